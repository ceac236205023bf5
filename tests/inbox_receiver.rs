//! The reference receiver's webhook inbox (`POST /inbox/stripe`) as a child process, on SQLite,
//! on Postgres and (feature `mysql`) on MySQL/MariaDB: SIGKILLed while its handlers run, then restarted, every acknowledged event
//! ends with exactly one row in `inbox_effects`; flaky events are retried, poisoned ones listed
//! as failed and re-queued through its routes, forged ones never stored.
#![cfg(unix)]

mod receiver_process;
mod support;

use std::time::Duration;

use futures_util::future::join_all;
use receiver_process::{
    deliver_stripe, get_json, on_sqlite_and_postgres, random_below, scalars, sqlite_store,
    stripe_event, Database, Receiver,
};
use serde_json::Value;
use support::*;

const SECRET: &str = "whsec_inbox_receiver_test";
const HANDLER_DELAY_MS: u64 = 300;
/// Longer than the handler's delay, so a live attempt never loses its claim.
const LEASE_MS: u64 = 1500;
const EVENTS_PER_ROUND: usize = 6;

fn start(store: &str, handler_delay_ms: u64, max_attempts: u32) -> Receiver {
    Receiver::stripe(
        store,
        SECRET,
        &[
            ("HANDLER_DELAY_MS", handler_delay_ms.to_string()),
            ("INBOX_LEASE_MS", LEASE_MS.to_string()),
            ("INBOX_SWEEP_MS", "20".to_owned()),
            ("INBOX_BACKOFF_MS", "10".to_owned()),
            ("INBOX_MAX_ATTEMPTS", max_attempts.to_string()),
        ],
    )
}

/// Polls `GET /effects` until `done` holds for it, failing after 20 s.
async fn effects_until(
    client: &reqwest::Client,
    base: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let effects = || get_json(client, format!("{base}/effects"));
    poll_until("the effects", Duration::from_millis(25), effects, done).await
}

/// Polls `GET /inbox/failed` until it lists `event_id` (`what` names it), failing after 20 s.
async fn listed_failed(client: &reqwest::Client, base: &str, what: &str, event_id: &str) {
    let failed = || get_json(client, format!("{base}/inbox/failed"));
    let lists = |failed: &Value| failed.as_array().unwrap().iter().any(|id| id == event_id);
    poll_until(what, Duration::from_millis(25), failed, lists).await;
}

/// The rows of `inbox_effects` for `event_id`, read from the database.
async fn rows(store: &str, event_id: &str) -> i64 {
    count(
        store,
        "SELECT count(*) FROM inbox_effects WHERE event_id = $1",
        event_id,
    )
    .await
}

/// Whether `event_id` was claimed by an attempt that did not finish: pending with an attempt
/// counted (the claim commits before the handler runs, the attempt's end with its writes).
async fn interrupted(store: &str, event_id: &str) -> bool {
    let sql =
        "SELECT count(*) FROM webhook_inbox WHERE event_id = $1 AND state = 0 AND attempts > 0";
    count(store, sql, event_id).await == 1
}

async fn count(store: &str, sql: &str, event_id: &str) -> i64 {
    scalars(store, sql, event_id).await[0]
}

/// `rounds` times (and more, up to four times as many, until a kill has interrupted a handler):
/// six events acknowledged by a receiver whose handlers take 300 ms, SIGKILLed at a random point
/// of the next 450 ms; the events whose handler was running (claimed, not processed) are
/// counted. A new process then finishes every event once their leases end, and each has exactly
/// one row.
async fn killed_mid_handler(store: &str, label: &str, rounds: usize) {
    let client = reqwest::Client::new();
    let mut interrupted_handlers = 0;
    let mut round = 0;
    while round < rounds || (interrupted_handlers == 0 && round < rounds * 4) {
        round += 1;
        let ids: Vec<String> = (0..EVENTS_PER_ROUND)
            .map(|n| format!("evt_{}_{round}_{n}", random_suffix()))
            .collect();
        let mut first = start(store, HANDLER_DELAY_MS, 10);
        let statuses = join_all(ids.iter().map(|id| {
            let body = stripe_event(id, "charge.succeeded");
            let (client, base) = (client.clone(), first.base.clone());
            async move { deliver_stripe(&client, &base, SECRET, &body).await }
        }))
        .await;
        assert!(statuses.iter().all(|&s| s == 200), "{label}: {statuses:?}");
        // The point of the crash is the point of this test: a random moment after the acks.
        tokio::time::sleep(Duration::from_millis(random_below(
            HANDLER_DELAY_MS * 3 / 2,
        )))
        .await;
        first.kill();
        for id in &ids {
            if interrupted(store, id).await {
                assert_eq!(rows(store, id).await, 0, "{label}: {id}");
                interrupted_handlers += 1;
            }
        }

        let second = start(store, 0, 10);
        let effects = effects_until(&client, &second.base, |effects| {
            ids.iter().all(|id| effects[format!("inbox:{id}")] == 1)
        })
        .await;
        for id in &ids {
            assert_eq!(rows(store, id).await, 1, "{label}: {id}: {effects}");
        }
    }
    assert!(
        interrupted_handlers > 0,
        "{label}: no kill interrupted a handler; the test proved nothing"
    );
    eprintln!(
        "{label}: {round} kills interrupted the handlers of {interrupted_handlers} of {} events",
        round * EVENTS_PER_ROUND
    );
}

/// Flaky events succeed on their third attempt; poisoned ones end in `GET /inbox/failed` with no
/// row and are re-queued by `POST /inbox/failed/<id>/retry`; forged ones are refused.
async fn routes(store: &str, label: &str) {
    let client = reqwest::Client::new();
    let receiver = start(store, 0, 3);
    let base = receiver.base.clone();
    let (flaky, poison) = (
        format!("evt_flaky_{}", random_suffix()),
        format!("evt_poison_{}", random_suffix()),
    );
    assert_eq!(
        deliver_stripe(&client, &base, SECRET, &stripe_event(&flaky, "test.flaky")).await,
        200
    );
    assert_eq!(
        deliver_stripe(
            &client,
            &base,
            SECRET,
            &stripe_event(&poison, "test.poison")
        )
        .await,
        200
    );
    let permanent = format!("evt_permanent_{}", random_suffix());
    assert_eq!(
        deliver_stripe(
            &client,
            &base,
            SECRET,
            &stripe_event(&permanent, "test.permanent")
        )
        .await,
        200
    );
    let forged = stripe_event("evt_forged", "charge.succeeded");
    assert_eq!(
        deliver_stripe(&client, &base, "whsec_not_the_secret", &forged).await,
        401
    );

    effects_until(&client, &base, |effects| {
        effects[format!("inbox:{flaky}")] == 1
    })
    .await;
    listed_failed(&client, &base, &format!("{label}: {poison}"), &poison).await;
    assert_eq!(
        rows(store, &poison).await,
        0,
        "{label}: a failed attempt's row was kept"
    );
    // Failed on its first attempt of three, with its message, no row.
    let permanently = "SELECT count(*) FROM webhook_inbox WHERE event_id = $1 AND state = 2 \
                       AND attempts = 1 AND last_error = 'test.permanent fails permanently'";
    until_scalar(store, permanently, &permanent, 1).await;
    assert_eq!(rows(store, &permanent).await, 0, "{label}");
    // `GET /inbox/events` lists by state and type, newest first, with RFC 3339 times.
    let failed = get_json(&client, format!("{base}/inbox/events?state=failed")).await;
    let listed: Vec<&str> = failed["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| event["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        [permanent.as_str(), poison.as_str()],
        "{label}: {failed}"
    );
    assert!(failed["events"][0]["received_at"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    let by_type = format!("{base}/inbox/events?state=failed&type=test.permanent&limit=1");
    let by_type = get_json(&client, by_type).await;
    assert_eq!(
        by_type["events"][0]["event_id"],
        permanent.as_str(),
        "{label}"
    );
    assert_eq!(
        by_type["events"][0]["last_error"],
        "test.permanent fails permanently"
    );
    assert_eq!(by_type["next_cursor"], Value::Null);
    let processed = get_json(&client, format!("{base}/inbox/events?state=processed")).await;
    assert_eq!(
        processed["events"][0]["event_id"],
        flaky.as_str(),
        "{label}"
    );
    let retry = |id: &str| {
        client
            .post(format!("{base}/inbox/failed/{id}/retry"))
            .send()
    };
    assert_eq!(retry(&poison).await.unwrap().status(), 202);
    assert_eq!(retry("evt_never_delivered").await.unwrap().status(), 404);
    let effects = get_json(&client, format!("{base}/effects")).await;
    assert!(
        effects.get("inbox:evt_forged").is_none(),
        "{label}: {effects}"
    );
    assert_eq!(rows(store, "evt_forged").await, 0);
}

/// Waits until `sql` (one `$1` parameter, `event_id`) answers `want`, failing after 20 s.
async fn until_scalar(store: &str, sql: &str, event_id: &str, want: i64) {
    let what = format!("{event_id}: {sql} answering {want}");
    let got = || count(store, sql, event_id);
    poll_until(&what, Duration::from_millis(20), got, |got| *got == want).await;
}

/// With `INBOX_MAX_ATTEMPTS=2`, a receiver whose handler takes a minute is SIGKILLed mid-handler
/// at each of its attempts: after the second kill the next receiver fails the event (its
/// attempts are spent, no third attempt starts) with a last error that says so and no row;
/// an operator's retry then processes it once.
async fn attempts_spent_by_kills(store: &str, label: &str) {
    let client = reqwest::Client::new();
    let spawn = |delay_ms: u64| {
        Receiver::stripe(
            store,
            SECRET,
            &[
                ("HANDLER_DELAY_MS", delay_ms.to_string()),
                ("INBOX_LEASE_MS", "400".to_owned()),
                ("INBOX_SWEEP_MS", "20".to_owned()),
                ("INBOX_BACKOFF_MS", "10".to_owned()),
                ("INBOX_MAX_ATTEMPTS", "2".to_owned()),
            ],
        )
    };
    let id = format!("evt_killed_{}", random_suffix());
    let attempts = "SELECT CAST(attempts AS bigint) FROM webhook_inbox WHERE event_id = $1";
    let mut first = spawn(60_000);
    let status = deliver_stripe(
        &client,
        &first.base,
        SECRET,
        &stripe_event(&id, "charge.succeeded"),
    )
    .await;
    assert_eq!(status, 200, "{label}");
    until_scalar(store, attempts, &id, 1).await;
    first.kill();
    let mut second = spawn(60_000);
    until_scalar(store, attempts, &id, 2).await;
    second.kill();

    let mut third = spawn(60_000);
    listed_failed(&client, &third.base, &format!("{label}: {id}"), &id).await;
    third.kill();
    let spent = "SELECT count(*) FROM webhook_inbox WHERE event_id = $1 AND state = 2 \
                 AND attempts = 2 AND last_error LIKE 'no attempts remain%'";
    assert_eq!(count(store, spent, &id).await, 1, "{label}: {id}");
    assert_eq!(rows(store, &id).await, 0, "{label}: {id}");

    let fourth = spawn(0);
    let retry = format!("{}/inbox/failed/{id}/retry", fourth.base);
    assert_eq!(client.post(&retry).send().await.unwrap().status(), 202);
    effects_until(&client, &fourth.base, |effects| {
        effects[format!("inbox:{id}")] == 1
    })
    .await;
    assert_eq!(rows(store, &id).await, 1, "{label}: {id}");
}

/// `INBOX_RETENTION_SECS`: a receiver started with a retention of zero purges, at its start,
/// the event an earlier one processed; the same delivery is then stored and processed again,
/// which is what a retention shorter than the provider's retry schedule costs.
async fn retention_purges_processed_events(store: &str, label: &str) {
    let client = reqwest::Client::new();
    let spawn = |retention: Option<&str>| {
        let mut env = vec![
            ("IDEMPOTENCY_STORE", store.to_owned()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
            ("INBOX_SWEEP_MS", "20".to_owned()),
        ];
        env.extend(retention.map(|secs| ("INBOX_RETENTION_SECS", secs.to_owned())));
        Receiver::start(&env)
    };
    let id = format!("evt_retained_{}", random_suffix());
    let event = stripe_event(&id, "charge.succeeded");
    let processed = "SELECT count(*) FROM webhook_inbox WHERE event_id = $1 AND state = 1";
    let mut first = spawn(None);
    assert_eq!(
        deliver_stripe(&client, &first.base, SECRET, &event).await,
        200
    );
    until_scalar(store, processed, &id, 1).await;
    // Under the default retention (a week) a redelivery is a duplicate.
    assert_eq!(
        deliver_stripe(&client, &first.base, SECRET, &event).await,
        200
    );
    first.kill();
    assert_eq!(rows(store, &id).await, 1, "{label}: {id}");

    let second = spawn(Some("0"));
    let stored = "SELECT count(*) FROM webhook_inbox WHERE event_id = $1";
    until_scalar(store, stored, &id, 0).await;
    assert_eq!(
        deliver_stripe(&client, &second.base, SECRET, &event).await,
        200
    );
    effects_until(&client, &second.base, |effects| {
        effects[format!("inbox:{id}")] == 2
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_survives_sigkill_exactly_once_sqlite() {
    let (_dir, store) = sqlite_store("inbox-crash");
    killed_mid_handler(&store, "sqlite", 4).await;
    routes(&store, "sqlite").await;
}

on_sqlite_and_postgres!(attempts_spent_by_kills:
    inbox_kills_spend_the_attempts_sqlite("inbox-spent"),
    inbox_kills_spend_the_attempts_postgres("tidem_spent"));

on_sqlite_and_postgres!(retention_purges_processed_events:
    inbox_retention_purges_sqlite("inbox-retention"),
    inbox_retention_purges_postgres("tidem_retention"));

/// On MySQL/MariaDB, in a database of the test's own (the receiver's tables have fixed names):
/// the same kills and routes.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_survives_sigkill_exactly_once_mysql() {
    if !tower_idempotency_testkit::mysql_or_skip("inbox crash test (mysql)") {
        return;
    }
    let name = format!("tidem_inbox_{}", random_suffix());
    let database = receiver_process::MySqlDatabase::create(name).await;
    killed_mid_handler(&database.url(), "mysql", 4).await;
    routes(&database.url(), "mysql").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_survives_sigkill_exactly_once_postgres() {
    require_postgres!("inbox crash test (postgres)");
    let database = Database::create(format!("tidem_inbox_{}", random_suffix())).await;
    killed_mid_handler(&database.url(), "postgres", 4).await;
    routes(&database.url(), "postgres").await;
}
