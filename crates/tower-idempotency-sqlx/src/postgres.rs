//! The Postgres store.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use sqlx::{postgres::PgPoolOptions, PgConnection, PgExecutor, PgPool, Postgres, Row};
use tower_idempotency_core::{
    CachedResponse, ClaimOutcome, FencingToken, Fingerprint, Ownership, RecordState, Store,
    StoreError,
};

use crate::{
    common::{
        self, millis, on_lane, prepare_completion, token_param, RawRecord, TokenOutOfRange,
        PURGE_BATCH,
    },
    lanes::{default_lane_count, Lanes},
    settlements::{self, PgNotices},
    validate_table_name, ConfigError, ConnectError, DEFAULT_MAX_RECORD_BYTES, DEFAULT_TABLE,
};

/// The DDL [`PostgresStore::migrate`] runs, for teams that run their own migrations.
///
/// `table` must pass [`validate_table_name`](crate::validate_table_name); this function does not
/// check it. Creates the table and an index on `expires_at` for purging. Fencing tokens are the
/// callers' random 63-bit values, so no sequence is needed (a `{table}_token_seq` left by an
/// earlier schema is unused and may be dropped).
pub fn schema_sql(table: &str) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS "{table}" (
    key          text COLLATE "C" PRIMARY KEY,
    fingerprint  bytea NOT NULL,
    token        bigint NOT NULL,
    state        smallint NOT NULL CHECK (state IN (0, 1)),
    expires_at   timestamptz NOT NULL,
    status       smallint,
    headers      bytea,
    body         bytea,
    body_omitted boolean NOT NULL DEFAULT false,
    watched      boolean NOT NULL DEFAULT false
) WITH (fillfactor = 80);
-- `CREATE INDEX IF NOT EXISTS` takes its table lock before it looks for the index, so on a
-- live table it would queue behind every open transaction (a `claim_in` in a business
-- transaction) and every store call would queue behind it. Look first.
DO $$
BEGIN
    -- In the table's own schema: `to_regclass` would search the whole search_path.
    IF NOT EXISTS (
        SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = '"{table}"'::regclass AND c.relname = '{table}_expires_at_idx'
    ) THEN
        CREATE INDEX IF NOT EXISTS "{table}_expires_at_idx" ON "{table}" (expires_at);
    END IF;
    -- Tables created before waiters marked keys; `ADD COLUMN IF NOT EXISTS` locks first too.
    IF NOT EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = '"{table}"'::regclass AND attname = 'watched' AND NOT attisdropped
    ) THEN
        ALTER TABLE "{table}" ADD COLUMN IF NOT EXISTS watched boolean NOT NULL DEFAULT false;
    END IF;
END
$$;
"#
    )
}

/// Columns every statement that reads a row returns, in [`decode_row`]'s order.
const RETURNED: &str = "token, fingerprint, state, \
     GREATEST(0, CEIL(EXTRACT(EPOCH FROM (expires_at - statement_timestamp())) * 1000))::bigint \
     AS remaining_ms, status, headers, body, body_omitted";

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
    /// The statements on `table`.
    fn new(table: &str) -> Self {
        let expired = "cur.expires_at <= statement_timestamp()";
        Self {
            // One statement, one round trip, in every case.
            //
            // `live`: a live row in the statement's snapshot is reported as it is, read-only, so
            // replays and in-flight duplicates write nothing. It can only report a record, never
            // grant a claim: the claim is always decided by the upsert on the primary key.
            //
            // `ins` runs when the snapshot holds no live row. Its update always fires: on a row
            // that turns out to be live (committed by a concurrent transaction after our
            // snapshot) it writes the row's own values back, which locks the newest version and
            // makes RETURNING report it; a plain fallback `SELECT` would read the snapshot and
            // find nothing. On an expired row it installs the new claim. An in-flight row with
            // the caller's token ($4) is the caller's: a new one, or one an earlier attempt of
            // the same claim wrote.
            claim: format!(
                r#"WITH live AS (
    SELECT token = $4 AND state = 0 AS claimed, {RETURNED} FROM "{table}"
    WHERE key = $1 AND expires_at > statement_timestamp()
),
next AS (
    SELECT $4::bigint AS token WHERE NOT EXISTS (SELECT 1 FROM live)
),
ins AS (
    INSERT INTO "{table}" AS cur (key, fingerprint, token, state, expires_at)
    SELECT $1, $2, next.token, 0, statement_timestamp() + $3::bigint * interval '1 millisecond'
    FROM next
    ON CONFLICT (key) DO UPDATE SET
        fingerprint  = CASE WHEN {expired} THEN excluded.fingerprint ELSE cur.fingerprint END,
        token        = CASE WHEN {expired} THEN excluded.token ELSE cur.token END,
        state        = CASE WHEN {expired} THEN 0 ELSE cur.state END,
        status       = CASE WHEN {expired} THEN NULL ELSE cur.status END,
        headers      = CASE WHEN {expired} THEN NULL ELSE cur.headers END,
        body         = CASE WHEN {expired} THEN NULL ELSE cur.body END,
        body_omitted = CASE WHEN {expired} THEN false ELSE cur.body_omitted END,
        watched      = CASE WHEN {expired} THEN false ELSE cur.watched END,
        expires_at   = CASE WHEN {expired} THEN excluded.expires_at ELSE cur.expires_at END
    RETURNING cur.token = $4 AND cur.state = 0 AS claimed, {RETURNED}
)
SELECT * FROM live UNION ALL SELECT * FROM ins"#
            ),
            // Completion, release and forget notify waiters in other instances (see
            // `settlements.rs`) for the row they changed if a waiter marked it; the command
            // tag still counts it.
            complete: format!(
                r#"WITH done AS (
UPDATE "{table}" SET state = 1, status = $3, headers = $4, body = $5,
    body_omitted = $6, expires_at = statement_timestamp() + $7::bigint * interval '1 millisecond'
WHERE key = $1 AND token = $2 AND state = 0 RETURNING key, watched
)
SELECT {}"#,
                settlements::notify_each(table, "done")
            ),
            renew: format!(
                r#"UPDATE "{table}"
SET expires_at = statement_timestamp() + $3::bigint * interval '1 millisecond'
WHERE key = $1 AND token = $2 AND state = 0"#
            ),
            release: format!(
                r#"WITH done AS (
DELETE FROM "{table}" WHERE key = $1 AND token = $2 AND state = 0 RETURNING key, watched
)
SELECT {}"#,
                settlements::notify_each(table, "done")
            ),
            get: format!(
                r#"SELECT {RETURNED} FROM "{table}"
WHERE key = $1 AND expires_at > statement_timestamp()"#
            ),
            // Batched, skipping rows a claimer holds locked, so purging never blocks requests.
            purge: format!(
                r#"DELETE FROM "{table}" WHERE key IN (
    SELECT key FROM "{table}" WHERE expires_at <= statement_timestamp()
    LIMIT {PURGE_BATCH} FOR UPDATE SKIP LOCKED)"#
            ),
        }
    }
}

/// A [`Store`] in a Postgres table. Several application instances sharing one database
/// coordinate through it: the table's primary key decides every race.
///
/// Every call is a single statement (see the [crate documentation](crate) for the SQL shape and
/// round-trip counts). Times are taken from the database clock (`statement_timestamp()`), so
/// application hosts need no synchronised clocks.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_idempotency_sqlx::PostgresStore;
/// let pool = sqlx::PgPool::connect("postgres://app@db/app").await?;
/// let store = PostgresStore::new(pool, "idempotency_records")?;
/// store.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct PostgresStore {
    lanes: Lanes<Postgres>,
    table: String,
    sql: Sql,
    max_record_bytes: usize,
    statements: AtomicU64,
    notices: PgNotices,
}

impl PostgresStore {
    /// A store on `pool` using `table`, which must pass
    /// [`validate_table_name`](crate::validate_table_name). Runs no SQL; call
    /// [`migrate`](Self::migrate) or create the table with [`schema_sql`] first.
    pub fn new(pool: PgPool, table: &str) -> Result<Self, ConfigError> {
        validate_table_name(table)?;
        Ok(Self {
            lanes: Lanes::new(pool.clone(), default_lane_count(&pool)),
            table: table.to_owned(),
            sql: Sql::new(table),
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            statements: AtomicU64::new(0),
            notices: PgNotices::new(&pool, table),
        })
    }

    /// Connects a pool to `url` (10 connections, 5 s acquire timeout; the store keeps 5 of them
    /// as [lanes](Self::with_connection_lanes)) and uses the [`DEFAULT_TABLE`].
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::connect_with_table(url, DEFAULT_TABLE).await
    }

    /// Like [`connect`](Self::connect) with a table of your choice.
    pub async fn connect_with_table(url: &str, table: &str) -> Result<Self, ConnectError> {
        validate_table_name(table)?;
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(5))
            .connect(url)
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
    /// Why: sqlx's pool pings a connection when it hands it out and again when it takes it back,
    /// so a store call through the pool costs three round trips; on a held connection it costs
    /// one (a connection idle for more than a second is pinged before use, and one whose
    /// statement failed or was cancelled goes back to the pool to be checked). Leave enough of
    /// the pool for the application and for [`claim_in`](Self::claim_in) transactions.
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
    pub fn pool(&self) -> &PgPool {
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

    /// Creates the table, sequence and index if they do not exist ([`schema_sql`]). Safe to run
    /// from several instances at once: it holds a transaction-scoped advisory lock.
    pub async fn migrate(&self) -> Result<(), sqlx::Error> {
        // A multi-statement simple query runs as one implicit transaction, so the advisory lock
        // serialises concurrent `CREATE .. IF NOT EXISTS`, which can otherwise race on the catalog.
        let sql = format!(
            "SELECT pg_advisory_xact_lock(hashtext('tower_idempotency_sqlx:migrate'));\n{}",
            schema_sql(&self.table)
        );
        sqlx::raw_sql(&sql).execute(self.pool()).await?;
        Ok(())
    }

    /// Deletes every expired record and returns how many were deleted.
    pub async fn purge_expired(&self) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            self.count();
            let done = sqlx::query(&self.sql.purge)
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
    pub async fn claim_in(
        &self,
        conn: &mut PgConnection,
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
        conn: &mut PgConnection,
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
        conn: &mut PgConnection,
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
        executor: impl PgExecutor<'e>,
        key: &str,
        fingerprint: &Fingerprint,
        token: FencingToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let token = token_param(token).ok_or(StoreError::Backend(Box::new(TokenOutOfRange)))?;
        self.count();
        let row = sqlx::query(&self.sql.claim)
            .bind(key)
            .bind(&fingerprint.as_bytes()[..])
            .bind(millis(lease))
            .bind(token)
            .fetch_one(executor)
            .await
            .map_err(|e| self.map_error(e, None))?;
        let claimed: bool = row
            .try_get("claimed")
            .map_err(|e| self.map_error(e, None))?;
        decode_row(&row)
            .map_err(|e| self.map_error(e, None))?
            .into_claim_outcome(claimed)
    }

    /// The completion's statement, on a record [`prepare_completion`] checked.
    async fn complete_with<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        key: &str,
        (token, headers, size): (i64, Vec<u8>, usize),
        response: &CachedResponse,
        ttl: Duration,
    ) -> Result<Ownership, StoreError> {
        self.count();
        let done = sqlx::query(&self.sql.complete)
            .bind(key)
            .bind(token)
            .bind(response.status.as_u16() as i16)
            .bind(headers)
            .bind(&response.body[..])
            .bind(response.body_omitted)
            .bind(millis(ttl))
            .execute(executor)
            .await
            .map_err(|e| self.map_error(e, Some(size)))?;
        Ok(ownership(done.rows_affected()))
    }

    async fn release_with<'e>(
        &self,
        executor: impl PgExecutor<'e>,
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

fn decode_row(row: &sqlx::postgres::PgRow) -> Result<RawRecord, sqlx::Error> {
    let remaining_ms: i64 = row.try_get("remaining_ms")?;
    Ok(RawRecord {
        token: row.try_get("token")?,
        fingerprint: row.try_get("fingerprint")?,
        state: row.try_get("state")?,
        remaining: Duration::from_millis(remaining_ms.max(0) as u64),
        status: row.try_get("status")?,
        headers: row.try_get("headers")?,
        body: row.try_get("body")?,
        body_omitted: row.try_get("body_omitted")?,
    })
}

impl PostgresStore {
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
        let renew = sqlx::query(&self.sql.renew)
            .bind(key)
            .bind(token)
            .bind(millis(lease));
        on_lane!(self, |conn| async {
            self.count();
            let done = renew
                .execute(conn)
                .await
                .map_err(|e| self.map_error(e, None))?;
            Ok(ownership(done.rows_affected()))
        })
    }
}

#[async_trait::async_trait]
impl Store for PostgresStore {
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
        let get = sqlx::query(&self.sql.get).bind(key);
        let row = on_lane!(self, |conn| async {
            self.count();
            get.fetch_optional(conn)
                .await
                .map_err(|e| self.map_error(e, None))
        })?;
        match row {
            None => Ok(None),
            Some(row) => decode_row(&row)
                .map_err(|e| self.map_error(e, None))?
                .into_state()
                .map(Some),
        }
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let sql = forget_sql(&self.table);
        let forget = sqlx::query(&sql).bind(key);
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
        "postgres"
    }

    /// `LISTEN/NOTIFY` on the channel `<table>_settled`: `complete`, `release` and `forget` notify
    /// the hex SHA-256 of the key they changed, in the same statement, when a waiter marked the
    /// key ([`Settlements::watch`](tower_idempotency_core::Settlements::watch) sets its
    /// `watched` column, which a new claim clears); each store object keeps one
    /// `LISTEN` connection of its own (besides its pool), opened on the first request through a
    /// waiting layer and reopened after a failure (100 ms, doubling up to 5 s, waiters poll
    /// meanwhile).
    fn settlements(&self) -> Option<tower_idempotency_core::Settlements> {
        Some(self.notices.settlements())
    }
}

/// Deletes one record whatever its state; `live` tells whether it had not expired yet.
fn forget_sql(table: &str) -> String {
    format!(
        r#"WITH done AS (
DELETE FROM "{table}" WHERE key = $1
RETURNING key, watched, expires_at > statement_timestamp() AS live
)
SELECT live, {}"#,
        settlements::notify_each(table, "done")
    )
}
