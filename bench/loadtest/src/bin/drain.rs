//! A CPU profile's workload: the inbox worker draining a backlog with nothing else running, on
//! Postgres or SQLite. An inbox table of its own is filled with `EVENTS` pending Stripe events in
//! one statement (no HTTP, no acknowledgement: only the worker runs), then a worker at the
//! reference receiver's defaults (16 handlers on Postgres, 4 on SQLite; a pool of twice that)
//! whose handler inserts one row in the event's transaction takes the backlog through its sweeps,
//! as after an outage. It prints the events per second from the worker's start until none is
//! pending, and drops its tables.
//!
//! ```text
//! SQLX_OFFLINE=true cargo build --release --manifest-path bench/Cargo.toml -p tower-idempotency-loadtest --bin drain
//! target/release/drain postgres|sqlite [EVENTS] [HISTORY]
//! ```
//!
//! `HISTORY` is the worker's attempt history (`WorkerBuilder::history`; default its default, `0`
//! writes none): the statement it adds per event is the one the profile's comparison removes.
//!
//! `bench/scripts/profile.sh` records it under `perf` and draws the flame graphs in
//! `docs/benchmarks/`. `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) names
//! the Postgres database.

mod drive;

use std::{
    str::FromStr,
    time::{Duration, Instant},
};

use drive::{postgres_pool, suffix};
use tower_idempotency_inbox::{HandlerError, IdempotentTx, Inbox, InboxDatabase, InboxEvent};
use tower_idempotency_sqlx::sqlx::{self, Pool, Postgres, Sqlite};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The handlers' table: one row per event.
const EFFECTS: &str = "drain_effects";

/// The handler on each database: the event's row in its transaction.
macro_rules! insert_handler {
    ($name:ident, $db:ty) => {
        async fn $name(event: InboxEvent, mut tx: IdempotentTx<$db>) -> Result<(), HandlerError> {
            sqlx::query("INSERT INTO drain_effects (event_id) VALUES ($1)")
                .bind(&event.key.event_id)
                .execute(&mut *tx)
                .await?;
            Ok(())
        }
    };
}

insert_handler!(insert_postgres, Postgres);
insert_handler!(insert_sqlite, Sqlite);

/// The `SELECT` of a pending Stripe event's columns for each number `n` of `rows`, received at
/// `now`.
fn pending(now: i64, rows: &str, body: &str) -> String {
    format!("SELECT 'stripe', 'evt_' || n, '[]', {body}, {now}, {now} FROM {rows}")
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let database = args.next().unwrap_or_else(|| "postgres".to_owned());
    let events: u64 = match args.next() {
        Some(events) => events.parse()?,
        None => 40_000,
    };
    let history: Option<u32> = args.next().map(|n| n.parse()).transpose()?;
    let table = format!("drain_{}", suffix());
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;
    let columns = "(provider, event_id, headers, body, received_at, available_at)";
    let rate = match database.as_str() {
        "postgres" => {
            let pool = postgres_pool().await?;
            let rows = format!("generate_series(1, {events}) AS g(n)");
            let body =
                "convert_to('{\"id\":\"evt_' || n || '\",\"type\":\"charge.succeeded\"}', 'UTF8')";
            let fill = format!(
                "INSERT INTO {table} {columns} {}",
                pending(now, &rows, body)
            );
            let rate = drain(&pool, &table, (events, history), &fill, insert_postgres).await?;
            pool.close().await;
            rate
        }
        "sqlite" => {
            let dir = std::env::temp_dir().join(format!("tidem-drain-{}", suffix()));
            std::fs::create_dir_all(&dir)?;
            let url = format!("sqlite://{}/drain.db?mode=rwc", dir.display());
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(&url)?
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(10));
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(2 * Sqlite::DEFAULT_CONCURRENCY as u32)
                .connect_with(options)
                .await?;
            let rows = format!(
                "(WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g \
                 WHERE n < {events}) SELECT n FROM g)"
            );
            let body = "CAST('{\"id\":\"evt_' || n || '\",\"type\":\"charge.succeeded\"}' AS BLOB)";
            let fill = format!(
                "INSERT INTO {table} {columns} {}",
                pending(now, &rows, body)
            );
            let rate = drain(&pool, &table, (events, history), &fill, insert_sqlite).await?;
            pool.close().await;
            std::fs::remove_dir_all(&dir)?;
            rate
        }
        other => return Err(format!("no database {other}: postgres or sqlite").into()),
    };
    let kept = history.map_or_else(|| "default".to_owned(), |n| n.to_string());
    println!("{database}: {events} events drained at {rate:.0} events/s (history {kept})");
    Ok(())
}

/// Fills the inbox `table` of `pool` with `fill` (`events` events), then drains it with a worker
/// running `handler` (its history `history`, when given); answers the events per second.
async fn drain<DB: InboxDatabase>(
    pool: &Pool<DB>,
    table: &str,
    (events, history): (u64, Option<u32>),
    fill: &str,
    handler: impl tower_idempotency_inbox::InboxHandler<DB>,
) -> Result<f64, BoxError>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let inbox = Inbox::new(pool.clone(), table)?;
    inbox.migrate().await?;
    let create = format!("CREATE TABLE {EFFECTS} (event_id TEXT NOT NULL)");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {EFFECTS}"
    )))
    .execute(pool)
    .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(create))
        .execute(pool)
        .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(fill.to_owned()))
        .execute(pool)
        .await?;
    assert_eq!(inbox.counts().await?.pending, events, "the backlog");

    let started = Instant::now();
    let mut worker = inbox.worker(handler).concurrency(DB::DEFAULT_CONCURRENCY);
    if let Some(history) = history {
        worker = worker.history(history);
    }
    let worker = worker.spawn();
    while inbox.counts().await?.pending > 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    worker.drain(Duration::from_secs(10)).await;
    let drop = [
        table.to_owned(),
        format!("{table}_attempts"),
        format!("{table}_audit"),
        format!("{table}_pauses"),
        format!("{table}_positions"),
        EFFECTS.to_owned(),
    ]
    .map(|name| format!("DROP TABLE IF EXISTS {name}"))
    .join(";\n");
    sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
        .execute(pool)
        .await?;
    Ok(events as f64 / elapsed.as_secs_f64())
}
