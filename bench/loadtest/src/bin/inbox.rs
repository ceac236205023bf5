//! The webhook inbox beside the synchronous webhook layer, in one run on loopback: for SQLite and
//! Postgres, signed Stripe deliveries (a new event each) to two routes whose work is inserting
//! one row:
//!
//! - `sync`: `IdempotencyLayer::stripe(..)`; the handler inserts its row before answering;
//! - `inbox`: `Inbox::ack(StripeVerifier)`; the answer comes once the event is stored, and a
//!   worker (16 handlers, on a pool of 32 connections of its own: the reference receiver's
//!   defaults) inserts the row in the event's transaction afterwards;
//! - `inbox, batch of 1`: the same with `max_ack_batch(1)`: each acknowledgement commits alone;
//! - `peer queue (apalis)`, Postgres only: the same route shape enqueueing each verified event
//!   into apalis 1.0's Postgres storage (answered once the enqueue committed), whose worker (16
//!   handlers and 32 connections, like the inbox's) inserts the row;
//! - `floor`: no HTTP, one `INSERT .. ON CONFLICT DO NOTHING` per transaction from as many
//!   connections as there are senders: what one commit per delivery allows.
//!
//! For each route and 1, 16 and 64 concurrent senders it prints the answers per second and their
//! p50/p99; for the inbox and the peer also the processing rate: events processed per second from
//! the start of the run until no event was left pending. A second table prints the ratios the
//! inbox is held to: its acknowledgements and processing against the floor, the synchronous route
//! and the peer.
//!
//! ```text
//! SQLX_OFFLINE=true cargo run --release --manifest-path bench/Cargo.toml -p tower-idempotency-loadtest --bin inbox -- [SECONDS]
//! ```
//!
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) names the Postgres database;
//! its tables get random names and are dropped at the end. Prints one Markdown table.

mod drive;
mod peer;

use std::{
    str::FromStr,
    sync::Arc,
    time::{Duration, Instant},
};

use drive::{drive, postgres_pool, seconds_arg, serve, suffix, summarize, Run};
use peer::Peer;

use axum::{
    extract::State,
    http::StatusCode,
    routing::{post, post_service},
    Router,
};
use tower_idempotency_core::{IdempotencyLayer, Store};
use tower_idempotency_inbox::{HandlerError, IdempotentTx, Inbox, InboxDatabase, InboxEvent};
use tower_idempotency_sqlx::{
    sqlx::{self, Pool, Postgres, Sqlite},
    PostgresStore, SqliteStore,
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
}

/// The handlers' row, one per event, on each database.
macro_rules! handlers {
    ($sync:ident, $inbox:ident, $db:ty) => {
        async fn $sync(
            State((pool, effects)): State<(Pool<$db>, Arc<Effects>)>,
            webhook: VerifiedWebhook,
        ) -> StatusCode {
            sqlx::query(&effects.insert)
                .bind(webhook.event_id())
                .execute(&pool)
                .await
                .expect("insert");
            StatusCode::OK
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
                    sqlx::query(&effects.insert)
                        .bind(&event.key.event_id)
                        .execute(&mut *tx)
                        .await?;
                    Ok(())
                })
            }
        }
    };
}

handlers!(sync_sqlite, inbox_sqlite, Sqlite);
handlers!(sync_pg, inbox_pg, Postgres);

/// The one-commit-per-delivery floor on each database: `connections` connections of `pool`,
/// held for the run, each committing `insert` (one new id, its own transaction) after another
/// for `seconds`.
macro_rules! floor {
    ($name:ident, $db:ty) => {
        async fn $name(
            pool: &Pool<$db>,
            insert: &str,
            connections: usize,
            seconds: u64,
        ) -> Result<Run, BoxError> {
            let mut held = Vec::with_capacity(connections);
            for _ in 0..connections {
                held.push(pool.acquire().await?);
            }
            let run = suffix();
            let stop = Instant::now() + Duration::from_secs(seconds);
            let tasks: Vec<_> = held
                .into_iter()
                .enumerate()
                .map(|(worker, mut connection)| {
                    let (insert, run) = (insert.to_owned(), run.clone());
                    tokio::spawn(async move {
                        let (mut latencies, mut errors, mut n) = (Vec::new(), 0u64, 0u64);
                        while Instant::now() < stop {
                            n += 1;
                            let sent = Instant::now();
                            match sqlx::query(&insert)
                                .bind(format!("{run}_{worker}_{n}"))
                                .execute(&mut *connection)
                                .await
                            {
                                Ok(_) if Instant::now() <= stop => latencies.push(sent.elapsed()),
                                Ok(_) => {}
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
    };
}

floor!(floor_sqlite, Sqlite);
floor!(floor_pg, Postgres);

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
    peer: Option<(f64, f64)>,
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
        "| {label} | {route} | {clients} | {:.0} | {:.2} | {:.2} | {:.0} | {processing} | {} |",
        run.rate,
        run.p50.as_secs_f64() * 1e3,
        run.p99.as_secs_f64() * 1e3,
        run.max.as_secs_f64() * 1e3,
        run.errors
    );
}

/// Every route at 1, 16 and 64 senders; after each inbox or peer run, waits for its backlog.
/// `floors` holds the floor's rate per sender count.
async fn measure<DB: InboxDatabase>(
    label: &str,
    base: &str,
    inbox: &Inbox<DB>,
    peer: Option<&Peer>,
    floors: &[f64],
    seconds: u64,
) -> Vec<(usize, Rates)> {
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
            let started = Instant::now();
            let acked = send_events(format!("{base}/{path}"), clients, seconds).await;
            while inbox.counts().await.expect("counts").pending > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let processing = acked.answered as f64 / started.elapsed().as_secs_f64();
            row(label, route, clients, &acked, Some(processing));
            if path == "inbox" {
                (rates.inbox, rates.inbox_drain) = (acked.rate, processing);
                rates.inbox_p99_ms = acked.p99.as_secs_f64() * 1e3;
            } else {
                (rates.alone, rates.alone_drain) = (acked.rate, processing);
            }
        }
        if let Some(peer) = peer {
            let started = Instant::now();
            let acked = send_events(format!("{base}/peer"), clients, seconds).await;
            while !peer.drained().await.expect("peer backlog") {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let processing = acked.answered as f64 / started.elapsed().as_secs_f64();
            row(
                label,
                "peer queue (apalis)",
                clients,
                &acked,
                Some(processing),
            );
            rates.peer = Some((acked.rate, processing));
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
        let (peer_acks, peer_drain) = r.peer.map_or(("-".to_owned(), "-".to_owned()), |(a, d)| {
            (ratio(r.inbox, a), ratio(r.inbox_drain, d))
        });
        println!(
            "| {label} | {clients} | {} | {} | {} | {} | {:.2} | {} | {} | {} | {} |",
            ratio(r.inbox, r.floor),
            ratio(r.inbox_drain, r.floor),
            ratio(r.inbox, r.sync),
            ratio(r.inbox_drain, r.sync),
            r.inbox_p99_ms,
            peer_acks,
            peer_drain,
            ratio(r.alone, r.floor),
            ratio(r.alone_drain, r.floor),
        );
    }
}

fn router<S: Clone + Send + Sync + 'static, DB: InboxDatabase, H, T>(
    state: S,
    store: Arc<dyn Store>,
    inbox: &Inbox<DB>,
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
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let seconds = seconds_arg();
    println!(
        "| database | route | senders | answers/s | p50 ms | p99 ms | max ms | processed/s | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");

    let sqlite = sqlite(seconds).await?;
    let postgres = postgres(seconds).await?;

    println!();
    println!(
        "| database | senders | inbox acks / floor | inbox drain / floor | inbox acks / sync \
         | inbox drain / sync | inbox p99 ms | inbox acks / peer | inbox drain / peer \
         | batch of 1: acks / floor | batch of 1: drain / floor |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    ratios("sqlite", &sqlite);
    ratios("postgres", &postgres);
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
            let run = floor_sqlite(&floor_pool, insert, clients, seconds).await;
            floor_pool.close().await;
            run
        }
    })
    .await?;
    let effects = Arc::new(Effects {
        insert: "INSERT INTO effects (event_id) VALUES ($1)".into(),
    });
    let inbox_pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(pool_size::<sqlx::Sqlite>())
        .connect_with(options.clone())
        .await?;
    let inbox = Inbox::new(inbox_pool.clone(), "bench_inbox")?;
    inbox.migrate().await?;
    let worker = inbox
        .worker(inbox_sqlite(effects.clone()))
        .concurrency(workers::<sqlx::Sqlite>())
        .sweep_every(Duration::from_millis(50))
        .spawn();
    let base = serve(router((pool, effects), store, &inbox, sync_sqlite)).await?;
    let rates = measure("sqlite", &base, &inbox, None, &floor_rates, seconds).await;
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
            sqlx::raw_sql(&format!(
                "CREATE TABLE IF NOT EXISTS {floor_table} (id text PRIMARY KEY)"
            ))
            .execute(&floor_pool)
            .await?;
            let insert =
                format!("INSERT INTO {floor_table} (id) VALUES ($1) ON CONFLICT DO NOTHING");
            let run = floor_pg(&floor_pool, &insert, clients, seconds).await;
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
    sqlx::raw_sql(&format!(
        "CREATE TABLE {effects_table} (event_id text NOT NULL)"
    ))
    .execute(&pool)
    .await?;
    let effects = Arc::new(Effects {
        insert: format!("INSERT INTO {effects_table} (event_id) VALUES ($1)"),
    });
    let inbox_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(pool_size::<sqlx::Postgres>())
        .connect(&url)
        .await?;
    let inbox = Inbox::new(inbox_pool.clone(), &inbox_table)?;
    inbox.migrate().await?;
    let worker = inbox
        .worker(inbox_pg(effects.clone()))
        .concurrency(workers::<sqlx::Postgres>())
        .sweep_every(Duration::from_millis(50))
        .spawn();
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
    let base =
        serve(router((pool.clone(), effects), store, &inbox, sync_pg).merge(peer.router())).await?;
    let rates = measure(
        "postgres",
        &base,
        &inbox,
        Some(&peer),
        &floor_rates,
        seconds,
    )
    .await;
    worker.drain(Duration::from_secs(10)).await;
    peer.stop().await?;
    sqlx::raw_sql(&format!(
        "DROP TABLE {effects_table}; DROP TABLE {inbox_table}; DROP TABLE {records}; \
         DROP TABLE {floor_table};"
    ))
    .execute(&pool)
    .await?;
    Ok(rates)
}
