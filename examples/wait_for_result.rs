//! `wait_for_result`: a retry sent while the first request still runs waits for its result and
//! gets the same `201` (marked `idempotent-replayed: true`) instead of `409`.
//!
//! ```text
//! cargo run --example wait_for_result
//! ```

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use axum::{http::StatusCode, routing::post, Router};
use tower_idempotency::{IdempotencyLayer, MemoryStore};

const ADDR: &str = "127.0.0.1:3012";

async fn create_order(body: String) -> (StatusCode, String) {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    println!("order {id} started");
    // Slow work: a client with a 1 s timeout retries while this runs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!("order {id} created");
    (StatusCode::CREATED, format!("order {id}: {body}\n"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let layer = IdempotencyLayer::client_keys(MemoryStore::new())
        .namespace("orders")
        // A duplicate waits up to 10 s for the first request's result, then gets 409.
        .wait_for_result(Duration::from_secs(10))
        // At most 256 requests wait at once; the next duplicate gets 409 at once.
        .max_waiters(256);
    let app = Router::new()
        .route("/orders", post(create_order))
        .route_layer(layer);

    let listener = tokio::net::TcpListener::bind(ADDR).await?;
    println!("listening on http://{ADDR}; send two at once (the second waits, then replays):");
    println!(
        "  for i in 1 2; do curl -si http://{ADDR}/orders -H 'Idempotency-Key: k-1' \
         -d '{{\"sku\":\"book\"}}' & done; wait"
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
