//! A bounded in-memory store for development, tests and single-process deployments.

use std::{
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

use self::shard::{lock, record_bytes, Entry, Shard};
use super::{
    deadline_after, CachedResponse, ClaimOutcome, CompletedRecord, FencingToken, Fingerprint,
    Ownership, RecordState, Store, StoreError,
};

mod shard;

const SHARDS: usize = 16;

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
            // A resend of the completion that landed (the contract allows `Current`).
            Some(Entry::Completed {
                token: completed_by,
                expires_at,
                ..
            }) if *completed_by == token && *expires_at > now => return Ok(Ownership::Current),
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
        // buffer), which a shallow clone would keep alive for the whole TTL, several times the
        // response's size held per record. The unit test
        // `cached_bodies_are_copied_out_of_their_buffer` checks the copy; the load harness shows
        // what it costs at 64 KiB.
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
                token,
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
mod tests;
