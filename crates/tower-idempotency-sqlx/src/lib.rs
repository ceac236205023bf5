//! Durable [`Store`](tower_idempotency_core::Store)s for `tower-idempotency` in one SQL table:
//! [`SqliteStore`] (feature `sqlite`, an embedded store shared by the processes of one host),
//! [`PostgresStore`] (feature `postgres`, shared by every instance on the database), both on by
//! default, and `MySqlStore` (feature `mysql`, MySQL 8.0+ and MariaDB 10.6+, shared like
//! Postgres), all on [sqlx](https://docs.rs/sqlx) 0.9 pools. Each passes the core's store
//! conformance suite, and this crate's [`transactional`] mode lets a handler's writes and the
//! key's completion commit together.
//!
//! The schemas ([`sqlite_schema_sql`], [`postgres_schema_sql`]), the statements each call runs
//! and their round trips, and why the SQLite store writes on a thread of its own and reads on
//! the calling task are in
//! [docs/stores.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/stores.md).
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
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

// `store`: what every SQL store shares, written once over a `Backend` (no feature switches
// inside); `sqlite`, `postgres` and `mysql`: each database's store, implementing `Backend`.
#[cfg(feature = "mysql")]
mod mysql;
mod pool;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
mod store;

#[cfg(all(
    feature = "conformance",
    any(feature = "sqlite", feature = "postgres", feature = "mysql")
))]
pub mod conformance;

#[cfg(feature = "mysql")]
pub use mysql::{schema_sql as mysql_schema_sql, MYSQL_LOCK_WAIT_TIMEOUT};
pub use pool::{ping_when_idle, PING_AFTER_IDLE};
#[cfg(feature = "postgres")]
pub use postgres::schema_sql as postgres_schema_sql;
#[cfg(feature = "sqlite")]
pub use sqlite::{schema_sql as sqlite_schema_sql, SQLITE_BUSY_TIMEOUT};
pub use store::{error::is_unavailable_error, transactional, Backend, SqlStore};
pub use transactional::{IdempotentTx, TxHandle, TxRejection};

/// The SQLite store: a [`SqlStore`] in an SQLite database file, the embedded default.
#[cfg(feature = "sqlite")]
pub type SqliteStore = SqlStore<sqlx::Sqlite>;

/// The Postgres store: a [`SqlStore`] in a Postgres table, shared by every instance on the
/// database.
#[cfg(feature = "postgres")]
pub type PostgresStore = SqlStore<sqlx::Postgres>;

/// The MySQL and MariaDB store: a [`SqlStore`] in an InnoDB table, shared by every instance on
/// the database (MySQL 8.0+, MariaDB 10.6+).
#[cfg(feature = "mysql")]
pub type MySqlStore = SqlStore<sqlx::MySql>;

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

/// SQL text built from this crate family's fixed statements and a table name that
/// [`validate_table_name`] accepted, as sqlx 0.9 takes dynamic SQL: audited
/// ([`sqlx::AssertSqlSafe`]), since no value a caller sends is spliced into it, and shared (a
/// clone is a reference count, not a copy). Values always go in as bound parameters.
pub fn table_sql(text: String) -> sqlx::SqlStr {
    use sqlx::SqlSafeStr;
    sqlx::AssertSqlSafe(std::sync::Arc::<str>::from(text)).into_sql_str()
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
