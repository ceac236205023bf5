//! The webhook inbox beside the synchronous webhook layer, in one run on loopback: for SQLite and
//! Postgres, signed Stripe deliveries (a new event each) to two routes whose work is inserting
//! one row:
//!
//! - `sync`: `IdempotencyLayer::stripe(..)`; the handler inserts its row before answering;
//! - `inbox`: `Inbox::ack(StripeVerifier)`; the answer comes once the event is stored, and a
//!   worker at the reference receiver's defaults (16 handlers on Postgres and 4 on SQLite, on a
//!   pool of its own of twice that) inserts the row in the event's transaction afterwards;
//! - `inbox, batch of 1`: the same with `max_ack_batch(1)`: each acknowledgement commits alone;
//! - `inbox, burst`: the same route on an inbox of its own whose worker starts only once the
//!   senders stop: the acknowledgements alone, then the backlog drained with nothing else running
//!   (a provider replaying a day of retries after an outage);
//! - `inbox, burst, 4 commits in flight`, Postgres only: the burst's acknowledgements with
//!   `ack_commits_in_flight(4)`, on the same table, drained afterwards without a measurement;
//! - `peer queue (apalis)`, Postgres only: the same route shape enqueueing each verified event
//!   into apalis 1.0's Postgres storage (answered once the enqueue committed), whose worker (16
//!   handlers and 32 connections, like the inbox's) inserts the row;
//! - `peer queue (graphile-worker)`, Postgres only: the same route shape in Node.js
//!   (`bench/peer-graphile`, a child process): the signature checked with Stripe's own library,
//!   each verified event added as a graphile-worker 0.17 job (answered once the job's insert
//!   committed), whose worker (16 jobs at once, a pool of 32 connections) inserts the row. Its
//!   rows come last, once the inbox's and apalis's pools are closed: its 32 connections beside
//!   theirs would pass the server's connection limit (Postgres's default, 100);
//! - `floor`: no HTTP, one `INSERT .. ON CONFLICT DO NOTHING` per transaction from as many
//!   connections as there are senders: what one commit per delivery allows;
//! - `floor: the worker's statements per event`: no worker, from as many connections as it has
//!   handlers, on an inbox table of its own filled with pending events: the claim of one event,
//!   then in one transaction the handler's insert and the fenced completion: what the worker's
//!   drain allows while each event keeps a transaction of its own. It is measured at each sender
//!   count right after the burst has drained, and that sender count's ratios use it.
//!
//! For each route and 1, 16 and 64 concurrent senders it prints the answers per second and their
//! p50/p99; for the inbox and the peers also the processing rate: events processed per second
//! from the start of the run until no event was left pending (for the burst, from the worker's
//! start). A second table prints the ratios the inbox is held to: its acknowledgements and
//! processing against the floor, the synchronous route and each peer. A third prints what the
//! machine's cores allow: the busy CPU time of the whole machine (`/proc/stat`: the senders, the
//! server and the database) per acknowledgement while a burst arrives and per event while it
//! drains, each measured with nothing else running; the cores that acknowledgements at half the
//! one-commit floor and a drain at 0.6 of the drain floor would need at once at those costs; and
//! the share of the cores busy while deliveries arrive at the inbox whose worker runs.
//!
//! ```text
//! npm ci --prefix bench/peer-graphile
//! SQLX_OFFLINE=true cargo run --release --manifest-path bench/Cargo.toml -p tower-idempotency-loadtest --bin inbox -- [SECONDS [DATABASES]]
//! ```
//!
//! `SECONDS` (default 3) is the length of each measurement; `DATABASES` (default
//! `sqlite,postgres`) the databases to run, comma-separated. The graphile-worker peer needs `node`
//! (20 or later) and its project's dependencies: without them a run on Postgres stops at the
//! start, naming the `npm` command. `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`) names the Postgres database; its tables and the
//! graphile-worker schema get random names and are dropped at the end. Prints three Markdown tables.

mod drive;
mod graphile;
mod peer;

use std::{
    str::FromStr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use drive::{
    drive, drop_tables, inbox_tables, machine_busy_ns, postgres_pool, seconds_arg, serve, suffix,
    summarize, DrainFloor, Run,
};
use graphile::GraphilePeer;
use peer::Peer;

use axum::{
    extract::State,
    http::StatusCode,
    routing::{post, post_service},
    Router,
};
use tower_idempotency_core::{IdempotencyLayer, Store};
use tower_idempotency_inbox::{
    HandlerError, IdempotentTx, Inbox, InboxDatabase, InboxEvent, InboxHandler, InboxWorker,
};
use tower_idempotency_sqlx::{
    ping_when_idle,
    sqlx::{self, Pool, Postgres, Sqlite},
    PostgresStore, SqliteStore, PING_AFTER_IDLE,
};
use tower_idempotency_webhooks::{
    stripe::{self, StripeVerifier},
    VerifiedWebhook, WebhookLayerExt,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SECRET: &str = "whsec_inbox_bench";
/// The inbox worker's handlers on `DB` (on Postgres also the peer's): the worker's default, which
/// the reference receiver keeps unless `INBOX_CONCURRENCY` says otherwise.
fn workers<DB: InboxDatabase>() -> usize {
    DB::DEFAULT_CONCURRENCY
}

/// The inbox's pool on `DB` (on Postgres also the peer's): the reference receiver's default
/// (`INBOX_POOL_SIZE`, twice the handlers).
fn pool_size<DB: InboxDatabase>() -> u32 {
    2 * workers::<DB>() as u32
}

/// The statements of one database's effects table.
struct Effects {
    insert: String,
    /// The inbox handlers that ran, counted before their commit.
    ran: AtomicU64,
}

impl Effects {
    fn new(insert: String) -> Self {
        Self {
            insert,
            ran: AtomicU64::new(0),
        }
    }
}

/// The handlers' row, one per event, on each database.
macro_rules! handlers {
    ($sync:ident, $inbox:ident, $db:ty) => {
        async fn $sync(
            State((pool, effects)): State<(Pool<$db>, Arc<Effects>)>,
            webhook: VerifiedWebhook,
        ) -> StatusCode {
            // A failed insert (the bench's small pool timing out) is the sender's error count,
            // as the layer answers a failed handler: a 5xx, not a panic.
            match sqlx::query(sqlx::AssertSqlSafe(&*effects.insert))
                .bind(webhook.event_id())
                .execute(&pool)
                .await
            {
                Ok(_) => StatusCode::OK,
                Err(_) => StatusCode::SERVICE_UNAVAILABLE,
            }
        }

        fn $inbox(
            effects: Arc<Effects>,
        ) -> impl Fn(
            InboxEvent,
            IdempotentTx<$db>,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<(), HandlerError>> + Send>,
        > + Send
               + Sync
               + 'static {
            move |event, mut tx| {
                let effects = effects.clone();
                Box::pin(async move {
                    sqlx::query(sqlx::AssertSqlSafe(&*effects.insert))
                        .bind(&event.key.event_id)
                        .execute(&mut *tx)
                        .await?;
                    effects.ran.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                })
            }
        }
    };
}

handlers!(sync_sqlite, inbox_sqlite, Sqlite);
handlers!(sync_pg, inbox_pg, Postgres);

/// A floor on each database: `connections` connections of `pool`, held for the run, each running
/// `statements` in turn for one id after another for `seconds` (the id bound as `$1` where a
/// statement has one; `BEGIN` and `COMMIT` have none). The one-commit-per-delivery floor is one
/// `INSERT` of a new id; the drain floor is the worker's statements for one event.
///
/// With it, the drain floor on each database ([`DrainFloor`]): `label` names the database in the
/// rows, `begin` is how its worker opens an event's transaction, `body` a literal of a body.
macro_rules! floor {
    ($name:ident, $drain:ident, $db:ty, $label:literal, $begin:literal, $body:literal) => {
        async fn $name(
            pool: &Pool<$db>,
            statements: &[String],
            run: &str,
            connections: usize,
            seconds: u64,
        ) -> Result<Run, BoxError> {
            let mut held = Vec::with_capacity(connections);
            for _ in 0..connections {
                held.push(pool.acquire().await?);
            }
            let stop = Instant::now() + Duration::from_secs(seconds);
            let tasks: Vec<_> = held
                .into_iter()
                .enumerate()
                .map(|(worker, mut connection)| {
                    let (statements, run) = (statements.to_vec(), run.to_owned());
                    tokio::spawn(async move {
                        let (mut latencies, mut errors, mut n) = (Vec::new(), 0u64, 0u64);
                        while Instant::now() < stop {
                            n += 1;
                            let (sent, id) = (Instant::now(), format!("{run}_{worker}_{n}"));
                            let mut done = Ok(());
                            for statement in &statements {
                                let query = sqlx::query(sqlx::AssertSqlSafe(statement.as_str()));
                                let query = if statement.contains("$1") {
                                    query.bind(&id)
                                } else {
                                    query
                                };
                                if let Err(error) = query.execute(&mut *connection).await {
                                    // A transaction a failed statement left open ends here.
                                    let _ = sqlx::query("ROLLBACK").execute(&mut *connection).await;
                                    done = Err(error);
                                    break;
                                }
                            }
                            match done {
                                Ok(()) if Instant::now() <= stop => latencies.push(sent.elapsed()),
                                Ok(()) => {}
                                Err(_) => errors += 1,
                            }
                        }
                        (latencies, errors)
                    })
                })
                .collect();
            let (mut all, mut errors) = (Vec::new(), 0);
            for task in tasks {
                let (latencies, failed) = task.await?;
                all.extend(latencies);
                errors += failed;
            }
            Ok(summarize(all, errors, seconds))
        }

        /// The drain floor on the inbox table `inbox` (created here, and dropped with its side
        /// tables afterwards) of `pool`'s database, whose handler inserts into `effects`; prints
        /// its row and answers its rate.
        async fn $drain(
            pool: &Pool<$db>,
            (inbox, effects): (&str, &str),
            seconds: u64,
        ) -> Result<f64, BoxError> {
            let (run, handlers) = (suffix(), workers::<$db>());
            let floor = DrainFloor::new(inbox, effects, &run, $begin, $body);
            Inbox::new(pool.clone(), inbox)?.migrate().await?;
            sqlx::query(sqlx::AssertSqlSafe(&*floor.fill))
                .bind(handlers as i64)
                .bind(DrainFloor::per_connection(seconds))
                .execute(pool)
                .await?;
            let drained = $name(pool, &floor.statements, &run, handlers, seconds).await?;
            row($label, DrainFloor::ROUTE, handlers, &drained, None);
            drop_tables(pool, &inbox_tables(inbox)).await?;
            Ok(drained.rate)
        }
    };
}

floor!(
    floor_sqlite,
    drain_floor_sqlite,
    Sqlite,
    "sqlite",
    "BEGIN IMMEDIATE",
    "X'7B7D'"
);
floor!(
    floor_pg,
    drain_floor_pg,
    Postgres,
    "postgres",
    "BEGIN",
    "'\\x7b7d'"
);

/// The sender counts of every route.
const SENDERS: [usize; 3] = [1, 16, 64];

/// One sender count's answer and processing rates on one database, for the ratios.
#[derive(Default)]
struct Rates {
    floor: f64,
    sync: f64,
    inbox: f64,
    inbox_drain: f64,
    inbox_p99_ms: f64,
    alone: f64,
    alone_drain: f64,
    burst: f64,
    burst_drain: f64,
    /// The worker's statements per event without the worker, from as many connections as it
    /// has handlers, measured right after the burst drained.
    drain_floor: f64,
    /// apalis's acknowledgement and processing rates.
    apalis: Option<(f64, f64)>,
    /// graphile-worker's acknowledgement and processing rates.
    graphile: Option<(f64, f64)>,
    /// The machine's busy CPU time per acknowledgement while a burst's deliveries arrive (the
    /// senders and the server included; no worker runs), µs.
    burst_ack_us: f64,
    /// The machine's busy CPU time per event while the burst's backlog drains, µs.
    burst_drain_us: f64,
    /// The share of the machine's cores busy while deliveries arrive at the inbox whose worker
    /// runs, until it has drained them.
    inbox_busy: f64,
}

/// `phase`'s output, with the machine's busy CPU time while it ran, µs.
async fn busy<T>(phase: impl std::future::Future<Output = T>) -> (T, f64) {
    let before = machine_busy_ns();
    let output = phase.await;
    let ns = machine_busy_ns().saturating_sub(before);
    (output, ns as f64 / 1000.0)
}

/// The machine's cores.
fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// An inbox whose worker is not running while deliveries arrive; `worker` starts one on it.
struct Burst<DB: InboxDatabase> {
    inbox: Inbox<DB>,
    worker: Box<dyn Fn() -> InboxWorker + Send + Sync>,
}

impl<DB: InboxDatabase> Burst<DB> {
    /// An inbox on `table` of `pool`, migrated, whose workers run `handler()`.
    async fn new<H: InboxHandler<DB>>(
        pool: Pool<DB>,
        table: &str,
        handler: impl Fn() -> H + Send + Sync + 'static,
    ) -> Result<Self, BoxError> {
        let inbox = Inbox::new(pool, table)?;
        inbox.migrate().await?;
        let on = inbox.clone();
        Ok(Self {
            inbox,
            worker: Box::new(move || start(&on, handler())),
        })
    }
}

/// A worker on `inbox` at the reference receiver's defaults.
fn start<DB: InboxDatabase>(inbox: &Inbox<DB>, handler: impl InboxHandler<DB>) -> InboxWorker {
    inbox.worker(handler).concurrency(workers::<DB>()).spawn()
}

/// Waits until `inbox` has nothing pending: first until its handlers ran `target` times in all
/// (`effects.ran`, which costs the database nothing; the table is read once a second meanwhile,
/// since `target` counts only the answers inside a run's window), then for the table.
async fn until_drained<DB: InboxDatabase>(inbox: &Inbox<DB>, effects: &Effects, target: u64) {
    let mut read = Instant::now();
    while effects.ran.load(Ordering::Relaxed) < target {
        tokio::time::sleep(Duration::from_millis(5)).await;
        if read.elapsed() >= Duration::from_secs(1) {
            if inbox.counts().await.expect("counts").pending == 0 {
                return;
            }
            read = Instant::now();
        }
    }
    while inbox.counts().await.expect("counts").pending > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A new signed event per request.
fn signed_event(
    client: &reqwest::Client,
    url: &str,
    run: &str,
    worker: usize,
    n: u64,
) -> reqwest::RequestBuilder {
    let body = format!(r#"{{"id":"evt_{run}_{worker}_{n}","type":"bench"}}"#);
    let now = tower_idempotency_testkit::unix_now();
    client
        .post(url)
        .header(
            stripe::SIGNATURE_HEADER,
            stripe::sign(SECRET, now, body.as_bytes()),
        )
        .body(body)
}

async fn send_events(url: String, clients: usize, seconds: u64) -> Run {
    drive(clients, seconds, 200, move |client, run, worker, n| {
        signed_event(client, &url, run, worker, n)
    })
    .await
}

fn row(label: &str, route: &str, clients: usize, run: &Run, processing: Option<f64>) {
    let processing = processing.map_or("-".to_owned(), |rate| format!("{rate:.0}"));
    println!(
        "| {label} | {route} | {clients} | {} | {processing} | {} |",
        run.cells(),
        run.errors
    );
}

/// A peer queue's row at `clients` senders: deliveries to `url` for `seconds`, then polls
/// `drained` until the peer's worker has caught up; answers the acknowledgement and processing
/// rates.
async fn peer_row<F, Fut>(
    (label, route): (&str, &str),
    url: String,
    clients: usize,
    seconds: u64,
    drained: F,
) -> (f64, f64)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<bool, BoxError>>,
{
    let started = Instant::now();
    let acked = send_events(url, clients, seconds).await;
    while !drained().await.expect("peer backlog") {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let processing = acked.answered as f64 / started.elapsed().as_secs_f64();
    row(label, route, clients, &acked, Some(processing));
    (acked.rate, processing)
}

/// Every route at 1, 16 and 64 senders; after each inbox or peer run, waits for its backlog.
/// `floors` holds the floor's rate per sender count; `drain_floor` measures the drain floor,
/// right after each burst has drained (the machine's state moves the floor between sender
/// counts); `effects` counts the inbox handlers' runs.
async fn measure<DB: InboxDatabase, F, Fut>(
    label: &str,
    base: &str,
    (inbox, effects): (&Inbox<DB>, &Effects),
    burst: &Burst<DB>,
    peer: Option<&Peer>,
    (floors, drain_floor): (&[f64], F),
    seconds: u64,
) -> Vec<(usize, Rates)>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<f64, BoxError>>,
{
    let mut all = Vec::new();
    for (clients, floor) in SENDERS.into_iter().zip(floors) {
        let mut rates = Rates {
            floor: *floor,
            ..Rates::default()
        };
        let sync = send_events(format!("{base}/sync"), clients, seconds).await;
        row(label, "sync", clients, &sync, None);
        rates.sync = sync.rate;
        for (path, route) in [("inbox", "inbox"), ("inbox-alone", "inbox, batch of 1")] {
            let (started, ran) = (Instant::now(), effects.ran.load(Ordering::Relaxed));
            let (acked, busy_us) = busy(async {
                let acked = send_events(format!("{base}/{path}"), clients, seconds).await;
                until_drained(inbox, effects, ran + acked.answered).await;
                acked
            })
            .await;
            let elapsed = started.elapsed().as_secs_f64();
            let processing = acked.answered as f64 / elapsed;
            row(label, route, clients, &acked, Some(processing));
            if path == "inbox" {
                (rates.inbox, rates.inbox_drain) = (acked.rate, processing);
                rates.inbox_p99_ms = acked.p99.as_secs_f64() * 1e3;
                rates.inbox_busy = busy_us / (elapsed * 1e6 * cores());
            } else {
                (rates.alone, rates.alone_drain) = (acked.rate, processing);
            }
        }
        let (acked, acks_us) = busy(send_events(format!("{base}/burst"), clients, seconds)).await;
        rates.burst_ack_us = acks_us / acked.answered.max(1) as f64;
        let (started, ran) = (Instant::now(), effects.ran.load(Ordering::Relaxed));
        let (worker, drain_us) = busy(async {
            let worker = (burst.worker)();
            until_drained(&burst.inbox, effects, ran + acked.answered).await;
            worker
        })
        .await;
        let processing = acked.answered as f64 / started.elapsed().as_secs_f64();
        rates.burst_drain_us = drain_us / acked.answered.max(1) as f64;
        worker.drain(Duration::from_secs(10)).await;
        row(label, "inbox, burst", clients, &acked, Some(processing));
        (rates.burst, rates.burst_drain) = (acked.rate, processing);
        rates.drain_floor = drain_floor().await.expect("the drain floor");
        if label == "postgres" {
            let acked = send_events(format!("{base}/burst-four-commits"), clients, seconds).await;
            row(
                label,
                "inbox, burst, 4 commits in flight",
                clients,
                &acked,
                None,
            );
            let ran = effects.ran.load(Ordering::Relaxed);
            let worker = (burst.worker)();
            until_drained(&burst.inbox, effects, ran + acked.answered).await;
            worker.drain(Duration::from_secs(10)).await;
        }
        if let Some(peer) = peer {
            let route = (label, "peer queue (apalis)");
            let url = format!("{base}/peer");
            rates.apalis = Some(peer_row(route, url, clients, seconds, || peer.drained()).await);
        }
        all.push((clients, rates));
    }
    all
}

/// The floor's row at each sender count; returns the rates.
async fn floors<F, Fut>(label: &str, mut floor: F) -> Result<Vec<f64>, BoxError>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<Run, BoxError>>,
{
    let mut rates = Vec::new();
    for clients in SENDERS {
        let run = floor(clients).await?;
        row(label, "floor: one commit per insert", clients, &run, None);
        rates.push(run.rate);
    }
    Ok(rates)
}

/// The ratios the inbox is held to, one line per database and sender count.
fn ratios(label: &str, rates: &[(usize, Rates)]) {
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            format!("{:.2}", a / b)
        } else {
            "-".to_owned()
        }
    };
    for (clients, r) in rates {
        let against = |peer: Option<(f64, f64)>| {
            peer.map_or(("-".to_owned(), "-".to_owned()), |(acks, drain)| {
                (ratio(r.inbox, acks), ratio(r.inbox_drain, drain))
            })
        };
        let (apalis_acks, apalis_drain) = against(r.apalis);
        let (graphile_acks, graphile_drain) = against(r.graphile);
        println!(
            "| {label} | {clients} | {} | {} | {} | {} | {:.2} | {} | {} | {} | {} | {} | {} | {} \
             | {} | {} | {} |",
            ratio(r.inbox, r.floor),
            ratio(r.inbox_drain, r.floor),
            ratio(r.inbox, r.sync),
            ratio(r.inbox_drain, r.sync),
            r.inbox_p99_ms,
            apalis_acks,
            apalis_drain,
            graphile_acks,
            graphile_drain,
            ratio(r.alone, r.floor),
            ratio(r.alone_drain, r.floor),
            ratio(r.burst, r.floor),
            ratio(r.burst_drain, r.floor),
            ratio(r.inbox_drain, r.drain_floor),
            ratio(r.burst_drain, r.drain_floor),
        );
    }
}

/// What the machine's cores allow: the CPU time an acknowledgement and a drained event take,
/// each measured alone in the burst (every process on the machine counted: the senders, the
/// server, the database), and the cores that acknowledgements at half the one-commit floor and a
/// drain at 0.6 of the drain floor would need at once at those costs.
fn capacity(label: &str, rates: &[(usize, Rates)]) {
    for (clients, r) in rates {
        let need = (0.5 * r.floor * r.burst_ack_us + 0.6 * r.drain_floor * r.burst_drain_us) / 1e6;
        println!(
            "| {label} | {clients} | {:.0} | {:.0} | {need:.2} | {:.0} | {:.2} |",
            r.burst_ack_us,
            r.burst_drain_us,
            cores(),
            r.inbox_busy,
        );
    }
}

fn router<S: Clone + Send + Sync + 'static, DB: InboxDatabase, H, T>(
    state: S,
    store: Arc<dyn Store>,
    inbox: &Inbox<DB>,
    burst: &Burst<DB>,
    sync: H,
) -> Router
where
    H: axum::handler::Handler<T, S> + Clone,
    T: 'static,
{
    Router::new()
        .merge(
            Router::new()
                .route("/sync", post(sync))
                .route_layer(IdempotencyLayer::stripe([SECRET], store))
                .with_state(state),
        )
        .route(
            "/inbox",
            post_service(inbox.ack(StripeVerifier::new([SECRET]))),
        )
        // The same table, each acknowledgement committed on its own.
        .route(
            "/inbox-alone",
            post_service(
                inbox
                    .clone()
                    .max_ack_batch(1)
                    .ack(StripeVerifier::new([SECRET])),
            ),
        )
        .route(
            "/burst",
            post_service(burst.inbox.ack(StripeVerifier::new([SECRET]))),
        )
        // The burst's table, four acknowledgement commits in flight.
        .route(
            "/burst-four-commits",
            post_service(
                burst
                    .inbox
                    .clone()
                    .ack_commits_in_flight(4)
                    .ack(StripeVerifier::new([SECRET])),
            ),
        )
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let seconds = seconds_arg();
    let databases = std::env::args()
        .nth(2)
        .unwrap_or_else(|| "sqlite,postgres".into());
    let databases: Vec<&str> = databases.split(',').collect();
    if let Some(unknown) = databases
        .iter()
        .find(|database| !["sqlite", "postgres"].contains(database))
    {
        return Err(format!("unknown database {unknown} (sqlite, postgres)").into());
    }
    let (on_sqlite, on_postgres) = (
        databases.contains(&"sqlite"),
        databases.contains(&"postgres"),
    );
    if on_postgres {
        // Before any measurement: a run is not to end after minutes without its Postgres half.
        graphile::check_installed()?;
    }
    println!(
        "| database | route | senders | answers/s | p50 ms | p99 ms | max ms | processed/s | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");

    let sqlite = if on_sqlite {
        sqlite(seconds).await?
    } else {
        Vec::new()
    };
    let postgres = if on_postgres {
        postgres(seconds).await?
    } else {
        Vec::new()
    };

    println!();
    println!(
        "| database | senders | inbox acks / floor | inbox drain / floor | inbox acks / sync \
         | inbox drain / sync | inbox p99 ms | inbox acks / apalis | inbox drain / apalis \
         | inbox acks / graphile-worker | inbox drain / graphile-worker \
         | batch of 1: acks / floor | batch of 1: drain / floor | burst: acks / floor \
         | burst: drain / floor | inbox drain / drain floor | burst: drain / drain floor |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    ratios("sqlite", &sqlite);
    ratios("postgres", &postgres);

    println!();
    println!(
        "| database | senders | burst: machine µs per ack | burst: machine µs per drained event \
         | cores the targets need | cores | inbox: share of the cores busy |"
    );
    println!("|---|---|---|---|---|---|---|");
    capacity("sqlite", &sqlite);
    capacity("postgres", &postgres);
    Ok(())
}

/// Both routes on a SQLite file of their own.
async fn sqlite(seconds: u64) -> Result<Vec<(usize, Rates)>, BoxError> {
    let dir = std::env::temp_dir().join(format!("tidem-inbox-bench-{}", suffix()));
    std::fs::create_dir_all(&dir)?;
    let url = format!("sqlite://{}/bench.db", dir.display());
    let store = Arc::new(SqliteStore::connect(&url).await?);
    store.migrate().await?;
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(&url)?
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(16)
        .connect_with(options.clone())
        .await?;
    sqlx::raw_sql(
        "CREATE TABLE effects (event_id TEXT NOT NULL); CREATE TABLE floor (id TEXT PRIMARY KEY)",
    )
    .execute(&pool)
    .await?;
    let floor_rates = floors("sqlite", |clients| {
        let options = options.clone();
        async move {
            let floor_pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(clients as u32)
                .connect_with(options)
                .await?;
            let insert = "INSERT INTO floor (id) VALUES ($1) ON CONFLICT DO NOTHING";
            let run =
                floor_sqlite(&floor_pool, &[insert.into()], &suffix(), clients, seconds).await;
            floor_pool.close().await;
            run
        }
    })
    .await?;
    let effects = Arc::new(Effects::new(
        "INSERT INTO effects (event_id) VALUES ($1)".into(),
    ));
    let inbox_pool =
        sqlx::sqlite::SqlitePoolOptions::new().max_connections(pool_size::<sqlx::Sqlite>());
    let inbox_pool = ping_when_idle(inbox_pool, PING_AFTER_IDLE)
        .connect_with(options.clone())
        .await?;
    let drain_floor_on = inbox_pool.clone();
    let drain_floor = || drain_floor_sqlite(&drain_floor_on, ("bench_drain", "effects"), seconds);
    let inbox = Inbox::new(inbox_pool.clone(), "bench_inbox")?;
    inbox.migrate().await?;
    let worker = start(&inbox, inbox_sqlite(effects.clone()));
    let burst = Burst::new(inbox_pool, "bench_burst", {
        let effects = effects.clone();
        move || inbox_sqlite(effects.clone())
    })
    .await?;
    let base = serve(router(
        (pool, effects.clone()),
        store,
        &inbox,
        &burst,
        sync_sqlite,
    ))
    .await?;
    let rates = measure(
        "sqlite",
        &base,
        (&inbox, &effects),
        &burst,
        None,
        (&floor_rates, drain_floor),
        seconds,
    )
    .await;
    worker.drain(Duration::from_secs(10)).await;
    let _ = std::fs::remove_dir_all(&dir);

    Ok(rates)
}

/// Every route on Postgres tables of their own, dropped at the end. The floor runs first, on
/// pools of its own closed after each sender count, so that its 64 connections and the other
/// routes' pools never count against the server's connection limit together.
async fn postgres(seconds: u64) -> Result<Vec<(usize, Rates)>, BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let floor_table = format!("bench_floor_{}", suffix());
    let floor_rates = floors("postgres", |clients| {
        let (url, floor_table) = (url.clone(), floor_table.clone());
        async move {
            let floor_pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(clients as u32)
                .connect(&url)
                .await?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
                "CREATE TABLE IF NOT EXISTS {floor_table} (id text PRIMARY KEY)"
            )))
            .execute(&floor_pool)
            .await?;
            let insert =
                format!("INSERT INTO {floor_table} (id) VALUES ($1) ON CONFLICT DO NOTHING");
            let run = floor_pg(&floor_pool, &[insert], &suffix(), clients, seconds).await;
            floor_pool.close().await;
            run
        }
    })
    .await?;
    let pool = postgres_pool().await?;
    let (records, inbox_table, effects_table) = (
        format!("bench_records_{}", suffix()),
        format!("bench_inbox_{}", suffix()),
        format!("bench_effects_{}", suffix()),
    );
    let store = Arc::new(PostgresStore::new(pool.clone(), &records)?.with_connection_lanes(16));
    store.migrate().await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
        "CREATE TABLE {effects_table} (event_id text NOT NULL)"
    )))
    .execute(&pool)
    .await?;
    let effects = Arc::new(Effects::new(format!(
        "INSERT INTO {effects_table} (event_id) VALUES ($1)"
    )));
    let inbox_pool =
        sqlx::postgres::PgPoolOptions::new().max_connections(pool_size::<sqlx::Postgres>());
    let inbox_pool = ping_when_idle(inbox_pool, PING_AFTER_IDLE)
        .connect(&url)
        .await?;
    let drain_floor = || {
        let (pool, drain_table) = (inbox_pool.clone(), format!("bench_drain_{}", suffix()));
        let effects_table = effects_table.clone();
        async move { drain_floor_pg(&pool, (&drain_table, &effects_table), seconds).await }
    };
    let inbox = Inbox::new(inbox_pool.clone(), &inbox_table)?;
    inbox.migrate().await?;
    let worker = start(&inbox, inbox_pg(effects.clone()));
    let burst_table = format!("bench_burst_{}", suffix());
    let burst = Burst::new(inbox_pool.clone(), &burst_table, {
        let effects = effects.clone();
        move || inbox_pg(effects.clone())
    })
    .await?;
    // The peer: a pool as large as the inbox's, and as many handlers as the inbox's worker.
    let peer = Peer::start(
        &url,
        SECRET,
        format!("bench_peer_{}", suffix()),
        format!("bench_peer_effects_{}", suffix()),
        workers::<sqlx::Postgres>(),
        pool_size::<sqlx::Postgres>(),
    )
    .await?;
    let base = serve(
        router(
            (pool.clone(), effects.clone()),
            store,
            &inbox,
            &burst,
            sync_pg,
        )
        .merge(peer.router()),
    )
    .await?;
    let mut rates = measure(
        "postgres",
        &base,
        (&inbox, &effects),
        &burst,
        Some(&peer),
        (&floor_rates, drain_floor),
        seconds,
    )
    .await;
    worker.drain(Duration::from_secs(10)).await;
    peer.stop().await?;
    // The second peer, graphile-worker, with the same handlers and connections, alone: the
    // inbox's and apalis's pools are closed, lest its connections beside theirs pass the
    // server's limit.
    inbox_pool.close().await;
    let graphile = GraphilePeer::start(
        &pool,
        &url,
        SECRET,
        (
            format!("bench_graphile_{}", suffix()),
            format!("bench_graphile_effects_{}", suffix()),
        ),
        workers::<sqlx::Postgres>(),
        pool_size::<sqlx::Postgres>(),
    )
    .await?;
    for (clients, rates) in &mut rates {
        let route = ("postgres", "peer queue (graphile-worker)");
        let row = peer_row(route, graphile.url(), *clients, seconds, || {
            graphile.drained()
        });
        rates.graphile = Some(row.await);
    }
    graphile.stop().await?;
    let inboxes = [&inbox_table, &burst_table].map(|table| inbox_tables(table));
    sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
        "DROP TABLE {effects_table}, {}, {records}, {floor_table};",
        inboxes.concat().join(", ")
    )))
    .execute(&pool)
    .await?;
    Ok(rates)
}
