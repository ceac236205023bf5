//! The MySQL and MariaDB store, [`MySqlStore`](crate::MySqlStore): its SQL (`statements`) and
//! how it runs the two statements that return a row (the claim and `forget`), which MySQL cannot
//! write as one (no `RETURNING`). Every statement runs on the store's lanes; there are no
//! notices of settled keys (waiters poll) and no coalescing. Why it is built this way:
//! docs/stores.md, "MySQL and MariaDB".

mod statements;

use std::time::Duration;

use sqlx::{
    mysql::{MySqlPoolOptions, MySqlQueryResult, MySqlRow},
    Connection, Executor, MySql, MySqlConnection, MySqlPool, Row,
};

pub use statements::schema_sql;

use self::statements::statements;
use crate::store::{
    backend::{sealed::Sealed, Backend, BoxFuture, Engine, Execute, Pick, Statement, Statements},
    record::{ClaimParams, Params, RawRecord},
};

/// How long a statement of a [`connect`](crate::SqlStore::connect)ed store waits for a row
/// lock (`innodb_lock_wait_timeout`) before it fails, which the layer answers `503`: 10 s.
pub const MYSQL_LOCK_WAIT_TIMEOUT: Duration = Duration::from_secs(10);

/// What [`connect`](crate::SqlStore::connect) runs on each new connection: READ COMMITTED (the
/// level Postgres runs at; the store's own statements are locking reads and writes, correct
/// at any level, and take no gap locks at this one) and [`MYSQL_LOCK_WAIT_TIMEOUT`]. Both
/// statements run on MySQL and MariaDB alike.
fn session_setup() -> [String; 2] {
    [
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".to_owned(),
        format!(
            "SET SESSION innodb_lock_wait_timeout = {}",
            MYSQL_LOCK_WAIT_TIMEOUT.as_secs()
        ),
    ]
}

/// Durations bound in microseconds, as `INTERVAL ? MICROSECOND` takes them (a hundred years,
/// the longest duration the store writes, is 3.2e15 µs).
fn micros(ms: i64) -> i64 {
    ms.saturating_mul(1000)
}

/// A claim's values in the order of its `VALUES` clause: key, fingerprint, token, lease.
fn bind_claim<'q>(query: Statement<'q, MySql>, claim: &ClaimParams<'q>) -> Statement<'q, MySql> {
    query
        .bind(claim.key.as_bytes())
        .bind(claim.fingerprint)
        .bind(claim.token)
        .bind(micros(claim.lease_ms))
}

impl Sealed for MySql {}

impl Backend for MySql {
    const STORE_NAME: &'static str = "mysql";
    const BEGIN: &'static str = "BEGIN";
    const EXCLUSIVE: bool = false;
    const ONE_WRITER: bool = false;
    const MAX_KEY_BYTES: usize = statements::MAX_KEY_BYTES;

    fn schema_sql(table: &str) -> String {
        schema_sql(table)
    }

    fn statements(table: &str) -> Statements {
        statements(table)
    }

    fn bind<'q>(sql: &sqlx::SqlStr, _now: i64, params: Params<'q>) -> Statement<'q, Self> {
        // Rows are dated by the database's clock (`UTC_TIMESTAMP(6)`), so application hosts
        // need no synchronised clocks; the store's clock is not bound. Positional parameters,
        // in the order statements.rs lists them.
        let query = sqlx::query(sql.clone());
        match params {
            // The plain insert; the claim statement binds more (`fetch_row`).
            Params::Claim(claim) => bind_claim(query, &claim),
            Params::Complete(complete) => query
                .bind(complete.status as i16)
                .bind(complete.headers)
                .bind(complete.body)
                .bind(complete.body_omitted)
                .bind(micros(complete.ttl_ms))
                .bind(complete.key.as_bytes())
                .bind(complete.token),
            Params::Renew {
                key,
                token,
                lease_ms,
            } => query
                .bind(micros(lease_ms))
                .bind(key.as_bytes())
                .bind(token),
            Params::Release { key, token } => query.bind(key.as_bytes()).bind(token),
            Params::Get { key } | Params::Forget { key } => query.bind(key.as_bytes()),
            Params::Purge => query,
        }
    }

    /// The claim statement, then its row read back under the row lock the claim took; `forget`'s
    /// row read under a lock, then deleted: each pair in one transaction (a savepoint inside a
    /// caller's transaction), so no other writer comes between.
    fn fetch_row<'e, 'q: 'e>(
        conn: &'e mut MySqlConnection,
        sql: &'e Statements,
        pick: Pick,
        now_ms: i64,
        params: Params<'q>,
    ) -> BoxFuture<'e, Result<Option<MySqlRow>, sqlx::Error>> {
        let key = match &params {
            Params::Claim(claim) if matches!(pick, Pick::Claim) => claim.key,
            Params::Forget { key } if matches!(pick, Pick::Forget) => key,
            _ => return Self::fetch_optional(conn, Self::bind(sql.text(pick), now_ms, params)),
        };
        let lock = sql
            .lock
            .as_ref()
            .expect("MySQL's statements include the locking read");
        Box::pin(async move {
            let read = Self::bind(lock, now_ms, Params::Get { key });
            let mut tx = conn.begin().await?;
            let row = if let Params::Claim(claim) = &params {
                // The upsert's update binds the new claim's values a second time.
                bind_claim(sqlx::query(sql.claim.clone()), claim)
                    .bind(claim.fingerprint)
                    .bind(claim.token)
                    .bind(micros(claim.lease_ms))
                    .execute(&mut *tx)
                    .await?;
                read.fetch_optional(&mut *tx).await?
            } else {
                let row = read.fetch_optional(&mut *tx).await?;
                Self::bind(sql.text(pick), now_ms, params)
                    .execute(&mut *tx)
                    .await?;
                row
            };
            tx.commit().await?;
            Ok(row)
        })
    }

    /// By position (`returned` in statements.rs leads every row that is decoded).
    fn decode(row: &MySqlRow, _now: i64) -> Result<RawRecord, sqlx::Error> {
        Ok(RawRecord {
            token: row.try_get(0)?,
            fingerprint: row.try_get(1)?,
            state: row.try_get(2)?,
            remaining_ms: row.try_get(3)?,
            status: row.try_get(4)?,
            headers: row.try_get(5)?,
            body: row.try_get(6)?,
            body_omitted: row.try_get(7)?,
        })
    }

    fn rows_affected(done: &MySqlQueryResult) -> u64 {
        done.rows_affected()
    }

    /// 10 connections, 5 s acquire timeout, each connection set up by `session_setup` and
    /// tested before it is lent only when it sat idle ([`crate::ping_when_idle`]).
    async fn connect_pool(url: &str) -> Result<MySqlPool, sqlx::Error> {
        let options = MySqlPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(5));
        crate::ping_when_idle(options, crate::PING_AFTER_IDLE)
            .after_connect(|conn, _meta| {
                Box::pin(async move {
                    for statement in session_setup() {
                        conn.execute(sqlx::AssertSqlSafe(statement)).await?;
                    }
                    Ok(())
                })
            })
            .connect(url)
            .await
    }

    /// Nothing besides the lanes: rows are dated by the database, waiters poll.
    type Engine = MySqlEngine;

    fn engine(_pool: &MySqlPool, _table: &str) -> MySqlEngine {
        MySqlEngine
    }
}

/// What a MySQL store keeps besides its lanes: nothing. Public only to be MySQL's
/// [`Backend::Engine`](crate::Backend::Engine); this module is private.
#[derive(Debug)]
pub struct MySqlEngine;

impl Engine<MySql> for MySqlEngine {}
