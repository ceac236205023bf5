//! Key administration: answering "what happened to this request?" and forgetting a key, from
//! the application (an admin route built on `Store::get`, `Store::forget` and
//! `scope::store_key_from_parts`) and from the `tower-idempotency` command-line tool.
//!
//! ```text
//! cargo run --example key_admin
//! ```
//!
//! The records live in `key-admin-example.db` in the working directory, so the command-line
//! tool can read them while the example runs (it prints the commands).

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::{
    extract::{Path, State},
    http::StatusCode,
    routing::{get, post},
    Json, Router,
};
use serde_json::json;
use tower_idempotency::{
    store::{store_key_from_parts, RecordState},
    IdempotencyLayer, SqliteStore, Store,
};

const ADDR: &str = "127.0.0.1:3011";
const DB: &str = "key-admin-example.db";
const NAMESPACE: &str = "orders";

async fn create_order(body: String) -> (StatusCode, String) {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    println!("order {id} created");
    (StatusCode::CREATED, format!("order {id}: {body}\n"))
}

/// The record of the `POST /orders` request sent with this `Idempotency-Key`. A real
/// application puts admin routes behind its own authentication.
fn order_key(idempotency_key: &str) -> String {
    store_key_from_parts(NAMESPACE, "POST", "/orders", None, idempotency_key)
}

async fn inspect(
    State(store): State<Arc<SqliteStore>>,
    Path(idempotency_key): Path<String>,
) -> Result<Json<serde_json::Value>, StatusCode> {
    let state = store
        .get(&order_key(&idempotency_key))
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    Ok(Json(match state {
        None => json!({ "state": "absent" }),
        Some(RecordState::InFlight {
            lease_remaining, ..
        }) => json!({
            "state": "in_flight",
            "lease_remaining_ms": lease_remaining.as_millis() as u64,
        }),
        Some(RecordState::Completed {
            record,
            ttl_remaining,
        }) => json!({
            "state": "completed",
            "status": record.response.status.as_u16(),
            "ttl_remaining_ms": ttl_remaining.as_millis() as u64,
        }),
    }))
}

async fn forget(
    State(store): State<Arc<SqliteStore>>,
    Path(idempotency_key): Path<String>,
) -> Result<StatusCode, StatusCode> {
    match store.forget(&order_key(&idempotency_key)).await {
        Ok(true) => Ok(StatusCode::NO_CONTENT),
        Ok(false) => Ok(StatusCode::NOT_FOUND),
        Err(_) => Err(StatusCode::SERVICE_UNAVAILABLE),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(SqliteStore::connect(&format!("sqlite://{DB}")).await?);
    store.migrate().await?;
    let app = Router::new()
        .route("/orders", post(create_order))
        .route_layer(
            IdempotencyLayer::client_keys(store.clone())
                .namespace(NAMESPACE)
                .ttl(Duration::from_secs(3600)),
        )
        .route(
            "/admin/orders/{idempotency_key}",
            get(inspect).delete(forget),
        )
        .with_state(store);

    let listener = tokio::net::TcpListener::bind(ADDR).await?;
    println!("listening on http://{ADDR}; create an order, replay it, inspect and forget it:");
    println!("  curl -i http://{ADDR}/orders -H 'Idempotency-Key: k-1' -d 'book'");
    println!("  curl -i http://{ADDR}/admin/orders/k-1");
    println!("  curl -i -X DELETE http://{ADDR}/admin/orders/k-1");
    println!("or with the command-line tool:");
    let tool = format!("cargo run --features cli --bin tower-idempotency -- --store sqlite://{DB}");
    let parts = format!("--namespace {NAMESPACE} --method POST --path /orders --key k-1");
    println!("  {tool} inspect {parts}");
    println!("  {tool} forget {parts}");
    println!("  {tool} purge-expired");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
