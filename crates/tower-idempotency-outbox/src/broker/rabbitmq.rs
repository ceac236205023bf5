//! The relay's RabbitMQ publisher (feature `rabbitmq`).

use std::{fmt, sync::Arc};

use lapin::{
    options::{BasicPublishOptions, ConfirmSelectOptions},
    types::{AMQPValue, FieldTable, LongString, ShortString},
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties,
};
use tokio::sync::Mutex;

use super::Outgoing;
use crate::{backend::OutboxDatabase, DispatchError, Relay};

/// AMQP's persistent delivery mode: the broker writes the message to disk (on a durable queue).
const PERSISTENT: u8 = 2;

/// Publishes the relay's [`Message::rabbitmq`](crate::Message::rabbitmq) messages to RabbitMQ;
/// give it to [`Relay::rabbitmq`].
///
/// It opens one connection and one channel in publisher-confirm mode, at the first message,
/// and opens them again at the next message after either failed. Each message is published
/// persistent, `mandatory`, with its key as `message_id`, and the attempt waits for the
/// broker's confirm: an `ack` delivers the message; a `nack`, a message returned because no
/// queue is bound to its exchange and routing key (unroutable), a broker that is down or a
/// connection lost before the confirm is a failed attempt, retried with the relay's backoff and
/// failed after its last attempt. RabbitMQ does not deduplicate: a message whose confirm was
/// lost is published again, and the consumer drops the copy by its `message_id`.
pub struct RabbitPublisher {
    uri: String,
    open: Mutex<Option<Open>>,
}

/// An open connection and its confirm-mode channel, numbered so that a failed publish closes
/// only the connection it used.
struct Open {
    generation: u64,
    channel: Channel,
    // Kept so the connection stays open while the channel is used.
    _connection: Connection,
}

impl fmt::Debug for RabbitPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URI carries the password.
        f.debug_struct("RabbitPublisher").finish_non_exhaustive()
    }
}

impl RabbitPublisher {
    /// A publisher for the broker at `uri` (`amqp://user:pass@host:port/vhost`, the vhost
    /// percent-encoded: `%2f` is `/`). It connects at the first message.
    pub fn new(uri: impl Into<String>) -> Self {
        Self {
            uri: uri.into(),
            open: Mutex::new(None),
        }
    }

    /// The channel to publish on and its generation, opened when there is none.
    async fn channel(&self) -> Result<(u64, Channel), DispatchError> {
        let mut open = self.open.lock().await;
        if let Some(open) = open.as_ref() {
            if open.channel.status().connected() {
                return Ok((open.generation, open.channel.clone()));
            }
        }
        let unreachable = |_| DispatchError::retry("RabbitMQ could not be reached");
        let connection = Connection::connect(&self.uri, ConnectionProperties::default())
            .await
            .map_err(unreachable)?;
        let channel = connection.create_channel().await.map_err(unreachable)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(unreachable)?;
        let generation = open.as_ref().map_or(0, |open| open.generation + 1);
        *open = Some(Open {
            generation,
            channel: channel.clone(),
            _connection: connection,
        });
        Ok((generation, channel))
    }

    /// Forgets the connection of `generation` after a failure on it.
    async fn reset(&self, generation: u64) {
        let mut open = self.open.lock().await;
        if open
            .as_ref()
            .is_some_and(|open| open.generation == generation)
        {
            *open = None;
        }
    }

    /// Publishes one message and waits for its confirm.
    pub(crate) async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        message: Outgoing,
    ) -> Result<(), DispatchError> {
        let mut headers = FieldTable::default();
        let mut content_type = None;
        for (name, value) in &message.headers {
            if name.eq_ignore_ascii_case("content-type") {
                content_type = Some(ShortString::from(value.as_str()));
            } else if name.len() <= 255 {
                headers.insert(
                    ShortString::from(name.as_str()),
                    AMQPValue::LongString(LongString::from(value.as_str())),
                );
            } else {
                return Err(DispatchError::permanent(
                    "a header name is longer than AMQP allows (255 bytes)",
                ));
            }
        }
        let mut properties = BasicProperties::default()
            .with_message_id(ShortString::from(message.key.as_str()))
            .with_delivery_mode(PERSISTENT)
            .with_headers(headers);
        if let Some(content_type) = content_type {
            properties = properties.with_content_type(content_type);
        }
        let (generation, channel) = self.channel().await?;
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirmed = async {
            channel
                .basic_publish(
                    ShortString::from(exchange),
                    ShortString::from(routing_key),
                    options,
                    &message.body,
                    properties,
                )
                .await?
                .await
        }
        .await;
        let confirmation = match confirmed {
            Ok(confirmation) => confirmation,
            Err(_) => {
                self.reset(generation).await;
                return Err(DispatchError::retry(
                    "the RabbitMQ connection failed before the publish was confirmed",
                ));
            }
        };
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                Err(DispatchError::retry(format!(
                    "RabbitMQ returned the message as unroutable ({} {}): no queue is bound \
                     to its exchange and routing key",
                    returned.reply_code, returned.reply_text
                )))
            }
            Confirmation::Nack(None) => Err(DispatchError::retry(
                "RabbitMQ refused the message (a negative publisher confirm)",
            )),
            Confirmation::NotRequested => {
                self.reset(generation).await;
                Err(DispatchError::retry(
                    "the RabbitMQ channel is not in publisher-confirm mode",
                ))
            }
        }
    }
}

impl<DB: OutboxDatabase> Relay<DB> {
    /// Publishes [`Message::rabbitmq`](crate::Message::rabbitmq) messages with `publisher`;
    /// without one, they fail at their first attempt.
    pub fn rabbitmq(mut self, publisher: RabbitPublisher) -> Self {
        self.deliver.brokers.rabbitmq = Some(Arc::new(publisher));
        self
    }
}
