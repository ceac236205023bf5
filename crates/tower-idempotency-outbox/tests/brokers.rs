//! The outbox's broker publishers against the NATS JetStream and RabbitMQ on this machine, on a
//! SQLite outbox of each test's own, each test with a stream or an exchange and queue of its own
//! (deleted at the end): messages land with their key as the broker's message id, a JetStream
//! duplicate acknowledgement delivers, a broker whose port refuses or whose connections are cut
//! leaves messages pending until it is back, an unroutable RabbitMQ message ends failed, and a
//! stream whose duplicate window is shorter than the relay's retry horizon is warned about.

#[path = "../../../tests/broker_fixtures/mod.rs"]
mod broker_fixtures;

use std::{
    collections::BTreeSet,
    path::PathBuf,
    time::{Duration, Instant},
};

use broker_fixtures::{amqp_url, msg_id, nats_or_skip, nats_url, rabbitmq_or_skip, Rabbit, Stream};
use tower_idempotency_outbox::{
    Backoff, Message, MessageState, NatsPublisher, Outbox, RabbitPublisher, Relay,
};
use tower_idempotency_sqlx::sqlx::{self, Sqlite};
use tower_idempotency_testkit::{host_port, random_suffix, CapturedLogs, Mode, Proxy};

/// A SQLite outbox in a directory of its own, removed when dropped.
struct Env {
    outbox: Outbox<Sqlite>,
    dir: PathBuf,
}

impl Env {
    async fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("tidem-outbox-broker-{}", random_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}/outbox.db?mode=rwc", dir.display());
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        let outbox = Outbox::new(pool, "outbox").unwrap();
        outbox.migrate().await.unwrap();
        Self { outbox, dir }
    }

    async fn enqueue(&self, message: Message) {
        let mut tx = self.outbox.pool().begin().await.unwrap();
        self.outbox.enqueue(&mut *tx, message).await.unwrap();
        tx.commit().await.unwrap();
    }

    async fn state(&self, key: &str) -> (MessageState, Option<String>) {
        let detail = self
            .outbox
            .message(key)
            .await
            .unwrap()
            .expect("the message");
        (detail.summary.state, detail.summary.last_error)
    }

    /// Runs rounds until `key` is in `want` (at most 60 s: a client reconnects with a backoff).
    async fn rounds_until(&self, relay: &Relay<Sqlite>, key: &str, want: MessageState) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            relay.run_once().await.unwrap();
            let (state, error) = self.state(key).await;
            if state == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{key} stayed {state:?} ({error:?})"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A relay retrying within milliseconds, each attempt bounded to two seconds.
fn fast(outbox: &Outbox<Sqlite>) -> Relay<Sqlite> {
    outbox
        .relay()
        .backoff(Backoff::exponential(
            Duration::from_millis(5),
            Duration::from_millis(20),
        ))
        .attempt_timeout(Duration::from_secs(2))
        .lease(Duration::from_secs(10))
        .max_attempts(1000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_stores_each_message_once_with_its_key_as_msg_id() {
    if !nats_or_skip("nats_stores_each_message_once_with_its_key_as_msg_id") {
        return;
    }
    let stream = Stream::create("outbox_once", Duration::from_secs(3600)).await;
    let env = Env::new().await;
    let keys: Vec<String> = (0..20).map(|n| format!("order-{n}")).collect();
    for key in &keys {
        let message = Message::nats(&stream.subject)
            .key(key)
            .header("x-tenant", "t1")
            .body(format!("{{\"order\":\"{key}\"}}"));
        env.enqueue(message).await;
    }
    // An earlier attempt of order-0 reached the stream, and its record was lost: the relay's
    // publish is then acknowledged as a duplicate, which delivers the message.
    stream
        .context
        .send_publish(
            stream.subject.clone(),
            async_nats::jetstream::message::PublishMessage::build()
                .payload("{\"order\":\"order-0\"}".into())
                .message_id("order-0"),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let publisher = NatsPublisher::connect(&nats_url()).await.unwrap();
    let relay = fast(&env.outbox).nats(publisher).concurrency(64);
    let round = relay.run_once().await.unwrap();
    assert_eq!((round.claimed, round.delivered), (20, 20), "{round:?}");
    for key in &keys {
        assert_eq!(env.state(key).await.0, MessageState::Delivered, "{key}");
    }
    let stored = stream.messages().await;
    assert_eq!(stored.len(), 20, "each message once");
    let ids: BTreeSet<String> = stored.iter().filter_map(msg_id).collect();
    assert_eq!(ids, keys.iter().cloned().collect::<BTreeSet<_>>());
    let tagged = stored
        .iter()
        .filter(|m| m.headers.get("x-tenant").map(|v| v.as_str()) == Some("t1"))
        .count();
    assert_eq!(tagged, 19, "the relay's copies carry the message's headers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_refused_or_cut_leaves_messages_pending_until_it_is_back() {
    if !nats_or_skip("nats_refused_or_cut_leaves_messages_pending_until_it_is_back") {
        return;
    }
    let stream = Stream::create("outbox_outage", Duration::from_secs(3600)).await;
    let env = Env::new().await;
    let proxy = Proxy::start(host_port(&nats_url())).await;
    let publisher = NatsPublisher::connect(&format!("nats://{}", proxy.addr))
        .await
        .unwrap();
    let relay = fast(&env.outbox).nats(publisher);

    // Up: delivered.
    env.enqueue(Message::nats(&stream.subject).key("first").body("1"))
        .await;
    env.rounds_until(&relay, "first", MessageState::Delivered)
        .await;

    // Cut mid-relay, and the port refusing every new connection: a retried failure.
    proxy.set(Mode::Drop);
    proxy.cut();
    env.enqueue(Message::nats(&stream.subject).key("second").body("2"))
        .await;
    let round = relay.run_once().await.unwrap();
    assert_eq!((round.retried, round.delivered), (1, 0), "{round:?}");
    let (state, error) = env.state("second").await;
    assert_eq!(state, MessageState::Pending);
    assert!(error.is_some(), "the failed attempt's error is kept");

    // Back: delivered by the next rounds.
    proxy.set(Mode::Pass);
    env.rounds_until(&relay, "second", MessageState::Delivered)
        .await;
    let ids: Vec<String> = stream.messages().await.iter().filter_map(msg_id).collect();
    assert_eq!(ids, ["first", "second"]);
}

/// A relay with the default retry settings (a horizon of about a quarter hour) warns about a
/// stream keeping duplicates for a second, and not about one keeping them for an hour.
#[tokio::test]
async fn nats_warns_when_the_duplicate_window_is_shorter_than_the_retry_horizon() {
    if !nats_or_skip("nats_warns_when_the_duplicate_window_is_shorter_than_the_retry_horizon") {
        return;
    }
    let short = Stream::create("outbox_short", Duration::from_secs(1)).await;
    let long = Stream::create("outbox_long", Duration::from_secs(3600)).await;
    let env = Env::new().await;
    let publisher = NatsPublisher::connect(&nats_url()).await.unwrap();
    let relay = env.outbox.relay().nats(publisher);
    assert!(relay.retry_horizon() > Duration::from_secs(60));
    assert!(relay.retry_horizon() < Duration::from_secs(3600));
    assert_eq!(
        publisher_window(&relay, &short.subject).await,
        Duration::from_secs(1)
    );

    let (logs, _guard) = CapturedLogs::start(tracing::Level::WARN);
    env.enqueue(Message::nats(&long.subject).key("long").body("x"))
        .await;
    relay.run_once().await.unwrap();
    assert_eq!(env.state("long").await.0, MessageState::Delivered);
    assert!(!logs.text().contains("duplicate window"), "{}", logs.text());
    env.enqueue(Message::nats(&short.subject).key("short").body("x"))
        .await;
    relay.run_once().await.unwrap();
    assert_eq!(env.state("short").await.0, MessageState::Delivered);
    let text = logs.text();
    assert!(
        text.contains("duplicate window is shorter than the outbox relay's retry horizon"),
        "{text}"
    );
    assert!(text.contains(&short.subject), "{text}");
}

async fn publisher_window(_relay: &Relay<Sqlite>, subject: &str) -> Duration {
    NatsPublisher::connect(&nats_url())
        .await
        .unwrap()
        .duplicate_window(subject)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_messages_are_confirmed_persistent_with_their_key_as_message_id() {
    if !rabbitmq_or_skip("rabbitmq_messages_are_confirmed_persistent_with_their_key_as_message_id")
    {
        return;
    }
    let rabbit = Rabbit::create("outbox-confirmed", true).await;
    let env = Env::new().await;
    let keys: Vec<String> = (0..10).map(|n| format!("refund-{n}")).collect();
    for key in &keys {
        let message = Message::rabbitmq(&rabbit.exchange, &rabbit.routing_key)
            .key(key)
            .header("content-type", "application/json")
            .header("x-tenant", "t1")
            .body(format!("{{\"refund\":\"{key}\"}}"));
        env.enqueue(message).await;
    }
    let relay = fast(&env.outbox).rabbitmq(RabbitPublisher::new(amqp_url()));
    let round = relay.run_once().await.unwrap();
    assert_eq!((round.claimed, round.delivered), (10, 10), "{round:?}");
    let messages = rabbit.take_all().await;
    assert_eq!(messages.len(), 10);
    let mut ids = BTreeSet::new();
    for message in &messages {
        let properties = &message.delivery.properties;
        let id = properties.message_id().as_ref().unwrap().to_string();
        assert_eq!(*properties.delivery_mode(), Some(2), "persistent");
        assert_eq!(
            properties.content_type().as_ref().map(|t| t.to_string()),
            Some("application/json".to_owned())
        );
        let headers = properties.headers().as_ref().expect("headers");
        assert!(headers.inner().contains_key("x-tenant"));
        assert_eq!(
            message.delivery.data,
            format!("{{\"refund\":\"{id}\"}}").into_bytes()
        );
        ids.insert(id);
    }
    assert_eq!(ids, keys.iter().cloned().collect::<BTreeSet<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_unroutable_message_ends_failed_never_delivered() {
    if !rabbitmq_or_skip("rabbitmq_unroutable_message_ends_failed_never_delivered") {
        return;
    }
    let rabbit = Rabbit::create("outbox-unroutable", false).await;
    let env = Env::new().await;
    env.enqueue(
        Message::rabbitmq(&rabbit.exchange, &rabbit.routing_key)
            .key("nowhere")
            .body("x"),
    )
    .await;
    let relay = fast(&env.outbox)
        .max_attempts(3)
        .rabbitmq(RabbitPublisher::new(amqp_url()));
    let mut delivered = 0;
    for _ in 0..200 {
        let round = relay.run_once().await.unwrap();
        delivered += round.delivered;
        if env.state("nowhere").await.0 == MessageState::Failed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(delivered, 0);
    let (state, error) = env.state("nowhere").await;
    assert_eq!(state, MessageState::Failed);
    let error = error.unwrap();
    assert!(
        error.contains("unroutable") && error.contains("NO_ROUTE"),
        "{error}"
    );
    let detail = env.outbox.message("nowhere").await.unwrap().unwrap();
    assert_eq!(detail.summary.attempts, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_refused_or_cut_leaves_messages_pending_until_it_is_back() {
    if !rabbitmq_or_skip("rabbitmq_refused_or_cut_leaves_messages_pending_until_it_is_back") {
        return;
    }
    let rabbit = Rabbit::create("outbox-outage", true).await;
    let env = Env::new().await;
    let proxy = Proxy::start(host_port(&amqp_url())).await;
    let proxied = format!("amqp://guest:guest@{}/%2f", proxy.addr);
    let relay = fast(&env.outbox).rabbitmq(RabbitPublisher::new(proxied));
    let target = || Message::rabbitmq(&rabbit.exchange, &rabbit.routing_key);

    // Refused from the start: pending, with a clear error.
    proxy.set(Mode::Drop);
    env.enqueue(target().key("first").body("1")).await;
    let round = relay.run_once().await.unwrap();
    assert_eq!((round.retried, round.delivered), (1, 0), "{round:?}");
    let (state, error) = env.state("first").await;
    assert_eq!(state, MessageState::Pending);
    assert_eq!(error.as_deref(), Some("RabbitMQ could not be reached"));

    // Back: delivered.
    proxy.set(Mode::Pass);
    env.rounds_until(&relay, "first", MessageState::Delivered)
        .await;

    // Cut mid-relay (the open connection dies) and refused: pending again, then delivered.
    proxy.set(Mode::Drop);
    proxy.cut();
    env.enqueue(target().key("second").body("2")).await;
    let round = relay.run_once().await.unwrap();
    assert_eq!((round.retried, round.delivered), (1, 0), "{round:?}");
    assert_eq!(env.state("second").await.0, MessageState::Pending);
    proxy.set(Mode::Pass);
    env.rounds_until(&relay, "second", MessageState::Delivered)
        .await;

    let ids: Vec<String> = rabbit
        .take_all()
        .await
        .iter()
        .map(|m| {
            m.delivery
                .properties
                .message_id()
                .as_ref()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(ids, ["first", "second"]);
}

/// A broker message reaching a relay without that broker's publisher fails at once with a clear
/// error; a broker target that is not valid is refused at enqueue.
#[tokio::test]
async fn broker_messages_without_a_publisher_fail_and_bad_targets_are_refused() {
    let env = Env::new().await;
    env.enqueue(Message::nats("orders.created").key("n").body("x"))
        .await;
    env.enqueue(Message::rabbitmq("orders", "created").key("r").body("x"))
        .await;
    let round = env.outbox.relay().run_once().await.unwrap();
    assert_eq!(round.failed, 2, "{round:?}");
    assert_eq!(
        env.state("n").await.1.as_deref(),
        Some("the relay has no NATS publisher for this message")
    );
    assert_eq!(
        env.state("r").await.1.as_deref(),
        Some("the relay has no RabbitMQ publisher for this message")
    );
    let detail = env.outbox.message("r").await.unwrap().unwrap();
    assert_eq!(detail.summary.url.as_deref(), Some("amqp:orders/created"));
    assert_eq!(detail.summary.method, None);

    let mut tx = env.outbox.pool().begin().await.unwrap();
    for bad in [Message::nats("has space"), Message::nats("")] {
        let refused = env.outbox.enqueue(&mut *tx, bad).await;
        assert!(
            matches!(
                refused,
                Err(tower_idempotency_outbox::OutboxError::InvalidBrokerTarget)
            ),
            "{refused:?}"
        );
    }
}
