//! Run a message broker's deliveries once, for
//! [tower-idempotency](https://docs.rs/tower-idempotency): a consumer hands each NATS JetStream
//! message (feature `nats`) or RabbitMQ delivery (feature `rabbitmq`) to
//! [`OnceConsumer::handle`], which keys it by its message id (`Nats-Msg-Id`, AMQP
//! `message_id`), runs the work once per key through the core's [`RunOnce`], and only then
//! settles the delivery with the broker:
//!
//! - the work ran and its result is recorded: the delivery is acknowledged;
//! - a duplicate (a redelivery, or a copy the publisher sent twice) of a key whose result is
//!   recorded: the work does not run, the delivery is acknowledged and the recorded result is
//!   returned ([`Ran::is_replay`]);
//! - the work failed with [`Failure::Retry`], another consumer is running the key, the store is
//!   unavailable, or the result could not be recorded: the delivery is handed back for
//!   redelivery (a JetStream `NAK`, a RabbitMQ `nack` with requeue);
//! - the work failed with [`Failure::Terminate`], the delivery has no key, or its key was used
//!   before for a different payload: the delivery is terminated (a JetStream `TERM`, a RabbitMQ
//!   `reject` without requeue, which dead-letters it where the queue has a dead-letter exchange).
//!
//! A consumer killed before it acknowledged leaves the delivery to the broker, which delivers it
//! again: a key whose result was recorded is then acknowledged without running the work again.
//!
//! [`TxConsumer`] (features `sqlite`, `postgres`) is the transactional mode: the work writes
//! through an [`IdempotentTx`](tower_idempotency_sqlx::IdempotentTx), and its writes commit in
//! one database transaction with the key's completion, so the effect and its record land
//! together or not at all.
//!
//! ```no_run
//! # #[cfg(feature = "nats")]
//! # async fn run() -> Result<(), async_nats::Error> {
//! use futures_util::StreamExt;
//! use tower_idempotency_broker::{Failure, OnceConsumer};
//! use tower_idempotency_core::{MemoryStore, RunOnce};
//!
//! let client = async_nats::connect("127.0.0.1:4222").await?;
//! let jetstream = async_nats::jetstream::new(client);
//! let stream = jetstream.get_stream("ORDERS").await?;
//! let consumer: async_nats::jetstream::consumer::PullConsumer =
//!     stream.get_consumer("shipping").await?;
//! let once = OnceConsumer::new(RunOnce::new(MemoryStore::new()).namespace("shipping"));
//! let mut messages = consumer.messages().await?;
//! while let Some(message) = messages.next().await {
//!     let message = message?;
//!     let handled = once
//!         .handle(&message, |payload| async move {
//!             // The effect, once per message id.
//!             Ok::<_, Failure<std::io::Error>>(payload.len())
//!         })
//!         .await;
//!     println!("{:?} {:?}", handled.key, handled.settled);
//! }
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

use std::{future::Future, time::Duration};

use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};
use sha2::{Digest, Sha256};
pub use tower_idempotency_core::{OnceError, Outcome, Ran, RunOnce};

#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "rabbitmq")]
mod rabbitmq;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod tx;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub use tx::TxConsumer;

/// A boxed error from a broker client.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why the work failed, and what the delivery should become: the user's classification.
#[derive(Debug)]
pub enum Failure<E> {
    /// Worth another delivery (a dependency's outage): the delivery is handed back to the
    /// broker, which delivers it again.
    Retry(E),
    /// Never worth another delivery (the message is invalid): the delivery is terminated
    /// (dead-lettered where the broker is set up for it).
    Terminate(E),
}

impl<E> Failure<E> {
    /// The error inside.
    pub fn into_inner(self) -> E {
        match self {
            Self::Retry(error) | Self::Terminate(error) => error,
        }
    }

    /// The error inside, borrowed.
    pub fn inner(&self) -> &E {
        match self {
            Self::Retry(error) | Self::Terminate(error) => error,
        }
    }
}

impl<E: std::fmt::Display> std::fmt::Display for Failure<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Retry(error) => write!(f, "{error} (retried)"),
            Self::Terminate(error) => write!(f, "{error} (terminated)"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Failure<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.inner())
    }
}

/// What keys a delivery.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyFrom {
    /// Its message id only (`Nats-Msg-Id`, AMQP `message_id`), which the publisher sets (the
    /// outbox sets the message's key): the same message keeps it across every publish and
    /// redelivery. A delivery without one is terminated. The default.
    #[default]
    MessageId,
    /// Its message id, else what the broker numbers it with: the JetStream stream sequence
    /// (stable across redeliveries, but a message published twice has two), or the RabbitMQ
    /// delivery tag (unique on its channel only: a redelivery gets another, so this keys
    /// nothing across redeliveries and serves only to run id-less deliveries at all).
    MessageIdOrSequence,
}

/// How a delivery was settled with the broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Settled {
    /// Acknowledged: the broker drops it.
    Acked,
    /// Handed back: the broker delivers it again (a JetStream `NAK`, a RabbitMQ `nack` with
    /// requeue).
    Retried,
    /// Terminated: never delivered again (a JetStream `TERM`, a RabbitMQ `reject` without
    /// requeue).
    Terminated,
}

/// Settling a delivery with the broker failed (the connection was lost): the broker delivers
/// it again, and a recorded result is then acknowledged without running the work.
#[derive(Debug, thiserror::Error)]
#[error("settling the delivery with the broker failed")]
pub struct SettleError(#[source] pub BoxError);

/// Why [`OnceConsumer::handle`] returned no value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandleError<E> {
    /// The delivery has no message id (and [`KeyFrom::MessageIdOrSequence`] was not chosen, or
    /// the broker gave no sequence either): it was terminated.
    #[error("the delivery has no message id")]
    NoKey,
    /// [`RunOnce`] (or the transactional mode) returned no value: the work failed, ran
    /// elsewhere, or did not run.
    #[error(transparent)]
    Once(OnceError<Failure<E>>),
}

/// What [`OnceConsumer::handle`] did with one delivery.
#[derive(Debug)]
#[non_exhaustive]
pub struct Handled<T, E> {
    /// The key the delivery ran under, when it had one.
    pub key: Option<String>,
    /// How it was settled, or why settling failed.
    pub settled: Result<Settled, SettleError>,
    /// The work's value (run now or recorded before), or why there is none.
    pub result: Result<Ran<T>, HandleError<E>>,
}

/// A broker's delivery as the consumers read and settle it. Implemented for
/// `async_nats::jetstream::Message` (feature `nats`) and `lapin::message::Delivery` (feature
/// `rabbitmq`); implement it for another broker's delivery.
pub trait BrokerDelivery: Send + Sync {
    /// The message id the publisher set, if any.
    fn message_id(&self) -> Option<String>;
    /// What the broker numbers the delivery with ([`KeyFrom::MessageIdOrSequence`]).
    fn sequence(&self) -> Option<String>;
    /// The payload.
    fn payload(&self) -> Bytes;
    /// Acknowledges it.
    fn ack(&self) -> impl Future<Output = Result<(), SettleError>> + Send;
    /// Hands it back for redelivery, after `delay` where the broker can delay it.
    fn retry(
        &self,
        delay: Option<Duration>,
    ) -> impl Future<Output = Result<(), SettleError>> + Send;
    /// Terminates it: never delivered again.
    fn terminate(&self) -> impl Future<Output = Result<(), SettleError>> + Send;
}

/// Runs each delivery's work once per message id over a [`RunOnce`], and settles the delivery
/// after the result is recorded (see the [crate] documentation for the rules).
#[derive(Clone, Debug)]
pub struct OnceConsumer {
    once: RunOnce,
    rules: Rules,
}

/// The settings both consumers share.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rules {
    key_from: KeyFrom,
    retry_delay: Option<Duration>,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            key_from: KeyFrom::MessageId,
            retry_delay: Some(Duration::from_secs(1)),
        }
    }
}

impl OnceConsumer {
    /// A consumer running work through `once` (its store, namespace, lease and TTL). Keep the
    /// TTL longer than the broker may deliver a message again (its redelivery window, plus the
    /// publisher's retry horizon): a duplicate after the TTL runs the work again.
    pub fn new(once: RunOnce) -> Self {
        Self {
            once,
            rules: Rules::default(),
        }
    }

    /// What keys a delivery (default [`KeyFrom::MessageId`]).
    pub fn key_from(mut self, key_from: KeyFrom) -> Self {
        self.rules.key_from = key_from;
        self
    }

    /// How long a delivery handed back waits before it is delivered again (default 1 s; a
    /// key in flight elsewhere waits as long as its holder's lease says instead). JetStream
    /// delays the redelivery itself; on RabbitMQ, which requeues at once, the consumer waits
    /// this long before handing the delivery back.
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.rules.retry_delay = Some(delay);
        self
    }

    /// Runs `work` on the delivery's payload once per key, then settles the delivery. The
    /// payload's SHA-256 is the key's input: a key used again with another payload is refused
    /// ([`OnceError::InputMismatch`]) and terminated.
    pub async fn handle<D, T, E, F, Fut>(&self, delivery: &D, work: F) -> Handled<T, E>
    where
        D: BrokerDelivery,
        F: FnOnce(Bytes) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, Failure<E>>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: Send + 'static,
    {
        let Some(key) = self.rules.key(delivery) else {
            return no_key(delivery).await;
        };
        let payload = delivery.payload();
        let input = fingerprint(&payload);
        let result = self
            .once
            .run_with_input(&key, &input, move || work(payload))
            .await;
        self.rules.settle(delivery, key, result).await
    }
}

/// The payload's fingerprint, the input a key is bound to.
pub(crate) fn fingerprint(payload: &[u8]) -> String {
    hex::encode(Sha256::digest(payload))
}

/// Terminates a delivery without a key.
pub(crate) async fn no_key<D: BrokerDelivery, T, E>(delivery: &D) -> Handled<T, E> {
    tracing::warn!("a broker delivery without a message id was terminated");
    Handled {
        key: None,
        settled: delivery.terminate().await.map(|()| Settled::Terminated),
        result: Err(HandleError::NoKey),
    }
}

impl Rules {
    /// The delivery's key under the rule.
    pub(crate) fn key<D: BrokerDelivery>(&self, delivery: &D) -> Option<String> {
        let id = delivery.message_id().filter(|id| !id.is_empty());
        match self.key_from {
            KeyFrom::MessageId => id,
            KeyFrom::MessageIdOrSequence => id.or_else(|| delivery.sequence()),
        }
    }

    /// Settles `delivery` by `result`.
    pub(crate) async fn settle<D: BrokerDelivery, T, E>(
        &self,
        delivery: &D,
        key: String,
        result: Result<Ran<T>, OnceError<Failure<E>>>,
    ) -> Handled<T, E> {
        let settled = match &result {
            Ok(ran) if ran.outcome == Outcome::ExecutedUnrecorded => {
                // The result is not recorded: not acknowledged, so the broker brings the
                // message back once the key's lease ends.
                delivery
                    .retry(self.retry_delay)
                    .await
                    .map(|()| Settled::Retried)
            }
            // A stored result that cannot be read back still means the work ran once.
            Ok(_) | Err(OnceError::Result(_)) => delivery.ack().await.map(|()| Settled::Acked),
            Err(OnceError::Failed(Failure::Terminate(_)))
            | Err(OnceError::InputMismatch)
            | Err(OnceError::Input(_)) => delivery.terminate().await.map(|()| Settled::Terminated),
            Err(OnceError::InFlight { retry_after }) => {
                let delay = retry_after.or(self.retry_delay);
                delivery.retry(delay).await.map(|()| Settled::Retried)
            }
            Err(_) => delivery
                .retry(self.retry_delay)
                .await
                .map(|()| Settled::Retried),
        };
        if let Err(error) = &settled {
            tracing::warn!(%error, "settling a broker delivery failed; the broker delivers it again");
        }
        Handled {
            key: Some(key),
            settled,
            result: result.map_err(HandleError::Once),
        }
    }
}
