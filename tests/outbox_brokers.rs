//! The reference receiver's outbox relaying to the NATS JetStream and RabbitMQ on this machine,
//! as a child process SIGKILLed three times while it relays 50 `test.outbox` messages
//! (`OUTBOX_TARGET_URL=nats://...` / `amqp://...`), then restarted until every message is
//! delivered: the JetStream stream holds each message exactly once (the key as `Nats-Msg-Id`);
//! the RabbitMQ queue holds each at least once, every copy with its key as `message_id`, and a
//! consumer on the broker helper (`TxConsumer`, its effect and record in one SQLite transaction)
//! runs each message's effect exactly once, also when it is killed after the effect committed
//! and before it acknowledged (the broker redelivers, the helper acknowledges the recorded
//! result). The receiver reaches the broker through a loopback proxy that, for the second kill,
//! holds the broker's replies back, so that kill always lands inside a delivery. Each test has its
//! own database, stream, exchange and queue, deleted at the end.
#![cfg(unix)]

mod broker_fixtures;
mod receiver_process;
mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use broker_fixtures::{
    amqp_url, msg_id, nats_or_skip, nats_url, rabbit_channel, rabbitmq_or_skip, Rabbit, Stream,
};
use futures_util::{future::join_all, StreamExt};
use lapin::{
    message::Delivery,
    options::{BasicConsumeOptions, BasicQosOptions},
    types::FieldTable,
    Channel,
};
use receiver_process::{
    deliver_stripe, get_json, random_below, scalars, sqlite_store, stripe_event, Receiver, TestDir,
};
use support::*;
use tower_idempotency::{
    broker::{BrokerDelivery, Failure, SettleError, Settled, TxConsumer},
    sqlx, SqliteStore,
};
use tower_idempotency_testkit::{host_port, poll_until, Mode, Proxy};

const SECRET: &str = "whsec_outbox_brokers_test";
const MESSAGES: usize = 50;
const KILLS: usize = 3;

fn upstream(store: &str, target: &str) -> Receiver {
    Receiver::stripe(
        store,
        SECRET,
        &[
            ("HANDLER_DELAY_MS", "20".to_owned()),
            ("INBOX_LEASE_MS", "1500".to_owned()),
            ("INBOX_SWEEP_MS", "20".to_owned()),
            ("INBOX_BACKOFF_MS", "10".to_owned()),
            ("INBOX_MAX_ATTEMPTS", "1000".to_owned()),
            ("OUTBOX_TARGET_URL", target.to_owned()),
        ],
    )
}

/// Whether one of the outbox's messages is claimed by a delivery that has not finished
/// (pending with an attempt counted).
async fn in_flight(store: &str, prefix: &str) -> i64 {
    let sql =
        "SELECT count(*) FROM outbox WHERE scope LIKE $1 || '%' AND state = 0 AND attempts > 0";
    scalars(store, sql, prefix).await[0]
}

/// 50 `test.outbox` events acknowledged by an upstream receiver relaying to the broker at
/// `broker` (`host:port`) through a proxy, `target` naming the proxy's address in the target URL,
/// in rounds; the receiver is SIGKILLed after each of the first three rounds: in the first and
/// third at a random point of the next 300 ms, in the second while the proxy holds the broker's
/// replies back and a delivery is claimed (so at least that kill cuts a delivery short). Then one
/// last receiver delivers everything. Answers the event ids and how many deliveries the kills
/// cut short.
async fn killed_while_relaying(
    store: &str,
    broker: &str,
    target: impl Fn(&str) -> String,
) -> (Vec<String>, i64) {
    let proxy = Proxy::start(broker).await;
    let target = target(&proxy.addr.to_string());
    let target = target.as_str();
    let client = reqwest::Client::new();
    let prefix = format!("evt_{}_", random_suffix());
    let ids: Vec<String> = (0..MESSAGES).map(|n| format!("{prefix}{n:02}")).collect();
    let mut cut_short = 0;
    for (round, chunk) in ids.chunks(MESSAGES.div_ceil(KILLS)).enumerate() {
        let held = round % 2 == 1;
        let mut receiver = upstream(store, target);
        if held {
            // After start-up (which, for NATS, waits for the stream) and before any event.
            proxy.set(Mode::HoldReplies);
        }
        let statuses = join_all(chunk.iter().map(|id| {
            let (client, base, body) = (
                client.clone(),
                receiver.base.clone(),
                stripe_event(id, "test.outbox"),
            );
            async move { deliver_stripe(&client, &base, SECRET, &body).await }
        }))
        .await;
        assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
        if held {
            // No delivery can finish while the broker's replies are held: wait for one to start.
            poll_until(
                "a delivery in flight",
                Duration::from_millis(2),
                || in_flight(store, &prefix),
                |&n| n > 0,
            )
            .await;
        } else {
            // The point of the crash is the point of this test: a random moment after the acks.
            tokio::time::sleep(Duration::from_millis(random_below(300))).await;
        }
        receiver.kill();
        cut_short += in_flight(store, &prefix).await;
        proxy.set(Mode::Pass);
    }
    let last = upstream(store, target);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let effects = get_json(&client, format!("{}/effects", last.base)).await;
        if ids.iter().all(|id| effects[format!("outbox:{id}")] == 1) {
            for id in &ids {
                assert_eq!(effects[format!("inbox:{id}")], 1, "{id}");
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every message was delivered: {effects}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    eprintln!("the kills cut short {cut_short} deliveries");
    assert!(
        cut_short > 0,
        "no kill cut a delivery short; the test proved nothing"
    );
    (ids, cut_short)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_killed_while_relaying_to_jetstream_stores_each_message_once() {
    if !nats_or_skip("receiver_killed_while_relaying_to_jetstream_stores_each_message_once") {
        return;
    }
    let (_dir, store) = sqlite_store("outbox-jetstream");
    let subject = format!("outbox_kill.{}", random_suffix());
    // The receiver creates the stream (none takes the subject yet); the guard deletes it.
    let stream = Stream::adopt(&subject).await;
    let (ids, _cut_short) = killed_while_relaying(&store, &host_port(&nats_url()), |addr| {
        format!("nats://{addr}/{subject}")
    })
    .await;
    let stream = stream.created().await;
    let stored = stream.messages().await;
    let mut seen = BTreeMap::<String, usize>::new();
    for message in &stored {
        *seen
            .entry(msg_id(message).expect("a Nats-Msg-Id"))
            .or_default() += 1;
        let body: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
        assert_eq!(
            format!("{}/0", body["event"].as_str().unwrap()),
            msg_id(message).unwrap()
        );
    }
    let expected: BTreeSet<String> = ids.iter().map(|id| format!("{id}/0")).collect();
    assert_eq!(seen.keys().cloned().collect::<BTreeSet<_>>(), expected);
    assert!(
        seen.values().all(|&n| n == 1),
        "a message stored twice: {seen:?}"
    );
    assert_eq!(stored.len(), MESSAGES);
}

/// A delivery whose consumer is killed at its acknowledgement: the acknowledgement never leaves,
/// and the consumer's channel closes (RabbitMQ requeues every delivery it held unacknowledged).
struct KilledAtAck<'a> {
    delivery: &'a Delivery,
    channel: &'a Channel,
}

impl BrokerDelivery for KilledAtAck<'_> {
    fn message_id(&self) -> Option<String> {
        self.delivery.message_id()
    }

    fn sequence(&self) -> Option<String> {
        self.delivery.sequence()
    }

    fn payload(&self) -> bytes::Bytes {
        self.delivery.payload()
    }

    async fn ack(&self) -> Result<(), SettleError> {
        let _ = self.channel.close(200, "killed".into()).await;
        Err(SettleError("killed before the acknowledgement".into()))
    }

    async fn retry(&self, delay: Option<Duration>) -> Result<(), SettleError> {
        self.delivery.retry(delay).await
    }

    async fn terminate(&self) -> Result<(), SettleError> {
        self.delivery.terminate().await
    }
}

/// Runs one consumer on `queue` with `once` until `done` says stop; the first `kill_after`
/// deliveries it acknowledges instead kill it (`KilledAtAck`). Answers the keys whose work ran
/// and the keys acknowledged as duplicates, per delivery.
async fn consume(
    once: &TxConsumer<sqlx::Sqlite>,
    queue: &str,
    kill_at: Option<usize>,
    done: impl Fn(&BTreeSet<String>) -> bool,
    acked: &mut BTreeSet<String>,
) -> (Vec<String>, Vec<String>) {
    let (connection, channel) = rabbit_channel().await;
    channel
        .basic_qos(10, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "outbox-brokers-test".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let (mut ran, mut replayed) = (Vec::new(), Vec::new());
    let mut handled = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done(acked) {
        let next = tokio::time::timeout_at(deadline.into(), consumer.next()).await;
        let Ok(Some(delivery)) = next else {
            if kill_at.is_some() {
                break; // The channel was closed by the kill.
            }
            panic!("the queue ran dry before every message was acknowledged: {acked:?}");
        };
        let Ok(delivery) = delivery else {
            break;
        };
        let work = |payload: bytes::Bytes,
                    mut tx: tower_idempotency::IdempotentTx<sqlx::Sqlite>| async move {
            let body: serde_json::Value = serde_json::from_slice(&payload).unwrap();
            let event = body["event"].as_str().unwrap().to_owned();
            sqlx::query("INSERT INTO consumer_effects (event_id) VALUES ($1)")
                .bind(&event)
                .execute(&mut *tx)
                .await
                .map_err(Failure::Retry)?;
            Ok::<_, Failure<sqlx::Error>>(event)
        };
        handled += 1;
        if kill_at == Some(handled) {
            let killed = KilledAtAck {
                delivery: &delivery,
                channel: &channel,
            };
            let outcome = once.handle(&killed, work).await;
            assert!(
                outcome.settled.is_err(),
                "the kill stopped the acknowledgement"
            );
            let ran_now = outcome.result.expect("the work ran before the kill");
            assert!(!ran_now.is_replay());
            ran.push(outcome.key.expect("a key"));
            break;
        }
        let outcome = once.handle(&delivery, work).await;
        assert_eq!(
            outcome.settled.as_ref().ok(),
            Some(&Settled::Acked),
            "{:?}",
            outcome.result
        );
        let result = outcome.result.expect("the work's value");
        let key = outcome.key.expect("a key");
        assert_eq!(key, format!("{}/0", result.value));
        if result.is_replay() {
            replayed.push(key.clone());
        } else {
            ran.push(key.clone());
        }
        acked.insert(key);
    }
    let _ = connection.close(200, "done".into()).await;
    (ran, replayed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_killed_while_relaying_to_rabbitmq_and_a_killed_consumer_run_each_effect_once() {
    let name =
        "receiver_killed_while_relaying_to_rabbitmq_and_a_killed_consumer_run_each_effect_once";
    if !rabbitmq_or_skip(name) {
        return;
    }
    let rabbit = Rabbit::create("outbox-kill", true).await;
    let (_dir, store) = sqlite_store("outbox-rabbitmq");
    let broker = host_port(&amqp_url());
    let (ids, _cut_short) = killed_while_relaying(&store, &broker, |addr| {
        format!(
            "{}?exchange={}&routing_key={}",
            amqp_url().replacen(&broker, addr, 1),
            rabbit.exchange,
            rabbit.routing_key
        )
    })
    .await;
    let expected: BTreeSet<String> = ids.iter().map(|id| format!("{id}/0")).collect();

    // The consumer: its effect (a row of `consumer_effects`) and the key's record commit in one
    // SQLite transaction of its own database.
    let consumer_dir = TestDir::new("outbox-consumer");
    let url = format!("sqlite://{}/consumer.db", consumer_dir.path().display());
    let once_store = SqliteStore::connect(&url).await.unwrap();
    once_store.migrate().await.unwrap();
    sqlx::query("CREATE TABLE consumer_effects (event_id TEXT NOT NULL)")
        .execute(once_store.pool())
        .await
        .unwrap();
    let pool = once_store.pool().clone();
    let once = TxConsumer::new(once_store, "outbox-consumer").unwrap();

    // The first consumer acknowledges four deliveries, runs the fifth's effect and is killed
    // before its acknowledgement; the second takes every message, the fifth's again.
    let mut acked = BTreeSet::new();
    let (ran_first, _) = consume(&once, &rabbit.queue, Some(5), |_| false, &mut acked).await;
    assert_eq!(ran_first.len(), 5, "{ran_first:?}");
    assert_eq!(acked.len(), 4);
    let killed = ran_first.last().unwrap().clone();
    assert!(!acked.contains(&killed));
    let (ran_second, replayed) = consume(
        &once,
        &rabbit.queue,
        None,
        |acked| acked.len() == MESSAGES,
        &mut acked,
    )
    .await;
    assert_eq!(acked, expected, "every message reached the queue");
    assert!(
        replayed.contains(&killed),
        "the killed consumer's delivery came back and was acknowledged without running again"
    );
    let ran: BTreeSet<String> = ran_first.iter().chain(&ran_second).cloned().collect();
    assert_eq!(
        ran.len(),
        ran_first.len() + ran_second.len(),
        "a key ran twice"
    );
    assert_eq!(ran, expected);
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT event_id, count(*) FROM consumer_effects GROUP BY event_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), MESSAGES);
    assert!(rows.iter().all(|(_, n)| *n == 1), "{rows:?}");
    // Copies left in the queue (a publish repeated after a kill) carry their key too.
    for copy in rabbit.take_all().await {
        let id = copy
            .delivery
            .properties
            .message_id()
            .as_ref()
            .unwrap()
            .to_string();
        assert!(expected.contains(&id), "{id}");
    }
}
