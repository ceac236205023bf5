//! A bounded in-memory store for development, tests and single-process deployments.

use std::{
    collections::{HashMap, VecDeque},
    hash::BuildHasher,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
// The layer's keys are SHA-256 digests, which nobody can steer into colliding buckets, so the
// seeded-but-fast foldhash replaces SipHash, which a first request would run three to four times
// over the ~75-byte key (`cargo bench -p tower-idempotency-core --bench layer` shows the layer's
// cost per request).
use foldhash::fast::RandomState;

use super::{
    deadline_after, CachedResponse, ClaimOutcome, CompletedRecord, FencingToken, Fingerprint,
    Ownership, RecordState, Store, StoreError,
};

const SHARDS: usize = 16;

/// Bytes counted for every record besides its key, body and headers (the map entry, the
/// fingerprint, the deadlines).
const RECORD_OVERHEAD: usize = 128;
/// Bytes counted for every header besides its name and value.
const HEADER_OVERHEAD: usize = 32;

type Map = HashMap<String, Entry, RandomState>;

/// One lock's worth of records.
#[derive(Debug, Default)]
struct Shard {
    map: Map,
    /// No record in `map` expires before this (a lower bound: every new or moved deadline is
    /// noted, a renewal that shortens a lease included). A full shard whose bound lies ahead has nothing to purge, so a claim refused for
    /// capacity costs a comparison instead of a scan of the whole shard under its lock.
    earliest_deadline: Option<Instant>,
    /// Completed keys in the order they completed, oldest first, each with the sequence number
    /// of its completion. An entry whose record was since removed or replaced no longer matches
    /// the record's number and is skipped.
    completed: VecDeque<(String, u64)>,
    /// The sequence number of the next completion.
    next_seq: u64,
    /// Bytes held by the records in `map`, as [`record_bytes`] counts them.
    bytes: usize,
}

impl Shard {
    fn note_deadline(&mut self, deadline: Instant) {
        self.earliest_deadline = Some(match self.earliest_deadline {
            Some(earliest) => earliest.min(deadline),
            None => deadline,
        });
    }

    /// Inserts or replaces a record, keeping the byte count.
    fn insert(&mut self, key: String, entry: Entry) {
        let key_len = key.len();
        self.bytes += entry.bytes(key_len);
        if let Some(old) = self.map.insert(key, entry) {
            self.bytes -= old.bytes(key_len);
        }
    }

    /// Removes a record, keeping the byte count.
    fn remove(&mut self, key: &str) -> Option<Entry> {
        let old = self.map.remove(key)?;
        self.bytes -= old.bytes(key.len());
        Some(old)
    }

    /// Drops expired records, if any can have expired by `now`; returns how many.
    fn purge(&mut self, now: Instant) -> usize {
        if self.earliest_deadline.is_none_or(|earliest| earliest > now) {
            return 0;
        }
        let before = self.map.len();
        let bytes = &mut self.bytes;
        self.map.retain(|key, entry| {
            let live = entry.is_live(now);
            if !live {
                *bytes -= entry.bytes(key.len());
            }
            live
        });
        self.earliest_deadline = self.map.values().map(Entry::deadline).min();
        self.compact_completed();
        before - self.map.len()
    }

    /// Whether `(key, seq)` from the completion queue still names a completed record.
    fn is_current(map: &Map, key: &str, seq: u64) -> bool {
        matches!(map.get(key), Some(Entry::Completed { seq: current, .. }) if *current == seq)
    }

    /// Drops the queue entries whose record was removed or replaced.
    fn compact_completed(&mut self) {
        let map = &self.map;
        self.completed
            .retain(|(key, seq)| Self::is_current(map, key, *seq));
    }

    /// Removes the oldest completed record, unless it is the completion numbered `keep`;
    /// returns whether one was removed. In-flight records are never removed here.
    fn evict_oldest_completed(&mut self, keep: Option<u64>) -> bool {
        while let Some((key, seq)) = self.completed.front() {
            if !Self::is_current(&self.map, key, *seq) {
                self.completed.pop_front();
                continue;
            }
            if Some(*seq) == keep {
                return false;
            }
            let (key, _) = self.completed.pop_front().expect("front exists");
            self.remove(&key);
            return true;
        }
        false
    }
}

/// An in-memory [`Store`]: a sharded hash map bounded by record count and by bytes.
///
/// **Single process only.** It forgets everything on restart and cannot coordinate two instances
/// of an application; use the SQLite, Postgres or Redis store for that.
///
/// The bounds are split evenly over 16 shards. When a shard is full (by count when a new key
/// is claimed, by bytes when a response is stored), expired records are purged first; if that
/// is not enough, the oldest *completed* records of the shard are evicted, in the order they
/// completed: their replay window ends early, so a retry after that runs the handler again.
/// Every eviction is counted ([`MemoryStore::evictions`]; the first is logged at `warn`, each
/// one at `debug`). An in-flight record is never evicted (a duplicate would run the handler
/// while the first still runs): a shard whose every record is in flight refuses a new key with
/// [`StoreError::CapacityExceeded`] (the layer answers `503`). A single record larger than a
/// shard's share of the byte bound is refused with [`StoreError::RecordTooLarge`]; the layer
/// then stores it without its body.
///
/// ```
/// use tower_idempotency_core::MemoryStore;
/// let store = MemoryStore::new()
///     .with_max_entries(50_000)
///     .with_max_bytes(64 * 1024 * 1024);
/// # let _ = store;
/// ```
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    max_per_shard: usize,
    max_bytes_per_shard: usize,
    evictions: AtomicU64,
    warned_eviction: AtomicBool,
}

#[derive(Debug)]
enum Entry {
    InFlight {
        fingerprint: Fingerprint,
        token: FencingToken,
        lease_until: Instant,
    },
    Completed {
        record: CompletedRecord,
        expires_at: Instant,
        /// Position in the shard's completion order.
        seq: u64,
    },
}

impl Entry {
    fn deadline(&self) -> Instant {
        match self {
            Entry::InFlight { lease_until, .. } => *lease_until,
            Entry::Completed { expires_at, .. } => *expires_at,
        }
    }

    fn is_live(&self, now: Instant) -> bool {
        self.deadline() > now
    }

    fn bytes(&self, key_len: usize) -> usize {
        match self {
            Entry::InFlight { .. } => key_len + RECORD_OVERHEAD,
            Entry::Completed { record, .. } => record_bytes(key_len, &record.response),
        }
    }
}

/// The bytes a completed record is counted for: its key, body and headers and a fixed overhead.
fn record_bytes(key_len: usize, response: &CachedResponse) -> usize {
    let headers: usize = response
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + HEADER_OVERHEAD)
        .sum();
    key_len + RECORD_OVERHEAD + response.body.len() + headers
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// The default bound on live records: 100 000.
    pub const DEFAULT_MAX_ENTRIES: usize = 100_000;
    /// The default bound on the bytes records hold: 256 MiB (each of the 16 shards holds up to
    /// 16 MiB, so a record of up to 16 MiB fits).
    pub const DEFAULT_MAX_BYTES: usize = 256 * 1024 * 1024;

    /// A store holding up to [`DEFAULT_MAX_ENTRIES`](Self::DEFAULT_MAX_ENTRIES) records and
    /// [`DEFAULT_MAX_BYTES`](Self::DEFAULT_MAX_BYTES) bytes.
    pub fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::default(),
            max_per_shard: Self::DEFAULT_MAX_ENTRIES.div_ceil(SHARDS),
            max_bytes_per_shard: Self::DEFAULT_MAX_BYTES.div_ceil(SHARDS),
            evictions: AtomicU64::new(0),
            warned_eviction: AtomicBool::new(false),
        }
    }

    /// Bounds the number of records (rounded up to a multiple of the shard count).
    pub fn with_max_entries(mut self, max_entries: usize) -> Self {
        self.max_per_shard = max_entries.div_ceil(SHARDS).max(1);
        self
    }

    /// Bounds the bytes records hold: keys, bodies and headers, plus a fixed overhead per record
    /// (rounded up to a multiple of the shard count). A single record larger than a sixteenth
    /// of it is refused with [`StoreError::RecordTooLarge`].
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes_per_shard = max_bytes.div_ceil(SHARDS).max(1);
        self
    }

    /// Number of records held, live or expired but not yet purged.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Whether the store holds no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held by the records, as counted against [`with_max_bytes`](Self::with_max_bytes).
    pub fn bytes(&self) -> usize {
        self.shards.iter().map(|s| lock(s).bytes).sum()
    }

    /// How many completed records were evicted before their TTL to make room.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Drops every expired record and returns how many were dropped.
    pub fn purge_expired(&self) -> usize {
        let now = Instant::now();
        self.shards.iter().map(|shard| lock(shard).purge(now)).sum()
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        let index = self.hasher.hash_one(key) as usize % SHARDS;
        &self.shards[index]
    }

    /// Evicts the oldest completed record of `shard` (never the completion numbered `keep`),
    /// counting and logging it; returns whether one was evicted.
    fn evict(&self, shard: &mut Shard, keep: Option<u64>) -> bool {
        if !shard.evict_oldest_completed(keep) {
            return false;
        }
        self.evictions.fetch_add(1, Ordering::Relaxed);
        if !self.warned_eviction.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "memory store full: evicting the oldest completed records (their replay window ends early; see MemoryStore::evictions)"
            );
        }
        tracing::debug!("memory store evicted a completed record");
        true
    }

    fn fenced<T>(
        &self,
        key: &str,
        token: FencingToken,
        apply: impl FnOnce(&mut Shard) -> T,
    ) -> Ownership {
        let mut shard = lock(self.shard(key));
        match shard.map.get(key) {
            Some(Entry::InFlight { token: current, .. }) if *current == token => {
                apply(&mut shard);
                Ownership::Current
            }
            _ => Ownership::Stale,
        }
    }
}

// A poisoned shard only means another thread panicked between two statements that each leave the
// map consistent, so the data is still usable.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        token: FencingToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let now = Instant::now();
        let mut shard = lock(self.shard(key));
        match shard.map.get(key) {
            Some(Entry::InFlight {
                token: holder,
                lease_until,
                ..
            }) if *lease_until > now && *holder == token => {
                return Ok(ClaimOutcome::Claimed { token })
            }
            Some(Entry::InFlight {
                fingerprint,
                lease_until,
                ..
            }) if *lease_until > now => {
                return Ok(ClaimOutcome::InFlight {
                    fingerprint: *fingerprint,
                    lease_remaining: *lease_until - now,
                })
            }
            Some(Entry::Completed {
                record, expires_at, ..
            }) if *expires_at > now => {
                return Ok(ClaimOutcome::Completed {
                    record: record.clone(),
                    ttl_remaining: *expires_at - now,
                })
            }
            Some(_) => {}
            None => {
                if shard.map.len() >= self.max_per_shard {
                    shard.purge(now);
                    if shard.map.len() >= self.max_per_shard && !self.evict(&mut shard, None) {
                        return Err(StoreError::CapacityExceeded(self.max_per_shard * SHARDS));
                    }
                }
            }
        }
        let lease_until = deadline_after(now, lease);
        shard.note_deadline(lease_until);
        shard.insert(
            key.to_owned(),
            Entry::InFlight {
                fingerprint: *fingerprint,
                token,
                lease_until,
            },
        );
        Ok(ClaimOutcome::Claimed { token })
    }

    async fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Ownership, StoreError> {
        let new_until = deadline_after(Instant::now(), lease);
        Ok(self.fenced(key, token, |shard| {
            // A renewal may shorten the lease: the purge bound must follow it down.
            shard.note_deadline(new_until);
            if let Some(Entry::InFlight { lease_until, .. }) = shard.map.get_mut(key) {
                *lease_until = new_until;
            }
        }))
    }

    async fn complete(
        &self,
        key: &str,
        token: FencingToken,
        response: &CachedResponse,
        ttl: Duration,
    ) -> Result<Ownership, StoreError> {
        let now = Instant::now();
        let expires_at = deadline_after(now, ttl);
        let mut shard = lock(self.shard(key));
        let fingerprint = match shard.map.get(key) {
            Some(Entry::InFlight {
                token: current,
                fingerprint,
                ..
            }) if *current == token => *fingerprint,
            _ => return Ok(Ownership::Stale),
        };
        let size = record_bytes(key.len(), response);
        if size > self.max_bytes_per_shard {
            return Err(StoreError::RecordTooLarge {
                size,
                limit: self.max_bytes_per_shard,
            });
        }
        // Copy the body: the caller's `Bytes` is often a slice of a larger buffer (hyper's read
        // buffer), which a shallow clone would keep alive for the whole TTL (measured: 8.7 KB
        // held per cached 1 KiB response, 131 KB per 64 KiB one, against 1.6 KB and 66 KB with
        // the copy; an A/B run of the load harness showed no throughput difference at 64 KiB).
        let response = CachedResponse {
            body: Bytes::copy_from_slice(&response.body),
            ..response.clone()
        };
        let seq = shard.next_seq;
        shard.next_seq += 1;
        shard.note_deadline(expires_at);
        shard.insert(
            key.to_owned(),
            Entry::Completed {
                record: CompletedRecord {
                    fingerprint,
                    response,
                },
                expires_at,
                seq,
            },
        );
        shard.completed.push_back((key.to_owned(), seq));
        if shard.bytes > self.max_bytes_per_shard {
            shard.purge(now);
        }
        while shard.bytes > self.max_bytes_per_shard && self.evict(&mut shard, Some(seq)) {}
        // Entries of records removed by release, reclaim or TTL pile up only this far.
        if shard.completed.len() > 2 * shard.map.len() + 64 {
            shard.compact_completed();
        }
        Ok(Ownership::Current)
    }

    async fn release(&self, key: &str, token: FencingToken) -> Result<Ownership, StoreError> {
        Ok(self.fenced(key, token, |shard| shard.remove(key)))
    }

    async fn get(&self, key: &str) -> Result<Option<RecordState>, StoreError> {
        let now = Instant::now();
        let shard = lock(self.shard(key));
        Ok(match shard.map.get(key) {
            Some(entry) if !entry.is_live(now) => None,
            Some(Entry::InFlight {
                fingerprint,
                token,
                lease_until,
            }) => Some(RecordState::InFlight {
                fingerprint: *fingerprint,
                token: *token,
                lease_remaining: *lease_until - now,
            }),
            Some(Entry::Completed {
                record, expires_at, ..
            }) => Some(RecordState::Completed {
                record: record.clone(),
                ttl_remaining: *expires_at - now,
            }),
            None => None,
        })
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let now = Instant::now();
        let removed = lock(self.shard(key)).remove(key);
        Ok(removed.is_some_and(|entry| entry.is_live(now)))
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Completes `key` with `body` and returns the body the store replays.
    async fn stored_body(store: &MemoryStore, key: &str, body: Bytes) -> Bytes {
        let fp = Fingerprint([3; 32]);
        let Ok(ClaimOutcome::Claimed { token }) = store
            .claim(
                key,
                &fp,
                FencingToken::random().unwrap(),
                Duration::from_secs(60),
            )
            .await
        else {
            panic!("fresh key");
        };
        let response = CachedResponse {
            status: http::StatusCode::OK,
            headers: http::HeaderMap::new(),
            body,
            body_omitted: false,
        };
        let done = store
            .complete(key, token, &response, Duration::from_secs(60))
            .await;
        assert_eq!(done.unwrap(), Ownership::Current);
        match store
            .claim(
                key,
                &fp,
                FencingToken::random().unwrap(),
                Duration::from_secs(60),
            )
            .await
        {
            Ok(ClaimOutcome::Completed { record, .. }) => record.response.body,
            other => panic!("expected the completed record, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn cached_bodies_are_copied_out_of_their_buffer() {
        let store = MemoryStore::new();
        // A body sliced out of a larger buffer, as hyper's read buffer hands it out.
        let buffer = Bytes::from(vec![b's'; 8 * 1024]);
        let small = buffer.slice(100..1124);
        let kept = stored_body(&store, "k:small", small.clone()).await;
        assert_eq!(kept, small);
        assert_ne!(
            kept.as_ptr(),
            small.as_ptr(),
            "copied: the 8 KiB buffer is not pinned"
        );
    }

    #[tokio::test]
    async fn a_completion_with_a_short_ttl_frees_its_place_when_it_expires() {
        // One record per shard; the only record is completed with a TTL far shorter than the
        // lease it was claimed with, so the shard's expiry bound must follow the completion.
        let store = MemoryStore::new().with_max_entries(1);
        let fp = Fingerprint([1; 32]);
        let long = Duration::from_secs(60);
        let Ok(ClaimOutcome::Claimed { token }) = store
            .claim("a", &fp, FencingToken::random().unwrap(), long)
            .await
        else {
            panic!("fresh key");
        };
        // A key that lands in the shard of "a", found while "a" is in flight and cannot be
        // evicted (every other shard is empty again at once).
        let mut same_shard = None;
        for i in 0..10_000 {
            let key = format!("b:{i}");
            match store
                .claim(&key, &fp, FencingToken::random().unwrap(), long)
                .await
            {
                Ok(ClaimOutcome::Claimed { token }) => {
                    store.release(&key, token).await.unwrap();
                }
                Err(StoreError::CapacityExceeded(_)) => {
                    same_shard = Some(key);
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let key = same_shard.expect("some key shares the shard of `a`");
        let response = CachedResponse {
            status: http::StatusCode::OK,
            headers: http::HeaderMap::new(),
            body: Bytes::from_static(b"done"),
            body_omitted: false,
        };
        let ttl = Duration::from_millis(50);
        let done = store.complete("a", token, &response, ttl).await;
        assert_eq!(done.unwrap(), Ownership::Current);
        // Waiting for the TTL to pass is the point of the test; there is no event to await.
        tokio::time::sleep(ttl * 2).await;
        let after = store
            .claim(&key, &fp, FencingToken::random().unwrap(), long)
            .await;
        assert!(
            matches!(after, Ok(ClaimOutcome::Claimed { .. })),
            "the expired completion must be purged to make room: {after:?}"
        );
        assert_eq!(store.evictions(), 0, "purged as expired, not evicted");
    }

    #[tokio::test]
    async fn a_full_store_refuses_new_claims_until_records_expire() {
        let store = MemoryStore::new().with_max_entries(SHARDS);
        let fp = Fingerprint([1; 32]);
        let lease = Duration::from_millis(100);
        let mut refused = None;
        for i in 0..10 * SHARDS {
            match store
                .claim(
                    &format!("k:{i}"),
                    &fp,
                    FencingToken::random().unwrap(),
                    lease,
                )
                .await
            {
                Ok(ClaimOutcome::Claimed { .. }) => {}
                Err(StoreError::CapacityExceeded(limit)) => {
                    refused = Some(i);
                    assert_eq!(limit, SHARDS);
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let refused = refused.expect("a bounded store must refuse once full");
        assert!(store.len() <= SHARDS);
        // Live records are never evicted to make room: that would let a duplicate run twice.
        let blocked = store
            .claim(
                &format!("k:{refused}"),
                &fp,
                FencingToken::random().unwrap(),
                lease,
            )
            .await;
        assert!(matches!(blocked, Err(StoreError::CapacityExceeded(_))));
        tokio::time::sleep(lease * 2).await;
        let after = store
            .claim(
                &format!("k:{refused}"),
                &fp,
                FencingToken::random().unwrap(),
                lease,
            )
            .await;
        assert!(
            matches!(after, Ok(ClaimOutcome::Claimed { .. })),
            "{after:?}"
        );
        store.purge_expired();
        assert!(store.len() <= 1);
    }
}
