//! The SQLite store's time (SQLite rows are dated by the store, not the database): the wall
//! clock read once, advanced by the monotonic clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `duration` in whole milliseconds (any duration a clock measures fits).
fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn wall_ms() -> i64 {
    // A clock before 1970 would be a broken host; treating it as the epoch keeps every record
    // expired rather than immortal.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(millis)
        .unwrap_or(0)
}

/// The store's time, in unix milliseconds: the wall clock read once, when the store is made,
/// advanced by the monotonic clock from then on. A step of the system clock while the store
/// runs (an NTP correction, an operator's `date -s`) therefore neither expires live leases nor
/// stretches them; the monotonic clock is slewed along with the wall clock, so the two keep the
/// same rate. A step shows up in the store's time only in a store made after it.
pub(crate) struct StoreClock {
    /// Unix milliseconds, read once.
    wall: Box<dyn Fn() -> i64 + Send + Sync>,
    /// Monotonic time since an arbitrary origin.
    monotonic: Box<dyn Fn() -> Duration + Send + Sync>,
    anchor_ms: i64,
    anchor: Duration,
}

impl StoreClock {
    pub(crate) fn system() -> Self {
        let origin = std::time::Instant::now();
        Self::new(Box::new(wall_ms), Box::new(move || origin.elapsed()))
    }

    fn new(
        wall: Box<dyn Fn() -> i64 + Send + Sync>,
        monotonic: Box<dyn Fn() -> Duration + Send + Sync>,
    ) -> Self {
        let (anchor_ms, anchor) = (wall(), monotonic());
        Self {
            wall,
            monotonic,
            anchor_ms,
            anchor,
        }
    }

    pub(crate) fn now_ms(&self) -> i64 {
        let elapsed = (self.monotonic)().saturating_sub(self.anchor);
        self.anchor_ms.saturating_add(millis(elapsed))
    }

    /// How far the wall clock is from the store's time now (positive: the wall clock is ahead).
    fn wall_offset_ms(&self) -> i64 {
        (self.wall)().saturating_sub(self.now_ms())
    }
}

impl std::fmt::Debug for StoreClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreClock")
            .field("now_ms", &self.now_ms())
            .field("wall_offset_ms", &self.wall_offset_ms())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        atomic::{AtomicI64, AtomicU64, Ordering},
        Arc,
    };

    use tower_idempotency_core::{
        CachedResponse, ClaimOutcome, FencingToken, Fingerprint, Ownership, Store,
    };

    use super::*;
    use crate::SqliteStore;

    /// A wall clock and a monotonic clock the test moves by hand.
    #[derive(Default)]
    struct Clocks {
        wall_ms: AtomicI64,
        monotonic_ms: AtomicU64,
    }

    impl Clocks {
        fn store_clock(self: &Arc<Self>) -> StoreClock {
            let (wall, monotonic) = (self.clone(), self.clone());
            StoreClock::new(
                Box::new(move || wall.wall_ms.load(Ordering::SeqCst)),
                Box::new(move || {
                    Duration::from_millis(monotonic.monotonic_ms.load(Ordering::SeqCst))
                }),
            )
        }

        fn advance(&self, wall_ms: i64, monotonic_ms: u64) {
            self.wall_ms.fetch_add(wall_ms, Ordering::SeqCst);
            self.monotonic_ms.fetch_add(monotonic_ms, Ordering::SeqCst);
        }
    }

    /// A store on a fresh database file (each connection of `sqlite::memory:` is a database of
    /// its own), running on clocks the test moves, started at a wall time in 2023 and 5 s of
    /// monotonic time; the file is removed when the guard drops.
    async fn store_on_clocks() -> (Arc<Clocks>, SqliteStore, FileGuard) {
        let clocks = Arc::new(Clocks::default());
        clocks.advance(1_700_000_000_000, 5_000);
        let path = std::env::temp_dir().join(format!("tidem-clock-{}.db", getrandom_suffix()));
        let guard = FileGuard(path.clone());
        let mut store = SqliteStore::connect(&format!("sqlite://{}", path.display()))
            .await
            .expect("open");
        store.migrate().await.expect("migrate");
        store.engine.clock = clocks.store_clock();
        (clocks, store, guard)
    }

    fn getrandom_suffix() -> u64 {
        FencingToken::random().expect("random").0
    }

    struct FileGuard(std::path::PathBuf);

    impl Drop for FileGuard {
        fn drop(&mut self) {
            for suffix in ["", "-wal", "-shm"] {
                let mut path = self.0.clone().into_os_string();
                path.push(suffix);
                let _ = std::fs::remove_file(path);
            }
        }
    }

    #[tokio::test]
    async fn a_wall_clock_step_forward_does_not_expire_a_live_lease() {
        let (clocks, store, _file) = store_on_clocks().await;
        let (fp, lease) = (Fingerprint([1; 32]), Duration::from_secs(60));
        let holder = FencingToken::random().unwrap();
        let claimed = store.claim("k:1", &fp, holder, lease).await.unwrap();
        assert_eq!(claimed, ClaimOutcome::Claimed { token: holder });
        // One second passes; the system clock is stepped two hours ahead meanwhile.
        clocks.advance(2 * 3600 * 1000 + 1000, 1000);
        match store
            .claim("k:1", &fp, FencingToken::random().unwrap(), lease)
            .await
            .unwrap()
        {
            ClaimOutcome::InFlight {
                lease_remaining, ..
            } => {
                assert_eq!(lease_remaining, Duration::from_secs(59))
            }
            other => panic!("the live lease must still hold, got {other:?}"),
        }
        let done = store
            .complete("k:1", holder, &response(), lease)
            .await
            .unwrap();
        assert_eq!(done, Ownership::Current, "the holder keeps its key");
    }

    #[tokio::test]
    async fn a_wall_clock_step_back_does_not_extend_a_lease() {
        let (clocks, store, _file) = store_on_clocks().await;
        let (fp, lease) = (Fingerprint([2; 32]), Duration::from_secs(60));
        let first = FencingToken::random().unwrap();
        store.claim("k:2", &fp, first, lease).await.unwrap();
        // The lease's 60 s pass on the monotonic clock while the wall clock is stepped back.
        clocks.advance(-3600 * 1000, 61_000);
        let second = FencingToken::random().unwrap();
        let outcome = store.claim("k:2", &fp, second, lease).await.unwrap();
        assert_eq!(
            outcome,
            ClaimOutcome::Claimed { token: second },
            "the lease is over"
        );
    }

    fn response() -> CachedResponse {
        CachedResponse {
            status: http::StatusCode::OK,
            headers: http::HeaderMap::new(),
            body: bytes::Bytes::from_static(b"ok"),
            body_omitted: false,
        }
    }
}
