//! `POST /orders`: a client-keyed route (`Idempotency-Key`) that answers `201 {"order_id", "request"}`.

use std::{
    hash::{BuildHasher, RandomState},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use axum::{
    body::Bytes,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
    Json, Router,
};
use serde_json::{json, Value};
use tower_idempotency::{IdempotencyLayer, ShutdownHandle, Store};

use crate::{
    app::{idempotency_key, App},
    config::Config,
};

/// The route behind a client-keyed layer in the `orders` namespace, tuned by `config`.
pub fn route(config: &Config, store: Arc<dyn Store>) -> (Router<App>, ShutdownHandle) {
    let mut layer = config.tune(IdempotencyLayer::client_keys(store).namespace("orders"));
    if let Some(wait) = config.wait {
        layer = layer.wait_for_result(wait);
    }
    let handle = layer.shutdown_handle();
    let router = Router::new()
        .route("/orders", post(create_order))
        .route_layer(layer);
    (router, handle)
}

/// A fresh order id. `RandomState` is seeded per process from the OS, which is unpredictable
/// enough for a demo id without a `rand` dependency; the counter keeps ids distinct.
fn new_order_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("ord_{:016x}", RandomState::new().hash_one(n))
}

async fn create_order(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    app.execute("orders", idempotency_key(&headers)).await;
    let request = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let order = json!({ "order_id": new_order_id(), "request": request });
    (StatusCode::CREATED, Json(order)).into_response()
}
