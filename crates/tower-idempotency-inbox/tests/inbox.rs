//! The inbox over real HTTP on the real databases (a SQLite file, the shared Postgres; each test
//! with tables of its own): concurrent duplicates, acknowledgement before a slow handler,
//! retries, dead-lettering, panics, a full queue, forgeries, a database outage, the drain and
//! the admin router.

#[macro_use]
mod common;

use std::time::Duration;

use common::*;
use futures_util::future::join_all;
use tower_idempotency_inbox::{admin, EventKey, EventState, InboxWorker, WorkerBuilder};
use tower_idempotency_sqlx::sqlx;

/// Retries a few milliseconds apart, swept every 10 ms.
fn quick<DB: Fixture>(builder: WorkerBuilder<DB>) -> WorkerBuilder<DB> {
    quick_retries(builder, Duration::from_millis(10))
}

async fn start<DB: Fixture>(setup: &Setup<DB>, probe: &Probe) -> InboxWorker {
    quick(setup.inbox.worker(probe.handler::<DB>()))
        .max_attempts(4)
        .spawn()
}

/// A test's inbox at work: its tables, a probe handler run by `start`'s worker, the
/// acknowledging route's URL, and a client.
async fn running<DB: Fixture>() -> (Setup<DB>, Probe, InboxWorker, String, reqwest::Client) {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let worker = start(&setup, &probe).await;
    let url = serve(&setup.inbox).await;
    (setup, probe, worker, url, reqwest::Client::new())
}

/// 10 rounds of 25 concurrent identical deliveries: every one is acknowledged `200`, the inbox
/// holds one row per event, and the handler runs and writes once per event.
async fn concurrent_duplicates<DB: Fixture>() {
    let (setup, probe, worker, url, client) = running::<DB>().await;
    for round in 0..10 {
        let id = format!("evt_dup_{round}");
        let body = event_body(&id, "charge.succeeded");
        let statuses = join_all((0..25).map(|_| deliver(&client, &url, SECRET, &body))).await;
        assert!(
            statuses.iter().all(|&s| s == 200),
            "{}: {statuses:?}",
            DB::LABEL
        );
        setup.wait_for(&id, EventState::Processed).await;
    }
    let counts = setup.inbox.counts().await.unwrap();
    assert_eq!(
        (counts.processed, counts.pending, counts.failed),
        (10, 0, 0)
    );
    for round in 0..10 {
        let id = format!("evt_dup_{round}");
        assert_eq!(setup.effects(&id).await, 1, "{}: {id}", DB::LABEL);
        assert_eq!(probe.runs(&id), 1, "{}: {id}", DB::LABEL);
    }
    setup.finish(worker).await;
}

/// The handler is held at a gate that opens only after the sender got its `200`: the
/// acknowledgement cannot have waited for it.
async fn ack_before_slow_handler<DB: Fixture>() {
    let (setup, probe, worker, url, client) = running::<DB>().await;
    let status = deliver(&client, &url, SECRET, &event_body("evt_slow", "test.gated")).await;
    assert_eq!(status, 200);
    probe.wait_started(1).await;
    let event = setup.inbox.get(&EventKey::new("stripe", "evt_slow")).await;
    assert_eq!(event.unwrap().unwrap().state, EventState::Pending);
    assert_eq!(setup.effects("evt_slow").await, 0, "{}", DB::LABEL);
    probe.open_gate();
    setup.wait_for("evt_slow", EventState::Processed).await;
    assert_eq!(setup.effects("evt_slow").await, 1);
    setup.finish(worker).await;
}

/// A handler that fails twice (after writing) is retried; its failed attempts' writes were
/// rolled back, so the third leaves the only row. One that panics once is retried too.
async fn retries_until_success<DB: Fixture>() {
    let (setup, probe, worker, url, client) = running::<DB>().await;
    for (id, kind) in [("evt_flaky", "test.flaky"), ("evt_panic", "test.panic")] {
        assert_eq!(
            deliver(&client, &url, SECRET, &event_body(id, kind)).await,
            200
        );
    }
    assert_eq!(setup.wait_for("evt_flaky", EventState::Processed).await, 3);
    assert_eq!(setup.wait_for("evt_panic", EventState::Processed).await, 2);
    assert_eq!((probe.runs("evt_flaky"), probe.runs("evt_panic")), (3, 2));
    assert_eq!(setup.effects("evt_flaky").await, 1, "{}", DB::LABEL);
    assert_eq!(setup.effects("evt_panic").await, 1, "{}", DB::LABEL);
    let event = setup.inbox.get(&EventKey::new("stripe", "evt_flaky")).await;
    assert_eq!(event.unwrap().unwrap().last_error, None);
    setup.finish(worker).await;
}

/// A handler that always fails ends `Failed` after exactly `max_attempts` runs, with its last
/// error and none of its writes; the admin retry gives it `max_attempts` more.
async fn poison_fails_after_max_attempts<DB: Fixture>() {
    let (setup, probe, worker, url, client) = running::<DB>().await;
    let body = event_body("evt_poison", "test.poison");
    assert_eq!(deliver(&client, &url, SECRET, &body).await, 200);
    assert_eq!(setup.wait_for("evt_poison", EventState::Failed).await, 4);
    let failed = setup.inbox.list(EventState::Failed, 10).await.unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].event_id, "evt_poison");
    let error = failed[0].last_error.as_deref().unwrap();
    assert!(error.contains("poisoned event"), "{error}");
    assert_eq!(probe.runs("evt_poison"), 4);
    assert_eq!(setup.effects("evt_poison").await, 0);
    // A duplicate delivery of a failed event is acknowledged and changes nothing.
    assert_eq!(deliver(&client, &url, SECRET, &body).await, 200);

    let key = EventKey::new("stripe", "evt_poison");
    assert!(setup.inbox.retry(&key).await.unwrap());
    assert_eq!(setup.wait_for("evt_poison", EventState::Failed).await, 4);
    assert_eq!(probe.runs("evt_poison"), 8, "{}", DB::LABEL);
    assert!(!setup
        .inbox
        .retry(&EventKey::new("stripe", "evt_absent"))
        .await
        .unwrap());
    setup.finish(worker).await;
}

/// One worker with a queue of one and 40 deliveries at once: the queue overflows, the sweeper
/// finds the rest, and every event is processed exactly once.
async fn full_queue_loses_nothing<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let worker = quick(setup.inbox.worker(probe.handler::<DB>()))
        .concurrency(1)
        .queue_capacity(1)
        .spawn();
    let url = serve(&setup.inbox).await;
    let client = reqwest::Client::new();
    let ids: Vec<String> = (0..40).map(|n| format!("evt_full_{n}")).collect();
    let statuses = join_all(ids.iter().map(|id| {
        let body = event_body(id, "charge.succeeded");
        let (client, url) = (client.clone(), url.clone());
        async move { deliver(&client, &url, SECRET, &body).await }
    }))
    .await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    for id in &ids {
        setup.wait_for(id, EventState::Processed).await;
        assert_eq!(setup.effects(id).await, 1, "{}: {id}", DB::LABEL);
        assert_eq!(probe.runs(id), 1, "{}: {id}", DB::LABEL);
    }
    setup.finish(worker).await;
}

/// A delivery signed with another secret, or whose body was changed after signing, is refused
/// `401` and never stored.
async fn forged_never_reaches_the_inbox<DB: Fixture>() {
    let (setup, probe, worker, url, client) = running::<DB>().await;
    let body = event_body("evt_forged", "charge.succeeded");
    let status = deliver(&client, &url, "whsec_someone_else_1234", &body).await;
    assert_eq!(status, 401);
    let signature = tower_idempotency_webhooks::stripe::sign(SECRET, now_secs(), body.as_bytes());
    let tampered = body.replace("charge.succeeded", "charge.refunded");
    let response = client
        .post(&url)
        .header("stripe-signature", signature)
        .body(tampered)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let unsigned = client.post(&url).body(body.clone()).send().await.unwrap();
    assert_eq!(unsigned.status(), 400);
    let counts = setup.inbox.counts().await.unwrap();
    assert_eq!((counts.pending, counts.processed, counts.failed), (0, 0, 0));
    assert_eq!(probe.total_runs(), 0);
    setup.finish(worker).await;
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// With the inbox table gone the acknowledgement is a `503` with `Retry-After` (the provider
/// retries); once it is back, the same delivery is stored and processed.
async fn outage_is_503_and_loses_nothing<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let url = serve(&setup.inbox).await;
    let client = reqwest::Client::new();
    let table = setup.inbox.table().to_owned();
    let outage = format!("ALTER TABLE {table} RENAME TO {table}_away");
    DB::exec(&setup.pool, &outage).await;
    let body = event_body("evt_outage", "charge.succeeded");
    let signature = tower_idempotency_webhooks::stripe::sign(SECRET, now_secs(), body.as_bytes());
    let response = client
        .post(&url)
        .header("stripe-signature", &signature)
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503, "{}", DB::LABEL);
    assert!(response.headers().contains_key("retry-after"));
    let restore = format!("ALTER TABLE {table}_away RENAME TO {table}");
    DB::exec(&setup.pool, &restore).await;
    let worker = start(&setup, &probe).await;
    assert_eq!(deliver(&client, &url, SECRET, &body).await, 200);
    setup.wait_for("evt_outage", EventState::Processed).await;
    assert_eq!(setup.effects("evt_outage").await, 1);
    setup.finish(worker).await;
}

/// A drain whose deadline passes while a handler runs answers `false` and rolls it back; the
/// event stays pending and the next worker processes it once its lease ends. A drain with
/// nothing running answers `true`.
async fn drain_keeps_pending<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let lease = Duration::from_millis(300);
    let worker = quick(setup.inbox.worker(probe.handler::<DB>()))
        .lease(lease)
        .spawn();
    let url = serve(&setup.inbox).await;
    let client = reqwest::Client::new();
    let status = deliver(
        &client,
        &url,
        SECRET,
        &event_body("evt_drain", "test.gated"),
    )
    .await;
    assert_eq!(status, 200);
    probe.wait_started(1).await;
    assert!(!worker.drain(Duration::from_millis(50)).await);
    let event = setup.inbox.get(&EventKey::new("stripe", "evt_drain")).await;
    assert_eq!(event.unwrap().unwrap().state, EventState::Pending);
    assert_eq!(setup.effects("evt_drain").await, 0);

    probe.open_gate();
    let worker = quick(setup.inbox.worker(probe.handler::<DB>())).spawn();
    assert_eq!(setup.wait_for("evt_drain", EventState::Processed).await, 2);
    assert_eq!(setup.effects("evt_drain").await, 1);
    setup.finish(worker).await;
}

/// The admin router over HTTP: lists failed, pending and processed events (another name is
/// `404`), re-queues a failed one (`202`, then `404` once it is not failed), counts, and purges
/// processed events (the age as a query, or as a JSON body; a purge without the admin header or
/// a JSON body is `403`, without an age `400`).
async fn admin_router<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let url = serve(&setup.inbox).await;
    let admin_url = serve_router(admin::router(setup.inbox.clone())).await;
    let client = reqwest::Client::new();
    let worker = start(&setup, &probe).await;
    let body = event_body("evt_admin", "test.poison");
    assert_eq!(deliver(&client, &url, SECRET, &body).await, 200);
    let ok = event_body("evt_admin_ok", "charge.succeeded");
    assert_eq!(deliver(&client, &url, SECRET, &ok).await, 200);
    setup.wait_for("evt_admin", EventState::Failed).await;
    setup.wait_for("evt_admin_ok", EventState::Processed).await;
    assert!(worker.drain(Duration::from_secs(30)).await);

    let get = |path: &str| client.get(format!("{admin_url}{path}")).send();
    let failed: serde_json::Value = json(get("/failed").await.unwrap()).await;
    assert_eq!(failed.as_array().unwrap().len(), 1, "{failed}");
    assert_eq!(failed[0]["event_id"], "evt_admin");
    assert_eq!(failed[0]["state"], "failed");
    assert_eq!(failed[0]["attempts"], 4);
    // Each attempt is on record: three retried, the last failed, each with the handler's error;
    // the processed event's one attempt is done.
    let detail: serde_json::Value = json(get("/events/stripe/evt_admin").await.unwrap()).await;
    let outcomes: Vec<&str> = detail["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|attempt| attempt["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        ["retried", "retried", "retried", "failed"],
        "{detail}"
    );
    for (n, attempt) in detail["history"].as_array().unwrap().iter().enumerate() {
        assert_eq!(attempt["attempt"], n + 1);
        assert!(
            attempt["error"]
                .as_str()
                .unwrap()
                .contains("poisoned event"),
            "{attempt}"
        );
        assert!(attempt["started_at_ms"].as_i64().unwrap() > 0);
    }
    let ok_detail: serde_json::Value =
        json(get("/events/stripe/evt_admin_ok").await.unwrap()).await;
    assert_eq!(ok_detail["history"][0]["outcome"], "done", "{ok_detail}");
    assert_eq!(ok_detail["history"].as_array().unwrap().len(), 1);
    let retry = format!("{admin_url}/failed/stripe/evt_admin/retry");
    let post = |url: &str| client.post(url).header("x-inbox-admin", "1").send();
    assert_eq!(post(&retry).await.unwrap().status(), 202);
    assert_eq!(post(&retry).await.unwrap().status(), 404);
    let pending: serde_json::Value = json(get("/pending").await.unwrap()).await;
    assert_eq!(pending[0]["event_id"], "evt_admin", "{pending}");
    assert_eq!(pending[0]["attempts"], 0);
    let counts: serde_json::Value = json(get("/counts").await.unwrap()).await;
    assert_eq!(
        counts,
        serde_json::json!({"pending": 1, "processed": 1, "failed": 0, "skipped": 0})
    );
    let processed: serde_json::Value = json(get("/processed").await.unwrap()).await;
    assert_eq!(processed[0]["event_id"], "evt_admin_ok", "{processed}");
    assert_eq!(get("/finished").await.unwrap().status(), 404);
    let purge = format!("{admin_url}/purge?older_than_secs=3600");
    let kept: serde_json::Value = json(post(&purge).await.unwrap()).await;
    assert_eq!(kept["purged"], 0);
    let bare = format!("{admin_url}/purge");
    let forged = client.post(&bare).send().await.unwrap();
    assert_eq!(forged.status(), 403);
    assert_eq!(post(&bare).await.unwrap().status(), 400, "no age");
    let in_body = client
        .post(&bare)
        .header("content-type", "application/json")
        .body(serde_json::json!({ "older_than_secs": 3600 }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(json(in_body).await["purged"], 0);
    // Processed at least a millisecond ago by now: the drain above waited for it.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let purge = format!("{admin_url}/purge?older_than_secs=0");
    let purged: serde_json::Value = json(post(&purge).await.unwrap()).await;
    assert_eq!(purged["purged"], 1);
    assert_eq!(
        setup
            .inbox
            .get(&EventKey::new("stripe", "evt_admin_ok"))
            .await
            .unwrap(),
        None
    );
    setup.cleanup().await;
}

/// Without a worker, an acknowledgement (first delivery or duplicate) sends at most one
/// statement: the insert that is also the dedupe, shared by the deliveries committed together.
/// One after another, each sends exactly one. Refused deliveries send none.
async fn at_most_one_statement_per_delivery<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let url = serve(&setup.inbox).await;
    let client = reqwest::Client::new();
    let before = setup.inbox.statements_executed();
    let body = event_body("evt_once", "charge.succeeded");
    let statuses = join_all((0..25).map(|_| deliver(&client, &url, SECRET, &body))).await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    let burst = setup.inbox.statements_executed() - before;
    // Copies that share a batch cost nothing beyond its statement.
    assert!(
        (1..=25).contains(&burst),
        "{}: {burst} statements for 25 deliveries",
        DB::LABEL
    );
    let before = setup.inbox.statements_executed();
    for n in 0..5 {
        let body = event_body(&format!("evt_other_{n}"), "charge.succeeded");
        assert_eq!(deliver(&client, &url, SECRET, &body).await, 200);
    }
    let forged = deliver(&client, &url, "whsec_not_ours_1234", &body).await;
    assert_eq!(forged, 401);
    let sent = setup.inbox.statements_executed() - before;
    assert_eq!(
        sent,
        5,
        "{}: statements for 5 deliveries one after another",
        DB::LABEL
    );
    assert_eq!(setup.inbox.counts().await.unwrap().pending, 6);
    setup.cleanup().await;
}

on_both!(
    and_mysql:
    concurrent_duplicates,
    ack_before_slow_handler,
    retries_until_success,
    poison_fails_after_max_attempts,
    full_queue_loses_nothing,
    forged_never_reaches_the_inbox,
    outage_is_503_and_loses_nothing,
    drain_keeps_pending,
    admin_router,
    at_most_one_statement_per_delivery,
);

/// Two instances (their own pools, servers and workers) on one Postgres table; every delivery
/// is sent to both at once. Each event is stored once and processed once, and both instances
/// process some.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_one_postgres_inbox() {
    two_instances_share_one_inbox::<sqlx::Postgres>().await;
}

/// The same on one MySQL or MariaDB table (claims skip the rows the other instance locks).
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_one_mysql_inbox() {
    if tower_idempotency_testkit::mysql_or_skip("two inbox instances on MySQL") {
        two_instances_share_one_inbox::<sqlx::MySql>().await;
    }
}

/// Two instances on one shared database's table (`DB::open` gives the second its own pool).
async fn two_instances_share_one_inbox<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let (second_pool, _, _) = DB::open().await;
    let second =
        tower_idempotency_inbox::Inbox::new(second_pool.clone(), &setup.inbox_table).unwrap();
    let (probe_a, probe_b) = (setup.probe(), setup.probe());
    let worker_a = start(&setup, &probe_a).await;
    let worker_b = quick(second.worker(probe_b.handler::<DB>())).spawn();
    let (url_a, url_b) = (serve(&setup.inbox).await, serve(&second).await);
    let client = reqwest::Client::new();
    let ids: Vec<String> = (0..40).map(|n| format!("evt_two_{n}")).collect();
    join_all(ids.iter().map(|id| {
        let body = event_body(id, "charge.succeeded");
        let (client, url_a, url_b) = (client.clone(), url_a.clone(), url_b.clone());
        async move {
            let (a, b) = tokio::join!(
                deliver(&client, &url_a, SECRET, &body),
                deliver(&client, &url_b, SECRET, &body)
            );
            assert_eq!((a, b), (200, 200));
        }
    }))
    .await;
    for id in &ids {
        setup.wait_for(id, EventState::Processed).await;
        assert_eq!(setup.effects(id).await, 1, "{id}");
        assert_eq!(probe_a.runs(id) + probe_b.runs(id), 1, "{id}");
    }
    let (a, b) = (probe_a.total_runs(), probe_b.total_runs());
    assert!(a > 0 && b > 0, "one instance did all the work: {a} and {b}");
    assert_eq!(setup.inbox.counts().await.unwrap().processed, 40);
    assert!(worker_a.drain(Duration::from_secs(30)).await);
    assert!(worker_b.drain(Duration::from_secs(30)).await);
    second_pool.close().await;
    setup.cleanup().await;
}
