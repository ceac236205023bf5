//! `OUTBOX_TARGET_URL` (feature `outbox`): where `test.outbox` events send their outbox
//! message.
//!
//! - `http://...` or `https://...`: a `POST` of the JSON body to that URL;
//! - `nats://HOST:PORT/SUBJECT` (feature `nats`): a JetStream publish to `SUBJECT`; a stream
//!   named after the subject is created when none takes it, with a duplicate window covering
//!   the relay's retry horizon;
//! - `amqp://USER:PASS@HOST:PORT/VHOST?exchange=E&routing_key=K` (feature `rabbitmq`): a
//!   RabbitMQ publish to exchange `E` (empty or absent: the default exchange) with routing key
//!   `K` (the vhost percent-encoded, `%2f` for `/`).

use serde_json::Value;
use tower_idempotency::outbox::{Message, OutboxDatabase, Relay};

use crate::BoxError;

/// A parsed `OUTBOX_TARGET_URL`.
pub enum OutboxTarget {
    Http(String),
    #[cfg(feature = "nats")]
    Nats {
        server: String,
        subject: String,
    },
    #[cfg(feature = "rabbitmq")]
    Rabbitmq {
        /// The broker's URI without the query (it carries the password: never logged).
        uri: String,
        exchange: String,
        routing_key: String,
    },
}

/// An `OUTBOX_TARGET_URL` that is none of the accepted forms (the text is not repeated: an
/// AMQP URL carries a password).
#[derive(Debug, thiserror::Error)]
#[error("OUTBOX_TARGET_URL must be http(s)://..., nats://HOST:PORT/SUBJECT or amqp://USER:PASS@HOST:PORT/VHOST?exchange=E&routing_key=K (with the receiver's features nats, rabbitmq)")]
pub struct InvalidTarget;

impl OutboxTarget {
    /// Parses the variable's value.
    pub fn parse(text: &str) -> Result<Self, InvalidTarget> {
        let url = reqwest::Url::parse(text).map_err(|_| InvalidTarget)?;
        match url.scheme() {
            "http" | "https" => Ok(Self::Http(text.to_owned())),
            #[cfg(feature = "nats")]
            "nats" => {
                let subject = url.path().trim_start_matches('/');
                let host = url.host_str().ok_or(InvalidTarget)?;
                if subject.is_empty() || subject.contains('/') {
                    return Err(InvalidTarget);
                }
                Ok(Self::Nats {
                    server: format!("nats://{host}:{}", url.port().unwrap_or(4222)),
                    subject: subject.to_owned(),
                })
            }
            #[cfg(feature = "rabbitmq")]
            "amqp" => {
                let (mut exchange, mut routing_key) = (String::new(), None);
                for (name, value) in url.query_pairs() {
                    match &*name {
                        "exchange" => exchange = value.into_owned(),
                        "routing_key" => routing_key = Some(value.into_owned()),
                        _ => return Err(InvalidTarget),
                    }
                }
                let mut uri = url.clone();
                uri.set_query(None);
                Ok(Self::Rabbitmq {
                    uri: uri.to_string(),
                    exchange,
                    routing_key: routing_key.ok_or(InvalidTarget)?,
                })
            }
            _ => Err(InvalidTarget),
        }
    }

    /// The message a `test.outbox` event enqueues: `body` as JSON.
    pub fn message(&self, body: &Value) -> Message {
        match self {
            Self::Http(url) => Message::post_json(url, body),
            #[cfg(feature = "nats")]
            Self::Nats { subject, .. } => json(Message::nats(subject), body),
            #[cfg(feature = "rabbitmq")]
            Self::Rabbitmq {
                exchange,
                routing_key,
                ..
            } => json(Message::rabbitmq(exchange, routing_key), body),
        }
    }

    /// Gives `relay` the publisher this target needs; for NATS, ensures a stream takes the
    /// subject first.
    pub async fn attach<DB: OutboxDatabase>(
        &self,
        relay: Relay<DB>,
    ) -> Result<Relay<DB>, BoxError> {
        match self {
            Self::Http(_) => Ok(relay),
            #[cfg(feature = "nats")]
            Self::Nats { server, subject } => {
                let publisher = tower_idempotency::outbox::NatsPublisher::connect(server).await?;
                let window = relay.retry_horizon();
                ensure_stream(publisher.context(), subject, window).await;
                Ok(relay.nats(publisher))
            }
            #[cfg(feature = "rabbitmq")]
            Self::Rabbitmq { uri, .. } => {
                Ok(relay.rabbitmq(tower_idempotency::outbox::RabbitPublisher::new(uri.clone())))
            }
        }
    }
}

/// Creates a stream for `subject` when none takes it: named after the subject (`.`, `*`, `>`
/// and other characters a stream name cannot hold as `_`), its duplicate window `window`. A
/// server that does not answer within 10 s is logged; the relay's attempts then fail and are
/// retried until a stream takes the subject.
#[cfg(feature = "nats")]
async fn ensure_stream(
    context: &async_nats::jetstream::Context,
    subject: &str,
    window: std::time::Duration,
) {
    let ensure = async {
        if context.stream_by_subject(subject).await.is_ok() {
            return Ok::<_, BoxError>(());
        }
        let name: String = subject
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        context
            .get_or_create_stream(async_nats::jetstream::stream::Config {
                name,
                subjects: vec![subject.to_owned()],
                duplicate_window: window,
                ..Default::default()
            })
            .await?;
        Ok(())
    };
    match tokio::time::timeout(std::time::Duration::from_secs(10), ensure).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(%error, "the outbox's JetStream stream could not be created")
        }
        Err(_) => {
            tracing::warn!("NATS did not answer; the outbox's JetStream stream was not checked")
        }
    }
}

/// `message` with `body` as its JSON payload.
#[cfg(any(feature = "nats", feature = "rabbitmq"))]
fn json(message: Message, body: &Value) -> Message {
    message
        .header("content-type", "application/json")
        .body(body.to_string())
}
