//! The NATS JetStream and RabbitMQ on this machine as test fixtures: a stream or an exchange
//! and queue of the test's own, deleted when dropped (even when the test panics), and the rule
//! that a broker that cannot be reached skips a test outside CI and fails it under `CI=true`.
//! Shared by the facade's broker tests and the outbox crate's (`#[path]`).
#![allow(dead_code)] // Each test binary uses a different subset.

use std::time::Duration;

use async_nats::jetstream::{self, message::StreamMessage, stream};
use lapin::{
    message::BasicGetMessage,
    options::{
        BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
        QueueDeclareOptions, QueueDeleteOptions,
    },
    types::FieldTable,
    Channel, Connection, ConnectionProperties, ExchangeKind,
};
use tower_idempotency_testkit::{host_port, random_suffix, reachable, skip};

/// The NATS server (`NATS_URL`, default `nats://127.0.0.1:4222`).
pub fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// The RabbitMQ broker (`AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`).
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// Whether NATS accepts connections; when not, `what` is skipped (failed under `CI=true`).
pub fn nats_or_skip(what: &str) -> bool {
    let up = reachable(&host_port(&nats_url()));
    if !up {
        skip(what, "NATS is not reachable");
    }
    up
}

/// Whether RabbitMQ accepts connections; when not, `what` is skipped (failed under `CI=true`).
pub fn rabbitmq_or_skip(what: &str) -> bool {
    let up = reachable(&host_port(&amqp_url()));
    if !up {
        skip(what, "RabbitMQ is not reachable");
    }
    up
}

/// Runs `work` to its end on a runtime of its own, on a thread of its own: for `Drop`, which runs
/// inside the test's runtime and cannot block it.
fn finish(work: impl std::future::Future<Output = ()> + Send + 'static) {
    let done = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(work);
    })
    .join();
    if done.is_err() && !std::thread::panicking() {
        panic!("deleting a broker fixture failed");
    }
}

/// A JetStream stream of the test's own on one subject of its own, deleted when dropped.
pub struct Stream {
    pub context: jetstream::Context,
    pub name: String,
    pub subject: String,
}

impl Stream {
    /// Creates `<prefix>_<random>` on the subject `<prefix>.<random>` with `duplicate_window`.
    pub async fn create(prefix: &str, duplicate_window: Duration) -> Self {
        let suffix = random_suffix();
        let client = async_nats::connect(host_port(&nats_url()))
            .await
            .expect("connect to NATS");
        let context = jetstream::new(client);
        let name = format!("{}_{suffix}", prefix.to_uppercase());
        let subject = format!("{prefix}.{suffix}");
        context
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![subject.clone()],
                duplicate_window,
                ..Default::default()
            })
            .await
            .expect("create the stream");
        Self {
            context,
            name,
            subject,
        }
    }

    /// A guard for the stream that will take `subject` (created by someone else, the receiver):
    /// [`created`](Self::created) finds it; dropped, it deletes the stream that took the subject.
    pub async fn adopt(subject: &str) -> Self {
        let client = async_nats::connect(host_port(&nats_url()))
            .await
            .expect("connect to NATS");
        Self {
            context: jetstream::new(client),
            name: String::new(),
            subject: subject.to_owned(),
        }
    }

    /// The adopted stream, found by its subject.
    pub async fn created(mut self) -> Self {
        self.name = self
            .context
            .stream_by_subject(self.subject.clone())
            .await
            .expect("a stream takes the subject");
        self
    }

    /// Every message the stream holds, in order.
    pub async fn messages(&self) -> Vec<StreamMessage> {
        let mut stream = self
            .context
            .get_stream(&self.name)
            .await
            .expect("the stream");
        let state = stream.info().await.expect("stream info").state.clone();
        let mut messages = Vec::new();
        if state.messages == 0 {
            return messages;
        }
        for sequence in state.first_sequence..=state.last_sequence {
            if let Ok(message) = stream.get_raw_message(sequence).await {
                messages.push(message);
            }
        }
        messages
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let (name, subject) = (self.name.clone(), self.subject.clone());
        finish(async move {
            let client = async_nats::connect(host_port(&nats_url()))
                .await
                .expect("connect to NATS");
            let context = jetstream::new(client);
            let name = match name.is_empty() {
                true => context.stream_by_subject(subject).await.unwrap_or_default(),
                false => name,
            };
            if !name.is_empty() {
                let _ = context.delete_stream(&name).await;
            }
        });
    }
}

/// The `Nats-Msg-Id` of a stored message.
pub fn msg_id(message: &StreamMessage) -> Option<String> {
    Some(message.headers.get("Nats-Msg-Id")?.as_str().to_owned())
}

/// A direct exchange and a queue of the test's own, the queue bound with the routing key (or
/// not, for unroutable messages); both deleted when dropped.
pub struct Rabbit {
    pub connection: Connection,
    pub channel: Channel,
    pub exchange: String,
    pub queue: String,
    pub routing_key: String,
}

/// A connection to RabbitMQ and a channel on it.
pub async fn rabbit_channel() -> (Connection, Channel) {
    let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("connect to RabbitMQ");
    let channel = connection.create_channel().await.expect("a channel");
    (connection, channel)
}

impl Rabbit {
    /// Declares `<prefix>-<random>` as exchange and queue; binds them with the routing key
    /// `<prefix>.key` when `bind`.
    pub async fn create(prefix: &str, bind: bool) -> Self {
        let name = format!("{prefix}-{}", random_suffix());
        let routing_key = format!("{prefix}.key");
        let (connection, channel) = rabbit_channel().await;
        channel
            .exchange_declare(
                name.as_str().into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare the exchange");
        channel
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare the queue");
        if bind {
            channel
                .queue_bind(
                    name.as_str().into(),
                    name.as_str().into(),
                    routing_key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .expect("bind the queue");
        }
        Self {
            connection,
            channel,
            exchange: name.clone(),
            queue: name,
            routing_key,
        }
    }

    /// Takes every message the queue holds now (acknowledged as taken).
    pub async fn take_all(&self) -> Vec<BasicGetMessage> {
        let mut messages = Vec::new();
        while let Some(message) = self
            .channel
            .basic_get(self.queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            messages.push(message);
        }
        messages
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        let (exchange, queue) = (self.exchange.clone(), self.queue.clone());
        finish(async move {
            let (connection, channel) = rabbit_channel().await;
            let _ = channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
            let _ = channel
                .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
                .await;
            let _ = connection.close(200, "done".into()).await;
        });
    }
}
