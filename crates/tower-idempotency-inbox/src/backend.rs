//! The inbox's own statements: its table (the job engine's columns beside an event's), the
//! acknowledgement's inserts, the ordered claims, the gauges, the retention's purge and the
//! operator's discard. Every statement over the job columns alone (claims by key, renewals,
//! completion, failures, the sweep, listings, retries, counts) is the job engine's ([`Driver`],
//! over the [`table`] shape), called through the functions at the end of this file, which count
//! each statement for [`Inbox::statements_executed`](crate::Inbox::statements_executed).

#[cfg(any(feature = "sqlite", feature = "mysql"))]
use std::collections::HashMap;
use std::{
    collections::HashSet,
    sync::atomic::{AtomicU64, Ordering},
};

use futures_util::future::BoxFuture;
use tower_idempotency_jobs::{
    Attempt, AttemptOutcome, Claimed, Driver, JobKey, JobState, JobSummary, PageFilter, Prepared,
    Statements, Table, DUE, DUE_BY_KEY,
};

use crate::{
    event::{now_ms, EventKey, EventSummary, StateCounts},
    ordering::OrderedSql,
    retention::OpenGroup,
};

/// A verified delivery, as the acknowledgement inserts it.
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
#[derive(Debug)]
pub struct ClaimedRow {
    pub headers: String,
    pub body: Vec<u8>,
    pub received_at: i64,
    pub attempts: i32,
}

/// A claimed or shown event's stored request: its payload columns.
#[derive(Debug, sqlx::FromRow)]
pub struct Stored {
    pub headers: String,
    pub body: Vec<u8>,
    pub received_at: i64,
}

/// A listed event's column beside the engine's: the body, for the event's type.
#[derive(Debug, sqlx::FromRow)]
pub struct Listed {
    pub body: Vec<u8>,
}

pub(crate) use crate::dialect::Db;
#[cfg(feature = "mysql")]
pub(crate) use crate::dialect::MYSQL_KEY;

/// The inbox table's shape for the job engine.
pub(crate) fn table(name: &str) -> Table {
    Table::new(name, &["provider", "event_id"], "received_at")
        .payload(&["headers", "body", "received_at"])
        .summary(&["body"])
        .group("provider")
}

/// The statements of one inbox table.
#[derive(Debug)]
pub struct Sql {
    /// The job engine's statements of the table.
    pub(crate) jobs: Statements,
    /// Postgres: the acknowledgement of many deliveries in one statement (see `acks.rs`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    insert_many: Prepared,
    /// The statements of ordered events.
    pub(crate) ordered: OrderedSql,
    pub(crate) schema: String,
    insert: Prepared,
    /// The gauges' and the retention's statements ([`crate::retention`]).
    pub(crate) queue: crate::retention::QueueSql,
    /// The operator's discard: keeps a row whose authenticator must still refuse a replay.
    discard_keep: Prepared,
    /// The operator's discard of a row without an authenticator to keep.
    discard_delete: Prepared,
    /// The operator's replay of a processed or skipped event that kept its body.
    replay: Prepared,
    /// Statements sent through these, for [`Inbox::statements_executed`](crate::Inbox::statements_executed).
    executed: AtomicU64,
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

/// The last error of a discarded event kept for its authenticator.
pub(crate) const DISCARDED: &str = "discarded by an operator; kept without its body and headers \
     until its provider's retry horizon, so that its delivery re-sent under another id is still \
     refused";

impl Sql {
    fn new<DB: Driver>(
        name: &str,
        schema: String,
        db: Db,
        queue: crate::retention::QueueSql,
    ) -> Self {
        let sql = |text: String| Prepared::new(text, db.placeholders());
        // MySQL: `INSERT IGNORE`, which skips a row that would repeat any unique key.
        let (insert, on_conflict) = match db {
            Db::MySql => ("INSERT IGNORE", ""),
            Db::Postgres | Db::Sqlite => ("INSERT", " ON CONFLICT DO NOTHING"),
        };
        Self {
            jobs: DB::statements(table(name)),
            insert_many: sql(format!(
                "INSERT INTO {name} (provider, event_id, headers, body, authenticator, \
                 received_at, available_at, order_key, event_time, authenticator_until) \
                 SELECT p, e, h, b, a, r, r, k, t, u FROM unnest($1::text[], $2::text[], \
                 $3::text[], $4::bytea[], $5::bytea[], $6::int8[], $7::text[], $8::int8[], \
                 $9::int8[]) AS x(p, e, h, b, a, r, k, t, u) \
                 ON CONFLICT DO NOTHING RETURNING provider, event_id"
            )),
            ordered: OrderedSql::new(name, (DUE, DUE_BY_KEY), db),
            schema: schema + &queue.schema,
            // One statement: the insert is the dedupe. No conflict target, so a replayed
            // authenticator (a captured signature under another event id) is ignored too.
            insert: sql(format!(
                "{insert} INTO {name} (provider, event_id, headers, body, authenticator, \
                 received_at, available_at, order_key, event_time, authenticator_until) \
                 VALUES ($1, $2, $3, $4, $5, $6, $6, $7, $8, $9){on_conflict}"
            )),
            queue,
            // Each statement checks the horizon itself, so whichever matches the row does the
            // right thing. Bound: provider, event id, now, an empty body, the error.
            discard_keep: sql(format!(
                "UPDATE {name} SET state = 3, body = $4, headers = '[]', finished_at = $3, \
                 last_error = $5, lease_token = NULL, lease_until = NULL \
                 WHERE provider = $1 AND event_id = $2 AND state = 2 \
                 AND authenticator IS NOT NULL AND authenticator_until > $3"
            )),
            // Bound: provider, event id, now.
            discard_delete: sql(format!(
                "DELETE FROM {name} WHERE provider = $1 AND event_id = $2 AND state = 2 \
                 AND (authenticator IS NULL OR authenticator_until IS NULL \
                 OR authenticator_until <= $3)"
            )),
            // Bound: provider, event id, due time, the kept discard's error.
            replay: sql(format!(
                "UPDATE {name} SET state = 0, attempts = 0, available_at = $3, \
                 finished_at = NULL, last_error = NULL, lease_token = NULL, lease_until = NULL \
                 WHERE provider = $1 AND event_id = $2 AND state IN (1, 3) \
                 AND (last_error IS NULL OR last_error <> $4)"
            )),
            executed: AtomicU64::new(0),
        }
    }

    /// The inbox's columns in a database's types, around the engine's.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    fn schema<DB: Driver>(name: &str, lock: &str, types: [&str; 4], suffix: &str) -> String {
        let [key, text, bytes, big] = types;
        format!(
            "{lock}CREATE TABLE IF NOT EXISTS {name} (\n\
             provider {key} NOT NULL,\n\
             event_id {key} NOT NULL,\n\
             headers {text} NOT NULL,\n\
             body {bytes} NOT NULL,\n\
             authenticator {bytes},\n\
             authenticator_until {big},\n\
             received_at {big} NOT NULL,\n\
             order_key {key},\n\
             event_time {big},\n\
             {columns},\n\
             PRIMARY KEY (provider, event_id)){suffix};\n\
             CREATE UNIQUE INDEX IF NOT EXISTS {name}_auth_idx ON {name} (provider, authenticator);\n\
             {due}\
             CREATE INDEX IF NOT EXISTS {name}_order_idx ON {name} (provider, order_key, state);\n\
             {history}{audit}{pauses}",
            columns = DB::JOB_COLUMNS,
            due = DB::due_index(name),
            history = DB::history_schema(&table(name)),
            audit = DB::audit_schema(&table(name)),
            pauses = DB::pauses_schema(&table(name)),
        )
    }

    /// The Postgres statements.
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(name: &str) -> Self {
        let lock =
            format!("SELECT pg_advisory_xact_lock(hashtext('tower-idempotency-inbox:{name}'));\n");
        let types = ["text COLLATE \"C\"", "text", "bytea", "bigint"];
        let schema = Self::schema::<sqlx::Postgres>(name, &lock, types, "");
        let queue = crate::retention::QueueSql::postgres(name);
        Self::new::<sqlx::Postgres>(name, schema, Db::Postgres, queue)
    }

    /// The SQLite statements.
    #[cfg(feature = "sqlite")]
    pub(crate) fn sqlite(name: &str) -> Self {
        let types = ["TEXT", "TEXT", "BLOB", "INTEGER"];
        let schema = Self::schema::<sqlx::Sqlite>(name, "", types, " WITHOUT ROWID");
        let queue = crate::retention::QueueSql::sqlite(name);
        Self::new::<sqlx::Sqlite>(name, schema, Db::Sqlite, queue)
    }

    /// The MySQL statements: one `CREATE TABLE IF NOT EXISTS` with its indexes (MySQL has no
    /// `CREATE INDEX IF NOT EXISTS`, nor partial indexes: the open index holds every row).
    #[cfg(feature = "mysql")]
    pub(crate) fn mysql(name: &str) -> Self {
        let key = MYSQL_KEY;
        let schema = format!(
            "CREATE TABLE IF NOT EXISTS {name} (\n\
             provider {key} NOT NULL,\n\
             event_id {key} NOT NULL,\n\
             headers MEDIUMTEXT NOT NULL,\n\
             body LONGBLOB NOT NULL,\n\
             authenticator VARBINARY(1024),\n\
             authenticator_until BIGINT,\n\
             received_at BIGINT NOT NULL,\n\
             order_key {key},\n\
             event_time BIGINT,\n\
             {columns},\n\
             PRIMARY KEY (provider, event_id),\n\
             UNIQUE INDEX {name}_auth_idx (provider, authenticator),\n\
             INDEX {name}_order_idx (provider, order_key, state),\n\
             INDEX {name}_open_idx (state, provider, received_at),\n\
             INDEX {name}_finished_idx (state, finished_at)) ENGINE = InnoDB;\n{history}{audit}{pauses}",
            columns = <sqlx::MySql as Driver>::JOB_COLUMNS,
            history = <sqlx::MySql as Driver>::history_schema(&table(name)),
            audit = <sqlx::MySql as Driver>::audit_schema(&table(name)),
            pauses = <sqlx::MySql as Driver>::pauses_schema(&table(name)),
        );
        let queue = crate::retention::QueueSql::mysql(name);
        Self::new::<sqlx::MySql>(name, schema, Db::MySql, queue)
    }
}

/// A database the inbox runs on: [`sqlx::Postgres`] (feature `postgres`), [`sqlx::Sqlite`]
/// (feature `sqlite`) or `sqlx::MySql` (feature `mysql`: MySQL 8.0+, MariaDB 10.6+), through its job engine [`Driver`] (whose
/// [`CONCURRENCY`](Driver::CONCURRENCY) is a worker's default). Sealed: its
/// statements are the inbox's own.
pub trait InboxDatabase: Driver + sealed::InboxSql {
    /// Handlers a worker runs at once unless
    /// [`WorkerBuilder::concurrency`](crate::WorkerBuilder::concurrency) says otherwise: the
    /// driver's [`Driver::CONCURRENCY`] (16 on Postgres, 4 on SQLite).
    const DEFAULT_CONCURRENCY: usize = <Self as Driver>::CONCURRENCY;
}

impl<DB: Driver + sealed::InboxSql> InboxDatabase for DB {}

pub(crate) mod sealed {
    use std::collections::HashSet;

    use super::{BoxFuture, ClaimedRow, EventKey, Listed, NewEvent, OpenGroup, Sql, Stored};

    /// The inbox's own statements on one database, and its rows as this database decodes them
    /// (associated types, so that generic code knows they decode).
    pub trait InboxSql: sqlx::Database {
        /// [`Stored`], decodable from this database's rows.
        type Stored: for<'r> sqlx::FromRow<'r, Self::Row> + Into<Stored> + Send + Unpin + 'static;

        /// [`Listed`], decodable from this database's rows.
        type Listed: for<'r> sqlx::FromRow<'r, Self::Row> + Into<Listed> + Send + Unpin + 'static;

        /// How an event's transaction starts when the worker reads before the handler writes
        /// (under [`OrderingPolicy::SkipStale`](crate::OrderingPolicy::SkipStale)), and when a
        /// lazy start met a conflict.
        const BEGIN: &'static str;

        /// How a handler's transaction starts otherwise: on SQLite `BEGIN` (deferred), which
        /// takes no lock until the handler's first statement, so what a handler does before it
        /// (calling another service, waiting) holds no lock.
        const BEGIN_LAZY: &'static str;

        fn statements(table: &str) -> Sql;

        /// Whether the row was inserted (`false`: a duplicate).
        fn insert<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a Sql,
            event: &'a NewEvent,
        ) -> BoxFuture<'a, sqlx::Result<bool>>;

        /// Inserts `events` (distinct keys) in one commit; answers the keys of the rows
        /// inserted (the others were duplicates).
        fn insert_many<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a Sql,
            events: &'a [&'a NewEvent],
        ) -> BoxFuture<'a, sqlx::Result<HashSet<EventKey>>>;

        /// Claims an event under [`OrderingPolicy::Sequential`](crate::OrderingPolicy::Sequential):
        /// only when no other pending event of its ordering key is earlier or running.
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

        /// The due events under [`OrderingPolicy::Sequential`](crate::OrderingPolicy::Sequential):
        /// only those a claim would take now.
        fn due_in_order<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a Sql,
            now: i64,
            limit: i64,
            max_attempts: i32,
        ) -> BoxFuture<'a, sqlx::Result<Vec<EventKey>>>;

        /// Locks the event's ordering key for the rest of `conn`'s transaction (Postgres; on
        /// SQLite the transaction's write lock does it), then answers the event id of a
        /// processed event of that key strictly newer than it, if any.
        fn newer_processed<'a>(
            conn: &'a mut Self::Connection,
            sql: &'a Sql,
            key: &'a EventKey,
        ) -> BoxFuture<'a, sqlx::Result<Option<String>>>;

        /// Marks the claimed event skipped with `reason`, fenced by `token`.
        fn skip<'a>(
            conn: &'a mut Self::Connection,
            sql: &'a Sql,
            key: &'a EventKey,
            now: i64,
            token: i64,
            reason: &'a str,
        ) -> BoxFuture<'a, sqlx::Result<bool>>;

        /// The earliest pending event of the event's ordering key, other than the event.
        fn next_in_order<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a Sql,
            key: &'a EventKey,
        ) -> BoxFuture<'a, sqlx::Result<Option<String>>>;

        /// The pending and failed events by state and provider, with each group's oldest
        /// `received_at`, read from the index of non-processed rows.
        fn open_groups<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a Sql,
        ) -> BoxFuture<'a, sqlx::Result<Vec<OpenGroup>>>;

        /// Deletes up to `limit` events finished before `before` whose authenticator horizon
        /// ended by `now`, oldest first, keeping their objects' newest processed positions;
        /// answers how many.
        fn purge_batch<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a Sql,
            before: i64,
            now: i64,
            limit: i64,
        ) -> BoxFuture<'a, sqlx::Result<u64>>;

        /// Discards a failed event: deletes it, or, while its authenticator must still refuse
        /// a replay (`authenticator_until` after `now`), keeps its row finished without its
        /// body and headers; whether it did either.
        fn discard<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a Sql,
            key: &'a EventKey,
            now: i64,
        ) -> BoxFuture<'a, sqlx::Result<bool>>;

        /// Puts a processed or skipped event that kept its body back to pending with a fresh
        /// count of attempts, due at `due`, and records the replay in its history, in one
        /// transaction; whether it did.
        fn replay<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a Sql,
            key: &'a EventKey,
            due: i64,
        ) -> BoxFuture<'a, sqlx::Result<bool>>;
    }
}

/// A claim's row.
fn claimed_row(row: Stored, attempt: u32) -> ClaimedRow {
    ClaimedRow {
        headers: row.headers,
        body: row.body,
        received_at: row.received_at,
        attempts: i32::try_from(attempt).unwrap_or(i32::MAX),
    }
}

/// A claim's `RETURNING headers, body, received_at, attempts`, as the ordered claim reads it.
fn returned_row<R: sqlx::Row>(row: &R) -> sqlx::Result<ClaimedRow>
where
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(ClaimedRow {
        headers: row.try_get(0)?,
        body: row.try_get(1)?,
        received_at: row.try_get(2)?,
        attempts: row.try_get(3)?,
    })
}

/// The inbox's own calls, the same for each database.
macro_rules! inbox_sql {
    ($db:ty, $feature:literal, $statements:path, $begin_lazy:literal, $insert_many:path) => {
        #[cfg(feature = $feature)]
        const _: () = {
            type Query<'q> = sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments>;

            /// `statement`, counted, with the event's key bound as `$1` and `$2`.
            fn keyed<'q>(
                sql: &Sql,
                statement: &'q Prepared,
                key: &'q EventKey,
            ) -> tower_idempotency_jobs::Binder<'q, $db> {
                sql.sent();
                statement
                    .binder::<$db>()
                    .bind(key.provider.as_str())
                    .bind(key.event_id.as_str())
            }

            /// Runs `query`: whether it changed exactly one row (`false`: a duplicate, or a
            /// claim that is no longer the holder's).
            async fn one_row<'e, E>(query: Query<'e>, executor: E) -> sqlx::Result<bool>
            where
                E: sqlx::Executor<'e, Database = $db> + 'e,
            {
                Ok(query.execute(executor).await?.rows_affected() == 1)
            }

            impl sealed::InboxSql for $db {
                type Stored = Stored;
                type Listed = Listed;
                const BEGIN: &'static str = <$db as Driver>::BEGIN_WRITE;
                const BEGIN_LAZY: &'static str = $begin_lazy;

                fn statements(table: &str) -> Sql {
                    $statements(table)
                }

                fn insert<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    event: &'a NewEvent,
                ) -> BoxFuture<'a, sqlx::Result<bool>> {
                    Box::pin(async move {
                        let _turn = tower_idempotency_jobs::gate::turn::<$db>(pool).await;
                        let query = keyed(sql, &sql.insert, &event.key)
                            .bind(event.headers.as_str())
                            .bind(event.body.as_slice())
                            .bind(event.authenticator.as_deref())
                            .bind(event.received_at)
                            .bind(event.order.as_ref().map(|o| o.key.as_str()))
                            .bind(event.order.as_ref().map(|o| o.time))
                            .bind(event.authenticator_until);
                        one_row(query.query(), pool).await
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
                        let _turn = tower_idempotency_jobs::gate::turn::<$db>(pool).await;
                        let claim = |statement: &'a Prepared| {
                            sql.sent();
                            statement
                                .binder::<$db>()
                                .bind(now)
                                .bind(key.provider.as_str())
                                .bind(key.event_id.as_str())
                                .bind(token)
                                .bind(lease_until)
                                .bind(max_attempts)
                                .query()
                        };
                        let row = match &sql.ordered.lock {
                            // MySQL, without `RETURNING`: the key's rows locked, the event
                            // picked, its claim written and its row read, in one transaction.
                            Some(lock) if sql.ordered.unreturned.is_some() => {
                                let (update, read) =
                                    sql.ordered.unreturned.as_ref().expect("checked");
                                let mut tx = pool.begin().await?;
                                keyed(sql, lock, key).query().fetch_all(&mut *tx).await?;
                                let picked =
                                    claim(&sql.ordered.claim).fetch_optional(&mut *tx).await?;
                                let row = if picked.is_some() {
                                    claim(update).execute(&mut *tx).await?;
                                    keyed(sql, read, key)
                                        .query()
                                        .fetch_optional(&mut *tx)
                                        .await?
                                } else {
                                    None
                                };
                                tx.commit().await?;
                                row
                            }
                            // The lock's statement and the claim's are two, so the claim reads
                            // what the key's previous holder committed before it let go.
                            Some(lock) => {
                                let mut tx = pool.begin().await?;
                                keyed(sql, lock, key).query().fetch_all(&mut *tx).await?;
                                let row =
                                    claim(&sql.ordered.claim).fetch_optional(&mut *tx).await?;
                                tx.commit().await?;
                                row
                            }
                            None => {
                                let mut conn = pool.acquire().await?;
                                claim(&sql.ordered.claim).fetch_optional(&mut *conn).await?
                            }
                        };
                        row.map(|row| returned_row(&row)).transpose()
                    })
                }

                fn due_in_order<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    now: i64,
                    limit: i64,
                    max_attempts: i32,
                ) -> BoxFuture<'a, sqlx::Result<Vec<EventKey>>> {
                    Box::pin(async move {
                        sql.sent();
                        let rows: Vec<(String, String)> = sql
                            .ordered
                            .due
                            .binder::<$db>()
                            .bind(now)
                            .bind(limit)
                            .bind(max_attempts)
                            .query()
                            .try_map(|row| sqlx::FromRow::from_row(&row))
                            .fetch_all(pool)
                            .await?;
                        Ok(rows
                            .into_iter()
                            .map(|(provider, event_id)| EventKey { provider, event_id })
                            .collect())
                    })
                }

                fn newer_processed<'a>(
                    conn: &'a mut Self::Connection,
                    sql: &'a Sql,
                    key: &'a EventKey,
                ) -> BoxFuture<'a, sqlx::Result<Option<String>>> {
                    Box::pin(async move {
                        if let Some(lock) = &sql.ordered.lock {
                            keyed(sql, lock, key).query().fetch_all(&mut *conn).await?;
                        }
                        keyed(sql, &sql.ordered.newer, key)
                            .query()
                            .try_map(|row| sqlx::Row::try_get(&row, 0))
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
                        one_row(query.query(), conn).await
                    })
                }

                fn next_in_order<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    key: &'a EventKey,
                ) -> BoxFuture<'a, sqlx::Result<Option<String>>> {
                    Box::pin(async move {
                        keyed(sql, &sql.ordered.next, key)
                            .query()
                            .try_map(|row| sqlx::Row::try_get(&row, 0))
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
                            sqlx::query_as(sql.queue.open_groups.text().clone())
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

                fn discard<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    key: &'a EventKey,
                    now: i64,
                ) -> BoxFuture<'a, sqlx::Result<bool>> {
                    Box::pin(async move {
                        let _turn = tower_idempotency_jobs::gate::turn::<$db>(pool).await;
                        let keep = keyed(sql, &sql.discard_keep, key)
                            .bind(now)
                            .bind(Vec::<u8>::new())
                            .bind(DISCARDED);
                        if one_row(keep.query(), pool).await? {
                            return Ok(true);
                        }
                        let delete = keyed(sql, &sql.discard_delete, key).bind(now);
                        one_row(delete.query(), pool).await
                    })
                }

                fn replay<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    key: &'a EventKey,
                    due: i64,
                ) -> BoxFuture<'a, sqlx::Result<bool>> {
                    Box::pin(async move {
                        let _turn = tower_idempotency_jobs::gate::turn::<$db>(pool).await;
                        let mut tx = pool.begin().await?;
                        let replay = keyed(sql, &sql.replay, key).bind(due).bind(DISCARDED);
                        if !one_row(replay.query(), &mut *tx).await? {
                            return Ok(false);
                        }
                        let marker = Attempt::ended(0, now_ms(), AttemptOutcome::Replayed);
                        sql.sent();
                        // Attempt 0 never trims: the rows of the runs before stay.
                        <$db as Driver>::record_attempt(
                            &mut tx,
                            &sql.jobs,
                            &job_key(key),
                            &marker,
                            0,
                        )
                        .await?;
                        tx.commit().await?;
                        Ok(true)
                    })
                }
            }
        };
    };
}

inbox_sql!(
    sqlx::Postgres,
    "postgres",
    Sql::postgres,
    "BEGIN",
    insert_many_postgres
);
// A handler's transaction starts deferred (`BEGIN`): it takes the write lock at its first write,
// and the worker reruns it under `BEGIN IMMEDIATE` when that upgrade meets a conflict.
inbox_sql!(
    sqlx::Sqlite,
    "sqlite",
    Sql::sqlite,
    "BEGIN",
    insert_many_sqlite
);

// A handler's transaction starts with `BEGIN`: InnoDB locks rows, not the database, so a lazy
// start takes nothing before the handler's first statement either.
inbox_sql!(sqlx::MySql, "mysql", Sql::mysql, "BEGIN", insert_many_mysql);

/// MySQL: the rows one by one (`INSERT IGNORE`) in one transaction, so one commit for all of
/// them.
#[cfg(feature = "mysql")]
async fn insert_many_mysql(
    pool: &sqlx::MySqlPool,
    sql: &Sql,
    events: &[&NewEvent],
) -> sqlx::Result<HashSet<EventKey>> {
    // In key order: two instances' batches sharing keys then take the rows' locks in one
    // order, instead of deadlocking (which InnoDB ends by failing one batch's acknowledgements).
    let mut ordered = events.to_vec();
    ordered.sort_by(|a, b| a.key.cmp(&b.key));
    let mut tx = pool.begin().await?;
    let mut inserted = HashSet::new();
    for event in ordered {
        sql.sent();
        let done = sql
            .insert
            .binder::<sqlx::MySql>()
            .bind(event.key.provider.as_str())
            .bind(event.key.event_id.as_str())
            .bind(event.headers.as_str())
            .bind(event.body.as_slice())
            .bind(event.authenticator.as_deref())
            .bind(event.received_at)
            .bind(event.order.as_ref().map(|o| o.key.as_str()))
            .bind(event.order.as_ref().map(|o| o.time))
            .bind(event.authenticator_until)
            .query()
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 1 {
            inserted.insert(event.key.clone());
        }
    }
    tx.commit().await?;
    Ok(inserted)
}

/// Postgres: one statement over arrays, whatever the batch's size (one prepared statement).
#[cfg(feature = "postgres")]
async fn insert_many_postgres(
    pool: &sqlx::PgPool,
    sql: &Sql,
    events: &[&NewEvent],
) -> sqlx::Result<HashSet<EventKey>> {
    let column = |f: &dyn Fn(&NewEvent) -> String| events.iter().map(|e| f(e)).collect::<Vec<_>>();
    sql.sent();
    let rows: Vec<(String, String)> = sqlx::query_as(sql.insert_many.text().clone())
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
    let _turn = tower_idempotency_jobs::gate::turn(pool).await;
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let mut inserted = HashSet::new();
    for event in events {
        sql.sent();
        let done = sqlx::query(sql.insert.text().clone())
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
    <DB as sqlx::Database>::Arguments: Send,
    for<'q> <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB>,
{
    sql.sent();
    sql.queue
        .purge_positions
        .binder::<DB>()
        .bind(before)
        .bind(limit)
        .query()
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
            let purged: i64 = sqlx::query_scalar(sql.queue.purge_batch.text().clone())
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
            let _turn = tower_idempotency_jobs::gate::turn(pool).await;
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
            sql.sent();
            type Deleted = (String, String, i16, Option<String>, Option<i64>);
            let deleted: Vec<Deleted> = sqlx::query_as(sql.queue.purge_batch.text().clone())
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
                sqlx::query(sql.queue.keep_position.text().clone())
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

#[cfg(feature = "mysql")]
impl Purge for sqlx::MySql {
    fn purge_batch<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        before: i64,
        now: i64,
        limit: i64,
    ) -> BoxFuture<'a, sqlx::Result<u64>> {
        Box::pin(async move {
            // One transaction: the batch picked and locked (skipping rows another instance's
            // purge holds), deleted by key, and the positions it carries kept.
            let mut tx = pool.begin().await?;
            sql.sent();
            type Picked = (String, String, i16, Option<String>, Option<i64>);
            let picked: Vec<Picked> = sql
                .queue
                .purge_batch
                .binder::<sqlx::MySql>()
                .bind(before)
                .bind(now)
                .bind(limit)
                .query()
                .try_map(|row| sqlx::FromRow::from_row(&row))
                .fetch_all(&mut *tx)
                .await?;
            if !picked.is_empty() {
                let column = |part: fn(&Picked) -> &str| {
                    let values: Vec<&str> = picked.iter().map(part).collect();
                    serde_json::to_string(&values).expect("strings serialize")
                };
                sql.sent();
                sql.queue
                    .purge_picked
                    .as_ref()
                    .expect("MySQL's purge deletes what it picked")
                    .binder::<sqlx::MySql>()
                    .bind(column(|row| &row.0))
                    .bind(column(|row| &row.1))
                    .query()
                    .execute(&mut *tx)
                    .await?;
            }
            let mut newest: HashMap<(&str, &str), (i64, &str)> = HashMap::new();
            for (provider, event_id, state, key, time) in &picked {
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
                sql.queue
                    .keep_position
                    .binder::<sqlx::MySql>()
                    .bind(provider)
                    .bind(key)
                    .bind(time)
                    .bind(event_id)
                    .bind(now)
                    .query()
                    .execute(&mut *tx)
                    .await?;
            }
            purge_positions(&mut *tx, sql, before, limit).await?;
            tx.commit().await?;
            Ok(u64::try_from(picked.len()).unwrap_or(u64::MAX))
        })
    }
}

/// The engine's key of an event.
pub(crate) fn job_key(key: &EventKey) -> JobKey {
    JobKey(vec![key.provider.clone(), key.event_id.clone()])
}

/// The event of an engine key.
pub(crate) fn event_key(key: JobKey) -> EventKey {
    let mut parts = key.0.into_iter();
    EventKey {
        provider: parts.next().unwrap_or_default(),
        event_id: parts.next().unwrap_or_default(),
    }
}

/// A listed event, with its body (for its type).
pub(crate) fn event_summary<L: Into<Listed>>(job: JobSummary<L>) -> (EventSummary, Vec<u8>) {
    let job = job.map(Into::into);
    let key = event_key(job.key);
    let summary = EventSummary {
        provider: key.provider,
        event_id: key.event_id,
        state: crate::EventState::from_job(job.state),
        attempts: job.attempts,
        received_at_ms: job.created_at_ms,
        available_at_ms: job.available_at_ms,
        finished_at_ms: job.finished_at_ms,
        last_error: job.last_error,
    };
    (summary, job.extra.body)
}

/// Claims, in one statement, those of `keys` (distinct) that are due with attempts below
/// `max_attempts`, all under `token` until `lease_until` (Postgres skips a row another
/// instance's claim is locking).
pub(crate) async fn claim_many<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
    keys: &[EventKey],
    (now, token, lease_until, max_attempts): (i64, i64, i64, i32),
) -> sqlx::Result<Vec<(EventKey, ClaimedRow)>> {
    let keys: Vec<JobKey> = keys.iter().map(job_key).collect();
    sql.sent();
    let claimed: Vec<Claimed<DB::Stored>> = DB::claim_keys(
        pool,
        &sql.jobs,
        &keys,
        now,
        token,
        lease_until,
        max_attempts,
    )
    .await?;
    Ok(claimed
        .into_iter()
        .map(|job| {
            let row = claimed_row(job.payload.into(), job.attempt);
            (event_key(job.key), row)
        })
        .collect())
}

/// Extends the claim of `token` to `lease_until`; `false` when it is no longer held.
pub(crate) async fn renew<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
    key: &EventKey,
    token: i64,
    lease_until: i64,
) -> sqlx::Result<bool> {
    sql.sent();
    DB::renew_one(pool, &sql.jobs, &job_key(key), token, lease_until).await
}

/// Gives back the claim of `token` on `key` before its attempt started: its attempt returned,
/// its lease freed; `false` when the claim is no longer held.
pub(crate) async fn give_back<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
    key: &EventKey,
    token: i64,
) -> sqlx::Result<bool> {
    sql.sent();
    DB::give_back(pool, &sql.jobs, &job_key(key), token).await
}

/// Marks the event processed inside the handler's transaction, fenced by the claim's token.
pub(crate) async fn complete<DB: InboxDatabase>(
    conn: &mut DB::Connection,
    sql: &Sql,
    key: &EventKey,
    now: i64,
    token: i64,
) -> sqlx::Result<bool> {
    sql.sent();
    DB::complete(conn, &sql.jobs, &job_key(key), token, now, None).await
}

/// Marks the event processed inside the handler's transaction, fenced by the claim's token, and
/// records `attempt` in its history (keeping its first and its newest `keep`): one statement on
/// Postgres, two elsewhere ([`Driver::complete_recorded`]).
pub(crate) async fn complete_recorded<DB: InboxDatabase>(
    conn: &mut DB::Connection,
    sql: &Sql,
    key: &EventKey,
    (now, token): (i64, i64),
    attempt: &tower_idempotency_jobs::Attempt,
    keep: u32,
) -> sqlx::Result<bool> {
    sql.sent();
    if !sql.jobs.completes_with_history() {
        sql.sent();
    }
    if attempt.attempt > keep {
        sql.sent();
    }
    let key = job_key(key);
    DB::complete_recorded(conn, &sql.jobs, &key, token, now, None, attempt, keep).await
}

/// Records a failed attempt, fenced by the claim's token: back to pending until `retry_at`,
/// or failed when `attempts >= max_attempts`.
pub(crate) async fn fail<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
    key: &EventKey,
    (now, token, max_attempts, retry_at): (i64, i64, i32, i64),
    error: &str,
) -> sqlx::Result<bool> {
    sql.sent();
    let key = job_key(key);
    DB::fail(
        pool,
        &sql.jobs,
        &key,
        token,
        now,
        max_attempts,
        retry_at,
        error,
        None,
    )
    .await
}

/// Fails the due events whose attempts are spent; answers their providers.
pub(crate) async fn exhaust<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
    now: i64,
    max_attempts: i32,
) -> sqlx::Result<Vec<String>> {
    sql.sent();
    let keys = DB::exhaust(pool, &sql.jobs, now, max_attempts).await?;
    Ok(keys
        .into_iter()
        .map(|key| event_key(key).provider)
        .collect())
}

/// Up to `limit` due events: retries and recovered events first when `retries_first` (a
/// statement that reads every due event), else by due time (read in the due index's order).
pub(crate) async fn due<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
    (now, limit, max_attempts): (i64, i64, i32),
    retries_first: bool,
) -> sqlx::Result<Vec<EventKey>> {
    sql.sent();
    let keys = match retries_first {
        true => DB::due(pool, &sql.jobs, now, limit, max_attempts).await?,
        false => DB::due_by_time(pool, &sql.jobs, now, limit, max_attempts).await?,
    };
    Ok(keys.into_iter().map(event_key).collect())
}

/// Up to `limit` events in `state`, oldest first.
pub(crate) async fn list<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
    state: JobState,
    limit: i64,
) -> sqlx::Result<Vec<EventSummary>> {
    sql.sent();
    let jobs = DB::list::<DB::Listed>(pool, &sql.jobs, state, limit).await?;
    Ok(jobs.into_iter().map(|job| event_summary(job).0).collect())
}

/// Events matching `filter`, newest first, with their bodies.
pub(crate) async fn page<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
    filter: &PageFilter,
    limit: i64,
) -> sqlx::Result<Vec<(EventSummary, Vec<u8>)>> {
    sql.sent();
    let jobs = DB::page::<DB::Listed>(pool, &sql.jobs, filter, limit).await?;
    Ok(jobs.into_iter().map(event_summary).collect())
}

/// One event.
pub(crate) async fn get<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
    key: &EventKey,
) -> sqlx::Result<Option<EventSummary>> {
    sql.sent();
    let job = DB::get::<DB::Listed>(pool, &sql.jobs, &job_key(key)).await?;
    Ok(job.map(|job| event_summary(job).0))
}

/// One event with its stored request: summary, headers (JSON text) and body.
pub(crate) async fn detail<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
    key: &EventKey,
) -> sqlx::Result<Option<(EventSummary, String, Vec<u8>)>> {
    sql.sent();
    let found = DB::detail::<DB::Listed, DB::Stored>(pool, &sql.jobs, &job_key(key)).await?;
    Ok(found.map(|(job, stored)| {
        let stored: Stored = stored.into();
        (event_summary(job).0, stored.headers, stored.body)
    }))
}

/// Puts a failed event back to pending, due at `now`.
pub(crate) async fn retry<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
    key: &EventKey,
    now: i64,
) -> sqlx::Result<bool> {
    sql.sent();
    DB::retry(pool, &sql.jobs, &job_key(key), now).await
}

/// Replays a processed or skipped event, due at `due` ([`sealed::InboxSql::replay`]).
pub(crate) async fn replay<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
    key: &EventKey,
    due: i64,
) -> sqlx::Result<bool> {
    <DB as sealed::InboxSql>::replay(pool, sql, key, due).await
}

/// How many events are in each state.
pub(crate) async fn counts<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
) -> sqlx::Result<StateCounts> {
    sql.sent();
    Ok(DB::counts(pool, &sql.jobs).await?.into())
}

/// `(provider, state, count)` for every provider and state present.
pub(crate) async fn provider_counts<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
) -> sqlx::Result<Vec<(String, JobState, u64)>> {
    sql.sent();
    DB::group_counts(pool, &sql.jobs).await
}

/// The received time of the oldest pending event, unix ms.
pub(crate) async fn oldest_pending<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
) -> sqlx::Result<Option<i64>> {
    sql.sent();
    DB::oldest_pending(pool, &sql.jobs).await
}
