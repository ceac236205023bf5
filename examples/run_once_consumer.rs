//! `RunOnce` in a queue consumer, without HTTP: a broker delivers at least once and a handler
//! must charge each order once.
//!
//! ```sh
//! # No broker: a tokio channel that sends every message twice, the copies interleaved and
//! # handled by two consumers at once.
//! cargo run --example run_once_consumer
//! # NATS JetStream: a stream of its own, every order published twice (the stream drops the
//! # copy by its Nats-Msg-Id), consumed through `broker::OnceConsumer`, the stream deleted after.
//! cargo run --example run_once_consumer --features nats -- nats://127.0.0.1:4222
//! # RabbitMQ: a queue of its own, every order published twice (RabbitMQ keeps both copies),
//! # consumed through `broker::OnceConsumer`: each order charged once, both copies acknowledged.
//! cargo run --example run_once_consumer --features rabbitmq -- amqp://guest:guest@127.0.0.1:5672/%2f
//! ```
//!
//! With a broker, each message is keyed by its message id (which the outbox sets to the
//! message's key), and acknowledged only after the charge's result is recorded: a consumer
//! killed before its acknowledgement gets the message again, and the stored receipt answers it.
//! Without one, key each message by what identifies it (an event id, a partition and offset, a
//! business key), and acknowledge it after `run` answered, whether the work ran now or earlier.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tower_idempotency::{OnceError, RunOnce, SqliteStore};

#[derive(Clone, Debug, Serialize)]
struct Message {
    id: String,
    order: u32,
    cents: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    charge: String,
}

async fn consume(
    once: RunOnce,
    messages: Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<Message>>>,
    charges: Arc<AtomicUsize>,
) -> (usize, usize) {
    let (mut ran, mut replayed) = (0, 0);
    loop {
        let Some(message) = messages.lock().await.recv().await else {
            return (ran, replayed);
        };
        let charges = charges.clone();
        let order = message.order;
        let result = once
            .run_with_input(&message.id, &message, move || async move {
                Ok::<_, std::io::Error>(charge(charges, order).await)
            })
            .await;
        match result {
            Ok(receipt) if receipt.is_replay() => replayed += 1,
            Ok(_) => ran += 1,
            // The other copy is being handled right now: leave this one unacknowledged, the
            // broker redelivers it and `run` then returns the stored receipt.
            Err(OnceError::InFlight { .. }) => replayed += 1,
            Err(error) => eprintln!("message {}: {error}", message.id),
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The orders the demos charge.
const ORDERS: u32 = 50;

/// The effect to run once: a charge at the payment provider.
async fn charge(charges: Arc<AtomicUsize>, order: u32) -> Receipt {
    let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(5)).await;
    Receipt {
        charge: format!("ch_{order}_{n}"),
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = std::env::temp_dir().join(format!("run-once-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store = SqliteStore::connect(&format!("sqlite://{}/once.db", dir.display())).await?;
    store.migrate().await?;
    let once = RunOnce::new(store)
        .namespace("charges")
        .wait_for_result(Duration::from_secs(10));
    let broker = std::env::args().nth(1);
    let charged =
        match broker.as_deref() {
            None => channel_demo(once).await?,
            #[cfg(feature = "nats")]
            Some(url) if url.starts_with("nats://") => nats::demo(once, url).await?,
            #[cfg(feature = "rabbitmq")]
            Some(url) if url.starts_with("amqp://") => rabbitmq::demo(once, url).await?,
            Some(_) => return Err(
                "the argument is a nats:// URL (feature nats) or an amqp:// URL (feature rabbitmq)"
                    .into(),
            ),
        };
    std::fs::remove_dir_all(&dir)?;
    assert_eq!(
        charged, ORDERS as usize,
        "every order is charged exactly once"
    );
    Ok(())
}

/// The no-broker demo: a tokio channel delivering every message twice to two consumers.
async fn channel_demo(once: RunOnce) -> Result<usize, BoxError> {
    let (send, receive) = tokio::sync::mpsc::channel(64);
    let receive = Arc::new(tokio::sync::Mutex::new(receive));
    let charges = Arc::new(AtomicUsize::new(0));
    let consumers: Vec<_> = (0..2)
        .map(|_| tokio::spawn(consume(once.clone(), receive.clone(), charges.clone())))
        .collect();
    let orders = ORDERS;
    for order in 0..orders {
        let message = Message {
            id: format!("msg-{order}"),
            order,
            cents: 1_000 + u64::from(order),
        };
        // At least once: every message arrives twice.
        send.send(message.clone()).await?;
        send.send(message).await?;
    }
    drop(send);
    let (mut ran, mut replayed) = (0, 0);
    for consumer in consumers {
        let (r, p) = consumer.await?;
        ran += r;
        replayed += p;
    }
    let charged = charges.load(Ordering::SeqCst);
    println!("{orders} orders, each delivered twice: {ran} ran, {replayed} duplicates answered from the store, {charged} charges");
    Ok(charged)
}

/// The JetStream demo: a stream of its own, each order published twice with one `Nats-Msg-Id`,
/// a pull consumer handing each message to `OnceConsumer`.
#[cfg(feature = "nats")]
mod nats {
    use super::*;
    use async_nats::jetstream::{self, consumer::pull, message::PublishMessage, stream};
    use futures_util::StreamExt;
    use tower_idempotency::broker::{Failure, OnceConsumer};

    pub async fn demo(once: RunOnce, url: &str) -> Result<usize, BoxError> {
        let context = jetstream::new(async_nats::connect(url.trim_start_matches("nats://")).await?);
        let name = format!("RUN_ONCE_DEMO_{}", std::process::id());
        let subject = format!("run-once-demo.{}", std::process::id());
        let stream = context
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![subject.clone()],
                ..Default::default()
            })
            .await?;
        let result = consume(&context, &stream, &subject, once).await;
        context.delete_stream(&name).await?;
        result
    }

    async fn consume(
        context: &jetstream::Context,
        stream: &stream::Stream,
        subject: &str,
        once: RunOnce,
    ) -> Result<usize, BoxError> {
        for order in 0..ORDERS {
            let body = serde_json::to_vec(&Message {
                id: format!("msg-{order}"),
                order,
                cents: 1_000 + u64::from(order),
            })?;
            for _copy in 0..2 {
                let publish = PublishMessage::build()
                    .payload(body.clone().into())
                    .message_id(format!("msg-{order}"));
                context
                    .send_publish(subject.to_owned(), publish)
                    .await?
                    .await?;
            }
        }
        let consumer = stream
            .create_consumer(pull::Config {
                durable_name: Some("charges".to_owned()),
                ..Default::default()
            })
            .await?;
        let mut messages = consumer.messages().await?;
        let consumer = OnceConsumer::new(once);
        let charges = Arc::new(AtomicUsize::new(0));
        let mut acked = 0;
        while acked < ORDERS {
            let Some(message) = messages.next().await else {
                break;
            };
            let message = message?;
            let charges = charges.clone();
            let handled = consumer
                .handle(&message, move |payload| async move {
                    let order: serde_json::Value =
                        serde_json::from_slice(&payload).map_err(Failure::Terminate)?;
                    let order = order["order"].as_u64().unwrap_or_default() as u32;
                    Ok::<_, Failure<serde_json::Error>>(charge(charges, order).await)
                })
                .await;
            if handled.settled.is_ok() && handled.result.is_ok() {
                acked += 1;
            }
        }
        let charged = charges.load(Ordering::SeqCst);
        println!("JetStream: {ORDERS} orders published twice, the stream kept one copy of each: {acked} acknowledged, {charged} charges");
        Ok(charged)
    }
}

/// The RabbitMQ demo: a queue of its own, each order published twice with one `message_id`
/// (RabbitMQ keeps both), a consumer handing each delivery to `OnceConsumer`.
#[cfg(feature = "rabbitmq")]
mod rabbitmq {
    use super::*;
    use futures_util::StreamExt;
    use lapin::{
        options::{
            BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions,
        },
        types::FieldTable,
        BasicProperties, Connection, ConnectionProperties,
    };
    use tower_idempotency::broker::{Failure, OnceConsumer};

    pub async fn demo(once: RunOnce, url: &str) -> Result<usize, BoxError> {
        let connection = Connection::connect(url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        let queue = format!("run-once-demo-{}", std::process::id());
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await?;
        for order in 0..ORDERS {
            let body = serde_json::to_vec(&Message {
                id: format!("msg-{order}"),
                order,
                cents: 1_000 + u64::from(order),
            })?;
            for _copy in 0..2 {
                let properties =
                    BasicProperties::default().with_message_id(format!("msg-{order}").into());
                channel
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        BasicPublishOptions::default(),
                        &body,
                        properties,
                    )
                    .await?;
            }
        }
        let mut deliveries = channel
            .basic_consume(
                queue.as_str().into(),
                "charges".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let consumer = OnceConsumer::new(once);
        let charges = Arc::new(AtomicUsize::new(0));
        let (mut ran, mut replayed) = (0, 0);
        while ran + replayed < 2 * ORDERS {
            let Some(delivery) = deliveries.next().await else {
                break;
            };
            let delivery = delivery?;
            let charges = charges.clone();
            let handled = consumer
                .handle(&delivery, move |payload| async move {
                    let order: serde_json::Value =
                        serde_json::from_slice(&payload).map_err(Failure::Terminate)?;
                    let order = order["order"].as_u64().unwrap_or_default() as u32;
                    Ok::<_, Failure<serde_json::Error>>(charge(charges, order).await)
                })
                .await;
            match handled.result {
                Ok(receipt) if receipt.is_replay() => replayed += 1,
                Ok(_) => ran += 1,
                Err(error) => eprintln!("{:?}: {error}", handled.key),
            }
        }
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
        let _ = connection.close(200, "done".into()).await;
        let charged = charges.load(Ordering::SeqCst);
        println!("RabbitMQ: {ORDERS} orders delivered twice: {ran} ran, {replayed} duplicates acknowledged with the stored receipt, {charged} charges");
        Ok(charged)
    }
}
