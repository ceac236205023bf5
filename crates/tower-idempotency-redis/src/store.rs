//! [`RedisStore`]: its settings, and the [`Store`] calls as the commands and scripts the
//! [crate documentation](crate) lists.

use std::{sync::Arc, time::Duration};

use redis::{aio::ConnectionManager, cluster_async::ClusterConnection, Value};
use tower_idempotency_core::{
    CachedResponse, ClaimOutcome, CompletedRecord, FencingToken, Fingerprint, Ownership,
    RecordState, Settlements, Store, StoreError,
};

use crate::{
    connect::{validate_prefix, ConfigError},
    connection::Connection,
    record::{self, corrupt, expiry_ms, token_bytes, unix_ms},
    scripts,
    settlements::RedisNotices,
};

/// Default largest encoded record: 16 MiB.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 16 * 1024 * 1024;
/// Redis refuses strings above 512 MB (`proto-max-bulk-len`); the limit is clamped below it.
const REDIS_MAX_STRING: usize = 512 * 1024 * 1024 - 1024;
/// Default time budget of one store call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Records up to this size go to Redis inside the script call; larger ones are staged with a
/// plain `SET` first, because Redis copies every string passed into Lua, in proportion to its size
/// (`cargo bench -p tower-idempotency-redis --bench redis_store` has a 64 KiB first request).
const INLINE_MAX: usize = 4 * 1024;
/// Lifetime of a staged response, in case the completing script never runs.
const STAGING_MS: u64 = 60_000;

/// A [`Store`] on Redis or Redis Cluster. Cheap to clone: clones share the connection.
///
/// See the [crate documentation](crate) for the key layout, the scripts and error mapping.
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) connection: Connection,
    prefix: String,
    max_record_bytes: usize,
    pub(crate) timeout: Duration,
    notices: Arc<RedisNotices>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("connection", &self.connection.kind())
            .field("prefix", &self.prefix)
            .field("max_record_bytes", &self.max_record_bytes)
            .field("timeout", &self.timeout)
            .field("notices", &self.notices.subscribes())
            .finish()
    }
}

impl RedisStore {
    /// A store on one Redis server (or a proxy) through a connection manager, which reconnects
    /// by itself. Configure its response timeout
    /// ([`ConnectionManagerConfig::set_response_timeout`](redis::aio::ConnectionManagerConfig::set_response_timeout))
    /// so a dead server fails calls quickly.
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
        record::record_key(&self.prefix, store_key)
    }

    /// A small completion: the script writes the whole record in the same call.
    async fn complete_inline(
        &self,
        key: &str,
        token: FencingToken,
        ttl_ms: u64,
        deadline: [u8; 8],
        encoded: &[u8],
    ) -> Result<Ownership, StoreError> {
        let record_key = self.redis_key(key);
        let mut invocation = scripts::COMPLETE_INLINE.prepare_invoke();
        invocation
            .key(record_key)
            .arg(&token_bytes(token)[..])
            .arg(ttl_ms)
            .arg(encoded)
            .arg(&deadline[..])
            .arg(&self.notices.channel)
            .arg(key);
        ownership(self.invoke(invocation).await?)
    }

    /// A large completion: a plain `SET` to a staging key of this token (same hash tag, so same
    /// slot), then the script renames it over the record, in one pipelined round trip.
    async fn complete_staged(
        &self,
        key: &str,
        token: FencingToken,
        ttl_ms: u64,
        staged: Vec<u8>,
    ) -> Result<Ownership, StoreError> {
        let record_key = self.redis_key(key);
        let staging_key = record::staging_key(&record_key, token);
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
}

/// What a token-checking script answered.
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
        let value = record::in_flight_value(token, fingerprint, unix_ms() + lease_ms);
        // One atomic command: create the record unless one exists, and return the existing one
        // (which carries its own deadlines).
        let mut command = redis::cmd("SET");
        command
            .arg(&record_key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(lease_ms)
            .arg("GET");
        match self.command(&command).await? {
            Value::Nil => Ok(ClaimOutcome::Claimed { token }),
            Value::BulkString(existing) => match record::decode_state(existing, unix_ms())? {
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
        let ttl_ms = expiry_ms(ttl);
        // The fingerprint lives in the in-flight record and the scripts copy it from there (the
        // caller of `complete` does not pass it), so the encoding carries a placeholder.
        let encoded = CompletedRecord {
            fingerprint: Fingerprint([0; 32]),
            response: response.clone(),
        }
        .encode();
        let size = record::COMPLETED_UNTIL_HEADER_LEN + encoded.len();
        let deadline = unix_ms().saturating_add(ttl_ms).to_be_bytes();
        if size > self.max_record_bytes {
            return Err(StoreError::RecordTooLarge {
                size,
                limit: self.max_record_bytes,
            });
        }
        if size <= INLINE_MAX {
            return self
                .complete_inline(key, token, ttl_ms, deadline, &encoded)
                .await;
        }
        let staged = record::completed_value(token, deadline, &encoded);
        drop(encoded);
        self.complete_staged(key, token, ttl_ms, staged).await
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
        let mut command = redis::cmd("GET");
        command.arg(&record_key);
        match self.command(&command).await? {
            Value::Nil => Ok(None),
            Value::BulkString(value) => record::decode_state(value, unix_ms()).map(Some),
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
