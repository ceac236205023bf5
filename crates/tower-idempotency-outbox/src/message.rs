//! What the outbox holds: the messages a handler enqueues, and the summaries operators list.

use bytes::Bytes;
use http::Method;
use serde::Serialize;
use tower_idempotency_jobs::{JobCounts, JobState, JobSummary};

use crate::backend::Listed;

/// One piece of outgoing work: an HTTP request to another service, a message for a broker
/// (NATS JetStream, RabbitMQ), or a payload for your own [`Dispatcher`](crate::Dispatcher) (a
/// queue, an email API). Build it, then hand it to
/// [`Outbox::enqueue`](crate::Outbox::enqueue) inside the transaction of the writes it belongs to.
///
/// Its key names it for good: the relay sends it as the `Idempotency-Key` of every attempt.
/// Enqueuing the same message again under its key does nothing
/// ([`Enqueued::AlreadyThere`](crate::Enqueued::AlreadyThere)); a different message under a key
/// the outbox holds is refused ([`OutboxError::KeyConflict`](crate::OutboxError::KeyConflict)).
/// Without [`key`](Self::key), [`Scope::enqueue`](crate::Scope::enqueue) numbers it within its
/// scope, and [`Outbox::enqueue`](crate::Outbox::enqueue) generates a UUIDv7.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub(crate) key: Option<String>,
    pub(crate) target: Target,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Bytes,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    Http {
        method: Method,
        url: String,
    },
    Dispatch {
        topic: String,
    },
    /// A JetStream publish to a subject ([`Message::nats`]).
    Nats {
        subject: String,
    },
    /// A RabbitMQ publish to an exchange with a routing key ([`Message::rabbitmq`]).
    Rabbitmq {
        exchange: String,
        routing_key: String,
    },
}

impl Message {
    /// An HTTP request: `method` to `url` (absolute), no headers, an empty body.
    pub fn http(method: Method, url: impl Into<String>) -> Self {
        Self {
            key: None,
            target: Target::Http {
                method,
                url: url.into(),
            },
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// A `POST` of `body` as JSON (`Content-Type: application/json`) to `url`.
    pub fn post_json(url: impl Into<String>, body: &serde_json::Value) -> Self {
        Self::http(Method::POST, url)
            .header("content-type", "application/json")
            .body(body.to_string())
    }

    /// A payload for the relay's [`Dispatcher`](crate::Dispatcher), under `topic` (which the
    /// dispatcher reads to route it).
    pub fn dispatch(topic: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        Self {
            key: None,
            target: Target::Dispatch {
                topic: topic.into(),
            },
            headers: Vec::new(),
            body: payload.into(),
        }
    }

    /// A message for NATS JetStream: published to `subject` with the message's key as its
    /// `Nats-Msg-Id` (the stream drops a repeat within its duplicate window), its headers as
    /// NATS headers and its [`body`](Self::body) as the payload. The relay needs a publisher
    /// ([`Relay::nats`](crate::Relay), feature `nats`); without one the message fails at its
    /// first attempt.
    pub fn nats(subject: impl Into<String>) -> Self {
        Self {
            key: None,
            target: Target::Nats {
                subject: subject.into(),
            },
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// A message for RabbitMQ: published to `exchange` (`""`: the default exchange, where the
    /// routing key names a queue) with `routing_key`, persistent, `mandatory`, with the
    /// message's key as its `message_id`, its headers as AMQP headers (`content-type` as the
    /// content type) and its [`body`](Self::body) as the payload. The relay needs a publisher
    /// ([`Relay::rabbitmq`](crate::Relay), feature `rabbitmq`); without one the message fails at
    /// its first attempt.
    pub fn rabbitmq(exchange: impl Into<String>, routing_key: impl Into<String>) -> Self {
        Self {
            key: None,
            target: Target::Rabbitmq {
                exchange: exchange.into(),
                routing_key: routing_key.into(),
            },
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// The message's key: visible ASCII, 1 to 255 bytes (the `Idempotency-Key` rule), checked
    /// at [`enqueue`](crate::Outbox::enqueue). Derive it from what the message is about
    /// (`refund-for-ch_123`) so that running the same work twice enqueues it once; keys are
    /// unique per outbox, so include the tenant when tenants share one.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Adds a request header (an HTTP message) or a header the dispatcher receives. The relay
    /// sets `Idempotency-Key` itself; a header of that name given here is replaced.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The request body (an HTTP message) or the payload (a broker's or a dispatched one).
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }
}

/// Where a message is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageState {
    /// Waiting for its first or next attempt, or being delivered under a lease.
    Pending,
    /// The receiver acknowledged it (a `2xx`, or the dispatcher's `Ok`).
    Delivered,
    /// Every attempt failed, or one failed permanently; kept until retried or discarded.
    Failed,
    /// An operator gave it up; kept (so its key is not enqueued again) until purged.
    Discarded,
}

impl MessageState {
    /// The job engine's state of a message in this state.
    pub(crate) fn job(self) -> JobState {
        match self {
            Self::Pending => JobState::Pending,
            Self::Delivered => JobState::Done,
            Self::Failed => JobState::Failed,
            Self::Discarded => JobState::Discarded,
        }
    }

    pub(crate) fn from_job(state: JobState) -> Self {
        match state {
            JobState::Pending => Self::Pending,
            JobState::Done => Self::Delivered,
            JobState::Failed => Self::Failed,
            JobState::Discarded => Self::Discarded,
        }
    }

    /// Every state.
    pub const ALL: [Self; 4] = [
        Self::Pending,
        Self::Delivered,
        Self::Failed,
        Self::Discarded,
    ];

    /// The state of this lowercase name ([`as_str`](Self::as_str)).
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == name)
    }

    /// The lowercase name (`pending`, `delivered`, `failed`, `discarded`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
            Self::Discarded => "discarded",
        }
    }
}

/// A message as operators see it: where it goes and how its delivery went, without its headers
/// or body (they may carry credentials or personal data).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct MessageSummary {
    /// The message's key, sent as its `Idempotency-Key`.
    pub key: String,
    /// The scope it was enqueued in ([`Outbox::scope`](crate::Outbox::scope)), if any.
    pub scope: Option<String>,
    /// An HTTP message's method.
    pub method: Option<String>,
    /// An HTTP message's URL, or a broker message's target: `nats:<subject>` or
    /// `amqp:<exchange>/<routing key>` (the exchange with `%` and `/` percent-encoded).
    pub url: Option<String>,
    /// A dispatched message's topic.
    pub topic: Option<String>,
    /// Its state.
    pub state: MessageState,
    /// Attempts started so far.
    pub attempts: u32,
    /// When it was enqueued, unix milliseconds.
    pub created_at_ms: i64,
    /// When its next attempt is due, unix milliseconds.
    pub available_at_ms: i64,
    /// When it was delivered, failed or discarded, unix milliseconds.
    pub finished_at_ms: Option<i64>,
    /// The HTTP status of its last attempt, when one answered.
    pub last_status: Option<u16>,
    /// Its last attempt's error.
    pub last_error: Option<String>,
}

impl From<JobSummary<Listed>> for MessageSummary {
    fn from(job: JobSummary<Listed>) -> Self {
        let JobSummary { key, extra, .. } = job;
        Self {
            key: key.0.into_iter().next().unwrap_or_default(),
            scope: extra.scope,
            method: extra.method,
            url: extra.url,
            topic: extra.topic,
            state: MessageState::from_job(job.state),
            attempts: job.attempts,
            created_at_ms: job.created_at_ms,
            available_at_ms: job.available_at_ms,
            finished_at_ms: job.finished_at_ms,
            last_status: job.status.and_then(|s| u16::try_from(s).ok()),
            last_error: job.last_error,
        }
    }
}

/// How many messages are in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct StateCounts {
    /// Pending messages.
    pub pending: u64,
    /// Delivered messages (until purged).
    pub delivered: u64,
    /// Failed messages.
    pub failed: u64,
    /// Discarded messages (until purged).
    pub discarded: u64,
}

impl From<JobCounts> for StateCounts {
    fn from(counts: JobCounts) -> Self {
        Self {
            pending: counts.pending,
            delivered: counts.done,
            failed: counts.failed,
            discarded: counts.discarded,
        }
    }
}

/// One page of [`Outbox::messages`](crate::Outbox::messages): newest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct MessagePage {
    /// The messages, newest enqueued first.
    pub messages: Vec<MessageSummary>,
    /// Where the next page starts, when there may be one: pass it back as the cursor.
    pub next_cursor: Option<String>,
}

/// One message in full, as an operator reads it: [`Outbox::message`](crate::Outbox::message).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct MessageDetail {
    /// Its listing fields.
    #[serde(flatten)]
    pub summary: MessageSummary,
    /// Its headers, `[name, value]`, in the order they were added; a value whose name looks
    /// like a credential (signature, token, authorization, cookie, api-key, ...) reads
    /// [`REDACTED`](tower_idempotency_jobs::redact::REDACTED), the inbox's rule.
    pub headers: Vec<(String, String)>,
    /// The body as text (invalid UTF-8 replaced).
    pub body: String,
    /// The body pretty-printed, when it is JSON.
    pub body_pretty: Option<String>,
    /// Its recorded attempts, oldest first (the first and the newest kept), each answer's
    /// credentials masked as the body's are.
    pub history: Vec<tower_idempotency_jobs::Attempt>,
}
