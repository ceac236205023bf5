//! The reference receiver's inbox worker claiming in batches, as a child process on SQLite and
//! on Postgres: SIGKILLed while a batch of claimed events runs, every event ends with exactly
//! one effect row after the lease; `INBOX_CONCURRENCY=1` still processes every event, and a bad
//! `INBOX_CONCURRENCY` or `INBOX_POOL_SIZE` stops the start with a message naming the variable.
#![cfg(unix)]

mod receiver_process;
mod support;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use receiver_process::{
    deliver_stripe, on_sqlite_and_postgres, receiver_binary, scalars, sqlite_store, stripe_event,
    Receiver,
};
use support::*;

const SECRET: &str = "whsec_inbox_batch_receiver_test";
const LEASE_MS: u64 = 1500;

fn start(store: &str, handler_delay_ms: u64, extra: &[(&str, &str)]) -> Receiver {
    let mut env = vec![
        ("IDEMPOTENCY_STORE", store.to_owned()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        ("HANDLER_DELAY_MS", handler_delay_ms.to_string()),
        ("INBOX_LEASE_MS", LEASE_MS.to_string()),
        ("INBOX_SWEEP_MS", "20".to_owned()),
        ("INBOX_BACKOFF_MS", "10".to_owned()),
    ];
    env.extend(
        extra
            .iter()
            .map(|(name, value)| (*name, (*value).to_owned())),
    );
    Receiver::start(&env)
}

/// Delivers a new event for each of `ids`; every one must be acknowledged `200`.
async fn deliver_all(client: &reqwest::Client, base: &str, ids: &[String], label: &str) {
    let statuses = join_all(ids.iter().map(|id| {
        let body = stripe_event(id, "charge.succeeded");
        async move { deliver_stripe(client, base, SECRET, &body).await }
    }))
    .await;
    assert!(statuses.iter().all(|&s| s == 200), "{label}: {statuses:?}");
}

async fn count(store: &str, sql: &str, param: &str) -> i64 {
    scalars(store, sql, param).await[0]
}

/// The events of `prefix` claimed by an attempt that has not finished.
async fn claimed(store: &str, prefix: &str) -> i64 {
    let sql = "SELECT count(*) FROM webhook_inbox WHERE event_id LIKE $1 AND state = 0 \
               AND attempts > 0";
    count(store, sql, &format!("{prefix}%")).await
}

/// Polls until every one of `ids` has exactly `rows` effect rows and is processed, failing
/// after 30 s.
async fn until_processed(store: &str, ids: &[String], label: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for id in ids {
        loop {
            let sql = "SELECT count(*) FROM webhook_inbox WHERE event_id = $1 AND state = 1";
            if count(store, sql, id).await == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "{label}: {id} never processed");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let rows = "SELECT count(*) FROM inbox_effects WHERE event_id = $1";
        assert_eq!(count(store, rows, id).await, 1, "{label}: {id}");
    }
}

/// Twenty events acknowledged by a receiver with 16 handlers whose handlers take 2 s (on SQLite
/// they hold the write lock one at a time, and acknowledgements wait for it within the busy
/// timeout); once at least two are claimed and unfinished (a batch or more running), the
/// receiver is SIGKILLed: the events claimed and unfinished then have no effect. A new receiver
/// finishes every event once the leases end, each with exactly one effect row.
async fn killed_mid_batch(store: &str, label: &str) {
    let client = reqwest::Client::new();
    let prefix = format!("evt_batch_{}", random_suffix());
    let ids: Vec<String> = (0..20).map(|n| format!("{prefix}_{n}")).collect();
    let mut first = start(store, 2000, &[("INBOX_CONCURRENCY", "16")]);
    deliver_all(&client, &first.base, &ids, label).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let running = loop {
        let running = claimed(store, &prefix).await;
        if running >= 2 {
            break running;
        }
        assert!(Instant::now() < deadline, "{label}: {running} claimed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    first.kill();
    let mut interrupted = 0;
    for id in &ids {
        let sql = "SELECT count(*) FROM webhook_inbox WHERE event_id = $1 AND state = 0 \
                   AND attempts > 0";
        if count(store, sql, id).await == 1 {
            let rows = "SELECT count(*) FROM inbox_effects WHERE event_id = $1";
            assert_eq!(count(store, rows, id).await, 0, "{label}: {id}");
            interrupted += 1;
        }
    }
    assert!(interrupted >= 2, "{label}: {interrupted} interrupted");
    let _second = start(store, 0, &[]);
    until_processed(store, &ids, label).await;
    eprintln!("{label}: {running} claimed before the kill, {interrupted} interrupted by it");
}

/// `INBOX_CONCURRENCY=1` with a pool of two: twelve events, each processed once.
async fn one_handler_processes_every_event(store: &str, label: &str) {
    let client = reqwest::Client::new();
    let prefix = format!("evt_one_{}", random_suffix());
    let ids: Vec<String> = (0..12).map(|n| format!("{prefix}_{n}")).collect();
    let receiver = start(
        store,
        0,
        &[("INBOX_CONCURRENCY", "1"), ("INBOX_POOL_SIZE", "2")],
    );
    deliver_all(&client, &receiver.base, &ids, label).await;
    until_processed(store, &ids, label).await;
}

/// The receiver started with `name=value`: it must exit with a failure whose log names `name`.
fn refuses_to_start(store: &str, name: &str, value: &str) {
    let output = std::process::Command::new(receiver_binary())
        .env_clear()
        .env("RECEIVER_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "error")
        .env("IDEMPOTENCY_STORE", store)
        .env("STRIPE_WEBHOOK_SECRET", SECRET)
        .env(name, value)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run the receiver");
    assert!(!output.status.success(), "{name}={value} started");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("{name} is not valid")),
        "{name}={value}: {stderr}"
    );
}

on_sqlite_and_postgres!(killed_mid_batch:
    inbox_killed_mid_batch_sqlite("inbox-batch-kill"),
    inbox_killed_mid_batch_postgres("tidem_batch"));

on_sqlite_and_postgres!(one_handler_processes_every_event:
    inbox_concurrency_one_sqlite("inbox-one"),
    inbox_concurrency_one_postgres("tidem_one"));

#[test]
fn inbox_bad_concurrency_or_pool_size_stops_the_start() {
    let (_dir, store) = sqlite_store("inbox-bad-vars");
    for (name, value) in [
        ("INBOX_CONCURRENCY", "0"),
        ("INBOX_CONCURRENCY", "many"),
        ("INBOX_POOL_SIZE", "0"),
        ("INBOX_POOL_SIZE", "-3"),
    ] {
        refuses_to_start(&store, name, value);
    }
}
