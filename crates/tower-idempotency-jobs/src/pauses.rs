//! Pauses: an operator stops the attempts of a scope of jobs (an inbox's provider, or a
//! provider's event type; an outbox's target host) until it is resumed. A pause is a row in a
//! table beside the job table (`{table}_pauses`, [`Driver::pauses_schema`]), so it is shared by
//! every instance and survives restarts. A half names its scopes; the engine only compares
//! them.
//!
//! A paused job stays pending and spends no attempt. A worker that claims a job of a paused
//! scope does not run it: one statement fenced by the claim ([`Driver::park`]) gives the attempt
//! back, frees the lease and makes the job due at [`PARKED_AT`], so that no claim nor sweep
//! picks it again. The statement parks only while the pause's row exists. A resume
//! ([`Driver::resume`]) deletes the row and makes every parked job of the table due now; a job
//! whose scope is still paused otherwise is parked again at its next claim.
//!
//! A worker reads the pauses at most every [`REFRESH`] ([`paused`]): an instance sees a pause
//! within that time of it (at once for one paused through the same statements); an attempt
//! already running when a scope is paused finishes. A worker that finds a scope resumed since
//! its last read makes the parked jobs due again as well, for a job it parked on a stale read.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::{Dialect, Driver, Prepared, Statements, Table};

/// The due time of a parked job: 9999-12-31T00:00:00Z in unix ms, later than any claim's or
/// sweep's now.
pub const PARKED_AT: i64 = 253_402_214_400_000;

/// How long a worker keeps the pauses it read before reading them again.
pub const REFRESH: Duration = Duration::from_millis(250);

/// The longest scope a pause takes, in bytes.
pub const MAX_SCOPE_LEN: usize = 255;

/// Whether a pending job due at `available_at_ms` is parked by a pause.
pub fn is_parked(available_at_ms: i64) -> bool {
    available_at_ms >= PARKED_AT
}

/// One pause, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Pause {
    /// The paused scope, as its half names it.
    pub scope: String,
    /// When it was paused, unix ms.
    pub paused_at_ms: i64,
    /// Who paused it.
    pub by: String,
}

impl From<(String, i64, String)> for Pause {
    fn from((scope, paused_at_ms, by): (String, i64, String)) -> Self {
        Self {
            scope,
            paused_at_ms,
            by,
        }
    }
}

/// The pauses' statements of one job table, and the pauses its workers read last.
#[derive(Debug)]
pub struct PauseStatements {
    pub(crate) insert: Prepared,
    pub(crate) delete: Prepared,
    pub(crate) list: Prepared,
    pub(crate) park: Prepared,
    pub(crate) unpark: Prepared,
    cache: Mutex<Cached>,
}

/// The pauses a worker read last.
#[derive(Debug, Default)]
struct Cached {
    read_at: Option<Instant>,
    scopes: Arc<BTreeSet<String>>,
}

impl PauseStatements {
    /// The statements over `table`'s pauses in `dialect`.
    pub(crate) fn new(table: &Table, dialect: Dialect) -> Self {
        let sql = |text: String| Prepared::new(text, dialect.placeholders);
        let (t, p) = (&table.name, pauses_table(table));
        let by_key = table.key_match(1, dialect.quote);
        let k = table.key.len() + 1;
        Self {
            insert: sql(format!(
                "INSERT INTO {p} (scope, paused_at, paused_by) VALUES ($1, $2, $3)"
            )),
            delete: sql(format!("DELETE FROM {p} WHERE scope = $1")),
            list: sql(format!(
                "SELECT scope, paused_at, paused_by FROM {p} ORDER BY scope"
            )),
            // The key, then $k token, $k+1 scope.
            park: sql(format!(
                "UPDATE {t} SET attempts = attempts - 1, available_at = {PARKED_AT}, \
                 lease_token = NULL, lease_until = NULL WHERE {by_key} AND lease_token = ${k} \
                 AND state + 0 = 0 AND EXISTS (SELECT 1 FROM {p} WHERE scope = ${})",
                k + 1
            )),
            // $1 now.
            unpark: sql(format!(
                "UPDATE {t} SET available_at = $1 WHERE state = 0 AND available_at = {PARKED_AT}"
            )),
            cache: Mutex::new(Cached::default()),
        }
    }

    /// Forgets the pauses read last: the next [`paused`] reads them.
    pub fn invalidate(&self) {
        self.cache.lock().expect("never poisoned").read_at = None;
    }

    /// The pauses read last, unless older than [`REFRESH`].
    fn fresh(&self) -> Option<Arc<BTreeSet<String>>> {
        let cached = self.cache.lock().expect("never poisoned");
        let fresh = cached.read_at.is_some_and(|at| at.elapsed() < REFRESH);
        fresh.then(|| cached.scopes.clone())
    }

    /// Keeps `scopes` as read now; answers whether a scope read before is gone (resumed).
    fn keep(&self, scopes: Arc<BTreeSet<String>>) -> bool {
        let mut cached = self.cache.lock().expect("never poisoned");
        let resumed = cached.scopes.iter().any(|scope| !scopes.contains(scope));
        cached.read_at = Some(Instant::now());
        cached.scopes = scopes;
        resumed
    }
}

/// The name of `table`'s pauses table: `{table}_pauses`.
pub fn pauses_table(table: &Table) -> String {
    format!("{}_pauses", table.name)
}

/// The DDL of `table`'s pauses table on `DB`.
pub(crate) fn schema<DB: Driver>(table: &Table) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (scope {} PRIMARY KEY, paused_at BIGINT NOT NULL, \
         paused_by TEXT NOT NULL);\n",
        pauses_table(table),
        DB::HISTORY_KEY_TYPE,
    )
}

/// The paused scopes of the table `sql`, read at most every [`REFRESH`] (a failed read keeps
/// the last one). A scope found resumed since the last read makes the table's parked jobs due
/// ([`Driver::unpark`]).
pub async fn paused<DB: Driver>(pool: &sqlx::Pool<DB>, sql: &Statements) -> Arc<BTreeSet<String>> {
    let pauses = &sql.pauses;
    if let Some(scopes) = pauses.fresh() {
        return scopes;
    }
    let table = sql.table().name();
    match DB::pauses(pool, sql).await {
        Ok(read) => {
            let scopes: Arc<BTreeSet<String>> =
                Arc::new(read.into_iter().map(|pause| pause.scope).collect());
            if pauses.keep(scopes.clone()) {
                let now = crate::time::now_ms();
                if let Err(error) = DB::unpark(pool, sql, now).await {
                    tracing::warn!(%error, table, "making resumed jobs due failed");
                }
            }
            scopes
        }
        Err(error) => {
            tracing::warn!(%error, table, "reading the pauses failed; the last read holds");
            let cached = pauses.cache.lock().expect("never poisoned");
            cached.scopes.clone()
        }
    }
}

/// The first of `scopes` that `paused` holds.
pub fn paused_scope<'s>(
    paused: &BTreeSet<String>,
    scopes: impl IntoIterator<Item = &'s str>,
) -> Option<&'s str> {
    if paused.is_empty() {
        return None;
    }
    scopes.into_iter().find(|scope| paused.contains(*scope))
}

/// Why a scope cannot be paused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScopeError {
    /// The scope is empty.
    Empty,
    /// The scope is longer than [`MAX_SCOPE_LEN`] bytes.
    TooLong,
}

impl std::fmt::Display for ScopeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Empty => f.write_str("the scope is empty"),
            Self::TooLong => write!(f, "the scope is longer than {MAX_SCOPE_LEN} bytes"),
        }
    }
}

impl std::error::Error for ScopeError {}

/// Checks a scope before it is paused.
pub fn check_scope(scope: &str) -> Result<(), ScopeError> {
    if scope.is_empty() {
        Err(ScopeError::Empty)
    } else if scope.len() > MAX_SCOPE_LEN {
        Err(ScopeError::TooLong)
    } else {
        Ok(())
    }
}
