//! The MySQL and MariaDB driver (MySQL 8.0+, MariaDB 10.6+). Statements take `?` placeholders,
//! bound in the order their texts use them ([`Placeholders::Positional`]); a batch of keys is
//! one JSON array of strings per key column, read by `JSON_TABLE`.
//!
//! Neither server has `RETURNING` on `UPDATE`, so a claim is a transaction of three statements:
//! a `SELECT .. FOR UPDATE SKIP LOCKED` that picks and locks the jobs (workers sharing a table
//! take disjoint jobs, as on Postgres), an `UPDATE` of the picked rows that counts the attempt
//! and takes the lease, and a read of those rows under the claim's token. The sweep of spent
//! jobs is a locking `SELECT` and an `UPDATE` likewise. Every statement is a locking read or a
//! write, so a claim sees the newest committed rows at any isolation level.

use sqlx::MySql;

use crate::{
    driver::{claimed, key, KeyBatch, Placeholders, Unreturned},
    BoxFuture, Claimed, Dialect, Driver, JobKey, Statements, Table, SPENT,
};

impl Driver for MySql {
    // MySQL has no `CREATE INDEX IF NOT EXISTS`: the due index is declared with the columns.
    const JOB_COLUMNS: &'static str = "state SMALLINT NOT NULL DEFAULT 0,\n\
         attempts INT NOT NULL DEFAULT 0,\n\
         available_at BIGINT NOT NULL,\n\
         lease_token BIGINT,\n\
         lease_until BIGINT,\n\
         finished_at BIGINT,\n\
         last_error TEXT,\n\
         INDEX job_due_idx (state, available_at)";
    const BEGIN_WRITE: &'static str = "BEGIN";
    const CONCURRENCY: usize = 16;
    const HISTORY_SEQ: &'static str = "seq BIGINT AUTO_INCREMENT PRIMARY KEY";
    const HISTORY_KEY_TYPE: &'static str = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";
    const HISTORY_QUOTE: &'static str = "`";
    // The job index is declared with the columns (no `CREATE INDEX IF NOT EXISTS` on MySQL).
    const AUDIT_COLUMNS: &'static str =
        "at BIGINT NOT NULL, who TEXT NOT NULL, action TEXT NOT NULL, \
         target TEXT NOT NULL, changed BIGINT NOT NULL";
    const HISTORY_COLUMNS: &'static str = "attempt INT NOT NULL, started_at BIGINT NOT NULL, \
         duration_ms BIGINT NOT NULL, outcome SMALLINT NOT NULL, error TEXT, status INT, \
         response TEXT";

    /// The history table with its job index declared among its columns.
    fn history_schema(table: &Table) -> String {
        let t = crate::history::history_table(table);
        let keys: Vec<String> = table
            .key
            .iter()
            .map(|column| format!("`{column}` {} NOT NULL", Self::HISTORY_KEY_TYPE))
            .collect();
        format!(
            "CREATE TABLE IF NOT EXISTS {t} ({}, {}, {}, INDEX job_idx ({}, seq));\n",
            Self::HISTORY_SEQ,
            keys.join(", "),
            Self::HISTORY_COLUMNS,
            table.key_list("`"),
        )
    }

    fn statements(table: Table) -> Statements {
        Statements::new(
            table,
            Dialect {
                claim_lock: " FOR UPDATE SKIP LOCKED",
                key_batch: KeyBatch::JsonTable,
                placeholders: Placeholders::Positional,
                returning: false,
                quote: "`",
                null_integer: "CAST(NULL AS SIGNED)",
                writing_with: false,
            },
        )
    }

    /// None: [`JOB_COLUMNS`](Driver::JOB_COLUMNS) declares the due index in the table.
    fn due_index(_table: &str) -> String {
        String::new()
    }

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
        P: for<'r> sqlx::FromRow<'r, Self::Row> + Send + Unpin + 'a,
    {
        Box::pin(async move {
            let mut tx = pool.begin().await?;
            let picked = sql
                .claim_due
                .binder::<MySql>()
                .bind(now)
                .bind(token)
                .bind(lease_until)
                .bind(max_attempts)
                .bind(limit)
                .query()
                .fetch_all(&mut *tx)
                .await?;
            let keys = keys_of(sql, &picked)?;
            let claimed = lease(&mut tx, sql, &keys, token, lease_until).await?;
            tx.commit().await?;
            Ok(claimed)
        })
    }

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
        P: for<'r> sqlx::FromRow<'r, Self::Row> + Send + Unpin + 'a,
    {
        Box::pin(async move {
            let mut tx = pool.begin().await?;
            let mut query = sql.claim_keys.binder::<MySql>().bind(now);
            for column in 0..sql.table().key.len() {
                query = query.bind(key_column(keys, column));
            }
            let picked = query
                .bind(token)
                .bind(lease_until)
                .bind(max_attempts)
                .query()
                .fetch_all(&mut *tx)
                .await?;
            let keys = keys_of(sql, &picked)?;
            let claimed = lease(&mut tx, sql, &keys, token, lease_until).await?;
            tx.commit().await?;
            Ok(claimed)
        })
    }

    fn exhaust<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Statements,
        now: i64,
        max_attempts: i32,
    ) -> BoxFuture<'a, sqlx::Result<Vec<JobKey>>> {
        Box::pin(async move {
            let mut tx = pool.begin().await?;
            let picked = sql
                .exhaust
                .binder::<MySql>()
                .bind(now)
                .bind(max_attempts)
                .bind(SPENT)
                .query()
                .fetch_all(&mut *tx)
                .await?;
            let keys = keys_of(sql, &picked)?;
            if !keys.is_empty() {
                let mut query = unreturned(sql)
                    .spend
                    .binder::<MySql>()
                    .bind(now)
                    .bind(SPENT);
                for column in 0..sql.table().key.len() {
                    query = query.bind(key_column(&keys, column));
                }
                query.query().execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(keys)
        })
    }

    crate::driver_calls!(sqlx::MySql, key_column, unreturned);
}

/// The statements that follow a locking `SELECT`: built for every MySQL table.
fn unreturned(sql: &Statements) -> &Unreturned {
    sql.unreturned
        .as_ref()
        .expect("MySQL's statements are built without RETURNING")
}

/// The keys of the rows a locking `SELECT` picked.
fn keys_of(sql: &Statements, rows: &[sqlx::mysql::MySqlRow]) -> sqlx::Result<Vec<JobKey>> {
    rows.iter().map(|row| key(sql.table(), row)).collect()
}

/// Takes the lease of the picked `keys` (locked by this transaction) under `token` and reads
/// them back as claimed.
async fn lease<P>(
    tx: &mut sqlx::Transaction<'_, MySql>,
    sql: &Statements,
    keys: &[JobKey],
    token: i64,
    lease_until: i64,
) -> sqlx::Result<Vec<Claimed<P>>>
where
    P: for<'r> sqlx::FromRow<'r, sqlx::mysql::MySqlRow>,
{
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let statements = unreturned(sql);
    let columns = sql.table().key.len();
    let mut update = statements
        .lease
        .binder::<MySql>()
        .bind(token)
        .bind(lease_until);
    for column in 0..columns {
        update = update.bind(key_column(keys, column));
    }
    update.query().execute(&mut **tx).await?;
    let mut read = statements.read.binder::<MySql>().bind(token);
    for column in 0..columns {
        read = read.bind(key_column(keys, column));
    }
    let rows = read.query().fetch_all(&mut **tx).await?;
    rows.iter().map(|row| claimed(sql.table(), row)).collect()
}

/// Key column `column` of every key in `keys`, as a JSON array of strings.
fn key_column(keys: &[JobKey], column: usize) -> String {
    let values: Vec<&str> = keys.iter().map(|key| key.part(column)).collect();
    serde_json::to_string(&values).expect("strings serialize")
}
