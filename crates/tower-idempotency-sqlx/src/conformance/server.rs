//! The suite's HTTP server and the handler whose writes it counts.

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

use axum::{
    error_handling::HandleError,
    extract::{FromRequestParts, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::{any_service, post, MethodRouter},
    Extension, Router,
};
use sqlx::Pool;
use tokio::sync::{Notify, Semaphore};
use tower_idempotency_core::{conformance::LoopbackServer, CacheDirective, IdempotencyLayer};

use super::{EffectsDb, Fixture};
use crate::IdempotentTx;

/// The handler's behaviour, chosen per request by the `x-effect` header.
pub const EFFECT_HEADER: &str = "x-effect";

/// The size of the `large` effect's body: 100 KiB.
pub const LARGE_BODY_BYTES: usize = 100 * 1024;

struct App {
    table: String,
    executions: AtomicUsize,
    entered: Notify,
    gate: Semaphore,
}

/// Inserts one row for the request's key (its `amount` is the execution's number), then acts as
/// `x-effect` says: `ok` (default) `201 {"amount":n}`; `reject` `400`; `panic` panics;
/// `decline` `402` with `CacheDirective::Complete`; `orphan` inserts a row whose deferred
/// foreign key fails at `COMMIT`; `large` answers `201` with a body of [`LARGE_BODY_BYTES`]
/// (`{"amount":n,"pad":"xx…"}`); `hold` signals [`EffectsServer::entered`] and waits for
/// [`EffectsServer::open_gate`] before answering `201`.
async fn effect<DB: EffectsDb>(
    State(app): State<Arc<App>>,
    mut tx: IdempotentTx<DB>,
    headers: HeaderMap,
) -> Response {
    let key = idempotency_key(&headers);
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
        "large" => {
            let pad = LARGE_BODY_BYTES - body.len() - 9;
            let large = format!("{{\"amount\":{amount},\"pad\":\"{}\"}}", "x".repeat(pad));
            (StatusCode::CREATED, large).into_response()
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
    _server: LoopbackServer,
}

impl<DB: EffectsDb> EffectsServer<DB> {
    /// Creates a fresh effects table and serves it behind `layer` (which must be transactional,
    /// on `fixture.store`).
    pub async fn start(fixture: &Fixture<DB>, layer: IdempotencyLayer) -> Self {
        let table = format!("effects_{}", super::random_suffix());
        DB::create(&fixture.pool, &table)
            .await
            .expect("create the effects table");
        let app = Arc::new(App {
            table,
            executions: AtomicUsize::new(0),
            entered: Notify::new(),
            gate: Semaphore::new(0),
        });
        let failing = failing_service::<DB>(&app, &layer);
        let plain = IdempotencyLayer::client_keys(fixture.store.clone()).namespace("plain");
        let router = Router::new()
            .route("/effects", post(effect::<DB>))
            .route_layer(layer)
            .route("/effects-error", failing)
            .merge(
                Router::new()
                    .route("/misconfigured", post(effect::<DB>))
                    .route_layer(plain),
            )
            .with_state(app.clone());
        let server = LoopbackServer::start(router).await;
        Self {
            base: server.url(""),
            app,
            pool: fixture.pool.clone(),
            _server: server,
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

/// `/effects-error`: an inner service behind `layer` that writes its row, then fails; the
/// failure is answered `502`.
fn failing_service<DB: EffectsDb>(
    app: &Arc<App>,
    layer: &IdempotencyLayer,
) -> MethodRouter<Arc<App>> {
    let app = app.clone();
    let inner = tower::service_fn(move |request: axum::extract::Request| {
        let app = app.clone();
        async move {
            let (mut parts, _) = request.into_parts();
            let mut tx = IdempotentTx::<DB>::from_request_parts(&mut parts, &())
                .await
                .map_err(std::io::Error::other)?;
            let key = idempotency_key(&parts.headers);
            DB::insert(&mut tx, &app.table, &key, -1, None)
                .await
                .map_err(std::io::Error::other)?;
            Err::<Response, _>(std::io::Error::other("the inner service fails"))
        }
    });
    let failing = tower::Layer::layer(layer, inner);
    any_service(HandleError::new(failing, |_: std::io::Error| async {
        StatusCode::BAD_GATEWAY
    }))
}

/// The request's `Idempotency-Key`, empty when absent.
fn idempotency_key(headers: &HeaderMap) -> String {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

pub(super) async fn send(
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
