//! Attempt history: one row per attempt of a job (when it started, how long it took, how it
//! ended, its error; for a delivery the target's status and the start of its answer), in a
//! table beside the job table (`{table}_attempts`, [`Driver::history_schema`]). A job keeps its
//! first attempt and its newest `n` ([`Settings::history`](crate::Settings::history)): an
//! attempt numbered past `n` deletes the rows between. An operator's retry starts the count of
//! attempts again, so the attempts of each run up to `n` are kept beside. The rows of a purged
//! job are purged after it ([`Driver::purge_attempts`]). A successful first attempt costs one
//! statement (inside the attempt's transaction where the half has one), or none where the
//! completion writes the row itself ([`Driver::complete_recorded`], Postgres).
//!
//! The record is written after the attempt's own outcome (inside a successful attempt's
//! transaction where the half has one), so an attempt cut short by a crash has no row: the
//! job's count of attempts then exceeds its rows.

use serde::Serialize;

use crate::{Dialect, Driver, Placeholders, Prepared, Table};

/// The most bytes of an answer an attempt keeps ([`Attempt::response`]).
pub const MAX_RESPONSE_LEN: usize = 1024;

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// It succeeded: the job is done.
    Done,
    /// It failed; another attempt follows after the backoff.
    Retried,
    /// It failed for good: the job is failed.
    Failed,
    /// It found the job needs no run (the inbox's stale events under `SkipStale`).
    Skipped,
    /// Not an attempt that ran: an operator replayed the finished job, whose next attempt runs
    /// it again (numbered from 1). Recorded with attempt number 0.
    Replayed,
}

impl AttemptOutcome {
    /// The code stored in the `outcome` column.
    pub fn code(self) -> i16 {
        match self {
            Self::Done => 1,
            Self::Retried => 2,
            Self::Failed => 3,
            Self::Skipped => 4,
            Self::Replayed => 5,
        }
    }

    /// The outcome of a stored code (an unknown one reads as failed).
    pub fn from_code(code: i16) -> Self {
        match code {
            1 => Self::Done,
            2 => Self::Retried,
            4 => Self::Skipped,
            5 => Self::Replayed,
            _ => Self::Failed,
        }
    }

    /// The lowercase name (`done`, `retried`, `failed`, `skipped`, `replayed`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Retried => "retried",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
            Self::Replayed => "replayed",
        }
    }
}

/// One attempt of a job, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Attempt {
    /// Its number in the job's count of attempts (an operator's retry starts the count again).
    pub attempt: u32,
    /// When it started, unix ms.
    pub started_at_ms: i64,
    /// How long it ran, in milliseconds.
    pub duration_ms: u64,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// Its error (bounded, naming no secret).
    pub error: Option<String>,
    /// The status code it met (a delivery's HTTP status).
    pub status: Option<i32>,
    /// The start of the answer it met (at most [`MAX_RESPONSE_LEN`] bytes, cut at a character
    /// boundary): a delivery's response body. Show it redacted.
    pub response: Option<String>,
}

impl Attempt {
    /// An attempt numbered `attempt` that started at `started_at_ms` and ended now with
    /// `outcome`.
    pub fn ended(attempt: u32, started_at_ms: i64, outcome: AttemptOutcome) -> Self {
        let duration = crate::time::now_ms().saturating_sub(started_at_ms);
        Self {
            attempt,
            started_at_ms,
            duration_ms: u64::try_from(duration).unwrap_or(0),
            outcome,
            error: None,
            status: None,
            response: None,
        }
    }

    /// With its error.
    pub fn error(mut self, error: Option<String>) -> Self {
        self.error = error.map(crate::bounded);
        self
    }

    /// With its status code.
    pub fn status(mut self, status: Option<i32>) -> Self {
        self.status = status;
        self
    }

    /// With the start of its answer, cut to [`MAX_RESPONSE_LEN`] bytes.
    pub fn response(mut self, response: Option<String>) -> Self {
        self.response = response.map(|mut text| {
            if text.len() > MAX_RESPONSE_LEN {
                let mut end = MAX_RESPONSE_LEN;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
            }
            text
        });
        self
    }
}

/// An attempt row as the statements read it.
pub(crate) type AttemptRow = (
    i32,
    i64,
    i64,
    i16,
    Option<String>,
    Option<i32>,
    Option<String>,
);

impl From<AttemptRow> for Attempt {
    fn from(
        (attempt, started_at_ms, duration_ms, outcome, error, status, response): AttemptRow,
    ) -> Self {
        Self {
            attempt: u32::try_from(attempt).unwrap_or(0),
            started_at_ms,
            duration_ms: u64::try_from(duration_ms).unwrap_or(0),
            outcome: AttemptOutcome::from_code(outcome),
            error,
            status,
            response,
        }
    }
}

/// The attempt history's statements of one job table.
#[derive(Debug)]
pub struct HistoryStatements {
    pub(crate) insert: Prepared,
    pub(crate) trim: Prepared,
    pub(crate) list: Prepared,
    pub(crate) orphans: Prepared,
}

impl HistoryStatements {
    /// The statements over `table`'s history table in `dialect`. A database with positional
    /// parameters (MySQL) cannot read the table a `DELETE` writes in a subquery of it, so there
    /// the subqueries read from a derived table.
    pub(crate) fn new(table: &Table, dialect: Dialect) -> Self {
        let sql = |text: String| Prepared::new(text, dialect.placeholders);
        let q = dialect.quote;
        let (t, keys, n) = (history_table(table), table.key_list(q), table.key.len());
        let jobs = &table.name;
        let by_key = table.key_match(1, q);
        let values: Vec<String> = (1..=n + 7).map(|i| format!("${i}")).collect();
        // The job's first row stays, and its newest `${n + 1}` after it.
        let keep = n + 1;
        let joined: Vec<String> = table
            .key
            .iter()
            .map(|column| format!("j.{q}{column}{q} = a.{q}{column}{q}"))
            .collect();
        let derived = dialect.placeholders == Placeholders::Positional;
        let scalar = |select: String| {
            if derived {
                format!("(SELECT v FROM ({select}) AS d)")
            } else {
                format!("({select})")
            }
        };
        let first = scalar(format!("SELECT min(seq) AS v FROM {t} WHERE {by_key}"));
        let newest = scalar(format!(
            "SELECT seq AS v FROM {t} WHERE {by_key} ORDER BY seq DESC LIMIT 1 OFFSET ${keep}"
        ));
        let orphan = format!(
            "SELECT a.seq FROM {t} a WHERE NOT EXISTS (SELECT 1 FROM {jobs} j WHERE {}) LIMIT $1",
            joined.join(" AND ")
        );
        let orphans = if derived {
            format!("DELETE FROM {t} WHERE seq IN (SELECT seq FROM ({orphan}) AS d)")
        } else {
            format!("DELETE FROM {t} WHERE seq IN ({orphan})")
        };
        Self {
            insert: sql(format!(
                "INSERT INTO {t} ({keys}, attempt, started_at, duration_ms, outcome, error, \
                 status, response) VALUES ({})",
                values.join(", ")
            )),
            trim: sql(format!(
                "DELETE FROM {t} WHERE {by_key} AND seq > {first} AND seq <= {newest}"
            )),
            list: sql(format!(
                "SELECT attempt, started_at, duration_ms, outcome, error, status, response \
                 FROM {t} WHERE {by_key} ORDER BY seq"
            )),
            orphans: sql(orphans),
        }
    }
}

/// The name of `table`'s history table: `{table}_attempts`.
pub fn history_table(table: &Table) -> String {
    format!("{}_attempts", table.name)
}

/// The DDL of `table`'s history table on `DB`, its key columns typed `key_type`.
pub(crate) fn schema<DB: Driver>(table: &Table) -> String {
    let t = history_table(table);
    let q = DB::HISTORY_QUOTE;
    let keys: Vec<String> = table
        .key
        .iter()
        .map(|column| format!("{q}{column}{q} {} NOT NULL", DB::HISTORY_KEY_TYPE))
        .collect();
    let key_list = table.key_list(q);
    format!(
        "CREATE TABLE IF NOT EXISTS {t} ({}, {}, {});\n\
         CREATE INDEX IF NOT EXISTS {t}_job ON {t} ({key_list}, seq);\n",
        DB::HISTORY_SEQ,
        keys.join(", "),
        DB::HISTORY_COLUMNS,
    )
}
