//! The webhook inbox beside the synchronous webhook layer, in one run on loopback: for SQLite and
//! Postgres, signed Stripe deliveries (a new event each) to two routes whose work is inserting
//! one row:
//!
//! - `sync`: `IdempotencyLayer::stripe(..)`; the handler inserts its row before answering;
//! - `inbox`: `Inbox::ack(StripeVerifier)`; the answer comes once the event is stored, and a
//!   worker (4 handlers) inserts the row in the event's transaction afterwards;
//! - `inbox, batch of 1`: the same with `max_ack_batch(1)`: each acknowledgement commits alone.
//!
//! For each route and 1, 16 and 64 concurrent senders it prints the answers per second and their
//! p50/p99; for the inbox also the processing rate: events processed per second from the start
//! of the run until the inbox had no pending event left.
//!
//! ```text
//! cargo run --release --manifest-path bench/Cargo.toml -p tower-idempotency-loadtest --bin inbox -- [SECONDS]
//! ```
//!
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) names the Postgres database;
//! its tables get random names and are dropped at the end. Prints one Markdown table.

mod drive;

use std::{
    str::FromStr,
    sync::Arc,
    time::{Duration, Instant},
};

use drive::{drive, postgres_pool, seconds_arg, serve, suffix, Run};

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
const WORKERS: usize = 4;

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

/// Both routes at 1, 16 and 64 senders; after each inbox run, waits for its backlog.
async fn measure<DB: InboxDatabase>(label: &str, base: &str, inbox: &Inbox<DB>, seconds: u64) {
    for clients in [1, 16, 64] {
        let sync = send_events(format!("{base}/sync"), clients, seconds).await;
        row(label, "sync", clients, &sync, None);
        for (path, route) in [("inbox", "inbox"), ("inbox-alone", "inbox, batch of 1")] {
            let started = Instant::now();
            let acked = send_events(format!("{base}/{path}"), clients, seconds).await;
            while inbox.counts().await.expect("counts").pending > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let processing = acked.answered as f64 / started.elapsed().as_secs_f64();
            row(label, route, clients, &acked, Some(processing));
        }
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

    sqlite(seconds).await?;
    postgres(seconds).await?;
    Ok(())
}

/// Both routes on a SQLite file of their own.
async fn sqlite(seconds: u64) -> Result<(), BoxError> {
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
        .connect_with(options)
        .await?;
    sqlx::raw_sql("CREATE TABLE effects (event_id TEXT NOT NULL)")
        .execute(&pool)
        .await?;
    let effects = Arc::new(Effects {
        insert: "INSERT INTO effects (event_id) VALUES ($1)".into(),
    });
    let inbox = Inbox::new(pool.clone(), "bench_inbox")?;
    inbox.migrate().await?;
    let worker = inbox
        .worker(inbox_sqlite(effects.clone()))
        .concurrency(WORKERS)
        .sweep_every(Duration::from_millis(50))
        .spawn();
    let base = serve(router((pool, effects), store, &inbox, sync_sqlite)).await?;
    measure("sqlite", &base, &inbox, seconds).await;
    worker.drain(Duration::from_secs(10)).await;
    let _ = std::fs::remove_dir_all(&dir);

    Ok(())
}

/// Both routes on Postgres tables of their own, dropped at the end.
async fn postgres(seconds: u64) -> Result<(), BoxError> {
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
    let inbox = Inbox::new(pool.clone(), &inbox_table)?;
    inbox.migrate().await?;
    let worker = inbox
        .worker(inbox_pg(effects.clone()))
        .concurrency(WORKERS)
        .sweep_every(Duration::from_millis(50))
        .spawn();
    let base = serve(router((pool.clone(), effects), store, &inbox, sync_pg)).await?;
    measure("postgres", &base, &inbox, seconds).await;
    worker.drain(Duration::from_secs(10)).await;
    sqlx::raw_sql(&format!(
        "DROP TABLE {effects_table}; DROP TABLE {inbox_table}; DROP TABLE {records};"
    ))
    .execute(&pool)
    .await?;
    Ok(())
}
