//! [`Table`]: the shape of one job table, and the rows the engine reads from it.
//!
//! A job table holds the engine's columns (state, attempts, due time, lease, finish time, last
//! error: [`Driver::job_columns`](crate::Driver::job_columns)) beside the columns of the half
//! that owns it (an inbox event's provider, headers and body; an outbox message's target). The
//! half creates the table; the engine's driver writes every statement over its job columns.

use std::fmt;

/// A job's state, stored as a small integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Waiting for an attempt (or running one, under a lease).
    Pending,
    /// Its last attempt succeeded.
    Done,
    /// Its attempts were spent, or one failed permanently.
    Failed,
    /// Finished without running: discarded by an operator, or skipped by the half.
    Discarded,
}

impl JobState {
    /// The stored code: 0 pending, 1 done, 2 failed, 3 discarded.
    pub fn code(self) -> i16 {
        match self {
            Self::Pending => 0,
            Self::Done => 1,
            Self::Failed => 2,
            Self::Discarded => 3,
        }
    }

    /// The state of a stored code (an unknown code reads as failed).
    pub fn from_code(code: i16) -> Self {
        match code {
            0 => Self::Pending,
            1 => Self::Done,
            3 => Self::Discarded,
            _ => Self::Failed,
        }
    }
}

/// A job's key: the values of its table's key columns, in their order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobKey(pub Vec<String>);

impl JobKey {
    /// The key of a table keyed by one column.
    pub fn one(value: impl Into<String>) -> Self {
        Self(vec![value.into()])
    }

    /// The value of key column `index`; empty when there is none.
    pub fn part(&self, index: usize) -> &str {
        self.0.get(index).map_or("", String::as_str)
    }
}

/// How many jobs are in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobCounts {
    /// Waiting or running.
    pub pending: u64,
    /// Succeeded.
    pub done: u64,
    /// Failed.
    pub failed: u64,
    /// Discarded or skipped.
    pub discarded: u64,
}

/// The shape of one job table: its name, key columns, the column of its enqueue time, and the
/// columns the half reads back with a claimed job and with a listed one.
///
/// ```
/// use tower_idempotency_jobs::Table;
///
/// let table = Table::new("outbox", &["key"], "created_at")
///     .payload(&["method", "url", "topic", "headers", "body"])
///     .summary(&["scope", "method", "url", "topic"])
///     .status("last_status");
/// assert_eq!(table.name(), "outbox");
/// ```
#[derive(Clone)]
pub struct Table {
    pub(crate) name: String,
    pub(crate) key: Vec<&'static str>,
    pub(crate) created: &'static str,
    pub(crate) payload: Vec<&'static str>,
    pub(crate) summary: Vec<&'static str>,
    pub(crate) status: Option<&'static str>,
    pub(crate) group: Option<&'static str>,
}

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("name", &self.name)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl Table {
    /// The table `name` (a plain SQL identifier the caller validated), keyed by the columns
    /// `key` (at least one), with jobs ordered by their enqueue time in column `created`.
    ///
    /// # Panics
    ///
    /// When `key` is empty.
    pub fn new(name: &str, key: &[&'static str], created: &'static str) -> Self {
        assert!(!key.is_empty(), "a job table needs a key column");
        Self {
            name: name.to_owned(),
            key: key.to_vec(),
            created,
            payload: Vec::new(),
            summary: Vec::new(),
            status: None,
            group: None,
        }
    }

    /// The columns a claim and a detail read back for the half (decoded by its
    /// [`sqlx::FromRow`] type).
    pub fn payload(mut self, columns: &[&'static str]) -> Self {
        self.payload = columns.to_vec();
        self
    }

    /// The columns a listing reads back beside the engine's (decoded by the half's
    /// [`sqlx::FromRow`] type).
    pub fn summary(mut self, columns: &[&'static str]) -> Self {
        self.summary = columns.to_vec();
        self
    }

    /// The integer column that records an attempt's status code (an HTTP target's answer).
    pub fn status(mut self, column: &'static str) -> Self {
        self.status = Some(column);
        self
    }

    /// The text column a listing can filter on ([`PageFilter::group`]): an inbox's provider.
    pub fn group(mut self, column: &'static str) -> Self {
        self.group = Some(column);
        self
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key columns, comma-separated, each quoted with `q` (empty: unquoted).
    pub(crate) fn key_list(&self, q: &str) -> String {
        self.key
            .iter()
            .map(|column| format!("{q}{column}{q}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `k1 = $n AND k2 = $n+1 ..` for the key bound from parameter `first`.
    pub(crate) fn key_match(&self, first: usize, q: &str) -> String {
        self.key
            .iter()
            .enumerate()
            .map(|(i, column)| format!("{q}{column}{q} = ${}", first + i))
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    /// The columns of a listing row, in [`JobSummary`]'s reading order; `null_integer` is the
    /// database's typed integer `NULL`, the status of a table without a status column.
    pub(crate) fn summary_columns(&self, q: &str, null_integer: &str) -> String {
        let mut columns: Vec<String> = self.key.iter().map(|c| format!("{q}{c}{q}")).collect();
        columns.push(format!("{q}{}{q} AS job_created_at", self.created));
        columns.extend(
            [
                "state",
                "attempts",
                "available_at",
                "finished_at",
                "last_error",
            ]
            .iter()
            .map(|c| (*c).to_owned()),
        );
        columns.push(match self.status {
            Some(status) => format!("{q}{status}{q} AS job_status"),
            None => format!("{null_integer} AS job_status"),
        });
        columns.extend(
            self.summary
                .iter()
                .filter(|c| !self.key.contains(c))
                .map(|c| format!("{q}{c}{q}")),
        );
        columns.join(", ")
    }

    /// The payload's columns after the key's, for a claim's or a detail's answer.
    pub(crate) fn payload_columns(&self, q: &str) -> String {
        self.payload
            .iter()
            .filter(|c| !self.key.contains(c))
            .map(|c| format!(", {q}{c}{q}"))
            .collect()
    }
}

/// A claimed job: its key, this attempt's number (from 1), and the half's payload.
#[derive(Debug)]
pub struct Claimed<P> {
    /// The job's key.
    pub key: JobKey,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// The columns of [`Table::payload`], as the half decodes them.
    pub payload: P,
}

/// A listed job: the engine's columns and the half's summary columns.
#[derive(Clone, Debug)]
pub struct JobSummary<S> {
    /// The job's key.
    pub key: JobKey,
    /// Its state.
    pub state: JobState,
    /// Attempts started.
    pub attempts: u32,
    /// When it was enqueued, unix ms.
    pub created_at_ms: i64,
    /// When it is (or was) due, unix ms.
    pub available_at_ms: i64,
    /// When it finished, unix ms.
    pub finished_at_ms: Option<i64>,
    /// The last attempt's status code ([`Table::status`]).
    pub status: Option<i32>,
    /// The last failed attempt's error.
    pub last_error: Option<String>,
    /// The columns of [`Table::summary`], as the half decodes them.
    pub extra: S,
}

impl<S> JobSummary<S> {
    /// The same job with its extra columns mapped by `f`.
    pub fn map<T>(self, f: impl FnOnce(S) -> T) -> JobSummary<T> {
        JobSummary {
            key: self.key,
            state: self.state,
            attempts: self.attempts,
            created_at_ms: self.created_at_ms,
            available_at_ms: self.available_at_ms,
            finished_at_ms: self.finished_at_ms,
            status: self.status,
            last_error: self.last_error,
            extra: f(self.extra),
        }
    }
}

/// Which jobs a listing takes, newest enqueued first. Every field left `None` matches all.
#[derive(Clone, Debug, Default)]
pub struct PageFilter {
    /// Only jobs in this state.
    pub state: Option<JobState>,
    /// Only jobs whose [`Table::group`] column holds this value.
    pub group: Option<String>,
    /// Only jobs enqueued at or after this time, unix ms.
    pub from_ms: Option<i64>,
    /// Only jobs enqueued before this time, unix ms.
    pub until_ms: Option<i64>,
    /// Only jobs after this position (enqueue time, key) in the listing's order: the last
    /// job of the previous page.
    pub after: Option<(i64, JobKey)>,
}

/// Extra columns for a listing that wants none: decodes from any row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoColumns;

impl<'r, R: sqlx::Row> sqlx::FromRow<'r, R> for NoColumns {
    fn from_row(_row: &'r R) -> sqlx::Result<Self> {
        Ok(Self)
    }
}
