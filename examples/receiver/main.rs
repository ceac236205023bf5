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
//! | `IDEMPOTENCY_STORE` | `memory`, `sqlite://PATH` (default `sqlite://receiver.db`), `postgres://...`, `mysql://...` (MySQL or MariaDB; build with `--features mysql`), `redis://...` |
//! | `IDEMPOTENCY_LEASE_MS` | in-flight lease (default: the layer's 60 s) |
//! | `IDEMPOTENCY_TTL_SECS` | how long completed responses are replayed (default: per provider) |
//! | `HANDLER_DELAY_MS` | every handler sleeps this long (default 0) |
//! | `IDEMPOTENCY_WAIT_MS` | a duplicate of an in-flight `POST /orders` waits this long for its result instead of `409` (unset: no wait) |
//! | `INBOX_MAX_ATTEMPTS` | `POST /inbox/stripe`: attempts before an event is failed (default 10) |
//! | `INBOX_BACKOFF_MS` | `POST /inbox/stripe`: the retry delay after the first failed attempt, doubling after each (default 1000) |
//! | `INBOX_LEASE_MS` | `POST /inbox/stripe`: how long an attempt's claim lasts unless renewed (a running attempt renews it); a crashed attempt is retried after it (default 60000) |
//! | `INBOX_ATTEMPT_TIMEOUT_MS` | `POST /inbox/stripe`: how long one attempt may run before it is cancelled and counted as failed (default 60000) |
//! | `INBOX_CONCURRENCY` | `POST /inbox/stripe`: handlers the worker runs at once, each holding a pool connection (default 16 on Postgres, 4 on SQLite) |
//! | `INBOX_POOL_SIZE` | `POST /inbox/stripe`: connections the inbox's pool opens at most (default twice `INBOX_CONCURRENCY`) |
//! | `INBOX_SWEEP_MS` | `POST /inbox/stripe`: how often the worker looks for due events (default 1000) |
//! | `INBOX_ORDERING` | `POST /inbox/stripe`: `sequential` or `skip-stale` orders Stripe events by `data.object.id` and `created` (unset: no ordering) |
//! | `OUTBOX_TARGET_URL` | `POST /inbox/stripe` (feature `outbox`): a `test.outbox` event enqueues one message of `{"event": "<event id>"}` keyed `<event id>/0`, relayed after its transaction commits: a `POST` to an `http(s)://` URL (the key as `Idempotency-Key`); with feature `nats`, `nats://HOST:PORT/SUBJECT` publishes to JetStream (the key as `Nats-Msg-Id`; a stream for the subject is created when missing); with feature `rabbitmq`, `amqp://USER:PASS@HOST:PORT/VHOST?exchange=E&routing_key=K` publishes to RabbitMQ (the key as `message_id`, publisher confirms) (unset: no outbox) |
//! | `INBOX_ADMIN` | `1`: the operator's page and admin routes at `/admin/inbox`, and with the outbox on (`OUTBOX_TARGET_URL`) the outbox's at `/admin/outbox` (page `/admin/outbox/page`), without authentication (a fixture); the audit records a change as made by the request's `x-operator` header, else `receiver-operator` |
//! | `INBOX_HEAL_FILE` | a path; while that file exists, `test.poison` and `test.permanent` events succeed |
//! | `INBOX_RETENTION_SECS` | `POST /inbox/stripe`: how long processed events are kept before the worker purges them, at its start and every minute (default 604800, a week) |
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
//! on a SQL store (`sqlite://`, `postgres://`, `mysql://`) `POST /payments` (requires `Idempotency-Key`,
//! body `{"amount": N}`; runs in the transactional mode: inserts one row into the table
//! `payments` of the store's database, waits `HANDLER_DELAY_MS` inside the transaction, answers
//! `201 {"payment_id", "amount"}`).
//!
//! Built with the `inbox` feature, on a SQLite or Postgres store and with `STRIPE_WEBHOOK_SECRET`
//! set, it also
//! mounts the webhook inbox (docs/inbox.md): `POST /inbox/stripe` answers `200` once the verified
//! event is stored; a worker then waits `HANDLER_DELAY_MS` and inserts one row into the table
//! `inbox_effects` in the event's transaction. Events whose `type` is `test.poison` always fail,
//! `test.flaky` fails its first two attempts, `test.permanent` fails permanently on its first
//! (failed at once, whatever attempts remain). `GET /inbox/events` lists events by filters with
//! a cursor (RFC 3339 times). `GET /inbox/failed` answers the failed event ids
//! (a JSON array), `POST /inbox/failed/<event id>/retry` re-queues one (`202`, `404` when it is
//! not failed). Built with the `outbox` feature and with `OUTBOX_TARGET_URL` set, a `test.outbox`
//! event also enqueues one message in the outbox table `outbox` (docs/outbox.md), which a relay
//! with the inbox's lease, backoff, attempts and sweep interval sends to that URL. The inbox and the
//! outbox run on every SQL store: SQLite, Postgres, and MySQL or MariaDB (`--features mysql`).
//!
//! Built with the `metrics` feature (`--features metrics`), it also serves `GET /metrics`: the
//! layer's metrics in the Prometheus text format (docs/observability.md).
//!
//! `GET /effects` counts how many times each handler ran per key, named `<route>:<event key>`.
//! The counts live in this process's memory: they count the executions of this process only and
//! start from zero after a restart (persisting them would make them survive one; out of scope).
//! The exceptions are `payments:<key>`, `inbox:<event id>` and `outbox:<event id>`: the rows of
//! `payments` for that key, of `inbox_effects` for that event, and the event's outbox messages
//! the target acknowledged, read from the database, so they survive restarts.
//!
//! Modules by job: `config` (variables), `webhook` (providers), `orders`, `payments`
//! (transactional), `inbox`, `effects`, `log` (request log), `metrics`, `app` (the router).

use std::{process::ExitCode, time::Duration};

use tower_idempotency::{connect_store, ShutdownHandle};

use crate::config::{secrets, Config, StartError};

mod app;
mod config;
mod effects;
#[cfg(feature = "inbox")]
mod inbox;
#[cfg(not(feature = "inbox"))]
#[path = "no_inbox.rs"]
mod inbox;
mod log;
#[cfg(feature = "metrics")]
mod metrics;
mod orders;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod payments;
#[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
#[path = "no_payments.rs"]
mod payments;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod sql;
mod webhook;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long running handlers get to finish and record their results on shutdown.
const DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// The webhook inbox, when this build has it, the store is SQL (SQLite, Postgres, MySQL or
/// MariaDB) and Stripe is configured.
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
    let metrics_route = metrics::install()?;
    let store = connect_store(&config.store_url).await?;
    tracing::info!(store = config.store_kind(), "store ready");
    let payments = payments::Payments::open(&config.store_url)
        .await
        .map_err(StartError::Payments)?;
    let inbox = start_inbox(&config).await?;
    let inbox_effects = inbox.as_ref().map(|running| running.effects.clone());
    let (mut router, handles) = app::build_app(&config, store, payments, inbox_effects)?;
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
