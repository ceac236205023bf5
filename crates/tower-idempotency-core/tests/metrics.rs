//! The layer's metrics over real HTTP, read from a recording recorder installed for each test
//! on its own thread (`metrics::with_local_recorder`, a current-thread runtime), so tests share
//! no global state.
#![cfg(feature = "metrics")]

use std::{
    cell::RefCell,
    collections::HashMap,
    future::Future,
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use axum::{extract::State, http::StatusCode, routing::post, Router};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tower_idempotency_core::{
    store_key_from_parts, IdempotencyLayer, MemoryStore, Store, HANDLERS_IN_FLIGHT,
    LEASE_RENEWALS_LOST_TOTAL, REQUESTS_TOTAL, RESULTS_UNRECORDED_TOTAL,
    STORE_CALL_DURATION_SECONDS,
};
use tower_idempotency_testkit::{metric_id, snapshot, MetricId};

/// Reads the recorded metrics. Every snapshot of the `DebuggingRecorder` drains it (counters
/// and gauges are swapped to zero, histograms cleared), so the values are summed here: a gauge
/// only moves by increments and decrements, whose sum is its value.
struct Recorded {
    snapshotter: Snapshotter,
    seen: RefCell<HashMap<MetricId, DebugValue>>,
}

impl Recorded {
    fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<DebugValue> {
        let mut seen = self.seen.borrow_mut();
        for (id, value) in snapshot(&self.snapshotter) {
            let merged = match (seen.remove(&id), value) {
                (None, value) => value,
                (Some(DebugValue::Counter(a)), DebugValue::Counter(b)) => {
                    DebugValue::Counter(a + b)
                }
                (Some(DebugValue::Gauge(a)), DebugValue::Gauge(b)) => DebugValue::Gauge(a + b),
                (Some(DebugValue::Histogram(mut a)), DebugValue::Histogram(b)) => {
                    a.extend(b);
                    DebugValue::Histogram(a)
                }
                (Some(a), b) => panic!("{id:?} changed kind: {a:?}, {b:?}"),
            };
            seen.insert(id, merged);
        }
        seen.get(&metric_id(name, labels)).map(|value| match value {
            DebugValue::Counter(n) => DebugValue::Counter(*n),
            DebugValue::Gauge(n) => DebugValue::Gauge(*n),
            DebugValue::Histogram(samples) => DebugValue::Histogram(samples.clone()),
        })
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.find(name, labels) {
            Some(DebugValue::Counter(n)) => n,
            None => 0,
            Some(other) => panic!("{name} is not a counter: {other:?}"),
        }
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        match self.find(name, labels) {
            Some(DebugValue::Gauge(n)) => Some(n.into_inner()),
            None => None,
            Some(other) => panic!("{name} is not a gauge: {other:?}"),
        }
    }

    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        match self.find(name, labels) {
            Some(DebugValue::Histogram(samples)) => {
                samples.into_iter().map(|s| s.into_inner()).collect()
            }
            None => Vec::new(),
            Some(other) => panic!("{name} is not a histogram: {other:?}"),
        }
    }

    fn requests(&self, namespace: &str, outcome: &str) -> u64 {
        self.counter(
            REQUESTS_TOTAL,
            &[("namespace", namespace), ("outcome", outcome)],
        )
    }
}

/// Runs `test` on a current-thread runtime with a recording recorder installed for this thread:
/// the server, the handlers and the client all record into it.
fn recorded<F: Future<Output = ()>>(test: impl FnOnce(Recorded) -> F) {
    let recorder = DebuggingRecorder::new();
    let metrics = Recorded {
        snapshotter: recorder.snapshotter(),
        seen: RefCell::default(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || runtime.block_on(test(metrics)));
}

type Handler = tower_idempotency_testkit::HeldHandler;

async fn order(State(h): State<Handler>) -> (StatusCode, &'static str) {
    h.execute().await;
    (StatusCode::CREATED, "created")
}

/// The orders endpoint behind a client-keys layer (namespace `orders`) over a memory store, and
/// a client for it.
async fn serve_orders(handler: Handler) -> (reqwest::Client, String) {
    let layer = IdempotencyLayer::client_keys(MemoryStore::new()).namespace("orders");
    (reqwest::Client::new(), serve(handler, layer).await)
}

/// Serves `/orders` (POST and GET) on a loopback port until the test's runtime ends.
async fn serve(handler: Handler, layer: IdempotencyLayer) -> String {
    let app = Router::new()
        .route("/orders", post(order).get(order))
        .route_layer(layer)
        .with_state(handler);
    let base = tower_idempotency_testkit::serve(app).await;
    format!("{base}/orders")
}

async fn post_order(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &'static str,
) -> StatusCode {
    let mut request = client.post(url).body(body);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.send().await.unwrap().status()
}

#[test]
fn requests_are_counted_by_namespace_and_outcome() {
    recorded(|metrics| async move {
        let (client, url) = serve_orders(Handler::default()).await;

        assert_eq!(post_order(&client, &url, Some("k1"), "a").await, 201);
        assert_eq!(post_order(&client, &url, Some("k1"), "a").await, 201);
        assert_eq!(post_order(&client, &url, Some("k1"), "b").await, 422);
        assert_eq!(post_order(&client, &url, None, "a").await, 400);
        assert_eq!(client.get(&url).send().await.unwrap().status(), 201);

        for outcome in [
            "executed",
            "replayed",
            "mismatch",
            "rejected",
            "passed_through",
        ] {
            assert_eq!(metrics.requests("orders", outcome), 1, "{outcome}");
        }
        assert_eq!(metrics.requests("orders", "in_flight"), 0);
    });
}

#[test]
fn store_calls_are_timed_by_operation_and_store() {
    recorded(|metrics| async move {
        let (client, url) = serve_orders(Handler::default()).await;

        assert_eq!(post_order(&client, &url, Some("k1"), "a").await, 201);
        assert_eq!(post_order(&client, &url, Some("k1"), "a").await, 201);
        // Refused before the store is asked: no store call.
        assert_eq!(post_order(&client, &url, None, "a").await, 400);

        let claims = metrics.histogram(
            STORE_CALL_DURATION_SECONDS,
            &[("operation", "claim"), ("store", "memory")],
        );
        let completions = metrics.histogram(
            STORE_CALL_DURATION_SECONDS,
            &[("operation", "complete"), ("store", "memory")],
        );
        assert_eq!(claims.len(), 2, "{claims:?}");
        assert_eq!(completions.len(), 1, "{completions:?}");
        for seconds in claims.iter().chain(&completions) {
            assert!(seconds.is_finite() && *seconds >= 0.0, "{seconds}");
        }
        let releases = metrics.histogram(
            STORE_CALL_DURATION_SECONDS,
            &[("operation", "release"), ("store", "memory")],
        );
        assert!(releases.is_empty(), "{releases:?}");
    });
}

#[test]
fn concurrent_duplicates_run_one_handler_and_the_gauge_follows_it() {
    recorded(|metrics| async move {
        let handler = Handler::blocking();
        let (client, url) = serve_orders(handler.clone()).await;
        let in_flight = || metrics.gauge(HANDLERS_IN_FLIGHT, &[("namespace", "orders")]);

        let first = tokio::spawn({
            let (client, url) = (client.clone(), url.clone());
            async move { post_order(&client, &url, Some("same"), "a").await }
        });
        handler.started.notified().await;
        assert_eq!(in_flight(), Some(1.0));

        let duplicates = futures_util::future::join_all(
            (0..16).map(|_| post_order(&client, &url, Some("same"), "a")),
        )
        .await;
        assert!(duplicates.iter().all(|s| *s == 409), "{duplicates:?}");
        assert_eq!(in_flight(), Some(1.0));
        assert_eq!(metrics.requests("orders", "in_flight"), 16);

        handler.proceed.notify_one();
        assert_eq!(first.await.unwrap(), 201);
        assert_eq!(in_flight(), Some(0.0));
        assert_eq!(handler.executions.load(Ordering::SeqCst), 1);
        assert_eq!(metrics.requests("orders", "executed"), 1);
    });
}

#[test]
fn a_lost_lease_counts_the_lost_renewal_and_the_unrecorded_result() {
    recorded(|metrics| async move {
        let handler = Handler::blocking();
        let store = Arc::new(MemoryStore::new());
        let lease = Duration::from_millis(100);
        let layer = IdempotencyLayer::client_keys(store.clone())
            .namespace("orders")
            .lease(lease);
        let url = serve(handler.clone(), layer).await;
        let client = reqwest::Client::new();
        let lost = || metrics.counter(LEASE_RENEWALS_LOST_TOTAL, &[("namespace", "orders")]);

        let answer = tokio::spawn({
            let (client, url) = (client.clone(), url.clone());
            async move { post_order(&client, &url, Some("k1"), "a").await }
        });
        handler.started.notified().await;
        assert_eq!(lost(), 0);
        // An operator forgets the key while its handler runs: the next renewal finds it gone.
        let key = store_key_from_parts("orders", "POST", "/orders", None, "k1");
        assert!(store.forget(&key).await.unwrap());
        // Renewals come every third of the lease; poll for the lost one, up to a generous deadline.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while lost() == 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(lost() >= 1, "no lost renewal was counted");
        assert_eq!(
            metrics.counter(RESULTS_UNRECORDED_TOTAL, &[("namespace", "orders")]),
            0
        );

        handler.proceed.notify_one();
        assert_eq!(answer.await.unwrap(), 201);
        assert_eq!(
            metrics.counter(RESULTS_UNRECORDED_TOTAL, &[("namespace", "orders")]),
            1
        );
        assert_eq!(metrics.requests("orders", "executed_unrecorded"), 1);
        let renewals = metrics.histogram(
            STORE_CALL_DURATION_SECONDS,
            &[("operation", "renew"), ("store", "memory")],
        );
        assert!(!renewals.is_empty());
    });
}
