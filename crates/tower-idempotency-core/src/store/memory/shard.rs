//! A shard of the memory store: its records, their byte count, expiry and the eviction order of
//! the completed ones.

use std::{
    collections::{HashMap, VecDeque},
    sync::Mutex,
    time::Instant,
};

use foldhash::fast::RandomState;

use crate::store::{CachedResponse, CompletedRecord, FencingToken, Fingerprint};

/// Bytes counted for every record besides its key, body and headers (the map entry, the
/// fingerprint, the deadlines).
const RECORD_OVERHEAD: usize = 128;
/// Bytes counted for every header besides its name and value.
const HEADER_OVERHEAD: usize = 32;

pub(super) type Map = HashMap<String, Entry, RandomState>;

/// One lock's worth of records.
#[derive(Debug, Default)]
pub(super) struct Shard {
    pub(super) map: Map,
    /// No record in `map` expires before this (a lower bound: every new or moved deadline is
    /// noted, a renewal that shortens a lease included). A full shard whose bound lies ahead has
    /// nothing to purge, so a claim refused for capacity costs a comparison instead of a scan of
    /// the whole shard under its lock.
    pub(super) earliest_deadline: Option<Instant>,
    /// Completed keys in the order they completed, oldest first, each with the sequence number
    /// of its completion. An entry whose record was since removed or replaced no longer matches
    /// the record's number and is skipped.
    pub(super) completed: VecDeque<(String, u64)>,
    /// The sequence number of the next completion.
    pub(super) next_seq: u64,
    /// Bytes held by the records in `map`, as [`record_bytes`] counts them.
    pub(super) bytes: usize,
}

impl Shard {
    pub(super) fn note_deadline(&mut self, deadline: Instant) {
        self.earliest_deadline = Some(match self.earliest_deadline {
            Some(earliest) => earliest.min(deadline),
            None => deadline,
        });
    }

    /// Inserts or replaces a record, keeping the byte count.
    pub(super) fn insert(&mut self, key: String, entry: Entry) {
        let key_len = key.len();
        self.bytes += entry.bytes(key_len);
        if let Some(old) = self.map.insert(key, entry) {
            self.bytes -= old.bytes(key_len);
        }
    }

    /// Removes a record, keeping the byte count.
    pub(super) fn remove(&mut self, key: &str) -> Option<Entry> {
        let old = self.map.remove(key)?;
        self.bytes -= old.bytes(key.len());
        Some(old)
    }

    /// Drops expired records, if any can have expired by `now`; returns how many.
    pub(super) fn purge(&mut self, now: Instant) -> usize {
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
    pub(super) fn compact_completed(&mut self) {
        let map = &self.map;
        self.completed
            .retain(|(key, seq)| Self::is_current(map, key, *seq));
    }

    /// Removes the oldest completed record, unless it is the completion numbered `keep`;
    /// returns whether one was removed. In-flight records are never removed here.
    pub(super) fn evict_oldest_completed(&mut self, keep: Option<u64>) -> bool {
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

#[derive(Debug)]
pub(super) enum Entry {
    InFlight {
        fingerprint: Fingerprint,
        token: FencingToken,
        lease_until: Instant,
    },
    Completed {
        record: CompletedRecord,
        /// The token that completed it: a resend of that completion is answered `Current`.
        token: FencingToken,
        expires_at: Instant,
        /// Position in the shard's completion order.
        seq: u64,
    },
}

impl Entry {
    pub(super) fn deadline(&self) -> Instant {
        match self {
            Entry::InFlight { lease_until, .. } => *lease_until,
            Entry::Completed { expires_at, .. } => *expires_at,
        }
    }

    pub(super) fn is_live(&self, now: Instant) -> bool {
        self.deadline() > now
    }

    pub(super) fn bytes(&self, key_len: usize) -> usize {
        match self {
            Entry::InFlight { .. } => key_len + RECORD_OVERHEAD,
            Entry::Completed { record, .. } => record_bytes(key_len, &record.response),
        }
    }
}

/// The bytes a completed record is counted for: its key, body and headers and a fixed overhead.
pub(super) fn record_bytes(key_len: usize, response: &CachedResponse) -> usize {
    let headers: usize = response
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + HEADER_OVERHEAD)
        .sum();
    key_len + RECORD_OVERHEAD + response.body.len() + headers
}

// A poisoned shard only means another thread panicked between two statements that each leave the
// map consistent, so the data is still usable.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
