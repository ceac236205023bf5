//! A small pool of the receiver's own on the store's database, for the tables its handlers
//! write (`payments`, `inbox_effects`) and their counts in `GET /effects`. A MySQL or MariaDB
//! store's database has a pool of its own type ([`open_mysql`]): only `payments` runs there,
//! as the inbox and the outbox do not run on MySQL yet.

#[cfg(feature = "sqlite")]
use std::{str::FromStr, time::Duration};

use tower_idempotency::sqlx;

use crate::BoxError;

/// The pool, by database.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[derive(Clone)]
pub enum Pool {
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
}

/// A table's DDL on each database, run once when the pool opens.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub struct Table {
    #[cfg(feature = "sqlite")]
    pub sqlite: &'static str,
    #[cfg(feature = "postgres")]
    pub postgres: &'static str,
}

/// A pool of `max_connections` on the database `options` name, `ddl` run once on it.
async fn connect<DB: sqlx::Database>(
    options: <DB::Connection as sqlx::Connection>::Options,
    max_connections: u32,
    ddl: &'static str,
) -> Result<sqlx::Pool<DB>, BoxError>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let pool = sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(max_connections)
        .connect_with(options)
        .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&pool)
        .await?;
    Ok(pool)
}

/// A pool of `max_connections` on a MySQL or MariaDB store's database (`mysql://`,
/// `mariadb://`), `ddl` run once on it; `None` for another store.
#[cfg(feature = "mysql")]
pub async fn open_mysql(
    url: &str,
    max_connections: u32,
    ddl: &'static str,
) -> Result<Option<sqlx::MySqlPool>, BoxError> {
    match url.split(':').next().unwrap_or_default() {
        "mysql" | "mariadb" => {
            let options = url.parse::<sqlx::mysql::MySqlConnectOptions>()?;
            Ok(Some(connect(options, max_connections, ddl).await?))
        }
        _ => Ok(None),
    }
}

/// The rows of `sql` on a MySQL pool, as [`Pool::counts`] reads them.
#[cfg(feature = "mysql")]
pub async fn mysql_counts(
    pool: &sqlx::MySqlPool,
    sql: &'static str,
) -> Result<Vec<(String, u64)>, BoxError> {
    let rows: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(name, n)| (name, n.max(0) as u64))
        .collect())
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl Pool {
    /// Opens `max_connections` on the store's database (SQLite in WAL mode when `wal`) and
    /// creates `table`; `None` for a store that is not SQL.
    pub async fn open(
        url: &str,
        max_connections: u32,
        wal: bool,
        table: &Table,
    ) -> Result<Option<Self>, BoxError> {
        // Only SQLite has a journal mode to choose.
        let _ = wal;
        match url.split(':').next().unwrap_or_default() {
            #[cfg(feature = "sqlite")]
            "sqlite" => {
                let mut options = sqlx::sqlite::SqliteConnectOptions::from_str(url)?
                    .create_if_missing(true)
                    .busy_timeout(Duration::from_secs(5));
                if wal {
                    options = options.journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
                }
                let pool = connect(options, max_connections, table.sqlite).await?;
                Ok(Some(Self::Sqlite(pool)))
            }
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => {
                let options = url.parse::<sqlx::postgres::PgConnectOptions>()?;
                let pool = connect(options, max_connections, table.postgres).await?;
                Ok(Some(Self::Postgres(pool)))
            }
            _ => Ok(None),
        }
    }

    /// The rows of `sql`, a `SELECT <name>, count(*) ... GROUP BY <name>`, as counts per name.
    pub async fn counts(&self, sql: &'static str) -> Result<Vec<(String, u64)>, BoxError> {
        let rows: Vec<(String, i64)> = match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(pool) => {
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .fetch_all(pool)
                    .await?
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .fetch_all(pool)
                    .await?
            }
        };
        Ok(rows
            .into_iter()
            .map(|(name, n)| (name, n.max(0) as u64))
            .collect())
    }

    /// The rows of `sql`, a `SELECT <a>, <b> ... ORDER BY ...`, as pairs in that order.
    #[cfg(feature = "inbox")]
    pub async fn pairs(&self, sql: &'static str) -> Result<Vec<(String, String)>, BoxError> {
        Ok(match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(pool) => {
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .fetch_all(pool)
                    .await?
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .fetch_all(pool)
                    .await?
            }
        })
    }
}
