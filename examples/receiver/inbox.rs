//! The reference receiver's webhook inbox (feature `inbox`, a SQL store and
//! `STRIPE_WEBHOOK_SECRET`): `POST /inbox/stripe` acknowledges through the inbox; a worker
//! processes each event by waiting `HANDLER_DELAY_MS` and inserting one row into
//! `inbox_effects` inside the event's transaction. Events of type `test.poison` always fail,
//! `test.flaky` fails its first two attempts, `test.permanent` fails permanently on its first. `GET /inbox/failed` lists the failed event ids,
//! `POST /inbox/failed/{event_id}/retry` re-queues one.

use std::time::Duration;

use axum::{
    extract::{Path, State},
    http::StatusCode,
    routing::{get, post, post_service},
    Json, Router,
};
use tower_idempotency::{
    inbox::{
        permanent, Backoff, EventKey, EventState, HandlerError, IdempotentTx, Inbox, InboxDatabase,
        InboxEvent, InboxWorker, DEFAULT_TABLE,
    },
    sqlx,
    webhooks::stripe::StripeVerifier,
};

use crate::{
    config::InboxSettings as Settings,
    sql::{Pool, Table},
    BoxError,
};

/// The running inbox: its routes, its worker, and the `inbox_effects` rows for `GET /effects`.
pub struct Running {
    pub router: Router,
    pub worker: InboxWorker,
    pub effects: Effects,
}

/// Stops the worker taking events and waits for the running handlers up to `deadline`.
pub async fn drain(worker: InboxWorker, deadline: Duration) -> bool {
    worker.drain(deadline).await
}

/// Reads `inbox_effects`.
#[derive(Clone)]
pub struct Effects(Pool);

const TABLE: Table = Table {
    #[cfg(feature = "sqlite")]
    sqlite: "CREATE TABLE IF NOT EXISTS inbox_effects (event_id TEXT NOT NULL)",
    #[cfg(feature = "postgres")]
    postgres: "SELECT pg_advisory_xact_lock(hashtext('receiver:inbox_effects'));\
               CREATE TABLE IF NOT EXISTS inbox_effects (event_id text NOT NULL)",
};

impl Effects {
    /// Rows of `inbox_effects` per event id.
    pub async fn rows(&self) -> Result<Vec<(String, u64)>, BoxError> {
        let sql = "SELECT event_id, count(*) FROM inbox_effects GROUP BY event_id";
        self.0.counts(sql).await
    }
}

/// Whether the attempt fails on purpose, by the event's `type`.
fn refusal(event: &InboxEvent) -> Option<HandlerError> {
    let json = event.json().ok()?;
    match json["type"].as_str()? {
        "test.poison" => Some("test.poison always fails".into()),
        "test.flaky" if event.attempt <= 2 => {
            Some(format!("test.flaky fails attempt {}", event.attempt).into())
        }
        "test.permanent" => Some(permanent("test.permanent fails permanently")),
        _ => None,
    }
}

/// The processing handler on one database: waits, writes one row, then fails on purpose or not.
macro_rules! handler {
    ($name:ident, $db:ty) => {
        async fn $name(
            delay: Duration,
            event: InboxEvent,
            mut tx: IdempotentTx<$db>,
        ) -> Result<(), HandlerError> {
            tokio::time::sleep(delay).await;
            sqlx::query("INSERT INTO inbox_effects (event_id) VALUES ($1)")
                .bind(&event.key.event_id)
                .execute(&mut *tx)
                .await?;
            match refusal(&event) {
                Some(reason) => Err(reason),
                None => Ok(()),
            }
        }
    };
}

#[cfg(feature = "sqlite")]
handler!(handle_sqlite, sqlx::Sqlite);
#[cfg(feature = "postgres")]
handler!(handle_postgres, sqlx::Postgres);

/// Starts the inbox on the store's database, or answers `None` for a store that is not SQL.
pub async fn start(
    url: &str,
    secrets: Vec<String>,
    settings: &Settings,
) -> Result<Option<Running>, BoxError> {
    let Some(pool) = Pool::open(url, 8, true, &TABLE).await? else {
        return Ok(None);
    };
    let verifier = StripeVerifier::new(secrets);
    let delay = settings.handler_delay;
    let (router, worker) = match &pool {
        #[cfg(feature = "sqlite")]
        Pool::Sqlite(pool) => {
            let inbox = Inbox::new(pool.clone(), DEFAULT_TABLE)?;
            let handler = move |event, tx| handle_sqlite(delay, event, tx);
            mount(inbox, verifier, handler, settings).await?
        }
        #[cfg(feature = "postgres")]
        Pool::Postgres(pool) => {
            let inbox = Inbox::new(pool.clone(), DEFAULT_TABLE)?;
            let handler = move |event, tx| handle_postgres(delay, event, tx);
            mount(inbox, verifier, handler, settings).await?
        }
    };
    Ok(Some(Running {
        router,
        worker,
        effects: Effects(pool),
    }))
}

async fn mount<DB: InboxDatabase>(
    inbox: Inbox<DB>,
    verifier: StripeVerifier,
    handler: impl tower_idempotency::inbox::InboxHandler<DB>,
    settings: &Settings,
) -> Result<(Router, InboxWorker), BoxError> {
    inbox.migrate().await?;
    let mut worker = inbox
        .worker(handler)
        .max_attempts(settings.max_attempts)
        .backoff(Backoff::exponential(
            settings.backoff,
            Duration::from_secs(3600),
        ));
    if let Some(lease) = settings.lease {
        worker = worker.lease(lease);
    }
    if let Some(timeout) = settings.attempt_timeout {
        worker = worker.attempt_timeout(timeout);
    }
    if let Some(sweep) = settings.sweep {
        worker = worker.sweep_every(sweep);
    }
    if let Some(retention) = settings.retention {
        worker = worker.retention(retention);
    }
    let router = Router::new()
        .route("/inbox/stripe", post_service(inbox.ack(verifier)))
        .route("/inbox/failed", get(failed::<DB>))
        .route("/inbox/failed/{event_id}/retry", post(retry::<DB>))
        .with_state(inbox);
    Ok((router, worker.spawn()))
}

async fn failed<DB: InboxDatabase>(
    State(inbox): State<Inbox<DB>>,
) -> Result<Json<Vec<String>>, StatusCode> {
    let events = inbox
        .list(EventState::Failed, 1000)
        .await
        .map_err(|error| {
            tracing::error!(%error, "listing failed inbox events failed");
            StatusCode::SERVICE_UNAVAILABLE
        })?;
    Ok(Json(
        events.into_iter().map(|event| event.event_id).collect(),
    ))
}

async fn retry<DB: InboxDatabase>(
    State(inbox): State<Inbox<DB>>,
    Path(event_id): Path<String>,
) -> StatusCode {
    match inbox.retry(&EventKey::new("stripe", event_id)).await {
        Ok(true) => StatusCode::ACCEPTED,
        Ok(false) => StatusCode::NOT_FOUND,
        Err(error) => {
            tracing::error!(%error, "retrying an inbox event failed");
            StatusCode::SERVICE_UNAVAILABLE
        }
    }
}
