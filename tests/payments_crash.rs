//! The transactional mode against crashes: the reference receiver (`examples/receiver/`) runs
//! as a child process with `POST /payments` (one row per payment, written in the same
//! transaction as the key's completion) and is SIGKILLed at random points of its handlers, many
//! times, on SQLite, on Postgres and (feature `mysql`) on MariaDB/MySQL. After each restart the retries of every key end with exactly
//! one row in `payments`, and the replay names that row.
#![cfg(unix)]

mod receiver_process;
mod support;

use std::time::{Duration, Instant};

use receiver_process::{get_json, random_below, scalars, send_each, Database, Receiver, TestDir};
use serde_json::Value;
use support::*;

/// The receiver clamps its store timeout to a third of the lease: a second per store call, so a
/// replay is not turned into a `503` on a loaded machine.
const LEASE_MS: u64 = 3000;
const HANDLER_DELAY_MS: u64 = 300;

/// The receiver on `store` with the payments route's settings.
fn start_receiver(store: &str, handler_delay_ms: u64) -> Receiver {
    Receiver::start(&[
        ("IDEMPOTENCY_STORE", store.to_owned()),
        ("HANDLER_DELAY_MS", handler_delay_ms.to_string()),
        ("IDEMPOTENCY_LEASE_MS", LEASE_MS.to_string()),
    ])
}

struct Paid {
    status: u16,
    replayed: bool,
    body: Value,
}

async fn pay(client: &reqwest::Client, base: &str, key: &str) -> Result<Paid, reqwest::Error> {
    let response = client
        .post(format!("{base}/payments"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"amount": 4200}"#)
        .send()
        .await?;
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = serde_json::from_slice(&response.bytes().await?).unwrap_or(Value::Null);
    Ok(Paid {
        status,
        replayed,
        body,
    })
}

/// The rows of `payments` for `key` (their ids), read from the database.
async fn rows(store: &str, key: &str) -> Vec<i64> {
    scalars(
        store,
        "SELECT id FROM payments WHERE idempotency_key = $1",
        key,
    )
    .await
}

/// `rounds` times: 4 payments sent at once to a receiver whose handlers hold their transaction
/// for 300 ms after writing, SIGKILLed at a random point of the first 450 ms (on odd rounds, as
/// soon as one payment is answered `201`); then, in a new process, every key is retried until it
/// succeeds. Each key ends with exactly one row, its replay names that row, `GET /effects` (read
/// from the database) counts one, and a payment answered `201` before the kill is the one the
/// new process replays (same body, same payment id): a payment answered, lost and created again
/// fails.
async fn killed_at_random_points(store: &str, label: &str, rounds: usize) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let (mut cut, mut compared) = (0, 0);
    for round in 0..rounds {
        let keys: Vec<String> = (0..4)
            .map(|n| format!("pay-{}-{round}-{n}", random_suffix()))
            .collect();
        let mut first = start_receiver(store, HANDLER_DELAY_MS);
        let (answered, mut first_answer) = tokio::sync::mpsc::unbounded_channel::<()>();
        let sent = send_each(&client, &first.base, &keys, |client, base, key| {
            let answered = answered.clone();
            async move {
                let paid = pay(&client, &base, &key).await;
                if matches!(&paid, Ok(paid) if paid.status == 201) {
                    let _ = answered.send(());
                }
                paid
            }
        });
        drop(answered);
        if round % 2 == 1 {
            // Ends early when every payment was answered without a 201.
            let _ = tokio::time::timeout(Duration::from_secs(10), first_answer.recv()).await;
        } else {
            // The point of the crash is the point of this test: a random moment after the sends.
            tokio::time::sleep(Duration::from_millis(random_below(
                HANDLER_DELAY_MS * 3 / 2,
            )))
            .await;
        }
        first.kill();
        // The body of each payment answered 201 before the kill.
        let mut created = std::collections::HashMap::new();
        for (key, task) in keys.iter().zip(sent) {
            match task.await.unwrap() {
                // 503: on SQLite a claim waits for the write lock that other payments'
                // transactions hold, and gives up after the store timeout (a third of the lease).
                Ok(paid) => {
                    assert!(
                        matches!(paid.status, 201 | 409 | 503),
                        "{label}: {}",
                        paid.status
                    );
                    if paid.status == 201 {
                        created.insert(key.clone(), paid.body);
                    }
                }
                Err(_) => cut += 1,
            }
        }

        let second = start_receiver(store, 0);
        let deadline = Instant::now() + Duration::from_millis(LEASE_MS) + Duration::from_secs(30);
        for key in &keys {
            let paid = loop {
                let paid = pay(&client, &second.base, key).await.expect("retry");
                if paid.status == 201 {
                    break paid;
                }
                // Until the dead holder's lease expires (409), or while SQLite's write lock is
                // busy (503).
                assert!(
                    matches!(paid.status, 409 | 503),
                    "{label}: {key}: {} {}",
                    paid.status,
                    paid.body
                );
                assert!(Instant::now() < deadline, "{label}: {key} is stuck");
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            if let Some(before) = created.get(key) {
                assert_eq!(
                    (&paid.body, paid.replayed),
                    (before, true),
                    "{label}: {key}: the payment answered 201 before the kill is the one kept"
                );
                compared += 1;
            }
            let replay = pay(&client, &second.base, key).await.expect("replay");
            assert!(replay.replayed, "{label}: {key}");
            assert_eq!(replay.body, paid.body, "{label}: {key}");
            let ids = rows(store, key).await;
            assert_eq!(ids.len(), 1, "{label}: {key}: exactly one row, got {ids:?}");
            assert_eq!(
                replay.body["payment_id"],
                format!("pay_{}", ids[0]),
                "{label}: {key}: the replay names the row"
            );
        }
        let effects = get_json(&client, format!("{}/effects", second.base)).await;
        for key in &keys {
            assert_eq!(effects[format!("payments:{key}")], 1, "{label}: {effects}");
        }
    }
    assert!(
        cut > 0,
        "{label}: no kill cut a request; the test proved nothing"
    );
    assert!(
        compared > 0,
        "{label}: no payment was answered before a kill; nothing was compared"
    );
    eprintln!(
        "{label}: {rounds} kills cut {cut} of {} payments; {compared} answered before a kill",
        rounds * 4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_survive_sigkill_exactly_once_sqlite() {
    let dir = TestDir::new("payments");
    let store = format!("sqlite://{}/payments.db", dir.path().display());
    killed_at_random_points(&store, "sqlite", 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_survive_sigkill_exactly_once_postgres() {
    require_postgres!("payments crash test (postgres)");
    let database = Database::create(format!("tidem_payments_{}", random_suffix())).await;
    killed_at_random_points(&database.url(), "postgres", 8).await;
}

/// On MySQL/MariaDB, in a database of the test's own (the receiver's tables have fixed names).
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_survive_sigkill_exactly_once_mysql() {
    if !tower_idempotency_testkit::mysql_or_skip("payments crash test (mysql)") {
        return;
    }
    let database =
        receiver_process::MySqlDatabase::create(format!("tidem_payments_{}", random_suffix()))
            .await;
    killed_at_random_points(&database.url(), "mysql", 8).await;
}
