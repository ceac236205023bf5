//! A Redis and Redis Cluster [`Store`](tower_idempotency_core::Store) for `tower-idempotency`.
//!
//! ```no_run
//! use tower_idempotency_core::IdempotencyLayer;
//! use tower_idempotency_redis::RedisStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379", "myapp:idem").await?;
//! let layer = IdempotencyLayer::client_keys(store);
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! One string key per record (`<prefix>:{<store key>}`, a cluster hash tag), Redis's own expiry
//! for the lease and the TTL, a `SET … NX GET` claim (one round trip, Redis ≥ 7.0 or Valkey),
//! token-checked scripts for the rest, and `PUBLISH` notices for waiting requests. The layout,
//! the commands and their round trips, why claims are not scripts, fencing, eviction, cluster
//! routing and durability are described once, in
//! [docs/stores.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/stores.md#redis).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod connect;
mod connection;
mod record;
mod scripts;
mod settlements;
mod store;

pub use connect::{validate_prefix, ConfigError, ConnectError, ConnectOptions};
pub use store::{RedisStore, DEFAULT_MAX_RECORD_BYTES, DEFAULT_TIMEOUT};

/// The redis version this crate is built on, re-exported so connections and clients match it.
pub use redis;
