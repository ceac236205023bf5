//! Client-keyed idempotency on `POST /orders` with the Postgres store: a client that retries
//! after a timeout sends the same `Idempotency-Key` and gets the first order back, never a
//! second one.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example orders_postgres --features postgres
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use axum::{http::StatusCode, routing::post, Json, Router};
use serde_json::{json, Value};
use tower_idempotency::{IdempotencyLayer, PostgresStore};

const ADDR: &str = "127.0.0.1:3005";

async fn create_order(Json(request): Json<Value>) -> (StatusCode, Json<Value>) {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    // Stands in for the INSERT: with the layer in front it runs once per key.
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    println!("creating order {id}");
    (
        StatusCode::CREATED,
        Json(json!({ "order_id": id, "request": request })),
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let store = PostgresStore::connect(&url).await?;
    store.migrate().await?;
    let app = Router::new()
        .route("/orders", post(create_order))
        .route_layer(IdempotencyLayer::client_keys(store).namespace("orders"));

    let listener = tokio::net::TcpListener::bind(ADDR).await?;
    println!(
        "listening on http://{ADDR}; try (twice: same order_id, `idempotent-replayed: true`):"
    );
    println!(
        "  curl -i http://{ADDR}/orders -H 'Idempotency-Key: 5b6f1c0e-order-1' \\\n    \
         -H 'Content-Type: application/json' -d '{{\"sku\":\"A-1\",\"qty\":2}}'"
    );
    println!("then change the body with the same key: 422; drop the header: 400.");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
