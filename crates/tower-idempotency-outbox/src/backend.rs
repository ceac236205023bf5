//! The outbox's own statements: its table (the job engine's columns beside a message's), the
//! insert and the read-back of an enqueued message. Every other statement is the job engine's
//! ([`Driver`]), over the [`table`] shape.

use futures_util::future::BoxFuture;
use tower_idempotency_jobs::{Driver, Placeholders, Prepared, Table};

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

impl AsRef<Payload> for Payload {
    fn as_ref(&self) -> &Payload {
        self
    }
}

impl Payload {
    /// The scope a pause of this message names ([`Outbox::pause`](crate::Outbox::pause)): an
    /// HTTP message's target host, `broker:nats` or `broker:rabbitmq` for a broker target,
    /// `topic:{topic}` for a dispatched one.
    pub(crate) fn pause_scope(&self) -> Option<String> {
        match (&self.method, &self.url, &self.topic) {
            (Some(_), Some(url), _) => reqwest::Url::parse(url)
                .ok()
                .and_then(|url| url.host_str().map(str::to_ascii_lowercase)),
            (_, _, Some(topic)) => Some(format!("topic:{topic}")),
            (None, Some(target), None) => {
                let broker = if target.starts_with("nats:") {
                    "nats"
                } else {
                    "rabbitmq"
                };
                Some(format!("broker:{broker}"))
            }
            _ => None,
        }
    }
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
    insert: Prepared,
    existing: Prepared,
}

impl Sql {
    pub(crate) fn new<DB: OutboxDatabase>(name: &str) -> Self {
        let q = DB::QUOTE;
        let sql = |text: String| Prepared::new(text, DB::PLACEHOLDERS);
        Self {
            schema: DB::schema(name),
            insert: sql(format!(
                "INSERT INTO {name} ({q}key{q}, scope, method, url, topic, headers, body, \
                 created_at, available_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8){}",
                DB::ON_CONFLICT,
            )),
            existing: sql(format!(
                "SELECT method, url, topic, headers, body FROM {name} WHERE {q}key{q} = $1{}",
                DB::READ_LOCK,
            )),
        }
    }
}

/// A database the outbox runs on: [`sqlx::Postgres`] (feature `postgres`), [`sqlx::Sqlite`]
/// (feature `sqlite`) or `sqlx::MySql` (feature `mysql`: MySQL 8.0+, MariaDB 10.6+), through
/// its job engine [`Driver`]. Sealed: its statements are the
/// outbox's own.
pub trait OutboxDatabase: Driver + sealed::OutboxSql {}

impl<DB: Driver + sealed::OutboxSql> OutboxDatabase for DB {}

pub(crate) mod sealed {
    use super::{BoxFuture, Listed, NewRow, Payload, Placeholders, Sql};

    /// The outbox's own statements on one database, and its rows as this database decodes
    /// them (associated types, so that generic code knows they decode).
    pub trait OutboxSql: sqlx::Database {
        /// [`Payload`], decodable from this database's rows.
        type Payload: for<'r> sqlx::FromRow<'r, Self::Row>
            + Into<Payload>
            + AsRef<Payload>
            + Send
            + Unpin
            + 'static;

        /// [`Listed`], decodable from this database's rows.
        type Listed: for<'r> sqlx::FromRow<'r, Self::Row> + Into<Listed> + Send + Unpin + 'static;

        /// How the outbox's statements write parameters (the engine's form on this database).
        const PLACEHOLDERS: Placeholders;

        /// The quote of the `key` column's name (a reserved word on MySQL).
        const QUOTE: &'static str;

        /// After the insert's `VALUES`: what a taken key does (nothing, where the database can
        /// say so; MySQL's duplicate-key error is answered `false` instead).
        const ON_CONFLICT: &'static str;

        /// After the read-back's `WHERE`: MySQL's locking read, which sees the row a
        /// conflicting insert waited for whatever the transaction read before.
        const READ_LOCK: &'static str;

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

/// The outbox's columns in a database's types, around the engine's; `q` quotes `key`.
fn schema<DB: Driver>(table: &str, lock: &str, types: [&str; 4], suffix: &str, q: &str) -> String {
    let [key, text, bytes, big] = types;
    // The finished messages by state and time (the activity's and the purge's reads): declared
    // in the table on a database whose due index is declared there (MySQL has no `CREATE
    // INDEX IF NOT EXISTS`).
    let index = DB::due_index(table);
    let finished = "(state, finished_at)";
    let (inline, finished) = if index.is_empty() {
        (
            format!(",\n INDEX {table}_finished_idx {finished}"),
            String::new(),
        )
    } else {
        let create =
            format!("CREATE INDEX IF NOT EXISTS {table}_finished_idx ON {table} {finished};\n");
        (String::new(), create)
    };
    format!(
        "{lock}CREATE TABLE IF NOT EXISTS {table} (\n\
         {q}key{q} {key} PRIMARY KEY,\n\
         scope {key},\n\
         method {text},\n\
         url {text},\n\
         topic {text},\n\
         headers {text} NOT NULL,\n\
         body {bytes} NOT NULL,\n\
         created_at {big} NOT NULL,\n\
         last_status integer,\n\
         {columns}{inline}){suffix};\n{index}{finished}\n{history}{audit}{pauses}",
        columns = DB::JOB_COLUMNS,
        history = DB::history_schema(&self::table(table)),
        audit = DB::audit_schema(&self::table(table)),
        pauses = DB::pauses_schema(&self::table(table)),
    )
}

macro_rules! outbox_database {
    ($db:ty, $feature:literal, $placeholders:expr, $quote:literal, $conflict:literal, $read_lock:literal, $schema:expr) => {
        #[cfg(feature = $feature)]
        impl sealed::OutboxSql for $db {
            type Payload = Payload;
            type Listed = Listed;

            const PLACEHOLDERS: Placeholders = $placeholders;
            const QUOTE: &'static str = $quote;
            const ON_CONFLICT: &'static str = $conflict;
            const READ_LOCK: &'static str = $read_lock;

            fn schema(table: &str) -> String {
                $schema(table)
            }

            fn insert<'a>(
                conn: &'a mut Self::Connection,
                sql: &'a Sql,
                row: &'a NewRow,
            ) -> BoxFuture<'a, sqlx::Result<bool>> {
                Box::pin(async move {
                    let done = sql
                        .insert
                        .binder::<$db>()
                        .bind(row.key.as_str())
                        .bind(row.scope.as_deref())
                        .bind(row.method.as_deref())
                        .bind(row.url.as_deref())
                        .bind(row.topic.as_deref())
                        .bind(row.headers.as_str())
                        .bind(row.body.as_slice())
                        .bind(row.created_at)
                        .query()
                        .execute(conn)
                        .await;
                    match done {
                        Ok(done) => Ok(done.rows_affected() == 1),
                        // MySQL: the key is taken (the statement alone is undone).
                        Err(sqlx::Error::Database(error)) if error.is_unique_violation() => {
                            Ok(false)
                        }
                        Err(error) => Err(error),
                    }
                })
            }

            fn existing<'a>(
                conn: &'a mut Self::Connection,
                sql: &'a Sql,
                key: &'a str,
            ) -> BoxFuture<'a, sqlx::Result<Option<Payload>>> {
                Box::pin(async move {
                    let row = sql
                        .existing
                        .binder::<$db>()
                        .bind(key)
                        .query()
                        .fetch_optional(conn)
                        .await?;
                    row.map(|row| <Payload as sqlx::FromRow<_>>::from_row(&row))
                        .transpose()
                })
            }
        }
    };
}

// One migration at a time per table: `CREATE .. IF NOT EXISTS` races on Postgres.
outbox_database!(
    sqlx::Postgres,
    "postgres",
    Placeholders::Numbered,
    "",
    " ON CONFLICT (key) DO NOTHING",
    "",
    |table: &str| schema::<sqlx::Postgres>(
        table,
        &format!("SELECT pg_advisory_xact_lock(hashtext('tower-idempotency-outbox:{table}'));\n"),
        ["text COLLATE \"C\"", "text", "bytea", "bigint"],
        "",
        "",
    )
);
outbox_database!(
    sqlx::Sqlite,
    "sqlite",
    Placeholders::Numbered,
    "",
    " ON CONFLICT (key) DO NOTHING",
    "",
    |table: &str| schema::<sqlx::Sqlite>(
        table,
        "",
        ["TEXT", "TEXT", "BLOB", "INTEGER"],
        " WITHOUT ROWID",
        "",
    )
);
// MySQL and MariaDB: keys compared byte by byte (as Postgres's "C" collation does); one
// statement, as MySQL has no `CREATE INDEX IF NOT EXISTS` (the engine's columns declare the due
// index), and `CREATE TABLE IF NOT EXISTS` is safe to race there.
outbox_database!(
    sqlx::MySql,
    "mysql",
    Placeholders::Positional,
    "`",
    "",
    " LOCK IN SHARE MODE",
    |table: &str| schema::<sqlx::MySql>(
        table,
        "",
        [
            "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
            "MEDIUMTEXT",
            "LONGBLOB",
            "BIGINT",
        ],
        " ENGINE = InnoDB",
        "`",
    )
);
