//! The outbox's statements on each database. Every statement but the DDL and the claim is the
//! same text on both (sqlx binds `$N` on SQLite too); the `backend!` macro writes the typed
//! calls once for each database.
//!
//! Times are unix milliseconds from the application's clock: relays sharing a Postgres outbox
//! must agree on the time to well within the lease.

use std::{future::Future, pin::Pin};

use sqlx::SqlStr;
use tower_idempotency_sqlx::table_sql;

use crate::message::{MessageState, MessageSummary, StateCounts};

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A message as [`Outbox::enqueue`](crate::Outbox::enqueue) inserts it.
#[doc(hidden)]
#[derive(Debug)]
pub struct NewRow {
    pub key: String,
    pub scope: Option<String>,
    pub method: Option<String>,
    pub url: Option<String>,
    pub topic: Option<String>,
    pub headers: String,
    pub body: Vec<u8>,
    pub created_at: i64,
}

/// A stored message's payload, as [`OutboxDatabase::existing`] reads it back: method, URL,
/// topic, headers (JSON text) and body.
#[doc(hidden)]
pub type Payload = (
    Option<String>,
    Option<String>,
    Option<String>,
    String,
    Vec<u8>,
);

impl NewRow {
    /// Whether `stored` is this row's message: the same method, URL or topic, headers and body.
    pub(crate) fn same_as(&self, stored: &Payload) -> bool {
        let (method, url, topic, headers, body) = stored;
        (method, url, topic, headers, body)
            == (
                &self.method,
                &self.url,
                &self.topic,
                &self.headers,
                &self.body,
            )
    }
}

/// A claimed message's row.
#[doc(hidden)]
#[derive(Debug)]
pub struct ClaimedRow {
    pub key: String,
    pub method: Option<String>,
    pub url: Option<String>,
    pub topic: Option<String>,
    pub headers: String,
    pub body: Vec<u8>,
    pub attempts: i32,
}

/// A message with its stored headers (JSON text) and body.
#[doc(hidden)]
pub type DetailRow = (MessageSummary, String, Vec<u8>);

/// The statements of one outbox table.
#[doc(hidden)]
#[derive(Debug)]
pub struct Sql {
    pub(crate) schema: String,
    insert: SqlStr,
    existing: SqlStr,
    claim: SqlStr,
    complete: SqlStr,
    fail: SqlStr,
    exhaust: SqlStr,
    list: SqlStr,
    page: SqlStr,
    get: SqlStr,
    detail: SqlStr,
    retry: SqlStr,
    discard: SqlStr,
    purge: SqlStr,
    counts: SqlStr,
}

const SUMMARY: &str = "key, scope, method, url, topic, state, attempts, created_at, \
                       available_at, finished_at, last_status, last_error";
/// Pending, due, and not leased by a live relay (`$1` is now).
const DUE: &str = "state = 0 AND available_at <= $1 AND (lease_until IS NULL OR lease_until <= $1)";
/// The last error of a message whose attempts were spent without one recording its end.
pub(crate) const SPENT: &str =
    "no attempts remain: the last attempt did not finish (its relay stopped, was killed or lost the lease)";

impl Sql {
    fn new(table: &str, schema: String, claim: String) -> Self {
        Self {
            schema,
            insert: table_sql(format!(
                "INSERT INTO {table} (key, scope, method, url, topic, headers, body, \
                 created_at, available_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8) \
                 ON CONFLICT (key) DO NOTHING"
            )),
            existing: table_sql(format!(
                "SELECT method, url, topic, headers, body FROM {table} WHERE key = $1"
            )),
            claim: table_sql(claim),
            complete: table_sql(format!(
                "UPDATE {table} SET state = 1, finished_at = $3, last_status = $4, \
                 last_error = NULL, lease_token = NULL, lease_until = NULL \
                 WHERE key = $1 AND lease_token = $2"
            )),
            fail: table_sql(format!(
                "UPDATE {table} SET \
                 state = CASE WHEN attempts >= $4 THEN 2 ELSE 0 END, \
                 finished_at = CASE WHEN attempts >= $4 THEN $3 ELSE NULL END, \
                 available_at = $5, last_status = $6, last_error = $7, \
                 lease_token = NULL, lease_until = NULL \
                 WHERE key = $1 AND lease_token = $2"
            )),
            exhaust: table_sql(format!(
                "UPDATE {table} SET state = 2, finished_at = $1, last_error = $3, \
                 lease_token = NULL, lease_until = NULL WHERE {DUE} AND attempts >= $2"
            )),
            list: table_sql(format!(
                "SELECT {SUMMARY} FROM {table} WHERE state = $1 \
                 ORDER BY created_at, key LIMIT $2"
            )),
            page: table_sql(format!(
                "SELECT {SUMMARY} FROM {table} WHERE ($1 < 0 OR state = $1) \
                 AND (created_at < $2 OR (created_at = $2 AND key < $3)) \
                 ORDER BY created_at DESC, key DESC LIMIT $4"
            )),
            get: table_sql(format!("SELECT {SUMMARY} FROM {table} WHERE key = $1")),
            detail: table_sql(format!(
                "SELECT {SUMMARY}, headers, body FROM {table} WHERE key = $1"
            )),
            retry: table_sql(format!(
                "UPDATE {table} SET state = 0, attempts = 0, available_at = $2, \
                 finished_at = NULL, last_error = NULL, lease_token = NULL, lease_until = NULL \
                 WHERE key = $1 AND state = 2"
            )),
            discard: table_sql(format!(
                "UPDATE {table} SET state = 3, finished_at = $2, \
                 lease_token = NULL, lease_until = NULL WHERE key = $1 AND (state = 2 OR \
                 (state = 0 AND (lease_until IS NULL OR lease_until <= $2)))"
            )),
            purge: table_sql(format!(
                "DELETE FROM {table} WHERE state IN (1, 3) AND finished_at < $1"
            )),
            counts: table_sql(format!(
                "SELECT state, count(*) FROM {table} GROUP BY state"
            )),
        }
    }

    /// The Postgres statements. The claim skips rows another relay's claim is locking instead
    /// of waiting for them, so several relays take disjoint batches.
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(table: &str) -> Self {
        let schema = format!(
            "SELECT pg_advisory_xact_lock(hashtext('tower-idempotency-outbox:{table}'));\n\
             CREATE TABLE IF NOT EXISTS {table} (\n\
             key text COLLATE \"C\" PRIMARY KEY,\n\
             scope text COLLATE \"C\",\n\
             method text,\n\
             url text,\n\
             topic text,\n\
             headers text NOT NULL,\n\
             body bytea NOT NULL,\n\
             created_at bigint NOT NULL,\n\
             state smallint NOT NULL DEFAULT 0,\n\
             attempts integer NOT NULL DEFAULT 0,\n\
             available_at bigint NOT NULL,\n\
             lease_token bigint,\n\
             lease_until bigint,\n\
             finished_at bigint,\n\
             last_status integer,\n\
             last_error text);\n\
             CREATE INDEX IF NOT EXISTS {table}_due_idx ON {table} (state, available_at);\n"
        );
        let claim = format!(
            "UPDATE {table} SET attempts = attempts + 1, lease_token = $2, lease_until = $3 \
             WHERE key IN (SELECT key FROM {table} WHERE {DUE} AND attempts < $4 \
             ORDER BY available_at LIMIT $5 FOR UPDATE SKIP LOCKED) \
             RETURNING key, method, url, topic, headers, body, attempts"
        );
        Self::new(table, schema, claim)
    }

    /// The SQLite statements. The database has one writer at a time, so the claim needs no
    /// lock clause.
    #[cfg(feature = "sqlite")]
    pub(crate) fn sqlite(table: &str) -> Self {
        let schema = format!(
            "CREATE TABLE IF NOT EXISTS {table} (\n\
             key TEXT PRIMARY KEY,\n\
             scope TEXT,\n\
             method TEXT,\n\
             url TEXT,\n\
             topic TEXT,\n\
             headers TEXT NOT NULL,\n\
             body BLOB NOT NULL,\n\
             created_at INTEGER NOT NULL,\n\
             state INTEGER NOT NULL DEFAULT 0,\n\
             attempts INTEGER NOT NULL DEFAULT 0,\n\
             available_at INTEGER NOT NULL,\n\
             lease_token INTEGER,\n\
             lease_until INTEGER,\n\
             finished_at INTEGER,\n\
             last_status INTEGER,\n\
             last_error TEXT) WITHOUT ROWID;\n\
             CREATE INDEX IF NOT EXISTS {table}_due_idx ON {table} (state, available_at);\n"
        );
        let claim = format!(
            "UPDATE {table} SET attempts = attempts + 1, lease_token = $2, lease_until = $3 \
             WHERE key IN (SELECT key FROM {table} WHERE {DUE} AND attempts < $4 \
             ORDER BY available_at LIMIT $5) \
             RETURNING key, method, url, topic, headers, body, attempts"
        );
        Self::new(table, schema, claim)
    }
}

/// A database the outbox runs on: [`sqlx::Postgres`] (feature `postgres`) or [`sqlx::Sqlite`]
/// (feature `sqlite`). Sealed; its methods are the outbox's statements and not a public API.
pub trait OutboxDatabase: sqlx::Database + sealed::Sealed {
    #[doc(hidden)]
    fn statements(table: &str) -> Sql;

    #[doc(hidden)]
    fn migrate<'a>(pool: &'a sqlx::Pool<Self>, sql: &'a Sql) -> BoxFuture<'a, sqlx::Result<()>>;

    /// Inserts the message on the caller's connection; `false` when its key was taken.
    #[doc(hidden)]
    fn insert<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a Sql,
        row: &'a NewRow,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// The payload stored under `key`, read on the caller's connection (its transaction sees
    /// its own inserts and, on Postgres, the row a conflicting insert waited for).
    #[doc(hidden)]
    fn existing<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a Sql,
        key: &'a str,
    ) -> BoxFuture<'a, sqlx::Result<Option<Payload>>>;

    /// Claims up to `limit` due messages under `token` until `lease_until`.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn claim<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        now: i64,
        token: i64,
        lease_until: i64,
        max_attempts: i32,
        limit: i64,
    ) -> BoxFuture<'a, sqlx::Result<Vec<ClaimedRow>>>;

    /// Marks a claimed message delivered, fenced by the claim's token.
    #[doc(hidden)]
    fn complete<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        key: &'a str,
        token: i64,
        now: i64,
        status: Option<i32>,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// Records a failed attempt, fenced by the claim's token: pending until `retry_at`, or
    /// failed when `attempts >= max_attempts`.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn fail<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        key: &'a str,
        token: i64,
        now: i64,
        max_attempts: i32,
        retry_at: i64,
        status: Option<i32>,
        error: &'a str,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// Fails the due messages whose attempts are spent; answers how many.
    #[doc(hidden)]
    fn exhaust<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        now: i64,
        max_attempts: i32,
    ) -> BoxFuture<'a, sqlx::Result<u64>>;

    #[doc(hidden)]
    fn list<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        state: i16,
        limit: i64,
    ) -> BoxFuture<'a, sqlx::Result<Vec<MessageSummary>>>;

    /// Up to `limit` messages in `state` (any when negative) enqueued before the position
    /// `before` (`created_at`, key), newest first.
    #[doc(hidden)]
    fn page<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        state: i16,
        before: (i64, &'a str),
        limit: i64,
    ) -> BoxFuture<'a, sqlx::Result<Vec<MessageSummary>>>;

    /// One message with its stored headers (JSON text) and body.
    #[doc(hidden)]
    fn detail<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        key: &'a str,
    ) -> BoxFuture<'a, sqlx::Result<Option<DetailRow>>>;

    #[doc(hidden)]
    fn get<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        key: &'a str,
    ) -> BoxFuture<'a, sqlx::Result<Option<MessageSummary>>>;

    #[doc(hidden)]
    fn retry<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        key: &'a str,
        now: i64,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    #[doc(hidden)]
    fn discard<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        key: &'a str,
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
}

mod sealed {
    pub trait Sealed {}
}

fn summary<R: sqlx::Row>(row: &R) -> sqlx::Result<MessageSummary>
where
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i16: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(MessageSummary {
        key: row.try_get(0)?,
        scope: row.try_get(1)?,
        method: row.try_get(2)?,
        url: row.try_get(3)?,
        topic: row.try_get(4)?,
        state: MessageState::from_code(row.try_get(5)?),
        attempts: u32::try_from(row.try_get::<i32, _>(6)?).unwrap_or(0),
        created_at_ms: row.try_get(7)?,
        available_at_ms: row.try_get(8)?,
        finished_at_ms: row.try_get(9)?,
        last_status: row
            .try_get::<Option<i32>, _>(10)?
            .and_then(|s| u16::try_from(s).ok()),
        last_error: row.try_get(11)?,
    })
}

/// The typed calls, the same for each database.
macro_rules! backend {
    ($db:ty, $feature:literal, $statements:path) => {
        #[cfg(feature = $feature)]
        const _: () = {
            async fn one_row<'e, E>(
                query: sqlx::query::Query<'e, $db, <$db as sqlx::Database>::Arguments>,
                executor: E,
            ) -> sqlx::Result<bool>
            where
                E: sqlx::Executor<'e, Database = $db> + 'e,
            {
                Ok(query.execute(executor).await?.rows_affected() == 1)
            }

            impl sealed::Sealed for $db {}

            impl OutboxDatabase for $db {
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
                    conn: &'a mut Self::Connection,
                    sql: &'a Sql,
                    row: &'a NewRow,
                ) -> BoxFuture<'a, sqlx::Result<bool>> {
                    Box::pin(async move {
                        let query = sqlx::query(sql.insert.clone())
                            .bind(&row.key)
                            .bind(&row.scope)
                            .bind(&row.method)
                            .bind(&row.url)
                            .bind(&row.topic)
                            .bind(&row.headers)
                            .bind(&row.body)
                            .bind(row.created_at);
                        one_row(query, conn).await
                    })
                }

                fn existing<'a>(
                    conn: &'a mut Self::Connection,
                    sql: &'a Sql,
                    key: &'a str,
                ) -> BoxFuture<'a, sqlx::Result<Option<Payload>>> {
                    Box::pin(async move {
                        sqlx::query_as(sql.existing.clone())
                            .bind(key)
                            .fetch_optional(conn)
                            .await
                    })
                }

                fn claim<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    now: i64,
                    token: i64,
                    lease_until: i64,
                    max_attempts: i32,
                    limit: i64,
                ) -> BoxFuture<'a, sqlx::Result<Vec<ClaimedRow>>> {
                    Box::pin(async move {
                        use sqlx::Row;
                        let rows = sqlx::query(sql.claim.clone())
                            .bind(now)
                            .bind(token)
                            .bind(lease_until)
                            .bind(max_attempts)
                            .bind(limit)
                            .fetch_all(pool)
                            .await?;
                        rows.iter()
                            .map(|row| {
                                Ok(ClaimedRow {
                                    key: row.try_get(0)?,
                                    method: row.try_get(1)?,
                                    url: row.try_get(2)?,
                                    topic: row.try_get(3)?,
                                    headers: row.try_get(4)?,
                                    body: row.try_get(5)?,
                                    attempts: row.try_get(6)?,
                                })
                            })
                            .collect()
                    })
                }

                fn complete<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    key: &'a str,
                    token: i64,
                    now: i64,
                    status: Option<i32>,
                ) -> BoxFuture<'a, sqlx::Result<bool>> {
                    Box::pin(async move {
                        let query = sqlx::query(sql.complete.clone())
                            .bind(key)
                            .bind(token)
                            .bind(now)
                            .bind(status);
                        one_row(query, pool).await
                    })
                }

                fn fail<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    key: &'a str,
                    token: i64,
                    now: i64,
                    max_attempts: i32,
                    retry_at: i64,
                    status: Option<i32>,
                    error: &'a str,
                ) -> BoxFuture<'a, sqlx::Result<bool>> {
                    Box::pin(async move {
                        let query = sqlx::query(sql.fail.clone())
                            .bind(key)
                            .bind(token)
                            .bind(now)
                            .bind(max_attempts)
                            .bind(retry_at)
                            .bind(status)
                            .bind(error);
                        one_row(query, pool).await
                    })
                }

                fn exhaust<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    now: i64,
                    max_attempts: i32,
                ) -> BoxFuture<'a, sqlx::Result<u64>> {
                    Box::pin(async move {
                        let done = sqlx::query(sql.exhaust.clone())
                            .bind(now)
                            .bind(max_attempts)
                            .bind(SPENT)
                            .execute(pool)
                            .await?;
                        Ok(done.rows_affected())
                    })
                }

                fn list<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    state: i16,
                    limit: i64,
                ) -> BoxFuture<'a, sqlx::Result<Vec<MessageSummary>>> {
                    Box::pin(async move {
                        let rows = sqlx::query(sql.list.clone())
                            .bind(state)
                            .bind(limit)
                            .fetch_all(pool)
                            .await?;
                        rows.iter().map(summary).collect()
                    })
                }

                fn page<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    state: i16,
                    before: (i64, &'a str),
                    limit: i64,
                ) -> BoxFuture<'a, sqlx::Result<Vec<MessageSummary>>> {
                    Box::pin(async move {
                        let rows = sqlx::query(sql.page.clone())
                            .bind(state)
                            .bind(before.0)
                            .bind(before.1)
                            .bind(limit)
                            .fetch_all(pool)
                            .await?;
                        rows.iter().map(summary).collect()
                    })
                }

                fn detail<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    key: &'a str,
                ) -> BoxFuture<'a, sqlx::Result<Option<DetailRow>>> {
                    Box::pin(async move {
                        use sqlx::Row;
                        let row = sqlx::query(sql.detail.clone())
                            .bind(key)
                            .fetch_optional(pool)
                            .await?;
                        row.map(|row| Ok((summary(&row)?, row.try_get(12)?, row.try_get(13)?)))
                            .transpose()
                    })
                }

                fn get<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    key: &'a str,
                ) -> BoxFuture<'a, sqlx::Result<Option<MessageSummary>>> {
                    Box::pin(async move {
                        let row = sqlx::query(sql.get.clone())
                            .bind(key)
                            .fetch_optional(pool)
                            .await?;
                        row.as_ref().map(summary).transpose()
                    })
                }

                fn retry<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    key: &'a str,
                    now: i64,
                ) -> BoxFuture<'a, sqlx::Result<bool>> {
                    Box::pin(async move {
                        let query = sqlx::query(sql.retry.clone()).bind(key).bind(now);
                        one_row(query, pool).await
                    })
                }

                fn discard<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    key: &'a str,
                    now: i64,
                ) -> BoxFuture<'a, sqlx::Result<bool>> {
                    Box::pin(async move {
                        let query = sqlx::query(sql.discard.clone()).bind(key).bind(now);
                        one_row(query, pool).await
                    })
                }

                fn purge<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                    before: i64,
                ) -> BoxFuture<'a, sqlx::Result<u64>> {
                    Box::pin(async move {
                        let done = sqlx::query(sql.purge.clone())
                            .bind(before)
                            .execute(pool)
                            .await?;
                        Ok(done.rows_affected())
                    })
                }

                fn counts<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    sql: &'a Sql,
                ) -> BoxFuture<'a, sqlx::Result<StateCounts>> {
                    Box::pin(async move {
                        let rows: Vec<(i16, i64)> =
                            sqlx::query_as(sql.counts.clone()).fetch_all(pool).await?;
                        let mut counts = StateCounts::default();
                        for (state, count) in rows {
                            let count = u64::try_from(count).unwrap_or(0);
                            match MessageState::from_code(state) {
                                MessageState::Pending => counts.pending = count,
                                MessageState::Delivered => counts.delivered = count,
                                MessageState::Failed => counts.failed = count,
                                MessageState::Discarded => counts.discarded = count,
                            }
                        }
                        Ok(counts)
                    })
                }
            }
        };
    };
}

backend!(sqlx::Postgres, "postgres", Sql::postgres);
backend!(sqlx::Sqlite, "sqlite", Sql::sqlite);
