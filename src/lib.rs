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
//! | `webhooks` | yes | [`webhooks`]: signature verification and event keys for every shipped provider, `IdempotencyLayer::stripe(..)` and friends via [`WebhookLayerExt`]; the same as all the provider features below |
//! | `stripe`, `github`, `standard-webhooks`, `slack`, `shopify`, `paddle`, `linear`, `gitlab`, `zoom`, `discord`, `sendgrid`, `mailgun`, `square`, `twilio` | with `webhooks` | one provider each (with `default-features = false`, pick only the providers you receive: `ed25519-dalek`, `p256` and `url` come with the providers that need them) |
//! | `custom-webhooks` | with any provider | the verification machinery alone: [`webhooks::generic`] for a provider of your own, [`VerifiedWebhook`], [`VerifiedJson`] |
//! | `postgres` | no | [`PostgresStore`] |
//! | `mysql` | no | [`MySqlStore`]: MySQL 8.0+ and MariaDB 10.6+ (the inbox and the outbox do not run on it yet) |
//! | `redis` | no | [`RedisStore`], standalone and Cluster |
//! | `redis-tls` | no | `rediss://` URLs for the Redis store (TLS through rustls with ring); [`RedisConnectOptions`] trusts a private CA |
//! | `inbox` | no | [`inbox`]: the durable webhook inbox (acknowledge once stored, process in the background with retries); with `sqlite` or `postgres` |
//! | `outbox` | no | [`outbox`]: the transactional outbox (enqueue outgoing requests in a handler's transaction, relay them at least once with a stable `Idempotency-Key`); with `sqlite` or `postgres` |
//! | `nats` | no | NATS JetStream: with `outbox`, the outbox publishes `Message::nats` messages (`outbox::NatsPublisher`); [`broker`] runs JetStream deliveries once (`broker::OnceConsumer`, `broker::TxConsumer` with a SQL store) |
//! | `rabbitmq` | no | RabbitMQ: with `outbox`, the outbox publishes `Message::rabbitmq` messages (`outbox::RabbitPublisher`, publisher confirms); [`broker`] runs RabbitMQ deliveries once |
//! | `cli` | no | the `tower-idempotency` binary: `inspect`, `forget` and `purge-expired` records; with `inbox` the `inbox` commands (`list`, `events`, `show`, `retry`, `discard`, `purge`, `counts`); with `outbox` the `outbox` commands (`list`, `show`, `retry`, `discard`, `purge`) ([docs/cli.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/cli.md)) |
//!
//! With `inbox` or `outbox`, [`jobs`] is the durable job engine under both (the job table's
//! statements per database, the worker, [`jobs::Backoff`]).
//!
//! The [`MemoryStore`] (single process only) is always available.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

// What an application names: the layer, its stores, its settings and what it answers.
pub use tower_idempotency_core::{
    Authenticator, CacheDirective, CachePolicy, ClientKey, FingerprintError, FingerprintMode,
    IdempotencyLayer, IdempotencyService, JsonPointers, KeyError, KeySource, LocalReplayCache,
    MemoryStore, OnceError, Outcome, Principal, PrincipalSource, Problem, Ran, Rejection,
    ResponseBody, ResponseFuture, RouteScope, RunOnce, Scope, ShutdownHandle, Store,
    TransactionalError, BODY_OMITTED_HEADER, REPLAYED_HEADER,
};

/// What a store implementer, an administration tool or a store's own tests need: the records,
/// the claim and ownership answers, fencing tokens, the transactional contract, settlement
/// notices and the record codec.
pub mod store {
    pub use tower_idempotency_core::{
        decode_headers, encode_headers, is_valid_namespace, store_key_from_parts, BoxError,
        CachedResponse, ClaimOutcome, CodecError, CommitError, CompletedRecord, FencingToken,
        Fingerprint, LocalReplayCache, MemoryStore, Ownership, RecordState, Settlement,
        Settlements, Store, StoreError, StoreTransaction, Subscriber, TransactionalStore,
        DEFAULT_LOCAL_CACHE_BYTES, DEFAULT_LOCAL_CACHE_TTL, LONGEST_DURATION,
    };
}

/// The layer's defaults and limits.
pub mod defaults {
    pub use tower_idempotency_core::{
        DEFAULT_DISCARD_BYTES, DEFAULT_DISCARD_TIME, DEFAULT_LEASE, DEFAULT_MAX_BODY,
        DEFAULT_MAX_CACHED_BODY, DEFAULT_MAX_LEASE_RENEWAL, DEFAULT_MAX_WAITERS,
        DEFAULT_STORE_TIMEOUT, DEFAULT_TTL, MAX_KEY_LEN, MAX_NAMESPACE_LEN, MIN_LEASE,
    };
}

/// The client's `Idempotency-Key` header: its name and its parser.
pub mod key {
    pub use tower_idempotency_core::{
        parse_key, ClientKey, KeyError, KeySource, IDEMPOTENCY_KEY, MAX_KEY_LEN,
    };
}

/// The `application/problem+json` answers the layer gives instead of the handler's.
pub mod problem {
    pub use tower_idempotency_core::{Problem, Rejection, PROBLEM_JSON, PROBLEM_TYPE_PREFIX};
}

/// Which response headers a replay carries.
pub mod policy {
    pub use tower_idempotency_core::{
        cacheable_headers, CacheDirective, CachePolicy, UNCACHED_HEADERS,
    };
}

/// The names of the layer's metrics (docs:
/// [observability](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/observability.md)).
pub mod metrics {
    #[cfg(feature = "metrics")]
    pub use tower_idempotency_core::describe_metrics;
    pub use tower_idempotency_core::{
        HANDLERS_IN_FLIGHT, LEASE_RENEWALS_LOST_TOTAL, REQUESTS_TOTAL, RESULTS_UNRECORDED_TOTAL,
        STORE_CALL_DURATION_SECONDS,
    };
}

#[cfg(feature = "custom-webhooks")]
pub use tower_idempotency_webhooks as webhooks;
#[cfg(feature = "custom-webhooks")]
pub use tower_idempotency_webhooks::{
    VerifiedJson, VerifiedJsonRejection, VerifiedWebhook, WebhookLayerExt,
};

#[cfg(feature = "sqlite")]
pub use tower_idempotency_sqlx::SqliteStore;

#[cfg(feature = "postgres")]
pub use tower_idempotency_sqlx::PostgresStore;

#[cfg(feature = "mysql")]
pub use tower_idempotency_sqlx::MySqlStore;

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use tower_idempotency_sqlx::{
    ping_when_idle, sqlx, transactional, IdempotentTx, TxRejection, PING_AFTER_IDLE,
};

#[cfg(feature = "redis")]
pub use tower_idempotency_redis::RedisStore;

/// [`RedisStore::connect_with`]'s options: the eviction check, and with `redis-tls` the root
/// certificates of `rediss://` servers.
#[cfg(feature = "redis")]
pub use tower_idempotency_redis::ConnectOptions as RedisConnectOptions;

/// The redis version [`RedisStore`] is built on, re-exported so connections and clients match it.
#[cfg(feature = "redis")]
pub use tower_idempotency_redis::redis;

#[cfg(feature = "inbox")]
pub use tower_idempotency_inbox as inbox;

#[cfg(feature = "outbox")]
pub use tower_idempotency_outbox as outbox;

#[cfg(any(feature = "nats", feature = "rabbitmq"))]
pub use tower_idempotency_broker as broker;
#[cfg(any(feature = "inbox", feature = "outbox"))]
pub use tower_idempotency_jobs as jobs;

mod connect;
pub use connect::{connect_store, ConnectStoreError};

/// Brings the constructor extensions into scope: `use tower_idempotency::prelude::*;`.
pub mod prelude {
    pub use tower_idempotency_core::{IdempotencyLayer, Store};
    #[cfg(feature = "custom-webhooks")]
    pub use tower_idempotency_webhooks::WebhookLayerExt;
}
