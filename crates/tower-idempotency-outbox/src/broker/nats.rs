//! The relay's NATS JetStream publisher (feature `nats`).

use std::{
    collections::HashSet,
    fmt,
    str::FromStr,
    sync::{Arc, Mutex},
    time::Duration,
};

use async_nats::{
    header::{HeaderMap, HeaderName},
    jetstream::{self, context::PublishErrorKind, message::PublishMessage},
};

use super::Outgoing;
use crate::{backend::OutboxDatabase, DispatchError, Relay};

/// Publishes the relay's [`Message::nats`](crate::Message::nats) messages to NATS JetStream;
/// give it to [`Relay::nats`].
///
/// Each message is published to its subject with its key as `Nats-Msg-Id`, and the attempt
/// waits for the stream's publish acknowledgement: an acknowledgement delivers the message, and
/// so does one marked `duplicate` (the stream already holds the message: an earlier attempt was
/// stored, and its acknowledgement or its record was lost). No acknowledgement (no stream
/// bound to the subject, the server down or cut off, the acknowledgement's timeout) is a
/// failed attempt, retried with the relay's backoff.
///
/// The stream drops a repeated `Nats-Msg-Id` only within its duplicate window (two minutes by
/// default). A message is published again only while the relay retries it, so the window must
/// cover the relay's [`retry_horizon`](Relay::retry_horizon): the publisher reads the window of
/// each stream it publishes to once, at its first message there, and warns when it is shorter.
#[derive(Clone)]
pub struct NatsPublisher {
    context: jetstream::Context,
    /// Streams whose duplicate window was compared with the retry horizon (by subject).
    checked: Arc<Mutex<HashSet<String>>>,
}

impl fmt::Debug for NatsPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsPublisher").finish_non_exhaustive()
    }
}

/// Why a publisher could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsPublisherError {
    /// The URL is not a NATS server address.
    #[error("the NATS URL is invalid")]
    InvalidUrl,
}

impl NatsPublisher {
    /// A publisher on a JetStream context of your client (its timeout bounds the wait for each
    /// acknowledgement).
    pub fn new(context: jetstream::Context) -> Self {
        Self {
            context,
            checked: Arc::default(),
        }
    }

    /// A publisher on a client of its own for the server at `url` (`nats://host:port`). It
    /// returns at once, also while the server is down: the client connects in the background
    /// and reconnects after a failure, and attempts made meanwhile fail and are retried.
    ///
    /// # Errors
    ///
    /// [`NatsPublisherError::InvalidUrl`] for an address that is none.
    pub async fn connect(url: &str) -> Result<Self, NatsPublisherError> {
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(url)
            .await
            .map_err(|_| NatsPublisherError::InvalidUrl)?;
        Ok(Self::new(jetstream::new(client)))
    }

    /// The JetStream context it publishes with.
    pub fn context(&self) -> &jetstream::Context {
        &self.context
    }

    /// The duplicate window of the stream bound to `subject`, read from the server.
    ///
    /// # Errors
    ///
    /// [`DispatchError::Retry`] when no stream is bound to the subject or the server did not
    /// answer.
    pub async fn duplicate_window(&self, subject: &str) -> Result<Duration, DispatchError> {
        let name =
            self.context.stream_by_subject(subject).await.map_err(|_| {
                DispatchError::retry("no JetStream stream was found for the subject")
            })?;
        let stream = self
            .context
            .get_stream(&name)
            .await
            .map_err(|_| DispatchError::retry("the JetStream stream could not be read"))?;
        Ok(stream.cached_info().config.duplicate_window)
    }

    /// Warns once per subject when its stream's duplicate window is shorter than `horizon`.
    async fn check_window(&self, subject: &str, horizon: Duration) {
        if self
            .checked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(subject)
        {
            return;
        }
        let Ok(window) = self.duplicate_window(subject).await else {
            return; // Checked at the next message, once the stream answers.
        };
        self.checked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(subject.to_owned());
        if window < horizon {
            tracing::warn!(
                subject,
                duplicate_window_ms = window.as_millis(),
                retry_horizon_ms = horizon.as_millis(),
                "the JetStream stream's duplicate window is shorter than the outbox relay's retry \
                 horizon: a message retried after the window may be stored twice"
            );
        }
    }

    /// Publishes one message and waits for its acknowledgement.
    pub(crate) async fn publish(
        &self,
        subject: &str,
        message: Outgoing,
        horizon: Duration,
    ) -> Result<(), DispatchError> {
        self.check_window(subject, horizon).await;
        let mut headers = HeaderMap::new();
        for (name, value) in &message.headers {
            if name.eq_ignore_ascii_case("Nats-Msg-Id") {
                continue; // The key is the message id.
            }
            let Ok(name) = HeaderName::from_str(name) else {
                return Err(DispatchError::permanent(
                    "a header name is not a valid NATS header name",
                ));
            };
            headers.append(name, value.as_str());
        }
        let publish = PublishMessage::build()
            .payload(message.body)
            .headers(headers)
            .message_id(&message.key);
        let failed = |kind: PublishErrorKind| match kind {
            PublishErrorKind::StreamNotFound => {
                DispatchError::retry("no JetStream stream is bound to the subject")
            }
            PublishErrorKind::TimedOut => {
                DispatchError::retry("JetStream did not acknowledge the message in time")
            }
            PublishErrorKind::MaxPayloadExceeded => {
                DispatchError::permanent("the message is larger than the NATS server accepts")
            }
            _ => DispatchError::retry("publishing to NATS JetStream failed"),
        };
        let pending = self
            .context
            .send_publish(subject.to_owned(), publish)
            .await
            .map_err(|error| failed(error.kind()))?;
        let ack = pending.await.map_err(|error| failed(error.kind()))?;
        if ack.duplicate {
            tracing::debug!(
                stream = ack.stream,
                "JetStream already held this outbox message: delivered"
            );
        }
        Ok(())
    }
}

impl<DB: OutboxDatabase> Relay<DB> {
    /// Publishes [`Message::nats`](crate::Message::nats) messages with `publisher`; without
    /// one, they fail at their first attempt.
    pub fn nats(mut self, publisher: NatsPublisher) -> Self {
        self.deliver.brokers.nats = Some(Arc::new(publisher));
        self
    }
}
