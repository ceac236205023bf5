//! [`Driver`]: the statements of a job table on one database. Each database's folder
//! (`postgres/`, `sqlite/`, `mysql/`) owns its dialect (its column types, its claim's lock
//! clause, how a batch of keys is bound, how parameters are written, whether it has
//! `RETURNING`) and implements the trait through `driver_calls!`, which writes the typed calls
//! once.
//!
//! Every statement is written once, with numbered parameters (`$1`, `$2`, ..); [`Prepared`]
//! turns it into `?` placeholders for a database that has only those, with the parameter number
//! of each `?`, and [`Binder`] binds a call's parameters in that order (twice where a parameter
//! is used twice).

use futures_util::future::BoxFuture;
use sqlx::SqlStr;
use tower_idempotency_sqlx::table_sql;

use crate::table::{Claimed, JobCounts, JobKey, JobSummary, PageFilter, Table};

/// What a database's driver says about its SQL; [`Statements::new`] builds the texts from it.
#[derive(Clone, Copy, Debug)]
pub struct Dialect {
    /// Appended to a claim's inner `SELECT`: Postgres and MySQL `FOR UPDATE SKIP LOCKED`, so
    /// workers sharing a table take disjoint jobs instead of waiting for each other's locks.
    pub claim_lock: &'static str,
    /// How the key columns' values of a batch are bound: one array per key column.
    pub key_batch: KeyBatch,
    /// How parameters are written.
    pub placeholders: Placeholders,
    /// Whether an `UPDATE` can answer the rows it changed (`RETURNING`). Without it, a claim
    /// and the sweep of spent jobs are a locking `SELECT` and an `UPDATE` of the rows it
    /// picked, in one transaction (`Statements::unreturned`).
    pub returning: bool,
    /// The quote of a column name the half chose (MySQL's backtick: an outbox's `key` is a
    /// reserved word there); empty for none.
    pub quote: &'static str,
    /// A `NULL` the database types as an integer: the status of a table without a status
    /// column.
    pub null_integer: &'static str,
    /// Whether a statement can write in a `WITH` clause (Postgres): a completion and its
    /// attempt's history row are then one statement ([`Driver::complete_recorded`]).
    pub writing_with: bool,
}

/// How a statement receives a batch of keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyBatch {
    /// One `text[]` parameter per key column, paired by position (`unnest`).
    PostgresArrays,
    /// One JSON array of strings per key column, paired by position (`json_each`).
    JsonArrays,
    /// One JSON array of strings per key column, paired by position (`JSON_TABLE .. FOR
    /// ORDINALITY`, MySQL 8.0 and MariaDB 10.6 on).
    JsonTable,
}

/// How a database writes a statement's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placeholders {
    /// `$1`, `$2`, .. by number: a parameter used twice is bound once (Postgres, SQLite).
    Numbered,
    /// `?` by position: each use of a parameter is bound (MySQL, MariaDB).
    Positional,
}

/// One statement's text in its database's placeholder form. Written with numbered parameters
/// (`$1`, `$2`, ..); for [`Placeholders::Positional`] each `$N` becomes `?` and the statement
/// keeps the number each `?` takes, so that [`Binder`] binds them in that order.
#[derive(Clone, Debug)]
pub struct Prepared {
    text: SqlStr,
    order: Option<Box<[usize]>>,
}

impl Prepared {
    /// `text`, whose parameters are numbered (`$1` ..), in the form of `placeholders`.
    pub fn new(text: String, placeholders: Placeholders) -> Self {
        match placeholders {
            Placeholders::Numbered => Self {
                text: table_sql(text),
                order: None,
            },
            Placeholders::Positional => {
                let (text, order) = positional(&text);
                Self {
                    text: table_sql(text),
                    order: Some(order.into_boxed_slice()),
                }
            }
        }
    }

    /// The text as the database receives it.
    pub fn text(&self) -> &SqlStr {
        &self.text
    }

    /// A query of this statement, to bind its parameters in their numbers' order.
    pub fn binder<'q, DB: sqlx::Database>(&'q self) -> Binder<'q, DB> {
        Binder {
            query: sqlx::query(self.text.clone()),
            order: self.order.as_deref(),
            deferred: Vec::new(),
        }
    }
}

/// `text` with each `$N` as `?`, and the `N` of each `?` in order.
fn positional(text: &str) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(text.len());
    let mut order = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        let digits = text[at + c.len_utf8()..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        if c != '$' || digits == 0 {
            out.push(c);
            continue;
        }
        let number = &text[at + 1..at + 1 + digits];
        order.push(number.parse().expect("a parameter number"));
        out.push('?');
        for _ in 0..digits {
            chars.next();
        }
    }
    (out, order)
}

/// One applied parameter of a positional statement.
type Bind<'q, DB> = Box<
    dyn Fn(
            sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>,
        ) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>
        + Send
        + 'q,
>;

/// A [`Prepared`] statement's parameters, given in their numbers' order (`$1` first) and bound
/// in the order its text uses them.
pub struct Binder<'q, DB: sqlx::Database> {
    query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>,
    order: Option<&'q [usize]>,
    deferred: Vec<Bind<'q, DB>>,
}

impl<'q, DB: sqlx::Database> Binder<'q, DB> {
    /// The next parameter (`$1`, then `$2`, ..).
    #[allow(clippy::should_implement_trait)]
    pub fn bind<T>(mut self, value: T) -> Self
    where
        T: sqlx::Encode<'q, DB> + sqlx::Type<DB> + Clone + Send + 'q,
    {
        if self.order.is_some() {
            self.deferred
                .push(Box::new(move |query| query.bind(value.clone())));
        } else {
            self.query = self.query.bind(value);
        }
        self
    }

    /// A job's key columns, as the next parameters.
    pub fn key(mut self, key: &'q JobKey) -> Self
    where
        &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        for part in &key.0 {
            self = self.bind(part.as_str());
        }
        self
    }

    /// A completion's parameters: the job's key, the fencing token, the time, and the status
    /// where `table` keeps one.
    pub fn completion(
        self,
        table: &Table,
        key: &'q JobKey,
        token: i64,
        now: i64,
        status: Option<i32>,
    ) -> Self
    where
        &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        Option<i32>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        let binder = self.key(key).bind(token).bind(now);
        if table.status.is_some() {
            binder.bind(status)
        } else {
            binder
        }
    }

    /// An attempt's history columns, as the next parameters: its number, start, duration,
    /// outcome, error, status and response, in the history table's column order.
    pub fn attempt(self, attempt: &'q crate::Attempt) -> Self
    where
        i16: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        i32: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        Option<i32>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        Option<&'q str>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        self.bind(i32::try_from(attempt.attempt).unwrap_or(i32::MAX))
            .bind(attempt.started_at_ms)
            .bind(i64::try_from(attempt.duration_ms).unwrap_or(i64::MAX))
            .bind(attempt.outcome.code())
            .bind(attempt.error.as_deref())
            .bind(attempt.status)
            .bind(attempt.response.as_deref())
    }

    /// The query with its parameters bound.
    pub fn query(self) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments> {
        let Some(order) = self.order else {
            return self.query;
        };
        let deferred = self.deferred;
        order.iter().fold(self.query, |query, number| {
            match number.checked_sub(1).and_then(|i| deferred.get(i)) {
                Some(bind) => bind(query),
                // Left unbound, the statement fails with the database's count error.
                None => query,
            }
        })
    }
}

/// The prepared texts of one job table's statements on one database. Built once per table.
#[derive(Debug)]
pub struct Statements {
    pub(crate) table: Table,
    pub(crate) claim_due: Prepared,
    pub(crate) claim_keys: Prepared,
    pub(crate) renew: Prepared,
    pub(crate) renew_one: Prepared,
    pub(crate) give_back: Prepared,
    pub(crate) complete: Prepared,
    /// [`Dialect::writing_with`]: the completion and the history row in one statement.
    pub(crate) complete_recorded: Option<Prepared>,
    pub(crate) fail: Prepared,
    pub(crate) exhaust: Prepared,
    pub(crate) due: Prepared,
    pub(crate) due_by_time: Prepared,
    pub(crate) retry: Prepared,
    pub(crate) discard: Prepared,
    pub(crate) purge: Prepared,
    pub(crate) list: Prepared,
    pub(crate) page: Prepared,
    pub(crate) get: Prepared,
    pub(crate) detail: Prepared,
    pub(crate) counts: Prepared,
    pub(crate) group_counts: Prepared,
    pub(crate) oldest_pending: Prepared,
    /// A database without `RETURNING`: what follows the locking `SELECT`s that
    /// `claim_due`, `claim_keys` and `exhaust` are there.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) unreturned: Option<Unreturned>,
    pub(crate) placeholders: Placeholders,
    pub(crate) history: crate::history::HistoryStatements,
    pub(crate) audit: crate::audit::AuditStatements,
    pub(crate) chart: crate::chart::ChartStatements,
    pub(crate) pauses: crate::pauses::PauseStatements,
}

/// The statements that write the rows a locking `SELECT` picked, on a database without
/// `RETURNING`, each over a batch of keys bound as [`KeyBatch`] says.
#[derive(Debug)]
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) struct Unreturned {
    /// `$1` token, `$2` lease end, then the batch: counts an attempt and takes the lease.
    pub(crate) lease: Prepared,
    /// `$1` token, then the batch: the claimed rows, as a claim answers them.
    pub(crate) read: Prepared,
    /// `$1` now, `$2` error, then the batch: fails the spent jobs.
    pub(crate) spend: Prepared,
}

/// A statement of [`Statements`] whose text [`Statements::text`] shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Statement {
    /// [`Driver::claim_due`]: `$1` now, `$2` token, `$3` lease end, `$4` attempts, `$5` limit
    /// (without `RETURNING`: the locking `SELECT` that picks the jobs).
    ClaimDue,
    /// [`Driver::claim_keys`]: `$1` now, one batch per key column, then token, lease end and
    /// attempts (without `RETURNING`: the locking `SELECT` that picks the jobs).
    ClaimKeys,
    /// [`Driver::renew`]: `$1` token, `$2` lease end.
    Renew,
    /// [`Driver::renew_one`]: the key's columns, then token and lease end.
    RenewOne,
    /// [`Driver::due`]: `$1` now, `$2` limit, `$3` attempts.
    Due,
    /// [`Driver::purge`]: `$1` before, `$2` limit.
    Purge,
    /// [`Driver::page`].
    Page,
    /// [`Driver::due_by_time`]: `$1` now, `$2` limit, `$3` attempts.
    DueByTime,
    /// [`Driver::give_back`]: the key's columns, then token.
    GiveBack,
}

/// Pending, due, and not leased by a live worker (`$1` is now): for a half's own statements
/// over due jobs (the inbox's ordered claims).
pub const DUE: &str =
    "state = 0 AND available_at <= $1 AND (lease_until IS NULL OR lease_until <= $1)";
/// [`DUE`] in a statement that names its jobs' keys. `state + 0` keeps the planner on the
/// primary key: without statistics (a table a burst filled before it was analysed) it would
/// otherwise find each key by walking every pending row of a backlog in an index led by `state`.
pub const DUE_BY_KEY: &str =
    "state + 0 = 0 AND available_at <= $1 AND (lease_until IS NULL OR lease_until <= $1)";

/// The last error of a job whose attempts were spent without one recording its end.
pub const SPENT: &str =
    "no attempts remain: the last attempt did not finish (its worker stopped, was killed or lost the lease)";

impl Statements {
    /// The statements of `table` in `dialect`.
    pub fn new(table: Table, dialect: Dialect) -> Self {
        let sql = |text: String| Prepared::new(text, dialect.placeholders);
        let q = dialect.quote;
        let t = table.name.as_str();
        let keys = table.key_list(q);
        let n = table.key.len();
        let payload = table.payload_columns(q);
        let claimed = format!("{keys}, attempts AS job_attempts{payload}");
        let returning = format!("RETURNING {claimed}");
        let lock = dialect.claim_lock;
        let lease = |token: usize, until: usize| {
            format!("attempts = attempts + 1, lease_token = ${token}, lease_until = ${until}")
        };
        // $1 now, $2 token, $3 lease end, $4 attempts, $5 limit.
        let due_pick = format!(
            "SELECT {keys} FROM {t} WHERE {DUE} AND attempts < $4 \
             ORDER BY available_at LIMIT $5{lock}"
        );
        // $1 now, $2.. one batch parameter per key column, then token, lease end, attempts.
        let after = 2 + n;
        let batch = key_batch(&table, dialect.key_batch, 2);
        let keys_pick = format!(
            "SELECT {keys} FROM {t} WHERE ({keys}) IN ({batch}) AND {DUE_BY_KEY} \
             AND attempts < ${}{lock}",
            after + 2,
        );
        // $1 now, $2 max attempts, $3 error.
        let spent = format!("{DUE} AND attempts >= $2");
        let spend = |now: usize, error: usize| {
            format!(
                "state = 2, finished_at = ${now}, last_error = ${error}, \
                 lease_token = NULL, lease_until = NULL"
            )
        };
        // $1 before, $2 limit.
        let purged = "state IN (1, 3) AND finished_at < $1";
        let (claim_due, claim_keys, exhaust, purge, unreturned) = if dialect.returning {
            (
                format!(
                    "UPDATE {t} SET {} WHERE ({keys}) IN ({due_pick}) {returning}",
                    lease(2, 3)
                ),
                format!(
                    "UPDATE {t} SET {} WHERE ({keys}) IN ({keys_pick}) {returning}",
                    lease(after, after + 1)
                ),
                format!(
                    "UPDATE {t} SET {} WHERE {spent} RETURNING {keys}",
                    spend(1, 3)
                ),
                format!(
                    "DELETE FROM {t} WHERE ({keys}) IN (SELECT {keys} FROM {t} \
                     WHERE {purged} ORDER BY finished_at LIMIT $2)"
                ),
                None,
            )
        } else {
            // The rows a locking `SELECT` picked, joined by key (a join, not `IN`: MariaDB
            // walks the whole table for an `UPDATE .. WHERE .. IN (subquery)`).
            let join = |first: usize| {
                let on: Vec<String> = table
                    .key
                    .iter()
                    .enumerate()
                    .map(|(i, column)| format!("{t}.{q}{column}{q} = b.job_k{i}"))
                    .collect();
                format!(
                    "{t} JOIN ({}) AS b ON {}",
                    key_batch(&table, dialect.key_batch, first),
                    on.join(" AND ")
                )
            };
            (
                due_pick,
                keys_pick,
                format!("SELECT {keys} FROM {t} WHERE {spent}{lock}"),
                format!("DELETE FROM {t} WHERE {purged} ORDER BY finished_at LIMIT $2"),
                Some(Unreturned {
                    lease: sql(format!("UPDATE {} SET {}", join(3), lease(1, 2))),
                    read: sql(format!(
                        "SELECT {claimed} FROM {} WHERE lease_token = $1",
                        join(2)
                    )),
                    spend: sql(format!("UPDATE {} SET {}", join(3), spend(1, 2))),
                }),
            )
        };
        let by_key = table.key_match(1, q);
        let k = n + 1; // the first parameter after a key
        let status_set = |param: usize| {
            table
                .status
                .map(|column| format!("{q}{column}{q} = ${param}, "))
                .unwrap_or_default()
        };
        let summary = table.summary_columns(q, dialect.null_integer);
        let detail_columns: String = table
            .payload
            .iter()
            .filter(|c| !table.key.contains(c) && !table.summary.contains(c))
            .map(|c| format!(", {q}{c}{q}"))
            .collect();
        let group = match table.group {
            Some(column) => format!("($2 IS NULL OR {q}{column}{q} = $2)"),
            None => "$2 IS NULL".to_owned(),
        };
        let created = format!("{q}{}{q}", table.created);
        let after_keys: Vec<String> = (0..n).map(|i| format!("${}", 6 + i)).collect();
        let page_limit = 6 + n;
        let complete = format!(
            "UPDATE {t} SET state = 1, finished_at = ${}, {}last_error = NULL, \
             lease_token = NULL, lease_until = NULL WHERE {by_key} AND lease_token = ${k}",
            k + 1,
            status_set(k + 2),
        );
        let order_desc: Vec<String> = table
            .key
            .iter()
            .map(|c| format!("{q}{c}{q} DESC"))
            .collect();
        Self {
            claim_due: sql(claim_due),
            claim_keys: sql(claim_keys),
            renew: sql(format!(
                "UPDATE {t} SET lease_until = $2 WHERE state = 0 AND lease_token = $1"
            )),
            renew_one: sql(format!(
                "UPDATE {t} SET lease_until = ${} \
                 WHERE {by_key} AND lease_token = ${k} AND state + 0 = 0",
                k + 1
            )),
            // $k token.
            give_back: sql(format!(
                "UPDATE {t} SET attempts = attempts - 1, lease_token = NULL, lease_until = NULL \
                 WHERE {by_key} AND lease_token = ${k} AND state + 0 = 0"
            )),
            // $k token, $k+1 now, $k+2 status.
            complete: sql(complete.clone()),
            // The completion's parameters, then the history row's seven.
            complete_recorded: dialect.writing_with.then(|| {
                let first = k + 2 + usize::from(table.status.is_some());
                let values: Vec<String> = (first..first + 7).map(|i| format!("${i}")).collect();
                let keys_bound: Vec<String> = (1..=n).map(|i| format!("${i}")).collect();
                sql(format!(
                    "WITH done AS ({complete} RETURNING 1) INSERT INTO {} ({keys}, attempt, \
                     started_at, duration_ms, outcome, error, status, response) SELECT {}, {} \
                     FROM done",
                    crate::history::history_table(&table),
                    keys_bound.join(", "),
                    values.join(", "),
                ))
            }),
            // $k token, $k+1 now, $k+2 max attempts, $k+3 retry at, $k+4 error, $k+5 status.
            fail: sql(format!(
                "UPDATE {t} SET \
                 state = CASE WHEN attempts >= ${max} THEN 2 ELSE 0 END, \
                 finished_at = CASE WHEN attempts >= ${max} THEN ${now} ELSE NULL END, \
                 available_at = ${at}, {}last_error = ${err}, \
                 lease_token = NULL, lease_until = NULL WHERE {by_key} AND lease_token = ${k}",
                status_set(k + 5),
                now = k + 1,
                max = k + 2,
                at = k + 3,
                err = k + 4,
            )),
            exhaust: sql(exhaust),
            // Retries and recovered jobs first: fresh ones are usually claimed already. The
            // order is not the due index's, so this reads every due job.
            due: sql(format!(
                "SELECT {keys} FROM {t} WHERE {DUE} AND attempts < $3 \
                 ORDER BY attempts = 0, available_at LIMIT $2"
            )),
            // In the due index's order, stopping at the limit.
            due_by_time: sql(format!(
                "SELECT {keys} FROM {t} WHERE {DUE} AND attempts < $3 \
                 ORDER BY available_at LIMIT $2"
            )),
            retry: sql(format!(
                "UPDATE {t} SET state = 0, attempts = 0, available_at = ${k}, \
                 finished_at = NULL, last_error = NULL, lease_token = NULL, lease_until = NULL \
                 WHERE {by_key} AND state = 2"
            )),
            discard: sql(format!(
                "UPDATE {t} SET state = 3, finished_at = ${k}, \
                 lease_token = NULL, lease_until = NULL WHERE {by_key} AND (state = 2 OR \
                 (state = 0 AND (lease_until IS NULL OR lease_until <= ${k})))"
            )),
            purge: sql(purge),
            list: sql(format!(
                "SELECT {summary} FROM {t} WHERE state = $1 ORDER BY {created}, {keys} LIMIT $2"
            )),
            page: sql(format!(
                "SELECT {summary} FROM {t} WHERE ($1 IS NULL OR state = $1) AND {group} \
                 AND ($3 IS NULL OR {created} >= $3) AND ($4 IS NULL OR {created} < $4) \
                 AND ($5 IS NULL OR ({created}, {keys}) < ($5, {})) \
                 ORDER BY {created} DESC, {} LIMIT ${page_limit}",
                after_keys.join(", "),
                order_desc.join(", "),
            )),
            get: sql(format!("SELECT {summary} FROM {t} WHERE {by_key}")),
            detail: sql(format!(
                "SELECT {summary}{detail_columns} FROM {t} WHERE {by_key}"
            )),
            counts: sql(format!("SELECT state, count(*) FROM {t} GROUP BY state")),
            group_counts: sql(match table.group {
                Some(column) => format!(
                    "SELECT {q}{column}{q}, state, count(*) FROM {t} \
                     GROUP BY {q}{column}{q}, state ORDER BY {q}{column}{q}, state"
                ),
                None => {
                    format!("SELECT '', state, count(*) FROM {t} GROUP BY state ORDER BY state")
                }
            }),
            oldest_pending: sql(format!("SELECT min({created}) FROM {t} WHERE state = 0")),
            unreturned,
            placeholders: dialect.placeholders,
            history: crate::history::HistoryStatements::new(&table, dialect),
            audit: crate::audit::AuditStatements::new(&table, dialect),
            chart: crate::chart::ChartStatements::new(&table, dialect),
            pauses: crate::pauses::PauseStatements::new(&table, dialect),
            table,
        }
    }

    /// The table these statements are for.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// Whether [`Driver::complete_recorded`] is one statement here ([`Dialect::writing_with`]).
    pub fn completes_with_history(&self) -> bool {
        self.complete_recorded.is_some()
    }

    /// How these statements write their parameters: the form a half's own statements beside
    /// them take ([`Prepared::new`]).
    pub fn placeholders(&self) -> Placeholders {
        self.placeholders
    }

    /// The text of one statement, to show or to explain (a query plan test).
    pub fn text(&self, which: Statement) -> &SqlStr {
        match which {
            Statement::ClaimDue => self.claim_due.text(),
            Statement::ClaimKeys => self.claim_keys.text(),
            Statement::Renew => self.renew.text(),
            Statement::RenewOne => self.renew_one.text(),
            Statement::Due => self.due.text(),
            Statement::DueByTime => self.due_by_time.text(),
            Statement::GiveBack => self.give_back.text(),
            Statement::Purge => self.purge.text(),
            Statement::Page => self.page.text(),
        }
    }
}

/// The rows of a batch of keys bound from parameter `first` on: `SELECT k1, k2 FROM ..`.
fn key_batch(table: &Table, batch: KeyBatch, first: usize) -> String {
    let n = table.key.len();
    match batch {
        KeyBatch::PostgresArrays => {
            let columns: Vec<String> = (0..n).map(|i| format!("x.k{i} COLLATE \"C\"")).collect();
            // Each array behind a sub-select: a plan made for its values knows the batch's
            // length, so it always looked cheaper than the statement's generic plan (which
            // assumes ten keys) and Postgres planned every claim anew; hidden from both, the
            // two cost the same and the generic plan (the same lookups by primary key) is kept.
            let arrays: Vec<String> = (0..n)
                .map(|i| format!("(SELECT ${}::text[])", first + i))
                .collect();
            let names: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
            format!(
                "SELECT {} FROM unnest({}) AS x({})",
                columns.join(", "),
                arrays.join(", "),
                names.join(", ")
            )
        }
        KeyBatch::JsonArrays => {
            let columns: Vec<String> = (0..n).map(|i| format!("k{i}.value")).collect();
            let mut from = format!("json_each(${first}) AS k0");
            for i in 1..n {
                from.push_str(&format!(
                    " JOIN json_each(${}) AS k{i} ON k{i}.key = k0.key",
                    first + i
                ));
            }
            format!("SELECT {} FROM {from}", columns.join(", "))
        }
        KeyBatch::JsonTable => {
            // Compared under the key column's collation (the column's is the stronger).
            let table = |param: usize| {
                format!(
                    "JSON_TABLE(${param}, '$[*]' COLUMNS \
                     (n FOR ORDINALITY, v TEXT PATH '$'))"
                )
            };
            let columns: Vec<String> = (0..n).map(|i| format!("k{i}.v AS job_k{i}")).collect();
            let mut from = format!("{} AS k0", table(first));
            for i in 1..n {
                from.push_str(&format!(
                    " JOIN {} AS k{i} ON k{i}.n = k0.n",
                    table(first + i)
                ));
            }
            format!("SELECT {} FROM {from}", columns.join(", "))
        }
    }
}

/// One job with its payload, as [`Driver::detail`] reads it.
pub type Detail<S, P> = (JobSummary<S>, P);

/// A job table's statements on one database: [`sqlx::Postgres`] (feature `postgres`),
/// [`sqlx::Sqlite`] (feature `sqlite`) and `sqlx::MySql` (feature `mysql`: MySQL 8.0+,
/// MariaDB 10.6+). A database's folder implements it with
/// `driver_calls!`; [`jobs_driver_conformance_tests!`](crate::jobs_driver_conformance_tests)
/// checks an implementation.
///
/// Times are unix milliseconds; leases are fenced by a claim's random token, so a worker whose
/// lease ended can no longer record an outcome.
pub trait Driver: sqlx::Database + Sized {
    /// The engine's columns in this database's `CREATE TABLE`, to put beside a half's own.
    const JOB_COLUMNS: &'static str;

    /// How a transaction that writes starts: SQLite `BEGIN IMMEDIATE` (the write lock from the
    /// start: a deferred transaction that read first could not upgrade after another
    /// connection's commit), `BEGIN` elsewhere.
    const BEGIN_WRITE: &'static str;

    /// Jobs a worker runs at once unless told otherwise: 16 on Postgres and MySQL, whose
    /// commits of many connections proceed side by side; 4 on SQLite, whose writers take one
    /// lock in turn.
    const CONCURRENCY: usize;

    /// The history table's sequence column, its primary key ([`history`](crate::history)).
    const HISTORY_SEQ: &'static str;

    /// The type of the history table's key columns.
    const HISTORY_KEY_TYPE: &'static str;

    /// The quote of the history table's key column names ([`Dialect::quote`]).
    const HISTORY_QUOTE: &'static str = "";

    /// The history table's columns after its key: `attempt`, `started_at`, `duration_ms`,
    /// `outcome`, `error`, `status`, `response`.
    const HISTORY_COLUMNS: &'static str;

    /// The DDL of `table`'s attempt history table (`{table}_attempts`) and its index, to run
    /// after the job table's.
    fn history_schema(table: &Table) -> String {
        crate::history::schema::<Self>(table)
    }

    /// The audit table's columns after its sequence: `at`, `who`, `action`, `target`,
    /// `changed` ([`audit`](crate::audit)).
    const AUDIT_COLUMNS: &'static str;

    /// The DDL of `table`'s audit table (`{table}_audit`), to run after the job table's.
    fn audit_schema(table: &Table) -> String {
        crate::audit::schema::<Self>(table)
    }

    /// The DDL of `table`'s pauses table (`{table}_pauses`, [`pauses`](crate::pauses)), to run
    /// after the job table's.
    fn pauses_schema(table: &Table) -> String {
        crate::pauses::schema::<Self>(table)
    }

    /// This database's statements for `table`.
    fn statements(table: Table) -> Statements;

    /// The writer gate of `pool`'s database ([`gate`](crate::gate)): on SQLite its file's, one
    /// per file in this process; `None` on databases whose writers proceed side by side.
    fn write_gate(_pool: &sqlx::Pool<Self>) -> Option<std::sync::Arc<crate::WriteGate>> {
        None
    }

    /// The due-index DDL of `table` (`{table}_due_idx` on state and due time); empty on MySQL,
    /// whose [`JOB_COLUMNS`](Self::JOB_COLUMNS) declare it.
    fn due_index(table: &str) -> String {
        format!("CREATE INDEX IF NOT EXISTS {table}_due_idx ON {table} (state, available_at);\n")
    }

    /// Claims up to `limit` due jobs whose attempts are below `max_attempts`, oldest due first,
    /// under `token` until `lease_until`; each claim counts an attempt.
    #[allow(clippy::too_many_arguments)]
    fn claim_due<'a, P>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        now: i64,
        token: i64,
        lease_until: i64,
        max_attempts: i32,
        limit: i64,
    ) -> BoxFuture<'a, sqlx::Result<Vec<Claimed<P>>>>
    where
        P: for<'r> sqlx::FromRow<'r, Self::Row> + Send + Unpin + 'a;

    /// Claims those of `keys` (distinct) that are due with attempts below `max_attempts`, in
    /// one statement, under `token` until `lease_until`.
    #[allow(clippy::too_many_arguments)]
    fn claim_keys<'a, P>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        keys: &'a [JobKey],
        now: i64,
        token: i64,
        lease_until: i64,
        max_attempts: i32,
    ) -> BoxFuture<'a, sqlx::Result<Vec<Claimed<P>>>>
    where
        P: for<'r> sqlx::FromRow<'r, Self::Row> + Send + Unpin + 'a;

    /// Extends every running job claimed under `token` to `lease_until`; answers how many.
    fn renew<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        token: i64,
        lease_until: i64,
    ) -> BoxFuture<'a, sqlx::Result<u64>>;

    /// Extends one job's claim of `token` to `lease_until`; `false` when it is no longer held.
    fn renew_one<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        key: &'a JobKey,
        token: i64,
        lease_until: i64,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// Marks a claimed job done on `conn` (a pool connection, or a transaction's, so that the
    /// job's effects and its completion commit together), fenced by `token`.
    fn complete<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a Statements,
        key: &'a JobKey,
        token: i64,
        now: i64,
        status: Option<i32>,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// [`complete`](Self::complete), then records `attempt` in the job's history as
    /// [`record_attempt`](Self::record_attempt) does, when the completion took effect: in one
    /// statement where the dialect can write in a `WITH` clause ([`Dialect::writing_with`]),
    /// else in two on `conn`.
    #[allow(clippy::too_many_arguments)]
    fn complete_recorded<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a Statements,
        key: &'a JobKey,
        token: i64,
        now: i64,
        status: Option<i32>,
        attempt: &'a crate::Attempt,
        keep_last: u32,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// Records a failed attempt, fenced by `token`: pending until `retry_at`, or failed when
    /// `attempts >= max_attempts` (0: failed whatever the count).
    #[allow(clippy::too_many_arguments)]
    fn fail<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        key: &'a JobKey,
        token: i64,
        now: i64,
        max_attempts: i32,
        retry_at: i64,
        error: &'a str,
        status: Option<i32>,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// Fails the due jobs whose attempts are spent (an attempt that never recorded its end:
    /// its worker crashed or lost the lease); answers their keys.
    fn exhaust<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        now: i64,
        max_attempts: i32,
    ) -> BoxFuture<'a, sqlx::Result<Vec<JobKey>>>;

    /// Up to `limit` keys of due jobs with attempts below `max_attempts`: retries and
    /// recovered jobs first, then by due time. That order is not the due index's: the statement
    /// reads every due job, however few it answers.
    fn due<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        now: i64,
        limit: i64,
        max_attempts: i32,
    ) -> BoxFuture<'a, sqlx::Result<Vec<JobKey>>>;

    /// Up to `limit` keys of due jobs with attempts below `max_attempts`, by due time: read in
    /// the due index's order, stopping at `limit`, so that sweeping a backlog `limit` jobs at a
    /// time does not read all of it at each sweep. By default [`Driver::due`].
    fn due_by_time<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        now: i64,
        limit: i64,
        max_attempts: i32,
    ) -> BoxFuture<'a, sqlx::Result<Vec<JobKey>>> {
        Self::due(pool, sql, now, limit, max_attempts)
    }

    /// Gives back the claim of `token` on the job `key` before its attempt started (a worker
    /// that claimed it ahead of a free handler, then stopped): the attempt the claim counted is
    /// returned and the lease freed, so the job is due again at once; `false` when the claim is
    /// no longer held. By default `false` without a statement: the job then waits for its lease
    /// to end, its attempt spent.
    fn give_back<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        key: &'a JobKey,
        token: i64,
    ) -> BoxFuture<'a, sqlx::Result<bool>> {
        let _ = (pool, sql, key, token);
        Box::pin(std::future::ready(Ok(false)))
    }

    /// Puts a failed job back to pending with no attempts, due at `now`; `false` when it is
    /// not failed.
    fn retry<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        key: &'a JobKey,
        now: i64,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// Marks a failed job, or a pending one no worker holds, discarded; `false` when there is
    /// no such job.
    fn discard<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        key: &'a JobKey,
        now: i64,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// Deletes up to `limit` done or discarded jobs finished before `before`, oldest first;
    /// answers how many.
    fn purge<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        before: i64,
        limit: i64,
    ) -> BoxFuture<'a, sqlx::Result<u64>>;

    /// Up to `limit` jobs in `state`, oldest enqueued first (then by key).
    fn list<'a, S>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        state: crate::JobState,
        limit: i64,
    ) -> BoxFuture<'a, sqlx::Result<Vec<JobSummary<S>>>>
    where
        S: for<'r> sqlx::FromRow<'r, Self::Row> + Send + Unpin + 'a;

    /// Up to `limit` jobs matching `filter`, newest enqueued first (then by key, descending).
    fn page<'a, S>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        filter: &'a PageFilter,
        limit: i64,
    ) -> BoxFuture<'a, sqlx::Result<Vec<JobSummary<S>>>>
    where
        S: for<'r> sqlx::FromRow<'r, Self::Row> + Send + Unpin + 'a;

    /// One job.
    fn get<'a, S>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        key: &'a JobKey,
    ) -> BoxFuture<'a, sqlx::Result<Option<JobSummary<S>>>>
    where
        S: for<'r> sqlx::FromRow<'r, Self::Row> + Send + Unpin + 'a;

    /// One job with its payload.
    fn detail<'a, S, P>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        key: &'a JobKey,
    ) -> BoxFuture<'a, sqlx::Result<Option<Detail<S, P>>>>
    where
        S: for<'r> sqlx::FromRow<'r, Self::Row> + Send + Unpin + 'a,
        P: for<'r> sqlx::FromRow<'r, Self::Row> + Send + Unpin + 'a;

    /// How many jobs are in each state.
    fn counts<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
    ) -> BoxFuture<'a, sqlx::Result<JobCounts>>;

    /// How many jobs of each [`Table::group`] value are in each state, by group then state
    /// (one group, `""`, for a table without one).
    fn group_counts<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
    ) -> BoxFuture<'a, sqlx::Result<Vec<(String, crate::JobState, u64)>>>;

    /// The enqueue time of the oldest pending job, unix ms.
    fn oldest_pending<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
    ) -> BoxFuture<'a, sqlx::Result<Option<i64>>>;

    /// The table's activity per minute over the hour up to `now` ([`chart`](crate::chart)).
    fn activity<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        now: i64,
    ) -> BoxFuture<'a, sqlx::Result<crate::chart::Activity>>;

    /// Records one attempt of the job `key` on `conn` (inside the attempt's transaction, or on
    /// its own); an attempt numbered past `keep_last` then deletes the job's rows but its first
    /// and its newest `keep_last`.
    fn record_attempt<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a Statements,
        key: &'a JobKey,
        attempt: &'a crate::Attempt,
        keep_last: u32,
    ) -> BoxFuture<'a, sqlx::Result<()>>;

    /// The recorded attempts of the job `key`, oldest first.
    fn attempts<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        key: &'a JobKey,
    ) -> BoxFuture<'a, sqlx::Result<Vec<crate::Attempt>>>;

    /// Deletes up to `limit` attempt rows whose job is gone (purged or deleted); answers how
    /// many.
    fn purge_attempts<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        limit: i64,
    ) -> BoxFuture<'a, sqlx::Result<u64>>;

    /// Stores one audit entry ([`audit::record`](crate::audit::record) logs it too).
    fn record_audit<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        entry: &'a crate::audit::AuditEntry,
    ) -> BoxFuture<'a, sqlx::Result<()>>;

    /// The newest `limit` audit entries, newest first.
    fn audit_log<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        limit: i64,
    ) -> BoxFuture<'a, sqlx::Result<Vec<crate::audit::AuditEntry>>>;

    /// Pauses `scope` at `now` by `by`; `false` when it was paused already (the first pause
    /// stays).
    fn pause<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        scope: &'a str,
        now: i64,
        by: &'a str,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// Resumes `scope` and makes the table's parked jobs due at `now`, in one transaction;
    /// `false` when it was not paused.
    fn resume<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        scope: &'a str,
        now: i64,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// The table's pauses, by scope.
    fn pauses<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
    ) -> BoxFuture<'a, sqlx::Result<Vec<crate::pauses::Pause>>>;

    /// Parks the job `key` claimed under `token` while `scope` is paused: gives its attempt
    /// back, frees its lease and makes it due at [`PARKED_AT`](crate::pauses::PARKED_AT);
    /// `false` when the claim is no longer held or `scope` is no longer paused.
    fn park<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        key: &'a JobKey,
        token: i64,
        scope: &'a str,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// Makes every parked job of the table due at `now`; answers how many.
    fn unpark<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        now: i64,
    ) -> BoxFuture<'a, sqlx::Result<u64>>;

    /// Runs `script`, several statements without parameters (a half's DDL).
    fn run_script<'a>(
        pool: &'a sqlx::Pool<Self>,
        script: &'a str,
    ) -> BoxFuture<'a, sqlx::Result<()>>;
}

/// Writes the typed calls of [`Driver`] for a database `$db` whose key batches are bound with
/// `$keys` (`fn(&[JobKey], usize) -> T` for key column `i`, `T` bindable). Used by each
/// database's folder; every text comes from its [`Statements`].
///
/// Inside `impl Driver for MyDatabase { .. }`, after the consts and `statements`:
/// `tower_idempotency_jobs::driver_calls!(MyDatabase, key_column);`, where `key_column` binds
/// key column `i` of a batch of keys in the form the dialect's [`KeyBatch`] reads.
/// A database without `RETURNING` ([`Dialect::returning`] `false`) writes `claim_due`,
/// `claim_keys` and `exhaust` itself and invokes
/// `driver_calls!(MyDatabase, key_column, unreturned)` for the rest.
#[macro_export]
macro_rules! driver_calls {
    ($db:ty, $keys:path) => {
        $crate::driver_calls!(@returning $db, $keys);
        $crate::driver_calls!(@common $db, $keys);
    };
    // A database without `RETURNING` writes `claim_due`, `claim_keys` and `exhaust` itself.
    ($db:ty, $keys:path, unreturned) => {
        $crate::driver_calls!(@common $db, $keys);
    };
    // `Driver::due` and `Driver::due_by_time`: the keys of `sql.$statement`'s rows.
    (@due $db:ty, $statement:ident) => {
        fn $statement<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            now: i64,
            limit: i64,
            max_attempts: i32,
        ) -> $crate::BoxFuture<'a, sqlx::Result<Vec<$crate::JobKey>>> {
            Box::pin(async move {
                let rows = sql.$statement.binder::<$db>()
                    .bind(now)
                    .bind(limit)
                    .bind(max_attempts)
                    .query()
                    .fetch_all(pool)
                    .await?;
                rows.iter()
                    .map(|row| $crate::driver::key(sql.table(), row))
                    .collect()
            })
        }
    };
    // A write to one job by its key, the statement named as the call, with the given `i64`
    // parameters after the key's columns, behind the writer gate; `true` when it changed the job.
    (@keyed $db:ty, $statement:ident, $($param:ident),+) => {
        fn $statement<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            key: &'a $crate::JobKey,
            $($param: i64),+
        ) -> $crate::BoxFuture<'a, sqlx::Result<bool>> {
            Box::pin(async move {
                let _turn = $crate::gate::turn::<$db>(pool).await;
                let query = sql.$statement.binder::<$db>().key(key);
                $(let query = query.bind($param);)+
                Ok(query.query().execute(pool).await?.rows_affected() == 1)
            })
        }
    };
    (@returning $db:ty, $keys:path) => {
        fn claim_due<'a, P>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            now: i64,
            token: i64,
            lease_until: i64,
            max_attempts: i32,
            limit: i64,
        ) -> $crate::BoxFuture<'a, sqlx::Result<Vec<$crate::Claimed<P>>>>
        where
            P: for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row> + Send + Unpin + 'a,
        {
            Box::pin(async move {
                let _turn = $crate::gate::turn::<$db>(pool).await;
                let rows = sql.claim_due.binder::<$db>()
                    .bind(now)
                    .bind(token)
                    .bind(lease_until)
                    .bind(max_attempts)
                    .bind(limit)
                    .query()
                    .fetch_all(pool)
                    .await?;
                rows.iter()
                    .map(|row| $crate::driver::claimed(sql.table(), row))
                    .collect()
            })
        }

        fn claim_keys<'a, P>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            keys: &'a [$crate::JobKey],
            now: i64,
            token: i64,
            lease_until: i64,
            max_attempts: i32,
        ) -> $crate::BoxFuture<'a, sqlx::Result<Vec<$crate::Claimed<P>>>>
        where
            P: for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row> + Send + Unpin + 'a,
        {
            Box::pin(async move {
                let _turn = $crate::gate::turn::<$db>(pool).await;
                let mut query = sql.claim_keys.binder::<$db>().bind(now);
                for column in 0..sql.table().key.len() {
                    query = query.bind($keys(keys, column));
                }
                let rows = query
                    .bind(token)
                    .bind(lease_until)
                    .bind(max_attempts)
                    .query()
                    .fetch_all(pool)
                    .await?;
                rows.iter()
                    .map(|row| $crate::driver::claimed(sql.table(), row))
                    .collect()
            })
        }

        fn exhaust<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            now: i64,
            max_attempts: i32,
        ) -> $crate::BoxFuture<'a, sqlx::Result<Vec<$crate::JobKey>>> {
            Box::pin(async move {
                let _turn = $crate::gate::turn::<$db>(pool).await;
                let rows = sql.exhaust.binder::<$db>()
                    .bind(now)
                    .bind(max_attempts)
                    .bind($crate::driver::SPENT)
                    .query()
                    .fetch_all(pool)
                    .await?;
                rows.iter()
                    .map(|row| $crate::driver::key(sql.table(), row))
                    .collect()
            })
        }

    };
    (@common $db:ty, $keys:path) => {
        fn renew<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            token: i64,
            lease_until: i64,
        ) -> $crate::BoxFuture<'a, sqlx::Result<u64>> {
            Box::pin(async move {
                let _turn = $crate::gate::turn::<$db>(pool).await;
                let done = sql.renew.binder::<$db>()
                    .bind(token)
                    .bind(lease_until)
                    .query()
                    .execute(pool)
                    .await?;
                Ok(done.rows_affected())
            })
        }

        $crate::driver_calls!(@keyed $db, renew_one, token, lease_until);

        $crate::driver_calls!(@keyed $db, give_back, token);

        fn complete<'a>(
            conn: &'a mut Self::Connection,
            sql: &'a $crate::Statements,
            key: &'a $crate::JobKey,
            token: i64,
            now: i64,
            status: Option<i32>,
        ) -> $crate::BoxFuture<'a, sqlx::Result<bool>> {
            Box::pin(async move {
                let query = sql.complete.binder::<$db>();
                let query = query.completion(sql.table(), key, token, now, status);
                Ok(query.query().execute(conn).await?.rows_affected() == 1)
            })
        }

        #[allow(clippy::too_many_arguments)]
        fn complete_recorded<'a>(
            conn: &'a mut Self::Connection,
            sql: &'a $crate::Statements,
            key: &'a $crate::JobKey,
            token: i64,
            now: i64,
            status: Option<i32>,
            attempt: &'a $crate::Attempt,
            keep_last: u32,
        ) -> $crate::BoxFuture<'a, sqlx::Result<bool>> {
            Box::pin(async move {
                let Some(statement) = &sql.complete_recorded else {
                    if !Self::complete(&mut *conn, sql, key, token, now, status).await? {
                        return Ok(false);
                    }
                    Self::record_attempt(&mut *conn, sql, key, attempt, keep_last).await?;
                    return Ok(true);
                };
                let query = statement.binder::<$db>();
                let done = query
                    .completion(sql.table(), key, token, now, status)
                    .attempt(attempt)
                    .query()
                    .execute(&mut *conn)
                    .await?
                    .rows_affected()
                    == 1;
                // Only an attempt past the newest kept can leave a row to delete.
                if done && attempt.attempt > keep_last {
                    let trim = sql.history.trim.binder::<$db>().key(key);
                    trim.bind(i64::from(keep_last))
                        .query()
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(done)
            })
        }

        fn fail<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            key: &'a $crate::JobKey,
            token: i64,
            now: i64,
            max_attempts: i32,
            retry_at: i64,
            error: &'a str,
            status: Option<i32>,
        ) -> $crate::BoxFuture<'a, sqlx::Result<bool>> {
            Box::pin(async move {
                let _turn = $crate::gate::turn::<$db>(pool).await;
                let mut query = sql.fail.binder::<$db>().key(key);
                query = query
                    .bind(token)
                    .bind(now)
                    .bind(max_attempts)
                    .bind(retry_at)
                    .bind(error);
                if sql.table().status.is_some() {
                    query = query.bind(status);
                }
                Ok(query.query().execute(pool).await?.rows_affected() == 1)
            })
        }

        $crate::driver_calls!(@due $db, due);
        $crate::driver_calls!(@due $db, due_by_time);

        $crate::driver_calls!(@keyed $db, retry, now);

        $crate::driver_calls!(@keyed $db, discard, now);

        fn purge<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            before: i64,
            limit: i64,
        ) -> $crate::BoxFuture<'a, sqlx::Result<u64>> {
            Box::pin(async move {
                let _turn = $crate::gate::turn::<$db>(pool).await;
                let done = sql.purge.binder::<$db>()
                    .bind(before)
                    .bind(limit)
                    .query()
                    .execute(pool)
                    .await?;
                Ok(done.rows_affected())
            })
        }

        fn list<'a, S>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            state: $crate::JobState,
            limit: i64,
        ) -> $crate::BoxFuture<'a, sqlx::Result<Vec<$crate::JobSummary<S>>>>
        where
            S: for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row> + Send + Unpin + 'a,
        {
            Box::pin(async move {
                let rows = sql.list.binder::<$db>()
                    .bind(state.code())
                    .bind(limit)
                    .query()
                    .fetch_all(pool)
                    .await?;
                rows.iter()
                    .map(|row| $crate::driver::summary(sql.table(), row))
                    .collect()
            })
        }

        fn page<'a, S>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            filter: &'a $crate::PageFilter,
            limit: i64,
        ) -> $crate::BoxFuture<'a, sqlx::Result<Vec<$crate::JobSummary<S>>>>
        where
            S: for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row> + Send + Unpin + 'a,
        {
            Box::pin(async move {
                let (after_at, after_key) = match &filter.after {
                    Some((at, key)) => (Some(*at), Some(key)),
                    None => (None, None),
                };
                let mut query = sql.page.binder::<$db>()
                    .bind(filter.state.map($crate::JobState::code))
                    .bind(filter.group.as_deref())
                    .bind(filter.from_ms)
                    .bind(filter.until_ms)
                    .bind(after_at);
                for column in 0..sql.table().key.len() {
                    query = query.bind(after_key.map(|key| key.part(column)));
                }
                let rows = query.bind(limit).query().fetch_all(pool).await?;
                rows.iter()
                    .map(|row| $crate::driver::summary(sql.table(), row))
                    .collect()
            })
        }

        fn get<'a, S>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            key: &'a $crate::JobKey,
        ) -> $crate::BoxFuture<'a, sqlx::Result<Option<$crate::JobSummary<S>>>>
        where
            S: for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row> + Send + Unpin + 'a,
        {
            Box::pin(async move {
                let query = sql.get.binder::<$db>().key(key);
                let row = query.query().fetch_optional(pool).await?;
                row.map(|row| $crate::driver::summary(sql.table(), &row))
                    .transpose()
            })
        }

        fn detail<'a, S, P>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            key: &'a $crate::JobKey,
        ) -> $crate::BoxFuture<'a, sqlx::Result<Option<$crate::driver::Detail<S, P>>>>
        where
            S: for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row> + Send + Unpin + 'a,
            P: for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row> + Send + Unpin + 'a,
        {
            Box::pin(async move {
                let query = sql.detail.binder::<$db>().key(key);
                let Some(row) = query.query().fetch_optional(pool).await? else {
                    return Ok(None);
                };
                let summary = $crate::driver::summary(sql.table(), &row)?;
                Ok(Some((summary, P::from_row(&row)?)))
            })
        }

        fn counts<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
        ) -> $crate::BoxFuture<'a, sqlx::Result<$crate::JobCounts>> {
            Box::pin(async move {
                let rows: Vec<(i16, i64)> =
                    sqlx::query_as(sql.counts.text().clone()).fetch_all(pool).await?;
                Ok($crate::driver::counts(rows))
            })
        }

        fn group_counts<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
        ) -> $crate::BoxFuture<'a, sqlx::Result<Vec<(String, $crate::JobState, u64)>>> {
            Box::pin(async move {
                let rows: Vec<(String, i16, i64)> = sqlx::query_as(sql.group_counts.text().clone())
                    .fetch_all(pool)
                    .await?;
                Ok(rows
                    .into_iter()
                    .map(|(group, state, count)| {
                        let count = u64::try_from(count).unwrap_or(0);
                        (group, $crate::JobState::from_code(state), count)
                    })
                    .collect())
            })
        }

        fn oldest_pending<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
        ) -> $crate::BoxFuture<'a, sqlx::Result<Option<i64>>> {
            Box::pin(async move {
                sqlx::query_scalar(sql.oldest_pending.text().clone())
                    .fetch_one(pool)
                    .await
            })
        }

        fn activity<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            now: i64,
        ) -> $crate::BoxFuture<'a, sqlx::Result<$crate::chart::Activity>> {
            Box::pin(async move {
                let start = $crate::chart::window_start(now);
                let rows = sql.chart.received.binder::<$db>()
                    .bind(start)
                    .query()
                    .fetch_all(pool)
                    .await?;
                let received = rows
                    .iter()
                    .map(sqlx::FromRow::from_row)
                    .collect::<sqlx::Result<Vec<$crate::chart::ReceivedRow>>>()?;
                let rows = sql.chart.finished.binder::<$db>()
                    .bind(start)
                    .query()
                    .fetch_all(pool)
                    .await?;
                let finished = rows
                    .iter()
                    .map(sqlx::FromRow::from_row)
                    .collect::<sqlx::Result<Vec<$crate::chart::FinishedRow>>>()?;
                let oldest: Option<i64> = sqlx::query_scalar(sql.oldest_pending.text().clone())
                    .fetch_one(pool)
                    .await?;
                Ok($crate::chart::assemble(now, received, finished, oldest))
            })
        }

        fn record_attempt<'a>(
            conn: &'a mut Self::Connection,
            sql: &'a $crate::Statements,
            key: &'a $crate::JobKey,
            attempt: &'a $crate::Attempt,
            keep_last: u32,
        ) -> $crate::BoxFuture<'a, sqlx::Result<()>> {
            Box::pin(async move {
                let insert = sql.history.insert.binder::<$db>().key(key);
                insert
                    .attempt(attempt)
                    .query()
                    .execute(&mut *conn)
                    .await?;
                // Only an attempt past the newest kept can leave a row to delete.
                if attempt.attempt > keep_last {
                    let trim = sql.history.trim.binder::<$db>().key(key);
                    trim.bind(i64::from(keep_last))
                        .query()
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(())
            })
        }

        fn attempts<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            key: &'a $crate::JobKey,
        ) -> $crate::BoxFuture<'a, sqlx::Result<Vec<$crate::Attempt>>> {
            Box::pin(async move {
                let query = sql.history.list.binder::<$db>().key(key);
                let rows = query.query().fetch_all(pool).await?;
                rows.iter()
                    .map(|row| {
                        let row: $crate::history::AttemptRow = sqlx::FromRow::from_row(row)?;
                        Ok($crate::Attempt::from(row))
                    })
                    .collect()
            })
        }

        fn purge_attempts<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            limit: i64,
        ) -> $crate::BoxFuture<'a, sqlx::Result<u64>> {
            Box::pin(async move {
                let _turn = $crate::gate::turn::<$db>(pool).await;
                let done = sql
                    .history
                    .orphans
                    .binder::<$db>()
                    .bind(limit)
                    .query()
                    .execute(pool)
                    .await?;
                Ok(done.rows_affected())
            })
        }

        fn record_audit<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            entry: &'a $crate::audit::AuditEntry,
        ) -> $crate::BoxFuture<'a, sqlx::Result<()>> {
            Box::pin(async move {
                let _turn = $crate::gate::turn::<$db>(pool).await;
                sql.audit
                    .insert
                    .binder::<$db>()
                    .bind(entry.at_ms)
                    .bind(entry.who.as_str())
                    .bind(entry.action_name())
                    .bind(entry.target.as_str())
                    .bind(i64::try_from(entry.changed).unwrap_or(i64::MAX))
                    .query()
                    .execute(pool)
                    .await?;
                Ok(())
            })
        }

        fn audit_log<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            limit: i64,
        ) -> $crate::BoxFuture<'a, sqlx::Result<Vec<$crate::audit::AuditEntry>>> {
            Box::pin(async move {
                let query = sql.audit.list.binder::<$db>().bind(limit);
                let rows = query.query().fetch_all(pool).await?;
                rows.iter()
                    .map(|row| {
                        let row: $crate::audit::AuditRow = sqlx::FromRow::from_row(row)?;
                        Ok($crate::audit::AuditEntry::from(row))
                    })
                    .collect()
            })
        }

        fn pause<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            scope: &'a str,
            now: i64,
            by: &'a str,
        ) -> $crate::BoxFuture<'a, sqlx::Result<bool>> {
            Box::pin(async move {
                let _turn = $crate::gate::turn::<$db>(pool).await;
                let insert = sql.pauses.insert.binder::<$db>().bind(scope).bind(now).bind(by);
                let done = match insert.query().execute(pool).await {
                    Ok(done) => done.rows_affected() == 1,
                    Err(sqlx::Error::Database(error)) if error.is_unique_violation() => false,
                    Err(error) => return Err(error),
                };
                sql.pauses.invalidate();
                Ok(done)
            })
        }

        fn resume<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            scope: &'a str,
            now: i64,
        ) -> $crate::BoxFuture<'a, sqlx::Result<bool>> {
            Box::pin(async move {
                let _turn = $crate::gate::turn::<$db>(pool).await;
                let mut tx = pool.begin().await?;
                let deleted = sql.pauses.delete.binder::<$db>().bind(scope).query();
                let resumed = deleted.execute(&mut *tx).await?.rows_affected() > 0;
                if resumed {
                    let unpark = sql.pauses.unpark.binder::<$db>().bind(now).query();
                    unpark.execute(&mut *tx).await?;
                }
                tx.commit().await?;
                sql.pauses.invalidate();
                Ok(resumed)
            })
        }

        fn pauses<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
        ) -> $crate::BoxFuture<'a, sqlx::Result<Vec<$crate::pauses::Pause>>> {
            Box::pin(async move {
                let rows: Vec<(String, i64, String)> =
                    sqlx::query_as(sql.pauses.list.text().clone()).fetch_all(pool).await?;
                Ok(rows.into_iter().map($crate::pauses::Pause::from).collect())
            })
        }

        fn park<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            key: &'a $crate::JobKey,
            token: i64,
            scope: &'a str,
        ) -> $crate::BoxFuture<'a, sqlx::Result<bool>> {
            Box::pin(async move {
                let _turn = $crate::gate::turn::<$db>(pool).await;
                let query = sql.pauses.park.binder::<$db>().key(key);
                let done = query.bind(token).bind(scope).query().execute(pool).await?;
                Ok(done.rows_affected() == 1)
            })
        }

        fn unpark<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            now: i64,
        ) -> $crate::BoxFuture<'a, sqlx::Result<u64>> {
            Box::pin(async move {
                let _turn = $crate::gate::turn::<$db>(pool).await;
                let query = sql.pauses.unpark.binder::<$db>().bind(now).query();
                Ok(query.execute(pool).await?.rows_affected())
            })
        }

        fn run_script<'a>(
            pool: &'a sqlx::Pool<Self>,
            script: &'a str,
        ) -> $crate::BoxFuture<'a, sqlx::Result<()>> {
            Box::pin(async move {
                let _turn = $crate::gate::turn::<$db>(pool).await;
                sqlx::raw_sql(sqlx::AssertSqlSafe(script.to_owned()))
                    .execute(pool)
                    .await?;
                Ok(())
            })
        }
    };
}

/// A row's key, read from the table's key columns (for a driver's calls: [`driver_calls!`]).
pub fn key<R: sqlx::Row>(table: &Table, row: &R) -> sqlx::Result<JobKey>
where
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    table
        .key
        .iter()
        .map(|column| row.try_get::<String, _>(*column))
        .collect::<sqlx::Result<Vec<_>>>()
        .map(JobKey)
}

/// A claim's row: the key, the attempt and the half's payload (for a driver's calls).
pub fn claimed<R: sqlx::Row, P>(table: &Table, row: &R) -> sqlx::Result<Claimed<P>>
where
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    P: for<'r> sqlx::FromRow<'r, R>,
{
    Ok(Claimed {
        key: key(table, row)?,
        attempt: u32::try_from(row.try_get::<i32, _>("job_attempts")?).unwrap_or(1),
        payload: P::from_row(row)?,
    })
}

/// A listing's row (for a driver's calls).
pub fn summary<R: sqlx::Row, S>(table: &Table, row: &R) -> sqlx::Result<JobSummary<S>>
where
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i16: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    S: for<'r> sqlx::FromRow<'r, R>,
{
    Ok(JobSummary {
        key: key(table, row)?,
        state: crate::JobState::from_code(row.try_get("state")?),
        attempts: u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0),
        created_at_ms: row.try_get("job_created_at")?,
        available_at_ms: row.try_get("available_at")?,
        finished_at_ms: row.try_get("finished_at")?,
        status: row.try_get("job_status")?,
        last_error: row.try_get("last_error")?,
        extra: S::from_row(row)?,
    })
}

/// The counts of `(state, count)` rows (for a driver's calls).
pub fn counts(rows: Vec<(i16, i64)>) -> JobCounts {
    let mut counts = JobCounts::default();
    for (state, count) in rows {
        let count = u64::try_from(count).unwrap_or(0);
        match crate::JobState::from_code(state) {
            crate::JobState::Pending => counts.pending = count,
            crate::JobState::Done => counts.done = count,
            crate::JobState::Failed => counts.failed = count,
            crate::JobState::Discarded => counts.discarded = count,
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_parameters_become_positional_in_their_order() {
        let (text, order) = positional(
            "UPDATE t SET a = $2, b = $10 WHERE c <= $1 AND d <= $1 \
             AND e IN (SELECT v FROM JSON_TABLE($3, '$[*]' COLUMNS (v TEXT PATH '$')) AS x)",
        );
        assert_eq!(
            text,
            "UPDATE t SET a = ?, b = ? WHERE c <= ? AND d <= ? \
             AND e IN (SELECT v FROM JSON_TABLE(?, '$[*]' COLUMNS (v TEXT PATH '$')) AS x)"
        );
        assert_eq!(order, [2, 10, 1, 1, 3]);
    }

    #[test]
    fn numbered_statements_are_left_as_written() {
        let text = "SELECT a FROM t WHERE b = $1 AND c = $1".to_owned();
        let prepared = Prepared::new(text.clone(), Placeholders::Numbered);
        assert_eq!(prepared.text().as_str(), text);
        assert!(prepared.order.is_none());
    }
}
