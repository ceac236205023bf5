//! The consumer helpers against the NATS JetStream and RabbitMQ on this machine, each test with
//! a stream or an exchange and queue of its own (deleted at the end) and a SQLite store in a
//! directory of its own: a delivery is acknowledged only after its result is recorded, a
//! duplicate or a redelivery after a consumer died before its acknowledgement is acknowledged
//! with the recorded result and never runs again, a failure is handed back or terminated by the
//! work's classification, a delivery without a message id is terminated, and in the
//! transactional mode a failed work's writes roll back.

#[path = "../../../tests/broker_fixtures/mod.rs"]
mod broker_fixtures;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use broker_fixtures::{nats_or_skip, rabbit_channel, rabbitmq_or_skip, Rabbit, Stream};
use bytes::Bytes;
use futures_util::StreamExt;
use lapin::{
    options::{BasicConsumeOptions, BasicPublishOptions},
    types::FieldTable,
    BasicProperties,
};
use tower_idempotency_broker::{
    BrokerDelivery, Failure, HandleError, OnceConsumer, OnceError, SettleError, Settled, TxConsumer,
};
use tower_idempotency_core::RunOnce;
use tower_idempotency_sqlx::{sqlx, IdempotentTx, SqliteStore};
use tower_idempotency_testkit::random_suffix;

/// A SQLite database in a directory of its own, removed when dropped.
struct Store {
    dir: std::path::PathBuf,
}

impl Store {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("tidem-broker-{}", random_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir }
    }

    /// A store on the database.
    async fn open(&self) -> SqliteStore {
        let store = SqliteStore::connect(&format!("sqlite://{}/once.db", self.dir.display()))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        store
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How often each key's work ran, and what it is told to do per key.
#[derive(Clone, Default)]
struct Work {
    ran: Arc<Mutex<BTreeMap<String, usize>>>,
    attempts: Arc<Mutex<BTreeMap<String, usize>>>,
}

impl Work {
    /// The work for one delivery: `retry-once*` fails its first attempt (retried),
    /// `terminate*` always fails (terminated); anything else runs and is counted.
    fn run(
        &self,
    ) -> impl FnOnce(Bytes) -> futures_util::future::Ready<Result<String, Failure<String>>>
           + Send
           + 'static {
        let this = self.clone();
        move |payload| {
            let key = String::from_utf8(payload.to_vec()).unwrap();
            let attempt = {
                let mut attempts = this.attempts.lock().unwrap();
                let n = attempts.entry(key.clone()).or_default();
                *n += 1;
                *n
            };
            let outcome = if key.starts_with("retry-once") && attempt == 1 {
                Err(Failure::Retry(format!("{key}: not yet")))
            } else if key.starts_with("terminate") {
                Err(Failure::Terminate(format!("{key}: never")))
            } else {
                *this.ran.lock().unwrap().entry(key.clone()).or_default() += 1;
                Ok(format!("done:{key}"))
            };
            futures_util::future::ready(outcome)
        }
    }

    fn ran(&self) -> BTreeMap<String, usize> {
        self.ran.lock().unwrap().clone()
    }
}

/// A delivery whose consumer dies at its acknowledgement: nothing is sent to the broker.
struct DiesAtAck<'a, D>(&'a D);

impl<D: BrokerDelivery> BrokerDelivery for DiesAtAck<'_, D> {
    fn message_id(&self) -> Option<String> {
        self.0.message_id()
    }

    fn sequence(&self) -> Option<String> {
        self.0.sequence()
    }

    fn payload(&self) -> Bytes {
        self.0.payload()
    }

    async fn ack(&self) -> Result<(), SettleError> {
        Err(SettleError("died before the acknowledgement".into()))
    }

    async fn retry(&self, delay: Option<Duration>) -> Result<(), SettleError> {
        self.0.retry(delay).await
    }

    async fn terminate(&self) -> Result<(), SettleError> {
        self.0.terminate().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_deliveries_run_once_and_settle_by_their_outcome() {
    if !nats_or_skip("jetstream_deliveries_run_once_and_settle_by_their_outcome") {
        return;
    }
    let stream = Stream::create("broker_once", Duration::from_secs(3600)).await;
    let store = Store::new();
    let once = OnceConsumer::new(RunOnce::new(store.open().await).namespace("jetstream"))
        .retry_delay(Duration::from_millis(10));
    let ids = ["a", "b", "c", "retry-once", "terminate"];
    for id in ids {
        stream
            .context
            .send_publish(
                stream.subject.clone(),
                async_nats::jetstream::message::PublishMessage::build()
                    .payload(id.into())
                    .message_id(id),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    // A message without an id.
    stream
        .context
        .publish(stream.subject.clone(), "anonymous".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let consumer = stream
        .context
        .get_stream(&stream.name)
        .await
        .unwrap()
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("once".to_owned()),
            ack_wait: Duration::from_secs(1),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    let work = Work::default();
    let mut settled = BTreeMap::<String, Vec<Settled>>::new();
    let mut died = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    // Until every id is settled for good: "a" dies at its first acknowledgement (after its
    // result is recorded) and comes back after the ack wait.
    while settled
        .values()
        .flatten()
        .filter(|s| **s != Settled::Retried)
        .count()
        < ids.len() + 1
    {
        let message = tokio::time::timeout_at(deadline.into(), messages.next())
            .await
            .expect("a delivery in time")
            .unwrap()
            .unwrap();
        let id = message.message_id().unwrap_or_else(|| "(none)".to_owned());
        let handled = if id == "a" && !died {
            died = true;
            let handled = once.handle(&DiesAtAck(&message), work.run()).await;
            assert!(handled.settled.is_err());
            assert!(!handled.result.unwrap().is_replay());
            continue;
        } else {
            once.handle(&message, work.run()).await
        };
        let how = handled.settled.unwrap();
        match id.as_str() {
            "a" => {
                let ran = handled.result.unwrap();
                assert!(
                    ran.is_replay(),
                    "the redelivery is answered from the record"
                );
                assert_eq!(ran.value, "done:a");
                assert_eq!(how, Settled::Acked);
            }
            "terminate" => {
                assert!(matches!(
                    handled.result,
                    Err(HandleError::Once(OnceError::Failed(Failure::Terminate(_))))
                ));
                assert_eq!(how, Settled::Terminated);
            }
            "(none)" => {
                assert!(matches!(handled.result, Err(HandleError::NoKey)));
                assert_eq!(how, Settled::Terminated);
            }
            "retry-once" if how == Settled::Retried => {
                assert!(matches!(
                    handled.result,
                    Err(HandleError::Once(OnceError::Failed(Failure::Retry(_))))
                ));
            }
            _ => {
                assert_eq!(handled.result.unwrap().value, format!("done:{id}"));
                assert_eq!(how, Settled::Acked);
            }
        }
        settled.entry(id).or_default().push(how);
    }
    assert_eq!(settled["retry-once"], [Settled::Retried, Settled::Acked]);
    let ran = work.ran();
    assert_eq!(
        ran,
        BTreeMap::from([
            ("a".to_owned(), 1),
            ("b".to_owned(), 1),
            ("c".to_owned(), 1),
            ("retry-once".to_owned(), 1),
        ])
    );
    let mut consumer = consumer;
    let info = consumer.info().await.unwrap();
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 0));
}

/// Publishes `payload` to the queue through the default exchange, with `id` as its
/// `message_id` when given.
async fn publish(channel: &lapin::Channel, queue: &str, payload: &str, id: Option<&str>) {
    let mut properties = BasicProperties::default();
    if let Some(id) = id {
        properties = properties.with_message_id(id.into());
    }
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            payload.as_bytes(),
            properties,
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_deliveries_run_once_and_settle_by_their_outcome() {
    if !rabbitmq_or_skip("rabbitmq_deliveries_run_once_and_settle_by_their_outcome") {
        return;
    }
    let rabbit = Rabbit::create("broker-once", true).await;
    let store = Store::new();
    let once = OnceConsumer::new(RunOnce::new(store.open().await).namespace("rabbitmq"))
        .retry_delay(Duration::from_millis(10));
    // "a" twice: the publisher's copy of a message whose confirm it lost.
    for id in ["a", "a", "b", "retry-once", "terminate"] {
        publish(&rabbit.channel, &rabbit.queue, id, Some(id)).await;
    }
    publish(&rabbit.channel, &rabbit.queue, "anonymous", None).await;
    let (connection, channel) = rabbit_channel().await;
    let mut consumer = channel
        .basic_consume(
            rabbit.queue.as_str().into(),
            "once".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let work = Work::default();
    let mut settled = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while settled
        .iter()
        .filter(|(_, s)| *s != Settled::Retried)
        .count()
        < 6
    {
        let delivery = tokio::time::timeout_at(deadline.into(), consumer.next())
            .await
            .expect("a delivery in time")
            .unwrap()
            .unwrap();
        let handled = once.handle(&delivery, work.run()).await;
        let id = handled.key.clone().unwrap_or_else(|| "(none)".to_owned());
        if id == "a" {
            let ran = handled.result.as_ref().unwrap();
            assert_eq!(ran.value, "done:a");
        }
        settled.push((id, handled.settled.unwrap()));
    }
    settled.sort();
    assert_eq!(
        settled,
        [
            ("(none)".to_owned(), Settled::Terminated),
            ("a".to_owned(), Settled::Acked),
            ("a".to_owned(), Settled::Acked),
            ("b".to_owned(), Settled::Acked),
            ("retry-once".to_owned(), Settled::Acked),
            ("retry-once".to_owned(), Settled::Retried),
            ("terminate".to_owned(), Settled::Terminated),
        ]
    );
    assert_eq!(
        work.ran(),
        BTreeMap::from([
            ("a".to_owned(), 1),
            ("b".to_owned(), 1),
            ("retry-once".to_owned(), 1),
        ])
    );
    let _ = connection.close(200, "done".into()).await;
    assert!(rabbit.take_all().await.is_empty(), "every delivery settled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_consumer_commits_the_effect_with_the_record_and_rolls_back_a_failure() {
    if !rabbitmq_or_skip("transactional_consumer_commits_the_effect_with_the_record") {
        return;
    }
    let rabbit = Rabbit::create("broker-tx", true).await;
    let store = Store::new();
    let sqlite = store.open().await;
    let pool = sqlite.pool().clone();
    sqlx::query("CREATE TABLE effects (id TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let once = TxConsumer::new(sqlite, "tx")
        .unwrap()
        .retry_delay(Duration::from_millis(10));
    for id in ["x", "x", "retry-once"] {
        publish(&rabbit.channel, &rabbit.queue, id, Some(id)).await;
    }
    let (connection, channel) = rabbit_channel().await;
    let mut consumer = channel
        .basic_consume(
            rabbit.queue.as_str().into(),
            "tx".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let attempts = Arc::new(Mutex::new(0));
    let mut outcomes = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while outcomes
        .iter()
        .filter(|(_, s, _)| *s == Settled::Acked)
        .count()
        < 3
    {
        let delivery = tokio::time::timeout_at(deadline.into(), consumer.next())
            .await
            .expect("a delivery in time")
            .unwrap()
            .unwrap();
        let attempts = attempts.clone();
        let handled = once
            .handle(
                &delivery,
                move |payload: Bytes, mut tx: IdempotentTx<sqlx::Sqlite>| async move {
                    let id = String::from_utf8(payload.to_vec()).unwrap();
                    sqlx::query("INSERT INTO effects (id) VALUES ($1)")
                        .bind(&id)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| Failure::Retry(e.to_string()))?;
                    if id == "retry-once" {
                        let mut attempts = attempts.lock().unwrap();
                        *attempts += 1;
                        if *attempts == 1 {
                            // The row above is rolled back with the failure.
                            return Err(Failure::Retry("not yet".to_owned()));
                        }
                    }
                    Ok::<_, Failure<String>>(id)
                },
            )
            .await;
        let replay = handled.result.as_ref().is_ok_and(|ran| ran.is_replay());
        outcomes.push((handled.key.unwrap(), handled.settled.unwrap(), replay));
    }
    outcomes.sort();
    assert_eq!(
        outcomes,
        [
            ("retry-once".to_owned(), Settled::Acked, false),
            ("retry-once".to_owned(), Settled::Retried, false),
            ("x".to_owned(), Settled::Acked, false),
            ("x".to_owned(), Settled::Acked, true),
        ]
    );
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT id, count(*) FROM effects GROUP BY id ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows, [("retry-once".to_owned(), 1), ("x".to_owned(), 1)]);
    let _ = connection.close(200, "done".into()).await;
}
