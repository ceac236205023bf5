//! The inbox's metrics over real HTTP on SQLite, read from a recording recorder installed as the
//! global one (this binary holds this one test): acknowledgements stored and duplicate, attempts
//! by outcome, and the state gauges a sweep sets.

mod common;

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use common::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tower_idempotency_inbox::{Backoff, EventState, ACKNOWLEDGED_TOTAL, ATTEMPTS_TOTAL, EVENTS};
use tower_idempotency_sqlx::sqlx;
use tower_idempotency_testkit::{metric_id, snapshot, MetricId};

/// Counters summed over snapshots (each snapshot drains them); gauges as last set.
#[derive(Default)]
struct Seen(HashMap<MetricId, f64>);

impl Seen {
    fn take(&mut self, snapshotter: &Snapshotter) {
        for (id, value) in snapshot(snapshotter) {
            match value {
                DebugValue::Counter(n) => *self.0.entry(id).or_default() += n as f64,
                DebugValue::Gauge(n) => {
                    self.0.insert(id, n.into_inner());
                }
                DebugValue::Histogram(_) => {}
            }
        }
    }

    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0.get(&metric_id(name, labels)).copied().unwrap_or(0.0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledgements_attempts_and_states_are_recorded() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder of this binary");
    tower_idempotency_inbox::describe_metrics();

    let setup = Setup::<sqlx::Sqlite>::new().await;
    let probe = setup.probe();
    let worker = setup
        .inbox
        .worker(probe.handler::<sqlx::Sqlite>())
        .max_attempts(2)
        .backoff(Backoff::exponential(
            Duration::from_millis(5),
            Duration::from_millis(5),
        ))
        .sweep_every(Duration::from_millis(10))
        .spawn();
    let url = serve(&setup.inbox).await;
    let client = reqwest::Client::new();
    let ok = event_body("evt_metrics_ok", "charge.succeeded");
    assert_eq!(deliver(&client, &url, SECRET, &ok).await, 200);
    assert_eq!(deliver(&client, &url, SECRET, &ok).await, 200);
    let poison = event_body("evt_metrics_poison", "test.poison");
    assert_eq!(deliver(&client, &url, SECRET, &poison).await, 200);
    setup
        .wait_for("evt_metrics_ok", EventState::Processed)
        .await;
    setup
        .wait_for("evt_metrics_poison", EventState::Failed)
        .await;

    let mut seen = Seen::default();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        seen.take(&snapshotter);
        if seen.get(EVENTS, &[("state", "failed")]) == 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no sweep counted the failed event"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen.get(EVENTS, &[("state", "pending")]), 0.0);
    let stripe = ("provider", "stripe");
    assert_eq!(
        seen.get(ACKNOWLEDGED_TOTAL, &[stripe, ("outcome", "stored")]),
        2.0
    );
    assert_eq!(
        seen.get(ACKNOWLEDGED_TOTAL, &[stripe, ("outcome", "duplicate")]),
        1.0
    );
    assert_eq!(
        seen.get(ATTEMPTS_TOTAL, &[stripe, ("outcome", "processed")]),
        1.0
    );
    assert_eq!(
        seen.get(ATTEMPTS_TOTAL, &[stripe, ("outcome", "retry")]),
        1.0
    );
    assert_eq!(
        seen.get(ATTEMPTS_TOTAL, &[stripe, ("outcome", "failed")]),
        1.0
    );
    assert!(worker.drain(Duration::from_secs(30)).await);
    setup.cleanup().await;
}
