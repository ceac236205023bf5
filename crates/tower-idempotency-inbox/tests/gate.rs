//! SQLite's writer gate, over real HTTP: every writer of one database file in this process
//! queues at the file's one gate ([`tower_idempotency_jobs::gate`]), whichever pool it writes
//! through. While a writer of another pool on the same file (as an outbox's would be) holds its
//! turn, an acknowledgement is not committed and the worker claims nothing; once the turn ends,
//! both go on, and each event is processed once.

#[macro_use]
mod common;

use std::time::Duration;

use common::*;
use tower_idempotency_inbox::EventState;
use tower_idempotency_jobs::Driver;
use tower_idempotency_sqlx::sqlx;

/// How long a writer that should wait is watched: it has no signal for "still waiting".
const WATCHED: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_through_two_pools_of_one_file_take_turns_at_its_gate() {
    let setup = Setup::<sqlx::Sqlite>::new().await;
    let probe = setup.probe();
    let url = serve(&setup.inbox).await;
    let client = reqwest::Client::new();
    let before = event_body("evt_gate_before", "charge.succeeded");
    assert_eq!(deliver(&client, &url, SECRET, &before).await, 200);

    let options = setup.pool.connect_options().as_ref().clone();
    let other = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    let gate = <sqlx::Sqlite as Driver>::write_gate(&other).expect("SQLite has a gate");
    let turn = gate.turn().await;
    assert!(turn.holds());

    let worker = quick(setup.inbox.worker(probe.handler::<sqlx::Sqlite>())).spawn();
    let during = event_body("evt_gate_during", "charge.succeeded");
    let mut acknowledged = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { deliver(&client, &url, SECRET, &during).await }
    });
    assert!(
        tokio::time::timeout(WATCHED, &mut acknowledged)
            .await
            .is_err(),
        "an acknowledgement was answered while another pool's writer held the file's gate"
    );
    let key = tower_idempotency_inbox::EventKey::new("stripe", "evt_gate_during");
    assert!(setup.inbox.get(&key).await.unwrap().is_none());
    let waiting = setup.event("evt_gate_before").await;
    assert_eq!(
        (
            waiting.state,
            waiting.attempts,
            probe.runs("evt_gate_before")
        ),
        (EventState::Pending, 0, 0),
        "the worker claimed while another pool's writer held the file's gate"
    );

    drop(turn);
    assert_eq!(acknowledged.await.unwrap(), 200);
    for id in ["evt_gate_before", "evt_gate_during"] {
        assert_eq!(setup.wait_for(id, EventState::Processed).await, 1);
        assert_eq!(probe.runs(id), 1, "{id}");
        assert_eq!(setup.effects(id).await, 1, "{id}");
    }
    other.close().await;
    setup.finish(worker).await;
}
