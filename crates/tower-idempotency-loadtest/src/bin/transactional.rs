//! The transactional mode's cost, measured side by side in one run on loopback: for SQLite and
//! Postgres, first requests (a new key each) to three routes whose handler inserts one row:
//!
//! - `bare`: no layer; the handler runs `BEGIN; INSERT; COMMIT` on the pool;
//! - `plain`: `IdempotencyLayer::client_keys(store)` in front of the same handler;
//! - `transactional`: `.transactional()`, the handler inserts through `IdempotentTx`.
//!
//! ```text
//! cargo run --release -p tower-idempotency-loadtest --bin transactional -- [SECONDS]
//! ```
//!
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) names the Postgres database;
//! its tables get random names and are dropped at the end. Prints one Markdown table.

use std::{
    hash::{BuildHasher, RandomState},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use axum::{extract::State, http::StatusCode, routing::post, Router};
use tower_idempotency_core::{IdempotencyLayer, Store};
use tower_idempotency_sqlx::{
    sqlx::{self, Database, Pool, Postgres, Sqlite},
    IdempotentTx, PostgresStore, SqliteStore,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn suffix() -> String {
    format!(
        "{:016x}",
        RandomState::new().hash_one(std::time::SystemTime::now())
    )
}

struct Sql {
    insert: String,
}

async fn bare_pg(State((pool, sql)): State<(Pool<Postgres>, Arc<Sql>)>) -> StatusCode {
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query(&sql.insert)
        .bind(1_i64)
        .execute(&mut *tx)
        .await
        .expect("insert");
    tx.commit().await.expect("commit");
    StatusCode::CREATED
}

async fn tx_pg(
    State((_, sql)): State<(Pool<Postgres>, Arc<Sql>)>,
    mut tx: IdempotentTx<Postgres>,
) -> StatusCode {
    sqlx::query(&sql.insert)
        .bind(1_i64)
        .execute(&mut *tx)
        .await
        .expect("insert");
    StatusCode::CREATED
}

async fn bare_sqlite(State((pool, sql)): State<(Pool<Sqlite>, Arc<Sql>)>) -> StatusCode {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.expect("begin");
    sqlx::query(&sql.insert)
        .bind(1_i64)
        .execute(&mut *tx)
        .await
        .expect("insert");
    tx.commit().await.expect("commit");
    StatusCode::CREATED
}

async fn tx_sqlite(
    State((_, sql)): State<(Pool<Sqlite>, Arc<Sql>)>,
    mut tx: IdempotentTx<Sqlite>,
) -> StatusCode {
    sqlx::query(&sql.insert)
        .bind(1_i64)
        .execute(&mut *tx)
        .await
        .expect("insert");
    StatusCode::CREATED
}

async fn serve(router: Router) -> Result<String, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(base)
}

/// `clients` loops sending first requests (fresh keys) for `seconds`: requests/s (answers inside
/// the window), p50, p99, max, and failed requests.
async fn drive(
    url: &str,
    clients: usize,
    seconds: u64,
) -> (f64, Duration, Duration, Duration, u64) {
    let client = reqwest::Client::new();
    let stop = Instant::now() + Duration::from_secs(seconds);
    let errors = Arc::new(AtomicU64::new(0));
    let run = suffix();
    let workers = (0..clients).map(|worker| {
        let (client, url, run, errors) =
            (client.clone(), url.to_owned(), run.clone(), errors.clone());
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = 0u64;
            while Instant::now() < stop {
                n += 1;
                let sent = Instant::now();
                let answer = client
                    .post(&url)
                    .header("idempotency-key", format!("{run}-{worker}-{n}"))
                    .body("{}")
                    .send()
                    .await;
                match answer {
                    // Only answers inside the window count towards the rate.
                    Ok(response) if response.status() == 201 && Instant::now() <= stop => {
                        latencies.push(sent.elapsed())
                    }
                    Ok(response) if response.status() == 201 => {}
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            latencies
        })
    });
    let mut all: Vec<Duration> = Vec::new();
    for worker in workers {
        all.extend(worker.await.expect("worker"));
    }
    let elapsed = seconds as f64;
    all.sort();
    let at = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    let max = all.last().copied().unwrap_or_default();
    (
        all.len() as f64 / elapsed,
        at(0.5),
        at(0.99),
        max,
        errors.load(Ordering::Relaxed),
    )
}

async fn measure(label: &str, routes: [(&str, String); 3], seconds: u64) {
    for clients in [1, 16] {
        for (name, url) in &routes {
            let (rate, p50, p99, max, errors) = drive(url, clients, seconds).await;
            println!(
                "| {label} | {name} | {clients} | {rate:.0} | {:.2} | {:.2} | {:.1} | {errors} |",
                p50.as_secs_f64() * 1e3,
                p99.as_secs_f64() * 1e3,
                max.as_secs_f64() * 1e3
            );
        }
    }
}

fn routes<DB: Database, H1, T1, H2, T2>(
    state: (Pool<DB>, Arc<Sql>),
    store: Arc<dyn Store>,
    bare: H1,
    tx: H2,
) -> Router
where
    H1: axum::handler::Handler<T1, (Pool<DB>, Arc<Sql>)> + Clone,
    H2: axum::handler::Handler<T2, (Pool<DB>, Arc<Sql>)> + Clone,
    T1: 'static,
    T2: 'static,
{
    Router::new()
        .route("/bare", post(bare.clone()))
        .merge(
            Router::new()
                .route("/plain", post(bare))
                .route_layer(IdempotencyLayer::client_keys(store.clone()).namespace("plain")),
        )
        .merge(
            Router::new().route("/transactional", post(tx)).route_layer(
                IdempotencyLayer::client_keys(store)
                    .namespace("transactional")
                    .transactional(),
            ),
        )
        .with_state(state)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    println!("| store | route | clients | requests/s | p50 ms | p99 ms | max ms | errors |");
    println!("|---|---|---|---|---|---|---|---|");

    let dir = std::env::temp_dir().join(format!("tidem-tx-bench-{}", suffix()));
    std::fs::create_dir_all(&dir)?;
    let sqlite =
        Arc::new(SqliteStore::connect(&format!("sqlite://{}/bench.db", dir.display())).await?);
    sqlite.migrate().await?;
    sqlx::raw_sql("CREATE TABLE effects (amount INTEGER NOT NULL)")
        .execute(sqlite.pool())
        .await?;
    let sql = Arc::new(Sql {
        insert: "INSERT INTO effects (amount) VALUES (?1)".into(),
    });
    let router = routes(
        (sqlite.pool().clone(), sql),
        sqlite.clone(),
        bare_sqlite,
        tx_sqlite,
    );
    let base = serve(router).await?;
    let urls = ["bare", "plain", "transactional"].map(|r| (r, format!("{base}/{r}")));
    measure("sqlite", urls, seconds).await;
    let _ = std::fs::remove_dir_all(&dir);

    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(40)
        .connect(&url)
        .await?;
    let table = format!("bench_tx_{}", suffix());
    let effects = format!("bench_effects_{}", suffix());
    let store = Arc::new(PostgresStore::new(pool.clone(), &table)?.with_connection_lanes(16));
    store.migrate().await?;
    sqlx::raw_sql(&format!("CREATE TABLE {effects} (amount bigint NOT NULL)"))
        .execute(&pool)
        .await?;
    let sql = Arc::new(Sql {
        insert: format!("INSERT INTO {effects} (amount) VALUES ($1)"),
    });
    let router = routes((pool.clone(), sql), store.clone(), bare_pg, tx_pg);
    let base = serve(router).await?;
    let urls = ["bare", "plain", "transactional"].map(|r| (r, format!("{base}/{r}")));
    measure("postgres", urls, seconds).await;
    sqlx::raw_sql(&format!("DROP TABLE {effects}; DROP TABLE {table};"))
        .execute(&pool)
        .await?;
    Ok(())
}
