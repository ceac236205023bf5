//! A small pool of the receiver's own on the store's database, for the tables its handlers
//! write (`payments`, `inbox_effects`) and their counts in `GET /effects`.

#[cfg(feature = "sqlite")]
use std::{str::FromStr, time::Duration};

use tower_idempotency::sqlx;

use crate::BoxError;

/// The pool, by database.
#[derive(Clone)]
pub enum Pool {
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
}

/// A table's DDL on each database, run once when the pool opens.
pub struct Table {
    #[cfg(feature = "sqlite")]
    pub sqlite: &'static str,
    #[cfg(feature = "postgres")]
    pub postgres: &'static str,
    #[cfg(feature = "mysql")]
    pub mysql: &'static str,
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
    // A connection is tested before it is lent only when it sat idle: sqlx's default tests
    // each one, a round trip more for every acknowledgement, claim and attempt.
    let pool = sqlx::pool::PoolOptions::<DB>::new().max_connections(max_connections);
    let pool = tower_idempotency::ping_when_idle(pool, tower_idempotency::PING_AFTER_IDLE)
        .connect_with(options)
        .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&pool)
        .await?;
    Ok(pool)
}

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
            #[cfg(feature = "mysql")]
            "mysql" | "mariadb" => {
                let options = url.parse::<sqlx::mysql::MySqlConnectOptions>()?;
                let pool = connect(options, max_connections, table.mysql).await?;
                Ok(Some(Self::MySql(pool)))
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
            #[cfg(feature = "mysql")]
            Self::MySql(pool) => {
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
            #[cfg(feature = "mysql")]
            Self::MySql(pool) => {
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .fetch_all(pool)
                    .await?
            }
        })
    }
}
