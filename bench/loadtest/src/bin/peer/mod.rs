//! The peer queue of the inbox benchmark: apalis 1.0 on its Postgres storage
//! (`apalis-postgres`, on sqlx 0.9), behind the same route shape as the inbox: a POST whose
//! Stripe signature is checked with the webhooks crate's own check, then the event is enqueued
//! and the answer is 200 once the enqueue has committed; an apalis worker runs the same trivial
//! handler (one row inserted per event).

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::SystemTime,
};

use apalis::prelude::*;
use apalis_postgres::{Config, PostgresStorage};
use axum::{body::Bytes, extract::State, http::StatusCode, routing::post, Router};
use http::request::Parts;
use serde::{Deserialize, Serialize};
// The statements name this run's own tables (generated names), hence `AssertSqlSafe`.
use sqlx_peer::{postgres::PgPoolOptions, AssertSqlSafe, Connection, PgConnection, PgPool};
use tower_idempotency_webhooks::{stripe::StripeVerifier, verify_delivery};

/// The queued job: the event's id.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerEvent {
    id: String,
}

/// What the route and the worker share.
#[derive(Clone)]
struct Enqueue {
    storage: PostgresStorage<PeerEvent>,
    verifier: Arc<StripeVerifier>,
    enqueued: Arc<AtomicU64>,
}

/// The handler's table and its statement.
#[derive(Clone)]
struct Effects {
    pool: PgPool,
    insert: Arc<str>,
}

/// The peer on its own pool, queue and effects table.
pub struct Peer {
    url: String,
    pool: PgPool,
    queue: String,
    effects_table: String,
    enqueued: Arc<AtomicU64>,
    stop: tokio::sync::oneshot::Sender<()>,
    worker: std::thread::JoinHandle<()>,
    router: Router,
}

async fn enqueue(State(state): State<Enqueue>, parts: Parts, body: Bytes) -> StatusCode {
    let Ok(webhook) = verify_delivery(&*state.verifier, &parts, &body, SystemTime::now()) else {
        return StatusCode::BAD_REQUEST;
    };
    let mut storage = state.storage.clone();
    let event = PeerEvent {
        id: webhook.event_id().to_owned(),
    };
    match storage.push(event).await {
        Ok(()) => {
            state.enqueued.fetch_add(1, Ordering::Relaxed);
            StatusCode::OK
        }
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

async fn handle(event: PeerEvent, effects: Data<Effects>) -> Result<(), BoxDynError> {
    sqlx_peer::query(AssertSqlSafe(&*effects.insert))
        .bind(&event.id)
        .execute(&effects.pool)
        .await?;
    Ok(())
}

impl Peer {
    /// Sets up apalis's schema, a queue named `queue`, the effects table, and a worker running
    /// `concurrency` handlers at once; `max_connections` bounds the peer's own pool.
    pub async fn start(
        url: &str,
        secret: &str,
        queue: String,
        effects_table: String,
        concurrency: usize,
        max_connections: u32,
    ) -> Result<Self, super::BoxError> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .connect(url)
            .await?;
        PostgresStorage::<()>::setup(&pool).await?;
        sqlx_peer::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {effects_table} (event_id text NOT NULL)"
        )))
        .execute(&pool)
        .await?;
        let storage =
            PostgresStorage::<PeerEvent>::new(&pool).with_config(Config::default().queue(&queue));
        let effects = Effects {
            pool: pool.clone(),
            insert: format!("INSERT INTO {effects_table} (event_id) VALUES ($1)").into(),
        };
        let worker = WorkerBuilder::new("inbox-bench-peer")
            .backend(storage.clone().with_pubsub())
            .data(effects)
            .parallelize(tokio::spawn)
            .concurrency(concurrency)
            .build(handle);
        // The worker's future is not `Send` for every lifetime the compiler asks about (a
        // higher-ranked bound through `parallelize`), so it runs on a thread of its own, in a
        // single-threaded runtime whose tasks are its handlers; `stop` ends it.
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let worker = std::thread::spawn(move || {
            runtime.block_on(async move {
                tokio::select! {
                    _ = worker.run() => {}
                    _ = stopped => {}
                }
            })
        });
        let enqueued = Arc::new(AtomicU64::new(0));
        let router = Router::new()
            .route("/peer", post(enqueue))
            .with_state(Enqueue {
                storage,
                verifier: Arc::new(StripeVerifier::new([secret])),
                enqueued: enqueued.clone(),
            });
        Ok(Self {
            url: url.to_owned(),
            pool,
            queue,
            effects_table,
            enqueued,
            stop,
            worker,
            router,
        })
    }

    /// The enqueueing route, `POST /peer`.
    pub fn router(&self) -> Router {
        self.router.clone()
    }

    /// Whether every event enqueued so far has its row.
    pub async fn drained(&self) -> Result<bool, super::BoxError> {
        let done: i64 = sqlx_peer::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {}",
            self.effects_table
        )))
        .fetch_one(&self.pool)
        .await?;
        Ok(done as u64 >= self.enqueued.load(Ordering::Relaxed))
    }

    /// Stops the worker and removes the queue's jobs and the effects table (apalis's schema
    /// stays: other queues may use it). The cleanup runs on a connection of its own: the pool's
    /// connections opened by the worker's tasks belong to the worker's runtime, which is gone
    /// (their I/O answers "A Tokio 1.x context was found, but it is being shutdown").
    pub async fn stop(self) -> Result<(), super::BoxError> {
        let _ = self.stop.send(());
        let worker = self.worker;
        let _ = tokio::task::spawn_blocking(move || worker.join()).await;
        self.pool.close().await;
        let mut cleanup = PgConnection::connect(&self.url).await?;
        sqlx_peer::query("DELETE FROM apalis.jobs WHERE job_type = $1")
            .bind(&self.queue)
            .execute(&mut cleanup)
            .await?;
        sqlx_peer::raw_sql(AssertSqlSafe(format!("DROP TABLE {}", self.effects_table)))
            .execute(&mut cleanup)
            .await?;
        cleanup.close().await?;
        Ok(())
    }
}
