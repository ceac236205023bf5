//! A durable webhook inbox for [tower-idempotency](https://docs.rs/tower-idempotency):
//! acknowledge a verified delivery as soon as it is stored, process it in the background, retry
//! it with backoff, and keep what kept failing for an operator.
//!
//! - [`Ack`] (from [`Inbox::ack`]) is the route's service: it runs the provider's
//!   [`Verifier`](tower_idempotency_webhooks::Verifier) (method, body cap, signature, replay
//!   window, event id) and inserts the delivery with one `INSERT .. ON CONFLICT DO NOTHING`,
//!   which is also the dedupe. The sender gets `200` once the row is committed, for the first
//!   delivery and every duplicate; a database outage is a `503`, so the provider retries.
//! - [`InboxWorker`] (from [`Inbox::worker`]) runs your [`InboxHandler`] in a pool of tasks, fed
//!   by a bounded queue at acknowledgement and by a sweeper that finds whatever the queue missed
//!   (a restart, a full queue, another instance's crash). Each attempt claims the event under a
//!   lease, runs the handler in a database transaction ([`IdempotentTx`]) and marks the event
//!   processed in that same transaction: the handler's writes land once or not at all.
//! - A handler error or panic rolls the transaction back and schedules the next attempt with
//!   exponential backoff and jitter ([`Backoff`]); after `max_attempts` the event is
//!   [`Failed`](EventState::Failed) with its last error.
//! - Processed events are purged in bounded batches after the retention
//!   ([`WorkerBuilder::retention`], a week by default), except while their authenticator must
//!   still refuse a captured delivery re-sent under a new id.
//! - [`Inbox::list`], [`Inbox::retry`], [`Inbox::purge_processed`] operate it; [`admin::router`]
//!   serves them over HTTP for you to mount behind your own auth.
//!
//! ```no_run
//! use axum::{routing::post_service, Router};
//! use tower_idempotency_inbox::{Inbox, InboxEvent, IdempotentTx, HandlerError};
//! use tower_idempotency_sqlx::sqlx::{self, Postgres};
//! use tower_idempotency_webhooks::stripe::StripeVerifier;
//!
//! async fn on_event(event: InboxEvent, mut tx: IdempotentTx<Postgres>) -> Result<(), HandlerError> {
//!     let json = event.json()?;
//!     sqlx::query("INSERT INTO charges (event_id, kind) VALUES ($1, $2)")
//!         .bind(&event.key.event_id)
//!         .bind(json["type"].as_str())
//!         .execute(&mut *tx)
//!         .await?;
//!     Ok(())
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::PgPool::connect("postgres://app@db/app").await?;
//! let inbox = Inbox::new(pool, "webhook_inbox")?;
//! inbox.migrate().await?;
//! let worker = inbox.worker(on_event).concurrency(4).spawn();
//! let app: Router = Router::new()
//!     .route("/webhooks/stripe", post_service(inbox.ack(StripeVerifier::new(["whsec_..."]))));
//! // ... serve `app`; on shutdown:
//! worker.drain(std::time::Duration::from_secs(30)).await;
//! # Ok(())
//! # }
//! ```
//!
//! Postgres: several application instances share one inbox table; SQLite: one host (its
//! single writer serializes the handlers' commits). See [docs/inbox.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/inbox.md) for the design, the
//! schema and the guarantees.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
compile_error!("tower-idempotency-inbox needs its `sqlite`, `postgres` or `mysql` feature");

mod ack;
mod acks;
pub mod admin;
mod backend;
mod dialect;
mod event;
mod handler;
mod inbox;
mod metrics;
mod ops;
mod ordering;
mod page;
mod retention;
mod worker;

pub use ack::Ack;
pub use acks::{DEFAULT_ACK_DEADLINE, DEFAULT_MAX_WAITING_ACKS, MAX_BATCH as MAX_ACK_BATCH};
pub use backend::InboxDatabase;
pub use event::{EventKey, EventState, EventSummary, InboxEvent, StateCounts};
pub use handler::{permanent, HandlerError, InboxHandler, Permanent, MAX_ERROR_LEN};
pub use inbox::{Inbox, InboxError, DEFAULT_TABLE};
pub use metrics::{
    describe_metrics, ACKNOWLEDGED_TOTAL, ATTEMPTS_TOTAL, ATTEMPT_DURATION_SECONDS, EVENTS,
    LAG_SECONDS, PURGED_TOTAL,
};
pub use ops::{
    parse_rfc3339, rfc3339, BulkReplay, BulkRetry, BulkRetryOptions, EventDetail, EventFilter,
    EventPage, EventRecord, ProviderCounts, MAX_PAGE, REDACTED,
};
pub use ordering::{OrderPosition, Ordering, OrderingPolicy};
pub use retention::{DEFAULT_PURGE_BATCH, DEFAULT_PURGE_EVERY, DEFAULT_RETENTION};
pub use tower_idempotency_jobs::{Backoff, WorkerHandle};
pub use worker::{
    InboxWorker, WorkerBuilder, DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_LEASE, DEFAULT_MAX_ATTEMPTS,
};

pub use tower_idempotency_sqlx::IdempotentTx;
