//! The idempotency middleware: [`IdempotencyLayer`] and [`IdempotencyService`].
//!
//! For each guarded request (by default `POST` and `PATCH`) the service:
//!
//! 1. buffers the body under a cap (`413` past it, checked against `Content-Length` first);
//! 2. derives the key through its [`KeySource`](crate::KeySource) (`400` for a missing or invalid
//!    `Idempotency-Key`, a provider's own problem for a bad signature);
//! 3. scopes it by namespace, method, path and principal (or by namespace and route template,
//!    see [`RouteScope`](crate::scope::RouteScope)), and fingerprints the request;
//! 4. claims it in the [`Store`](crate::Store): a claim runs the handler (to completion even if the caller
//!    disconnects), an
//!    in-flight duplicate gets `409` (or, with
//!    [`wait_for_result`](IdempotencyLayer::wait_for_result), waits for the first one's result), a completed key is replayed with `Idempotent-Replayed: true`,
//!    a reused key with another fingerprint gets `422`, a failing store gets `503`;
//! 5. completes or releases the key according to the [`CachePolicy`](crate::CachePolicy).
//!
//! # Example
//!
//! ```
//! use axum::{routing::post, Json, Router};
//! use tower_idempotency_core::{IdempotencyLayer, MemoryStore};
//!
//! async fn create_order(Json(order): Json<serde_json::Value>) -> Json<serde_json::Value> {
//!     Json(serde_json::json!({ "order_id": "ord_1", "order": order }))
//! }
//!
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order))
//!     .route_layer(IdempotencyLayer::client_keys(MemoryStore::new()).namespace("orders"));
//! # let _ = app;
//! ```

mod authenticated;
mod body;
mod detach;
mod future;
mod layer;
mod metrics;
mod service;
mod transactional;
mod wait;

pub use body::ResponseBody;
pub use future::ResponseFuture;
pub use layer::{
    IdempotencyLayer, DEFAULT_DISCARD_BYTES, DEFAULT_DISCARD_TIME, DEFAULT_LEASE, DEFAULT_MAX_BODY,
    DEFAULT_MAX_CACHED_BODY, DEFAULT_MAX_LEASE_RENEWAL, DEFAULT_MAX_WAITERS, DEFAULT_STORE_TIMEOUT,
    DEFAULT_TTL, MIN_LEASE,
};
#[cfg(feature = "metrics")]
pub use metrics::describe_metrics;
pub use metrics::{
    HANDLERS_IN_FLIGHT, LEASE_RENEWALS_LOST_TOTAL, REQUESTS_TOTAL, RESULTS_UNRECORDED_TOTAL,
    STORE_CALL_DURATION_SECONDS,
};
pub use service::IdempotencyService;
pub use transactional::TransactionalError;
