//! The durable job engine under tower-idempotency's webhook inbox and transactional outbox.
//!
//! A job table holds the engine's columns beside the columns of the half that owns it. The
//! engine owns every statement over its columns, once per database ([`Driver`], a folder per
//! database: `sqlite/`, `postgres/`, `mysql/`): claims under a fenced lease, renewals, completion (inside
//! the caller's transaction when asked), failures with bounded attempts and [`Backoff`], the
//! sweep of spent jobs, purges in batches, keyset listings, retries, discards, counts and lag.
//! Its [`Worker`] runs a table's jobs in rounds (the outbox's relay), its [`Dispatcher`] as
//! they are fed (the inbox's worker); its operator's kit ([`admin`], [`page`], [`redact`],
//! [`cursor`], [`Unavailable`]) is what both halves' pages and routes are built from.
//!
//! A database's driver is checked by one suite,
//! [`jobs_driver_conformance_tests!`](crate::jobs_driver_conformance_tests) (feature
//! `conformance`), which runs unchanged against every driver.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use sqlx::{FromRow, SqlitePool};
//! use tokio::sync::Notify;
//! use tower_idempotency_jobs::{Claimed, Driver, Job, Outcome, Settings, Table, Worker};
//!
//! #[derive(FromRow)]
//! struct Email {
//!     body: String,
//! }
//!
//! struct Send;
//!
//! impl Job<sqlx::Sqlite> for Send {
//!     type Payload = Email;
//!     async fn run(&self, job: Claimed<Email>) -> Outcome {
//!         println!("sending {}", job.payload.body);
//!         Outcome::done()
//!     }
//! }
//!
//! # async fn run() -> sqlx::Result<()> {
//! let pool = SqlitePool::connect("sqlite://jobs.db?mode=rwc").await?;
//! let columns = <sqlx::Sqlite as Driver>::JOB_COLUMNS;
//! let ddl = format!(
//!     "CREATE TABLE IF NOT EXISTS emails (key TEXT PRIMARY KEY, body TEXT NOT NULL, \
//!      created_at INTEGER NOT NULL, {columns});\n{}",
//!     <sqlx::Sqlite as Driver>::due_index("emails"),
//! );
//! sqlx::raw_sql(sqlx::AssertSqlSafe(ddl)).execute(&pool).await?;
//! let table = Table::new("emails", &["key"], "created_at").payload(&["body"]);
//! let sql = Arc::new(<sqlx::Sqlite as Driver>::statements(table));
//! let worker = Worker::new(pool, sql, Send, Settings::new(4), Arc::new(Notify::new()));
//! let handle = worker.spawn();
//! handle.drain(std::time::Duration::from_secs(5)).await;
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod admin;
pub mod audit;
mod backoff;
pub mod chart;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod cursor;
mod dispatch;
pub mod driver;
pub mod gate;
pub mod history;
#[cfg(feature = "mysql")]
mod mysql;
pub mod page;
pub mod pauses;
#[cfg(feature = "postgres")]
mod postgres;
pub mod redact;
mod setters;
#[cfg(feature = "sqlite")]
mod sqlite;
mod table;
mod text;
pub mod time;
mod unavailable;
mod worker;

pub use backoff::Backoff;
pub use dispatch::{Dispatcher, Source};
pub use driver::{
    Binder, Dialect, Driver, KeyBatch, Placeholders, Prepared, Statement, Statements, DUE,
    DUE_BY_KEY, SPENT,
};
pub use gate::{Turn, WriteGate};
pub use history::{Attempt, AttemptOutcome};
pub use pauses::{Pause, PARKED_AT};
pub use table::{Claimed, JobCounts, JobKey, JobState, JobSummary, NoColumns, PageFilter, Table};
pub use text::{bounded, MAX_ERROR_LEN};
pub use unavailable::Unavailable;
pub use worker::{
    guarded, keep_lease, persist, Cut, Job, Outcome, Round, Settings, Worker, WorkerHandle,
    DEFAULT_HISTORY, DEFAULT_LEASE, DEFAULT_MAX_ATTEMPTS, DEFAULT_POLL_EVERY,
};

/// The `Debug` of a half's handle over a job table: its name, its database and its table, and
/// nothing of its pool or queues.
pub fn debug_handle(
    f: &mut std::fmt::Formatter<'_>,
    name: &str,
    database: &str,
    table: &dyn std::fmt::Debug,
) -> std::fmt::Result {
    f.debug_struct(name)
        .field("database", &database)
        .field("table", table)
        .finish_non_exhaustive()
}

/// A boxed future, as the driver's calls answer.
pub type BoxFuture<'a, T> = futures_util::future::BoxFuture<'a, T>;
