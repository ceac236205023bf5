//! The public conformance suite of the transactional mode (feature `conformance`): run it
//! against your own SQL store, as this crate runs it against [`PostgresStore`](crate::PostgresStore)
//! and [`SqliteStore`](crate::SqliteStore).
//!
//! Each case takes a [`Fixture`]: the store under test (whose [`Store::transactions`] must be
//! `Some`, attaching a [`TxHandle`](crate::TxHandle) of the same database, see
//! [`TxHandle::new`](crate::TxHandle::new)) and a pool on
//! the database the store's transactions write to. Every case creates its own effects table
//! with a random name there (and drops it when it passes), serves a handler that inserts one row
//! `(idempotency_key, amount)` through [`IdempotentTx`] behind a transactional
//! [`IdempotencyLayer`] on `127.0.0.1:0`, and checks the rows the database holds afterwards.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tower_idempotency_sqlx::{conformance, PostgresStore};
//!
//! let store = Arc::new(PostgresStore::connect("postgres://app@127.0.0.1/test").await?);
//! store.migrate().await?;
//! let fixture = conformance::Fixture { store: store.clone(), pool: store.pool().clone() };
//! conformance::concurrent_rounds_write_one_row_per_key(&fixture).await;
//! # Ok(())
//! # }
//! ```

use std::{
    hash::{BuildHasher, RandomState},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use axum::{
    extract::{FromRequestParts, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
    Extension, Router,
};
use sqlx::{Database, Pool};
use tokio::sync::{Notify, Semaphore};
use tower_idempotency_core::{CacheDirective, IdempotencyLayer, MemoryStore, Store};

use crate::{backend::BoxFuture, IdempotentTx};

/// The store under test and a pool on the database its transactions write to.
#[derive(Clone)]
pub struct Fixture<DB: Database> {
    /// The store under test; [`Store::transactions`] must be `Some`.
    pub store: Arc<dyn Store>,
    /// A pool on the same database, for the effects table.
    pub pool: Pool<DB>,
}

/// The SQL the suite runs for one database: the effects table's DDL, its insert and its count.
/// Implemented for [`sqlx::Postgres`] and [`sqlx::Sqlite`].
pub trait EffectsDb: Database {
    /// Creates `table` (`idempotency_key`, `amount`, and a nullable `parent` with a deferred
    /// foreign key to `{table}_parents`, which lets a case make `COMMIT` fail).
    fn create<'a>(pool: &'a Pool<Self>, table: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>>;
    /// Drops `table` and `{table}_parents`.
    fn drop_table<'a>(
        pool: &'a Pool<Self>,
        table: &'a str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;
    /// Inserts one row on the handler's connection.
    fn insert<'a>(
        conn: &'a mut Self::Connection,
        table: &'a str,
        key: &'a str,
        amount: i64,
        parent: Option<i64>,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;
    /// The rows of `table` for `key`.
    fn count<'a>(
        pool: &'a Pool<Self>,
        table: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>>;
}

#[cfg(feature = "postgres")]
impl EffectsDb for sqlx::Postgres {
    fn create<'a>(pool: &'a Pool<Self>, table: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let sql = format!(
                r#"CREATE TABLE "{table}_parents" (id bigint PRIMARY KEY);
CREATE TABLE "{table}" (idempotency_key text NOT NULL, amount bigint NOT NULL,
    parent bigint REFERENCES "{table}_parents" (id) DEFERRABLE INITIALLY DEFERRED);"#
            );
            sqlx::raw_sql(&sql).execute(pool).await.map(drop)
        })
    }

    fn drop_table<'a>(
        pool: &'a Pool<Self>,
        table: &'a str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let sql = format!(r#"DROP TABLE IF EXISTS "{table}", "{table}_parents""#);
            sqlx::raw_sql(&sql).execute(pool).await.map(drop)
        })
    }

    fn insert<'a>(
        conn: &'a mut Self::Connection,
        table: &'a str,
        key: &'a str,
        amount: i64,
        parent: Option<i64>,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let sql = format!(
                r#"INSERT INTO "{table}" (idempotency_key, amount, parent) VALUES ($1, $2, $3)"#
            );
            sqlx::query(&sql)
                .bind(key)
                .bind(amount)
                .bind(parent)
                .execute(conn)
                .await
                .map(drop)
        })
    }

    fn count<'a>(
        pool: &'a Pool<Self>,
        table: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>> {
        Box::pin(async move {
            let sql = format!(r#"SELECT count(*) FROM "{table}" WHERE idempotency_key = $1"#);
            sqlx::query_scalar(&sql).bind(key).fetch_one(pool).await
        })
    }
}

#[cfg(feature = "sqlite")]
impl EffectsDb for sqlx::Sqlite {
    fn create<'a>(pool: &'a Pool<Self>, table: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let sql = format!(
                r#"CREATE TABLE "{table}_parents" (id INTEGER PRIMARY KEY);
CREATE TABLE "{table}" (idempotency_key TEXT NOT NULL, amount INTEGER NOT NULL,
    parent INTEGER REFERENCES "{table}_parents" (id) DEFERRABLE INITIALLY DEFERRED);"#
            );
            sqlx::raw_sql(&sql).execute(pool).await.map(drop)
        })
    }

    fn drop_table<'a>(
        pool: &'a Pool<Self>,
        table: &'a str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let sql = format!(
                r#"DROP TABLE IF EXISTS "{table}"; DROP TABLE IF EXISTS "{table}_parents";"#
            );
            sqlx::raw_sql(&sql).execute(pool).await.map(drop)
        })
    }

    fn insert<'a>(
        conn: &'a mut Self::Connection,
        table: &'a str,
        key: &'a str,
        amount: i64,
        parent: Option<i64>,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let sql = format!(
                r#"INSERT INTO "{table}" (idempotency_key, amount, parent) VALUES (?1, ?2, ?3)"#
            );
            sqlx::query(&sql)
                .bind(key)
                .bind(amount)
                .bind(parent)
                .execute(conn)
                .await
                .map(drop)
        })
    }

    fn count<'a>(
        pool: &'a Pool<Self>,
        table: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>> {
        Box::pin(async move {
            let sql = format!(r#"SELECT count(*) FROM "{table}" WHERE idempotency_key = ?1"#);
            sqlx::query_scalar(&sql).bind(key).fetch_one(pool).await
        })
    }
}

/// The handler's behaviour, chosen per request by the `x-effect` header.
pub const EFFECT_HEADER: &str = "x-effect";

struct App {
    table: String,
    executions: AtomicUsize,
    entered: Notify,
    gate: Semaphore,
}

/// Inserts one row for the request's key (its `amount` is the execution's number), then acts as
/// `x-effect` says: `ok` (default) `201 {"amount":n}`; `reject` `400`; `panic` panics;
/// `decline` `402` with `CacheDirective::Complete`; `orphan` inserts a row whose deferred
/// foreign key fails at `COMMIT`; `hold` signals [`EffectsServer::entered`] and waits for
/// [`EffectsServer::open_gate`] before answering `201`.
async fn effect<DB: EffectsDb>(
    State(app): State<Arc<App>>,
    mut tx: IdempotentTx<DB>,
    headers: HeaderMap,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mode = headers
        .get(EFFECT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("ok")
        .to_owned();
    let amount = app.executions.fetch_add(1, Ordering::SeqCst) as i64 + 1;
    let parent = (mode == "orphan").then_some(i64::MAX);
    if let Err(error) = DB::insert(&mut tx, &app.table, &key, amount, parent).await {
        return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response();
    }
    let body = format!("{{\"amount\":{amount}}}");
    match mode.as_str() {
        "reject" => (StatusCode::BAD_REQUEST, "rejected").into_response(),
        "panic" => panic!("the handler panics after its write (expected by the test)"),
        "decline" => (
            StatusCode::PAYMENT_REQUIRED,
            Extension(CacheDirective::Complete),
            body,
        )
            .into_response(),
        "hold" => {
            app.entered.notify_one();
            app.gate.acquire().await.expect("gate").forget();
            (StatusCode::CREATED, body).into_response()
        }
        _ => (StatusCode::CREATED, body).into_response(),
    }
}

/// The suite's HTTP server: `POST /effects` (transactional), `POST /effects-error` (an inner
/// service that writes, then fails) and `POST /misconfigured` (a handler taking
/// [`IdempotentTx`] behind a layer that is not transactional), on `127.0.0.1:0`.
pub struct EffectsServer<DB: EffectsDb> {
    /// `http://127.0.0.1:port`.
    pub base: String,
    app: Arc<App>,
    pool: Pool<DB>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl<DB: EffectsDb> Drop for EffectsServer<DB> {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl<DB: EffectsDb> EffectsServer<DB> {
    /// Creates a fresh effects table and serves it behind `layer` (which must be transactional,
    /// on `fixture.store`).
    pub async fn start(fixture: &Fixture<DB>, layer: IdempotencyLayer) -> Self {
        let table = format!(
            "effects_{:016x}",
            RandomState::new().hash_one(std::time::SystemTime::now())
        );
        DB::create(&fixture.pool, &table)
            .await
            .expect("create the effects table");
        let app = Arc::new(App {
            table,
            executions: AtomicUsize::new(0),
            entered: Notify::new(),
            gate: Semaphore::new(0),
        });
        let failing = tower::service_fn({
            let app = app.clone();
            move |request: axum::extract::Request| {
                let app = app.clone();
                async move {
                    let (mut parts, _) = request.into_parts();
                    let mut tx = IdempotentTx::<DB>::from_request_parts(&mut parts, &())
                        .await
                        .map_err(std::io::Error::other)?;
                    let key = parts
                        .headers
                        .get("idempotency-key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    DB::insert(&mut tx, &app.table, &key, -1, None)
                        .await
                        .map_err(std::io::Error::other)?;
                    Err::<Response, _>(std::io::Error::other("the inner service fails"))
                }
            }
        });
        let failing = tower::Layer::layer(&layer, failing);
        let failing = axum::error_handling::HandleError::new(failing, |_: std::io::Error| async {
            StatusCode::BAD_GATEWAY
        });
        let plain = IdempotencyLayer::client_keys(fixture.store.clone()).namespace("plain");
        let router = Router::new()
            .route("/effects", post(effect::<DB>))
            .route_layer(layer)
            .route_service("/effects-error", failing)
            .merge(
                Router::new()
                    .route("/misconfigured", post(effect::<DB>))
                    .route_layer(plain),
            )
            .with_state(app.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Self {
            base,
            app,
            pool: fixture.pool.clone(),
            stop: Some(stop),
        }
    }

    /// The effects table's name.
    pub fn table(&self) -> &str {
        &self.app.table
    }

    /// How many times a handler (of any route) started.
    pub fn executions(&self) -> usize {
        self.app.executions.load(Ordering::SeqCst)
    }

    /// The rows the database holds for `key`.
    pub async fn rows(&self, key: &str) -> i64 {
        DB::count(&self.pool, &self.app.table, key)
            .await
            .expect("count rows")
    }

    /// Waits until a `hold` handler has written its row and waits.
    ///
    /// # Panics
    /// After 30 s: the handler never got there (e.g. its request was refused).
    pub async fn entered(&self) {
        let entered = self.app.entered.notified();
        tokio::time::timeout(std::time::Duration::from_secs(30), entered)
            .await
            .expect("no `hold` handler reached its hold point within 30 s");
    }

    /// Lets one `hold` handler answer.
    pub fn open_gate(&self) {
        self.app.gate.add_permits(1);
    }

    /// `POST {path}` with `key` and `x-effect: mode`: status, whether it was a replay, body.
    pub async fn post(&self, path: &str, key: &str, mode: &str) -> (StatusCode, bool, String) {
        send(
            &reqwest::Client::new(),
            &format!("{}{path}", self.base),
            key,
            mode,
        )
        .await
    }

    /// Drops the effects table.
    pub async fn finish(self) {
        DB::drop_table(&self.pool, &self.app.table)
            .await
            .expect("drop the effects table");
    }
}

async fn send(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    mode: &str,
) -> (StatusCode, bool, String) {
    let response = client
        .post(url)
        .header("idempotency-key", key)
        .header(EFFECT_HEADER, mode)
        .body("{}")
        .send()
        .await
        .expect("request");
    let status = StatusCode::from_u16(response.status().as_u16()).expect("status");
    let replayed = response.headers().contains_key("idempotent-replayed");
    (status, replayed, response.text().await.expect("body"))
}

/// A fresh client key.
pub fn fresh_key(case: &str) -> String {
    format!(
        "tx-{case}-{:016x}",
        RandomState::new().hash_one(std::time::SystemTime::now())
    )
}

/// The transactional layer the suite uses on `store`.
pub fn layer(store: Arc<dyn Store>) -> IdempotencyLayer {
    IdempotencyLayer::client_keys(store).transactional()
}

fn problem_type(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Over real HTTP: 10 rounds of 25 concurrent identical requests (one key per round) leave
/// exactly one row per key in the handler's table and one handler execution per round; every
/// answer is `201` or `409`, and a later request replays the row's own `amount`.
pub async fn concurrent_rounds_write_one_row_per_key<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let server = EffectsServer::start(fixture, layer(fixture.store.clone())).await;
    let client = reqwest::Client::new();
    let url = format!("{}/effects", server.base);
    for round in 0..10 {
        let key = fresh_key(&format!("round{round}"));
        let before = server.executions();
        let requests = (0..25).map(|_| {
            let (client, url, key) = (client.clone(), url.clone(), key.clone());
            tokio::spawn(async move { send(&client, &url, &key, "ok").await })
        });
        let mut firsts = Vec::new();
        for answer in futures_util::future::join_all(requests).await {
            let (status, replayed, body) = answer.expect("task");
            match status {
                StatusCode::CREATED if !replayed => firsts.push(body),
                StatusCode::CREATED | StatusCode::CONFLICT => {}
                other => panic!("unexpected {other}: {body}"),
            }
        }
        assert!(firsts.len() <= 1, "two first answers: {firsts:?}");
        assert_eq!(server.executions() - before, 1, "one execution per round");
        assert_eq!(server.rows(&key).await, 1, "one row per key");
        let (status, replayed, body) = send(&client, &url, &key, "ok").await;
        assert_eq!((status, replayed), (StatusCode::CREATED, true));
        let amount = before + 1;
        assert_eq!(body, format!("{{\"amount\":{amount}}}"));
        if let Some(first) = firsts.first() {
            assert_eq!(&body, first);
        }
    }
    server.finish().await;
}

/// A handler that wrote and then answers `400` (released by the default policy), panics, or whose
/// inner service fails leaves no row, and its key is released: a retry runs the handler and
/// writes exactly one row.
pub async fn released_answers_write_nothing<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let server = EffectsServer::start(fixture, layer(fixture.store.clone())).await;
    let cases = [
        ("/effects", "reject", StatusCode::BAD_REQUEST),
        ("/effects", "panic", StatusCode::INTERNAL_SERVER_ERROR),
        ("/effects-error", "ok", StatusCode::BAD_GATEWAY),
    ];
    for (path, mode, expected) in cases {
        let key = fresh_key(mode);
        let before = server.executions();
        let (status, _, body) = server.post(path, &key, mode).await;
        assert_eq!(status, expected, "{path} {mode}: {body}");
        if path == "/effects" {
            assert_eq!(server.executions() - before, 1, "{mode}: the handler ran");
        }
        assert_eq!(server.rows(&key).await, 0, "{path} {mode}: nothing written");
        let (status, replayed, _) = server.post("/effects", &key, "ok").await;
        assert_eq!(
            (status, replayed),
            (StatusCode::CREATED, false),
            "{mode}: the key was released, a retry runs"
        );
        assert_eq!(server.rows(&key).await, 1, "{mode}: the retry wrote once");
    }
    server.finish().await;
}

/// `CacheDirective::Complete` on a `402` commits the handler's writes with the completion; the
/// `402` is replayed and nothing is written again.
pub async fn directive_commits_a_non_2xx<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let server = EffectsServer::start(fixture, layer(fixture.store.clone())).await;
    let key = fresh_key("decline");
    let (status, replayed, first) = server.post("/effects", &key, "decline").await;
    assert_eq!((status, replayed), (StatusCode::PAYMENT_REQUIRED, false));
    assert_eq!(server.rows(&key).await, 1);
    let (status, replayed, again) = server.post("/effects", &key, "decline").await;
    assert_eq!((status, replayed), (StatusCode::PAYMENT_REQUIRED, true));
    assert_eq!(again, first);
    assert_eq!(server.rows(&key).await, 1);
    assert_eq!(server.executions(), 1);
    server.finish().await;
}

/// A `COMMIT` that fails (a deferred foreign key) is answered `503 commit-failed`, writes
/// nothing, and releases the key: a retry runs and writes once.
pub async fn failed_commit_writes_nothing<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let server = EffectsServer::start(fixture, layer(fixture.store.clone())).await;
    let key = fresh_key("orphan");
    let (status, _, body) = server.post("/effects", &key, "orphan").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(
        problem_type(&body),
        "urn:tower-idempotency:problem:commit-failed"
    );
    assert_eq!(server.rows(&key).await, 0);
    let (status, replayed, _) = server.post("/effects", &key, "ok").await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));
    assert_eq!(server.rows(&key).await, 1);
    server.finish().await;
}

/// A handler taking [`IdempotentTx`] behind a layer that is not transactional is answered with a
/// `500 transaction-unavailable` problem naming the misconfiguration, before it writes; and
/// `try_transactional` refuses a store without transactions.
pub async fn misconfiguration_is_refused<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let server = EffectsServer::start(fixture, layer(fixture.store.clone())).await;
    let key = fresh_key("misconfigured");
    let (status, _, body) = server.post("/misconfigured", &key, "ok").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(
        problem_type(&body),
        "urn:tower-idempotency:problem:transaction-unavailable"
    );
    assert!(body.contains(".transactional()"), "{body}");
    assert_eq!(server.executions(), 0, "the handler never ran");
    assert_eq!(server.rows(&key).await, 0);
    assert!(IdempotencyLayer::client_keys(MemoryStore::new())
        .try_transactional()
        .is_err());
    server.finish().await;
}

/// A duplicate that arrives while the first request's transaction is open waits for no lock
/// on its claim, and after the commit is answered with the replay; one row in all.
/// (Postgres-like stores only: on SQLite a claim waits for the open transaction's write lock.)
pub async fn duplicate_in_flight_gets_409<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let server = EffectsServer::start(fixture, layer(fixture.store.clone())).await;
    let key = fresh_key("hold");
    let first = {
        let (url, key) = (format!("{}/effects", server.base), key.clone());
        tokio::spawn(async move { send(&reqwest::Client::new(), &url, &key, "hold").await })
    };
    server.entered().await;
    let (status, _, body) = server.post("/effects", &key, "hold").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    server.open_gate();
    let (status, replayed, body) = first.await.expect("task");
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{body}");
    let (status, replayed, again) = server.post("/effects", &key, "hold").await;
    assert_eq!((status, replayed, again), (StatusCode::CREATED, true, body));
    assert_eq!(server.rows(&key).await, 1);
    server.finish().await;
}

/// A caller that disconnects while its handler holds the transaction does not cancel it: the
/// handler finishes on a task of its own and commits once; the retry replays its result.
pub async fn caller_disconnect_still_commits_once<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let server = EffectsServer::start(fixture, layer(fixture.store.clone())).await;
    let key = fresh_key("disconnect");
    let caller = {
        let (url, key) = (format!("{}/effects", server.base), key.clone());
        tokio::spawn(async move { send(&reqwest::Client::new(), &url, &key, "hold").await })
    };
    server.entered().await;
    caller.abort();
    assert!(caller.await.is_err(), "the caller went away");
    server.open_gate();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (status, replayed, _) = loop {
        let answer = server.post("/effects", &key, "ok").await;
        if answer.0 != StatusCode::CONFLICT {
            break answer;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the detached handler never committed"
        );
        tokio::task::yield_now().await;
    };
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(server.rows(&key).await, 1);
    assert_eq!(server.executions(), 1);
    server.finish().await;
}
