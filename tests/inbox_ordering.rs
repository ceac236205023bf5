//! The reference receiver's `INBOX_ORDERING` as child processes, on SQLite and on Postgres
//! (two receivers sharing the database): Stripe events of one object sent out of order
//! (`created` 3, 1, 2), one by one and concurrently, are handled as each policy promises, read
//! from `GET /effects` (`"order:<object id>"`) and from the receiver's `inbox_order` table.
#![cfg(unix)]

mod receiver_process;
mod support;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use receiver_process::{deliver_stripe, get_json, scalars, sqlite_store, Database, Receiver};
use support::*;

const SECRET: &str = "whsec_inbox_ordering_test";

fn start(store: &str, ordering: &str) -> Receiver {
    Receiver::stripe(
        store,
        SECRET,
        &[
            ("HANDLER_DELAY_MS", "50".to_owned()),
            ("INBOX_SWEEP_MS", "20".to_owned()),
            ("INBOX_ORDERING", ordering.to_owned()),
        ],
    )
}

async fn send(base: &str, id: &str, object: &str, created: i64) {
    let body = format!(
        r#"{{"id":"{id}","object":"event","type":"payment_intent.updated","created":{created},"data":{{"object":{{"id":"{object}"}}}}}}"#
    );
    let status = deliver_stripe(&reqwest::Client::new(), base, SECRET, &body).await;
    assert_eq!(status, 200, "{id}");
}

/// The event ids `GET /effects` lists for `object`, in handling order.
async fn order(base: &str, object: &str) -> Vec<String> {
    let effects = get_json(&reqwest::Client::new(), format!("{base}/effects")).await;
    effects[format!("order:{object}")]
        .as_array()
        .map(|ids| {
            ids.iter()
                .map(|id| id.as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The inbox state of `event_id` (0 pending, 1 processed, 2 failed, 3 skipped).
async fn state(store: &str, event_id: &str) -> i64 {
    let sql = "SELECT CAST(state AS BIGINT) FROM webhook_inbox WHERE event_id = $1";
    scalars(store, sql, event_id)
        .await
        .first()
        .copied()
        .unwrap_or(-1)
}

/// Polls until every one of `ids` has finished (processed or skipped), failing after 20 s.
async fn until_finished(store: &str, ids: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for id in ids {
        while !matches!(state(store, id).await, 1 | 3) {
            assert!(Instant::now() < deadline, "{id} never finished");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The handler's runs of `object` as (start, end) in Unix ms, by start.
async fn runs(store: &str, object: &str) -> Vec<(i64, i64)> {
    let sql = "SELECT started_ms FROM inbox_order WHERE object_id = $1 ORDER BY started_ms";
    let starts = scalars(store, sql, object).await;
    let sql = "SELECT ended_ms FROM inbox_order WHERE object_id = $1 ORDER BY started_ms";
    let ends = scalars(store, sql, object).await;
    starts.into_iter().zip(ends).collect()
}

fn ids(object: &str, created: &[i64]) -> Vec<String> {
    created
        .iter()
        .map(|c| format!("evt_{object}_{c}"))
        .collect()
}

/// Sends `created` of `object` at once, alternating between `bases`.
async fn send_together(bases: &[&str], object: &str, created: &[i64]) {
    join_all(created.iter().enumerate().map(|(i, c)| {
        let base = bases[i % bases.len()].to_owned();
        let id = format!("evt_{object}_{c}");
        async move { send(&base, &id, object, *c).await }
    }))
    .await;
}

/// Sequential: one by one (each handled before the next is sent) the events run as they come;
/// sent together to every receiver, each runs once and no two runs of the object overlap.
async fn sequential(store: &str, bases: &[&str], label: &str) {
    for c in [3, 1, 2] {
        send(bases[0], &format!("evt_a_{c}"), "a", c).await;
        until_finished(store, &ids("a", &[c])).await;
    }
    assert_eq!(order(bases[0], "a").await, ids("a", &[3, 1, 2]), "{label}");

    let created = [3, 1, 2, 6, 4, 5];
    send_together(bases, "b", &created).await;
    until_finished(store, &ids("b", &created)).await;
    let mut handled = order(bases[0], "b").await;
    handled.sort();
    let mut expected = ids("b", &created);
    expected.sort();
    assert_eq!(handled, expected, "{label}: each event once");
    let runs = runs(store, "b").await;
    for pair in runs.windows(2) {
        assert!(pair[1].0 >= pair[0].1, "{label}: runs overlapped: {runs:?}");
    }
}

/// Skip-stale: one by one, 3 is handled and 1 and 2 are skipped; sent together, the handled
/// events are in increasing `created`, the newest among them, and the rest skipped.
async fn skip_stale(store: &str, bases: &[&str], label: &str) {
    for c in [3, 1, 2] {
        send(bases[0], &format!("evt_a_{c}"), "a", c).await;
        until_finished(store, &ids("a", &[c])).await;
    }
    assert_eq!(order(bases[0], "a").await, ids("a", &[3]), "{label}");
    for id in ids("a", &[1, 2]) {
        assert_eq!(state(store, &id).await, 3, "{label}: {id} is skipped");
    }

    let created = [3, 1, 2, 6, 4, 5];
    send_together(bases, "b", &created).await;
    until_finished(store, &ids("b", &created)).await;
    let handled = order(bases[0], "b").await;
    let times: Vec<i64> = handled
        .iter()
        .map(|id| id.rsplit('_').next().unwrap().parse().unwrap())
        .collect();
    assert!(times.windows(2).all(|p| p[0] < p[1]), "{label}: {times:?}");
    assert_eq!(times.last(), Some(&6), "{label}: the newest is handled");
    for id in ids("b", &created) {
        let want = if handled.contains(&id) { 1 } else { 3 };
        assert_eq!(state(store, &id).await, want, "{label}: {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_ordering_sqlite() {
    let (_dir, store) = sqlite_store("order-seq");
    let receiver = start(&store, "sequential");
    sequential(&store, &[&receiver.base], "sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_stale_ordering_sqlite() {
    let (_dir, store) = sqlite_store("order-stale");
    let receiver = start(&store, "skip-stale");
    skip_stale(&store, &[&receiver.base], "sqlite").await;
}

/// A new Postgres database named after `name` and two receivers sharing it under `ordering`.
async fn two_on_postgres(name: &str, ordering: &str) -> (Database, [Receiver; 2]) {
    let database = Database::create(format!("tidem_order_{name}_{}", random_suffix())).await;
    let store = database.url();
    let receivers = [start(&store, ordering), start(&store, ordering)];
    (database, receivers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_ordering_two_instances_postgres() {
    let (database, [first, second]) = two_on_postgres("seq", "sequential").await;
    sequential(&database.url(), &[&first.base, &second.base], "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_stale_ordering_two_instances_postgres() {
    let (database, [first, second]) = two_on_postgres("stale", "skip-stale").await;
    skip_stale(&database.url(), &[&first.base, &second.base], "postgres").await;
}
