//! The stale-event guard over real HTTP on a SQLite file and on Postgres: events of one object
//! delivered out of order (Stripe's `created` 3, 1, 2) are handled in the order each policy
//! promises, one by one and concurrently, and by two workers sharing the table.

#[macro_use]
mod common;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::*;
use futures_util::future::join_all;
use tower_idempotency_inbox::{EventKey, EventState, Inbox, InboxWorker, Ordering, OrderingPolicy};
use tower_idempotency_sqlx::sqlx;

/// A Stripe event about `object` created at `created` (seconds).
fn stripe_event(id: &str, object: &str, created: i64, kind: &str) -> String {
    format!(
        r#"{{"id":"{id}","object":"event","type":"{kind}","created":{created},"data":{{"object":{{"id":"{object}"}}}}}}"#
    )
}

/// One handler run: the event, when it started and when it ended.
#[derive(Clone, Debug)]
struct Run {
    id: String,
    started: Instant,
    ended: Instant,
}

/// Records every run; events of type `test.slow` take 20 ms.
#[derive(Clone)]
struct Recorder {
    runs: Arc<Mutex<Vec<Run>>>,
    effects_table: Arc<str>,
}

impl Recorder {
    fn new(effects_table: &str) -> Self {
        Self {
            runs: Arc::default(),
            effects_table: effects_table.into(),
        }
    }

    fn handler<DB: Fixture>(&self) -> impl TestHandler<DB> {
        let recorder = self.clone();
        move |event, mut tx| {
            let recorder = recorder.clone();
            Box::pin(async move {
                let started = Instant::now();
                let kind = event.json()?["type"].as_str().unwrap_or("").to_owned();
                if kind == "test.slow" {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                DB::write_effect(&mut tx, &recorder.effects_table, &event.key.event_id).await?;
                recorder.runs.lock().unwrap().push(Run {
                    id: event.key.event_id.clone(),
                    started,
                    ended: Instant::now(),
                });
                Ok(())
            })
        }
    }

    fn ids(&self) -> Vec<String> {
        self.runs
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.id.clone())
            .collect()
    }

    /// Fails when two runs of the events `of` selects overlapped.
    fn assert_one_at_a_time(&self, label: &str, of: impl Fn(&str) -> bool) {
        let mut runs: Vec<Run> = self
            .runs
            .lock()
            .unwrap()
            .iter()
            .filter(|r| of(&r.id))
            .cloned()
            .collect();
        runs.sort_by_key(|r| r.started);
        for pair in runs.windows(2) {
            assert!(
                pair[1].started >= pair[0].ended,
                "{label}: {} started while {} ran",
                pair[1].id,
                pair[0].id
            );
        }
    }
}

async fn send<DB: Fixture>(url: &str, id: &str, object: &str, created: i64, kind: &str) {
    let client = reqwest::Client::new();
    let status = deliver(
        &client,
        url,
        SECRET,
        &stripe_event(id, object, created, kind),
    )
    .await;
    assert_eq!(status, 200, "{}: {id}", DB::LABEL);
}

fn ordered<DB: Fixture>(setup: &Setup<DB>, policy: OrderingPolicy) -> Inbox<DB> {
    setup.inbox.clone().ordering(Ordering::stripe(policy))
}

/// A fresh setup's inbox ordered by `policy`, served over HTTP at the answered URL, and a
/// recorder for its handler.
async fn served<DB: Fixture>(policy: OrderingPolicy) -> (Setup<DB>, Inbox<DB>, Recorder, String) {
    let setup = Setup::<DB>::new().await;
    let inbox = ordered(&setup, policy);
    let recorder = Recorder::new(&setup.effects_table);
    let url = serve(&inbox).await;
    (setup, inbox, recorder, url)
}

fn spawn<DB: Fixture>(inbox: &Inbox<DB>, recorder: &Recorder) -> InboxWorker {
    inbox
        .worker(recorder.handler::<DB>())
        .concurrency(4)
        .poll_every(Duration::from_millis(20))
        .spawn()
}

/// `created` 3, 1, 2 delivered before the worker starts, with an event of another object: the
/// worker runs 1, 2, 3 (earliest pending first). Then one by one (3, 1, 2 of another object,
/// each processed before the next arrives): each runs as it comes, since the policy orders only
/// the events pending together.
async fn sequential_runs_pending_events_of_an_object_in_time_order<DB: Fixture>() {
    let (setup, inbox, recorder, url) = served::<DB>(OrderingPolicy::Sequential).await;
    for (id, created) in [("evt_3", 3), ("evt_1", 1), ("evt_2", 2)] {
        send::<DB>(&url, id, "pi_a", created, "test.slow").await;
    }
    send::<DB>(&url, "evt_other", "pi_b", 1, "charge.updated").await;
    let worker = spawn(&inbox, &recorder);
    for id in ["evt_1", "evt_2", "evt_3", "evt_other"] {
        assert_eq!(
            setup.wait_for(id, EventState::Processed).await,
            1,
            "{}",
            DB::LABEL
        );
    }
    let object_a: Vec<String> = recorder
        .ids()
        .into_iter()
        .filter(|id| id != "evt_other")
        .collect();
    assert_eq!(object_a, ["evt_1", "evt_2", "evt_3"], "{}", DB::LABEL);
    recorder.assert_one_at_a_time(DB::LABEL, |id| id != "evt_other");

    for (id, created) in [("evt_c3", 3), ("evt_c1", 1), ("evt_c2", 2)] {
        send::<DB>(&url, id, "pi_c", created, "charge.updated").await;
        setup.wait_for(id, EventState::Processed).await;
    }
    let object_c: Vec<String> = recorder
        .ids()
        .into_iter()
        .filter(|id| id.starts_with("evt_c"))
        .collect();
    assert_eq!(object_c, ["evt_c3", "evt_c1", "evt_c2"], "{}", DB::LABEL);
    setup.finish(worker).await;
}

/// 300 events of one object acknowledged in reverse event-time order before the worker starts,
/// more than one sweep takes (256): the earliest, acknowledged last, is found and runs first,
/// and the rest follow in event-time order.
async fn sequential_backlog_larger_than_a_sweep<DB: Fixture>() {
    let (setup, inbox, recorder, url) = served::<DB>(OrderingPolicy::Sequential).await;
    for created in (1..=300).rev() {
        send::<DB>(
            &url,
            &format!("evt_{created}"),
            "pi_a",
            created,
            "charge.updated",
        )
        .await;
    }
    let worker = spawn(&inbox, &recorder);
    setup.wait_for("evt_300", EventState::Processed).await;
    let expected: Vec<String> = (1..=300).map(|c| format!("evt_{c}")).collect();
    assert_eq!(recorder.ids(), expected, "{}", DB::LABEL);
    setup.finish(worker).await;
}

/// Twelve events of one object, acknowledged newest first through two inboxes that share the
/// table (each with its own queue and worker), before the workers start: every event runs once,
/// in event-time order (1 to 12), whichever worker claims it. On Postgres no two runs overlap
/// either. That check runs on Postgres only: on SQLite the database's single write lock, not the
/// policy, decides how much of two runs can overlap (and a run whose write meets that lock runs
/// again), so there only the order is the policy's to keep.
async fn sequential_holds_across_two_workers<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let first = ordered(&setup, OrderingPolicy::Sequential);
    let second = Inbox::new(setup.pool.clone(), &setup.inbox_table)
        .unwrap()
        .ordering(Ordering::stripe(OrderingPolicy::Sequential));
    let recorder = Recorder::new(&setup.effects_table);
    let urls = [serve(&first).await, serve(&second).await];
    // Newest first, so an inbox that ran events as they were acknowledged would run 12 first.
    for c in (1..=12).rev() {
        let url = &urls[usize::try_from(c).unwrap() % 2];
        send::<DB>(url, &format!("evt_{c}"), "pi_a", c, "test.slow").await;
    }
    let workers = [spawn(&first, &recorder), spawn(&second, &recorder)];
    for c in 1..=12 {
        setup
            .wait_for(&format!("evt_{c}"), EventState::Processed)
            .await;
    }
    for worker in workers {
        assert!(worker.drain(Duration::from_secs(30)).await);
    }
    for c in 1..=12 {
        let id = format!("evt_{c}");
        assert_eq!(setup.event(&id).await.attempts, 1, "{}: {id}", DB::LABEL);
        assert_eq!(setup.effects(&id).await, 1, "{}: {id}", DB::LABEL);
    }
    let expected: Vec<String> = (1..=12).map(|c| format!("evt_{c}")).collect();
    assert_eq!(recorder.ids(), expected, "{}", DB::LABEL);
    if DB::LABEL == "postgres" {
        recorder.assert_one_at_a_time(DB::LABEL, |_| true);
    }
    setup.cleanup().await;
}

/// One by one: 3 is processed, then 1 and 2 are skipped without running (their last error
/// names the newer event), 4 is processed, and another event of the same second as 4 is not
/// stale.
async fn skip_stale_skips_events_older_than_the_newest_processed<DB: Fixture>() {
    let (setup, inbox, recorder, url) = served::<DB>(OrderingPolicy::SkipStale).await;
    let worker = spawn(&inbox, &recorder);
    send::<DB>(&url, "evt_3", "pi_a", 3, "charge.updated").await;
    setup.wait_for("evt_3", EventState::Processed).await;
    for (id, created) in [("evt_1", 1), ("evt_2", 2)] {
        send::<DB>(&url, id, "pi_a", created, "charge.updated").await;
        setup.wait_for(id, EventState::Skipped).await;
        let event = inbox
            .get(&EventKey::new("stripe", id))
            .await
            .unwrap()
            .unwrap();
        assert!(
            event.last_error.as_deref().unwrap_or("").contains("evt_3"),
            "{}: {event:?}",
            DB::LABEL
        );
        assert_eq!(setup.effects(id).await, 0, "{}: {id}", DB::LABEL);
    }
    send::<DB>(&url, "evt_4", "pi_a", 4, "charge.updated").await;
    setup.wait_for("evt_4", EventState::Processed).await;
    send::<DB>(&url, "evt_4b", "pi_a", 4, "charge.refunded").await;
    setup.wait_for("evt_4b", EventState::Processed).await;
    assert_eq!(
        recorder.ids(),
        ["evt_3", "evt_4", "evt_4b"],
        "{}",
        DB::LABEL
    );
    let counts = inbox.counts().await.unwrap();
    assert_eq!((counts.processed, counts.skipped), (3, 2), "{}", DB::LABEL);
    setup.finish(worker).await;
}

/// Ten events of one object delivered concurrently in shuffled order: each ends processed or
/// skipped, the newest is processed, and the processed ones ran in increasing `created`: no
/// older event was handled after a newer one.
async fn skip_stale_never_runs_an_older_event_after_a_newer_one<DB: Fixture>() {
    let (setup, inbox, recorder, url) = served::<DB>(OrderingPolicy::SkipStale).await;
    let worker = spawn(&inbox, &recorder);
    let mut created: Vec<i64> = (1..=10).collect();
    fastrand::shuffle(&mut created);
    join_all(created.iter().map(|c| {
        let url = url.clone();
        async move { send::<DB>(&url, &format!("evt_{c}"), "pi_a", *c, "test.slow").await }
    }))
    .await;
    setup.wait_for("evt_10", EventState::Processed).await;
    for c in 1..=10 {
        let id = format!("evt_{c}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let event = inbox
                .get(&EventKey::new("stripe", &id))
                .await
                .unwrap()
                .unwrap();
            if matches!(event.state, EventState::Processed | EventState::Skipped) {
                let ran = u64::from(event.state == EventState::Processed);
                assert_eq!(setup.effects(&id).await as u64, ran, "{}: {id}", DB::LABEL);
                break;
            }
            assert!(Instant::now() < deadline, "{}: {event:?}", DB::LABEL);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let handled: Vec<i64> = recorder
        .ids()
        .iter()
        .map(|id| id.trim_start_matches("evt_").parse().unwrap())
        .collect();
    assert!(
        handled.windows(2).all(|pair| pair[0] < pair[1]),
        "{}: handled {handled:?}",
        DB::LABEL
    );
    assert_eq!(handled.last(), Some(&10), "{}", DB::LABEL);
    setup.finish(worker).await;
}

on_both!(
    and_mysql:
    sequential_runs_pending_events_of_an_object_in_time_order,
    sequential_backlog_larger_than_a_sweep,
    sequential_holds_across_two_workers,
    skip_stale_skips_events_older_than_the_newest_processed,
    skip_stale_never_runs_an_older_event_after_a_newer_one,
);
