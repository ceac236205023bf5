//! [`SqlStore`], written once over a [`Backend`]: the claim's order of statements, fencing,
//! lease rules, purging, the lanes' paths, and the calls on a caller's transaction.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use sqlx::{Pool, SqlStr};
use tower_idempotency_core::{
    CachedResponse, ClaimOutcome, FencingToken, Fingerprint, Ownership, RecordState, Settlements,
    Store, StoreError,
};

use super::{
    backend::{Backend, Done, Engine, Pick, Returns, Statement, Statements, Write, PURGE_BATCH},
    error, lanes,
    lanes::{Lanes, StoreLanes},
    recent::RecentKeys,
    record::{claim_token, Params, RawRecord},
};
use crate::{
    validate_table_name, ConfigError, ConnectError, DEFAULT_MAX_RECORD_BYTES, DEFAULT_TABLE,
};

/// A [`Store`] in one SQL table, on SQLite ([`SqliteStore`](crate::SqliteStore)), Postgres
/// ([`PostgresStore`](crate::PostgresStore)) or MySQL and MariaDB
/// ([`MySqlStore`](crate::MySqlStore)).
///
/// Every call is a single statement, run on one of the store's
/// [lanes](Self::with_connection_lanes) or, on SQLite, on its writer thread or the calling
/// task. A Postgres table coordinates every instance on the database, dated by the database's
/// clock; an SQLite file every process of one host, dated by the store's own clock. What each
/// call runs, and why:
/// [docs/stores.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/stores.md).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_idempotency_sqlx::{PostgresStore, SqliteStore};
/// let store = SqliteStore::connect("sqlite:///var/lib/app/idempotency.db").await?;
/// store.migrate().await?;
/// let pool = sqlx::PgPool::connect("postgres://app@db/app").await?;
/// let store = PostgresStore::new(pool, "idempotency_records")?;
/// store.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct SqlStore<DB: Backend> {
    pool: Pool<DB>,
    lanes: StoreLanes<DB>,
    table: String,
    sql: Statements,
    max_record_bytes: usize,
    statements: AtomicU64,
    recent: RecentKeys,
    /// What the store keeps besides its lanes: SQLite's clock, writer thread and inline reads,
    /// Postgres's notices.
    pub(crate) engine: DB::Engine,
}

impl<DB: Backend> SqlStore<DB> {
    /// A store on `pool` using `table`, which must pass
    /// [`validate_table_name`](crate::validate_table_name). Runs no SQL; call
    /// [`migrate`](Self::migrate) or create the table with the backend's `schema_sql` first.
    ///
    /// On SQLite, open the pool in WAL mode with a busy timeout (as [`connect`](Self::connect)
    /// does), or concurrent requests fail with "database is locked".
    ///
    /// What it takes from a pool it shares with the application: up to half of the pool's
    /// `max_connections` (rounded down; 5 of a 10-connection pool), which it checks out as
    /// [lanes](Self::with_connection_lanes) as load needs them and keeps while they are busy
    /// (a lane hands its connection back after a minute). The rest stays with the
    /// application, [`claim_in`](Self::claim_in) transactions and an inbox worker's event
    /// transactions (one per running event): size the pool for the store's half plus those, or
    /// set fewer lanes. The shared-pool test (`tests/shared_pool.rs`) runs the three on one pool.
    pub fn new(pool: Pool<DB>, table: &str) -> Result<Self, ConfigError> {
        validate_table_name(table)?;
        let lanes = StoreLanes::new(
            pool.clone(),
            lanes::default_lane_count(&pool),
            DB::ONE_WRITER,
        );
        let mut engine = DB::engine(&pool, table);
        engine.lanes(&lanes);
        Ok(Self {
            pool: pool.clone(),
            lanes,
            table: table.to_owned(),
            sql: DB::statements(table),
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            statements: AtomicU64::new(0),
            recent: RecentKeys::default(),
            engine,
        })
    }

    /// Opens a pool on `url` and uses the [`DEFAULT_TABLE`].
    ///
    /// SQLite (`sqlite://path` or `sqlite::memory:`): creates the file if missing, in WAL mode
    /// with `synchronous = NORMAL` and a [`SQLITE_BUSY_TIMEOUT`](crate::SQLITE_BUSY_TIMEOUT)
    /// busy timeout, on a pool of 8 connections (the store keeps 4 of them as
    /// [lanes](Self::with_connection_lanes)). Postgres: 10 connections, 5 s acquire timeout;
    /// the store keeps 5 of them as lanes.
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::connect_with_table(url, DEFAULT_TABLE).await
    }

    /// Like [`connect`](Self::connect) with a table of your choice.
    pub async fn connect_with_table(url: &str, table: &str) -> Result<Self, ConnectError> {
        validate_table_name(table)?;
        let pool = DB::connect_pool(url)
            .await
            .map_err(ConnectError::Database)?;
        Ok(Self::new(pool, table)?)
    }

    /// Sets the largest record (encoded headers plus body) [`complete`](Store::complete)
    /// accepts; larger ones fail with [`StoreError::RecordTooLarge`] without touching the
    /// database. Defaults to [`DEFAULT_MAX_RECORD_BYTES`].
    pub fn with_max_record_bytes(mut self, limit: usize) -> Self {
        self.max_record_bytes = limit;
        self
    }

    /// Bounds the queue of SQLite's writer thread: at most `jobs` writes, holding at most
    /// `bytes` of parameters (keys, fingerprints, response bodies), accepted and not yet
    /// answered. A write past either bound is refused at once with [`StoreError::Unavailable`],
    /// which the layer answers `503 store-unavailable` with `Retry-After`, instead of waiting in
    /// memory while SQLite's write lock is held (by a transactional handler, another process, a
    /// checkpoint). A single write larger than `bytes` is accepted when the queue is empty.
    /// Defaults to [`DEFAULT_WRITE_QUEUE_JOBS`](crate::DEFAULT_WRITE_QUEUE_JOBS) and
    /// [`DEFAULT_WRITE_QUEUE_BYTES`](crate::DEFAULT_WRITE_QUEUE_BYTES). Stores without a writer
    /// thread (Postgres, SQLite pools not on a plain read-write file) ignore it.
    pub fn with_write_queue(mut self, jobs: usize, bytes: usize) -> Self {
        self.engine.bound_writes(jobs, bytes);
        self
    }

    /// Sets how many of the pool's connections the store keeps checked out for its own
    /// statements (capped at all but one of the pool's connections; `0` takes a connection from
    /// the pool per statement). Defaults to half the pool's maximum size. Waiting for a lane is
    /// bounded by the pool's `acquire_timeout`, as a pool acquire is.
    ///
    /// On SQLite, with two lanes or more, one lane is the writer (every statement that may write
    /// runs on it, one at a time, where the store has no writer thread: a pool that is not on a
    /// plain read-write file) and the others run reads; with one lane, reads share it.
    ///
    /// Why: sqlx's pool pings a connection when it hands it out and again when it takes it back
    /// (for SQLite, a message to the connection's worker thread and back), so a store call
    /// through the pool costs three round trips; on a held connection it costs one (a
    /// connection idle for more than a second is pinged before use, and one whose statement
    /// failed or was cancelled goes back to the pool to be checked). Leave enough of the pool
    /// for the application and for [`claim_in`](Self::claim_in) transactions.
    pub fn with_connection_lanes(mut self, lanes: usize) -> Self {
        self.lanes = StoreLanes::new(self.pool.clone(), lanes, DB::ONE_WRITER);
        self.engine.lanes(&self.lanes);
        self
    }

    /// How many connections the store keeps checked out for its statements; see
    /// [`with_connection_lanes`](Self::with_connection_lanes).
    pub fn connection_lanes(&self) -> usize {
        self.lanes.count()
    }

    /// The pool this store runs on.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// The table this store uses.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// How many SQL statements this store has executed, for tests and metrics.
    pub fn statements_executed(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// Creates the table and its index if they do not exist (the backend's `schema_sql`). On
    /// Postgres it is safe to run from several instances at once: it holds a
    /// transaction-scoped advisory lock.
    pub async fn migrate(&self) -> Result<(), sqlx::Error> {
        DB::execute_script(self.pool(), &DB::migration_sql(&self.table)).await
    }

    /// Deletes every expired record and returns how many were deleted.
    pub async fn purge_expired(&self) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let done = self.purge_batch().await?;
            total += done;
            if done < PURGE_BATCH as u64 {
                return Ok(total);
            }
        }
    }

    /// Runs [`purge_expired`](Self::purge_expired) every `every` until the last `Arc` of the
    /// store is dropped (or the returned handle is aborted). Failures are logged and retried at
    /// the next tick.
    pub fn spawn_purger(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let store = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(every);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                // Holding only a weak reference between runs lets the store (and its pool) drop.
                let Some(store) = store.upgrade() else { return };
                match store.purge_expired().await {
                    Ok(0) => {}
                    Ok(purged) => tracing::debug!(purged, "purged expired idempotency records"),
                    Err(error) => {
                        tracing::warn!(%error, "purging expired idempotency records failed")
                    }
                }
            }
        })
    }

    /// [`Store::claim`] on a connection or transaction of the caller's, e.g. to claim the key in
    /// the same transaction as the business write (`store.claim_in(&mut tx, ..)`).
    ///
    /// On SQLite, start such a transaction with `pool.begin_with("BEGIN IMMEDIATE")`: in a
    /// deferred transaction that read before claiming, another connection's commit makes the
    /// claim's upgrade to a write fail with `SQLITE_BUSY` at once instead of waiting.
    pub async fn claim_in(
        &self,
        conn: &mut DB::Connection,
        key: &str,
        fingerprint: &Fingerprint,
        token: FencingToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        self.check_key(key)?;
        let (token, claim) = Params::claim(key, fingerprint, token, lease)?;
        let now = self.engine.now_ms();
        self.count();
        let row = DB::fetch_row(conn, &self.sql, Pick::Claim, now, claim)
            .await
            .map_err(|e| self.map_error(e, None))?
            .ok_or_else(|| self.map_error(sqlx::Error::RowNotFound, None))?;
        self.decode(&row, now)?.into_claim_outcome(token)
    }

    /// [`Store::complete`] on a connection or transaction of the caller's.
    pub async fn complete_in(
        &self,
        conn: &mut DB::Connection,
        key: &str,
        token: FencingToken,
        response: &CachedResponse,
        ttl: Duration,
    ) -> Result<Ownership, StoreError> {
        let complete = Params::complete(key, token, response, ttl, self.max_record_bytes)?;
        let Some((complete, size)) = complete else {
            return Ok(Ownership::Stale);
        };
        self.fenced(conn, &self.sql.complete, complete, Some(size))
            .await
    }

    /// [`Store::release`] on a connection or transaction of the caller's.
    pub async fn release_in(
        &self,
        conn: &mut DB::Connection,
        key: &str,
        token: FencingToken,
    ) -> Result<Ownership, StoreError> {
        let Some(release) = Params::release(key, token) else {
            return Ok(Ownership::Stale);
        };
        self.fenced(conn, &self.sql.release, release, None).await
    }
}

/// The statements' plumbing: binding, counting, error mapping, lanes.
impl<DB: Backend> SqlStore<DB> {
    /// Refuses a key longer than the table holds whole ([`Backend::MAX_KEY_BYTES`]).
    fn check_key(&self, key: &str) -> Result<(), StoreError> {
        if key.len() > DB::MAX_KEY_BYTES {
            return Err(StoreError::Backend(Box::new(KeyTooLong {
                len: key.len(),
                limit: DB::MAX_KEY_BYTES,
            })));
        }
        Ok(())
    }

    fn count(&self) {
        self.statements.fetch_add(1, Ordering::Relaxed);
    }

    fn map_error(&self, error: sqlx::Error, size: Option<usize>) -> StoreError {
        error::map_error(error, size, self.max_record_bytes)
    }

    fn decode(&self, row: &DB::Row, now: i64) -> Result<RawRecord, StoreError> {
        DB::decode(row, now).map_err(|e| self.map_error(e, None))
    }

    fn bind<'q>(&self, sql: &SqlStr, params: Params<'q>) -> Statement<'q, DB> {
        DB::bind(sql, self.engine.now_ms(), params)
    }

    /// Runs `statement` on a write lane (see `lanes.rs`).
    async fn on_lane<T>(
        &self,
        statement: impl AsyncFnOnce(&mut DB::Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.on(self.lanes.writes(), statement).await
    }

    /// Runs `statement` on one of `lanes`; the lane keeps its connection only when the
    /// statement succeeded.
    async fn on<T>(
        &self,
        lanes: &Lanes<DB>,
        statement: impl AsyncFnOnce(&mut DB::Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut lane = lanes.take().await.map_err(|e| self.map_error(e, None))?;
        let result = match lane.connection().await {
            Ok(conn) => statement(conn).await,
            Err(error) => Err(self.map_error(error, None)),
        };
        lane.settle(result.is_ok());
        result
    }

    /// Runs a statement fenced by the caller's token: whether it changed the caller's row.
    /// Bound once a connection is ours, so a lease is dated after any wait for a lane.
    async fn fenced(
        &self,
        conn: &mut DB::Connection,
        sql: &SqlStr,
        params: Params<'_>,
        size: Option<usize>,
    ) -> Result<Ownership, StoreError> {
        self.count();
        let done = DB::execute(conn, self.bind(sql, params))
            .await
            .map_err(|e| self.map_error(e, size))?;
        Ok(ownership(DB::rows_affected(&done)))
    }

    /// Runs a write that returns no rows, `pick`ed from the store's statements: how many rows it
    /// changed.
    async fn write(
        &self,
        pick: Pick,
        params: Params<'_>,
        size: Option<usize>,
    ) -> Result<u64, StoreError> {
        match self.run_write(pick, params, Returns::Changes, size).await? {
            Done::Changed(rows) => Ok(rows),
            Done::Row(_) => unreachable!("a write without RETURNING reports changes"),
        }
    }

    /// Runs a write with a `RETURNING` clause (the claim statement, `forget`), like
    /// [`write`](Self::write): the row it returned.
    async fn write_returning(
        &self,
        pick: Pick,
        params: Params<'_>,
    ) -> Result<Option<RawRecord>, StoreError> {
        match self.run_write(pick, params, Returns::Row, None).await? {
            Done::Row(row) => Ok(row),
            Done::Changed(_) => unreachable!("a write with RETURNING reports its row"),
        }
    }

    /// Runs a write where the engine runs it (SQLite's writer thread), otherwise on a write
    /// lane. A closed pool answers nothing, through either path.
    async fn run_write(
        &self,
        pick: Pick,
        params: Params<'_>,
        returns: Returns,
        size: Option<usize>,
    ) -> Result<Done, StoreError> {
        let limit = self.max_record_bytes;
        let write = Write {
            pick,
            params,
            returns,
            size,
            limit,
        };
        let Write { params, .. } = match self.engine.write(write) {
            Ok(running) => {
                if self.pool().is_closed() {
                    return Err(self.map_error(sqlx::Error::PoolClosed, None));
                }
                // Counted when sent, as the tests that wait for a queued write read it; a write
                // handed back by a failed Postgres batch counts again for its own statement.
                self.count();
                match running.await {
                    Ok(done) => return done,
                    // Handed back (a Postgres batch that failed): its own statement, below.
                    Err(write) => write,
                }
            }
            Err(write) => write,
        };
        match returns {
            Returns::Changes => {
                self.on_lane(async |conn| {
                    self.count();
                    let done = DB::execute(conn, self.bind(self.sql.text(pick), params))
                        .await
                        .map_err(|e| self.map_error(e, size))?;
                    Ok(Done::Changed(DB::rows_affected(&done)))
                })
                .await
            }
            Returns::Row => match self.fetch_on(self.lanes.writes(), pick, params).await? {
                Some((row, now)) => self.decode(&row, now).map(|row| Done::Row(Some(row))),
                None => Ok(Done::Row(None)),
            },
        }
    }

    /// One renewal statement.
    async fn renew_once(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Ownership, StoreError> {
        let Some(renew) = Params::renew(key, token, lease) else {
            return Ok(Ownership::Stale);
        };
        Ok(ownership(self.write(Pick::Renew, renew, None).await?))
    }

    /// One purge statement: with one writer, as every other write, so it waits its turn instead
    /// of making requests wait in SQLite's busy handler; otherwise on a connection from the
    /// pool, so a purge of a large backlog does not hold up a lane.
    async fn purge_batch(&self) -> Result<u64, StoreError> {
        if DB::ONE_WRITER {
            return self.write(Pick::Purge, Params::Purge, None).await;
        }
        let mut conn = self
            .pool()
            .acquire()
            .await
            .map_err(|e| self.map_error(e, None))?;
        self.count();
        let done = DB::execute(&mut conn, self.bind(&self.sql.purge, Params::Purge))
            .await
            .map_err(|e| self.map_error(e, None))?;
        Ok(DB::rows_affected(&done))
    }

    /// One claim: a key this process has seen is read first (see `recent.rs`): its replays are
    /// a plain read, beside the writer on SQLite. A key it has not seen is most likely new: a
    /// plain insert claims it, the cheapest write there is; only if the key has a row (another
    /// process's, or one from before a restart) does the claim statement run.
    async fn claim_once(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        token: FencingToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        if self.recent.seen(key) {
            if let Some(live) = self.read_live(key, token).await? {
                return Ok(live);
            }
        } else if let Some(claimed) = self.insert_new(key, fingerprint, token, lease).await? {
            return Ok(claimed);
        }
        self.claim_statement(key, fingerprint, token, lease).await
    }

    /// A claim of a key that has no row, by inserting it; `None`: the key has a row (live or
    /// not), which only the claim statement may judge.
    async fn insert_new(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let (token, insert) = Params::claim(key, fingerprint, token, lease)?;
        let inserted = ownership(self.write(Pick::Insert, insert, None).await?);
        Ok(
            (inserted == Ownership::Current).then_some(ClaimOutcome::Claimed {
                token: FencingToken(token as u64),
            }),
        )
    }

    /// The claim statement, which judges a key whatever its row: claims it, or reports the
    /// live record.
    async fn claim_statement(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        token: FencingToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let (token, claim) = Params::claim(key, fingerprint, token, lease)?;
        self.write_returning(Pick::Claim, claim)
            .await?
            .ok_or_else(|| self.map_error(sqlx::Error::RowNotFound, None))?
            .into_claim_outcome(token)
    }

    /// The key's live record, as a claim reports it: a replay or an in-flight duplicate is
    /// answered without a write. `None`: no live record, claim it.
    async fn read_live(
        &self,
        key: &str,
        token: FencingToken,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let token = claim_token(token)?;
        match self.read_record(key).await? {
            Some(record) => record.into_claim_outcome(token).map(Some),
            None => Ok(None),
        }
    }

    /// The key's live row: read by the engine where it can (SQLite's inline reads), otherwise
    /// on a reader lane. A closed pool answers nothing, through either path.
    async fn read_record(&self, key: &str) -> Result<Option<RawRecord>, StoreError> {
        if !self.pool().is_closed() {
            if let Some(record) = self.engine.read(key) {
                self.count();
                return Ok(record);
            }
        }
        let get = Params::Get { key };
        match self.fetch_on(self.lanes.reads(), Pick::Get, get).await? {
            Some((row, now)) => self.decode(&row, now).map(Some),
            None => Ok(None),
        }
    }

    /// Runs the statement `pick` names, which returns at most one row, on one of `lanes`.
    async fn fetch_on(
        &self,
        lanes: &Lanes<DB>,
        pick: Pick,
        params: Params<'_>,
    ) -> Result<Option<(DB::Row, i64)>, StoreError> {
        self.on(lanes, async |conn| {
            let now = self.engine.now_ms();
            self.count();
            let row = DB::fetch_row(conn, &self.sql, pick, now, params)
                .await
                .map_err(|e| self.map_error(e, None))?;
            Ok(row.map(|row| (row, now)))
        })
        .await
    }
}

/// A key longer than the store's table holds whole ([`Backend::MAX_KEY_BYTES`]).
#[derive(Debug, thiserror::Error)]
#[error("key is {len} bytes long, the store's table holds keys of up to {limit}")]
struct KeyTooLong {
    len: usize,
    limit: usize,
}

/// Whether a fenced statement changed the caller's row.
fn ownership(rows_affected: u64) -> Ownership {
    if rows_affected == 1 {
        Ownership::Current
    } else {
        Ownership::Stale
    }
}

/// Whether a claim or renewal that started at `started` took long enough (a quarter of the
/// lease) that the lease it wrote, dated from before any wait (for a row lock, for SQLite's
/// write lock), may be short or over.
fn waited_too_long(started: Instant, lease: Duration) -> bool {
    started.elapsed() > lease / 4
}

#[async_trait::async_trait]
impl<DB: Backend> Store for SqlStore<DB> {
    /// The transactional mode's transactions (see [`crate::transactional`]).
    fn transactions(&self) -> Option<&dyn tower_idempotency_core::TransactionalStore> {
        Some(self)
    }

    async fn claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        token: FencingToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        // A claim that waited long after dating its lease may hold a short lease, or one that
        // is over: a granted claim is renewed before it is answered. If the lease is gone,
        // someone else holds the key now: a second claim says who, instead of granting a dead
        // claim.
        self.check_key(key)?;
        let started = Instant::now();
        match self.claim_once(key, fingerprint, token, lease).await? {
            ClaimOutcome::Claimed { token: claimed } if waited_too_long(started, lease) => {
                match self.renew(key, claimed, lease).await? {
                    Ownership::Current => Ok(ClaimOutcome::Claimed { token: claimed }),
                    Ownership::Stale => self.claim_once(key, fingerprint, token, lease).await,
                }
            }
            outcome => Ok(outcome),
        }
    }

    async fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Ownership, StoreError> {
        // A renewal dates its lease before it waits, and the next one usually does not wait:
        // up to three while they wait long.
        let mut attempts = 0;
        loop {
            let started = Instant::now();
            let renewed = self.renew_once(key, token, lease).await?;
            attempts += 1;
            if renewed == Ownership::Stale || !waited_too_long(started, lease) || attempts == 3 {
                return Ok(renewed);
            }
        }
    }

    async fn complete(
        &self,
        key: &str,
        token: FencingToken,
        response: &CachedResponse,
        ttl: Duration,
    ) -> Result<Ownership, StoreError> {
        // Checked before a lane is taken: an oversized record never touches the database.
        let complete = Params::complete(key, token, response, ttl, self.max_record_bytes)?;
        let Some((complete, size)) = complete else {
            return Ok(Ownership::Stale);
        };
        Ok(ownership(
            self.write(Pick::Complete, complete, Some(size)).await?,
        ))
    }

    async fn release(&self, key: &str, token: FencingToken) -> Result<Ownership, StoreError> {
        let Some(release) = Params::release(key, token) else {
            return Ok(Ownership::Stale);
        };
        Ok(ownership(self.write(Pick::Release, release, None).await?))
    }

    async fn get(&self, key: &str) -> Result<Option<RecordState>, StoreError> {
        match self.read_record(key).await? {
            Some(record) => record.into_state().map(Some),
            None => Ok(None),
        }
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let forget = Params::Forget { key };
        // A deleted record that had expired was absent already.
        Ok(self
            .write_returning(Pick::Forget, forget)
            .await?
            .is_some_and(|record| record.remaining_ms > 0))
    }

    fn name(&self) -> &'static str {
        DB::STORE_NAME
    }

    /// Postgres: `LISTEN/NOTIFY` on the channel `<table>_settled`: `complete`, `release` and
    /// `forget` notify the hex SHA-256 of the key they changed, in the same statement, when a
    /// waiter marked the key ([`Settlements::watch`] sets its `watched` column, which a new
    /// claim clears); each store object keeps one `LISTEN` connection of its own (besides its
    /// pool), opened on the first request through a waiting layer and reopened after a failure
    /// (100 ms, doubling up to 5 s, waiters poll meanwhile). SQLite: none, waiters poll.
    fn settlements(&self) -> Option<Settlements> {
        self.engine.settlements()
    }
}
