//! Connections a store keeps checked out of its pool, so that one store call is one round trip.
//!
//! Why not run each statement on `&pool`: sqlx 0.8's pool pings a connection when it hands it
//! out (`test_before_acquire`, on by default) and again, unconditionally, when it takes it back
//! (`PoolConnection`'s return to the pool), so a one-statement store call costs three round trips
//! on the wire, not one. Measured on Postgres over loopback with 16 concurrent claims of a
//! completed key (the replay path): 5.9 k claims/s at 85 µs of client CPU each through the pool,
//! 7.3 k/s at 64 µs with only the hand-out ping turned off, 7.3–10.6 k/s at 28 µs on four held
//! connections. A lane holds one connection and runs one statement at a time on it.
//!
//! What the pool's pings protected is kept: a lane that sat idle longer than
//! [`PING_AFTER_IDLE`] pings its connection before using it (and swaps a dead one for a fresh one
//! from the pool), a statement that fails or is cancelled midway gives its connection back to the
//! pool (whose return ping flushes or discards it), and a lane hands its connection back after
//! [`RECYCLE_AFTER`] so the pool's lifetime and idle rules still apply. `Pool::close` waits for
//! every connection to come back, so a task started with the first lane watches for the pool
//! closing and empties the lanes when it does.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, OnceLock,
    },
    time::{Duration, Instant},
};

use sqlx::{pool::PoolConnection, Connection, Database, Pool};
use tokio::sync::{oneshot, Mutex, MutexGuard, Semaphore, SemaphorePermit};

/// A lane unused for longer than this pings its connection before the next statement.
pub(crate) const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// A lane returns its connection to the pool after holding it this long.
pub(crate) const RECYCLE_AFTER: Duration = Duration::from_secs(60);

/// The lanes a store on `pool` uses by default: half the pool's connections, so the other half
/// stays free for the application, the purger and transactions that call `claim_in`.
pub(crate) fn default_lane_count<DB: Database>(pool: &Pool<DB>) -> usize {
    (pool.options().get_max_connections() / 2) as usize
}

/// A fixed set of lanes over one pool. With no lanes, every statement takes a connection from
/// the pool as before.
pub(crate) struct Lanes<DB: Database> {
    pool: Pool<DB>,
    lanes: Arc<[Mutex<Lane<DB>>]>,
    /// One permit per lane: a caller waits for whichever lane frees first, never in the queue of
    /// one lane that may be stuck (a SQLite writer sleeping in its busy handler, say).
    free: Semaphore,
    next: AtomicUsize,
    /// Set when the close watcher starts; dropping it (with the lanes) stops the watcher.
    watcher: OnceLock<oneshot::Sender<()>>,
}

impl<DB: Database> std::fmt::Debug for Lanes<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes")
            .field("pool", &self.pool)
            .field("lanes", &self.lanes.len())
            .finish()
    }
}

struct Lane<DB: Database> {
    connection: Option<PoolConnection<DB>>,
    checked_out: Instant,
    last_used: Instant,
}

impl<DB: Database> Lanes<DB> {
    /// `count` lanes over `pool`, capped at the pool's size; no connection is taken yet.
    pub fn new(pool: Pool<DB>, count: usize) -> Self {
        let count = count.min(pool.options().get_max_connections() as usize);
        let now = Instant::now();
        let lanes = (0..count)
            .map(|_| {
                Mutex::new(Lane {
                    connection: None,
                    checked_out: now,
                    last_used: now,
                })
            })
            .collect();
        Self {
            pool,
            lanes,
            free: Semaphore::new(count),
            next: AtomicUsize::new(0),
            watcher: OnceLock::new(),
        }
    }

    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    pub fn count(&self) -> usize {
        self.lanes.len()
    }

    /// The first lane to be free, starting the search at the next lane in turn.
    pub async fn take(&self) -> Taken<'_, DB> {
        let count = self.lanes.len();
        if count == 0 {
            return Taken {
                pool: &self.pool,
                held: Held::Pooled(None),
                _permit: None,
                settled: false,
            };
        }
        self.watch_for_close();
        let permit = self
            .free
            .acquire()
            .await
            .expect("the semaphore is never closed");
        let start = self.next.fetch_add(1, Ordering::Relaxed) % count;
        // With a permit, at most `count - 1` other callers hold lanes, so one is free; it can
        // only be missed while a finishing caller has released its permit but not yet its lane
        // (or while the close watcher holds it), hence the retry.
        let lane = loop {
            let free = (0..count).find_map(|i| self.lanes[(start + i) % count].try_lock().ok());
            match free {
                Some(lane) => break lane,
                None => tokio::task::yield_now().await,
            }
        };
        Taken {
            pool: &self.pool,
            held: Held::Lane(lane),
            _permit: Some(permit),
            settled: false,
        }
    }
}

impl<DB: Database> Drop for Lanes<DB> {
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            return; // each held connection goes back to the pool as usual
        }
        // Outside a runtime a `PoolConnection`'s drop panics (it spawns its return to the pool),
        // e.g. for a store dropped after its runtime shut down: close the connections instead.
        let keeps_minimum = self.pool.options().get_min_connections() > 0;
        for lane in self.lanes.iter() {
            let Ok(mut lane) = lane.try_lock() else {
                continue;
            };
            if let Some(connection) = lane.connection.take() {
                if keeps_minimum {
                    // Even a detached connection's drop spawns the pool's top-up task then; the
                    // pool is being dropped without a runtime anyway, so let the socket go.
                    std::mem::forget(connection);
                } else {
                    drop(connection.detach());
                }
            }
        }
    }
}

impl<DB: Database> Lanes<DB> {
    /// Started on first use rather than in `new`, which may run outside a runtime.
    fn watch_for_close(&self) {
        self.watcher.get_or_init(|| {
            let (stop, stopped) = oneshot::channel::<()>();
            let closed = self.pool.close_event();
            let lanes = Arc::downgrade(&self.lanes);
            tokio::spawn(async move {
                tokio::select! {
                    _ = closed => {
                        let Some(lanes) = lanes.upgrade() else { return };
                        for lane in lanes.iter() {
                            lane.lock().await.connection = None;
                        }
                    }
                    _ = stopped => {}
                }
            });
            stop
        });
    }
}

enum Held<'a, DB: Database> {
    Lane(MutexGuard<'a, Lane<DB>>),
    /// No lanes: a connection from the pool for this statement only.
    Pooled(Option<PoolConnection<DB>>),
}

/// A lane (or a pooled connection) for one statement. Call [`Taken::settle`] when the statement
/// finished; dropped unsettled (an error, a cancelled future), the connection goes back to the
/// pool, which checks it before anyone reuses it.
pub(crate) struct Taken<'a, DB: Database> {
    pool: &'a Pool<DB>,
    held: Held<'a, DB>,
    /// Declared after `held`, so the lane is unlocked before its permit is given back.
    _permit: Option<SemaphorePermit<'a>>,
    settled: bool,
}

impl<DB: Database> Taken<'_, DB> {
    /// The connection to run the statement on.
    pub async fn connection(&mut self) -> Result<&mut DB::Connection, sqlx::Error> {
        let pool = self.pool;
        let slot = match &mut self.held {
            Held::Pooled(slot) => slot,
            Held::Lane(lane) => {
                let now = Instant::now();
                let lane = &mut **lane;
                if pool.is_closed() {
                    lane.connection = None;
                    return Err(sqlx::Error::PoolClosed);
                }
                if lane.connection.is_some()
                    && now.saturating_duration_since(lane.checked_out) > RECYCLE_AFTER
                {
                    lane.connection = None;
                }
                if let Some(connection) = &mut lane.connection {
                    if now.saturating_duration_since(lane.last_used) > PING_AFTER_IDLE
                        && connection.ping().await.is_err()
                    {
                        lane.connection = None;
                    }
                }
                if lane.connection.is_none() {
                    lane.checked_out = now;
                }
                &mut lane.connection
            }
        };
        if slot.is_none() {
            *slot = Some(pool.acquire().await?);
        }
        Ok(&mut **slot.as_mut().expect("filled above"))
    }

    /// The statement ran to the end, successfully: keep the connection on the lane when `ok`,
    /// give it back to the pool otherwise.
    pub fn settle(mut self, ok: bool) {
        self.settled = ok;
    }
}

impl<DB: Database> Drop for Taken<'_, DB> {
    fn drop(&mut self) {
        if let Held::Lane(lane) = &mut self.held {
            if self.settled {
                lane.last_used = Instant::now();
            } else {
                // Back to the pool, whose return ping flushes whatever the interrupted statement
                // left on the wire, or closes the connection if it is broken.
                lane.connection = None;
            }
        }
    }
}
