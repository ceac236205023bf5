//! The reference receiver: every shipped webhook provider plus a client-keyed `POST /orders`,
//! guarded by `IdempotencyLayer` and configured only by environment variables.
//!
//! ```text
//! STRIPE_WEBHOOK_SECRET=whsec_test GITHUB_WEBHOOK_SECRET=s3cret-key \
//!     cargo run --release --example receiver
//! ```
//!
//! | variable | meaning |
//! |---|---|
//! | `RECEIVER_ADDR` | listen address (default `127.0.0.1:3000`; port `0` picks a free one) |
//! | `IDEMPOTENCY_STORE` | `memory`, `sqlite://PATH` (default `sqlite://receiver.db`), `postgres://...`, `redis://...` |
//! | `IDEMPOTENCY_LEASE_MS` | in-flight lease (default: the layer's 60 s) |
//! | `IDEMPOTENCY_TTL_SECS` | how long completed responses are replayed (default: per provider) |
//! | `HANDLER_DELAY_MS` | every handler sleeps this long (default 0) |
//! | `IDEMPOTENCY_WAIT_MS` | a duplicate of an in-flight `POST /orders` waits this long for its result instead of `409` (unset: no wait) |
//! | `INBOX_MAX_ATTEMPTS` | `POST /inbox/stripe`: attempts before an event is failed (default 10) |
//! | `INBOX_BACKOFF_MS` | `POST /inbox/stripe`: the retry delay after the first failed attempt, doubling after each (default 1000) |
//! | `INBOX_LEASE_MS` | `POST /inbox/stripe`: how long an attempt's claim lasts; a crashed attempt is retried after it (default 60000) |
//! | `INBOX_SWEEP_MS` | `POST /inbox/stripe`: how often the worker looks for due events (default 1000) |
//! | `RUST_LOG` | log filter (default `info`); logs go to stderr |
//!
//! A webhook route is mounted for each provider whose variable is set; several comma-separated
//! secrets mean rotation (current first):
//!
//! | variable | route `POST /webhooks/...` |
//! |---|---|
//! | `STRIPE_WEBHOOK_SECRET` | `stripe` |
//! | `GITHUB_WEBHOOK_SECRET` | `github` |
//! | `SLACK_SIGNING_SECRET` | `slack` (answers `url_verification`) |
//! | `STANDARD_WEBHOOKS_SECRET` (`whsec_...`) | `standard` |
//! | `SHOPIFY_WEBHOOK_SECRET` | `shopify` |
//! | `PADDLE_WEBHOOK_SECRET` | `paddle` |
//! | `LINEAR_WEBHOOK_SECRET` | `linear` |
//! | `GITLAB_WEBHOOK_TOKEN` | `gitlab` |
//! | `ZOOM_WEBHOOK_SECRET` | `zoom` (answers `endpoint.url_validation`) |
//! | `DISCORD_PUBLIC_KEY` (hex) | `discord` (answers `PING`) |
//! | `SENDGRID_VERIFICATION_KEY` (base64 DER) | `sendgrid` |
//! | `MAILGUN_SIGNING_KEY` | `mailgun` |
//! | `SQUARE_SIGNATURE_KEY` + `SQUARE_NOTIFICATION_URL` | `square` |
//! | `TWILIO_AUTH_TOKEN` + `RECEIVER_PUBLIC_URL` (base URL Twilio calls) | `twilio` |
//!
//! The first line on stdout is
//! `listening on http://ADDR`. Routes: `POST /webhooks/<provider>`, `POST /orders` (requires
//! `Idempotency-Key`, answers `201 {"order_id", "request"}`), `GET /effects`, `GET /health`, and
//! on a SQL store (`sqlite://`, `postgres://`) `POST /payments` (requires `Idempotency-Key`,
//! body `{"amount": N}`; runs in the transactional mode: inserts one row into the table
//! `payments` of the store's database, waits `HANDLER_DELAY_MS` inside the transaction, answers
//! `201 {"payment_id", "amount"}`).
//!
//! Built with the `inbox` feature, on a SQL store and with `STRIPE_WEBHOOK_SECRET` set, it also
//! mounts the webhook inbox (docs/inbox.md): `POST /inbox/stripe` answers `200` once the verified
//! event is stored; a worker then waits `HANDLER_DELAY_MS` and inserts one row into the table
//! `inbox_effects` in the event's transaction. Events whose `type` is `test.poison` always fail,
//! `test.flaky` fails its first two attempts. `GET /inbox/failed` answers the failed event ids
//! (a JSON array), `POST /inbox/failed/<event id>/retry` re-queues one (`202`, `404` when it is
//! not failed).
//!
//! Built with the `metrics` feature (`--features metrics`), it also serves `GET /metrics`: the
//! layer's metrics in the Prometheus text format (docs/observability.md).
//!
//! `GET /effects` counts how many times each handler ran per key, named `<route>:<event key>`.
//! The counts live in this process's memory: they count the executions of this process only and
//! start from zero after a restart (persisting them would make them survive one; out of scope).
//! The exceptions are `payments:<key>` and `inbox:<event id>`: the rows of `payments` for that
//! key and of `inbox_effects` for that event, read from the database, so they survive restarts.

use std::{
    collections::{BTreeMap, HashMap},
    hash::{BuildHasher, RandomState},
    net::SocketAddr,
    process::ExitCode,
    str::FromStr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use axum::{
    body::{Body, Bytes},
    extract::{Request, State},
    http::{header, HeaderMap, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use serde_json::{json, Value};
use tower_idempotency::{
    connect_store,
    webhooks::{self, discord, slack, zoom},
    ConnectStoreError, IdempotencyLayer, Outcome, ShutdownHandle, Store, VerifiedWebhook,
    WebhookLayerExt, IDEMPOTENCY_KEY, PROBLEM_JSON, PROBLEM_TYPE_PREFIX,
};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use tower_idempotency::{sqlx, IdempotentTx};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[cfg(feature = "inbox")]
#[path = "receiver/inbox.rs"]
mod inbox;
#[cfg(not(feature = "inbox"))]
#[path = "receiver/no_inbox.rs"]
mod inbox;

const DEFAULT_ADDR: &str = "127.0.0.1:3000";
const DEFAULT_STORE: &str = "sqlite://receiver.db";
/// How long running handlers get to finish and record their results on shutdown.
const DRAIN_DEADLINE: Duration = Duration::from_secs(30);
/// A syntactically valid scoped key that no request can produce (its namespace is not used).
const HEALTH_PROBE_KEY: &str =
    "health-probe:0000000000000000000000000000000000000000000000000000000000000000";

// ---------------------------------------------------------------------------------------------
// Configuration

/// Why the receiver could not start. Messages name variables, never their values.
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("{name} is not valid: {expected}")]
    Invalid {
        name: &'static str,
        expected: &'static str,
    },
    #[error("{name} is set but {needs} is not")]
    Incomplete {
        name: &'static str,
        needs: &'static str,
    },
    #[error("{name} is not usable")]
    Provider {
        name: &'static str,
        #[source]
        source: webhooks::ConfigError,
    },
    #[error(transparent)]
    Store(#[from] ConnectStoreError),
    #[error("the payments table could not be prepared")]
    Payments(#[source] BoxError),
    #[error("the webhook inbox could not be started")]
    Inbox(#[source] BoxError),
    #[error("cannot listen: {0}")]
    Io(#[from] std::io::Error),
    #[cfg(feature = "metrics")]
    #[error("the metrics recorder could not be installed")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
}

/// The webhook inbox's settings (`POST /inbox/stripe`, feature `inbox`).
struct InboxSettings {
    handler_delay: Duration,
    max_attempts: u32,
    backoff: Duration,
    lease: Option<Duration>,
    sweep: Option<Duration>,
}

struct Config {
    addr: SocketAddr,
    store_url: String,
    handler_delay: Duration,
    lease: Option<Duration>,
    ttl: Option<Duration>,
    /// `POST /orders` only: how long a duplicate waits for an in-flight result.
    wait: Option<Duration>,
    inbox: InboxSettings,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|value| value.trim().to_owned())
        .filter(|value| !value.is_empty())
}

fn parsed<T: FromStr>(name: &'static str, expected: &'static str) -> Result<Option<T>, StartError> {
    var(name)
        .map(|value| {
            value
                .parse()
                .map_err(|_| StartError::Invalid { name, expected })
        })
        .transpose()
}

/// A comma-separated list of secrets, current first; `None` when the variable is unset.
fn secrets(name: &str) -> Option<Vec<String>> {
    let list: Vec<String> = var(name)?
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    (!list.is_empty()).then_some(list)
}

impl Config {
    fn from_env() -> Result<Self, StartError> {
        let millis = "a whole number of milliseconds";
        Ok(Self {
            addr: parsed("RECEIVER_ADDR", "an address such as 127.0.0.1:3000")?
                .unwrap_or_else(|| DEFAULT_ADDR.parse().expect("valid default")),
            store_url: var("IDEMPOTENCY_STORE").unwrap_or_else(|| DEFAULT_STORE.to_owned()),
            handler_delay: Duration::from_millis(parsed("HANDLER_DELAY_MS", millis)?.unwrap_or(0)),
            lease: parsed("IDEMPOTENCY_LEASE_MS", millis)?.map(Duration::from_millis),
            wait: parsed("IDEMPOTENCY_WAIT_MS", millis)?.map(Duration::from_millis),
            ttl: parsed("IDEMPOTENCY_TTL_SECS", "a whole number of seconds")?
                .map(Duration::from_secs),
            inbox: InboxSettings {
                handler_delay: Duration::from_millis(
                    parsed("HANDLER_DELAY_MS", millis)?.unwrap_or(0),
                ),
                max_attempts: parsed("INBOX_MAX_ATTEMPTS", "a whole number")?.unwrap_or(10),
                backoff: Duration::from_millis(parsed("INBOX_BACKOFF_MS", millis)?.unwrap_or(1000)),
                lease: parsed("INBOX_LEASE_MS", millis)?.map(Duration::from_millis),
                sweep: parsed("INBOX_SWEEP_MS", millis)?.map(Duration::from_millis),
            },
        })
    }

    /// Applies the lease and TTL overrides; unset ones keep the layer's (provider's) default.
    fn tune(&self, mut layer: IdempotencyLayer) -> IdempotencyLayer {
        if let Some(lease) = self.lease {
            layer = layer.lease(lease);
        }
        if let Some(ttl) = self.ttl {
            layer = layer.ttl(ttl);
        }
        layer
    }

    /// The store's kind, for logs: the URL itself may carry a password.
    fn store_kind(&self) -> &str {
        self.store_url.split(':').next().unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------------
// Providers

type Build = fn(Vec<String>, Arc<dyn Store>) -> Result<IdempotencyLayer, webhooks::ConfigError>;

/// A provider whose route is mounted when its variable is set.
struct Provider {
    var: &'static str,
    route: &'static str,
    build: Build,
}

/// Every provider configured by one variable. Square and Twilio also need the URL they call
/// (they sign it), so [`webhook_layers`] handles them.
fn providers() -> [Provider; 12] {
    let p = |var, route, build| Provider { var, route, build };
    [
        p("STRIPE_WEBHOOK_SECRET", "stripe", |s, st| {
            Ok(IdempotencyLayer::stripe(s, st))
        }),
        p("GITHUB_WEBHOOK_SECRET", "github", |s, st| {
            Ok(IdempotencyLayer::github(s, st))
        }),
        p("SLACK_SIGNING_SECRET", "slack", |s, st| {
            Ok(IdempotencyLayer::slack(s, st))
        }),
        p(
            "STANDARD_WEBHOOKS_SECRET",
            "standard",
            IdempotencyLayer::standard_webhooks,
        ),
        p("SHOPIFY_WEBHOOK_SECRET", "shopify", |s, st| {
            Ok(IdempotencyLayer::shopify(s, st))
        }),
        p("PADDLE_WEBHOOK_SECRET", "paddle", |s, st| {
            Ok(IdempotencyLayer::paddle(s, st))
        }),
        p("LINEAR_WEBHOOK_SECRET", "linear", |s, st| {
            Ok(IdempotencyLayer::linear(s, st))
        }),
        p("GITLAB_WEBHOOK_TOKEN", "gitlab", |s, st| {
            Ok(IdempotencyLayer::gitlab(s, st))
        }),
        p("ZOOM_WEBHOOK_SECRET", "zoom", |s, st| {
            Ok(IdempotencyLayer::zoom(s, st))
        }),
        p("DISCORD_PUBLIC_KEY", "discord", IdempotencyLayer::discord),
        p(
            "SENDGRID_VERIFICATION_KEY",
            "sendgrid",
            IdempotencyLayer::sendgrid,
        ),
        p("MAILGUN_SIGNING_KEY", "mailgun", |s, st| {
            Ok(IdempotencyLayer::mailgun(s, st))
        }),
    ]
}

/// The webhook layers to mount, keyed by route name.
fn webhook_layers(
    store: &Arc<dyn Store>,
) -> Result<Vec<(&'static str, IdempotencyLayer)>, StartError> {
    let mut layers = Vec::new();
    for provider in providers() {
        if let Some(secrets) = secrets(provider.var) {
            // Refused here as a start error rather than by the constructor's panic.
            for secret in &secrets {
                webhooks::Secret::try_new(secret).map_err(|source| StartError::Provider {
                    name: provider.var,
                    source,
                })?;
            }
            let layer = (provider.build)(secrets, store.clone()).map_err(|source| {
                StartError::Provider {
                    name: provider.var,
                    source,
                }
            })?;
            layers.push((provider.route, layer));
        }
    }
    if let Some(keys) = secrets("SQUARE_SIGNATURE_KEY") {
        let name = "SQUARE_SIGNATURE_KEY";
        let url = var("SQUARE_NOTIFICATION_URL").ok_or(StartError::Incomplete {
            name,
            needs: "SQUARE_NOTIFICATION_URL",
        })?;
        let layer = IdempotencyLayer::square(url, keys, store.clone())
            .map_err(|source| StartError::Provider { name, source })?;
        layers.push(("square", layer));
    }
    if let Some(tokens) = secrets("TWILIO_AUTH_TOKEN") {
        let name = "TWILIO_AUTH_TOKEN";
        let url = var("RECEIVER_PUBLIC_URL").ok_or(StartError::Incomplete {
            name,
            needs: "RECEIVER_PUBLIC_URL",
        })?;
        let layer = IdempotencyLayer::twilio(&url, tokens, store.clone())
            .map_err(|source| StartError::Provider { name, source })?;
        layers.push(("twilio", layer));
    }
    Ok(layers)
}

// ---------------------------------------------------------------------------------------------
// Handlers

/// Executions per `<route>:<event key>`, in this process.
#[derive(Clone, Default)]
struct Effects(Arc<Mutex<HashMap<String, u64>>>);

impl Effects {
    fn record(&self, route: &str, key: &str) {
        *self
            .0
            .lock()
            .unwrap()
            .entry(format!("{route}:{key}"))
            .or_default() += 1;
    }

    fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap().clone().into_iter().collect()
    }
}

#[derive(Clone)]
struct App {
    effects: Effects,
    store: Arc<dyn Store>,
    handler_delay: Duration,
    payments: Option<payments::Payments>,
    inbox_effects: Option<inbox::Effects>,
}

impl App {
    /// Records the side effect, then simulates the rest of the work (a database write, a call).
    async fn execute(&self, route: &str, key: &str) {
        self.effects.record(route, key);
        if !self.handler_delay.is_zero() {
            tokio::time::sleep(self.handler_delay).await;
        }
    }
}

/// Endpoint-validation requests (Slack, Zoom, Discord) are answered, not executed.
fn challenge_answer(webhook: &VerifiedWebhook) -> Option<Response> {
    slack::url_verification_response(webhook)
        .or_else(|| zoom::url_validation_response(webhook))
        .or_else(|| discord::ping_response(webhook))
}

async fn handle_webhook(app: App, route: &'static str, webhook: VerifiedWebhook) -> Response {
    if let Some(answer) = challenge_answer(&webhook) {
        return answer;
    }
    app.execute(route, webhook.event_id()).await;
    if route == "twilio" {
        // Twilio parses the answer as TwiML: an empty document means "nothing to do".
        return ([(header::CONTENT_TYPE, "text/xml")], "<Response/>").into_response();
    }
    Json(json!({ "received": webhook.event_id(), "route": route })).into_response()
}

fn webhook_routes(route: &'static str, layer: IdempotencyLayer) -> Router<App> {
    let handler =
        move |State(app): State<App>, webhook: VerifiedWebhook| handle_webhook(app, route, webhook);
    Router::new()
        .route(&format!("/webhooks/{route}"), post(handler))
        .route_layer(layer)
}

/// A fresh order id. `RandomState` is seeded per process from the OS, which is unpredictable
/// enough for a demo id without a `rand` dependency; the counter keeps ids distinct.
fn new_order_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("ord_{:016x}", RandomState::new().hash_one(n))
}

async fn create_order(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    // The layer refuses requests without a key before they get here.
    let key = headers
        .get(&IDEMPOTENCY_KEY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    app.execute("orders", key).await;
    let request = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let order = json!({ "order_id": new_order_id(), "request": request });
    (StatusCode::CREATED, Json(order)).into_response()
}

async fn effects(State(app): State<App>) -> Result<Json<BTreeMap<String, u64>>, StatusCode> {
    let mut effects = app.effects.snapshot();
    if let Some(payments) = &app.payments {
        let rows = payments.rows().await.map_err(|error| {
            tracing::error!(%error, "reading the payments table failed");
            StatusCode::SERVICE_UNAVAILABLE
        })?;
        for (key, count) in rows {
            effects.insert(format!("payments:{key}"), count);
        }
    }
    if let Some(inbox) = &app.inbox_effects {
        let rows = inbox.rows().await.map_err(|error| {
            tracing::error!(%error, "reading the inbox_effects table failed");
            StatusCode::SERVICE_UNAVAILABLE
        })?;
        for (event_id, count) in rows {
            effects.insert(format!("inbox:{event_id}"), count);
        }
    }
    Ok(Json(effects))
}

/// `POST /payments`: the transactional mode on the SQL stores. The handler inserts one row
/// `(idempotency_key, amount)` into `payments` through the request's transaction, which the layer
/// commits together with the key's completion: a crash before the commit leaves no row, and the
/// retry writes the only one.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod payments {
    use super::*;

    /// The payments table's own pool (for its DDL and `GET /effects`), by database.
    #[derive(Clone)]
    pub enum Payments {
        #[cfg(feature = "sqlite")]
        Sqlite(sqlx::SqlitePool),
        #[cfg(feature = "postgres")]
        Postgres(sqlx::PgPool),
    }

    #[derive(serde::Deserialize)]
    pub struct Payment {
        amount: i64,
    }

    fn answer(id: i64, amount: i64) -> Response {
        let body = json!({ "payment_id": format!("pay_{id}"), "amount": amount });
        (StatusCode::CREATED, Json(body)).into_response()
    }

    fn key(headers: &HeaderMap) -> &str {
        // The layer refuses requests without a key before they get here.
        headers
            .get(&IDEMPOTENCY_KEY)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    fn failed(error: sqlx::Error) -> Response {
        tracing::error!(%error, "inserting the payment failed");
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }

    impl Payments {
        /// Opens a small pool of its own on the store's database and creates `payments`.
        pub async fn open(url: &str) -> Result<Option<Self>, BoxError> {
            match url.split(':').next().unwrap_or_default() {
                #[cfg(feature = "sqlite")]
                "sqlite" => {
                    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)?
                        .create_if_missing(true)
                        .busy_timeout(Duration::from_secs(5));
                    let pool = sqlx::sqlite::SqlitePoolOptions::new()
                        .max_connections(2)
                        .connect_with(options)
                        .await?;
                    sqlx::raw_sql(
                        "CREATE TABLE IF NOT EXISTS payments (\
                         id INTEGER PRIMARY KEY AUTOINCREMENT, \
                         idempotency_key TEXT NOT NULL, amount INTEGER NOT NULL)",
                    )
                    .execute(&pool)
                    .await?;
                    Ok(Some(Self::Sqlite(pool)))
                }
                #[cfg(feature = "postgres")]
                "postgres" | "postgresql" => {
                    let pool = sqlx::postgres::PgPoolOptions::new()
                        .max_connections(2)
                        .connect(url)
                        .await?;
                    sqlx::raw_sql(
                        "SELECT pg_advisory_xact_lock(hashtext('receiver:payments'));\
                         CREATE TABLE IF NOT EXISTS payments (\
                         id bigserial PRIMARY KEY, \
                         idempotency_key text NOT NULL, amount bigint NOT NULL)",
                    )
                    .execute(&pool)
                    .await?;
                    Ok(Some(Self::Postgres(pool)))
                }
                _ => Ok(None),
            }
        }

        /// The route, behind `layer` (transactional on this database's store).
        pub fn route(&self, layer: IdempotencyLayer) -> Router<App> {
            let router = match self {
                #[cfg(feature = "sqlite")]
                Self::Sqlite(_) => Router::new().route("/payments", post(pay_sqlite)),
                #[cfg(feature = "postgres")]
                Self::Postgres(_) => Router::new().route("/payments", post(pay_postgres)),
            };
            router.route_layer(layer)
        }

        /// Rows of `payments` per idempotency key.
        pub async fn rows(&self) -> Result<Vec<(String, u64)>, BoxError> {
            let sql = "SELECT idempotency_key, count(*) FROM payments GROUP BY idempotency_key";
            let rows: Vec<(String, i64)> = match self {
                #[cfg(feature = "sqlite")]
                Self::Sqlite(pool) => sqlx::query_as(sql).fetch_all(pool).await?,
                #[cfg(feature = "postgres")]
                Self::Postgres(pool) => sqlx::query_as(sql).fetch_all(pool).await?,
            };
            Ok(rows
                .into_iter()
                .map(|(key, n)| (key, n.max(0) as u64))
                .collect())
        }
    }

    #[cfg(feature = "sqlite")]
    async fn pay_sqlite(
        State(app): State<App>,
        mut tx: IdempotentTx<sqlx::Sqlite>,
        headers: HeaderMap,
        Json(payment): Json<Payment>,
    ) -> Response {
        let inserted: Result<i64, _> = sqlx::query_scalar(
            "INSERT INTO payments (idempotency_key, amount) VALUES (?1, ?2) RETURNING id",
        )
        .bind(key(&headers))
        .bind(payment.amount)
        .fetch_one(&mut *tx)
        .await;
        let id = match inserted {
            Ok(id) => id,
            Err(error) => return failed(error),
        };
        // Inside the transaction: a crash now leaves no row.
        tokio::time::sleep(app.handler_delay).await;
        answer(id, payment.amount)
    }

    #[cfg(feature = "postgres")]
    async fn pay_postgres(
        State(app): State<App>,
        mut tx: IdempotentTx<sqlx::Postgres>,
        headers: HeaderMap,
        Json(payment): Json<Payment>,
    ) -> Response {
        let inserted: Result<i64, _> = sqlx::query_scalar(
            "INSERT INTO payments (idempotency_key, amount) VALUES ($1, $2) RETURNING id",
        )
        .bind(key(&headers))
        .bind(payment.amount)
        .fetch_one(&mut *tx)
        .await;
        let id = match inserted {
            Ok(id) => id,
            Err(error) => return failed(error),
        };
        // Inside the transaction: a crash now leaves no row.
        tokio::time::sleep(app.handler_delay).await;
        answer(id, payment.amount)
    }
}

/// `200` when the store answers a read within two seconds, `503` otherwise.
async fn health(State(app): State<App>) -> (StatusCode, Json<Value>) {
    let probe = tokio::time::timeout(Duration::from_secs(2), app.store.get(HEALTH_PROBE_KEY));
    match probe.await {
        Ok(Ok(_)) => (StatusCode::OK, Json(json!({ "status": "ok" }))),
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "store unavailable" })),
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Request log

/// The problem `type` slug of a rejection, re-buffering the (small) problem body.
async fn problem_slug(response: Response) -> (Response, Option<String>) {
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v == PROBLEM_JSON);
    if !is_problem {
        return (response, None);
    }
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 64 * 1024).await else {
        return (Response::from_parts(parts, Body::empty()), None);
    };
    let slug = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|problem| problem["type"].as_str().map(str::to_owned))
        .map(|t| t.trim_start_matches(PROBLEM_TYPE_PREFIX).to_owned());
    (Response::from_parts(parts, Body::from(bytes)), slug)
}

/// One line per request: what the idempotency layer did, and why it refused.
async fn log_request(request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let started = Instant::now();
    let response = next.run(request).await;
    let outcome = response
        .extensions()
        .get::<Outcome>()
        .map_or("unguarded", Outcome::as_str);
    let (response, problem) = problem_slug(response).await;
    let status = response.status().as_u16();
    let problem = problem.as_deref().unwrap_or("-");
    let elapsed_ms = started.elapsed().as_millis() as u64;
    if response.status().is_server_error() {
        tracing::warn!(%method, path, status, outcome, problem, elapsed_ms, "request");
    } else {
        tracing::info!(%method, path, status, outcome, problem, elapsed_ms, "request");
    }
    response
}

// ---------------------------------------------------------------------------------------------
// Startup and shutdown

/// Without a SQL store feature there is no `POST /payments`.
#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
mod payments {
    use super::*;

    #[derive(Clone)]
    pub enum Payments {}

    impl Payments {
        pub async fn open(_url: &str) -> Result<Option<Self>, BoxError> {
            Ok(None)
        }

        pub fn route(&self, _layer: IdempotencyLayer) -> Router<App> {
            match *self {}
        }

        pub async fn rows(&self) -> Result<Vec<(String, u64)>, BoxError> {
            match *self {}
        }
    }
}

/// The webhook inbox, when this build has it, the store is SQL and Stripe is configured.
async fn start_inbox(config: &Config) -> Result<Option<inbox::Running>, StartError> {
    let Some(secrets) = secrets("STRIPE_WEBHOOK_SECRET") else {
        return Ok(None);
    };
    let running = inbox::start(&config.store_url, secrets, &config.inbox)
        .await
        .map_err(StartError::Inbox)?;
    if running.is_some() {
        tracing::info!(path = "/inbox/stripe", "webhook inbox mounted");
    }
    Ok(running)
}

/// The router, and the shutdown handle of every idempotency layer in it.
fn build_app(
    config: &Config,
    store: Arc<dyn Store>,
    payments: Option<payments::Payments>,
    inbox_effects: Option<inbox::Effects>,
) -> Result<(Router, Vec<ShutdownHandle>), StartError> {
    let mut handles = Vec::new();
    let mut router = Router::new()
        .route("/health", get(health))
        .route("/effects", get(effects));
    for (route, layer) in webhook_layers(&store)? {
        let layer = config.tune(layer);
        handles.push(layer.shutdown_handle());
        tracing::info!(path = format!("/webhooks/{route}"), "webhook route mounted");
        router = router.merge(webhook_routes(route, layer));
    }
    let mut orders = config.tune(IdempotencyLayer::client_keys(store.clone()).namespace("orders"));
    if let Some(wait) = config.wait {
        orders = orders.wait_for_result(wait);
    }
    handles.push(orders.shutdown_handle());
    router = router.merge(
        Router::new()
            .route("/orders", post(create_order))
            .route_layer(orders),
    );
    if let Some(payments) = &payments {
        let layer = IdempotencyLayer::client_keys(store.clone())
            .namespace("payments")
            .transactional();
        let layer = config.tune(layer);
        handles.push(layer.shutdown_handle());
        tracing::info!(path = "/payments", "transactional route mounted");
        router = router.merge(payments.route(layer));
    }
    let app = App {
        effects: Effects::default(),
        store,
        handler_delay: config.handler_delay,
        payments,
        inbox_effects,
    };
    let router = router
        .layer(middleware::from_fn(log_request))
        .with_state(app);
    Ok((router, handles))
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutdown requested: no new connections, draining handlers");
}

/// Lets handlers that are still running finish and record their results, so their retries
/// replay instead of running again.
async fn drain(handles: &[ShutdownHandle]) {
    let drained = futures_util::future::join_all(handles.iter().map(|h| h.drain(DRAIN_DEADLINE)));
    if drained.await.iter().all(|&finished| finished) {
        tracing::info!("all handlers finished");
    } else {
        let left: usize = handles.iter().map(ShutdownHandle::in_flight).sum();
        tracing::warn!(left, "handlers still running at the drain deadline");
    }
}

async fn run() -> Result<(), StartError> {
    let config = Config::from_env()?;
    #[cfg(feature = "metrics")]
    let metrics_route = prometheus::install()?;
    let store = connect_store(&config.store_url).await?;
    tracing::info!(store = config.store_kind(), "store ready");
    let payments = payments::Payments::open(&config.store_url)
        .await
        .map_err(StartError::Payments)?;
    let inbox = start_inbox(&config).await?;
    let inbox_effects = inbox.as_ref().map(|running| running.effects.clone());
    let (mut router, handles) = build_app(&config, store, payments, inbox_effects)?;
    let mut inbox_worker = None;
    if let Some(running) = inbox {
        router = router.merge(running.router);
        inbox_worker = Some(running.worker);
    }
    #[cfg(feature = "metrics")]
    let router = router.merge(metrics_route);
    let listener = tokio::net::TcpListener::bind(config.addr).await?;
    let addr = listener.local_addr()?;
    // On stdout, alone, so scripts and tests can read the address (logs go to stderr).
    println!("listening on http://{addr}");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    drain(&handles).await;
    if let Some(worker) = inbox_worker {
        if !inbox::drain(worker, DRAIN_DEADLINE).await {
            tracing::warn!(
                "inbox handlers still running at the drain deadline; their events stay pending"
            );
        }
    }
    Ok(())
}

/// `GET /metrics`: the layer's metrics (docs/observability.md) in the Prometheus text format.
#[cfg(feature = "metrics")]
mod prometheus {
    use std::time::Duration;

    use axum::{http::header, routing::get, Router};
    use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};
    use tower_idempotency::{describe_metrics, STORE_CALL_DURATION_SECONDS};

    /// How often the recorder folds recorded histogram samples into its buckets.
    const UPKEEP: Duration = Duration::from_secs(5);
    /// Store call latency buckets, in seconds: an in-process store answers in microseconds, a
    /// network store in milliseconds; the store timeout bounds the rest.
    const STORE_CALL_BUCKETS: &[f64] = &[
        0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    ];

    /// Installs the Prometheus recorder as the global one and returns the route that renders it.
    pub fn install() -> Result<Router, BuildError> {
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full(STORE_CALL_DURATION_SECONDS.to_owned()),
                STORE_CALL_BUCKETS,
            )?
            .install_recorder()?;
        describe_metrics();
        #[cfg(feature = "inbox")]
        tower_idempotency::inbox::describe_metrics();
        let upkeep = handle.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(UPKEEP);
            loop {
                every.tick().await;
                upkeep.run_upkeep();
            }
        });
        let render = move || {
            let text = handle.render();
            async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    text,
                )
            }
        };
        Ok(Router::new().route("/metrics", get(render)))
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

#[tokio::main]
async fn main() -> ExitCode {
    init_tracing();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let mut message = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            tracing::error!("receiver failed to start: {message}");
            ExitCode::FAILURE
        }
    }
}
