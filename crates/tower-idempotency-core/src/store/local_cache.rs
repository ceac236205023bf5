//! A bounded, short-lived local cache of completed records in front of a shared store.

use std::{
    fmt,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use quick_cache::{sync::Cache, Weighter};

use super::{
    deadline_after, CachedResponse, ClaimOutcome, CompletedRecord, FencingToken, Fingerprint,
    Ownership, RecordState, Store, StoreError,
};

/// Default bound on the bytes a [`LocalReplayCache`] holds (keys, headers and bodies).
pub const DEFAULT_LOCAL_CACHE_BYTES: u64 = 64 * 1024 * 1024;
/// Default time a completed record is served from a [`LocalReplayCache`] without asking the store.
pub const DEFAULT_LOCAL_CACHE_TTL: Duration = Duration::from_secs(5);

/// Answers replays of recently seen completed keys from process memory, so that a burst of
/// duplicates (a provider's retries, a client's retry loop, many deliveries of one event) costs one
/// store round trip per instance instead of one per duplicate.
///
/// Wraps any [`Store`]; every call except a replay goes to that store unchanged. A record enters
/// the cache when this instance completes it (the store accepted the completion), or when the
/// store answers a claim with [`ClaimOutcome::Completed`], and is served locally for at most
/// [`ttl`](Self::ttl) (default 5 s, and never past the record's remaining lifetime in the store,
/// which the store reports with the record) or until the byte bound ([`max_bytes`](Self::max_bytes), default 64 MiB) evicts it. In-flight records are never cached:
/// only the store decides who runs the handler, so the exactly-once guarantee does not depend on
/// the cache.
///
/// **The trade-off (staleness).** A completed record never changes in the store until it expires,
/// so a locally served replay is byte-identical to the store's. What the cache can get wrong is
/// *absence*: a record that an operator deletes to let a key run again may still be replayed by
/// an instance that cached it, for up to `ttl` (a record that expires in the store leaves the
/// cache no later). Keep `ttl` far
/// below the layer's record TTL (hours by default) and delete keys by waiting `ttl` after the
/// deletion before retrying.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency_core::{IdempotencyLayer, LocalReplayCache, MemoryStore};
///
/// // In production the inner store is a shared one (Postgres, Redis).
/// let store = LocalReplayCache::new(MemoryStore::new())
///     .max_bytes(32 * 1024 * 1024)
///     .ttl(Duration::from_secs(2));
/// let layer = IdempotencyLayer::client_keys(store);
/// # let _ = layer;
/// ```
pub struct LocalReplayCache<S> {
    inner: S,
    entries: Cache<String, Entry, RecordWeight>,
    /// Keys this instance claimed and may complete: the fingerprint a completed record needs is
    /// only known at claim time. Bounded; losing an entry only means that record is not cached
    /// on completion.
    claimed: Cache<String, (FencingToken, Fingerprint)>,
    max_bytes: u64,
    ttl: Duration,
    hits: AtomicU64,
}

#[derive(Clone)]
struct Entry {
    record: CompletedRecord,
    /// Served locally until then: the cache's TTL, capped by `expires_at`.
    served_until: Instant,
    /// When the record expires in the store.
    expires_at: Instant,
}

#[derive(Clone)]
struct RecordWeight;

impl Weighter<String, Entry> for RecordWeight {
    fn weight(&self, key: &String, entry: &Entry) -> u64 {
        let response = &entry.record.response;
        let headers: usize = response
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 32)
            .sum();
        // The fixed part approximates the entry's own size and the map's bookkeeping.
        (key.len() + headers + response.body.len() + 160) as u64
    }
}

impl<S: Store> LocalReplayCache<S> {
    /// Caches up to [`DEFAULT_LOCAL_CACHE_BYTES`] for [`DEFAULT_LOCAL_CACHE_TTL`] each.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            entries: new_cache(DEFAULT_LOCAL_CACHE_BYTES),
            claimed: Cache::new(CLAIMED_CAPACITY),
            max_bytes: DEFAULT_LOCAL_CACHE_BYTES,
            ttl: DEFAULT_LOCAL_CACHE_TTL,
            hits: AtomicU64::new(0),
        }
    }

    /// Bounds the cache's size in bytes (approximate: keys, header names and values, bodies and
    /// a fixed overhead per entry). A record larger than a sixteenth of it is not cached.
    pub fn max_bytes(mut self, max_bytes: u64) -> Self {
        self.entries = new_cache(max_bytes);
        self.max_bytes = max_bytes;
        self
    }

    /// How long a completed record is served locally before the store is asked again.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Replays answered from the cache without calling the store, since the cache was made.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Number of records cached (including ones whose local time ran out but are not evicted yet).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache holds no record.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Claims remembered for filling the cache on completion (about 100 bytes each).
const CLAIMED_CAPACITY: usize = 16 * 1024;

fn new_cache(max_bytes: u64) -> Cache<String, Entry, RecordWeight> {
    let estimated_items = (max_bytes / 2048).max(16) as usize;
    let options = quick_cache::OptionsBuilder::new()
        .estimated_items_capacity(estimated_items)
        .weight_capacity(max_bytes)
        .build()
        .expect("cache options are valid");
    Cache::with_options(
        options,
        RecordWeight,
        Default::default(),
        Default::default(),
    )
}

impl<S> LocalReplayCache<S> {
    fn remember(
        &self,
        key: &str,
        record: CompletedRecord,
        served_until: Instant,
        expires_at: Instant,
    ) {
        if served_until <= Instant::now() {
            return;
        }
        let key = key.to_owned();
        let entry = Entry {
            record,
            served_until,
            expires_at,
        };
        // One large response must not flush hundreds of small ones.
        if RecordWeight.weight(&key, &entry) <= self.max_bytes / 16 {
            self.entries.insert(key, entry);
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for LocalReplayCache<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalReplayCache")
            .field("inner", &self.inner)
            .field("max_bytes", &self.max_bytes)
            .field("ttl", &self.ttl)
            .field("len", &self.entries.len())
            .field("hits", &self.hits.load(Ordering::Relaxed))
            .finish()
    }
}

#[async_trait::async_trait]
impl<S: Store> Store for LocalReplayCache<S> {
    async fn claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        token: FencingToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let now = Instant::now();
        if let Some(entry) = self.entries.get(key) {
            if entry.served_until > now {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(ClaimOutcome::Completed {
                    record: entry.record,
                    ttl_remaining: entry.expires_at.saturating_duration_since(now),
                });
            }
            self.entries.remove(key);
        }
        let outcome = self.inner.claim(key, fingerprint, token, lease).await?;
        match &outcome {
            ClaimOutcome::Completed {
                record,
                ttl_remaining,
            } => {
                // Never past the record's own end in the store.
                let expires_at = deadline_after(now, *ttl_remaining);
                let served_until = deadline_after(now, self.ttl).min(expires_at);
                self.remember(key, record.clone(), served_until, expires_at)
            }
            ClaimOutcome::Claimed { token } => {
                self.claimed.insert(key.to_owned(), (*token, *fingerprint));
            }
            ClaimOutcome::InFlight { .. } => {}
        }
        Ok(outcome)
    }

    async fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Ownership, StoreError> {
        self.inner.renew(key, token, lease).await
    }

    async fn complete(
        &self,
        key: &str,
        token: FencingToken,
        response: &CachedResponse,
        ttl: Duration,
    ) -> Result<Ownership, StoreError> {
        let outcome = self.inner.complete(key, token, response, ttl).await;
        let claim = self.claimed.remove(key).map(|(_, claim)| claim);
        if let (Ok(Ownership::Current), Some((claimed, fingerprint))) = (&outcome, claim) {
            if claimed == token {
                let record = CompletedRecord {
                    fingerprint,
                    // A copy, so the cache never pins the buffer the body was sliced from.
                    response: CachedResponse {
                        body: bytes::Bytes::copy_from_slice(&response.body),
                        ..response.clone()
                    },
                };
                let now = Instant::now();
                self.remember(
                    key,
                    record,
                    deadline_after(now, self.ttl.min(ttl)),
                    deadline_after(now, ttl),
                );
            }
        }
        outcome
    }

    async fn release(&self, key: &str, token: FencingToken) -> Result<Ownership, StoreError> {
        self.claimed.remove(key);
        self.inner.release(key, token).await
    }

    /// Always asks the store: `get` is for inspection, and should see the store's truth.
    async fn get(&self, key: &str) -> Result<Option<RecordState>, StoreError> {
        self.inner.get(key).await
    }

    /// Deletes the record in the store and this instance's cached copy. Other instances'
    /// caches keep theirs for up to [`ttl`](Self::ttl) (see the staleness trade-off above).
    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let forgotten = self.inner.forget(key).await;
        self.entries.remove(key);
        self.claimed.remove(key);
        forgotten
    }

    /// The inner store's name.
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn settlements(&self) -> Option<super::Settlements> {
        self.inner.settlements()
    }
}
