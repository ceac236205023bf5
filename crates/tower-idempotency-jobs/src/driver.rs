//! [`Driver`]: the statements of a job table on one database. Each database's folder
//! (`postgres/`, `sqlite/`) owns its dialect (its column types, its claim's lock clause, how a
//! batch of keys is bound) and implements the trait through `driver_calls!`, which writes the
//! typed calls once.

use futures_util::future::BoxFuture;
use sqlx::SqlStr;
use tower_idempotency_sqlx::table_sql;

use crate::table::{Claimed, JobCounts, JobKey, JobSummary, PageFilter, Table};

/// What a database's driver says about its SQL; [`Statements::new`] builds the texts from it.
#[derive(Clone, Copy, Debug)]
pub struct Dialect {
    /// Appended to a claim's inner `SELECT`: Postgres `FOR UPDATE SKIP LOCKED`, so workers
    /// sharing a table take disjoint jobs instead of waiting for each other's locks.
    pub claim_lock: &'static str,
    /// How the key columns' values of a batch are bound: one array per key column.
    pub key_batch: KeyBatch,
}

/// How a statement receives a batch of keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyBatch {
    /// One `text[]` parameter per key column, paired by position (`unnest`).
    PostgresArrays,
    /// One JSON array of strings per key column, paired by position (`json_each`).
    JsonArrays,
}

/// The prepared texts of one job table's statements on one database. Built once per table.
#[derive(Debug)]
pub struct Statements {
    pub(crate) table: Table,
    pub(crate) claim_due: SqlStr,
    pub(crate) claim_keys: SqlStr,
    pub(crate) renew: SqlStr,
    pub(crate) renew_one: SqlStr,
    pub(crate) complete: SqlStr,
    pub(crate) fail: SqlStr,
    pub(crate) exhaust: SqlStr,
    pub(crate) due: SqlStr,
    pub(crate) retry: SqlStr,
    pub(crate) discard: SqlStr,
    pub(crate) purge: SqlStr,
    pub(crate) list: SqlStr,
    pub(crate) page: SqlStr,
    pub(crate) get: SqlStr,
    pub(crate) detail: SqlStr,
    pub(crate) counts: SqlStr,
    pub(crate) group_counts: SqlStr,
    pub(crate) oldest_pending: SqlStr,
    pub(crate) history: crate::history::HistoryStatements,
}

/// A statement of [`Statements`] whose text [`Statements::text`] shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Statement {
    /// [`Driver::claim_due`]: `$1` now, `$2` token, `$3` lease end, `$4` attempts, `$5` limit.
    ClaimDue,
    /// [`Driver::claim_keys`]: `$1` now, one batch per key column, then token, lease end and
    /// attempts.
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
        let t = table.name.as_str();
        let keys = table.key_list();
        let n = table.key.len();
        let payload = table.payload_columns();
        let returning = format!("RETURNING {keys}, attempts AS job_attempts{payload}");
        let lock = dialect.claim_lock;
        let claim_due = format!(
            "UPDATE {t} SET attempts = attempts + 1, lease_token = $2, lease_until = $3 \
             WHERE ({keys}) IN (SELECT {keys} FROM {t} WHERE {DUE} AND attempts < $4 \
             ORDER BY available_at LIMIT $5{lock}) {returning}"
        );
        // $1 now, $2.. one batch parameter per key column, then token, lease end, attempts.
        let after = 2 + n;
        let batch = key_batch(&table, dialect.key_batch, 2);
        let claim_keys = format!(
            "UPDATE {t} SET attempts = attempts + 1, lease_token = ${after}, \
             lease_until = ${} WHERE ({keys}) IN (SELECT {keys} FROM {t} \
             WHERE ({keys}) IN ({batch}) AND {DUE_BY_KEY} AND attempts < ${}{lock}) {returning}",
            after + 1,
            after + 2,
        );
        let by_key = table.key_match(1);
        let k = n + 1; // the first parameter after a key
        let status_set = |param: usize| {
            table
                .status
                .map(|column| format!("{column} = ${param}, "))
                .unwrap_or_default()
        };
        let summary = table.summary_columns();
        let detail_columns: String = table
            .payload
            .iter()
            .filter(|c| !table.key.contains(c) && !table.summary.contains(c))
            .map(|c| format!(", {c}"))
            .collect();
        let group = match table.group {
            Some(column) => format!("($2 IS NULL OR {column} = $2)"),
            None => "$2 IS NULL".to_owned(),
        };
        let created = table.created;
        let after_keys: Vec<String> = (0..n).map(|i| format!("${}", 6 + i)).collect();
        let page_limit = 6 + n;
        let order_desc: Vec<String> = table.key.iter().map(|c| format!("{c} DESC")).collect();
        Self {
            claim_due: table_sql(claim_due),
            claim_keys: table_sql(claim_keys),
            renew: table_sql(format!(
                "UPDATE {t} SET lease_until = $2 WHERE state = 0 AND lease_token = $1"
            )),
            renew_one: table_sql(format!(
                "UPDATE {t} SET lease_until = ${} \
                 WHERE {by_key} AND lease_token = ${k} AND state + 0 = 0",
                k + 1
            )),
            // $k token, $k+1 now, $k+2 status.
            complete: table_sql(format!(
                "UPDATE {t} SET state = 1, finished_at = ${}, {}last_error = NULL, \
                 lease_token = NULL, lease_until = NULL WHERE {by_key} AND lease_token = ${k}",
                k + 1,
                status_set(k + 2),
            )),
            // $k token, $k+1 now, $k+2 max attempts, $k+3 retry at, $k+4 error, $k+5 status.
            fail: table_sql(format!(
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
            exhaust: table_sql(format!(
                "UPDATE {t} SET state = 2, finished_at = $1, last_error = $3, \
                 lease_token = NULL, lease_until = NULL WHERE {DUE} AND attempts >= $2 \
                 RETURNING {keys}"
            )),
            // Retries and recovered jobs first: fresh ones are usually claimed already.
            due: table_sql(format!(
                "SELECT {keys} FROM {t} WHERE {DUE} AND attempts < $3 \
                 ORDER BY attempts = 0, available_at LIMIT $2"
            )),
            retry: table_sql(format!(
                "UPDATE {t} SET state = 0, attempts = 0, available_at = ${k}, \
                 finished_at = NULL, last_error = NULL, lease_token = NULL, lease_until = NULL \
                 WHERE {by_key} AND state = 2"
            )),
            discard: table_sql(format!(
                "UPDATE {t} SET state = 3, finished_at = ${k}, \
                 lease_token = NULL, lease_until = NULL WHERE {by_key} AND (state = 2 OR \
                 (state = 0 AND (lease_until IS NULL OR lease_until <= ${k})))"
            )),
            purge: table_sql(format!(
                "DELETE FROM {t} WHERE ({keys}) IN (SELECT {keys} FROM {t} \
                 WHERE state IN (1, 3) AND finished_at < $1 ORDER BY finished_at LIMIT $2)"
            )),
            list: table_sql(format!(
                "SELECT {summary} FROM {t} WHERE state = $1 ORDER BY {created}, {keys} LIMIT $2"
            )),
            page: table_sql(format!(
                "SELECT {summary} FROM {t} WHERE ($1 IS NULL OR state = $1) AND {group} \
                 AND ($3 IS NULL OR {created} >= $3) AND ($4 IS NULL OR {created} < $4) \
                 AND ($5 IS NULL OR ({created}, {keys}) < ($5, {})) \
                 ORDER BY {created} DESC, {} LIMIT ${page_limit}",
                after_keys.join(", "),
                order_desc.join(", "),
            )),
            get: table_sql(format!("SELECT {summary} FROM {t} WHERE {by_key}")),
            detail: table_sql(format!(
                "SELECT {summary}{detail_columns} FROM {t} WHERE {by_key}"
            )),
            counts: table_sql(format!("SELECT state, count(*) FROM {t} GROUP BY state")),
            group_counts: table_sql(match table.group {
                Some(column) => format!(
                    "SELECT {column}, state, count(*) FROM {t} \
                     GROUP BY {column}, state ORDER BY {column}, state"
                ),
                None => {
                    format!("SELECT '', state, count(*) FROM {t} GROUP BY state ORDER BY state")
                }
            }),
            oldest_pending: table_sql(format!("SELECT min({created}) FROM {t} WHERE state = 0")),
            history: crate::history::HistoryStatements::new(&table),
            table,
        }
    }

    /// The table these statements are for.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// The text of one statement, to show or to explain (a query plan test).
    pub fn text(&self, which: Statement) -> &SqlStr {
        match which {
            Statement::ClaimDue => &self.claim_due,
            Statement::ClaimKeys => &self.claim_keys,
            Statement::Renew => &self.renew,
            Statement::RenewOne => &self.renew_one,
            Statement::Due => &self.due,
            Statement::Purge => &self.purge,
            Statement::Page => &self.page,
        }
    }
}

/// The rows of a batch of keys bound from parameter `first` on: `SELECT k1, k2 FROM ..`.
fn key_batch(table: &Table, batch: KeyBatch, first: usize) -> String {
    let n = table.key.len();
    match batch {
        KeyBatch::PostgresArrays => {
            let columns: Vec<String> = (0..n).map(|i| format!("x.k{i} COLLATE \"C\"")).collect();
            let arrays: Vec<String> = (0..n).map(|i| format!("${}::text[]", first + i)).collect();
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
    }
}

/// One job with its payload, as [`Driver::detail`] reads it.
pub type Detail<S, P> = (JobSummary<S>, P);

/// A job table's statements on one database: [`sqlx::Postgres`] (feature `postgres`) and
/// [`sqlx::Sqlite`] (feature `sqlite`). A database's folder implements it with
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

    /// Jobs a worker runs at once unless told otherwise: 16 on Postgres, whose commits of many
    /// connections proceed side by side; 4 on SQLite, whose writers take one lock in turn.
    const CONCURRENCY: usize;

    /// The history table's sequence column, its primary key ([`history`](crate::history)).
    const HISTORY_SEQ: &'static str;

    /// The type of the history table's key columns.
    const HISTORY_KEY_TYPE: &'static str;

    /// The history table's columns after its key: `attempt`, `started_at`, `duration_ms`,
    /// `outcome`, `error`, `status`, `response`.
    const HISTORY_COLUMNS: &'static str;

    /// The DDL of `table`'s attempt history table (`{table}_attempts`) and its index, to run
    /// after the job table's.
    fn history_schema(table: &Table) -> String {
        crate::history::schema::<Self>(table)
    }

    /// This database's statements for `table`.
    fn statements(table: Table) -> Statements;

    /// The due-index DDL of `table` (`{table}_due_idx` on state and due time).
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
    /// recovered jobs first, then by due time.
    fn due<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        now: i64,
        limit: i64,
        max_attempts: i32,
    ) -> BoxFuture<'a, sqlx::Result<Vec<JobKey>>>;

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
#[macro_export]
macro_rules! driver_calls {
    ($db:ty, $keys:path) => {
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
                let rows = sqlx::query(sql.claim_due.clone())
                    .bind(now)
                    .bind(token)
                    .bind(lease_until)
                    .bind(max_attempts)
                    .bind(limit)
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
                let mut query = sqlx::query(sql.claim_keys.clone()).bind(now);
                for column in 0..sql.table().key.len() {
                    query = query.bind($keys(keys, column));
                }
                let rows = query
                    .bind(token)
                    .bind(lease_until)
                    .bind(max_attempts)
                    .fetch_all(pool)
                    .await?;
                rows.iter()
                    .map(|row| $crate::driver::claimed(sql.table(), row))
                    .collect()
            })
        }

        fn renew<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            token: i64,
            lease_until: i64,
        ) -> $crate::BoxFuture<'a, sqlx::Result<u64>> {
            Box::pin(async move {
                let done = sqlx::query(sql.renew.clone())
                    .bind(token)
                    .bind(lease_until)
                    .execute(pool)
                    .await?;
                Ok(done.rows_affected())
            })
        }

        fn renew_one<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            key: &'a $crate::JobKey,
            token: i64,
            lease_until: i64,
        ) -> $crate::BoxFuture<'a, sqlx::Result<bool>> {
            Box::pin(async move {
                let mut query = sqlx::query(sql.renew_one.clone());
                for part in &key.0 {
                    query = query.bind(part.as_str());
                }
                let done = query.bind(token).bind(lease_until).execute(pool).await?;
                Ok(done.rows_affected() == 1)
            })
        }

        fn complete<'a>(
            conn: &'a mut Self::Connection,
            sql: &'a $crate::Statements,
            key: &'a $crate::JobKey,
            token: i64,
            now: i64,
            status: Option<i32>,
        ) -> $crate::BoxFuture<'a, sqlx::Result<bool>> {
            Box::pin(async move {
                let mut query = sqlx::query(sql.complete.clone());
                for part in &key.0 {
                    query = query.bind(part.as_str());
                }
                query = query.bind(token).bind(now);
                if sql.table().status.is_some() {
                    query = query.bind(status);
                }
                Ok(query.execute(conn).await?.rows_affected() == 1)
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
                let mut query = sqlx::query(sql.fail.clone());
                for part in &key.0 {
                    query = query.bind(part.as_str());
                }
                query = query
                    .bind(token)
                    .bind(now)
                    .bind(max_attempts)
                    .bind(retry_at)
                    .bind(error);
                if sql.table().status.is_some() {
                    query = query.bind(status);
                }
                Ok(query.execute(pool).await?.rows_affected() == 1)
            })
        }

        fn exhaust<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            now: i64,
            max_attempts: i32,
        ) -> $crate::BoxFuture<'a, sqlx::Result<Vec<$crate::JobKey>>> {
            Box::pin(async move {
                let rows = sqlx::query(sql.exhaust.clone())
                    .bind(now)
                    .bind(max_attempts)
                    .bind($crate::driver::SPENT)
                    .fetch_all(pool)
                    .await?;
                rows.iter()
                    .map(|row| $crate::driver::key(sql.table(), row))
                    .collect()
            })
        }

        fn due<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            now: i64,
            limit: i64,
            max_attempts: i32,
        ) -> $crate::BoxFuture<'a, sqlx::Result<Vec<$crate::JobKey>>> {
            Box::pin(async move {
                let rows = sqlx::query(sql.due.clone())
                    .bind(now)
                    .bind(limit)
                    .bind(max_attempts)
                    .fetch_all(pool)
                    .await?;
                rows.iter()
                    .map(|row| $crate::driver::key(sql.table(), row))
                    .collect()
            })
        }

        fn retry<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            key: &'a $crate::JobKey,
            now: i64,
        ) -> $crate::BoxFuture<'a, sqlx::Result<bool>> {
            Box::pin(async move {
                let mut query = sqlx::query(sql.retry.clone());
                for part in &key.0 {
                    query = query.bind(part.as_str());
                }
                Ok(query.bind(now).execute(pool).await?.rows_affected() == 1)
            })
        }

        fn discard<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            key: &'a $crate::JobKey,
            now: i64,
        ) -> $crate::BoxFuture<'a, sqlx::Result<bool>> {
            Box::pin(async move {
                let mut query = sqlx::query(sql.discard.clone());
                for part in &key.0 {
                    query = query.bind(part.as_str());
                }
                Ok(query.bind(now).execute(pool).await?.rows_affected() == 1)
            })
        }

        fn purge<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            before: i64,
            limit: i64,
        ) -> $crate::BoxFuture<'a, sqlx::Result<u64>> {
            Box::pin(async move {
                let done = sqlx::query(sql.purge.clone())
                    .bind(before)
                    .bind(limit)
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
                let rows = sqlx::query(sql.list.clone())
                    .bind(state.code())
                    .bind(limit)
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
                let mut query = sqlx::query(sql.page.clone())
                    .bind(filter.state.map($crate::JobState::code))
                    .bind(filter.group.as_deref())
                    .bind(filter.from_ms)
                    .bind(filter.until_ms)
                    .bind(after_at);
                for column in 0..sql.table().key.len() {
                    query = query.bind(after_key.map(|key| key.part(column)));
                }
                let rows = query.bind(limit).fetch_all(pool).await?;
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
                let mut query = sqlx::query(sql.get.clone());
                for part in &key.0 {
                    query = query.bind(part.as_str());
                }
                let row = query.fetch_optional(pool).await?;
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
                let mut query = sqlx::query(sql.detail.clone());
                for part in &key.0 {
                    query = query.bind(part.as_str());
                }
                let Some(row) = query.fetch_optional(pool).await? else {
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
                    sqlx::query_as(sql.counts.clone()).fetch_all(pool).await?;
                Ok($crate::driver::counts(rows))
            })
        }

        fn group_counts<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
        ) -> $crate::BoxFuture<'a, sqlx::Result<Vec<(String, $crate::JobState, u64)>>> {
            Box::pin(async move {
                let rows: Vec<(String, i16, i64)> = sqlx::query_as(sql.group_counts.clone())
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
                sqlx::query_scalar(sql.oldest_pending.clone())
                    .fetch_one(pool)
                    .await
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
                let mut insert = sqlx::query(sql.history.insert.clone());
                for part in &key.0 {
                    insert = insert.bind(part.as_str());
                }
                insert
                    .bind(i32::try_from(attempt.attempt).unwrap_or(i32::MAX))
                    .bind(attempt.started_at_ms)
                    .bind(i64::try_from(attempt.duration_ms).unwrap_or(i64::MAX))
                    .bind(attempt.outcome.code())
                    .bind(attempt.error.as_deref())
                    .bind(attempt.status)
                    .bind(attempt.response.as_deref())
                    .execute(&mut *conn)
                    .await?;
                // Only an attempt past the newest kept can leave a row to delete.
                if attempt.attempt > keep_last {
                    let mut trim = sqlx::query(sql.history.trim.clone());
                    for part in &key.0 {
                        trim = trim.bind(part.as_str());
                    }
                    trim.bind(i64::from(keep_last)).execute(&mut *conn).await?;
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
                let mut query =
                    sqlx::query_as::<_, $crate::history::AttemptRow>(sql.history.list.clone());
                for part in &key.0 {
                    query = query.bind(part.as_str());
                }
                let rows = query.fetch_all(pool).await?;
                Ok(rows.into_iter().map($crate::Attempt::from).collect())
            })
        }

        fn purge_attempts<'a>(
            pool: &'a sqlx::Pool<Self>,
            sql: &'a $crate::Statements,
            limit: i64,
        ) -> $crate::BoxFuture<'a, sqlx::Result<u64>> {
            Box::pin(async move {
                let done = sqlx::query(sql.history.orphans.clone())
                    .bind(limit)
                    .execute(pool)
                    .await?;
                Ok(done.rows_affected())
            })
        }

        fn run_script<'a>(
            pool: &'a sqlx::Pool<Self>,
            script: &'a str,
        ) -> $crate::BoxFuture<'a, sqlx::Result<()>> {
            Box::pin(async move {
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
