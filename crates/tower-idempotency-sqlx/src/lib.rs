//! Durable [`Store`](tower_idempotency_core::Store)s for `tower-idempotency` on
//! [sqlx](https://docs.rs/sqlx) 0.8: [`SqliteStore`] (feature `sqlite`) and [`PostgresStore`]
//! (feature `postgres`). Both features are on by default.
//!
//! # Schema
//!
//! One table holds one row per scoped key; [`postgres_schema_sql`] and [`sqlite_schema_sql`]
//! return the exact DDL for teams that run their own migrations, and `migrate()` runs it
//! (`IF NOT EXISTS`, safe to call at every start).
//!
//! | column | Postgres | SQLite | meaning |
//! |---|---|---|---|
//! | `key` | `text COLLATE "C" PRIMARY KEY` | `TEXT PRIMARY KEY` | the scoped key; the primary key is the only arbiter of who claims it |
//! | `fingerprint` | `bytea` | `BLOB` | 32-byte request fingerprint of the holder |
//! | `token` | `bigint` | `INTEGER` | fencing token of the current claim |
//! | `state` | `smallint` | `INTEGER` | `0` in flight, `1` completed |
//! | `expires_at` | `timestamptz` | `INTEGER` (unix ms) | lease end while in flight, TTL end once completed |
//! | `status` | `smallint` | `INTEGER` | cached status code (completed rows) |
//! | `headers` | `bytea` | `BLOB` | cached headers, [`encode_headers`](tower_idempotency_core::encode_headers) format |
//! | `body` | `bytea` | `BLOB` | cached body |
//! | `body_omitted` | `boolean` | `INTEGER` | the body was over the cache cap and not stored |
//!
//! A row whose `expires_at` has passed is treated as absent by every call; `purge_expired()` (or
//! the background task from `spawn_purger`) deletes such rows to reclaim space, but correctness
//! never depends on it.
//!
//! # Round trips
//!
//! | request | Postgres | SQLite |
//! |---|---|---|
//! | first request (claim, then complete or release) | 2 | 2 |
//! | duplicate while in flight, or replay of a completed key | 1 (a read, once the process has seen the key) | 1 (likewise) |
//! | the same, for a key the process has not seen (another instance or process wrote it, or it was written before a restart) | 2 (the insert that finds the row, then the claim statement) | 2 (likewise) |
//!
//! The claim is **one** statement whose core is `INSERT .. ON CONFLICT (key) DO UPDATE ..
//! RETURNING` on the primary key, the only arbiter of who holds a key. Its update always fires:
//! when the existing row is live it writes the row's own values back, which locks the newest
//! version and returns it, so a duplicate learns the holder's state from the same statement; when
//! the existing row has expired, the same update installs the new claim. On Postgres the
//! statement first reads the key in its snapshot (a CTE) and, when it finds a live row, returns
//! it without writing anything, so replays are read-only; the upsert only runs when the snapshot
//! has no live row. For a key the process has claimed lately, both stores read the key first
//! with a plain primary-key `SELECT` and run the claim statement only when it found no live row:
//! a replay or an in-flight duplicate is a read. On SQLite that read runs beside the writer and
//! never waits for the write lock (WAL mode), on the calling task itself, through connections
//! the store opens for it with rusqlite: sqlx runs each SQLite statement on its connection's
//! own thread, and the trip there and back costs more than a primary-key read. A read that
//! cannot run there at once (no free connection, a body over 64 KiB, an in-memory database, any
//! error) runs on a reader lane instead. A key the process has
//! not seen is most likely new: a plain `INSERT .. ON CONFLICT (key) DO NOTHING` claims it, which
//! costs the database less than the claim statement's upsert (its `RETURNING`, and on Postgres
//! its snapshot read and CTEs; the load harness's `postgres` new keys show it). Only when the key
//! has a row (written by another process, or before a restart) does the claim statement run.
//! SQLite's writes run on one connection on a thread of the store's own (through rusqlite
//! too), so requests of one process queue in order instead of in SQLite's busy handler (which
//! sleeps and retries), and the writes that queued up while it was busy run in one transaction
//! (group commit): one lock cycle and one WAL commit for all of them, each caller answered
//! after the commit. A pool that is not on a plain read-write file writes on a writer lane
//! instead. Each store counts the statements it executes
//! ([`SqlStore::statements_executed`]); the test
//! suite asserts the counts above over real HTTP, and for Postgres also on the wire (a proxy
//! that counts the protocol's round trips).
//!
//! A statement is one round trip because each store keeps a few of its pool's connections
//! checked out ("lanes", half the pool by default; `with_connection_lanes` changes it; on
//! SQLite one of them is the writer lane, used where the store has no writer thread, and the
//! others read). Through
//! the pool itself, sqlx 0.8 pings a connection when it hands it out and again when it takes it
//! back, which makes every statement three round trips (the load harness's `--store-lanes 0`
//! measures that path against the lanes).
//! A lane idle for over a second pings before its next statement; a statement that fails or is
//! cancelled hands its connection back to the pool to be checked; waiting for a lane is bounded
//! by the pool's `acquire_timeout`; closing the pool empties the lanes. Trade-off: after the database restarts, up to one statement per lane fails (the layer
//! answers `503`) before the lanes reconnect, where the pool's ping would have reconnected
//! first.
//!
//! # Fencing tokens
//!
//! Both stores write the caller's token: 63 random bits the layer draws from the operating
//! system per claim ([`FencingToken::random`](tower_idempotency_core::FencingToken::random)),
//! stored as a non-negative 64-bit integer. No counter has to survive in the database (a
//! sequence rolled back by a lossy failover would hand a token out twice); the chance that a key
//! ever sees the same token twice is about `claims_of_that_key / 2^63`.
//!
//! # Example
//!
//! ```no_run
//! use tower_idempotency_core::IdempotencyLayer;
//! use tower_idempotency_sqlx::SqliteStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = SqliteStore::connect("sqlite://idempotency.db").await?;
//! store.migrate().await?;
//! let layer = IdempotencyLayer::client_keys(store);
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! With Postgres and a table of your own, plus a background purge:
//!
//! ```no_run
//! use std::{sync::Arc, time::Duration};
//! use tower_idempotency_core::IdempotencyLayer;
//! use tower_idempotency_sqlx::PostgresStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::PgPool::connect("postgres://app@db/app").await?;
//! let store = Arc::new(PostgresStore::new(pool, "payment_idempotency")?);
//! store.migrate().await?;
//! let _purger = store.spawn_purger(Duration::from_secs(60));
//! let layer = IdempotencyLayer::client_keys(store);
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

// The store is written once (`store`) over what differs between databases (`backend`, with
// `sqlite` and `postgres` implementing it); `lanes` keeps connections checked out so that a
// statement is one round trip; `record` decodes rows and checks completions; `lease` holds the
// rules for claims that waited; `error` maps database errors; `clock` is SQLite's time;
// `settlements` is Postgres's notices of settled keys for waiters in other instances;
// `sqlite_reads` runs SQLite's one-row reads on the calling task; `sqlite_writer` runs SQLite's
// writes on a thread of their own, several to a transaction.
mod backend;
mod error;
mod lanes;
mod lease;
#[cfg(feature = "postgres")]
mod postgres;
mod recent;
mod record;
#[cfg(feature = "sqlite")]
mod sqlite;
mod store;
pub mod transactional;

#[cfg(all(feature = "conformance", any(feature = "sqlite", feature = "postgres")))]
pub mod conformance;

pub use backend::Backend;
#[cfg(feature = "postgres")]
pub use postgres::schema_sql as postgres_schema_sql;
#[cfg(feature = "sqlite")]
pub use sqlite::{schema_sql as sqlite_schema_sql, SQLITE_BUSY_TIMEOUT};
pub use store::SqlStore;
pub use transactional::{IdempotentTx, TxHandle, TxRejection};

/// The SQLite store: a [`SqlStore`] in an SQLite database file, the embedded default.
#[cfg(feature = "sqlite")]
pub type SqliteStore = SqlStore<sqlx::Sqlite>;

/// The Postgres store: a [`SqlStore`] in a Postgres table, shared by every instance on the
/// database.
#[cfg(feature = "postgres")]
pub type PostgresStore = SqlStore<sqlx::Postgres>;

/// The sqlx version this crate is built on, re-exported so pools and transactions match it.
pub use sqlx;

/// The table name `connect` uses when none is given.
pub const DEFAULT_TABLE: &str = "idempotency_records";

/// The largest record (headers plus body) a store accepts unless configured otherwise: 16 MiB.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 16 * 1024 * 1024;

/// The most writes SQLite's writer thread holds accepted and unanswered unless configured
/// otherwise ([`SqlStore::with_write_queue`]): 4096.
pub const DEFAULT_WRITE_QUEUE_JOBS: usize = 4096;

/// The most bytes of parameters SQLite's writer thread holds in accepted, unanswered writes
/// unless configured otherwise ([`SqlStore::with_write_queue`]): 64 MiB.
pub const DEFAULT_WRITE_QUEUE_BYTES: usize = 64 * 1024 * 1024;

/// The longest table name accepted: the derived index name (`{table}_expires_at_idx`) must fit
/// Postgres's 63-byte identifier limit, or two long table names could truncate to the same
/// derived name.
pub const MAX_TABLE_NAME_LEN: usize = 48;

/// A store configuration that was rejected before any SQL ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The table name is not an SQL identifier of the form `[A-Za-z_][A-Za-z0-9_]*`. Table names
    /// are spliced into SQL text, so nothing else is accepted.
    #[error("invalid table name {0:?}: expected [A-Za-z_][A-Za-z0-9_]*")]
    InvalidTableName(String),
    /// The table name is longer than [`MAX_TABLE_NAME_LEN`] bytes.
    #[error("table name is {len} bytes long, the limit is {limit}")]
    TableNameTooLong {
        /// Length of the rejected name.
        len: usize,
        /// [`MAX_TABLE_NAME_LEN`].
        limit: usize,
    },
}

/// Why `connect` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The table name was rejected.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The database could not be opened or reached.
    #[error("could not connect to the database")]
    Database(#[source] sqlx::Error),
}

/// Checks that `table` is a plain SQL identifier that is safe to splice into SQL text.
///
/// Accepts `^[A-Za-z_][A-Za-z0-9_]*$` of at most [`MAX_TABLE_NAME_LEN`] bytes.
pub fn validate_table_name(table: &str) -> Result<(), ConfigError> {
    let mut bytes = table.bytes();
    let first_ok = matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_');
    if !first_ok || !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(ConfigError::InvalidTableName(table.to_owned()));
    }
    if table.len() > MAX_TABLE_NAME_LEN {
        return Err(ConfigError::TableNameTooLong {
            len: table.len(),
            limit: MAX_TABLE_NAME_LEN,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        for ok in ["t", "_t", "idempotency_records", "T1_x", &"a".repeat(48)] {
            assert_eq!(validate_table_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "1t",
            "t-1",
            "t;drop table x",
            "t\"",
            "t.x",
            "t x",
            "tä",
            "t\0",
        ] {
            assert!(
                matches!(
                    validate_table_name(bad),
                    Err(ConfigError::InvalidTableName(_))
                ),
                "{bad:?}"
            );
        }
        assert_eq!(
            validate_table_name(&"a".repeat(49)),
            Err(ConfigError::TableNameTooLong { len: 49, limit: 48 })
        );
    }
}
