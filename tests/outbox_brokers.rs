//! The outbox relaying to NATS JetStream and RabbitMQ through the reference receiver (written next).
