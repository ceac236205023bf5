//! The reference receiver's webhook inbox (feature `inbox`, a SQL store and
//! `STRIPE_WEBHOOK_SECRET`): `POST /inbox/stripe` acknowledges through the inbox; a worker
//! processes each event by waiting `HANDLER_DELAY_MS` and inserting one row into
//! `inbox_effects` inside the event's transaction. Events of type `test.poison` always fail,
//! `test.flaky` fails its first two attempts, `test.permanent` fails permanently on its first
//! (both `test.poison` and `test.permanent` pass while the file `INBOX_HEAL_FILE` names exists).
//! `GET /inbox/failed` lists the failed event ids, `GET /inbox/events` lists events by filters
//! with a cursor, `POST /inbox/failed/{event_id}/retry` re-queues one. With `INBOX_ADMIN=1` the
//! operator's page and the admin routes are mounted at `/admin/inbox`, and with the outbox on
//! (`OUTBOX_TARGET_URL`) the outbox's page and routes at `/admin/outbox`. `INBOX_ORDERING=sequential|skip-stale`
//! orders Stripe events by `data.object.id` and `created`; the handler records, per object, the
//! order in which it committed the object's events and when each run started and ended
//! (`inbox_order`; `"order:<object id>"` in `GET /effects`).
//!
//! With the `outbox` feature and `OUTBOX_TARGET_URL` set, a `test.outbox` event also enqueues,
//! in its transaction, one message with the body `{"event": "<event id>"}` (key
//! `<event id>/0`): a `POST {OUTBOX_TARGET_URL}` (the key sent as its `Idempotency-Key`), or with
//! the features `nats` and `rabbitmq` a JetStream publish (`nats://HOST:PORT/SUBJECT`, the key
//! as `Nats-Msg-Id`) or a RabbitMQ publish (`amqp://...?exchange=E&routing_key=K`, the key as
//! `message_id`) (outbox_target.rs); a relay with the inbox's lease, backoff, attempts and sweep
//! interval delivers it.

use std::{collections::BTreeMap, time::Duration};

use axum::{
    extract::{Path, Query, State},
    http::StatusCode,
    routing::{get, post, post_service},
    Json, Router,
};
#[cfg(feature = "outbox")]
#[path = "outbox_target.rs"]
mod outbox_target;

#[cfg(feature = "outbox")]
use tower_idempotency::outbox::{self, Outbox, OutboxDatabase, RelayHandle};
use tower_idempotency::{
    inbox::{
        admin, permanent, Backoff, EventFilter, EventKey, EventPage, EventState, HandlerError,
        IdempotentTx, Inbox, InboxDatabase, InboxError, InboxEvent, InboxWorker, Ordering,
        OrderingPolicy, DEFAULT_TABLE,
    },
    sqlx,
    webhooks::stripe::StripeVerifier,
};

use crate::{
    config::{InboxOrdering, InboxSettings as Settings},
    sql::{Pool, Table},
    BoxError,
};

/// The running inbox: its routes, its worker (and relay), and the `inbox_effects` rows for
/// `GET /effects`.
pub struct Running {
    pub router: Router,
    pub worker: Worker,
    pub effects: Effects,
}

/// The inbox's worker, and the outbox's relay when `OUTBOX_TARGET_URL` is set.
pub struct Worker {
    inbox: InboxWorker,
    #[cfg(feature = "outbox")]
    relay: Option<RelayHandle>,
}

/// Stops the worker taking events and waits for the running handlers up to `deadline`, then
/// for the relay's running deliveries.
pub async fn drain(worker: Worker, deadline: Duration) -> bool {
    let drained = worker.inbox.drain(deadline).await;
    #[cfg(feature = "outbox")]
    if let Some(relay) = worker.relay {
        return relay.drain(deadline).await && drained;
    }
    drained
}

/// Reads `inbox_effects`, and the outbox's delivered messages when it has one.
#[derive(Clone)]
pub struct Effects {
    pool: Pool,
    outbox: bool,
}

/// Where `test.outbox` events send their message: the outbox and `OUTBOX_TARGET_URL`.
#[cfg(feature = "outbox")]
type Outgoing<DB> = Option<(Outbox<DB>, std::sync::Arc<outbox_target::OutboxTarget>)>;
#[cfg(not(feature = "outbox"))]
type Outgoing<DB> = Option<(std::marker::PhantomData<DB>, std::sync::Arc<str>)>;

const TABLE: Table = Table {
    #[cfg(feature = "sqlite")]
    sqlite: "CREATE TABLE IF NOT EXISTS inbox_effects (event_id TEXT NOT NULL);\
             CREATE TABLE IF NOT EXISTS inbox_order (seq INTEGER PRIMARY KEY AUTOINCREMENT, \
             object_id TEXT NOT NULL, event_id TEXT NOT NULL, started_ms INTEGER NOT NULL, \
             ended_ms INTEGER NOT NULL)",
    #[cfg(feature = "postgres")]
    postgres: "SELECT pg_advisory_xact_lock(hashtext('receiver:inbox_effects'));\
               CREATE TABLE IF NOT EXISTS inbox_effects (event_id text NOT NULL);\
               CREATE TABLE IF NOT EXISTS inbox_order (seq bigserial PRIMARY KEY, \
               object_id text NOT NULL, event_id text NOT NULL, started_ms bigint NOT NULL, \
               ended_ms bigint NOT NULL)",
    #[cfg(feature = "mysql")]
    mysql: "CREATE TABLE IF NOT EXISTS inbox_effects (event_id VARCHAR(255) NOT NULL) \
            ENGINE = InnoDB;\
            CREATE TABLE IF NOT EXISTS inbox_order (seq BIGINT AUTO_INCREMENT PRIMARY KEY, \
            object_id VARCHAR(255) NOT NULL, event_id VARCHAR(255) NOT NULL, \
            started_ms BIGINT NOT NULL, ended_ms BIGINT NOT NULL) ENGINE = InnoDB",
};

impl Effects {
    /// Rows of `inbox_effects` per event id.
    pub async fn rows(&self) -> Result<Vec<(String, u64)>, BoxError> {
        let sql = "SELECT event_id, count(*) FROM inbox_effects GROUP BY event_id";
        self.pool.counts(sql).await
    }

    /// Delivered (acknowledged) outbox messages per event id (their scope); none without an
    /// outbox.
    pub async fn outbox_rows(&self) -> Result<Vec<(String, u64)>, BoxError> {
        if !self.outbox {
            return Ok(Vec::new());
        }
        let sql = "SELECT scope, count(*) FROM outbox WHERE state = 1 AND scope IS NOT NULL \
                   GROUP BY scope";
        self.pool.counts(sql).await
    }

    /// Per object id, the event ids in the order the handler committed them.
    pub async fn order(&self) -> Result<BTreeMap<String, Vec<String>>, BoxError> {
        let sql = "SELECT object_id, event_id FROM inbox_order ORDER BY seq";
        let mut order = BTreeMap::<String, Vec<String>>::new();
        for (object, event) in self.pool.pairs(sql).await? {
            order.entry(object).or_default().push(event);
        }
        Ok(order)
    }
}

/// Whether the attempt fails on purpose, by the event's `type`; `test.poison` and
/// `test.permanent` events pass while `heal_file` exists.
fn refusal(event: &InboxEvent, heal_file: Option<&std::path::Path>) -> Option<HandlerError> {
    let json = event.json().ok()?;
    let healable = json["type"] == "test.permanent" || json["type"] == "test.poison";
    if healable && heal_file.is_some_and(std::path::Path::exists) {
        return None;
    }
    match json["type"].as_str()? {
        "test.poison" => Some("test.poison always fails".into()),
        "test.flaky" if event.attempt <= 2 => {
            Some(format!("test.flaky fails attempt {}", event.attempt).into())
        }
        "test.permanent" => Some(permanent("test.permanent fails permanently")),
        _ => None,
    }
}

/// Now, in Unix milliseconds (the handler's run times in `inbox_order`).
fn unix_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The Stripe object the event is about (`data.object.id`), when it names one.
fn object_id(event: &InboxEvent) -> Option<String> {
    let json = event.json().ok()?;
    Some(json.pointer("/data/object/id")?.as_str()?.to_owned())
}

/// The processing handler on one database (`$effect` and `$order` its inserts): waits, writes
/// one row (and for a `test.outbox` event enqueues its message), then fails on purpose or not.
macro_rules! handler {
    ($name:ident, $db:ty) => {
        handler!(
            $name,
            $db,
            "INSERT INTO inbox_effects (event_id) VALUES ($1)",
            "INSERT INTO inbox_order (object_id, event_id, started_ms, ended_ms) \
             VALUES ($1, $2, $3, $4)"
        );
    };
    ($name:ident, $db:ty, $effect:literal, $order:literal) => {
        async fn $name(
            delay: Duration,
            outgoing: Outgoing<$db>,
            heal_file: Option<std::sync::Arc<std::path::Path>>,
            event: InboxEvent,
            mut tx: IdempotentTx<$db>,
        ) -> Result<(), HandlerError> {
            let started = unix_ms();
            tokio::time::sleep(delay).await;
            sqlx::query($effect)
                .bind(&event.key.event_id)
                .execute(&mut *tx)
                .await?;
            if let Some(object) = object_id(&event) {
                sqlx::query($order)
                .bind(object)
                .bind(&event.key.event_id)
                .bind(started)
                .bind(unix_ms())
                .execute(&mut *tx)
                .await?;
            }
            #[cfg(feature = "outbox")]
            if let Some((outbox, target)) = &outgoing {
                let kind = event.json().ok().and_then(|json| json["type"].as_str().map(str::to_owned));
                if kind.as_deref() == Some("test.outbox") {
                    let body = serde_json::json!({ "event": event.key.event_id });
                    // Scoped by the event id alone: the receiver's one inbox route is Stripe's,
                    // for one tenant, and the outbox is its own, so the id is unique in it (and
                    // `<event id>/0` is the documented key). An application whose outbox serves
                    // several providers or tenants names them in the scope (docs/outbox.md).
                    outbox
                        .scope(event.key.event_id.clone())
                        .enqueue(&mut *tx, target.message(&body))
                        .await?;
                }
            }
            #[cfg(not(feature = "outbox"))]
            let _ = outgoing;
            match refusal(&event, heal_file.as_deref()) {
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
#[cfg(feature = "mysql")]
handler!(
    handle_mysql,
    sqlx::MySql,
    "INSERT INTO inbox_effects (event_id) VALUES (?)",
    "INSERT INTO inbox_order (object_id, event_id, started_ms, ended_ms) VALUES (?, ?, ?, ?)"
);

/// The worker's default concurrency on the database `url` names.
fn default_concurrency(url: &str) -> usize {
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres") {
        return <sqlx::Postgres as InboxDatabase>::DEFAULT_CONCURRENCY;
    }
    #[cfg(feature = "sqlite")]
    if url.starts_with("sqlite") {
        return <sqlx::Sqlite as InboxDatabase>::DEFAULT_CONCURRENCY;
    }
    #[cfg(feature = "mysql")]
    if url.starts_with("mysql") || url.starts_with("mariadb") {
        return <sqlx::MySql as InboxDatabase>::DEFAULT_CONCURRENCY;
    }
    let _ = url;
    1
}

/// Starts the inbox on the store's database, or answers `None` for a store that is not SQL.
pub async fn start(
    url: &str,
    secrets: Vec<String>,
    settings: &Settings,
) -> Result<Option<Running>, BoxError> {
    let concurrency = settings
        .concurrency
        .unwrap_or_else(|| default_concurrency(url));
    let pool_size = settings
        .pool_size
        .unwrap_or_else(|| u32::try_from(concurrency.saturating_mul(2)).unwrap_or(u32::MAX));
    let Some(pool) = Pool::open(url, pool_size, true, &TABLE).await? else {
        return Ok(None);
    };
    let verifier = StripeVerifier::new(secrets);
    let delay = settings.handler_delay;
    let heal: Option<std::sync::Arc<std::path::Path>> =
        settings.heal_file.as_deref().map(Into::into);
    let (router, worker) = match &pool {
        #[cfg(feature = "sqlite")]
        Pool::Sqlite(pool) => {
            let inbox = ordered(Inbox::new(pool.clone(), DEFAULT_TABLE)?, settings);
            let (outgoing, relay) = start_outbox(pool, settings).await?;
            let outbox_admin = outbox_admin(&outgoing);
            let handler =
                move |event, tx| handle_sqlite(delay, outgoing.clone(), heal.clone(), event, tx);
            mount(inbox, verifier, handler, settings, (relay, outbox_admin)).await?
        }
        #[cfg(feature = "postgres")]
        Pool::Postgres(pool) => {
            let inbox = ordered(Inbox::new(pool.clone(), DEFAULT_TABLE)?, settings);
            let (outgoing, relay) = start_outbox(pool, settings).await?;
            let outbox_admin = outbox_admin(&outgoing);
            let handler =
                move |event, tx| handle_postgres(delay, outgoing.clone(), heal.clone(), event, tx);
            mount(inbox, verifier, handler, settings, (relay, outbox_admin)).await?
        }
        #[cfg(feature = "mysql")]
        Pool::MySql(pool) => {
            let inbox = ordered(Inbox::new(pool.clone(), DEFAULT_TABLE)?, settings);
            let (outgoing, relay) = start_outbox(pool, settings).await?;
            let outbox_admin = outbox_admin(&outgoing);
            let handler =
                move |event, tx| handle_mysql(delay, outgoing.clone(), heal.clone(), event, tx);
            mount(inbox, verifier, handler, settings, (relay, outbox_admin)).await?
        }
    };
    Ok(Some(Running {
        router,
        worker,
        effects: Effects {
            pool,
            outbox: cfg!(feature = "outbox") && settings.outbox_target.is_some(),
        },
    }))
}

/// The inbox with `INBOX_ORDERING` applied: Stripe events by `data.object.id` and `created`.
fn ordered<DB: InboxDatabase>(inbox: Inbox<DB>, settings: &Settings) -> Inbox<DB> {
    let policy = match settings.ordering {
        None => return inbox,
        Some(InboxOrdering::Sequential) => OrderingPolicy::Sequential,
        Some(InboxOrdering::SkipStale) => OrderingPolicy::SkipStale,
    };
    inbox.ordering(Ordering::stripe(policy))
}

/// The outbox and its running relay when `OUTBOX_TARGET_URL` is set (feature `outbox`).
#[cfg(feature = "outbox")]
async fn start_outbox<DB: InboxDatabase + OutboxDatabase>(
    pool: &sqlx::Pool<DB>,
    settings: &Settings,
) -> Result<(Outgoing<DB>, Option<RelayHandle>), BoxError> {
    let Some(target) = settings.outbox_target.as_deref() else {
        return Ok((None, None));
    };
    let target = outbox_target::OutboxTarget::parse(target)?;
    let outbox = Outbox::new(pool.clone(), outbox::DEFAULT_TABLE)?;
    outbox.migrate().await?;
    let lease = settings.lease.unwrap_or(outbox::DEFAULT_LEASE);
    let timeout = settings
        .attempt_timeout
        .unwrap_or(outbox::DEFAULT_ATTEMPT_TIMEOUT)
        .min(lease / 2);
    let mut relay = outbox
        .relay()
        .max_attempts(settings.max_attempts)
        .backoff(Backoff::exponential(
            settings.backoff,
            Duration::from_secs(3600),
        ))
        .lease(lease)
        .attempt_timeout(timeout);
    if let Some(sweep) = settings.sweep {
        relay = relay.poll_every(sweep);
    }
    let relay = target.attach(relay).await?;
    tracing::info!("outbox relay started");
    Ok((Some((outbox, target.into())), Some(relay.spawn())))
}

#[cfg(not(feature = "outbox"))]
async fn start_outbox<DB>(
    _pool: &sqlx::Pool<DB>,
    _settings: &Settings,
) -> Result<(Outgoing<DB>, Option<std::convert::Infallible>), BoxError>
where
    DB: sqlx::Database,
{
    Ok((None, None))
}

/// The outbox's admin router (its operator's page and JSON routes), when the outbox is on.
#[cfg(feature = "outbox")]
fn outbox_admin<DB: OutboxDatabase>(outgoing: &Outgoing<DB>) -> Option<Router> {
    outgoing
        .as_ref()
        .map(|(outbox, _)| outbox::admin::router(outbox.clone()))
}

#[cfg(not(feature = "outbox"))]
fn outbox_admin<DB>(_outgoing: &Outgoing<DB>) -> Option<Router> {
    None
}

/// Who the admin routes' audit records a change as made by: the request's `x-operator` header,
/// else `receiver-operator`. A deployment's own extractor reads its signed-in user instead.
struct FixtureOperator(String);

impl std::fmt::Display for FixtureOperator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for FixtureOperator {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        let named = parts
            .headers
            .get("x-operator")
            .and_then(|value| value.to_str().ok());
        Ok(Self(named.unwrap_or("receiver-operator").to_owned()))
    }
}

#[cfg(feature = "outbox")]
type Relay = RelayHandle;
#[cfg(not(feature = "outbox"))]
type Relay = std::convert::Infallible;

async fn mount<DB: InboxDatabase>(
    inbox: Inbox<DB>,
    verifier: StripeVerifier,
    handler: impl tower_idempotency::inbox::InboxHandler<DB>,
    settings: &Settings,
    (relay, outbox_admin): (Option<Relay>, Option<Router>),
) -> Result<(Router, Worker), BoxError> {
    inbox.migrate().await?;
    let mut worker = inbox
        .worker(handler)
        .concurrency(settings.concurrency.unwrap_or(DB::DEFAULT_CONCURRENCY))
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
        worker = worker.poll_every(sweep);
    }
    if let Some(retention) = settings.retention {
        worker = worker.retention(retention);
    }
    let mut router = Router::new()
        .route("/inbox/stripe", post_service(inbox.ack(verifier)))
        .route("/inbox/failed", get(failed::<DB>))
        .route("/inbox/events", get(events::<DB>))
        .route("/inbox/failed/{event_id}/retry", post(retry::<DB>))
        .with_state(inbox.clone());
    if settings.admin {
        // The receiver is a test and demo fixture: a real deployment puts its authentication
        // layer on these routers (docs/inbox.md), and names the audit's operator from it.
        let operator = axum::middleware::from_fn(admin::operator::<FixtureOperator>);
        router = router.nest("/admin/inbox", admin::router(inbox).layer(operator.clone()));
        if let Some(outbox_admin) = outbox_admin {
            router = router.nest("/admin/outbox", outbox_admin.layer(operator));
        }
    }
    #[cfg(not(feature = "outbox"))]
    let _ = relay;
    let worker = Worker {
        inbox: worker.spawn(),
        #[cfg(feature = "outbox")]
        relay,
    };
    Ok((router, worker))
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

/// The paging part of `GET /inbox/events`.
#[derive(serde::Deserialize)]
struct Paging {
    cursor: Option<String>,
    limit: Option<u32>,
}

async fn events<DB: InboxDatabase>(
    State(inbox): State<Inbox<DB>>,
    Query(filter): Query<EventFilter>,
    Query(paging): Query<Paging>,
) -> Result<Json<EventPage>, StatusCode> {
    let cursor = paging.cursor.as_deref().filter(|cursor| !cursor.is_empty());
    let limit = paging.limit.unwrap_or(100);
    match inbox.events(&filter, cursor, limit).await {
        Ok(page) => Ok(Json(page)),
        Err(InboxError::InvalidCursor) => Err(StatusCode::BAD_REQUEST),
        Err(error) => {
            tracing::error!(%error, "listing inbox events failed");
            Err(StatusCode::SERVICE_UNAVAILABLE)
        }
    }
}
