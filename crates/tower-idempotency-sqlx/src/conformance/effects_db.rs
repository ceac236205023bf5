//! The effects table's SQL on each database.

use sqlx::{Database, Pool};

use crate::store::backend::BoxFuture;

/// The SQL the suite runs for one database: the effects table's DDL, its insert and its count.
/// Implemented for [`sqlx::Postgres`], [`sqlx::Sqlite`] and `sqlx::MySql` (feature `mysql`; MySQL
/// has no deferred foreign keys, so [`failed_commit_writes_nothing`](super::failed_commit_writes_nothing)
/// cannot make its `COMMIT` fail there).
pub trait EffectsDb: Database {
    /// Creates `table` (`idempotency_key`, `amount`, and a nullable `parent` with a deferred
    /// foreign key to `{table}_parents`, which lets a case make `COMMIT` fail).
    fn create<'a>(pool: &'a Pool<Self>, table: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>>;
    /// Drops `table` and `{table}_parents`.
    fn drop_table<'a>(
        pool: &'a Pool<Self>,
        table: &'a str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;
    /// Inserts one row on the handler's connection.
    fn insert<'a>(
        conn: &'a mut Self::Connection,
        table: &'a str,
        key: &'a str,
        amount: i64,
        parent: Option<i64>,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;
    /// The rows of `table` for `key`.
    fn count<'a>(
        pool: &'a Pool<Self>,
        table: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>>;
}

/// The effects table's SQL in one database's dialect.
struct Dialect {
    /// The integer column type.
    int: &'static str,
    /// The text column type.
    text: &'static str,
    /// The first three bind parameters.
    params: [&'static str; 3],
    /// Whether one `DROP TABLE` may name both tables.
    drops_several: bool,
    /// The identifier quote.
    quote: char,
    /// What follows the foreign key's `REFERENCES`.
    deferred: &'static str,
}

impl Dialect {
    fn create(&self, table: &str) -> String {
        let Self {
            int,
            text,
            quote: q,
            deferred,
            ..
        } = self;
        format!(
            r#"CREATE TABLE {q}{table}_parents{q} (id {int} PRIMARY KEY);
CREATE TABLE {q}{table}{q} (idempotency_key {text} NOT NULL, amount {int} NOT NULL,
    parent {int}, FOREIGN KEY (parent) REFERENCES {q}{table}_parents{q} (id){deferred});"#
        )
    }

    fn drop_table(&self, table: &str) -> String {
        let q = self.quote;
        if self.drops_several {
            format!(r#"DROP TABLE IF EXISTS {q}{table}{q}, {q}{table}_parents{q}"#)
        } else {
            format!(
                r#"DROP TABLE IF EXISTS {q}{table}{q}; DROP TABLE IF EXISTS {q}{table}_parents{q};"#
            )
        }
    }

    fn insert(&self, table: &str) -> String {
        let [key, amount, parent] = self.params;
        let q = self.quote;
        format!(
            r#"INSERT INTO {q}{table}{q} (idempotency_key, amount, parent) VALUES ({key}, {amount}, {parent})"#
        )
    }

    fn count(&self, table: &str) -> String {
        let (key, q) = (self.params[0], self.quote);
        format!(r#"SELECT count(*) FROM {q}{table}{q} WHERE idempotency_key = {key}"#)
    }
}

/// Runs `script`, one or more statements without parameters, on `pool`.
async fn run_script<DB: Database>(pool: &Pool<DB>, script: String) -> Result<(), sqlx::Error>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    sqlx::raw_sql(sqlx::AssertSqlSafe(script))
        .execute(pool)
        .await
        .map(drop)
}

/// The typed calls, the same for each database; the SQL comes from its [`Dialect`].
macro_rules! effects_db {
    ($db:ty, $feature:literal, $dialect:ident) => {
        #[cfg(feature = $feature)]
        impl EffectsDb for $db {
            fn create<'a>(
                pool: &'a Pool<Self>,
                table: &'a str,
            ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
                Box::pin(run_script(pool, $dialect.create(table)))
            }

            fn drop_table<'a>(
                pool: &'a Pool<Self>,
                table: &'a str,
            ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
                Box::pin(run_script(pool, $dialect.drop_table(table)))
            }

            fn insert<'a>(
                conn: &'a mut Self::Connection,
                table: &'a str,
                key: &'a str,
                amount: i64,
                parent: Option<i64>,
            ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
                Box::pin(async move {
                    let sql = $dialect.insert(table);
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .bind(key)
                        .bind(amount)
                        .bind(parent)
                        .execute(conn)
                        .await
                        .map(drop)
                })
            }

            fn count<'a>(
                pool: &'a Pool<Self>,
                table: &'a str,
                key: &'a str,
            ) -> BoxFuture<'a, Result<i64, sqlx::Error>> {
                Box::pin(async move {
                    let sql = $dialect.count(table);
                    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                        .bind(key)
                        .fetch_one(pool)
                        .await
                })
            }
        }
    };
}

#[cfg(feature = "postgres")]
const POSTGRES: Dialect = Dialect {
    int: "bigint",
    text: "text",
    params: ["$1", "$2", "$3"],
    drops_several: true,
    quote: '"',
    deferred: " DEFERRABLE INITIALLY DEFERRED",
};

#[cfg(feature = "sqlite")]
const SQLITE: Dialect = Dialect {
    int: "INTEGER",
    text: "TEXT",
    params: ["?1", "?2", "?3"],
    drops_several: false,
    quote: '"',
    deferred: " DEFERRABLE INITIALLY DEFERRED",
};

#[cfg(feature = "mysql")]
const MYSQL: Dialect = Dialect {
    int: "BIGINT",
    text: "VARCHAR(1024)",
    params: ["?", "?", "?"],
    drops_several: true,
    quote: '`',
    deferred: "",
};

effects_db!(sqlx::Postgres, "postgres", POSTGRES);
effects_db!(sqlx::Sqlite, "sqlite", SQLITE);
effects_db!(sqlx::MySql, "mysql", MYSQL);
