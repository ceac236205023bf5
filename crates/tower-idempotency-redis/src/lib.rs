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
//! # Key layout
//! Every record is **one string key**: `<prefix>:{<store key>}`, for example
//! `myapp:idem:{orders:3f2a…}`. The braces are a Redis Cluster *hash tag*: the slot is computed
//! from the store key alone, so the record and its companion key (the staging key below,
//! `<prefix>:{<store key>}:staged:<token>`) live in the same slot and one script can touch both.
//! The prefix is validated ([`ConfigError`]): 1 to 64 bytes of `A-Z a-z 0-9 : _ . -`, so it
//! cannot contain a brace and break the tag. A store key that itself starts with a brace (the
//! layer's never do) is written `<prefix>:{{<store key>}`, so the tag is never empty.
//!
//! The value is binary:
//!
//! | state | value | expiry |
//! |---|---|---|
//! | in flight | `'I'`, fencing token (8 bytes), request fingerprint (32 bytes), lease deadline (8 bytes, Unix ms) | `PX` = the lease |
//! | completed | `'E'`, fingerprint (32 bytes), the completing fencing token (8 bytes), expiry deadline (8 bytes, Unix ms), [`CompletedRecord::encode`](tower_idempotency_core::CompletedRecord::encode) of the response | `PX` = the TTL |
//!
//! Redis's own key expiry implements both the lease and the TTL, so no sweeper is needed and an
//! expired record is simply absent.
//!
//! # Commands and round trips
//!
//! | call | what is sent | round trips |
//! |---|---|---|
//! | `claim` | `SET key <in-flight> NX PX <lease> GET`: creates the record, or returns the existing one (the whole completed record, or the holder's fingerprint and deadline) | 1 |
//! | `complete`, record ≤ 4 KiB | script: check token; `SET 'E'+fingerprint+token+deadline PX ttl`; `APPEND` the response; `PUBLISH` | 1 |
//! | `complete`, larger record | pipeline: `SET <staging key> <record> PX 60000`, then script: check token; `RENAME` staging key to record; `SETRANGE` the fingerprint; `PEXPIRE ttl`; `PUBLISH` (a stale holder's staged value is deleted instead) | 1 |
//! | `renew` | script: check token; `SETRANGE` the deadline; `PEXPIRE` | 1 |
//! | `release` | script: check token; `DEL`; `PUBLISH` | 1 |
//! | `get` | `GET` | 1 |
//! | `forget` | script: `DEL`; `PUBLISH` when it deleted a record | 1 |
//!
//! So a first request costs two round trips and three commands (claim; complete: `EVALSHA`, or a
//! staging `SET` and `EVALSHA`), and a replay or a concurrent duplicate costs one `SET … NX GET`. Scripts ([`redis::Script`]) are sent as `EVALSHA`; on
//! `NOSCRIPT` (after a restart or failover) the client loads the script and retries.
//! [`RedisStore::connect`] preloads them (`SCRIPT LOAD`, on every master in a cluster).
//!
//! Why `claim` is not a script: Redis copies every string that enters Lua, whether read with
//! `redis.call` or passed in `ARGV`, at a cost proportional to its size and many times a plain
//! `GET`'s, and Redis runs one command at a time. A claim script returning the completed record
//! would pay that on every replay. So no script ever
//! reads more than a record's first 49 bytes (`GETRANGE`), and large responses reach Redis through
//! a plain `SET` and a `RENAME`. `SET` with both `NX` and `GET` needs **Redis 7.0** or later (or
//! Valkey).
//!
//! The deadlines in a record are written by the claimer's or completer's clock and read by
//! another host's. They only feed `lease_remaining` (the `Retry-After` hint) and `ttl_remaining`
//! (how long a [`LocalReplayCache`](tower_idempotency_core::LocalReplayCache) may keep a replay,
//! within its own bound): clock skew between application hosts shifts those and nothing else.
//! The lease and the TTL themselves are Redis's `PX`. Keeping the deadline in the value spares
//! every claim and read a `PTTL` command.
//!
//! # Notices for waiting requests
//! The scripts that complete, release or forget a record `PUBLISH` its store key on
//! `<prefix>:settled` when they changed it. A store with clients to subscribe with
//! ([`RedisStore::with_notices`]; [`RedisStore::connect`] and [`RedisStore::connect_cluster`]
//! set them up) keeps one `SUBSCRIBE` connection and wakes the requests waiting on that key
//! ([`Store::settlements`](tower_idempotency_core::Store::settlements), used by the layer's `wait_for_result`), so waiters in every
//! instance claim again once, when notified, instead of polling. In a cluster a plain `PUBLISH`
//! reaches subscribers on every node (the cluster bus relays it), so one subscription hears
//! every master; a sharded `SPUBLISH` would need the channel in the record's slot, one
//! subscription per shard. The price: each publish crosses the cluster bus to every node.
//!
//! # Fencing tokens
//! A token is 63 random bits ([`FencingToken::random`](tower_idempotency_core::FencingToken::random)),
//! drawn by the client. A counter would
//! need a key that outlives every record of its key (or one global key, which a cluster cannot
//! update in the same script as a record in another slot). A random token goes wrong only if a
//! stale holder, still running after its key was reclaimed, happens to hold the same 63 bits as
//! the new holder: a chance of 2⁻⁶³ per reclaim and stale holder, about 10⁻¹⁰ after a billion
//! reclaims. Tokens are compared byte-wise inside the scripts, never as Lua numbers
//! (doubles).
//!
//! # Limits and errors
//! Records larger than [`RedisStore::with_max_record_bytes`] (default 16 MiB; Redis itself stops
//! at 512 MB per string) fail with [`StoreError::RecordTooLarge`](tower_idempotency_core::StoreError::RecordTooLarge) before anything is sent.
//! Connection failures, cluster-down and failover replies map to [`StoreError::Unavailable`](tower_idempotency_core::StoreError::Unavailable),
//! I/O timeouts and calls exceeding [`RedisStore::with_timeout`] to [`StoreError::Timeout`](tower_idempotency_core::StoreError::Timeout), and
//! every other server reply to [`StoreError::Backend`](tower_idempotency_core::StoreError::Backend). Errors never carry values or bodies.
//!
//! # Redis Cluster
//! Use [`RedisStore::cluster`] with a [`redis::cluster_async::ClusterConnection`], or
//! [`RedisStore::connect_cluster`]. Every command and script touches one slot, so it is routed
//! to that slot's master and stays atomic; `MOVED`/`ASK` redirections are followed by the client.
//! Reads are never sent to replicas, because a claim must see the latest write. As with any Redis
//! deployment, an asynchronous failover can lose the last writes a master acknowledged: a claim
//! lost that way lets one duplicate run the handler again.
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
