//! The inbox's metrics and attempt spans over real HTTP on SQLite and on Postgres, read from a
//! recording recorder and a capturing subscriber installed as the global ones (this binary holds
//! this one test): acknowledgements stored and duplicate, attempts and their durations by
//! outcome, the state gauges a sweep sets, and the handler's own log inside its attempt's span;
//! then the state gauges beside many processed rows and the lag gauge by provider.

mod common;

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use common::*;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, SharedString, Unit};
use metrics_util::{
    debugging::{DebugValue, DebuggingRecorder, Snapshotter},
    layers::FanoutBuilder,
    registry::{AtomicStorage, Registry},
};
use tower_idempotency_inbox::{
    Backoff, EventState, ACKNOWLEDGED_TOTAL, ATTEMPTS_TOTAL, ATTEMPT_DURATION_SECONDS, EVENTS,
    LAG_SECONDS,
};
use tower_idempotency_sqlx::sqlx;
use tower_idempotency_testkit::{metric_id, snapshot, CapturedLogs, MetricId};

/// Counters summed over snapshots (each snapshot drains them); gauges as last set; histograms
/// as their observation counts, summed.
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
    let gauges = Gauges::default();
    let fanout = FanoutBuilder::default()
        .add_recorder(recorder)
        .add_recorder(gauges.clone())
        .build();
    metrics::set_global_recorder(fanout).expect("the only recorder of this binary");
    tower_idempotency_inbox::describe_metrics();
    let captured = CapturedLogs::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    recorded::<sqlx::Sqlite>(&snapshotter, &captured).await;
    recorded::<sqlx::Postgres>(&snapshotter, &captured).await;
    queue_gauges::<sqlx::Sqlite>(&gauges).await;
    queue_gauges::<sqlx::Postgres>(&gauges).await;
}

/// A recorder of gauges only, which keeps their values as an exporter does (the debugging
/// recorder's snapshot resets them to zero, so a gauge set back to zero and one never set again
/// would read alike).
#[derive(Clone)]
struct Gauges(Arc<Registry<Key, AtomicStorage>>);

impl Default for Gauges {
    fn default() -> Self {
        Self(Arc::new(Registry::atomic()))
    }
}

impl metrics::Recorder for Gauges {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .get_or_create_gauge(key, |gauge| Gauge::from_arc(gauge.clone()))
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

impl Gauges {
    /// The gauge's current value; 0 when it was never set.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let wanted = metric_id(name, labels);
        self.0
            .get_gauge_handles()
            .into_iter()
            .find(|(key, _)| {
                let labels: Vec<(&str, &str)> =
                    key.labels().map(|l| (l.key(), l.value())).collect();
                metric_id(key.name(), &labels) == wanted
            })
            .map_or(0.0, |(_, value)| {
                f64::from_bits(value.load(std::sync::atomic::Ordering::SeqCst))
            })
    }
}

fn now_ms() -> i64 {
    i64::try_from(std::time::UNIX_EPOCH.elapsed().unwrap().as_millis()).unwrap()
}

/// Polls the gauges until `done` holds of them, failing after 20 s with `what`.
async fn until(seen: &Gauges, what: &str, done: impl Fn(&Gauges) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if done(seen) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {:?}",
            [
                seen.get(EVENTS, &[("state", "pending")]),
                seen.get(EVENTS, &[("state", "failed")]),
                seen.get(LAG_SECONDS, &[("provider", "stripe")]),
                seen.get(LAG_SECONDS, &[("provider", "github")]),
            ]
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The state gauges count pending and failed events beside many processed ones; the lag gauge
/// follows each provider's oldest pending event and falls to zero once it has none.
async fn queue_gauges<DB: Fixture>(seen: &Gauges) {
    let setup = Setup::<DB>::new().await;
    let (now, hour) = (now_ms(), 3_600_000);
    let body = if DB::LABEL == "postgres" {
        "'\\x7b7d'"
    } else {
        "x'7b7d'"
    };
    // 500 processed events, and a GitHub event pending for an hour, due tomorrow.
    let processed = format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500) \
         INSERT INTO {table} (provider, event_id, headers, body, received_at, state, \
         available_at, finished_at) \
         SELECT 'stripe', 'evt_done_' || i, '[]', {body}, {now}, 1, {now}, {now} FROM n",
        table = setup.inbox_table,
    );
    DB::exec(&setup.pool, &processed).await;
    let late = format!(
        "INSERT INTO {table} (provider, event_id, headers, body, received_at, available_at) \
         VALUES ('github', 'd-lag', '[]', {body}, {received}, {due})",
        table = setup.inbox_table,
        received = now - hour,
        due = now + 24 * hour,
    );
    DB::exec(&setup.pool, &late).await;
    let probe = setup.probe();
    let worker = setup
        .inbox
        .worker(probe.handler::<DB>())
        .max_attempts(1)
        .poll_every(Duration::from_millis(10))
        .spawn();
    let sender = Sender::new(&setup.inbox).await;
    let poison_id = format!("evt_gauges_poison_{}", DB::LABEL);
    sender.acknowledged(&poison_id, "test.poison").await;
    setup.wait_for(&poison_id, EventState::Failed).await;
    // One event held in its handler (on SQLite it holds the write lock meanwhile).
    let gated_id = format!("evt_gauges_gated_{}", DB::LABEL);
    sender.acknowledged(&gated_id, "test.gated").await;
    probe.wait_started(2).await;

    let github = [("provider", "github")];
    let stripe = [("provider", "stripe")];
    until(
        seen,
        "the gated and the late events pending, one failed",
        |seen| {
            seen.get(EVENTS, &[("state", "pending")]) == 2.0
                && seen.get(EVENTS, &[("state", "failed")]) == 1.0
                && seen.get(LAG_SECONDS, &github) >= 3600.0
                && seen.get(LAG_SECONDS, &stripe) > 0.0
        },
    )
    .await;
    let lag = seen.get(LAG_SECONDS, &github);
    assert!(lag < 3660.0, "{}: {lag}", DB::LABEL);
    let lag = seen.get(LAG_SECONDS, &stripe);
    assert!(lag < 60.0, "{}: {lag}", DB::LABEL);

    // The gated event is processed: Stripe has no pending event left.
    probe.open_gate();
    until(seen, "the gated event processed", |seen| {
        seen.get(EVENTS, &[("state", "pending")]) == 1.0
            && seen.get(LAG_SECONDS, &stripe) == 0.0
            && seen.get(LAG_SECONDS, &github) >= 3600.0
    })
    .await;
    // The late one is done too.
    let done = format!(
        "UPDATE {} SET state = 1, finished_at = {now} WHERE event_id = 'd-lag'",
        setup.inbox_table
    );
    DB::exec(&setup.pool, &done).await;
    until(seen, "nothing pending", |seen| {
        seen.get(EVENTS, &[("state", "pending")]) == 0.0
            && seen.get(EVENTS, &[("state", "failed")]) == 1.0
            && seen.get(LAG_SECONDS, &github) == 0.0
    })
    .await;
    setup.finish(worker).await;
}

async fn recorded<DB: Fixture>(snapshotter: &Snapshotter, captured: &CapturedLogs) {
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
        .poll_every(Duration::from_millis(10))
        .spawn();
    let sender = Sender::new(&setup.inbox).await;
    let ok_id = format!("evt_metrics_ok_{}", DB::LABEL);
    sender.acknowledged(&ok_id, "charge.succeeded").await;
    sender.acknowledged(&ok_id, "charge.succeeded").await;
    let poison_id = format!("evt_metrics_poison_{}", DB::LABEL);
    sender.acknowledged(&poison_id, "test.poison").await;
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
    for (name, outcome, count) in [
        (ACKNOWLEDGED_TOTAL, "stored", 2.0),
        (ACKNOWLEDGED_TOTAL, "duplicate", 1.0),
        (ATTEMPTS_TOTAL, "processed", 1.0),
        (ATTEMPTS_TOTAL, "retry", 1.0),
        (ATTEMPTS_TOTAL, "failed", 1.0),
    ] {
        assert_eq!(
            seen.get(name, &[stripe, ("outcome", outcome)]),
            count,
            "{name} {outcome}"
        );
    }
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
    let text = captured.text();
    let lines: Vec<&str> = text.lines().collect();
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
    setup.finish(worker).await;
}
