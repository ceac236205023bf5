//! Closed-loop senders for the side-by-side harness binaries (`transactional`, `inbox`): each
//! sender sends its next request when the previous one answered, for a fixed time; and what
//! both binaries set up the same way (the server, the run's length, the Postgres pool).
#![allow(dead_code)] // Each binary reads a different subset of a run.

use std::{
    hash::{BuildHasher, RandomState},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant, SystemTime},
};

use tower_idempotency_sqlx::{ping_when_idle, sqlx, PING_AFTER_IDLE};

/// A name of this run, so that requests of different runs never share a key.
pub fn suffix() -> String {
    format!("{:016x}", RandomState::new().hash_one(SystemTime::now()))
}

/// What one run measured.
pub struct Run {
    /// Expected answers per second inside the window.
    pub rate: f64,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// Expected answers inside the window.
    pub answered: u64,
    /// Requests that failed or answered another status.
    pub errors: u64,
}

impl Run {
    /// The table cells both binaries print for a run: rate, p50, p99 and max (ms).
    pub fn cells(&self) -> String {
        format!(
            "{:.0} | {:.2} | {:.2} | {:.1}",
            self.rate,
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3,
            self.max.as_secs_f64() * 1e3,
        )
    }
}

/// `clients` senders loop for `seconds`; sender `worker`'s `n`-th request is
/// `request(client, run, worker, n)`, and only an answer with status `expected` inside the
/// window counts.
pub async fn drive<F>(clients: usize, seconds: u64, expected: u16, request: F) -> Run
where
    F: Fn(&reqwest::Client, &str, usize, u64) -> reqwest::RequestBuilder + Clone + Send + 'static,
{
    let client = reqwest::Client::new();
    let stop = Instant::now() + Duration::from_secs(seconds);
    let errors = Arc::new(AtomicU64::new(0));
    let run = suffix();
    // Collected before any is awaited: every sender runs at once. (A lazy `map` awaited in
    // the loop below would start each sender only when the previous one had finished.)
    let workers: Vec<_> = (0..clients)
        .map(|worker| {
            let (client, run, errors, request) =
                (client.clone(), run.clone(), errors.clone(), request.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut n = 0u64;
                while Instant::now() < stop {
                    n += 1;
                    let sent = Instant::now();
                    // The body is read to its end, so that the connection goes back to the pool.
                    let answer = match request(&client, &run, worker, n).send().await {
                        Ok(response) => {
                            let status = response.status();
                            response.bytes().await.map(|_| status)
                        }
                        Err(error) => Err(error),
                    };
                    match answer {
                        Ok(status) if status == expected && Instant::now() <= stop => {
                            latencies.push(sent.elapsed())
                        }
                        Ok(status) if status == expected => {}
                        _ => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                latencies
            })
        })
        .collect();
    let mut all: Vec<Duration> = Vec::new();
    for worker in workers {
        all.extend(worker.await.expect("worker"));
    }
    summarize(all, errors.load(Ordering::Relaxed), seconds)
}

/// The run whose answers inside a window of `seconds` took `all`, with `errors` failures.
pub fn summarize(mut all: Vec<Duration>, errors: u64, seconds: u64) -> Run {
    all.sort();
    let at = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Run {
        rate: all.len() as f64 / seconds as f64,
        p50: at(0.5),
        p99: at(0.99),
        max: all.last().copied().unwrap_or_default(),
        answered: all.len() as u64,
        errors,
    }
}

/// Serves `router` on a free loopback port; returns its base URL.
pub async fn serve(router: axum::Router) -> std::io::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(base)
}

/// Seconds per measurement: the first argument, 3 without one.
pub fn seconds_arg() -> u64 {
    std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
}

/// A pool of 40 connections on `DATABASE_URL` (default the local test database), testing a
/// connection before lending it only when it sat idle, as the reference receiver's pools do.
pub async fn postgres_pool() -> Result<sqlx::PgPool, sqlx::Error> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let options = sqlx::postgres::PgPoolOptions::new().max_connections(40);
    ping_when_idle(options, PING_AFTER_IDLE).connect(&url).await
}

/// An inbox's table and the tables `migrate` creates beside it.
pub fn inbox_tables(table: &str) -> Vec<String> {
    ["", "_attempts", "_audit", "_pauses", "_positions"]
        .map(|side| format!("{table}{side}"))
        .to_vec()
}

/// The drain floor's statements and set-up on an inbox table: what the worker sends for one
/// event without the worker (the claim, then the handler's insert and the fenced completion in
/// one transaction), on events that wait pending under the floor's ids.
pub struct DrainFloor {
    /// Fills `inbox` with `per_connection` pending events for each of `connections`, named as
    /// the floor names its ids.
    pub fill: String,
    /// The statements of one event, in order (its id bound as `$1` where one has it).
    pub statements: Vec<String>,
}

impl DrainFloor {
    /// Its row's route.
    pub const ROUTE: &'static str = "floor: the worker's statements per event (senders: handlers)";

    /// `begin` is how the worker opens an event's transaction; `body` a literal of a body.
    pub fn new(inbox: &str, effects: &str, run: &str, begin: &str, body: &str) -> Self {
        let fill = format!(
            "WITH RECURSIVE c(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM c WHERE j + 1 < $1), \
             n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $2) \
             INSERT INTO {inbox} (provider, event_id, headers, body, received_at, available_at) \
             SELECT 'floor', '{run}_' || j || '_' || i, '{{}}', {body}, 0, 0 FROM c, n"
        );
        let event = "provider = 'floor' AND event_id = $1";
        let statements = vec![
            format!(
                "UPDATE {inbox} SET attempts = attempts + 1, lease_token = 7, \
                 lease_until = 9000000000000 WHERE {event} AND state + 0 = 0 \
                 RETURNING headers, body, received_at, attempts"
            ),
            begin.to_owned(),
            format!("INSERT INTO {effects} (event_id) VALUES ($1)"),
            format!(
                "UPDATE {inbox} SET state = 1, finished_at = 0, last_error = NULL, \
                 lease_token = NULL, lease_until = NULL WHERE {event} AND lease_token = 7"
            ),
            "COMMIT".to_owned(),
        ];
        Self { fill, statements }
    }

    /// The same statements with the attempt's history row the worker writes at its default
    /// (`WorkerBuilder::history`): on Postgres inside the completion (`WITH done AS (UPDATE ..
    /// RETURNING 1) INSERT ..`, as `Driver::complete_recorded` does), elsewhere as an `INSERT`
    /// of its own before the commit.
    pub fn with_history(mut self, inbox: &str, in_completion: bool) -> Self {
        let record = format!(
            "INSERT INTO {inbox}_attempts (provider, event_id, attempt, started_at, duration_ms, \
             outcome, error, status, response)"
        );
        let values = "'floor', $1, 1, 0, 0, 1, NULL, NULL, NULL";
        let completion = self.statements.len() - 2;
        if in_completion {
            let update = &self.statements[completion];
            self.statements[completion] =
                format!("WITH done AS ({update} RETURNING 1) {record} SELECT {values} FROM done");
        } else {
            self.statements
                .insert(completion + 1, format!("{record} VALUES ({values})"));
        }
        self
    }

    /// Events enough for `connections` floor connections over `seconds`.
    pub fn per_connection(seconds: u64) -> i64 {
        2_000 * i64::try_from(seconds).unwrap_or(60)
    }
}

/// The machine's busy CPU time so far, ns: `/proc/stat`'s first line without idle and iowait.
pub fn machine_busy_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|field| field.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: USER_HZ is 100 on Linux.
    let busy: u64 = ticks
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4 && *i < 8)
        .map(|(_, t)| t)
        .sum();
    busy * 10_000_000
}

/// Drops `tables` of `pool`'s database.
pub async fn drop_tables<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
    tables: &[String],
) -> Result<(), sqlx::Error>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let drop: Vec<String> = tables
        .iter()
        .map(|name| format!("DROP TABLE IF EXISTS {name}"))
        .collect();
    sqlx::raw_sql(sqlx::AssertSqlSafe(drop.join(";\n")))
        .execute(pool)
        .await?;
    Ok(())
}
