//! The driver conformance suite: one set of cases that runs unchanged against every
//! [`Driver`], through [`jobs_driver_conformance_tests!`](crate::jobs_driver_conformance_tests).
//!
//! A driver of your own implements [`Fixture`] (how the suite makes a table, adds jobs and
//! holds a table's write lock on that database) and invokes the macro with a pool:
//!
//! ```no_run
//! tower_idempotency_jobs::jobs_driver_conformance_tests!(sqlite, sqlx::Sqlite, async {
//!     sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap()
//! });
//! ```

mod cases;

use std::future::Future;

pub use cases::*;

use crate::{BoxFuture, Driver};

/// How the suite prepares a database: its test table, its jobs and its lock.
pub trait Fixture: Driver {
    /// Creates `table`: key columns `kind` and `id` (text), `body` (text), `created_at`
    /// (big integer), `last_status` (integer, null), and [`Driver::JOB_COLUMNS`], with the due
    /// index, its history table ([`Driver::history_schema`]), its audit table
    /// ([`Driver::audit_schema`]) and its pauses table ([`Driver::pauses_schema`]). Drops tables
    /// of those names first.
    fn create<'a>(pool: &'a sqlx::Pool<Self>, table: &'a str) -> BoxFuture<'a, sqlx::Result<()>>;

    /// Adds a pending job `(kind, id)` with `body`, enqueued and due at `created_at`.
    fn add<'a>(
        pool: &'a sqlx::Pool<Self>,
        table: &'a str,
        kind: &'a str,
        id: &'a str,
        body: &'a str,
        created_at: i64,
    ) -> BoxFuture<'a, sqlx::Result<()>>;

    /// Drops `table`, its history table, its audit table and its pauses table.
    fn drop_table<'a>(
        pool: &'a sqlx::Pool<Self>,
        table: &'a str,
    ) -> BoxFuture<'a, sqlx::Result<()>>;

    /// Holds the write lock of `table` until `release` resolves: SQLite `BEGIN IMMEDIATE`,
    /// Postgres `LOCK TABLE .. IN ACCESS EXCLUSIVE MODE`, MySQL `SELECT .. FOR UPDATE` of every
    /// row. Resolves `locked` once it holds it.
    fn hold_lock<'a>(
        pool: &'a sqlx::Pool<Self>,
        table: &'a str,
        locked: tokio::sync::oneshot::Sender<()>,
        release: BoxFuture<'a, ()>,
    ) -> BoxFuture<'a, sqlx::Result<()>>;
}

macro_rules! fixture {
    ($db:ty, $feature:literal, $begin:literal, $lock:literal, $text:literal, $big:literal, $int:literal, $placeholders:expr) => {
        #[cfg(feature = $feature)]
        impl Fixture for $db {
            fn create<'a>(
                pool: &'a sqlx::Pool<Self>,
                table: &'a str,
            ) -> BoxFuture<'a, sqlx::Result<()>> {
                Box::pin(async move {
                    let ddl = format!(
                        "DROP TABLE IF EXISTS {table}_attempts;\n\
                         DROP TABLE IF EXISTS {table}_audit;\n\
                         DROP TABLE IF EXISTS {table}_pauses;\n\
                         DROP TABLE IF EXISTS {table};\n\
                         CREATE TABLE {table} (kind {text} NOT NULL, id {text} NOT NULL, \
                         body {text} NOT NULL, created_at {big} NOT NULL, last_status {int}, \
                         {columns}, PRIMARY KEY (kind, id));\n{index}\n{history}{audit}{pauses}",
                        text = $text,
                        big = $big,
                        int = $int,
                        columns = <$db as Driver>::JOB_COLUMNS,
                        index = <$db as Driver>::due_index(table),
                        history = <$db as Driver>::history_schema(&cases::table(table)),
                        audit = <$db as Driver>::audit_schema(&cases::table(table)),
                        pauses = <$db as Driver>::pauses_schema(&cases::table(table)),
                    );
                    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
                        .execute(pool)
                        .await?;
                    Ok(())
                })
            }

            fn add<'a>(
                pool: &'a sqlx::Pool<Self>,
                table: &'a str,
                kind: &'a str,
                id: &'a str,
                body: &'a str,
                created_at: i64,
            ) -> BoxFuture<'a, sqlx::Result<()>> {
                Box::pin(async move {
                    let text = crate::Prepared::new(
                        format!(
                            "INSERT INTO {table} (kind, id, body, created_at, available_at) \
                             VALUES ($1, $2, $3, $4, $4)"
                        ),
                        $placeholders,
                    );
                    text.binder::<$db>()
                        .bind(kind)
                        .bind(id)
                        .bind(body)
                        .bind(created_at)
                        .query()
                        .execute(pool)
                        .await?;
                    Ok(())
                })
            }

            fn drop_table<'a>(
                pool: &'a sqlx::Pool<Self>,
                table: &'a str,
            ) -> BoxFuture<'a, sqlx::Result<()>> {
                Box::pin(async move {
                    let ddl = format!(
                        "DROP TABLE IF EXISTS {table}_attempts;\nDROP TABLE IF EXISTS {table}_audit;\n\
                         DROP TABLE IF EXISTS {table}_pauses;\nDROP TABLE IF EXISTS {table}"
                    );
                    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
                        .execute(pool)
                        .await?;
                    Ok(())
                })
            }

            fn hold_lock<'a>(
                pool: &'a sqlx::Pool<Self>,
                table: &'a str,
                locked: tokio::sync::oneshot::Sender<()>,
                release: BoxFuture<'a, ()>,
            ) -> BoxFuture<'a, sqlx::Result<()>> {
                Box::pin(async move {
                    let mut tx = pool.begin_with($begin).await?;
                    let statement = format!($lock, table = table);
                    sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
                        .execute(&mut *tx)
                        .await?;
                    let _ = locked.send(());
                    release.await;
                    tx.rollback().await
                })
            }
        }
    };
}

// SQLite: the write lock from `BEGIN IMMEDIATE` on; a write makes it certain.
fixture!(
    sqlx::Sqlite,
    "sqlite",
    "BEGIN IMMEDIATE",
    "UPDATE {table} SET body = body WHERE 0",
    "TEXT",
    "INTEGER",
    "INTEGER",
    crate::Placeholders::Numbered
);
fixture!(
    sqlx::Postgres,
    "postgres",
    "BEGIN",
    "LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE",
    "text COLLATE \"C\"",
    "bigint",
    "integer",
    crate::Placeholders::Numbered
);
// MySQL and MariaDB: every row of the table locked by a locking read; keys compared byte by
// byte (as Postgres's "C" collation does).
fixture!(
    sqlx::MySql,
    "mysql",
    "BEGIN",
    "SELECT kind FROM {table} FOR UPDATE",
    "VARCHAR(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
    "BIGINT",
    "INT",
    crate::Placeholders::Positional
);

/// The table of `case` in the suite `name`: `jc_{name}_{the case's start}_{a hash of the
/// case}`, at most [`MAX_TABLE_NAME_LEN`](tower_idempotency_sqlx::MAX_TABLE_NAME_LEN) bytes for
/// a short `name`, so that its derived names (`{table}_attempts_job`) fit Postgres's 63-byte
/// identifiers.
pub fn table_name(name: &str, case: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    case.hash(&mut hasher);
    let start: String = case.chars().take(20).collect();
    format!("jc_{name}_{start}_{:08x}", hasher.finish() as u32)
}

/// Runs `case` once per fresh table named `{prefix}_{case}`.
pub async fn with_table<DB, F, Fut>(pool: &sqlx::Pool<DB>, table: &str, case: F)
where
    DB: Fixture,
    F: FnOnce(sqlx::Pool<DB>, String) -> Fut,
    Fut: Future<Output = ()>,
{
    DB::create(pool, table)
        .await
        .expect("create the test table");
    case(pool.clone(), table.to_owned()).await;
    DB::drop_table(pool, table)
        .await
        .expect("drop the test table");
}

/// Every case of the suite, as `#[tokio::test]`s in a module `$name`, on the pool `$pool`
/// (an `async` block answering a `sqlx::Pool<$db>`) of a database `$db` that implements
/// [`Fixture`]. Each case makes its own table ([`table_name`](crate::conformance::table_name)).
///
/// `jobs_driver_conformance_tests!(name, Db, optional pool)`: `pool` answers an
/// `Option<sqlx::Pool<Db>>`, and each case passes without running on `None` (a database the
/// caller found unreachable and said so).
#[macro_export]
macro_rules! jobs_driver_conformance_tests {
    ($name:ident, $db:ty, $pool:expr) => {
        $crate::jobs_driver_conformance_tests!($name, $db, optional async {
            Some($pool.await)
        });
    };
    ($name:ident, $db:ty, optional $pool:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            $crate::jobs_driver_conformance_tests!(@cases $name, $db, $pool;
                claims_are_leased_and_fenced,
                a_lapsed_lease_is_claimed_again_and_its_old_claim_cannot_record,
                renewals_keep_a_lease,
                a_claim_given_back_is_due_again_with_its_attempt,
                attempts_are_bounded_whatever_ends_them,
                a_permanent_failure_fails_at_once,
                the_worker_bounds_attempts_through_errors_timeouts_and_panics,
                claims_by_key_take_only_due_jobs,
                retry_and_discard_follow_the_states,
                purge_is_bounded,
                pages_follow_the_keys,
                counts_and_lag,
                concurrent_workers_run_each_job_once,
                the_dispatcher_runs_fed_and_swept_jobs_once,
                a_paused_scope_parks_its_jobs_until_resumed,
                a_locked_table_delays_the_record_but_never_doubles_it,
                a_database_gone_mid_batch_fails_the_round,
                the_history_keeps_the_first_and_the_last_attempts,
                the_audit_lists_the_newest_entries_first,
                activity_counts_each_minute_and_its_lag,
            );
        }
    };
    (@cases $name:ident, $db:ty, $pool:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let pool: Option<sqlx::Pool<$db>> = $pool.await;
                let Some(pool) = pool else {
                    return;
                };
                let table =
                    $crate::conformance::table_name(stringify!($name), stringify!($case));
                $crate::conformance::with_table(&pool, &table, |pool, table| async move {
                    $crate::conformance::$case::<$db>(pool, table).await
                })
                .await;
            }
        )+
    };
}
