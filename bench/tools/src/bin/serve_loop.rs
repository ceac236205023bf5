//! Serves a fixed number of new-key requests over loopback HTTP, for counting the server's
//! instructions with `valgrind --tool=callgrind`: the load harness's server (the echo handler on
//! `POST /orders`, one Tokio worker, the layer's default settings), with its load generator in
//! a child process that valgrind does not follow, so the counts are the server's alone. Two runs
//! with different counts, subtracted, give the instructions per request without the set-up:
//!
//! ```sh
//! cargo build --release --manifest-path bench/Cargo.toml -p tower-idempotency-tools --bin serve_loop
//! valgrind --tool=callgrind target/release/serve_loop postgres 1024 500
//! valgrind --tool=callgrind target/release/serve_loop postgres 1024 1500
//! ```
//!
//! Arguments: the target, the body size in bytes, the number of requests, and optionally the
//! number of concurrent keep-alive connections (default 32, as the harness). Targets:
//! `bare` (no layer), `memory`, `postgres` (the store with its default lanes), and
//! `postgres-floor` (the harness's `postgres-floor-write`: `INSERT` then `UPDATE` of one row on
//! one of 5 connections, no layer). Postgres is `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); each run uses a table of its own and drops it.

use std::{
    hash::{BuildHasher, RandomState},
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::SystemTime,
};

use axum::{extract::State, routing::post, serve::ListenerExt, Router};
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tokio::sync::Mutex;
use tower_idempotency_core::{IdempotencyLayer, MemoryStore};
use tower_idempotency_sqlx::{
    sqlx::{self, Connection, PgConnection},
    PostgresStore,
};
use tower_idempotency_testkit::order_body;

const USAGE: &str = "usage: serve_loop bare|memory|postgres|postgres-floor BODY_BYTES REQUESTS \
                     [CONNECTIONS]\n       serve_loop --send ADDR BODY_BYTES REQUESTS CONNECTIONS";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--send") {
        return send(&args[1..]);
    }
    let (target, size, requests, connections) = match args.as_slice() {
        [t, s, r] => (t, s, r, "32"),
        [t, s, r, c] => (t, s, r, c.as_str()),
        _ => usage(),
    };
    let (Ok(size), Ok(requests), Ok(connections)) = (
        size.parse::<usize>(),
        requests.parse::<usize>(),
        connections.parse::<usize>(),
    ) else {
        usage()
    };
    // As the harness's server: one worker.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(serve(target, size, requests, connections));
}

fn usage() -> ! {
    eprintln!("{USAGE}");
    std::process::exit(2)
}

/// A name for this run's keys and table.
fn run_id() -> String {
    format!("{:016x}", RandomState::new().hash_one(SystemTime::now()))
}

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

async fn echo(body: Bytes) -> (StatusCode, Bytes) {
    (StatusCode::CREATED, body)
}

async fn serve(target: &str, size: usize, requests: usize, connections: usize) {
    let table = format!("serve_loop_{}", run_id());
    let routes = Router::new().route("/orders", post(echo));
    let mut postgres = None;
    let router = match target {
        "bare" => routes,
        "memory" => routes.route_layer(IdempotencyLayer::client_keys(
            MemoryStore::new().with_max_entries(100_000_000),
        )),
        "postgres" => {
            let store = PostgresStore::connect_with_table(&database_url(), &table)
                .await
                .expect("connect to Postgres");
            store.migrate().await.expect("migrate");
            let store = Arc::new(store);
            postgres = Some(store.pool().clone());
            routes.route_layer(IdempotencyLayer::client_keys(store))
        }
        "postgres-floor" => {
            let floor = Floor::open(&table).await;
            postgres = Some(floor.pool.clone());
            Router::new()
                .route("/orders", post(floor_write))
                .with_state(Arc::new(floor))
        }
        _ => usage(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let status = tokio::process::Command::new(std::env::current_exe().expect("own path"))
        .args(["--send", &addr.to_string()])
        .args([size, requests, connections].map(|n| n.to_string()))
        .status()
        .await
        .expect("start the load generator");
    server.abort();
    if let Some(pool) = postgres {
        sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
            "DROP TABLE IF EXISTS \"{table}\"; DROP TABLE IF EXISTS \"{table}_floor\";"
        )))
        .execute(&pool)
        .await
        .expect("drop the run's table");
    }
    assert!(status.success(), "the load generator failed: {status}");
}

/// The harness's `postgres-floor-write`: `INSERT` then `UPDATE` of one row per request on one of
/// 5 connections, the store's default lane count.
struct Floor {
    pool: sqlx::PgPool,
    connections: Vec<Mutex<PgConnection>>,
    next: AtomicUsize,
    insert: String,
    update: String,
}

impl Floor {
    async fn open(table: &str) -> Self {
        let url = database_url();
        let mut connections = Vec::new();
        for _ in 0..5 {
            let connection = PgConnection::connect(&url).await.expect("connect");
            connections.push(Mutex::new(connection));
        }
        let pool = sqlx::PgPool::connect(&url).await.expect("connect");
        sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
            "CREATE TABLE \"{table}_floor\" (key text COLLATE \"C\" PRIMARY KEY, state smallint NOT NULL, body bytea) WITH (fillfactor = 80)"
        )))
        .execute(&pool)
        .await
        .expect("create the floor's table");
        Self {
            pool,
            connections,
            next: AtomicUsize::new(0),
            insert: format!("INSERT INTO \"{table}_floor\" (key, state) VALUES ($1, 0)"),
            update: format!("UPDATE \"{table}_floor\" SET state = 1, body = $2 WHERE key = $1"),
        }
    }

    async fn write(&self, key: &str, body: &[u8]) -> Result<(), sqlx::Error> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.connections.len();
        let free = (0..n).find_map(|i| self.connections[(start + i) % n].try_lock().ok());
        let mut connection = match free {
            Some(connection) => connection,
            None => self.connections[start % n].lock().await,
        };
        sqlx::query(sqlx::AssertSqlSafe(&*self.insert))
            .bind(key)
            .execute(&mut *connection)
            .await?;
        sqlx::query(sqlx::AssertSqlSafe(&*self.update))
            .bind(key)
            .bind(body)
            .execute(&mut *connection)
            .await?;
        Ok(())
    }
}

async fn floor_write(
    State(floor): State<Arc<Floor>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Bytes) {
    let Some(key) = headers.get("idempotency-key").and_then(|k| k.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, Bytes::new());
    };
    match floor.write(key, &body).await {
        Ok(()) => (StatusCode::CREATED, body),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, Bytes::new()),
    }
}

/// The load generator: `REQUESTS` fresh keys over `CONNECTIONS` keep-alive connections, each
/// sending its next request when the previous one answered `201`.
fn send(args: &[String]) {
    let [addr, size, requests, connections] = args else {
        usage()
    };
    let (Ok(addr), Ok(size), Ok(requests), Ok(connections)) = (
        addr.parse::<SocketAddr>(),
        size.parse::<usize>(),
        requests.parse::<usize>(),
        connections.parse::<usize>(),
    ) else {
        usage()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(connections)
            .build()
            .expect("client");
        let url = format!("http://{addr}/orders");
        let (run, body, next) = (run_id(), order_body(size), Arc::new(AtomicUsize::new(0)));
        let workers: Vec<_> = (0..connections)
            .map(|_| {
                let (client, url, run, body, next) = (
                    client.clone(),
                    url.clone(),
                    run.clone(),
                    body.clone(),
                    next.clone(),
                );
                tokio::spawn(async move {
                    loop {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        if n >= requests {
                            return;
                        }
                        let response = client
                            .post(&url)
                            .header("idempotency-key", format!("{run}-{n}"))
                            .header("content-type", "application/json")
                            .body(body.clone())
                            .send()
                            .await
                            .expect("request");
                        assert_eq!(response.status(), 201, "request {n}");
                        response.bytes().await.expect("response body");
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.await.expect("worker");
        }
    });
}
