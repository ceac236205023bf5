//! The worker and the locks it meets, over real HTTP: on SQLite a handler's transaction takes
//! the write lock at its first statement (so acknowledgements are answered while handlers wait
//! before it), the worker's failure record waits out a busy database instead of leaving its
//! event for a whole lease, and on Postgres a wait for an object's ordering lock keeps the claim
//! renewed (no second instance runs the event meanwhile). With `max_ack_batch(1)` each delivery
//! is its own commit.

#[macro_use]
mod common;

use std::{
    str::FromStr,
    time::{Duration, Instant},
};

use common::*;
use futures_util::future::join_all;
use tower_idempotency_inbox::{EventKey, EventState, Inbox, Ordering, OrderingPolicy};
use tower_idempotency_sqlx::sqlx::{self, Executor};

/// Four handlers wait at a gate before their first statement; five deliveries sent meanwhile
/// are all answered `200` while the gate is still closed (on SQLite no handler holds the write
/// lock yet). Then every event is processed once.
async fn acknowledgements_pass_handlers_waiting_before_their_first_statement<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let inbox = setup.inbox.clone();
    acknowledged_while_handlers_wait(setup, inbox, "evt").await;
}

/// Under skip-stale, an event without an ordering key (no `data.object.id`) needs no lock on a
/// key: on SQLite its handler's transaction takes the write lock at its first statement, as
/// without ordering, so the same holds as above.
async fn skip_stale_leaves_unordered_events_lazy<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let inbox = setup
        .inbox
        .clone()
        .ordering(Ordering::stripe(OrderingPolicy::SkipStale));
    acknowledged_while_handlers_wait(setup, inbox, "evt_unordered").await;
}

/// Four handlers of `inbox` wait at a gate before their first statement while five deliveries
/// are sent: all five are answered `200` before the gate opens; then all nine are processed once.
async fn acknowledged_while_handlers_wait<DB: Fixture>(
    setup: Setup<DB>,
    inbox: Inbox<DB>,
    prefix: &str,
) {
    let probe = setup.probe();
    let worker = quick(inbox.worker(probe.handler::<DB>()))
        .concurrency(4)
        .spawn();
    let url = serve(&inbox).await;
    let client = reqwest::Client::new();
    let gated = ids(&format!("{prefix}_gated"), 4);
    deliver_all(&client, &url, &gated, "test.gated").await;
    probe.wait_started(4).await;
    let later = ids(&format!("{prefix}_later"), 5);
    let bodies: Vec<String> = later
        .iter()
        .map(|id| event_body(id, "charge.succeeded"))
        .collect();
    let statuses = tokio::time::timeout(
        Duration::from_secs(5),
        join_all(bodies.iter().map(|b| deliver(&client, &url, SECRET, b))),
    )
    .await
    .unwrap_or_else(|_| panic!("{}: acknowledgements waited for the handlers", DB::LABEL));
    assert!(
        statuses.iter().all(|&s| s == 200),
        "{}: {statuses:?}",
        DB::LABEL
    );
    probe.open_gate();
    for id in gated.iter().chain(&later) {
        assert_eq!(
            setup.wait_for(id, EventState::Processed).await,
            1,
            "{}",
            DB::LABEL
        );
        assert_eq!(setup.effects(id).await, 1, "{}: {id}", DB::LABEL);
    }
    setup.finish(worker).await;
}

/// SQLite, a 100 ms busy timeout and a one-minute lease: the test takes the write lock while a
/// handler waits at its gate and holds it well past the busy timeout, so the handler's write and
/// then the worker's failure record meet a busy database. The record is written once the lock
/// is free, so the event is retried and processed within seconds, not after its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_failure_record_waits_out_a_busy_database() {
    let dir = std::env::temp_dir().join(format!("tidem-locks-{}", suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}/inbox.db", dir.display());
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(&url)
        .unwrap()
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_millis(100));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .unwrap();
    let (table, effects) = (format!("t{}_inbox", suffix()), format!("t{}_fx", suffix()));
    let inbox = Inbox::new(pool.clone(), &table).unwrap();
    inbox.migrate().await.unwrap();
    <sqlx::Sqlite as Fixture>::create_effects(&pool, &effects).await;
    let probe = Probe::new(&effects);
    let worker = quick(inbox.worker(probe.handler::<sqlx::Sqlite>()))
        .lease(Duration::from_secs(60))
        .spawn();
    let served = serve(&inbox).await;
    deliver_all(
        &reqwest::Client::new(),
        &served,
        &ids("evt_busy", 1),
        "test.gated",
    )
    .await;
    probe.wait_started(1).await;
    let mut held = pool.acquire().await.unwrap();
    held.execute("BEGIN IMMEDIATE").await.unwrap();
    probe.open_gate();
    // Longer than the busy timeout of the handler's write, of its second try with the write lock
    // and of the failure record's first write.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    held.execute("ROLLBACK").await.unwrap();
    drop(held);
    let key = EventKey::new("stripe", "evt_busy_0");
    let deadline = Instant::now() + Duration::from_secs(20);
    let event = loop {
        let event = inbox.get(&key).await.unwrap().unwrap();
        if event.state == EventState::Processed {
            break event;
        }
        assert!(
            Instant::now() < deadline,
            "the event waits for its lease: {event:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(event.attempts, 2, "{event:?}");
    assert_eq!(
        <sqlx::Sqlite as Fixture>::effects(&pool, &effects, "evt_busy_0").await,
        1
    );
    assert!(worker.drain(Duration::from_secs(10)).await);
    pool.close().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Postgres, skip-stale ordering, a 300 ms lease and two workers (two instances): the test
/// holds the object's ordering lock for five leases while one attempt waits for it. The
/// waiting attempt keeps its claim renewed, so the other worker never claims the event: the
/// handler runs once, on the first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_wait_for_the_ordering_lock_keeps_the_claim() {
    let setup = Setup::<sqlx::Postgres>::new().await;
    let inbox = setup
        .inbox
        .clone()
        .ordering(Ordering::stripe(OrderingPolicy::SkipStale));
    let probe = setup.probe();
    let workers: Vec<_> = (0..2)
        .map(|_| {
            quick(inbox.worker(probe.handler::<sqlx::Postgres>()))
                .lease(Duration::from_millis(300))
                .spawn()
        })
        .collect();
    let mut held = setup.pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(hashtextextended('stripe:obj_locked', 0))")
        .execute(&mut *held)
        .await
        .unwrap();
    let url = serve(&inbox).await;
    let body = r#"{"id":"evt_locked","object":"event","type":"charge.succeeded","created":7,"data":{"object":{"id":"obj_locked"}}}"#;
    assert_eq!(
        deliver(&reqwest::Client::new(), &url, SECRET, body).await,
        200
    );
    // One attempt waits for the lock.
    let waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
    let deadline = Instant::now() + Duration::from_secs(20);
    while sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(waiting))
        .fetch_one(&setup.pool)
        .await
        .unwrap()
        == 0
    {
        assert!(Instant::now() < deadline, "no attempt waited for the lock");
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sqlx::query("SELECT pg_advisory_unlock(hashtextextended('stripe:obj_locked', 0))")
        .execute(&mut *held)
        .await
        .unwrap();
    drop(held);
    assert_eq!(setup.wait_for("evt_locked", EventState::Processed).await, 1);
    for worker in workers {
        assert!(worker.drain(Duration::from_secs(10)).await);
    }
    assert_eq!(probe.runs("evt_locked"), 1);
    assert_eq!(setup.effects("evt_locked").await, 1);
    setup.cleanup().await;
}

/// With `max_ack_batch(1)` every delivery is its own statement and commit: 30 events and 10
/// copies of some, at once, are all answered `200` with one statement each, and each event is
/// stored once.
async fn one_commit_per_delivery<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let inbox = setup.inbox.clone().max_ack_batch(1);
    let url = serve(&inbox).await;
    let ids = ids("evt_single", 30);
    let mut bodies: Vec<String> = ids
        .iter()
        .map(|id| event_body(id, "charge.succeeded"))
        .collect();
    bodies.extend((0..10).map(|i| event_body(&ids[i * 3], "charge.succeeded")));
    let client = reqwest::Client::new();
    let before = inbox.statements_executed();
    let statuses = join_all(bodies.iter().map(|b| deliver(&client, &url, SECRET, b))).await;
    assert!(
        statuses.iter().all(|&s| s == 200),
        "{}: {statuses:?}",
        DB::LABEL
    );
    assert_eq!(
        inbox.statements_executed() - before,
        bodies.len() as u64,
        "{}",
        DB::LABEL
    );
    assert_eq!(inbox.counts().await.unwrap().pending, 30, "{}", DB::LABEL);
    setup.cleanup().await;
}

on_both!(
    acknowledgements_pass_handlers_waiting_before_their_first_statement,
    skip_stale_leaves_unordered_events_lazy,
    one_commit_per_delivery,
);
