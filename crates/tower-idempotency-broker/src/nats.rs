//! [`BrokerDelivery`] for NATS JetStream messages (feature `nats`).

use std::time::Duration;

use async_nats::jetstream::{message::Message, AckKind};
use bytes::Bytes;

use crate::{BrokerDelivery, SettleError};

/// A JetStream message: keyed by its `Nats-Msg-Id` header (the outbox's message key), else by
/// its stream sequence. Each settlement waits for the server's confirmation (a double ack), so
/// an acknowledgement that returned `Ok` was received.
impl BrokerDelivery for Message {
    fn message_id(&self) -> Option<String> {
        let headers = self.headers.as_ref()?;
        Some(headers.get("Nats-Msg-Id")?.as_str().to_owned())
    }

    fn sequence(&self) -> Option<String> {
        let info = self.info().ok()?;
        Some(format!("{}:{}", info.stream, info.stream_sequence))
    }

    fn payload(&self) -> Bytes {
        self.payload.clone()
    }

    async fn ack(&self) -> Result<(), SettleError> {
        self.double_ack().await.map_err(SettleError)
    }

    async fn retry(&self, delay: Option<Duration>) -> Result<(), SettleError> {
        self.double_ack_with(AckKind::Nak(delay))
            .await
            .map_err(SettleError)
    }

    async fn terminate(&self) -> Result<(), SettleError> {
        self.double_ack_with(AckKind::Term)
            .await
            .map_err(SettleError)
    }
}
