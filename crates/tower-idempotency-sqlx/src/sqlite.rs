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
use tower_idempotency_core::store::{
    CachedResponse, ClaimOutcome, FencingToken, Fingerprint, Ownership, RecordState, Store,
    StoreError,
};

use crate::{
    common::{self, millis, on_lane, prepare_completion, token_param, RawRecord, PURGE_BATCH},
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
/// milliseconds from the application host's clock; all processes sharing the file share it.
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
                .bind(now_ms())
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
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claim_with(conn, key, fingerprint, lease).await
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
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let token = new_token()?;
        let now = now_ms();
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
        let claimed = record.token == token;
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
            .bind(now_ms().saturating_add(millis(ttl)))
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

fn now_ms() -> i64 {
    // A clock before 1970 would be a broken host; treating it as the epoch keeps every record
    // expired rather than immortal.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(millis)
        .unwrap_or(0)
}

/// 63 random bits: SQLite has no sequence we could draw from inside the claim statement.
fn new_token() -> Result<i64, StoreError> {
    let bits = getrandom::u64().map_err(|e| StoreError::Backend(Box::new(e)))?;
    Ok((bits & i64::MAX as u64) as i64)
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
                .bind(now_ms().saturating_add(millis(lease)))
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
    fn transactions(&self) -> Option<&dyn tower_idempotency_core::store::TransactionalStore> {
        Some(self)
    }

    async fn claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let claim_once =
            || async { on_lane!(self, |conn| self.claim_with(conn, key, fingerprint, lease)) };
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
        let now = now_ms();
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
}
