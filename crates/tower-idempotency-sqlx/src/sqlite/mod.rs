//! The SQLite store, [`SqliteStore`](crate::SqliteStore): its SQL (`statements`), its writer
//! thread (`writer`), its inline reads (`reads`) and its clock (`clock`). Why it is built this
//! way: docs/stores.md, "SQLite".

mod clock;
mod reads;
mod statements;
mod writer;

use std::{borrow::Cow, future::Future, str::FromStr, time::Duration};

use sqlx::{
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
    Row, Sqlite, SqlitePool,
};

pub use statements::schema_sql;

use self::{
    clock::StoreClock,
    reads::{Inline, InlineReads},
    statements::{narrow, statements, values, Value},
    writer::SqliteWriter,
};
use crate::store::{
    backend::{sealed::Sealed, Backend, Engine, Statement, Statements, Write, Wrote},
    record::{Params, RawRecord},
};

/// How long a statement waits for another connection's write lock before failing with
/// [`StoreError::Unavailable`](tower_idempotency_core::StoreError::Unavailable).
pub const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

impl Sealed for Sqlite {}

/// What an SQLite store keeps besides its lanes: its clock, and on a plain file its writer
/// thread and its inline reads.
#[derive(Debug)]
pub struct SqliteEngine {
    /// The time rows are dated with.
    pub(crate) clock: StoreClock,
    /// Reads of one row on the calling task (see `reads.rs`); `None` off a plain file.
    inline: Option<InlineReads>,
    /// Writes on a thread of their own (see `writer.rs`); `None` off a plain read-write file.
    writer: Option<SqliteWriter>,
}

impl Engine<Sqlite> for SqliteEngine {
    fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    fn read(&self, key: &str) -> Option<Option<RawRecord>> {
        match self.inline.as_ref()?.get(key, self.clock.now_ms()) {
            Inline::Read(record) => Some(record),
            Inline::Elsewhere => None,
        }
    }

    fn write<'a>(
        &'a self,
        write: Write<'a>,
    ) -> Result<impl Future<Output = Wrote<'a>> + Send + 'a, Write<'a>> {
        match &self.writer {
            Some(writer) => {
                let running = writer.run(self.clock.now_ms(), write);
                Ok(async move { Ok(running.await) })
            }
            None => Err(write),
        }
    }

    fn bound_writes(&mut self, jobs: usize, bytes: usize) {
        if let Some(writer) = &mut self.writer {
            writer.bound(jobs, bytes);
        }
    }
}

impl Backend for Sqlite {
    const STORE_NAME: &'static str = "sqlite";
    // The write lock from the start: a deferred transaction that read first could not
    // upgrade to a write after another connection's commit (`SQLITE_BUSY` at once).
    const BEGIN: &'static str = "BEGIN IMMEDIATE";
    const EXCLUSIVE: bool = true;
    const ONE_WRITER: bool = true;

    fn schema_sql(table: &str) -> String {
        schema_sql(table)
    }

    fn statements(table: &str) -> Statements {
        statements(table)
    }

    fn bind<'q>(sql: &sqlx::SqlStr, now: i64, params: Params<'q>) -> Statement<'q, Self> {
        values(now, params)
            .into_iter()
            .fold(sqlx::query(sql.clone()), |query, value| match value {
                Value::Int(value) => query.bind(value),
                Value::Text(value) => query.bind(value),
                Value::Blob(Cow::Borrowed(value)) => query.bind(value),
                Value::Blob(Cow::Owned(value)) => query.bind(value),
            })
    }

    fn decode(row: &sqlx::sqlite::SqliteRow, now: i64) -> Result<RawRecord, sqlx::Error> {
        let expires_at: i64 = row.try_get("expires_at")?;
        let status: Option<i64> = row.try_get("status")?;
        Ok(RawRecord {
            token: row.try_get("token")?,
            fingerprint: row.try_get("fingerprint")?,
            state: narrow(row.try_get("state")?),
            remaining_ms: expires_at.saturating_sub(now),
            status: status.map(narrow),
            headers: row.try_get("headers")?,
            body: row.try_get("body")?,
            body_omitted: row.try_get("body_omitted")?,
        })
    }

    fn rows_affected(done: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    /// WAL mode with `synchronous = NORMAL` and a [`SQLITE_BUSY_TIMEOUT`] busy timeout, on a
    /// pool of 8 connections, a connection tested before it is lent only when it sat idle
    /// ([`crate::ping_when_idle`]).
    async fn connect_pool(url: &str) -> Result<SqlitePool, sqlx::Error> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(SQLITE_BUSY_TIMEOUT);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(5));
        crate::ping_when_idle(pool, crate::PING_AFTER_IDLE)
            .connect_with(options)
            .await
    }

    type Engine = SqliteEngine;

    fn engine(pool: &SqlitePool, table: &str) -> SqliteEngine {
        SqliteEngine {
            clock: StoreClock::system(),
            inline: InlineReads::for_pool(pool, table),
            writer: SqliteWriter::for_pool(pool, table),
        }
    }
}

/// The parameters of the pool's options as sqlx renders them as a URL (`mode`, `vfs` and
/// `immutable` tell whether the database is a plain file), or `None` for a database named as a
/// SQLite URI (`file:...`): sqlx names every in-memory database so (`file:sqlx-in-memory-N`),
/// and sqlx 0.9's `to_url_lossy` cannot render such a name (it panics), so it is not asked.
fn url_parameters(options: &SqliteConnectOptions) -> Option<Vec<(String, String)>> {
    use sqlx::ConnectOptions;
    let name = options.get_filename().to_str()?;
    if name.starts_with("file:") || name == ":memory:" {
        return None;
    }
    let url = options.to_url_lossy();
    Some(
        url.query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect(),
    )
}
