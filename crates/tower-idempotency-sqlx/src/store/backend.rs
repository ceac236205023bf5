//! What differs between the databases a [`SqlStore`](crate::SqlStore) runs on: the SQL text, the
//! DDL, how parameters are bound and rows decoded, how a pool is opened, and what a store keeps
//! besides its lanes ([`Engine`]). Everything else (lanes, lease rules, fencing, error
//! mapping, statement counting) is written once in [`SqlStore`](crate::SqlStore).

use std::{fmt::Debug, future::Future, pin::Pin};

use sqlx::{query::Query, Database, Executor, IntoArguments, Pool, SqlStr};
use tower_idempotency_core::{Settlements, StoreError};

use super::{
    lanes::StoreLanes,
    record::{Params, RawRecord},
};

/// A statement with its parameters bound, ready to run.
pub type Statement<'q, DB> = Query<'q, DB, <DB as Database>::Arguments>;

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Running statements, for every sqlx database whose connections are executors. A supertrait
/// of [`Backend`] so that the sqlx bounds are written here once, not on every generic item.
pub trait Execute: Database {
    /// Runs a statement that returns at most one row.
    fn fetch_optional<'e, 'q: 'e>(
        conn: &'e mut Self::Connection,
        statement: Statement<'q, Self>,
    ) -> BoxFuture<'e, Result<Option<Self::Row>, sqlx::Error>>;

    /// Runs a statement that returns no rows.
    fn execute<'e, 'q: 'e>(
        conn: &'e mut Self::Connection,
        statement: Statement<'q, Self>,
    ) -> BoxFuture<'e, Result<Self::QueryResult, sqlx::Error>>;

    /// Runs `sql`, which may hold several statements, on a connection of `pool`.
    fn execute_script<'e>(
        pool: &'e Pool<Self>,
        sql: &'e str,
    ) -> BoxFuture<'e, Result<(), sqlx::Error>>;
}

impl<DB: Database> Execute for DB
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
{
    fn fetch_optional<'e, 'q: 'e>(
        conn: &'e mut DB::Connection,
        statement: Statement<'q, DB>,
    ) -> BoxFuture<'e, Result<Option<DB::Row>, sqlx::Error>> {
        Box::pin(statement.fetch_optional(conn))
    }

    fn execute<'e, 'q: 'e>(
        conn: &'e mut DB::Connection,
        statement: Statement<'q, DB>,
    ) -> BoxFuture<'e, Result<DB::QueryResult, sqlx::Error>> {
        Box::pin(statement.execute(conn))
    }

    fn execute_script<'e>(
        pool: &'e Pool<DB>,
        sql: &'e str,
    ) -> BoxFuture<'e, Result<(), sqlx::Error>> {
        Box::pin(async move {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(pool)
                .await?;
            Ok(())
        })
    }
}

/// Rows removed per purge statement, so a purge never holds locks on a large part of the table.
pub(crate) const PURGE_BATCH: i64 = 1000;

/// The SQL text of a store's statements, made once per store for its table.
#[derive(Debug)]
pub struct Statements {
    /// A claim of a key with no row: inserts it, or changes nothing when the key has a row.
    /// Bound like [`Params::Claim`].
    pub(crate) insert: SqlStr,
    pub(crate) claim: SqlStr,
    pub(crate) complete: SqlStr,
    pub(crate) renew: SqlStr,
    pub(crate) release: SqlStr,
    pub(crate) get: SqlStr,
    pub(crate) forget: SqlStr,
    pub(crate) purge: SqlStr,
    /// For a database whose writes return no rows (MySQL): the read of a key's row whatever
    /// its state, under a row lock, that [`Backend::fetch_row`] runs after the claim statement
    /// and before `forget` in one transaction. Bound like [`Params::Get`]. `None` elsewhere.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) lock: Option<SqlStr>,
}

/// Which of a store's [`Statements`] a call runs.
#[derive(Debug, Clone, Copy)]
pub enum Pick {
    /// [`Statements::insert`].
    Insert,
    /// [`Statements::claim`].
    Claim,
    /// [`Statements::complete`].
    Complete,
    /// [`Statements::renew`].
    Renew,
    /// [`Statements::release`].
    Release,
    /// [`Statements::get`].
    Get,
    /// [`Statements::forget`].
    Forget,
    /// [`Statements::purge`].
    Purge,
}

impl Statements {
    /// The text of the statement `pick` names.
    pub(crate) fn text(&self, pick: Pick) -> &SqlStr {
        match pick {
            Pick::Insert => &self.insert,
            Pick::Claim => &self.claim,
            Pick::Complete => &self.complete,
            Pick::Renew => &self.renew,
            Pick::Release => &self.release,
            Pick::Get => &self.get,
            Pick::Forget => &self.forget,
            Pick::Purge => &self.purge,
        }
    }
}

/// Implemented next to each [`Backend`] implementation, and nowhere else.
pub(crate) mod sealed {
    pub trait Sealed {}
}

/// A database a [`SqlStore`](crate::SqlStore) runs on: `sqlx::Sqlite` (feature `sqlite`),
/// `sqlx::Postgres` (feature `postgres`) and `sqlx::MySql` (feature `mysql`, MySQL and MariaDB). Sealed: the store's guarantees rest on the SQL each
/// backend runs, which the crate's tests check against the real databases.
pub trait Backend: Execute + sealed::Sealed + Debug {
    /// The name [`Store::name`](tower_idempotency_core::Store::name) reports.
    #[doc(hidden)]
    const STORE_NAME: &'static str;
    /// The statement that opens a transactional-mode transaction.
    #[doc(hidden)]
    const BEGIN: &'static str;
    /// Whether an open transaction alone keeps other claimers out (SQLite's write lock).
    #[doc(hidden)]
    const EXCLUSIVE: bool;
    /// Whether the database takes one writer at a time (SQLite): writes that are not the
    /// [`Engine`]'s then run on one lane of their own, reads on the others.
    #[doc(hidden)]
    const ONE_WRITER: bool;
    /// The longest key the table holds whole (MySQL's primary key is a `VARBINARY` of bounded
    /// length): a claim of a longer key is refused before any statement runs, as a database
    /// that is not in strict mode would otherwise cut it short.
    #[doc(hidden)]
    const MAX_KEY_BYTES: usize = usize::MAX;

    /// The DDL of the store's table.
    #[doc(hidden)]
    fn schema_sql(table: &str) -> String;

    /// What `migrate()` runs: the DDL, with whatever makes concurrent migrations safe.
    #[doc(hidden)]
    fn migration_sql(table: &str) -> String {
        Self::schema_sql(table)
    }

    /// The statements on `table`.
    #[doc(hidden)]
    fn statements(table: &str) -> Statements;

    /// Binds `params` to `sql`, the statement of [`Statements`] they belong to.
    #[doc(hidden)]
    fn bind<'q>(sql: &SqlStr, now_ms: i64, params: Params<'q>) -> Statement<'q, Self>;

    /// Runs the statement `pick` names that returns a row (the claim statement, `get`,
    /// `forget`): by default that one statement, which returns the row itself (`RETURNING`). A
    /// database without `RETURNING` (MySQL) runs the write and a locking read of the row
    /// ([`Statements::lock`]) in one transaction (a savepoint inside a caller's transaction).
    #[doc(hidden)]
    fn fetch_row<'e, 'q: 'e>(
        conn: &'e mut Self::Connection,
        sql: &'e Statements,
        pick: Pick,
        now_ms: i64,
        params: Params<'q>,
    ) -> BoxFuture<'e, Result<Option<Self::Row>, sqlx::Error>> {
        Self::fetch_optional(conn, Self::bind(sql.text(pick), now_ms, params))
    }

    /// Decodes a row the claim, get or forget statement returned; `now_ms` is the time the
    /// statement was bound with.
    #[doc(hidden)]
    fn decode(row: &Self::Row, now_ms: i64) -> Result<RawRecord, sqlx::Error>;

    /// How many rows a statement changed (sqlx has no trait for it).
    #[doc(hidden)]
    fn rows_affected(done: &Self::QueryResult) -> u64;

    /// Opens the pool `connect()` uses.
    #[doc(hidden)]
    fn connect_pool(url: &str) -> impl Future<Output = Result<Pool<Self>, sqlx::Error>> + Send;

    /// What a store on this database keeps besides its lanes (see [`Engine`]).
    #[doc(hidden)]
    type Engine: Engine<Self>;

    /// The engine of a store on `pool` and `table`. Opens no connection.
    #[doc(hidden)]
    fn engine(pool: &Pool<Self>, table: &str) -> Self::Engine;
}

/// What a store on one database keeps besides its lanes, and the paths its statements take
/// off them: SQLite's clock, writer thread and inline reads (`crate::sqlite`), Postgres's
/// notices of settled keys. Every default is "none": statements run on the store's lanes,
/// rows are dated by the database, and waiters poll.
#[doc(hidden)]
pub trait Engine<DB: Database>: Debug + Send + Sync {
    /// The time bound into statements (unix ms), for databases whose rows are dated by the
    /// store's own clock; `0` where the database dates them.
    fn now_ms(&self) -> i64 {
        0
    }

    /// The live row of `key` (`Some(None)`: none), when it can be read off the lanes at once;
    /// `None`: read it on a lane.
    fn read(&self, _key: &str) -> Option<Option<RawRecord>> {
        None
    }

    /// A future that runs `write` off the lanes, or `write` back to run on a write lane; the
    /// future may also hand `write` back (`Err`), to run on a write lane after all.
    fn write<'a>(
        &'a self,
        write: Write<'a>,
    ) -> Result<impl Future<Output = Wrote<'a>> + Send + 'a, Write<'a>> {
        Err::<std::future::Ready<_>, _>(write)
    }

    /// Bounds the queue of writes waiting to run off the lanes, where there is one.
    fn bound_writes(&mut self, _jobs: usize, _bytes: usize) {}

    /// Given the store's lanes (again whenever they change), for an engine that runs writes on
    /// them from tasks of its own.
    fn lanes(&mut self, _lanes: &StoreLanes<DB>) {}

    /// What [`Store::settlements`](tower_idempotency_core::Store::settlements) returns.
    fn settlements(&self) -> Option<Settlements> {
        None
    }
}

/// How a write run off the lanes ends: its outcome, or the write handed back to run on a
/// write lane.
pub type Wrote<'a> = Result<Result<Done, StoreError>, Write<'a>>;

/// A write a store runs: which statement, its parameters, what it returns, and for the error
/// of a record that was too large, its size and the store's limit.
#[derive(Debug)]
pub struct Write<'q> {
    /// The statement.
    pub pick: Pick,
    /// Its parameters.
    pub params: Params<'q>,
    /// What it returns.
    pub returns: Returns,
    /// The size of the record it writes, if it writes one.
    pub size: Option<usize>,
    /// The store's record limit.
    pub limit: usize,
}

/// What a write returns.
#[derive(Debug, Clone, Copy)]
pub enum Returns {
    /// How many rows it changed.
    Changes,
    /// The row its `RETURNING` clause returned.
    Row,
}

/// What a write did.
#[derive(Debug)]
pub enum Done {
    /// It changed this many rows.
    Changed(u64),
    /// It returned this row.
    Row(Option<RawRecord>),
}
