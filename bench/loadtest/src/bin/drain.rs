//! A CPU profile's workload: the inbox worker draining a backlog with nothing else running, on
//! Postgres or SQLite. An inbox table of its own is filled with `EVENTS` pending Stripe events in
//! one statement (no HTTP, no acknowledgement: only the worker runs), then a worker at the
//! reference receiver's defaults (16 handlers on Postgres, 4 on SQLite; a pool of twice that)
//! whose handler inserts one row in the event's transaction takes the backlog through its sweeps,
//! as after an outage. It prints the events per second from the worker's start until none is
//! pending, and drops its tables.
//!
//! With `--floor`, the same run then measures the drain's floor: the worker's statements for
//! each of as many events, sent from as many connections as the worker has handlers, with no
//! worker (`DrainFloor`, the inbox harness's "the worker's statements per event", here a fixed
//! number of events rather than a fixed time), on an inbox table of its own. It prints the
//! floor's rate, the drain's ratio to it, and for both the CPU time per event of this process and
//! of the whole machine (`/proc/stat`: the database server included). Then the same floor with
//! each event's statements on a connection borrowed from the pool for that event, as a pool's
//! user runs them: sqlx tests each connection given back to its pool (a round trip the floor's
//! held connections do not pay, and the worker pays once per claim and once per attempt). Then
//! the floor on held connections with the attempt's history row the worker writes at its default
//! (`DrainFloor::with_history`): the floor of a drain with the history on. Last, the history row
//! on borrowed connections: what a worker that borrows a pooled connection for each attempt and
//! writes its history allows, the floor of the worker at its defaults.
//!
//! ```text
//! SQLX_OFFLINE=true cargo build --release --manifest-path bench/Cargo.toml -p tower-idempotency-loadtest --bin drain
//! target/release/drain postgres|sqlite [EVENTS] [HISTORY] [--floor]
//! ```
//!
//! `HISTORY` is the worker's attempt history (`WorkerBuilder::history`; default its default, `0`
//! writes none): the statement it adds per event is the one the profile's comparison removes.
//!
//! `bench/scripts/profile.sh` records it under `perf` and draws the flame graphs in
//! `docs/benchmarks/`. `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) names
//! the Postgres database.

#[path = "../cpu.rs"]
#[allow(dead_code)] // The harness's server threads are not this binary's.
mod cpu;
mod drive;

use std::{
    str::FromStr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use drive::{drop_tables, inbox_tables, machine_busy_ns, postgres_pool, suffix, DrainFloor};
use tower_idempotency_inbox::{
    HandlerError, IdempotentTx, Inbox, InboxDatabase, InboxEvent, InboxHandler,
};
use tower_idempotency_sqlx::{
    ping_when_idle,
    sqlx::{self, Pool, Postgres, Sqlite},
    PING_AFTER_IDLE,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The handlers' table: one row per event.
const EFFECTS: &str = "drain_effects";

/// The handler on each database: the event's row in its transaction, then a count of the
/// handlers that ran (before their commit: the drain's end is then read from the table).
macro_rules! insert_handler {
    ($name:ident, $db:ty) => {
        fn $name(ran: Arc<AtomicU64>) -> impl InboxHandler<$db> {
            move |event: InboxEvent, mut tx: IdempotentTx<$db>| {
                let ran = ran.clone();
                async move {
                    sqlx::query("INSERT INTO drain_effects (event_id) VALUES ($1)")
                        .bind(&event.key.event_id)
                        .execute(&mut *tx)
                        .await?;
                    ran.fetch_add(1, Ordering::Relaxed);
                    Ok::<(), HandlerError>(())
                }
            }
        }
    };
}

insert_handler!(insert_postgres, Postgres);
insert_handler!(insert_sqlite, Sqlite);

/// A phase's rate and CPU time per event.
struct Measured {
    rate: f64,
    /// This process's CPU time per event, µs.
    process_us: f64,
    /// The machine's busy CPU time per event, µs (every process, the database server's too).
    machine_us: f64,
}

impl Measured {
    /// Measures `events` events taken by `phase`.
    async fn of(
        events: u64,
        phase: impl std::future::Future<Output = Result<(), BoxError>>,
    ) -> Result<Self, BoxError> {
        let (process, machine, started) = (
            cpu::process_ns(std::process::id()),
            machine_busy_ns(),
            Instant::now(),
        );
        phase.await?;
        let elapsed = started.elapsed();
        let per_event = |ns: u64| ns as f64 / 1000.0 / events as f64;
        Ok(Self {
            rate: events as f64 / elapsed.as_secs_f64(),
            process_us: per_event(cpu::process_ns(std::process::id()).saturating_sub(process)),
            machine_us: per_event(machine_busy_ns().saturating_sub(machine)),
        })
    }

    fn cpu(&self) -> String {
        format!(
            "CPU per event {:.0} µs in this process, {:.0} µs on the machine",
            self.process_us, self.machine_us
        )
    }
}

/// The `SELECT` of a pending Stripe event's columns for each number `n` of `rows`, received at
/// `now`.
fn pending(now: i64, rows: &str, body: &str) -> String {
    format!("SELECT 'stripe', 'evt_' || n, '[]', {body}, {now}, {now} FROM {rows}")
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let with_floor = args.iter().any(|arg| arg == "--floor");
    let mut args = args.into_iter().filter(|arg| arg != "--floor");
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
    let (drained, floor) = match database.as_str() {
        "postgres" => {
            let pool = postgres_pool().await?;
            let rows = format!("generate_series(1, {events}) AS g(n)");
            let body =
                "convert_to('{\"id\":\"evt_' || n || '\",\"type\":\"charge.succeeded\"}', 'UTF8')";
            let fill = format!(
                "INSERT INTO {table} {columns} {}",
                pending(now, &rows, body)
            );
            let drained = drain(&pool, &table, (events, history), &fill, insert_postgres).await?;
            let floor = match with_floor {
                true => Some(floors(&pool, events, ("BEGIN", "'\\x7b7d'")).await?),
                false => None,
            };
            pool.close().await;
            (drained, floor)
        }
        "sqlite" => {
            let dir = std::env::temp_dir().join(format!("tidem-drain-{}", suffix()));
            std::fs::create_dir_all(&dir)?;
            let url = format!("sqlite://{}/drain.db?mode=rwc", dir.display());
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(&url)?
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(10));
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(2 * Sqlite::DEFAULT_CONCURRENCY as u32);
            let pool = ping_when_idle(pool, PING_AFTER_IDLE)
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
            let drained = drain(&pool, &table, (events, history), &fill, insert_sqlite).await?;
            let floor = match with_floor {
                true => Some(floors(&pool, events, ("BEGIN IMMEDIATE", "X'7B7D'")).await?),
                false => None,
            };
            pool.close().await;
            std::fs::remove_dir_all(&dir)?;
            (drained, floor)
        }
        other => return Err(format!("no database {other}: postgres or sqlite").into()),
    };
    let kept = history.map_or_else(|| "default".to_owned(), |n| n.to_string());
    println!(
        "{database}: {events} events drained at {:.0} events/s (history {kept}); {}",
        drained.rate,
        drained.cpu()
    );
    if let Some(floors) = floor {
        let floors = [
            ("the worker's statements per event, no worker", "floor"),
            (
                "the same, a connection borrowed from the pool for each event",
                "this floor",
            ),
            (
                "the same on held connections, with the attempt's history row",
                "this floor",
            ),
            (
                "the same on borrowed connections, with the history row",
                "this floor",
            ),
        ]
        .into_iter()
        .zip(floors);
        for ((name, ratio), measured) in floors {
            println!(
                "{database}: {name}: {:.0} events/s; {}; drain / {ratio} {:.2}",
                measured.rate,
                measured.cpu(),
                drained.rate / measured.rate
            );
        }
    }
    Ok(())
}

/// Creates the handlers' table, empty.
async fn effects<DB: InboxDatabase>(pool: &Pool<DB>) -> Result<(), BoxError>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    drop_tables(pool, &[EFFECTS.to_owned()]).await?;
    let create = format!("CREATE TABLE {EFFECTS} (event_id TEXT NOT NULL)");
    sqlx::raw_sql(sqlx::AssertSqlSafe(create))
        .execute(pool)
        .await?;
    Ok(())
}

/// Fills the inbox `table` of `pool` with `fill` (`events` events), then drains it with a worker
/// running `handler(ran)` (its history `history`, when given), `ran` counting the handlers that
/// ran; measures the drain from the worker's start until no event is pending.
async fn drain<DB: InboxDatabase, H: tower_idempotency_inbox::InboxHandler<DB>>(
    pool: &Pool<DB>,
    table: &str,
    (events, history): (u64, Option<u32>),
    fill: &str,
    handler: impl FnOnce(Arc<AtomicU64>) -> H,
) -> Result<Measured, BoxError>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let inbox = Inbox::new(pool.clone(), table)?;
    inbox.migrate().await?;
    effects(pool).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(fill.to_owned()))
        .execute(pool)
        .await?;
    assert_eq!(inbox.counts().await?.pending, events, "the backlog");

    let ran = Arc::new(AtomicU64::new(0));
    let mut worker = inbox
        .worker(handler(ran.clone()))
        .concurrency(DB::DEFAULT_CONCURRENCY);
    if let Some(history) = history {
        worker = worker.history(history);
    }
    let mut running = None;
    let measured = Measured::of(events, async {
        running = Some(worker.spawn());
        // The handlers' count costs the database nothing: the table is read only once every
        // handler has run, for the last commits.
        while ran.load(Ordering::Relaxed) < events {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        while inbox.counts().await?.pending > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    })
    .await?;
    if let Some(worker) = running {
        worker.drain(Duration::from_secs(10)).await;
    }
    let mut tables = inbox_tables(table);
    tables.push(EFFECTS.to_owned());
    drop_tables(pool, &tables).await?;
    Ok(measured)
}

/// The drain's floors for `events` events ([`floor`]): on connections held for the run, on a
/// connection borrowed for each event, on held connections with the history row, and on
/// borrowed connections with it.
async fn floors<DB: InboxDatabase>(
    pool: &Pool<DB>,
    events: u64,
    statements: (&str, &str),
) -> Result<[Measured; 4], BoxError>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    Ok([
        floor(pool, events, statements, false, false).await?,
        floor(pool, events, statements, true, false).await?,
        floor(pool, events, statements, false, true).await?,
        floor(pool, events, statements, true, true).await?,
    ])
}

/// The drain's floor for `events` events ([`DrainFloor`]: `begin` opens an event's transaction,
/// `body` is a body's literal): as many tasks as the worker has handlers, each sending the
/// statements of its share of the events one event after another, on an inbox table of its own,
/// each on a connection held for the run or, when `borrowing`, on a connection borrowed from the
/// pool for each event, and with the attempt's history row when `history`; measured from the
/// first statement until every task is done.
async fn floor<DB: InboxDatabase>(
    pool: &Pool<DB>,
    events: u64,
    (begin, body): (&str, &str),
    borrowing: bool,
    history: bool,
) -> Result<Measured, BoxError>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let (table, run) = (format!("drain_floor_{}", suffix()), suffix());
    let connections = DB::DEFAULT_CONCURRENCY;
    let per_connection = events / connections as u64;
    let mut floor = DrainFloor::new(&table, EFFECTS, &run, begin, body);
    if history {
        // Postgres writes the row in the completion, as its driver does.
        floor = floor.with_history(&table, begin == "BEGIN");
    }
    Inbox::new(pool.clone(), &table)?.migrate().await?;
    effects(pool).await?;
    sqlx::query(sqlx::AssertSqlSafe(floor.fill.as_str()))
        .bind(connections as i64)
        .bind(per_connection as i64)
        .execute(pool)
        .await?;
    let mut held = Vec::with_capacity(connections);
    for _ in 0..connections {
        held.push(pool.acquire().await?);
    }
    if borrowing {
        held.clear();
    }
    let statements = Arc::new(floor.statements);
    let measured = Measured::of(per_connection * connections as u64, async {
        let sent = (0..connections).map(|j| {
            let (statements, run, pool) = (statements.clone(), run.clone(), pool.clone());
            let mut kept = held.pop();
            tokio::spawn(async move {
                for i in 1..=per_connection {
                    let id = format!("{run}_{j}_{i}");
                    let mut connection = match kept.take() {
                        Some(connection) => connection,
                        None => pool.acquire().await?,
                    };
                    for statement in statements.iter() {
                        let query = sqlx::query(sqlx::AssertSqlSafe(statement.as_str()));
                        let query = match statement.contains("$1") {
                            true => query.bind(id.clone()),
                            false => query,
                        };
                        query.execute(&mut *connection).await?;
                    }
                    // Borrowed: dropped, so back to the pool.
                    if !borrowing {
                        kept = Some(connection);
                    }
                }
                Ok::<(), sqlx::Error>(())
            })
        });
        for done in sent.collect::<Vec<_>>() {
            let done = done.await;
            done??;
        }
        Ok(())
    })
    .await?;
    let mut tables = inbox_tables(&table);
    tables.push(EFFECTS.to_owned());
    drop_tables(pool, &tables).await?;
    Ok(measured)
}
