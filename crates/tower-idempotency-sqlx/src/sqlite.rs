//! The SQLite store.

use std::{
    str::FromStr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use sqlx::{
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
    Row, Sqlite, SqliteConnection, SqliteExecutor, SqlitePool,
};
use tower_idempotency_core::{
    CachedResponse, ClaimOutcome, FencingToken, Fingerprint, Ownership, RecordState, Store,
    StoreError,
};

use crate::{
    common::{
        self, millis, on_lane, prepare_completion, token_param, RawRecord, TokenOutOfRange,
        PURGE_BATCH, STATE_IN_FLIGHT,
    },
    lanes::{default_lane_count, Lanes},
    validate_table_name, ConfigError, ConnectError, DEFAULT_MAX_RECORD_BYTES, DEFAULT_TABLE,
};

/// How long a statement waits for another connection's write lock before failing with
/// [`StoreError::Unavailable`].
pub const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The DDL [`SqliteStore::migrate`] runs, for teams that run their own migrations.
///
/// `table` must pass [`validate_table_name`](crate::validate_table_name); this function does not
/// check it. `expires_at` is in unix milliseconds.
pub fn schema_sql(table: &str) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS "{table}" (
    key          TEXT PRIMARY KEY NOT NULL,
    fingerprint  BLOB NOT NULL,
    token        INTEGER NOT NULL,
    state        INTEGER NOT NULL CHECK (state IN (0, 1)),
    expires_at   INTEGER NOT NULL,
    status       INTEGER,
    headers      BLOB,
    body         BLOB,
    body_omitted INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS "{table}_expires_at_idx" ON "{table}" (expires_at);
"#
    )
}

const RETURNED: &str = "token, fingerprint, state, expires_at, status, headers, body, body_omitted";

#[derive(Debug)]
struct Sql {
    claim: String,
    complete: String,
    renew: String,
    release: String,
    get: String,
    purge: String,
}

impl Sql {
    fn new(table: &str) -> Self {
        // ?1 key, ?2 fingerprint, ?3 new token, ?4 now (unix ms), ?5 lease end (unix ms).
        let expired = "expires_at <= ?4";
        Self {
            // One statement, like the Postgres claim: the update always fires so RETURNING
            // reports the existing row to a duplicate. Rewriting a live row with its own values
            // is cheap in SQLite: pages whose content is unchanged are not written.
            claim: format!(
                r#"INSERT INTO "{table}" (key, fingerprint, token, state, expires_at)
VALUES (?1, ?2, ?3, 0, ?5)
ON CONFLICT (key) DO UPDATE SET
    fingerprint  = CASE WHEN {expired} THEN excluded.fingerprint ELSE fingerprint END,
    token        = CASE WHEN {expired} THEN excluded.token ELSE token END,
    state        = CASE WHEN {expired} THEN 0 ELSE state END,
    status       = CASE WHEN {expired} THEN NULL ELSE status END,
    headers      = CASE WHEN {expired} THEN NULL ELSE headers END,
    body         = CASE WHEN {expired} THEN NULL ELSE body END,
    body_omitted = CASE WHEN {expired} THEN 0 ELSE body_omitted END,
    expires_at   = CASE WHEN {expired} THEN excluded.expires_at ELSE expires_at END
RETURNING {RETURNED}"#
            ),
            complete: format!(
                r#"UPDATE "{table}" SET state = 1, status = ?3, headers = ?4, body = ?5,
    body_omitted = ?6, expires_at = ?7
WHERE key = ?1 AND token = ?2 AND state = 0"#
            ),
            renew: format!(
                r#"UPDATE "{table}" SET expires_at = ?3 WHERE key = ?1 AND token = ?2 AND state = 0"#
            ),
            release: format!(
                r#"DELETE FROM "{table}" WHERE key = ?1 AND token = ?2 AND state = 0"#
            ),
            get: format!(r#"SELECT {RETURNED} FROM "{table}" WHERE key = ?1 AND expires_at > ?2"#),
            purge: format!(
                r#"DELETE FROM "{table}" WHERE rowid IN (
    SELECT rowid FROM "{table}" WHERE expires_at <= ?1 LIMIT {PURGE_BATCH})"#
            ),
        }
    }
}

/// A [`Store`] in an SQLite database file: durable across restarts, shared by every process on
/// the host that opens the same file. Writes are serialised by SQLite's database lock.
///
/// Every call is a single statement (see the [crate documentation](crate)). Times are unix
/// milliseconds: the host's wall clock as it was when the store was made, advanced by the
/// monotonic clock, so a step of the system clock while the store runs does not expire live
/// leases (or extend them). Processes sharing the file agree on the time up to any clock step
/// taken between their starts; start them after the clock is synchronised (e.g. after systemd's
/// `time-sync.target`).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_idempotency_sqlx::SqliteStore;
/// let store = SqliteStore::connect("sqlite:///var/lib/app/idempotency.db").await?;
/// store.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct SqliteStore {
    lanes: Lanes<Sqlite>,
    table: String,
    sql: Sql,
    max_record_bytes: usize,
    statements: AtomicU64,
    clock: StoreClock,
}

impl SqliteStore {
    /// A store on `pool` using `table`, which must pass
    /// [`validate_table_name`](crate::validate_table_name). Runs no SQL; call
    /// [`migrate`](Self::migrate) or create the table with [`schema_sql`] first.
    ///
    /// Open the pool in WAL mode with a busy timeout (as [`connect`](Self::connect) does), or
    /// concurrent requests fail with "database is locked".
    pub fn new(pool: SqlitePool, table: &str) -> Result<Self, ConfigError> {
        validate_table_name(table)?;
        Ok(Self {
            lanes: Lanes::new(pool.clone(), default_lane_count(&pool)),
            table: table.to_owned(),
            sql: Sql::new(table),
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            statements: AtomicU64::new(0),
            clock: StoreClock::system(),
        })
    }

    /// Opens (creating it if missing) the database at `url` (`sqlite://path` or
    /// `sqlite::memory:`) in WAL mode with `synchronous = NORMAL` and a
    /// [`SQLITE_BUSY_TIMEOUT`] busy timeout on a pool of 8 connections (the store keeps 4 of
    /// them as [lanes](Self::with_connection_lanes)), and uses the [`DEFAULT_TABLE`].
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::connect_with_table(url, DEFAULT_TABLE).await
    }

    /// Like [`connect`](Self::connect) with a table of your choice.
    pub async fn connect_with_table(url: &str, table: &str) -> Result<Self, ConnectError> {
        validate_table_name(table)?;
        let options = SqliteConnectOptions::from_str(url)
            .map_err(ConnectError::Database)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(SQLITE_BUSY_TIMEOUT);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
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

    /// Sets how many of the pool's connections the store keeps checked out for its own
    /// statements (capped at all but one of the pool's connections; `0` takes a connection from
    /// the pool per statement). Defaults to half the pool's maximum size. Waiting for a lane is
    /// bounded by the pool's `acquire_timeout`, as a pool acquire is.
    ///
    /// Why: sqlx's pool checks a connection with a ping when it hands it out and again when it
    /// takes it back (for SQLite, a message to the connection's worker thread and back), so a
    /// store call through the pool is three trips to the worker instead of one. A connection
    /// idle for more than a second is pinged before use, and one whose statement failed or was
    /// cancelled goes back to the pool to be checked.
    pub fn with_connection_lanes(mut self, lanes: usize) -> Self {
        self.lanes = Lanes::new(self.lanes.pool().clone(), lanes);
        self
    }

    /// How many connections the store keeps checked out for its statements; see
    /// [`with_connection_lanes`](Self::with_connection_lanes).
    pub fn connection_lanes(&self) -> usize {
        self.lanes.count()
    }

    /// The pool this store runs on.
    pub fn pool(&self) -> &SqlitePool {
        self.lanes.pool()
    }

    /// The table this store uses.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// How many SQL statements this store has executed, for tests and metrics.
    pub fn statements_executed(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// Creates the table and index if they do not exist ([`schema_sql`]).
    pub async fn migrate(&self) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(&schema_sql(&self.table))
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Deletes every expired record and returns how many were deleted.
    pub async fn purge_expired(&self) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            self.count();
            let done = sqlx::query(&self.sql.purge)
                .bind(self.clock.now_ms())
                .execute(self.pool())
                .await
                .map_err(|e| self.map_error(e, None))?
                .rows_affected();
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
        common::spawn_purger(Arc::downgrade(self), every, |store: Arc<Self>| async move {
            store.purge_expired().await
        })
    }

    /// [`Store::claim`] on a connection or transaction of the caller's, e.g. to claim the key in
    /// the same transaction as the business write (`store.claim_in(&mut tx, ..)`).
    ///
    /// Start such a transaction with `pool.begin_with("BEGIN IMMEDIATE")`: in a deferred
    /// transaction that read before claiming, another connection's commit makes the claim's
    /// upgrade to a write fail with `SQLITE_BUSY` at once instead of waiting.
    pub async fn claim_in(
        &self,
        conn: &mut SqliteConnection,
        key: &str,
        fingerprint: &Fingerprint,
        token: FencingToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claim_with(conn, key, fingerprint, token, lease).await
    }

    /// [`Store::complete`] on a connection or transaction of the caller's.
    pub async fn complete_in(
        &self,
        conn: &mut SqliteConnection,
        key: &str,
        token: FencingToken,
        response: &CachedResponse,
        ttl: Duration,
    ) -> Result<Ownership, StoreError> {
        match prepare_completion(token, response, self.max_record_bytes)? {
            Some(record) => self.complete_with(conn, key, record, response, ttl).await,
            None => Ok(Ownership::Stale),
        }
    }

    /// [`Store::release`] on a connection or transaction of the caller's.
    pub async fn release_in(
        &self,
        conn: &mut SqliteConnection,
        key: &str,
        token: FencingToken,
    ) -> Result<Ownership, StoreError> {
        self.release_with(conn, key, token).await
    }

    fn count(&self) {
        self.statements.fetch_add(1, Ordering::Relaxed);
    }

    fn map_error(&self, error: sqlx::Error, size: Option<usize>) -> StoreError {
        common::map_error(error, size, self.max_record_bytes)
    }

    async fn claim_with<'e>(
        &self,
        executor: impl SqliteExecutor<'e>,
        key: &str,
        fingerprint: &Fingerprint,
        token: FencingToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let token = token_param(token).ok_or(StoreError::Backend(Box::new(TokenOutOfRange)))?;
        let now = self.clock.now_ms();
        self.count();
        let row = sqlx::query(&self.sql.claim)
            .bind(key)
            .bind(&fingerprint.as_bytes()[..])
            .bind(token)
            .bind(now)
            .bind(now.saturating_add(millis(lease)))
            .fetch_one(executor)
            .await
            .map_err(|e| self.map_error(e, None))?;
        let record = decode_row(&row, now).map_err(|e| self.map_error(e, None))?;
        // In flight with the caller's token: a new claim, or one an earlier attempt wrote.
        let claimed = record.token == token && record.state == STATE_IN_FLIGHT;
        record.into_claim_outcome(claimed)
    }

    /// The completion's statement, on a record [`prepare_completion`] checked.
    async fn complete_with<'e>(
        &self,
        executor: impl SqliteExecutor<'e>,
        key: &str,
        (token, headers, size): (i64, Vec<u8>, usize),
        response: &CachedResponse,
        ttl: Duration,
    ) -> Result<Ownership, StoreError> {
        self.count();
        let done = sqlx::query(&self.sql.complete)
            .bind(key)
            .bind(token)
            .bind(i64::from(response.status.as_u16()))
            .bind(headers)
            .bind(&response.body[..])
            .bind(response.body_omitted)
            .bind(self.clock.now_ms().saturating_add(millis(ttl)))
            .execute(executor)
            .await
            .map_err(|e| self.map_error(e, Some(size)))?;
        Ok(ownership(done.rows_affected()))
    }

    async fn release_with<'e>(
        &self,
        executor: impl SqliteExecutor<'e>,
        key: &str,
        token: FencingToken,
    ) -> Result<Ownership, StoreError> {
        let Some(token) = token_param(token) else {
            return Ok(Ownership::Stale);
        };
        self.count();
        let done = sqlx::query(&self.sql.release)
            .bind(key)
            .bind(token)
            .execute(executor)
            .await
            .map_err(|e| self.map_error(e, None))?;
        Ok(ownership(done.rows_affected()))
    }
}

fn ownership(rows_affected: u64) -> Ownership {
    if rows_affected == 1 {
        Ownership::Current
    } else {
        Ownership::Stale
    }
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
struct StoreClock {
    /// Unix milliseconds, read once.
    wall: Box<dyn Fn() -> i64 + Send + Sync>,
    /// Monotonic time since an arbitrary origin.
    monotonic: Box<dyn Fn() -> Duration + Send + Sync>,
    anchor_ms: i64,
    anchor: Duration,
}

impl StoreClock {
    fn system() -> Self {
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

    fn now_ms(&self) -> i64 {
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

fn decode_row(row: &sqlx::sqlite::SqliteRow, now: i64) -> Result<RawRecord, sqlx::Error> {
    let expires_at: i64 = row.try_get("expires_at")?;
    let state: i64 = row.try_get("state")?;
    let status: Option<i64> = row.try_get("status")?;
    Ok(RawRecord {
        token: row.try_get("token")?,
        fingerprint: row.try_get("fingerprint")?,
        // Out-of-range values become -1, which decoding reports as corrupt.
        state: i16::try_from(state).unwrap_or(-1),
        remaining: Duration::from_millis(expires_at.saturating_sub(now).max(0) as u64),
        status: status.map(|s| i16::try_from(s).unwrap_or(-1)),
        headers: row.try_get("headers")?,
        body: row.try_get("body")?,
        body_omitted: row.try_get("body_omitted")?,
    })
}

impl SqliteStore {
    /// One renewal statement.
    async fn renew_once(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Ownership, StoreError> {
        let Some(token) = token_param(token) else {
            return Ok(Ownership::Stale);
        };
        on_lane!(self, |conn| async {
            self.count();
            // Dated once a lane is ours, not before waiting for one.
            let done = sqlx::query(&self.sql.renew)
                .bind(key)
                .bind(token)
                .bind(self.clock.now_ms().saturating_add(millis(lease)))
                .execute(conn)
                .await
                .map_err(|e| self.map_error(e, None))?;
            Ok(ownership(done.rows_affected()))
        })
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
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
        let claim_once = || async {
            on_lane!(self, |conn| self.claim_with(
                conn,
                key,
                fingerprint,
                token,
                lease
            ))
        };
        common::claim_with_a_whole_lease(claim_once, |token| self.renew(key, token, lease), lease)
            .await
    }

    async fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Ownership, StoreError> {
        common::renew_for_a_whole_lease(|| self.renew_once(key, token, lease), lease).await
    }

    async fn complete(
        &self,
        key: &str,
        token: FencingToken,
        response: &CachedResponse,
        ttl: Duration,
    ) -> Result<Ownership, StoreError> {
        // Checked before a lane is taken: an oversized record never touches the database.
        match prepare_completion(token, response, self.max_record_bytes)? {
            Some(record) => on_lane!(self, |conn| self
                .complete_with(conn, key, record, response, ttl)),
            None => Ok(Ownership::Stale),
        }
    }

    async fn release(&self, key: &str, token: FencingToken) -> Result<Ownership, StoreError> {
        on_lane!(self, |conn| self.release_with(conn, key, token))
    }

    async fn get(&self, key: &str) -> Result<Option<RecordState>, StoreError> {
        let now = self.clock.now_ms();
        let get = sqlx::query(&self.sql.get).bind(key).bind(now);
        let row = on_lane!(self, |conn| async {
            self.count();
            get.fetch_optional(conn)
                .await
                .map_err(|e| self.map_error(e, None))
        })?;
        match row {
            None => Ok(None),
            Some(row) => decode_row(&row, now)
                .map_err(|e| self.map_error(e, None))?
                .into_state()
                .map(Some),
        }
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let sql = forget_sql(&self.table);
        let forget = sqlx::query(&sql).bind(key).bind(self.clock.now_ms());
        let row = on_lane!(self, |conn| async {
            self.count();
            forget
                .fetch_optional(conn)
                .await
                .map_err(|e| self.map_error(e, None))
        })?;
        match row {
            None => Ok(false),
            Some(row) => row
                .try_get::<bool, _>("live")
                .map_err(|e| self.map_error(e, None)),
        }
    }

    fn name(&self) -> &'static str {
        "sqlite"
    }
}

/// Deletes one record whatever its state; `live` tells whether it had not expired yet.
fn forget_sql(table: &str) -> String {
    format!(r#"DELETE FROM "{table}" WHERE key = ?1 RETURNING expires_at > ?2 AS live"#)
}

#[cfg(test)]
mod clock_tests {
    use std::sync::{
        atomic::{AtomicI64, AtomicU64},
        Arc,
    };

    use tower_idempotency_core::{FencingToken, Fingerprint};

    use super::*;

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
    /// its own) and the clocks it runs on; the file is removed when the guard drops.
    async fn store_on(clocks: &Arc<Clocks>) -> (SqliteStore, FileGuard) {
        let path = std::env::temp_dir().join(format!("tidem-clock-{}.db", getrandom_suffix()));
        let guard = FileGuard(path.clone());
        let mut store = SqliteStore::connect(&format!("sqlite://{}", path.display()))
            .await
            .expect("open");
        store.migrate().await.expect("migrate");
        store.clock = clocks.store_clock();
        (store, guard)
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
        let clocks = Arc::new(Clocks::default());
        clocks.advance(1_700_000_000_000, 5_000);
        let (store, _file) = store_on(&clocks).await;
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
        let clocks = Arc::new(Clocks::default());
        clocks.advance(1_700_000_000_000, 5_000);
        let (store, _file) = store_on(&clocks).await;
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
