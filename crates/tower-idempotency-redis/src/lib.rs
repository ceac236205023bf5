//! A Redis and Redis Cluster [`Store`] for `tower-idempotency`.
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
//! | completed | `'D'`, fingerprint (32 bytes), the completing fencing token (8 bytes), [`CompletedRecord::encode`] of the response | `PX` = the TTL |
//!
//! Records written without the token (`'C'`, fingerprint, response) are still read.
//!
//! Redis's own key expiry implements both the lease and the TTL, so no sweeper is needed and an
//! expired record is simply absent.
//!
//! # Commands and round trips
//!
//! | call | what is sent | round trips |
//! |---|---|---|
//! | `claim` | `SET key <in-flight> NX PX <lease> GET`: creates the record, or returns the existing one (the whole completed record, or the holder's fingerprint and deadline) | 1 |
//! | `complete`, record ≤ 4 KiB | script: check token; `SET 'D'+fingerprint+token PX ttl`; `APPEND` the response; `PUBLISH` | 1 |
//! | `complete`, larger record | pipeline: `SET <staging key> <record> PX 60000`, then script: check token; `RENAME` staging key to record; `SETRANGE` the fingerprint; `PEXPIRE ttl`; `PUBLISH` (a stale holder's staged value is deleted instead) | 1 |
//! | `renew` | script: check token; `SETRANGE` the deadline; `PEXPIRE` | 1 |
//! | `release` | script: check token; `DEL`; `PUBLISH` | 1 |
//! | `get` | `GET` | 1 |
//! | `forget` | script: `DEL`; `PUBLISH` when it deleted a record | 1 |
//!
//! So a first request costs two round trips (claim, complete) and a replay or a concurrent
//! duplicate costs one `SET … NX GET`. Scripts ([`redis::Script`]) are sent as `EVALSHA`; on
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
//! The deadline in an in-flight record is written by the claimer's clock and read by the
//! duplicate's, and only feeds `lease_remaining` (the `Retry-After` hint): clock skew between
//! application hosts shifts that hint and nothing else. The lease itself is Redis's `PX`.
//!
//! # Notices for waiting requests
//! The scripts that complete, release or forget a record `PUBLISH` its store key on
//! `<prefix>:settled` when they changed it. A store with clients to subscribe with
//! ([`RedisStore::with_notices`]; [`RedisStore::connect`] and [`RedisStore::connect_cluster`]
//! set them up) keeps one `SUBSCRIBE` connection and wakes the requests waiting on that key
//! ([`Store::settlements`], used by the layer's `wait_for_result`), so waiters in every
//! instance claim again once, when notified, instead of polling. In a cluster a plain `PUBLISH`
//! reaches subscribers on every node (the cluster bus relays it), so one subscription hears
//! every master; a sharded `SPUBLISH` would need the channel in the record's slot, one
//! subscription per shard. The price: each publish crosses the cluster bus to every node.
//!
//! # Fencing tokens
//! A token is 64 bits from the operating system's CSPRNG, drawn by the client. A counter would
//! need a key that outlives every record of its key (or one global key, which a cluster cannot
//! update in the same script as a record in another slot). A random token goes wrong only if a
//! stale holder, still running after its key was reclaimed, happens to hold the same 64 bits as
//! the new holder: a chance of 2⁻⁶⁴ per reclaim and stale holder, below 10⁻¹⁰ even after a
//! billion reclaims. Tokens are compared byte-wise inside the scripts, never as Lua numbers
//! (doubles).
//!
//! # Limits and errors
//! Records larger than [`RedisStore::with_max_record_bytes`] (default 16 MiB; Redis itself stops
//! at 512 MB per string) fail with [`StoreError::RecordTooLarge`] before anything is sent.
//! Connection failures, cluster-down and failover replies map to [`StoreError::Unavailable`],
//! I/O timeouts and calls exceeding [`RedisStore::with_timeout`] to [`StoreError::Timeout`], and
//! every other server reply to [`StoreError::Backend`]. Errors never carry values or bodies.
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

mod scripts;
mod settlements;

use std::{sync::Arc, time::Duration};

use bytes::{BufMut, Bytes};
use redis::{
    aio::{ConnectionManager, ConnectionManagerConfig},
    cluster_async::ClusterConnection,
    ErrorKind, Pipeline, RedisError, ScriptInvocation, ServerErrorKind, Value,
};
use settlements::RedisNotices;
use tower_idempotency_core::store::{
    CachedResponse, ClaimOutcome, CodecError, CompletedRecord, FencingToken, Fingerprint,
    Ownership, RecordState, Settlements, Store, StoreError,
};

/// Default largest encoded record: 16 MiB.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 16 * 1024 * 1024;
/// Redis refuses strings above 512 MB (`proto-max-bulk-len`); the limit is clamped below it.
const REDIS_MAX_STRING: usize = 512 * 1024 * 1024 - 1024;
/// Default time budget of one store call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest expiry written: 100 years, so `now + PX` never overflows on the server.
const MAX_EXPIRY_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

const KIND_IN_FLIGHT: u8 = b'I';
/// Completed, without the completing token (still read, no longer written).
const KIND_COMPLETED: u8 = b'C';
/// Completed, with the completing token, so a resent completion can tell it already applied.
const KIND_COMPLETED_BY: u8 = b'D';
const IN_FLIGHT_LEN: usize = 1 + 8 + 32 + 8;
const COMPLETED_HEADER_LEN: usize = 1 + 32;
const COMPLETED_BY_HEADER_LEN: usize = 1 + 32 + 8;
/// Records up to this size go to Redis inside the script call; larger ones are staged with a
/// plain `SET` first, because Redis copies every string passed into Lua, in proportion to its size
/// (`cargo bench -p tower-idempotency-redis --bench redis_store` has a 64 KiB first request).
const INLINE_MAX: usize = 4 * 1024;
/// Lifetime of a staged response, in case the completing script never runs.
const STAGING_MS: u64 = 60_000;

/// A prefix that cannot be used for keys.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The prefix is empty or longer than 64 bytes.
    #[error("key prefix must be 1 to 64 bytes long, got {len}")]
    PrefixLength {
        /// The prefix's length in bytes.
        len: usize,
    },
    /// The prefix holds a byte outside `A-Z a-z 0-9 : _ . -`.
    #[error("key prefix may only contain A-Z a-z 0-9 : _ . - (invalid byte at {position})")]
    PrefixCharacter {
        /// Byte offset of the first invalid character.
        position: usize,
    },
}

/// Why [`RedisStore::connect`] or [`RedisStore::connect_cluster`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The prefix was rejected.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The URL was invalid or the server could not be reached.
    #[error("cannot connect to redis")]
    Redis(#[source] RedisError),
    /// A server may evict keys under memory pressure (`maxmemory-policy` is not `noeviction`):
    /// an evicted in-flight or completed record lets a duplicate run the handler again. Set the
    /// policy to `noeviction`, or accept the risk with [`ConnectOptions::allow_eviction`].
    #[error("redis maxmemory-policy is {policy}; records could be evicted (use noeviction)")]
    EvictingPolicy {
        /// The policy a server reported.
        policy: String,
    },
}

/// Options for [`RedisStore::connect_with`] and [`RedisStore::connect_cluster_with`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ConnectOptions {
    allow_eviction: bool,
}

impl ConnectOptions {
    /// The defaults: refuse a server whose `maxmemory-policy` may evict keys.
    pub fn new() -> Self {
        Self::default()
    }

    /// Connects even when a server's `maxmemory-policy` may evict keys (anything but
    /// `noeviction`). Under memory pressure Redis may then delete an in-flight record (a
    /// duplicate runs the handler while the first still runs) or a completed one (a retry runs
    /// it again): only for deployments that accept that.
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
    }
}

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// A [`Store`] on Redis or Redis Cluster. Cheap to clone: clones share the connection.
///
/// See the [crate documentation](crate) for the key layout, the scripts and error mapping.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    prefix: String,
    max_record_bytes: usize,
    timeout: Duration,
    notices: Arc<RedisNotices>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field(
                "connection",
                &match self.connection {
                    Connection::Single(_) => "single",
                    Connection::Cluster(_) => "cluster",
                },
            )
            .field("prefix", &self.prefix)
            .field("max_record_bytes", &self.max_record_bytes)
            .field("timeout", &self.timeout)
            .field("notices", &self.notices.subscribes())
            .finish()
    }
}

/// `<prefix>:{<store_key>}`. Redis Cluster hashes the text between the first `{` and the next
/// `}`, and the whole name when that text is empty: a store key starting with `}` would put its
/// record and its staging key (the record key plus a suffix) in different slots. Such keys get
/// one more `{` in front, and so do keys starting with `{`, which keeps the mapping one-to-one
/// (the prefix cannot contain a brace).
fn record_key(prefix: &str, store_key: &str) -> String {
    let mut key = String::with_capacity(prefix.len() + store_key.len() + 4);
    key.push_str(prefix);
    key.push_str(":{");
    if store_key.starts_with(['{', '}']) {
        key.push('{');
    }
    key.push_str(store_key);
    key.push('}');
    key
}

/// Checks a key prefix: 1 to 64 bytes of `A-Z a-z 0-9 : _ . -`.
pub fn validate_prefix(prefix: &str) -> Result<(), ConfigError> {
    if prefix.is_empty() || prefix.len() > 64 {
        return Err(ConfigError::PrefixLength { len: prefix.len() });
    }
    match prefix
        .bytes()
        .position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'.' | b'-')))
    {
        Some(position) => Err(ConfigError::PrefixCharacter { position }),
        None => Ok(()),
    }
}

impl RedisStore {
    /// A store on one Redis server (or a proxy) through a connection manager, which reconnects
    /// by itself. Configure its response timeout
    /// ([`ConnectionManagerConfig::set_response_timeout`]) so a dead server fails calls quickly.
    pub fn new(connection: ConnectionManager, prefix: &str) -> Result<Self, ConfigError> {
        Self::with_connection(Connection::Single(connection), prefix)
    }

    /// A store on a Redis Cluster.
    pub fn cluster(connection: ClusterConnection, prefix: &str) -> Result<Self, ConfigError> {
        Self::with_connection(Connection::Cluster(connection), prefix)
    }

    fn with_connection(connection: Connection, prefix: &str) -> Result<Self, ConfigError> {
        validate_prefix(prefix)?;
        Ok(Self {
            connection,
            prefix: prefix.to_owned(),
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            timeout: DEFAULT_TIMEOUT,
            notices: Arc::new(RedisNotices::new(prefix, Vec::new())),
        })
    }

    /// Subscribes to the notices of settled keys through `clients` (tried in turn; for a
    /// cluster, clients of some of its nodes), for requests waiting on a key another instance
    /// holds ([`Store::settlements`]). [`connect`](Self::connect) and
    /// [`connect_cluster`](Self::connect_cluster) do this with their URLs; a store built with
    /// [`new`](Self::new) or [`cluster`](Self::cluster) has no notices until this is called, and
    /// its waiters poll.
    ///
    /// Costs one extra connection per store (its clones share it), opened on the first request
    /// through a waiting layer. Every store, with notices or not, publishes one message per
    /// completion, release and forget on `<prefix>:settled`; a cluster relays each to every node.
    pub fn with_notices(mut self, clients: impl IntoIterator<Item = redis::Client>) -> Self {
        self.notices = Arc::new(RedisNotices::new(
            &self.prefix,
            clients.into_iter().collect(),
        ));
        self
    }

    /// Connects to one Redis server (`redis://host:port/db`) with a 2 s connection and response
    /// timeout and 3 reconnection attempts, checks that the server does not evict keys (see
    /// [`ConnectError::EvictingPolicy`]), and preloads the scripts.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, ConnectError> {
        Self::connect_with(url, prefix, ConnectOptions::new()).await
    }

    /// [`connect`](Self::connect) with options.
    pub async fn connect_with(
        url: &str,
        prefix: &str,
        options: ConnectOptions,
    ) -> Result<Self, ConnectError> {
        validate_prefix(prefix)?;
        let client = redis::Client::open(url).map_err(ConnectError::Redis)?;
        let notices = client.clone();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(3);
        let manager = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(ConnectError::Redis)?;
        let store = Self::new(manager, prefix)?.with_notices([notices]);
        store.check_eviction(&options).await?;
        store.preload_scripts().await.map_err(ConnectError::Redis)?;
        Ok(store)
    }

    /// Connects to a Redis Cluster through any of its nodes (`redis://host:port`) with a 2 s
    /// connection and response timeout, checks that no master evicts keys (see
    /// [`ConnectError::EvictingPolicy`]), and preloads the scripts on every master.
    pub async fn connect_cluster<'a>(
        nodes: impl IntoIterator<Item = &'a str>,
        prefix: &str,
    ) -> Result<Self, ConnectError> {
        Self::connect_cluster_with(nodes, prefix, ConnectOptions::new()).await
    }

    /// [`connect_cluster`](Self::connect_cluster) with options.
    pub async fn connect_cluster_with<'a>(
        nodes: impl IntoIterator<Item = &'a str>,
        prefix: &str,
        options: ConnectOptions,
    ) -> Result<Self, ConnectError> {
        validate_prefix(prefix)?;
        let nodes: Vec<&str> = nodes.into_iter().collect();
        let notices = nodes
            .iter()
            .map(|node| redis::Client::open(*node))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ConnectError::Redis)?;
        let client = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
            .build()
            .map_err(ConnectError::Redis)?;
        let connection = client
            .get_async_connection()
            .await
            .map_err(ConnectError::Redis)?;
        let store = Self::cluster(connection, prefix)?.with_notices(notices);
        store.check_eviction(&options).await?;
        store.preload_scripts().await.map_err(ConnectError::Redis)?;
        Ok(store)
    }

    async fn check_eviction(&self, options: &ConnectOptions) -> Result<(), ConnectError> {
        let policies = self
            .eviction_policies()
            .await
            .map_err(ConnectError::Redis)?;
        match policies.into_iter().find(|p| p != "noeviction") {
            Some(policy) if options.allow_eviction => {
                tracing::warn!(%policy, "redis may evict idempotency records under memory pressure (eviction allowed by ConnectOptions)");
                Ok(())
            }
            Some(policy) => Err(ConnectError::EvictingPolicy { policy }),
            None => Ok(()),
        }
    }

    /// The `maxmemory-policy` of the server, or of every master of a cluster, read from
    /// `INFO memory` (which managed services that disable `CONFIG` still answer). Anything but
    /// `noeviction` lets Redis delete records under memory pressure; [`connect`](Self::connect)
    /// and [`connect_cluster`](Self::connect_cluster) check it, a store built with
    /// [`new`](Self::new) or [`cluster`](Self::cluster) can call this itself.
    pub async fn eviction_policies(&self) -> Result<Vec<String>, RedisError> {
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        let reply = match self.connection.clone() {
            Connection::Single(mut c) => info.query_async::<Value>(&mut c).await?,
            Connection::Cluster(mut c) => {
                use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                c.route_command(info, all).await?
            }
        };
        let mut policies = Vec::new();
        collect_policies(&reply, &mut policies);
        if policies.is_empty() {
            return Err(RedisError::from((
                ErrorKind::Parse,
                "INFO memory has no maxmemory_policy",
            )));
        }
        Ok(policies)
    }

    /// Bounds the encoded size of a completed record (default 16 MiB). Larger responses fail
    /// with [`StoreError::RecordTooLarge`]. Values above Redis's 512 MB string limit are clamped.
    pub fn with_max_record_bytes(mut self, max: usize) -> Self {
        self.max_record_bytes = max.min(REDIS_MAX_STRING);
        self
    }

    /// Bounds every store call (default 5 s); slower calls fail with [`StoreError::Timeout`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The largest encoded record accepted.
    pub fn max_record_bytes(&self) -> usize {
        self.max_record_bytes
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key holding the record of `store_key`: `<prefix>:{<store_key>}`
    /// (`<prefix>:{{<store_key>}` when the store key starts with a brace).
    pub fn redis_key(&self, store_key: &str) -> String {
        record_key(&self.prefix, store_key)
    }

    /// Loads the scripts (`SCRIPT LOAD`; on every master of a cluster) so the first calls need
    /// no `NOSCRIPT` detour. Optional: calls load a missing script by themselves.
    pub async fn preload_scripts(&self) -> Result<(), RedisError> {
        for script in scripts::all() {
            let invocation = script.prepare_invoke();
            match self.connection.clone() {
                Connection::Single(mut c) => invocation.load_async(&mut c).await?,
                Connection::Cluster(mut c) => invocation.load_async(&mut c).await?,
            };
        }
        Ok(())
    }

    /// Runs one round trip within the store timeout.
    async fn round_trip<T>(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(self.timeout, call).await {
            // The connection's own response timeout fired: report how long it waited.
            Ok(result) => result.map_err(|e| map_error(e, started.elapsed())),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    async fn pipeline(&self, pipeline: &Pipeline) -> Result<(Value, i64), StoreError> {
        self.round_trip(async {
            match self.connection.clone() {
                Connection::Single(mut c) => pipeline.query_async::<(Value, i64)>(&mut c).await,
                Connection::Cluster(mut c) => pipeline.query_async::<(Value, i64)>(&mut c).await,
            }
        })
        .await
    }

    /// `EVALSHA`, and on `NOSCRIPT` (server restarted or failed over) `SCRIPT LOAD` and again.
    async fn invoke(&self, invocation: ScriptInvocation<'_>) -> Result<Value, StoreError> {
        self.round_trip(async {
            match self.connection.clone() {
                Connection::Single(mut c) => invocation.invoke_async::<Value>(&mut c).await,
                Connection::Cluster(mut c) => invocation.invoke_async::<Value>(&mut c).await,
            }
        })
        .await
    }

    /// A pipeline ending in a script, in one round trip, with the same `NOSCRIPT` fallback. The
    /// whole pipeline is repeated after loading, so its other commands must be idempotent.
    async fn pipeline_with_script(
        &self,
        pipeline: &Pipeline,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<Value, StoreError> {
        async fn run<C: redis::aio::ConnectionLike>(
            c: &mut C,
            pipeline: &Pipeline,
            invocation: &ScriptInvocation<'_>,
        ) -> redis::RedisResult<Value> {
            let first = pipeline.query_async::<(Value,)>(c).await;
            match first {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    invocation.load_async(c).await?;
                    Ok(pipeline.query_async::<(Value,)>(c).await?.0)
                }
                other => Ok(other?.0),
            }
        }
        self.round_trip(async {
            match self.connection.clone() {
                Connection::Single(mut c) => run(&mut c, pipeline, invocation).await,
                Connection::Cluster(mut c) => run(&mut c, pipeline, invocation).await,
            }
        })
        .await
    }
}

/// Every `maxmemory_policy:` line in an `INFO` reply (one text per node in a cluster's reply).
fn collect_policies(reply: &Value, policies: &mut Vec<String>) {
    let text = match reply {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::VerbatimString { text, .. } | Value::SimpleString(text) => text.clone(),
        Value::Array(items) | Value::Set(items) => {
            return items.iter().for_each(|v| collect_policies(v, policies))
        }
        Value::Map(pairs) => {
            return pairs
                .iter()
                .for_each(|(_, v)| collect_policies(v, policies))
        }
        _ => return,
    };
    policies.extend(
        text.lines()
            .filter_map(|line| line.trim().strip_prefix("maxmemory_policy:"))
            .map(str::to_owned),
    );
}

fn ownership(reply: Value) -> Result<Ownership, StoreError> {
    match reply {
        Value::Int(1) => Ok(Ownership::Current),
        Value::Int(0) => Ok(Ownership::Stale),
        Value::Int(2) => Err(StoreError::Backend(Box::new(
            ReplyError::StagedValueMissing,
        ))),
        _ => Err(corrupt("script reply")),
    }
}

/// A reply the store cannot act on.
#[derive(Debug, thiserror::Error)]
enum ReplyError {
    /// The staged response expired or was deleted before the completing script ran.
    #[error("the staged response vanished before it was committed")]
    StagedValueMissing,
}

fn map_error(error: RedisError, waited: Duration) -> StoreError {
    if error.is_timeout() {
        return StoreError::Timeout(waited);
    }
    let unavailable = error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_cluster_error()
        || matches!(
            error.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                )
        );
    if unavailable {
        StoreError::Unavailable(Box::new(error))
    } else {
        StoreError::Backend(Box::new(error))
    }
}

fn corrupt(what: &'static str) -> StoreError {
    StoreError::Corrupt(CodecError::Invalid(what))
}

fn expiry_ms(duration: Duration) -> u64 {
    // PX 0 is rejected by Redis; a zero lease or TTL expires as soon as possible instead.
    (duration.as_millis().min(MAX_EXPIRY_MS as u128) as u64).max(1)
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn token_bytes(token: FencingToken) -> [u8; 8] {
    token.0.to_be_bytes()
}

fn fingerprint_from(bytes: &[u8]) -> Result<Fingerprint, StoreError> {
    Fingerprint::from_slice(bytes).ok_or(StoreError::Corrupt(CodecError::Truncated))
}

fn decode_completed(value: Vec<u8>) -> Result<CompletedRecord, StoreError> {
    let header = match value.first() {
        Some(&KIND_COMPLETED) => COMPLETED_HEADER_LEN,
        Some(&KIND_COMPLETED_BY) => COMPLETED_BY_HEADER_LEN,
        _ => return Err(corrupt("record kind")),
    };
    if value.len() < header {
        return Err(corrupt("record kind"));
    }
    let fingerprint = fingerprint_from(&value[1..33])?;
    let mut record =
        CompletedRecord::decode(Bytes::from(value).slice(header..)).map_err(StoreError::Corrupt)?;
    record.fingerprint = fingerprint;
    Ok(record)
}

/// Decodes a record value read at wall-clock time `now_ms`, whose key had `pttl_ms` left (the
/// `PTTL` reply: negative when the key vanished or has no expiry, which reads as no time left).
fn decode_state(value: Vec<u8>, now_ms: u64, pttl_ms: i64) -> Result<RecordState, StoreError> {
    match value.first() {
        Some(&KIND_IN_FLIGHT) if value.len() == IN_FLIGHT_LEN => {
            let field = |range: std::ops::Range<usize>| -> [u8; 8] {
                value[range].try_into().expect("8 bytes")
            };
            let deadline = u64::from_be_bytes(field(41..49));
            Ok(RecordState::InFlight {
                token: FencingToken(u64::from_be_bytes(field(1..9))),
                fingerprint: fingerprint_from(&value[9..41])?,
                lease_remaining: Duration::from_millis(deadline.saturating_sub(now_ms)),
            })
        }
        Some(&KIND_COMPLETED | &KIND_COMPLETED_BY) => Ok(RecordState::Completed {
            record: decode_completed(value)?,
            ttl_remaining: Duration::from_millis(pttl_ms.max(0) as u64),
        }),
        _ => Err(corrupt("record kind")),
    }
}

fn in_flight_value(token: FencingToken, fingerprint: &Fingerprint, deadline_ms: u64) -> Vec<u8> {
    let mut value = Vec::with_capacity(IN_FLIGHT_LEN);
    value.put_u8(KIND_IN_FLIGHT);
    value.put_slice(&token_bytes(token));
    value.put_slice(fingerprint.as_bytes());
    value.put_u64(deadline_ms);
    value
}

#[async_trait::async_trait]
impl Store for RedisStore {
    async fn claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        token: FencingToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let record_key = self.redis_key(key);
        let lease_ms = expiry_ms(lease);
        let value = in_flight_value(token, fingerprint, unix_ms() + lease_ms);
        // One atomic command: create the record unless one exists, and return the existing one;
        // `PTTL` in the same round trip gives an existing record's remaining lifetime.
        let mut pipeline = redis::pipe();
        pipeline
            .cmd("SET")
            .arg(&record_key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(lease_ms)
            .arg("GET")
            .cmd("PTTL")
            .arg(&record_key);
        let (existing, pttl) = self.pipeline(&pipeline).await?;
        match existing {
            Value::Nil => Ok(ClaimOutcome::Claimed { token }),
            Value::BulkString(existing) => match decode_state(existing, unix_ms(), pttl)? {
                // Our own record: a claim the client resent after its first attempt landed.
                RecordState::InFlight { token: holder, .. } if holder == token => {
                    Ok(ClaimOutcome::Claimed { token })
                }
                RecordState::InFlight {
                    fingerprint,
                    lease_remaining,
                    ..
                } => Ok(ClaimOutcome::InFlight {
                    fingerprint,
                    lease_remaining,
                }),
                RecordState::Completed {
                    record,
                    ttl_remaining,
                } => Ok(ClaimOutcome::Completed {
                    record,
                    ttl_remaining,
                }),
            },
            _ => Err(corrupt("SET reply")),
        }
    }

    async fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Ownership, StoreError> {
        let lease_ms = expiry_ms(lease);
        let deadline = (unix_ms() + lease_ms).to_be_bytes();
        let mut invocation = scripts::RENEW.prepare_invoke();
        invocation
            .key(self.redis_key(key))
            .arg(&token_bytes(token)[..])
            .arg(lease_ms)
            .arg(&deadline[..]);
        ownership(self.invoke(invocation).await?)
    }

    async fn complete(
        &self,
        key: &str,
        token: FencingToken,
        response: &CachedResponse,
        ttl: Duration,
    ) -> Result<Ownership, StoreError> {
        let record_key = self.redis_key(key);
        let ttl_ms = expiry_ms(ttl);
        // The fingerprint lives in the in-flight record and the scripts copy it from there (the
        // caller of `complete` does not pass it), so the encoding carries a placeholder.
        let encoded = CompletedRecord {
            fingerprint: Fingerprint([0; 32]),
            response: response.clone(),
        }
        .encode();
        let size = COMPLETED_BY_HEADER_LEN + encoded.len();
        if size > self.max_record_bytes {
            return Err(StoreError::RecordTooLarge {
                size,
                limit: self.max_record_bytes,
            });
        }
        if size <= INLINE_MAX {
            let mut invocation = scripts::COMPLETE_INLINE.prepare_invoke();
            invocation
                .key(record_key)
                .arg(&token_bytes(token)[..])
                .arg(ttl_ms)
                .arg(encoded)
                .arg(&self.notices.channel)
                .arg(key);
            return ownership(self.invoke(invocation).await?);
        }
        // Large: a plain SET to a staging key of this token (same hash tag, so same slot), then
        // the script renames it over the record, in one pipelined round trip.
        let mut staged = Vec::with_capacity(size);
        staged.put_u8(KIND_COMPLETED_BY);
        staged.put_bytes(0, 32);
        staged.put_slice(&token_bytes(token));
        staged.extend_from_slice(&encoded);
        drop(encoded);
        let staging_key = format!("{record_key}:staged:{:016x}", token.0);
        let mut invocation = scripts::COMPLETE_STAGED.prepare_invoke();
        invocation
            .key(&record_key)
            .key(&staging_key)
            .arg(&token_bytes(token)[..])
            .arg(ttl_ms)
            .arg(&self.notices.channel)
            .arg(key);
        let mut pipeline = redis::pipe();
        pipeline
            .cmd("SET")
            .arg(&staging_key)
            .arg(staged)
            .arg("PX")
            .arg(STAGING_MS)
            .ignore()
            .invoke_script(&invocation);
        ownership(self.pipeline_with_script(&pipeline, &invocation).await?)
    }

    async fn release(&self, key: &str, token: FencingToken) -> Result<Ownership, StoreError> {
        let mut invocation = scripts::RELEASE.prepare_invoke();
        invocation
            .key(self.redis_key(key))
            .arg(&token_bytes(token)[..])
            .arg(&self.notices.channel)
            .arg(key);
        ownership(self.invoke(invocation).await?)
    }

    async fn get(&self, key: &str) -> Result<Option<RecordState>, StoreError> {
        let record_key = self.redis_key(key);
        let mut pipeline = redis::pipe();
        pipeline
            .cmd("GET")
            .arg(&record_key)
            .cmd("PTTL")
            .arg(&record_key);
        match self.pipeline(&pipeline).await? {
            (Value::Nil, _) => Ok(None),
            (Value::BulkString(value), pttl) => decode_state(value, unix_ms(), pttl).map(Some),
            _ => Err(corrupt("GET reply")),
        }
    }

    /// A script: `DEL` of the record key, and the notice when it deleted one. Redis expires
    /// records itself, so an expired record is already gone and reads as `false`. A staged
    /// response of the holder (larger completions) is left to its own 60 s expiry.
    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let mut invocation = scripts::FORGET.prepare_invoke();
        invocation
            .key(self.redis_key(key))
            .arg(&self.notices.channel)
            .arg(key);
        match self.invoke(invocation).await? {
            Value::Int(deleted) => Ok(deleted > 0),
            _ => Err(corrupt("DEL reply")),
        }
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    /// Pub/sub on `<prefix>:settled`, when the store has clients to subscribe with
    /// ([`with_notices`](RedisStore::with_notices)).
    fn settlements(&self) -> Option<Settlements> {
        self.notices
            .subscribes()
            .then(|| self.notices.settlements())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_and_its_staging_key_share_a_slot_whatever_the_store_key() {
        use redis::cluster_routing::Slot;
        let keys = [
            "ns:0a1b", "}ns:1", "{ns:2", "n}s:3", "n{s:4", "{}", "}", "{", "}}{{", "a}",
        ];
        let mut seen = std::collections::HashSet::new();
        for store_key in keys {
            let record = record_key("app", store_key);
            let staging = format!("{record}:staged:{:016x}", 7);
            assert_eq!(
                Slot::for_key(&record),
                Slot::for_key(&staging),
                "{store_key:?} -> {record:?}"
            );
            assert!(seen.insert(record), "two store keys share a Redis key");
        }
        // Keys without a leading brace keep the documented layout.
        assert_eq!(record_key("app", "ns:0a1b"), "app:{ns:0a1b}");
        assert_eq!(record_key("app", "}x"), "app:{{}x}");
        assert_eq!(record_key("app", "{}x"), "app:{{{}x}");
    }

    #[test]
    fn prefixes_are_validated() {
        assert_eq!(validate_prefix("app:idem_1.v-2"), Ok(()));
        assert_eq!(
            validate_prefix(""),
            Err(ConfigError::PrefixLength { len: 0 })
        );
        assert_eq!(validate_prefix(&"a".repeat(64)), Ok(()));
        assert_eq!(
            validate_prefix(&"a".repeat(65)),
            Err(ConfigError::PrefixLength { len: 65 })
        );
        assert_eq!(
            validate_prefix("ab{c}"),
            Err(ConfigError::PrefixCharacter { position: 2 })
        );
        assert_eq!(
            validate_prefix("a b"),
            Err(ConfigError::PrefixCharacter { position: 1 })
        );
        assert_eq!(
            validate_prefix("é"),
            Err(ConfigError::PrefixCharacter { position: 0 })
        );
    }

    #[test]
    fn expiries_are_never_zero_and_never_overflow() {
        assert_eq!(expiry_ms(Duration::ZERO), 1);
        assert_eq!(expiry_ms(Duration::from_micros(500)), 1);
        assert_eq!(expiry_ms(Duration::from_millis(250)), 250);
        assert_eq!(expiry_ms(Duration::MAX), MAX_EXPIRY_MS);
    }

    #[test]
    fn corrupt_values_are_errors_not_panics() {
        for value in [
            vec![],
            vec![b'X'; 49],
            vec![b'I'; 41],
            vec![b'I'; 50],
            vec![b'C'; 10],
            vec![b'C'; 40],
            vec![b'D'; 40],
        ] {
            assert!(matches!(
                decode_state(value, 100, 1000),
                Err(StoreError::Corrupt(_))
            ));
        }
    }

    #[test]
    fn in_flight_values_decode_with_their_remaining_lease() {
        let value = in_flight_value(FencingToken(u64::MAX), &Fingerprint([9; 32]), 10_250);
        assert_eq!(value.len(), IN_FLIGHT_LEN);
        assert_eq!(
            decode_state(value.clone(), 10_000, 250).unwrap(),
            RecordState::InFlight {
                fingerprint: Fingerprint([9; 32]),
                token: FencingToken(u64::MAX),
                lease_remaining: Duration::from_millis(250),
            }
        );
        // A reader whose clock is past the deadline sees no time left, never a negative one.
        assert!(matches!(
            decode_state(value, 20_000, 250).unwrap(),
            RecordState::InFlight { lease_remaining, .. } if lease_remaining.is_zero()
        ));
    }
}
