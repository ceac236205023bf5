//! Two instances of one application, each with its own Redis connection, sharing one Redis:
//! a key claimed through one instance is replayed by the other, as behind a load balancer.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example redis_two_instances --features redis
//! ```

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

use axum::{extract::State, routing::post, Router};
use tower_idempotency::{IdempotencyLayer, RedisStore};

const ADDRS: [&str; 2] = ["127.0.0.1:3006", "127.0.0.1:3007"];

/// Executions across both instances (they share this process only to make the count visible).
type Executions = Arc<AtomicUsize>;

async fn charge(State(executions): State<Executions>, body: String) -> String {
    let n = executions.fetch_add(1, Ordering::SeqCst) + 1;
    println!("charging {body} (execution #{n} across both instances)");
    format!("charged {body}\n")
}

async fn instance(
    addr: &str,
    url: &str,
    executions: Executions,
) -> Result<(), Box<dyn std::error::Error>> {
    // Its own connection, as a separate process would have.
    let store = RedisStore::connect(url, "example-two-instances").await?;
    let app = Router::new()
        .route("/charges", post(charge))
        .route_layer(IdempotencyLayer::client_keys(store).namespace("charges"))
        .with_state(executions);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let executions = Executions::default();
    let [a, b] = ADDRS;
    println!("instances on http://{a} and http://{b}; try the same key on both:");
    for addr in ADDRS {
        println!("  curl -i http://{addr}/charges -H 'Idempotency-Key: charge-42' -d '10 EUR'");
    }
    tokio::try_join!(
        instance(a, &url, executions.clone()),
        instance(b, &url, executions.clone())
    )?;
    Ok(())
}
