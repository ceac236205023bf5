//! Connections a store keeps checked out of its pool, so that one store call is one round trip.
//!
//! Why (sqlx's pool pings a connection when it hands it out and again when it takes it back):
//! docs/stores.md, "Connection lanes"; the load harness's `--store-lanes 0` runs every statement
//! through the pool instead. A lane holds one connection and runs one statement at a time on it.
//!
//! What the pool's pings protected is kept: a lane that sat idle longer than
//! [`PING_AFTER_IDLE`] pings its connection before using it (and swaps a dead one for a fresh one
//! from the pool), a statement that fails or is cancelled midway gives its connection back to the
//! pool (whose return ping flushes or discards it), and a lane hands its connection back after
//! [`RECYCLE_AFTER`] (checked at its next statement and by a sweep for idle lanes) so the
//! pool's lifetime and idle rules still apply. Waiting for a lane, and the idle ping, are
//! bounded by the pool's `acquire_timeout`, as a pool acquire is. `Pool::close` waits for every
//! connection to come back, so a task (started with the first lane, restarted if its runtime
//! went away) empties the lanes when the pool closes.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
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

/// At most all but one of the pool's connections, so `migrate`, the purger and `claim_in` can
/// always get one.
pub(crate) fn lane_limit<DB: Database>(pool: &Pool<DB>) -> usize {
    (pool.options().get_max_connections() as usize).saturating_sub(1)
}

/// A store's lanes. For a database that takes one writer at a time (SQLite), writes run on a
/// lane of their own (where the store has no writer thread, see the SQLite store's `writer.rs`) and reads
/// on the others: the writer lane serialises writes in the process
/// (a writer waits on an async lock, not in SQLite's busy handler, which sleeps and retries),
/// and reads, which in WAL mode never wait for the writer, run in parallel beside it. For
/// other databases every statement takes any lane.
pub struct StoreLanes<DB: Database> {
    /// Shared with an engine that runs writes on them from tasks of its own (Postgres's
    /// coalescer).
    writes: Arc<Lanes<DB>>,
    /// `None`: reads share the write lanes.
    reads: Option<Lanes<DB>>,
}

impl<DB: Database> StoreLanes<DB> {
    /// `count` lanes over `pool` (capped at all but one of its connections); with
    /// `one_writer` and at least two lanes, one of them is the writer.
    pub fn new(pool: Pool<DB>, count: usize, one_writer: bool) -> Self {
        let count = count.min(lane_limit(&pool));
        if one_writer && count >= 2 {
            Self {
                writes: Arc::new(Lanes::new(pool.clone(), 1)),
                reads: Some(Lanes::new(pool, count - 1)),
            }
        } else {
            Self {
                writes: Arc::new(Lanes::new(pool, count)),
                reads: None,
            }
        }
    }

    /// The lanes of statements that may write.
    pub fn writes(&self) -> &Lanes<DB> {
        &self.writes
    }

    /// The write lanes, for an engine's tasks to share.
    pub fn shared_writes(&self) -> Arc<Lanes<DB>> {
        self.writes.clone()
    }

    /// The lanes of statements that only read.
    pub fn reads(&self) -> &Lanes<DB> {
        self.reads.as_ref().unwrap_or(&self.writes)
    }

    pub fn count(&self) -> usize {
        self.writes.count() + self.reads.as_ref().map_or(0, Lanes::count)
    }
}

impl<DB: Database> std::fmt::Debug for StoreLanes<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreLanes")
            .field("writes", &self.writes)
            .field("reads", &self.reads)
            .finish()
    }
}

/// A fixed set of lanes over one pool. With no lanes, every statement takes a connection from
/// the pool for itself.
pub struct Lanes<DB: Database> {
    pool: Pool<DB>,
    lanes: Arc<[Mutex<Lane<DB>>]>,
    /// One permit per lane: a caller waits for whichever lane frees first, never in the queue of
    /// one lane that may be stuck (a SQLite writer sleeping in its busy handler, say).
    free: Semaphore,
    next: AtomicUsize,
    /// True while a watcher task is alive (it clears the flag when it ends or is dropped).
    watching: Arc<AtomicBool>,
    /// Dropping the sender (with the lanes) stops the current watcher.
    stop_watcher: std::sync::Mutex<Option<oneshot::Sender<()>>>,
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

impl<DB: Database> Lane<DB> {
    /// Hands the connection back to the pool once the lane has held it for [`RECYCLE_AFTER`].
    fn recycle_if_due(&mut self, now: Instant) {
        if now.saturating_duration_since(self.checked_out) > RECYCLE_AFTER {
            self.connection = None;
        }
    }
}

impl<DB: Database> Lanes<DB> {
    /// `count` lanes over `pool`, capped at all but one of the pool's connections; no
    /// connection is taken yet.
    pub fn new(pool: Pool<DB>, count: usize) -> Self {
        let count = count.min(lane_limit(&pool));
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
            watching: Arc::new(AtomicBool::new(false)),
            stop_watcher: std::sync::Mutex::new(None),
        }
    }

    pub fn count(&self) -> usize {
        self.lanes.len()
    }

    /// How many lanes are free now (`0` without lanes).
    pub fn free(&self) -> usize {
        self.free.available_permits()
    }

    /// The first lane to be free, starting the search at the next lane in turn; waits at most
    /// the pool's `acquire_timeout` (then `PoolTimedOut`, as a pool acquire would fail).
    pub async fn take(&self) -> Result<Taken<'_, DB>, sqlx::Error> {
        let count = self.lanes.len();
        if count == 0 {
            return Ok(Taken {
                pool: &self.pool,
                held: Held::Pooled(None),
                _permit: None,
                settled: false,
                used: true,
            });
        }
        self.watch_for_close();
        let limit = self.pool.options().get_acquire_timeout();
        let permit = tokio::time::timeout(limit, self.free.acquire())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
            .expect("the semaphore is never closed");
        let start = self.next.fetch_add(1, Ordering::Relaxed) % count;
        // With a permit, at most `count - 1` other callers hold lanes, so one is free; it can
        // only be missed while the close watcher or the idle sweep holds it, hence the retry.
        let lane = loop {
            let free = (0..count).find_map(|i| self.lanes[(start + i) % count].try_lock().ok());
            match free {
                Some(lane) => break lane,
                None => tokio::task::yield_now().await,
            }
        };
        Ok(Taken {
            pool: &self.pool,
            held: Held::Lane(lane),
            _permit: Some(permit),
            settled: false,
            used: true,
        })
    }
}

impl<DB: Database> Drop for Lanes<DB> {
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            return; // each held connection goes back to the pool as usual
        }
        // Outside a runtime a `PoolConnection`'s drop panics (it spawns its return to the pool),
        // e.g. for a store dropped after its runtime shut down. Drop them inside a throwaway
        // runtime: the spawned returns are dropped with it, which closes the connections and
        // gives their places in the pool back.
        let held: Vec<PoolConnection<DB>> = self
            .lanes
            .iter()
            .filter_map(|lane| lane.try_lock().ok()?.connection.take())
            .collect();
        if held.is_empty() {
            return;
        }
        match tokio::runtime::Builder::new_current_thread().build() {
            Ok(runtime) => {
                let _entered = runtime.enter();
                drop(held);
            }
            // Without a runtime only a detach avoids the spawn (when the pool keeps no minimum
            // of connections; otherwise even that spawns, and the connections are leaked).
            Err(_) if self.pool.options().get_min_connections() == 0 => {
                held.into_iter().for_each(|c| drop(c.detach()))
            }
            Err(_) => std::mem::forget(held),
        }
    }
}

impl<DB: Database> Lanes<DB> {
    /// Starts the watcher if none is alive: on first use rather than in `new`, which may run
    /// outside a runtime, and again if the runtime it ran on has gone away.
    fn watch_for_close(&self) {
        if self.watching.load(Ordering::Acquire)
            || self.pool.is_closed()
            || self.watching.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let (stop, stopped) = oneshot::channel::<()>();
        *self
            .stop_watcher
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(stop);
        let alive = Watching(self.watching.clone());
        let closed = self.pool.close_event();
        let lanes = Arc::downgrade(&self.lanes);
        tokio::spawn(async move {
            let _alive = alive;
            let mut sweep = tokio::time::interval(RECYCLE_AFTER);
            sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tokio::pin!(closed, stopped);
            loop {
                tokio::select! {
                    _ = &mut closed => {
                        let Some(lanes) = lanes.upgrade() else { return };
                        for lane in lanes.iter() {
                            lane.lock().await.connection = None;
                        }
                        return;
                    }
                    _ = &mut stopped => return,
                    _ = sweep.tick() => {
                        let Some(lanes) = lanes.upgrade() else { return };
                        sweep_idle(&lanes);
                    }
                }
            }
        });
    }
}

/// Hands back the connections of lanes that are free and have held theirs for longer than
/// [`RECYCLE_AFTER`], so a quiet store does not keep them from the pool's own rules.
fn sweep_idle<DB: Database>(lanes: &[Mutex<Lane<DB>>]) {
    let now = Instant::now();
    for lane in lanes {
        if let Ok(mut lane) = lane.try_lock() {
            lane.recycle_if_due(now);
        }
    }
}

/// Clears the watcher flag when the watcher ends, including when its runtime drops it.
struct Watching(Arc<AtomicBool>);

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
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
pub struct Taken<'a, DB: Database> {
    pool: &'a Pool<DB>,
    held: Held<'a, DB>,
    /// Declared after `held`, so the lane is unlocked before its permit is given back.
    _permit: Option<SemaphorePermit<'a>>,
    settled: bool,
    /// False once given back [`unused`](Self::unused).
    used: bool,
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
                lane.recycle_if_due(now);
                if let Some(connection) = &mut lane.connection {
                    if now.saturating_duration_since(lane.last_used) > PING_AFTER_IDLE {
                        let limit = pool.options().get_acquire_timeout();
                        let ping = tokio::time::timeout(limit, connection.ping()).await;
                        if !matches!(ping, Ok(Ok(()))) {
                            lane.connection = None;
                        }
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

    /// Gives the lane back without having run a statement on it: its connection stays, as it
    /// was (not stamped as used).
    pub fn unused(mut self) {
        self.settled = true;
        self.used = false;
    }
}

impl<DB: Database> Drop for Taken<'_, DB> {
    fn drop(&mut self) {
        if let Held::Lane(lane) = &mut self.held {
            if self.settled {
                if self.used {
                    lane.last_used = Instant::now();
                }
            } else {
                // Back to the pool, whose return ping flushes whatever the interrupted statement
                // left on the wire, or closes the connection if it is broken.
                lane.connection = None;
            }
        }
    }
}
