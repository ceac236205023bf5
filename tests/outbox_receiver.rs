//! The reference receiver's outbox as two child processes, on SQLite, on Postgres and (feature
//! `mysql`) on MySQL/MariaDB: an
//! upstream receiver whose `test.outbox` events each enqueue one `POST /orders` to a downstream
//! receiver (`OUTBOX_TARGET_URL`), SIGKILLed at random points while it processes the events and
//! relays their messages, restarted, until every message is delivered: the downstream's
//! client-key route ran each order exactly once, and the upstream reports each delivery.
#![cfg(unix)]

mod receiver_process;
mod support;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use receiver_process::{
    deliver_stripe, get_json, random_below, scalars, sqlite_store, stripe_event, Database, Receiver,
};
use serde_json::Value;
use support::*;

const SECRET: &str = "whsec_outbox_receiver_test";
/// The downstream's `POST /orders` takes this long, so kills land mid-delivery.
const DOWNSTREAM_DELAY_MS: u64 = 150;
const EVENTS_PER_ROUND: usize = 6;

fn upstream(store: &str, target: &str) -> Receiver {
    Receiver::stripe(
        store,
        SECRET,
        &[
            ("HANDLER_DELAY_MS", "50".to_owned()),
            ("INBOX_LEASE_MS", "1500".to_owned()),
            ("INBOX_SWEEP_MS", "20".to_owned()),
            ("INBOX_BACKOFF_MS", "10".to_owned()),
            ("INBOX_MAX_ATTEMPTS", "1000".to_owned()),
            ("OUTBOX_TARGET_URL", format!("{target}/orders")),
        ],
    )
}

fn downstream() -> Receiver {
    Receiver::start(&[
        ("IDEMPOTENCY_STORE", "memory".to_owned()),
        ("HANDLER_DELAY_MS", DOWNSTREAM_DELAY_MS.to_string()),
    ])
}

/// Whether `event_id`'s message was claimed by a delivery that did not finish: pending with an
/// attempt counted (the claim commits before the request is sent, its outcome after the answer).
async fn interrupted(store: &str, event_id: &str) -> bool {
    let sql = "SELECT count(*) FROM outbox WHERE scope = $1 AND state = 0 AND attempts > 0";
    scalars(store, sql, event_id).await[0] == 1
}

/// Waits until one of the messages whose scope starts with `prefix` is claimed by a delivery
/// that has not finished (polled every 5 ms, at most 20 s).
async fn delivery_in_flight(store: &str, prefix: &str) {
    // The pattern is bound whole: `||` is not concatenation on MySQL.
    let sql = "SELECT count(*) FROM outbox WHERE scope LIKE $1 AND state = 0 AND attempts > 0";
    let pattern = format!("{prefix}%");
    let deadline = Instant::now() + Duration::from_secs(20);
    while scalars(store, sql, &pattern).await[0] == 0 {
        assert!(Instant::now() < deadline, "{prefix}: no delivery started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// At least `rounds` times, and until kills have cut at least two deliveries short (at most 20
/// rounds): six `test.outbox` events acknowledged by an upstream receiver, which is SIGKILLed
/// at a random point of the next 600 ms (while handlers run, messages wait or deliveries are in
/// flight) on even rounds, and as soon as a delivery is in flight on odd rounds; deliveries cut
/// short are counted. A last upstream then finishes everything; the downstream ran each order
/// once.
async fn killed_while_relaying(store: &str, label: &str, rounds: usize) {
    let client = reqwest::Client::new();
    let target = downstream();
    let mut ids = Vec::new();
    let mut cut_short = 0;
    let mut round = 0;
    while round < rounds || (cut_short < 2 && round < 20) {
        let prefix = format!("evt_{}_{round}_", random_suffix());
        let round_ids: Vec<String> = (0..EVENTS_PER_ROUND)
            .map(|n| format!("{prefix}{n}"))
            .collect();
        let mut receiver = upstream(store, &target.base);
        let statuses = join_all(round_ids.iter().map(|id| {
            let (client, base, body) = (
                client.clone(),
                receiver.base.clone(),
                stripe_event(id, "test.outbox"),
            );
            async move { deliver_stripe(&client, &base, SECRET, &body).await }
        }))
        .await;
        assert!(statuses.iter().all(|&s| s == 200), "{label}: {statuses:?}");
        if round % 2 == 0 {
            // The point of the crash is the point of this test: a random moment after the acks.
            tokio::time::sleep(Duration::from_millis(random_below(600))).await;
        } else {
            delivery_in_flight(store, &prefix).await;
        }
        receiver.kill();
        for id in &round_ids {
            if interrupted(store, id).await {
                cut_short += 1;
            }
        }
        ids.extend(round_ids);
        round += 1;
    }

    let last = upstream(store, &target.base);
    let deadline = Instant::now() + Duration::from_secs(30);
    let upstream_effects = loop {
        let effects = get_json(&client, format!("{}/effects", &last.base)).await;
        if ids.iter().all(|id| effects[format!("outbox:{id}")] == 1) {
            break effects;
        }
        assert!(
            Instant::now() < deadline,
            "{label}: not every message was delivered: {effects}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    for id in &ids {
        assert_eq!(upstream_effects[format!("inbox:{id}")], 1, "{label}: {id}");
    }
    let orders = get_json(&client, format!("{}/effects", &target.base)).await;
    let ran: Vec<(&String, &Value)> = orders
        .as_object()
        .unwrap()
        .iter()
        .filter(|(name, _)| name.starts_with("orders:"))
        .collect();
    assert_eq!(ran.len(), ids.len(), "{label}: {orders}");
    for id in &ids {
        assert_eq!(
            orders[format!("orders:{id}/0")],
            1,
            "{label}: {id}: {orders}"
        );
    }
    assert!(
        cut_short > 0,
        "{label}: no kill cut a delivery short; the test proved nothing"
    );
    eprintln!(
        "{label}: {round} kills cut short the deliveries of {cut_short} of {} messages",
        ids.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_survives_sigkill_exactly_once_downstream_sqlite() {
    let (_dir, store) = sqlite_store("outbox-crash");
    killed_while_relaying(&store, "sqlite", 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_survives_sigkill_exactly_once_downstream_postgres() {
    let database = Database::create(format!("tidem_outbox_{}", random_suffix())).await;
    killed_while_relaying(&database.url(), "postgres", 5).await;
}

/// On MySQL/MariaDB, in a database of the test's own (the receiver's tables have fixed names).
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_survives_sigkill_exactly_once_downstream_mysql() {
    if !tower_idempotency_testkit::mysql_or_skip("outbox crash test (mysql)") {
        return;
    }
    let name = format!("tidem_outbox_{}", random_suffix());
    let database = receiver_process::MySqlDatabase::create(name).await;
    killed_while_relaying(&database.url(), "mysql", 5).await;
}
