//! **tower-idempotency** makes HTTP endpoints safe to call twice.
//!
//! Payment providers retry webhooks, clients retry `POST`s after a timeout, and two deliveries of
//! the same event often arrive at the same instant. This crate's [`IdempotencyLayer`] claims each
//! request's key atomically in a [`Store`], runs the handler once, caches the successful response
//! and replays it to every duplicate.
//!
//! ```no_run
//! use axum::{routing::post, Router};
//! use tower_idempotency::{IdempotencyLayer, SqliteStore};
//!
//! async fn create_order(body: String) -> (http::StatusCode, String) {
//!     (http::StatusCode::CREATED, body)
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = SqliteStore::connect("sqlite://idempotency.db").await?;
//! store.migrate().await?;
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order))
//!     .route_layer(IdempotencyLayer::client_keys(store).namespace("orders"));
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! # Feature flags
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `sqlite` | yes | [`SqliteStore`], the embedded durable store |
//! | `webhooks` | yes | [`webhooks`]: signature verification and event keys for every shipped provider, `IdempotencyLayer::stripe(..)` and friends via [`WebhookLayerExt`] |
//! | `postgres` | no | [`PostgresStore`] |
//! | `redis` | no | [`RedisStore`], standalone and Cluster |
//! | `inbox` | no | [`inbox`]: the durable webhook inbox (acknowledge once stored, process in the background with retries); with `sqlite` or `postgres` |
//! | `cli` | no | the `tower-idempotency` binary: `inspect`, `forget` and `purge-expired` records, and with `inbox` `inbox list` and `inbox retry` ([docs/cli.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/cli.md)) |
//!
//! The [`MemoryStore`] (single process only) is always available.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub use tower_idempotency_core::*;

#[cfg(feature = "webhooks")]
pub use tower_idempotency_webhooks as webhooks;
#[cfg(feature = "webhooks")]
pub use tower_idempotency_webhooks::{VerifiedWebhook, WebhookLayerExt};

#[cfg(feature = "sqlite")]
pub use tower_idempotency_sqlx::SqliteStore;

#[cfg(feature = "postgres")]
pub use tower_idempotency_sqlx::PostgresStore;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use tower_idempotency_sqlx::{sqlx, transactional, IdempotentTx, TxRejection};

#[cfg(feature = "redis")]
pub use tower_idempotency_redis::RedisStore;

#[cfg(feature = "inbox")]
pub use tower_idempotency_inbox as inbox;

mod connect;
pub use connect::{connect_store, ConnectStoreError};

/// Brings the constructor extensions into scope: `use tower_idempotency::prelude::*;`.
pub mod prelude {
    pub use tower_idempotency_core::{IdempotencyLayer, Store};
    #[cfg(feature = "webhooks")]
    pub use tower_idempotency_webhooks::WebhookLayerExt;
}
