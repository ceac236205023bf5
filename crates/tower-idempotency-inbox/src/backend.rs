//! The inbox's statements on each database. Every statement but the DDL and the claim is the
//! same text on both (sqlx binds `$N` on SQLite too); the `backend!` macro writes the typed
//! calls once for each database.
//!
//! Times are unix milliseconds from the application's clock: instances sharing a Postgres inbox
//! must agree on the time to well within the lease.

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    pin::Pin,
    sync::atomic::{AtomicU64, Ordering},
};

pub use crate::retention::OpenGroup;
use sqlx::SqlStr;
use tower_idempotency_sqlx::table_sql;

use crate::{
    event::{EventKey, EventSummary, StateCounts},
    ordering::OrderedSql,
};

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A verified delivery, as the acknowledgement inserts it.
#[doc(hidden)]
#[derive(Debug)]
pub struct NewEvent {
    pub key: EventKey,
    pub headers: String,
    pub body: Vec<u8>,
    pub authenticator: Option<Vec<u8>>,
    pub received_at: i64,
    /// Its [`OrderPosition`](crate::OrderPosition) under the inbox's ordering.
    pub order: Option<crate::OrderPosition>,
    /// Unix ms until which a processed row carrying `authenticator` is kept (its provider's
    /// retry horizon); `None` without an authenticator.
    pub authenticator_until: Option<i64>,
}

/// A claimed event's row.
#[doc(hidden)]
#[derive(Debug)]
pub struct ClaimedRow {
    pub headers: String,
    pub body: Vec<u8>,
    pub received_at: i64,
    pub attempts: i32,
}

/// The statements of one inbox table.
#[doc(hidden)]
#[derive(Debug)]
pub struct Sql {
    /// Postgres: the acknowledgement of many deliveries in one statement (see `acks.rs`).
    insert_many: SqlStr,
    /// The statements of ordered events.
    pub(crate) ordered: OrderedSql,
    pub(crate) schema: String,
    insert: SqlStr,
    pub(crate) claim: SqlStr,
    complete: SqlStr,
    fail: SqlStr,
    due: SqlStr,
    pub(crate) renew: SqlStr,
    exhaust: SqlStr,
    list: SqlStr,
    get: SqlStr,
    retry: SqlStr,
    counts: SqlStr,
    /// The gauges' and the retention's statements ([`crate::retention`]).
    pub(crate) queue: crate::retention::QueueSql,
    /// Statements sent through these, for [`Inbox::statements_executed`](crate::Inbox::statements_executed).
    executed: AtomicU64,
    /// The claim of several events in one statement ([`InboxDatabase::claim_many`]).
    pub(crate) claim_many: SqlStr,
}

impl Sql {
    /// Counts one statement about to be sent.
    pub(crate) fn sent(&self) {
        self.executed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn executed(&self) -> u64 {
        self.executed.load(Ordering::Relaxed)
    }
}

const SUMMARY: &str =
    "provider, event_id, state, attempts, received_at, available_at, finished_at, last_error";
/// Pending, due, and not leased by a live worker.
const DUE: &str = "state = 0 AND available_at <= $1 AND (lease_until IS NULL OR lease_until <= $1)";
/// [`DUE`] in a statement that names its events' keys. `state + 0` keeps the planner on the
/// primary key: without statistics (a table a burst filled before it was analysed) it would
/// otherwise find each key by walking every pending row of a backlog in an index led by `state`.
const DUE_BY_KEY: &str =
    "state + 0 = 0 AND available_at <= $1 AND (lease_until IS NULL OR lease_until <= $1)";
/// The last error of an event whose attempts were spent without one recording its end.
pub(crate) const SPENT: &str =
    "no attempts remain: the last attempt did not finish (its instance stopped, was killed or lost the lease)";

impl Sql {
    fn new(
        table: &str,
        schema: String,
        claim: String,
        postgres: bool,
        queue: crate::retention::QueueSql,
    ) -> Self {
        Self {
            insert_many: table_sql(format!(
                "INSERT INTO {table} (provider, event_id, headers, body, authenticator, \
                 received_at, available_at, order_key, event_time, authenticator_until) \
                 SELECT p, e, h, b, a, r, r, k, t, u FROM unnest($1::text[], $2::text[], \
                 $3::text[], $4::bytea[], $5::bytea[], $6::int8[], $7::text[], $8::int8[], \
                 $9::int8[]) AS x(p, e, h, b, a, r, k, t, u) \
                 ON CONFLICT DO NOTHING RETURNING provider, event_id"
            )),
            ordered: OrderedSql::new(table, (DUE, DUE_BY_KEY), postgres),
            schema: schema + &queue.schema,
            // One statement: the insert is the dedupe. No conflict target, so a replayed
            // authenticator (a captured signature under another event id) is ignored too.
            insert: table_sql(format!(
                "INSERT INTO {table} (provider, event_id, headers, body, authenticator, \
                 received_at, available_at, order_key, event_time, authenticator_until) \
                 VALUES ($1, $2, $3, $4, $5, $6, $6, $7, $8, $9) ON CONFLICT DO NOTHING"
            )),
            claim: table_sql(claim),
            complete: table_sql(format!(
                "UPDATE {table} SET state = 1, finished_at = $3, last_error = NULL, \
                 lease_token = NULL, lease_until = NULL \
                 WHERE provider = $1 AND event_id = $2 AND lease_token = $4"
            )),
            fail: table_sql(format!(
                "UPDATE {table} SET \
                 state = CASE WHEN attempts >= $5 THEN 2 ELSE 0 END, \
                 finished_at = CASE WHEN attempts >= $5 THEN $3 ELSE NULL END, \
                 available_at = $6, last_error = $7, lease_token = NULL, lease_until = NULL \
                 WHERE provider = $1 AND event_id = $2 AND lease_token = $4"
            )),
            // Retries and recovered events first: fresh ones are usually queued already.
            due: table_sql(format!(
                "SELECT provider, event_id FROM {table} WHERE {DUE} AND attempts < $3 \
                 ORDER BY attempts = 0, available_at LIMIT $2"
            )),
            renew: table_sql(format!(
                "UPDATE {table} SET lease_until = $4 \
                 WHERE provider = $1 AND event_id = $2 AND lease_token = $3 AND state + 0 = 0"
            )),
            exhaust: table_sql(format!(
                "UPDATE {table} SET state = 2, finished_at = $1, last_error = $3, \
                 lease_token = NULL, lease_until = NULL WHERE {DUE} AND attempts >= $2 \
                 RETURNING provider"
            )),
            list: table_sql(format!(
                "SELECT {SUMMARY} FROM {table} WHERE state = $1 \
                 ORDER BY received_at, provider, event_id LIMIT $2"
            )),
            get: table_sql(format!(
                "SELECT {SUMMARY} FROM {table} WHERE provider = $1 AND event_id = $2"
            )),
            retry: table_sql(format!(
                "UPDATE {table} SET state = 0, attempts = 0, available_at = $3, \
                 finished_at = NULL, last_error = NULL, lease_token = NULL, lease_until = NULL \
                 WHERE provider = $1 AND event_id = $2 AND state = 2"
            )),
            counts: table_sql(format!(
                "SELECT state, count(*) FROM {table} GROUP BY state"
            )),
            queue,
            executed: AtomicU64::new(0),
            claim_many: table_sql(String::new()),
        }
    }

    /// The Postgres statements. The claim skips a row another instance's claim is locking
    /// instead of waiting for it.
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(table: &str) -> Self {
        let schema = format!(
            "SELECT pg_advisory_xact_lock(hashtext('tower-idempotency-inbox:{table}'));\n\
             CREATE TABLE IF NOT EXISTS {table} (\n\
             provider text COLLATE \"C\" NOT NULL,\n\
             event_id text COLLATE \"C\" NOT NULL,\n\
             headers text NOT NULL,\n\
             body bytea NOT NULL,\n\
             authenticator bytea,\n\
             authenticator_until bigint,\n\
             received_at bigint NOT NULL,\n\
             state smallint NOT NULL DEFAULT 0,\n\
             attempts integer NOT NULL DEFAULT 0,\n\
             available_at bigint NOT NULL,\n\
             lease_token bigint,\n\
             lease_until bigint,\n\
             finished_at bigint,\n\
             last_error text,\n\
             order_key text COLLATE \"C\",\n\
             event_time bigint,\n\
             PRIMARY KEY (provider, event_id));\n\
             CREATE UNIQUE INDEX IF NOT EXISTS {table}_auth_idx ON {table} (provider, authenticator);\n\
             CREATE INDEX IF NOT EXISTS {table}_due_idx ON {table} (state, available_at);\n\
             CREATE INDEX IF NOT EXISTS {table}_order_idx ON {table} (provider, order_key, state);\n"
        );
        let claim = format!(
            "UPDATE {table} SET attempts = attempts + 1, lease_token = $4, lease_until = $5 \
             WHERE (provider, event_id) = (SELECT provider, event_id FROM {table} \
             WHERE provider = $2 AND event_id = $3 AND {DUE_BY_KEY} AND attempts < $6 \
             FOR UPDATE SKIP LOCKED) \
             RETURNING headers, body, received_at, attempts"
        );
        // The keys arrive as two arrays; each row a claim takes is locked by its subquery, and a
        // row another instance's claim is locking is skipped.
        let claim_many = format!(
            "UPDATE {table} SET attempts = attempts + 1, lease_token = $4, lease_until = $5 \
             WHERE (provider, event_id) IN (SELECT provider, event_id FROM {table} \
             WHERE (provider, event_id) IN (SELECT p COLLATE \"C\", e COLLATE \"C\" \
             FROM unnest($2::text[], $3::text[]) AS x(p, e)) \
             AND {DUE_BY_KEY} AND attempts < $6 FOR UPDATE SKIP LOCKED) \
             RETURNING provider, event_id, headers, body, received_at, attempts"
        );
        Self {
            claim_many: table_sql(claim_many),
            ..Self::new(
                table,
                schema,
                claim,
                true,
                crate::retention::QueueSql::postgres(table),
            )
        }
    }

    /// The SQLite statements. The database has one writer at a time, so the claim needs no
    /// lock clause.
    #[cfg(feature = "sqlite")]
    pub(crate) fn sqlite(table: &str) -> Self {
        let schema = format!(
            "CREATE TABLE IF NOT EXISTS {table} (\n\
             provider TEXT NOT NULL,\n\
             event_id TEXT NOT NULL,\n\
             headers TEXT NOT NULL,\n\
             body BLOB NOT NULL,\n\
             authenticator BLOB,\n\
             authenticator_until INTEGER,\n\
             received_at INTEGER NOT NULL,\n\
             state INTEGER NOT NULL DEFAULT 0,\n\
             attempts INTEGER NOT NULL DEFAULT 0,\n\
             available_at INTEGER NOT NULL,\n\
             lease_token INTEGER,\n\
             lease_until INTEGER,\n\
             finished_at INTEGER,\n\
             last_error TEXT,\n\
             order_key TEXT,\n\
             event_time INTEGER,\n\
             PRIMARY KEY (provider, event_id)) WITHOUT ROWID;\n\
             CREATE UNIQUE INDEX IF NOT EXISTS {table}_auth_idx ON {table} (provider, authenticator);\n\
             CREATE INDEX IF NOT EXISTS {table}_due_idx ON {table} (state, available_at);\n\
             CREATE INDEX IF NOT EXISTS {table}_order_idx ON {table} (provider, order_key, state);\n"
        );
        let claim = format!(
            "UPDATE {table} SET attempts = attempts + 1, lease_token = $4, lease_until = $5 \
             WHERE provider = $2 AND event_id = $3 AND {DUE_BY_KEY} AND attempts < $6 \
             RETURNING headers, body, received_at, attempts"
        );
        // The keys arrive as two JSON arrays of strings, paired by position.
        let claim_many = format!(
            "UPDATE {table} SET attempts = attempts + 1, lease_token = $4, lease_until = $5 \
             WHERE (provider, event_id) IN (SELECT p.value, e.value \
             FROM json_each($2) AS p JOIN json_each($3) AS e ON e.key = p.key) \
             AND {DUE_BY_KEY} AND attempts < $6 \
             RETURNING provider, event_id, headers, body, received_at, attempts"
        );
        Self {
            claim_many: table_sql(claim_many),
            ..Self::new(
                table,
                schema,
                claim,
                false,
                crate::retention::QueueSql::sqlite(table),
            )
        }
    }
}

/// A database the inbox runs on: [`sqlx::Postgres`] (feature `postgres`) or [`sqlx::Sqlite`]
/// (feature `sqlite`). Sealed; its methods are the inbox's statements and not a public API.
pub trait InboxDatabase: sqlx::Database + sealed::Sealed + crate::ops_sql::OpsDatabase {
    /// How an event's transaction starts when the worker reads before the handler writes
    /// (under [`OrderingPolicy::SkipStale`](crate::OrderingPolicy::SkipStale)), and when a lazy
    /// start met a conflict.
    #[doc(hidden)]
    const BEGIN: &'static str;

    /// How a handler's transaction starts otherwise: on SQLite `BEGIN` (deferred), which takes
    /// no lock until the handler's first statement, so what a handler does before it (calling
    /// another service, waiting) holds no lock.
    #[doc(hidden)]
    const BEGIN_LAZY: &'static str;

    /// Handlers a worker runs at once unless [`WorkerBuilder::concurrency`] says otherwise:
    /// 16 on Postgres, whose commits of many connections proceed side by side; 4 on SQLite,
    /// whose event transactions take the one write lock in turn.
    ///
    /// [`WorkerBuilder::concurrency`]: crate::WorkerBuilder::concurrency
    const DEFAULT_CONCURRENCY: usize;

    #[doc(hidden)]
    fn statements(table: &str) -> Sql;

    #[doc(hidden)]
    fn migrate<'a>(pool: &'a sqlx::Pool<Self>, sql: &'a Sql) -> BoxFuture<'a, sqlx::Result<()>>;

    /// Whether the row was inserted (`false`: a duplicate).
    #[doc(hidden)]
    fn insert<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        event: &'a NewEvent,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// Claims a due event whose attempts are below `max_attempts` under `token` until
    /// `lease_until`.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn claim<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        key: &'a EventKey,
        now: i64,
        token: i64,
        lease_until: i64,
        max_attempts: i32,
    ) -> BoxFuture<'a, sqlx::Result<Option<ClaimedRow>>>;

    /// Extends the claim of `token` to `lease_until`; `false` when it is no longer held.
    #[doc(hidden)]
    fn renew<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        key: &'a EventKey,
        token: i64,
        lease_until: i64,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// Fails the due events whose attempts are spent; answers their providers.
    #[doc(hidden)]
    fn exhaust<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        now: i64,
        max_attempts: i32,
    ) -> BoxFuture<'a, sqlx::Result<Vec<String>>>;

    /// Marks the event processed inside the handler's transaction, fenced by the claim's token.
    #[doc(hidden)]
    fn complete<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a Sql,
        key: &'a EventKey,
        now: i64,
        token: i64,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// Records a failed attempt, fenced by the claim's token: back to pending until `retry_at`,
    /// or failed when `attempts >= max_attempts`.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn fail<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        key: &'a EventKey,
        now: i64,
        token: i64,
        max_attempts: i32,
        retry_at: i64,
        error: &'a str,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    #[doc(hidden)]
    fn due<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        now: i64,
        limit: i64,
        max_attempts: i32,
    ) -> BoxFuture<'a, sqlx::Result<Vec<EventKey>>>;

    #[doc(hidden)]
    fn list<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        state: i16,
        limit: i64,
    ) -> BoxFuture<'a, sqlx::Result<Vec<EventSummary>>>;

    #[doc(hidden)]
    fn get<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        key: &'a EventKey,
    ) -> BoxFuture<'a, sqlx::Result<Option<EventSummary>>>;

    #[doc(hidden)]
    fn retry<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        key: &'a EventKey,
        now: i64,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    #[doc(hidden)]
    fn purge<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        before: i64,
    ) -> BoxFuture<'a, sqlx::Result<u64>>;

    #[doc(hidden)]
    fn counts<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
    ) -> BoxFuture<'a, sqlx::Result<StateCounts>>;

    /// Inserts `events` (distinct keys) in one commit; answers the keys of the rows inserted
    /// (the others were duplicates).
    #[doc(hidden)]
    fn insert_many<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        events: &'a [&'a NewEvent],
    ) -> BoxFuture<'a, sqlx::Result<HashSet<EventKey>>>;

    /// Claims like [`claim`](Self::claim) under [`OrderingPolicy::Sequential`](crate::OrderingPolicy::Sequential):
    /// only when no other pending event of its ordering key is earlier or running.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn claim_in_order<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        key: &'a EventKey,
        now: i64,
        token: i64,
        lease_until: i64,
        max_attempts: i32,
    ) -> BoxFuture<'a, sqlx::Result<Option<ClaimedRow>>>;

    /// The due events as [`due`](Self::due) under [`OrderingPolicy::Sequential`](crate::OrderingPolicy::Sequential):
    /// only those a claim would take now.
    #[doc(hidden)]
    fn due_in_order<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        now: i64,
        limit: i64,
        max_attempts: i32,
    ) -> BoxFuture<'a, sqlx::Result<Vec<EventKey>>>;

    /// Locks the event's ordering key for the rest of `conn`'s transaction (Postgres; on
    /// SQLite the transaction's write lock does it), then answers the event id of a processed
    /// event of that key strictly newer than it, if any.
    #[doc(hidden)]
    fn newer_processed<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a Sql,
        key: &'a EventKey,
    ) -> BoxFuture<'a, sqlx::Result<Option<String>>>;

    /// Marks the claimed event skipped with `reason`, fenced by `token`.
    #[doc(hidden)]
    fn skip<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a Sql,
        key: &'a EventKey,
        now: i64,
        token: i64,
        reason: &'a str,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// The earliest pending event of the event's ordering key, other than the event.
    #[doc(hidden)]
    fn next_in_order<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        key: &'a EventKey,
    ) -> BoxFuture<'a, sqlx::Result<Option<String>>>;

    /// The pending and failed events by state and provider, with each group's oldest
    /// `received_at`, read from the index of non-processed rows.
    #[doc(hidden)]
    fn open_groups<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
    ) -> BoxFuture<'a, sqlx::Result<Vec<OpenGroup>>>;

    /// Deletes up to `limit` events processed before `before` whose authenticator horizon
    /// ended by `now`, oldest first; answers how many.
    #[doc(hidden)]
    fn purge_batch<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        before: i64,
        now: i64,
        limit: i64,
    ) -> BoxFuture<'a, sqlx::Result<u64>>;

    /// Claims, in one statement, those of `keys` (distinct) that are due with attempts below
    /// `max_attempts`, all under `token` until `lease_until`; answers each claimed event's key
    /// and row (Postgres skips a row another instance's claim is locking).
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn claim_many<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        keys: &'a [EventKey],
        now: i64,
        token: i64,
        lease_until: i64,
        max_attempts: i32,
    ) -> BoxFuture<'a, sqlx::Result<Vec<(EventKey, ClaimedRow)>>>;
}

mod sealed {
    pub trait Sealed {}
}

/// A claim's `RETURNING headers, body, received_at, attempts`.
fn claimed_row<R: sqlx::Row>(row: &R) -> sqlx::Result<ClaimedRow>
where
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    claimed_row_at(row, 0)
}

/// [`claimed_row`] from the row's columns `at..at + 4`.
fn claimed_row_at<R: sqlx::Row>(row: &R, at: usize) -> sqlx::Result<ClaimedRow>
where
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(ClaimedRow {
        headers: row.try_get(at)?,
        body: row.try_get(at + 1)?,
        received_at: row.try_get(at + 2)?,
        attempts: row.try_get(at + 3)?,
    })
}

fn summary<R: sqlx::Row>(row: &R) -> sqlx::Result<EventSummary>
where
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i16: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(EventSummary {
        provider: row.try_get(0)?,
        event_id: row.try_get(1)?,
        state: crate::EventState::from_code(row.try_get(2)?),
        attempts: u32::try_from(row.try_get::<i32, _>(3)?).unwrap_or(0),
        received_at_ms: row.try_get(4)?,
        available_at_ms: row.try_get(5)?,
        finished_at_ms: row.try_get(6)?,
        last_error: row.try_get(7)?,
    })
}

/// The typed calls, the same for each database.
macro_rules! backend {
    (
        $db:ty,
        $feature:literal,
        $statements:path,
        $begin:literal,
        $begin_lazy:literal,
        $concurrency:literal,
        $insert_many:path,
        $keys:path
    ) => {
        #[cfg(feature = $feature)]
        const _: () = {
            type Query<'q> = sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments>;

            /// `statement`, counted, with the event's key bound as `$1` and `$2`.
            fn keyed<'q>(sql: &Sql, statement: &SqlStr, key: &'q EventKey) -> Query<'q> {
                sql.sent();
                sqlx::query(statement.clone())
                    .bind(&key.provider)
                    .bind(&key.event_id)
            }

            /// Runs `query`: whether it changed exactly one row (`false`: a duplicate, or a claim
            /// that is no longer the holder's).
            async fn one_row<'e, E>(query: Query<'e>, executor: E) -> sqlx::Result<bool>
            where
                E: sqlx::Executor<'e, Database = $db> + 'e,
            {
                Ok(query.execute(executor).await?.rows_affected() == 1)
            }

            /// The due events `statement` selects.
            fn due_by<'a>(
                pool: &'a sqlx::Pool<$db>,
                sql: &'a Sql,
                statement: &'a SqlStr,
                now: i64,
                limit: i64,
                max_attempts: i32,
            ) -> BoxFuture<'a, sqlx::Result<Vec<EventKey>>> {
                Box::pin(async move {
                    sql.sent();
                    let rows: Vec<(String, String)> = sqlx::query_as(statement.clone())
                        .bind(now)
                        .bind(limit)
                        .bind(max_attempts)
                        .fetch_all(pool)
                        .await?;
                    Ok(rows
                        .into_iter()
                        .map(|(provider, event_id)| EventKey { provider, event_id })
                        .collect())
                })
            }

            impl sealed::Sealed for $db {}

            impl InboxDatabase for $db {
                const BEGIN: &'static str = $begin;
                const BEGIN_LAZY: &'static str = $begin_lazy;
                const DEFAULT_CONCURRENCY: usize = $concurrency;

                fn statements(table: &str) -> Sql {
                    $statements(table)
                }

                fn migrate<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                ) -> BoxFuture<'a, sqlx::Result<()>> {
                    Box::pin(async move {
                        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.schema.as_str()))
                            .execute(pool)
                            .await?;
                        Ok(())
                    })
                }

                fn insert<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    event: &'a NewEvent,
                ) -> BoxFuture<'a, sqlx::Result<bool>> {
                    Box::pin(async move {
                        let query = keyed(sql, &sql.insert, &event.key)
                            .bind(&event.headers)
                            .bind(&event.body)
                            .bind(&event.authenticator)
                            .bind(event.received_at)
                            .bind(event.order.as_ref().map(|o| o.key.as_str()))
                            .bind(event.order.as_ref().map(|o| o.time))
                            .bind(event.authenticator_until);
                        one_row(query, pool).await
                    })
                }

                fn claim<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    key: &'a EventKey,
                    now: i64,
                    token: i64,
                    lease_until: i64,
                    max_attempts: i32,
                ) -> BoxFuture<'a, sqlx::Result<Option<ClaimedRow>>> {
                    Box::pin(async move {
                        sql.sent();
                        let row = sqlx::query(sql.claim.clone())
                            .bind(now)
                            .bind(&key.provider)
                            .bind(&key.event_id)
                            .bind(token)
                            .bind(lease_until)
                            .bind(max_attempts)
                            .fetch_optional(pool)
                            .await?;
                        row.map(|row| claimed_row(&row)).transpose()
                    })
                }

                fn complete<'a>(
                    conn: &'a mut Self::Connection,
                    sql: &'a Sql,
                    key: &'a EventKey,
                    now: i64,
                    token: i64,
                ) -> BoxFuture<'a, sqlx::Result<bool>> {
                    Box::pin(async move {
                        let query = keyed(sql, &sql.complete, key).bind(now).bind(token);
                        one_row(query, conn).await
                    })
                }

                fn fail<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    key: &'a EventKey,
                    now: i64,
                    token: i64,
                    max_attempts: i32,
                    retry_at: i64,
                    error: &'a str,
                ) -> BoxFuture<'a, sqlx::Result<bool>> {
                    Box::pin(async move {
                        let query = keyed(sql, &sql.fail, key)
                            .bind(now)
                            .bind(token)
                            .bind(max_attempts)
                            .bind(retry_at)
                            .bind(error);
                        one_row(query, pool).await
                    })
                }

                fn renew<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    key: &'a EventKey,
                    token: i64,
                    lease_until: i64,
                ) -> BoxFuture<'a, sqlx::Result<bool>> {
                    Box::pin(async move {
                        let query = keyed(sql, &sql.renew, key).bind(token).bind(lease_until);
                        one_row(query, pool).await
                    })
                }

                fn exhaust<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    now: i64,
                    max_attempts: i32,
                ) -> BoxFuture<'a, sqlx::Result<Vec<String>>> {
                    Box::pin(async move {
                        sql.sent();
                        sqlx::query_scalar(sql.exhaust.clone())
                            .bind(now)
                            .bind(max_attempts)
                            .bind(SPENT)
                            .fetch_all(pool)
                            .await
                    })
                }

                fn due<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    now: i64,
                    limit: i64,
                    max_attempts: i32,
                ) -> BoxFuture<'a, sqlx::Result<Vec<EventKey>>> {
                    due_by(pool, sql, &sql.due, now, limit, max_attempts)
                }

                fn due_in_order<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    now: i64,
                    limit: i64,
                    max_attempts: i32,
                ) -> BoxFuture<'a, sqlx::Result<Vec<EventKey>>> {
                    due_by(pool, sql, &sql.ordered.due, now, limit, max_attempts)
                }

                fn list<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    state: i16,
                    limit: i64,
                ) -> BoxFuture<'a, sqlx::Result<Vec<EventSummary>>> {
                    Box::pin(async move {
                        sql.sent();
                        let rows = sqlx::query(sql.list.clone())
                            .bind(state)
                            .bind(limit)
                            .fetch_all(pool)
                            .await?;
                        rows.iter().map(summary).collect()
                    })
                }

                fn get<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    key: &'a EventKey,
                ) -> BoxFuture<'a, sqlx::Result<Option<EventSummary>>> {
                    Box::pin(async move {
                        let row = keyed(sql, &sql.get, key).fetch_optional(pool).await?;
                        row.as_ref().map(summary).transpose()
                    })
                }

                fn retry<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    key: &'a EventKey,
                    now: i64,
                ) -> BoxFuture<'a, sqlx::Result<bool>> {
                    Box::pin(async move {
                        let query = keyed(sql, &sql.retry, key).bind(now);
                        one_row(query, pool).await
                    })
                }

                fn purge<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    before: i64,
                ) -> BoxFuture<'a, sqlx::Result<u64>> {
                    // In batches, each a statement of its own (see `purge_batch`).
                    Box::pin(async move {
                        let (now, batch) = (
                            crate::event::now_ms(),
                            crate::retention::DEFAULT_PURGE_BATCH,
                        );
                        let mut purged = 0;
                        loop {
                            let done = <Self as InboxDatabase>::purge_batch(
                                pool,
                                sql,
                                before,
                                now,
                                i64::from(batch),
                            )
                            .await?;
                            purged += done;
                            if done < u64::from(batch) {
                                return Ok(purged);
                            }
                        }
                    })
                }

                fn counts<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                ) -> BoxFuture<'a, sqlx::Result<StateCounts>> {
                    Box::pin(async move {
                        sql.sent();
                        let rows: Vec<(i16, i64)> =
                            sqlx::query_as(sql.counts.clone()).fetch_all(pool).await?;
                        let mut counts = StateCounts::default();
                        for (state, count) in rows {
                            let count = u64::try_from(count).unwrap_or(0);
                            match crate::EventState::from_code(state) {
                                crate::EventState::Pending => counts.pending = count,
                                crate::EventState::Processed => counts.processed = count,
                                crate::EventState::Failed => counts.failed = count,
                                crate::EventState::Skipped => counts.skipped = count,
                            }
                        }
                        Ok(counts)
                    })
                }

                fn insert_many<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    events: &'a [&'a NewEvent],
                ) -> BoxFuture<'a, sqlx::Result<HashSet<EventKey>>> {
                    Box::pin($insert_many(pool, sql, events))
                }

                fn claim_in_order<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    key: &'a EventKey,
                    now: i64,
                    token: i64,
                    lease_until: i64,
                    max_attempts: i32,
                ) -> BoxFuture<'a, sqlx::Result<Option<ClaimedRow>>> {
                    Box::pin(async move {
                        let claim = |conn| {
                            sql.sent();
                            sqlx::query(sql.ordered.claim.clone())
                                .bind(now)
                                .bind(&key.provider)
                                .bind(&key.event_id)
                                .bind(token)
                                .bind(lease_until)
                                .bind(max_attempts)
                                .fetch_optional(conn)
                        };
                        let row = match &sql.ordered.lock {
                            // The lock's statement and the claim's are two, so the claim reads
                            // what the key's previous holder committed before it let go.
                            Some(lock) => {
                                let mut tx = pool.begin().await?;
                                keyed(sql, lock, key).fetch_all(&mut *tx).await?;
                                let row = claim(&mut *tx).await?;
                                tx.commit().await?;
                                row
                            }
                            None => {
                                let mut conn = pool.acquire().await?;
                                claim(&mut *conn).await?
                            }
                        };
                        row.map(|row| claimed_row(&row)).transpose()
                    })
                }

                fn newer_processed<'a>(
                    conn: &'a mut Self::Connection,
                    sql: &'a Sql,
                    key: &'a EventKey,
                ) -> BoxFuture<'a, sqlx::Result<Option<String>>> {
                    Box::pin(async move {
                        if let Some(lock) = &sql.ordered.lock {
                            keyed(sql, lock, key).fetch_all(&mut *conn).await?;
                        }
                        sql.sent();
                        sqlx::query_scalar(sql.ordered.newer.clone())
                            .bind(&key.provider)
                            .bind(&key.event_id)
                            .fetch_optional(&mut *conn)
                            .await
                    })
                }

                fn skip<'a>(
                    conn: &'a mut Self::Connection,
                    sql: &'a Sql,
                    key: &'a EventKey,
                    now: i64,
                    token: i64,
                    reason: &'a str,
                ) -> BoxFuture<'a, sqlx::Result<bool>> {
                    Box::pin(async move {
                        let query = keyed(sql, &sql.ordered.skip, key)
                            .bind(now)
                            .bind(token)
                            .bind(reason);
                        one_row(query, conn).await
                    })
                }

                fn next_in_order<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    key: &'a EventKey,
                ) -> BoxFuture<'a, sqlx::Result<Option<String>>> {
                    Box::pin(async move {
                        sql.sent();
                        sqlx::query_scalar(sql.ordered.next.clone())
                            .bind(&key.provider)
                            .bind(&key.event_id)
                            .fetch_optional(pool)
                            .await
                    })
                }

                fn open_groups<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                ) -> BoxFuture<'a, sqlx::Result<Vec<OpenGroup>>> {
                    Box::pin(async move {
                        sql.sent();
                        let rows: Vec<(i16, String, i64, i64)> =
                            sqlx::query_as(sql.queue.open_groups.clone())
                                .fetch_all(pool)
                                .await?;
                        Ok(rows
                            .into_iter()
                            .map(|(state, provider, count, oldest)| OpenGroup {
                                state: crate::EventState::from_code(state),
                                provider,
                                count: u64::try_from(count).unwrap_or(0),
                                oldest_received_at: oldest,
                            })
                            .collect())
                    })
                }

                fn purge_batch<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    before: i64,
                    now: i64,
                    limit: i64,
                ) -> BoxFuture<'a, sqlx::Result<u64>> {
                    <Self as Purge>::purge_batch(pool, sql, before, now, limit)
                }

                fn claim_many<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    keys: &'a [EventKey],
                    now: i64,
                    token: i64,
                    lease_until: i64,
                    max_attempts: i32,
                ) -> BoxFuture<'a, sqlx::Result<Vec<(EventKey, ClaimedRow)>>> {
                    use sqlx::Row as _;
                    Box::pin(async move {
                        let (providers, event_ids) = $keys(keys);
                        sql.sent();
                        let rows = sqlx::query(sql.claim_many.clone())
                            .bind(now)
                            .bind(providers)
                            .bind(event_ids)
                            .bind(token)
                            .bind(lease_until)
                            .bind(max_attempts)
                            .fetch_all(pool)
                            .await?;
                        rows.iter()
                            .map(|row| {
                                let key = EventKey {
                                    provider: row.try_get(0)?,
                                    event_id: row.try_get(1)?,
                                };
                                Ok((key, claimed_row_at(row, 2)?))
                            })
                            .collect()
                    })
                }
            }
        };
    };
}

backend!(
    sqlx::Postgres,
    "postgres",
    Sql::postgres,
    "BEGIN",
    "BEGIN",
    16,
    insert_many_postgres,
    keys_postgres
);
// The write lock from the start: a deferred transaction that read first could not upgrade to a
// write after another connection's commit (`SQLITE_BUSY` at once, whatever the busy timeout).
// So one handler writes at a time, and more handlers than a few only wait in the busy handler
// (`--bin inbox` in the bench workspace shows the drain).
backend!(
    sqlx::Sqlite,
    "sqlite",
    Sql::sqlite,
    "BEGIN IMMEDIATE",
    "BEGIN",
    4,
    insert_many_sqlite,
    keys_sqlite
);

/// Postgres: one statement over arrays, whatever the batch's size (one prepared statement).
#[cfg(feature = "postgres")]
async fn insert_many_postgres(
    pool: &sqlx::PgPool,
    sql: &Sql,
    events: &[&NewEvent],
) -> sqlx::Result<HashSet<EventKey>> {
    let column = |f: &dyn Fn(&NewEvent) -> String| events.iter().map(|e| f(e)).collect::<Vec<_>>();
    sql.sent();
    let rows: Vec<(String, String)> = sqlx::query_as(sql.insert_many.clone())
        .bind(column(&|e| e.key.provider.clone()))
        .bind(column(&|e| e.key.event_id.clone()))
        .bind(column(&|e| e.headers.clone()))
        .bind(events.iter().map(|e| e.body.clone()).collect::<Vec<_>>())
        .bind(
            events
                .iter()
                .map(|e| e.authenticator.clone())
                .collect::<Vec<_>>(),
        )
        .bind(events.iter().map(|e| e.received_at).collect::<Vec<_>>())
        .bind(
            events
                .iter()
                .map(|e| e.order.as_ref().map(|o| o.key.clone()))
                .collect::<Vec<_>>(),
        )
        .bind(
            events
                .iter()
                .map(|e| e.order.as_ref().map(|o| o.time))
                .collect::<Vec<_>>(),
        )
        .bind(
            events
                .iter()
                .map(|e| e.authenticator_until)
                .collect::<Vec<_>>(),
        )
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(provider, event_id)| EventKey { provider, event_id })
        .collect())
}

/// SQLite: the rows one by one in one `BEGIN IMMEDIATE` transaction, so one commit (and one
/// wait for the write lock) for all of them.
#[cfg(feature = "sqlite")]
async fn insert_many_sqlite(
    pool: &sqlx::SqlitePool,
    sql: &Sql,
    events: &[&NewEvent],
) -> sqlx::Result<HashSet<EventKey>> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let mut inserted = HashSet::new();
    for event in events {
        sql.sent();
        let done = sqlx::query(sql.insert.clone())
            .bind(&event.key.provider)
            .bind(&event.key.event_id)
            .bind(&event.headers)
            .bind(&event.body)
            .bind(&event.authenticator)
            .bind(event.received_at)
            .bind(event.order.as_ref().map(|o| o.key.as_str()))
            .bind(event.order.as_ref().map(|o| o.time))
            .bind(event.authenticator_until)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 1 {
            inserted.insert(event.key.clone());
        }
    }
    tx.commit().await?;
    Ok(inserted)
}

/// Postgres: a batch claim's keys as two text arrays.
#[cfg(feature = "postgres")]
fn keys_postgres(keys: &[EventKey]) -> (Vec<&str>, Vec<&str>) {
    keys.iter()
        .map(|k| (k.provider.as_str(), k.event_id.as_str()))
        .unzip()
}

/// SQLite: a batch claim's keys as two JSON arrays of strings.
#[cfg(feature = "sqlite")]
fn keys_sqlite(keys: &[EventKey]) -> (String, String) {
    let (providers, event_ids): (Vec<&str>, Vec<&str>) = keys
        .iter()
        .map(|k| (k.provider.as_str(), k.event_id.as_str()))
        .unzip();
    let json = |v: Vec<&str>| serde_json::to_string(&v).expect("strings serialize");
    (json(providers), json(event_ids))
}

/// A database's purge of one batch (see [`Inbox::purge_batch`](crate::Inbox::purge_batch)).
pub(crate) trait Purge: sqlx::Database {
    /// Deletes up to `limit` finished events before `before` whose authenticator horizon ended
    /// by `now`, keeping the newest processed position of each object among them, and up to
    /// `limit` positions written before `before` whose object has no open event; answers how
    /// many events it deleted.
    fn purge_batch<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        before: i64,
        now: i64,
        limit: i64,
    ) -> BoxFuture<'a, sqlx::Result<u64>>;
}

/// Deletes up to `limit` positions written before `before` whose object has no open event.
async fn purge_positions<'e, DB, E>(
    executor: E,
    sql: &'e Sql,
    before: i64,
    limit: i64,
) -> sqlx::Result<()>
where
    DB: sqlx::Database,
    E: sqlx::Executor<'e, Database = DB>,
    i64: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'q> <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB>,
{
    sql.sent();
    sqlx::query(sql.queue.purge_positions.clone())
        .bind(before)
        .bind(limit)
        .execute(executor)
        .await?;
    Ok(())
}

#[cfg(feature = "postgres")]
impl Purge for sqlx::Postgres {
    fn purge_batch<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        before: i64,
        now: i64,
        limit: i64,
    ) -> BoxFuture<'a, sqlx::Result<u64>> {
        Box::pin(async move {
            sql.sent();
            let purged: i64 = sqlx::query_scalar(sql.queue.purge_batch.clone())
                .bind(before)
                .bind(now)
                .bind(limit)
                .fetch_one(pool)
                .await?;
            purge_positions(pool, sql, before, limit).await?;
            Ok(u64::try_from(purged).unwrap_or(0))
        })
    }
}

#[cfg(feature = "sqlite")]
impl Purge for sqlx::Sqlite {
    fn purge_batch<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        before: i64,
        now: i64,
        limit: i64,
    ) -> BoxFuture<'a, sqlx::Result<u64>> {
        Box::pin(async move {
            // One transaction: the rows and the positions they carry change together.
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
            sql.sent();
            type Deleted = (String, String, i16, Option<String>, Option<i64>);
            let deleted: Vec<Deleted> = sqlx::query_as(sql.queue.purge_batch.clone())
                .bind(before)
                .bind(now)
                .bind(limit)
                .fetch_all(&mut *tx)
                .await?;
            let mut newest: HashMap<(&str, &str), (i64, &str)> = HashMap::new();
            for (provider, event_id, state, key, time) in &deleted {
                let (Some(key), Some(time), 1) = (key, time, state) else {
                    continue;
                };
                // The newest by time, then by event id, as on Postgres.
                let entry = newest
                    .entry((provider, key))
                    .or_insert((*time, event_id.as_str()));
                if (*time, event_id.as_str()) > *entry {
                    *entry = (*time, event_id);
                }
            }
            for ((provider, key), (time, event_id)) in newest {
                sql.sent();
                sqlx::query(sql.queue.keep_position.clone())
                    .bind(provider)
                    .bind(key)
                    .bind(time)
                    .bind(event_id)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
            }
            purge_positions(&mut *tx, sql, before, limit).await?;
            tx.commit().await?;
            Ok(u64::try_from(deleted.len()).unwrap_or(u64::MAX))
        })
    }
}
