//! The outbox's own statements: its table (the job engine's columns beside a message's), the
//! insert and the read-back of an enqueued message. Every other statement is the job engine's
//! ([`Driver`]), over the [`table`] shape.

use futures_util::future::BoxFuture;
use sqlx::SqlStr;
use tower_idempotency_jobs::{Driver, Table};
use tower_idempotency_sqlx::table_sql;

/// A message as [`Outbox::enqueue`](crate::Outbox::enqueue) inserts it.
#[derive(Debug)]
pub struct NewRow {
    pub(crate) key: String,
    pub(crate) scope: Option<String>,
    pub(crate) method: Option<String>,
    pub(crate) url: Option<String>,
    pub(crate) topic: Option<String>,
    pub(crate) headers: String,
    pub(crate) body: Vec<u8>,
    pub(crate) created_at: i64,
}

/// A stored message's payload: method, URL, topic, headers (JSON text) and body.
#[derive(Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Payload {
    pub(crate) method: Option<String>,
    pub(crate) url: Option<String>,
    pub(crate) topic: Option<String>,
    pub(crate) headers: String,
    pub(crate) body: Vec<u8>,
}

/// A listed message's columns beside the engine's.
#[derive(Debug, sqlx::FromRow)]
pub struct Listed {
    pub(crate) scope: Option<String>,
    pub(crate) method: Option<String>,
    pub(crate) url: Option<String>,
    pub(crate) topic: Option<String>,
}

impl NewRow {
    /// Whether `stored` is this row's message: the same method, URL or topic, headers and body.
    pub(crate) fn same_as(&self, stored: &Payload) -> bool {
        (
            &stored.method,
            &stored.url,
            &stored.topic,
            &stored.headers,
            &stored.body,
        ) == (
            &self.method,
            &self.url,
            &self.topic,
            &self.headers,
            &self.body,
        )
    }
}

/// The outbox table's shape for the job engine.
pub(crate) fn table(name: &str) -> Table {
    Table::new(name, &["key"], "created_at")
        .payload(&["method", "url", "topic", "headers", "body"])
        .summary(&["scope", "method", "url", "topic"])
        .status("last_status")
}

/// The outbox's own statements of one table.
#[derive(Debug)]
pub struct Sql {
    pub(crate) schema: String,
    insert: SqlStr,
    existing: SqlStr,
}

impl Sql {
    pub(crate) fn new<DB: OutboxDatabase>(name: &str) -> Self {
        Self {
            schema: DB::schema(name),
            insert: table_sql(format!(
                "INSERT INTO {name} (key, scope, method, url, topic, headers, body, \
                 created_at, available_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8) \
                 ON CONFLICT (key) DO NOTHING"
            )),
            existing: table_sql(format!(
                "SELECT method, url, topic, headers, body FROM {name} WHERE key = $1"
            )),
        }
    }
}

/// A database the outbox runs on: [`sqlx::Postgres`] (feature `postgres`) or [`sqlx::Sqlite`]
/// (feature `sqlite`), through its job engine [`Driver`]. Sealed: its statements are the
/// outbox's own.
pub trait OutboxDatabase: Driver + sealed::OutboxSql {}

impl<DB: Driver + sealed::OutboxSql> OutboxDatabase for DB {}

pub(crate) mod sealed {
    use super::{BoxFuture, Listed, NewRow, Payload, Sql};

    /// The outbox's own statements on one database, and its rows as this database decodes
    /// them (associated types, so that generic code knows they decode).
    pub trait OutboxSql: sqlx::Database {
        /// [`Payload`], decodable from this database's rows.
        type Payload: for<'r> sqlx::FromRow<'r, Self::Row> + Into<Payload> + Send + Unpin + 'static;

        /// [`Listed`], decodable from this database's rows.
        type Listed: for<'r> sqlx::FromRow<'r, Self::Row> + Into<Listed> + Send + Unpin + 'static;

        /// The outbox table's DDL.
        fn schema(table: &str) -> String;

        /// Inserts the message on the caller's connection; `false` when its key was taken.
        fn insert<'a>(
            conn: &'a mut Self::Connection,
            sql: &'a Sql,
            row: &'a NewRow,
        ) -> BoxFuture<'a, sqlx::Result<bool>>;

        /// The payload stored under `key`, read on the caller's connection (its transaction
        /// sees its own inserts and, on Postgres, the row a conflicting insert waited for).
        fn existing<'a>(
            conn: &'a mut Self::Connection,
            sql: &'a Sql,
            key: &'a str,
        ) -> BoxFuture<'a, sqlx::Result<Option<Payload>>>;
    }
}

/// The outbox's columns in a database's types, around the engine's.
fn schema<DB: Driver>(table: &str, lock: &str, types: [&str; 4], suffix: &str) -> String {
    let [key, text, bytes, big] = types;
    format!(
        "{lock}CREATE TABLE IF NOT EXISTS {table} (\n\
         key {key} PRIMARY KEY,\n\
         scope {key},\n\
         method {text},\n\
         url {text},\n\
         topic {text},\n\
         headers {text} NOT NULL,\n\
         body {bytes} NOT NULL,\n\
         created_at {big} NOT NULL,\n\
         last_status integer,\n\
         {columns}){suffix};\n{index}\n{history}",
        columns = DB::JOB_COLUMNS,
        index = DB::due_index(table),
        history = DB::history_schema(&self::table(table)),
    )
}

macro_rules! outbox_database {
    ($db:ty, $feature:literal, $schema:expr) => {
        #[cfg(feature = $feature)]
        impl sealed::OutboxSql for $db {
            type Payload = Payload;
            type Listed = Listed;

            fn schema(table: &str) -> String {
                $schema(table)
            }

            fn insert<'a>(
                conn: &'a mut Self::Connection,
                sql: &'a Sql,
                row: &'a NewRow,
            ) -> BoxFuture<'a, sqlx::Result<bool>> {
                Box::pin(async move {
                    let done = sqlx::query(sql.insert.clone())
                        .bind(&row.key)
                        .bind(&row.scope)
                        .bind(&row.method)
                        .bind(&row.url)
                        .bind(&row.topic)
                        .bind(&row.headers)
                        .bind(&row.body)
                        .bind(row.created_at)
                        .execute(conn)
                        .await?;
                    Ok(done.rows_affected() == 1)
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
        }
    };
}

// One migration at a time per table: `CREATE .. IF NOT EXISTS` races on Postgres.
outbox_database!(sqlx::Postgres, "postgres", |table: &str| schema::<
    sqlx::Postgres,
>(
    table,
    &format!("SELECT pg_advisory_xact_lock(hashtext('tower-idempotency-outbox:{table}'));\n"),
    ["text COLLATE \"C\"", "text", "bytea", "bigint"],
    "",
));
outbox_database!(
    sqlx::Sqlite,
    "sqlite",
    |table: &str| schema::<sqlx::Sqlite>(
        table,
        "",
        ["TEXT", "TEXT", "BLOB", "INTEGER"],
        " WITHOUT ROWID",
    )
);
