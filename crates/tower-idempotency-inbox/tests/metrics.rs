//! The inbox's metrics and attempt spans over real HTTP on SQLite and on Postgres, read from a
//! recording recorder and a capturing subscriber installed as the global ones (this binary holds
//! this one test): acknowledgements stored and duplicate, attempts and their durations by
//! outcome, the state gauges a sweep sets, and the handler's own log inside its attempt's span.

mod common;

use std::{
    collections::HashMap,
    io,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tower_idempotency_inbox::{
    Backoff, EventState, ACKNOWLEDGED_TOTAL, ATTEMPTS_TOTAL, ATTEMPT_DURATION_SECONDS, EVENTS,
};
use tower_idempotency_sqlx::sqlx;
use tower_idempotency_testkit::{metric_id, snapshot, MetricId};

/// Counters summed over snapshots (each snapshot drains them); gauges as last set; histograms
/// as their observation counts, summed.
#[derive(Default)]
struct Seen(HashMap<MetricId, f64>);

/// What the global subscriber wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }
}

impl Seen {
    fn take(&mut self, snapshotter: &Snapshotter) {
        for (id, value) in snapshot(snapshotter) {
            match value {
                DebugValue::Counter(n) => *self.0.entry(id).or_default() += n as f64,
                DebugValue::Gauge(n) => {
                    self.0.insert(id, n.into_inner());
                }
                DebugValue::Histogram(values) => {
                    *self.0.entry(id).or_default() += values.len() as f64
                }
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
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    recorded::<sqlx::Sqlite>(&snapshotter, &captured).await;
    recorded::<sqlx::Postgres>(&snapshotter, &captured).await;
}

async fn recorded<DB: Fixture>(snapshotter: &Snapshotter, captured: &Captured) {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let worker = setup
        .inbox
        .worker(probe.handler::<DB>())
        .max_attempts(2)
        .backoff(Backoff::exponential(
            Duration::from_millis(5),
            Duration::from_millis(5),
        ))
        .sweep_every(Duration::from_millis(10))
        .spawn();
    let url = serve(&setup.inbox).await;
    let client = reqwest::Client::new();
    let ok_id = format!("evt_metrics_ok_{}", DB::LABEL);
    let ok = event_body(&ok_id, "charge.succeeded");
    assert_eq!(deliver(&client, &url, SECRET, &ok).await, 200);
    assert_eq!(deliver(&client, &url, SECRET, &ok).await, 200);
    let poison_id = format!("evt_metrics_poison_{}", DB::LABEL);
    let poison = event_body(&poison_id, "test.poison");
    assert_eq!(deliver(&client, &url, SECRET, &poison).await, 200);
    setup.wait_for(&ok_id, EventState::Processed).await;
    setup.wait_for(&poison_id, EventState::Failed).await;

    let mut seen = Seen::default();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        seen.take(snapshotter);
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
    for outcome in ["processed", "retry", "failed"] {
        let labels = [stripe, ("outcome", outcome)];
        assert_eq!(
            seen.get(ATTEMPT_DURATION_SECONDS, &labels),
            1.0,
            "{}: {outcome}",
            DB::LABEL
        );
    }
    // The handler's own log carries its attempt's span: provider, event id, type, attempt.
    let span = format!(
        "inbox_attempt{{provider=stripe event_id={ok_id} event_type=charge.succeeded attempt=1}}"
    );
    let lines = captured.lines();
    assert!(
        lines
            .iter()
            .any(|line| line.contains(&span) && line.contains("the probe handler runs")),
        "{}: no handler log in {span}: {lines:#?}",
        DB::LABEL
    );
    let retried = format!("event_id={poison_id} event_type=test.poison attempt=2}}");
    assert!(
        lines.iter().any(|line| line.contains(&retried)),
        "{}: {lines:#?}",
        DB::LABEL
    );
    assert!(worker.drain(Duration::from_secs(30)).await);
    setup.cleanup().await;
}
