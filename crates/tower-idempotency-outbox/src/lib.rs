//! A transactional outbox for [tower-idempotency](https://docs.rs/tower-idempotency): a
//! handler enqueues its outgoing work (an HTTP request to another service, a message for NATS
//! JetStream or RabbitMQ (features `nats`, `rabbitmq`), or a message for a [`Dispatcher`] of
//! yours) in the same database transaction as its other writes, and a
//! [`Relay`] delivers it afterwards, at least once, with a stable `Idempotency-Key`.
//!
//! - [`Outbox::enqueue`] (or [`Scope::enqueue`]) inserts a [`Message`] through the caller's
//!   connection: the inbox's or a transactional route's [`IdempotentTx`] (`&mut *tx`), or any
//!   `sqlx::Transaction`. The message exists if and only if the transaction commits, so a
//!   handler that is rolled back and retried never leaves a message behind, and one that
//!   commits never loses its message.
//! - Each message has a key, unique in its outbox: the one it was given, `{scope}/{n}` for the
//!   `n`-th message of a [`Scope`] (the provider, tenant and id of an inbox event, or of a
//!   request's idempotency key), or a generated UUIDv7. The relay sends it as the
//!   `Idempotency-Key` of every attempt, so a receiver that honours the header (this project's
//!   client-key layer, Stripe's API) runs the message once however often it is delivered.
//!   `enqueue` answers [`Enqueued::Inserted`], [`Enqueued::AlreadyThere`] (the same message
//!   again) or [`OutboxError::KeyConflict`] (a different message holds the key).
//! - [`Relay`] (from [`Outbox::relay`]), a worker of the job engine
//!   ([`tower_idempotency_jobs`]), claims due messages under a lease (`FOR UPDATE SKIP
//!   LOCKED` on Postgres, so several relays share the work), delivers them concurrently,
//!   retries failures with the job engine's [`Backoff`] (the inbox's too), and marks a message
//!   [`Failed`](MessageState::Failed) after its last attempt. It follows no redirect by
//!   default: a `3xx` is a failed attempt, never a delivery.
//! - Broker messages ([`Message::nats`], [`Message::rabbitmq`]) carry their key as the
//!   broker's deduplication id (`Nats-Msg-Id`, AMQP `message_id`); the relay publishes them
//!   with the publisher it was given (`Relay::nats`, `Relay::rabbitmq`), waits for the broker's
//!   acknowledgement (a publisher confirm on RabbitMQ, where a returned, unroutable message is
//!   a failed attempt) and retries a broker that is down like an HTTP receiver that is.
//! - [`Outbox::list`], [`Outbox::messages`], [`Outbox::message`], [`Outbox::retry`],
//!   [`Outbox::discard`] and [`Outbox::purge_finished`] operate it; [`admin::router`] serves
//!   them over HTTP, with an operator's page (failed messages, one message's detail, retry and
//!   discard buttons).
//!
//! ```no_run
//! use tower_idempotency_outbox::{Message, Outbox};
//! use tower_idempotency_sqlx::sqlx::{self, Postgres};
//!
//! /// Marks an order paid and tells shipping, in one transaction (an inbox handler's or a
//! /// transactional route's `IdempotentTx` works the same way: `&mut *tx`).
//! async fn paid(outbox: &Outbox<Postgres>, event_id: &str) -> Result<(), Box<dyn std::error::Error>> {
//!     let mut tx = outbox.pool().begin().await?;
//!     sqlx::query("UPDATE orders SET paid = true WHERE event_id = $1")
//!         .bind(event_id)
//!         .execute(&mut *tx)
//!         .await?;
//!     // Stored with the update, or not at all; delivered after the commit. Keys are unique per
//!     // outbox: the scope names the provider (and the tenant, when several share the outbox)
//!     // as well as the event.
//!     let notice = serde_json::json!({ "event": event_id });
//!     let mut scope = outbox.scope(format!("stripe/{event_id}"));
//!     scope
//!         .enqueue(&mut tx, Message::post_json("http://shipping.internal/shipments", &notice))
//!         .await?;
//!     tx.commit().await?;
//!     outbox.wake();
//!     Ok(())
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::PgPool::connect("postgres://app@db/app").await?;
//! let outbox = Outbox::new(pool, "outbox")?;
//! outbox.migrate().await?;
//! let relay = outbox.relay().spawn();
//! paid(&outbox, "evt_1").await?;
//! // ... on shutdown:
//! relay.drain(std::time::Duration::from_secs(30)).await;
//! # Ok(())
//! # }
//! ```
//!
//! Where exactly-once ends: the handler's writes and the enqueue commit once; the delivery is
//! at least once; the receiver's deduplication on the key makes its effect once. A receiver
//! that ignores `Idempotency-Key` may act more than once. See
//! [docs/outbox.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/outbox.md).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
compile_error!("tower-idempotency-outbox needs its `sqlite`, `postgres` or `mysql` feature");

pub mod admin;
mod backend;
mod broker;
mod http;
mod message;
mod outbox;
mod page;
mod relay;

pub use backend::OutboxDatabase;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub use broker::nats::{NatsPublisher, NatsPublisherError};
#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub use broker::rabbitmq::RabbitPublisher;
pub use message::{Message, MessageDetail, MessagePage, MessageState, MessageSummary, StateCounts};
pub use outbox::{Enqueued, Outbox, OutboxError, Scope, DEFAULT_TABLE};
#[allow(deprecated)]
pub use relay::DEFAULT_BATCH;
pub use relay::{
    same_method_redirects, Dispatch, DispatchError, Dispatcher, Relay, RelayHandle, Round,
    DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_CONCURRENCY, DEFAULT_LEASE, DEFAULT_MAX_ATTEMPTS,
    DEFAULT_POLL_EVERY, MAX_ERROR_LEN,
};

pub use tower_idempotency_jobs::{Backoff, WorkerHandle};
pub use tower_idempotency_sqlx::IdempotentTx;
