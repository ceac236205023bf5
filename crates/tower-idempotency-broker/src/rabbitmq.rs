//! [`BrokerDelivery`] for RabbitMQ deliveries (feature `rabbitmq`).

use std::time::Duration;

use bytes::Bytes;
use lapin::{
    message::Delivery,
    options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions},
};

use crate::{BrokerDelivery, SettleError};

/// A RabbitMQ delivery: keyed by its `message_id` property (the outbox's message key), else by
/// its delivery tag. RabbitMQ requeues a `nack` at once, so [`retry`](BrokerDelivery::retry)
/// waits its delay first (the delivery stays unacknowledged meanwhile).
impl BrokerDelivery for Delivery {
    fn message_id(&self) -> Option<String> {
        self.properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_owned())
    }

    fn sequence(&self) -> Option<String> {
        Some(format!("tag:{}", self.delivery_tag))
    }

    fn payload(&self) -> Bytes {
        Bytes::copy_from_slice(&self.data)
    }

    async fn ack(&self) -> Result<(), SettleError> {
        self.acker
            .ack(BasicAckOptions::default())
            .await
            .map(drop)
            .map_err(|error| SettleError(error.into()))
    }

    async fn retry(&self, delay: Option<Duration>) -> Result<(), SettleError> {
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let options = BasicNackOptions {
            requeue: true,
            ..BasicNackOptions::default()
        };
        self.acker
            .nack(options)
            .await
            .map(drop)
            .map_err(|error| SettleError(error.into()))
    }

    async fn terminate(&self) -> Result<(), SettleError> {
        let options = BasicRejectOptions { requeue: false };
        self.acker
            .reject(options)
            .await
            .map(drop)
            .map_err(|error| SettleError(error.into()))
    }
}
