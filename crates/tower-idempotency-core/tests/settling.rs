//! Settling the key after the handler ran: a completion the store refuses or fails, and lease
//! renewals that run beside the handler.

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::body::Body;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::Notify;
use tower::{Layer, ServiceExt};
use tower_idempotency_core::{
    IdempotencyLayer, MemoryStore, Outcome, StoreError, BODY_OMITTED_HEADER,
};
use tower_idempotency_testkit::{Call, CapturedLogs, Hooked, Hooks, Outage};

fn keyed(key: &str) -> Request<Body> {
    Request::post("/orders")
        .header("idempotency-key", key)
        .body(Body::from("{}"))
        .unwrap()
}

/// The outcome the layer recorded on `response`.
fn outcome<B>(response: &Response<B>) -> Option<Outcome> {
    response.extensions().get::<Outcome>().copied()
}

/// A handler answering `size` bytes, counting its runs.
fn answering(
    size: usize,
    runs: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<Body>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |_request: Request<Body>| {
        runs.fetch_add(1, Ordering::SeqCst);
        async move {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(StatusCode::CREATED)
                    .header("x-order", "o-1")
                    .body(Body::from(vec![b'x'; size]))
                    .unwrap(),
            )
        }
    })
}

#[tokio::test]
async fn a_response_the_store_refuses_as_too_large_completes_without_its_body() {
    // 16 shards of 1 KiB: the store refuses any record over 1 KiB.
    let store = MemoryStore::new().with_max_bytes(16 * 1024);
    let lease = Duration::from_millis(200);
    let runs = Arc::new(AtomicUsize::new(0));
    let service = IdempotencyLayer::client_keys(store)
        .lease(lease)
        .layer(answering(2048, runs.clone()));

    let first = service.clone().oneshot(keyed("big")).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(outcome(&first), Some(Outcome::Executed));
    assert!(!first.headers().contains_key(&BODY_OMITTED_HEADER));
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 2048, "the first caller gets the whole body");

    // Past the lease, a retry must be a replay, not a second run.
    tokio::time::sleep(lease * 2).await;
    let retry = service.oneshot(keyed("big")).await.unwrap();
    assert_eq!(outcome(&retry), Some(Outcome::Replayed));
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()[&BODY_OMITTED_HEADER], "true");
    assert_eq!(retry.headers()["x-order"], "o-1");
    assert!(retry
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .is_empty());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Hooks failing `complete` (as a lost connection does) a given number of times.
struct FlakyCompletion {
    failures_left: AtomicUsize,
    attempts: AtomicUsize,
}

impl FlakyCompletion {
    fn failing(times: usize) -> Hooked<Self> {
        let hooks = Self {
            failures_left: AtomicUsize::new(times),
            attempts: AtomicUsize::new(0),
        };
        Hooked::wrap(MemoryStore::new(), hooks)
    }
}

#[async_trait::async_trait]
impl Hooks for FlakyCompletion {
    async fn before(&self, call: Call, _key: &str) -> Result<(), StoreError> {
        if call != Call::Complete {
            return Ok(());
        }
        self.attempts.fetch_add(1, Ordering::SeqCst);
        let failing = self
            .failures_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(StoreError::Unavailable("connection reset".into()));
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_transient_completion_failure_is_retried_within_the_lease() {
    let store = Arc::new(FlakyCompletion::failing(2));
    let lease = Duration::from_secs(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let service = IdempotencyLayer::client_keys(store.clone())
        .lease(lease)
        .layer(answering(16, runs.clone()));
    let first = service.clone().oneshot(keyed("flaky")).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(outcome(&first), Some(Outcome::Executed));
    assert_eq!(store.hooks.attempts.load(Ordering::SeqCst), 3);
    let retry = service.oneshot(keyed("flaky")).await.unwrap();
    assert_eq!(outcome(&retry), Some(Outcome::Replayed));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_completion_that_keeps_failing_stops_when_the_lease_ends() {
    let store = Arc::new(FlakyCompletion::failing(usize::MAX));
    let lease = Duration::from_millis(300);
    let service = IdempotencyLayer::client_keys(store.clone())
        .lease(lease)
        .layer(answering(16, Arc::new(AtomicUsize::new(0))));
    let first = service.oneshot(keyed("down")).await.unwrap();
    assert_eq!(
        first.status(),
        StatusCode::CREATED,
        "the caller still gets its answer"
    );
    assert_eq!(outcome(&first), Some(Outcome::ExecutedUnrecorded));
    let attempts = store.hooks.attempts.load(Ordering::SeqCst);
    // 50 ms doubling inside a 300 ms lease: a few attempts, never an unbounded loop.
    assert!((2..=4).contains(&attempts), "{attempts} attempts");
}

/// Hooks making `renew` never answer (a hung connection), noting whether one is still waiting.
#[derive(Default)]
struct HungRenewal {
    renewal_started: Notify,
    renewal_pending: AtomicBool,
}

struct PendingFlag<'a>(&'a AtomicBool);

impl Drop for PendingFlag<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl Hooks for HungRenewal {
    async fn before(&self, call: Call, _key: &str) -> Result<(), StoreError> {
        if call != Call::Renew {
            return Ok(());
        }
        self.renewal_pending.store(true, Ordering::SeqCst);
        let _flag = PendingFlag(&self.renewal_pending);
        self.renewal_started.notify_one();
        std::future::pending().await
    }
}

#[tokio::test]
async fn the_handler_is_polled_while_a_renewal_waits_on_the_store() {
    let store = Arc::new(Hooked::wrap(MemoryStore::new(), HungRenewal::default()));
    let go = Arc::new(Notify::new());
    let saw_pending_renewal = Arc::new(AtomicBool::new(false));
    let handler = tower::service_fn({
        let (store, go, saw) = (store.clone(), go.clone(), saw_pending_renewal.clone());
        move |_request: Request<Body>| {
            let (store, go, saw) = (store.clone(), go.clone(), saw.clone());
            async move {
                go.notified().await;
                // Woken while the renewal still waits: the handler was not paused behind it.
                saw.store(
                    store.hooks.renewal_pending.load(Ordering::SeqCst),
                    Ordering::SeqCst,
                );
                Ok::<_, Infallible>(Response::new(Body::from("done")))
            }
        }
    });
    let service = IdempotencyLayer::client_keys(store.clone())
        .lease(Duration::from_millis(600))
        .store_timeout(Duration::from_secs(60))
        .layer(handler);
    let request = tokio::spawn(service.oneshot(keyed("slow")));
    store.hooks.renewal_started.notified().await;
    go.notify_one();
    let answer = request.await.unwrap().unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    assert!(
        saw_pending_renewal.load(Ordering::SeqCst),
        "the handler resumed only after the renewal gave up"
    );
}

#[tokio::test]
async fn a_store_timeout_longer_than_a_renewal_period_is_clamped_to_it() {
    // Either order of the two settings gives the same bound: a third of the lease.
    for layer in [
        IdempotencyLayer::client_keys(Outage::Hung.store())
            .store_timeout(Duration::from_secs(60))
            .lease(Duration::from_millis(300)),
        IdempotencyLayer::client_keys(Outage::Hung.store())
            .lease(Duration::from_millis(300))
            .store_timeout(Duration::from_secs(60)),
    ] {
        let service = layer.layer(answering(16, Arc::new(AtomicUsize::new(0))));
        // Unclamped, the claim would wait the full 60 s; half of that is a hang, not a speed bound.
        let answer = tokio::time::timeout(Duration::from_secs(30), service.oneshot(keyed("hung")))
            .await
            .expect("the claim is bounded by a third of the lease, not by 60 s")
            .unwrap();
        assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}

#[tokio::test]
async fn past_the_renewal_ceiling_the_layer_warns_once_and_a_duplicate_may_run() {
    let (captured, _guard) = CapturedLogs::start(tracing::Level::WARN);

    let lease = Duration::from_millis(300);
    let runs = Arc::new(AtomicUsize::new(0));
    let (started, proceed) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let handler = tower::service_fn({
        let (runs, started, proceed) = (runs.clone(), started.clone(), proceed.clone());
        move |_request: Request<Body>| {
            let n = runs.fetch_add(1, Ordering::SeqCst);
            let (started, proceed) = (started.clone(), proceed.clone());
            async move {
                if n == 0 {
                    // The first run outlives the ceiling and the lease after it: it waits
                    // until the duplicate has run.
                    started.notify_one();
                    proceed.notified().await;
                }
                Ok::<_, Infallible>(Response::new(Body::from("done")))
            }
        }
    });
    let service = IdempotencyLayer::client_keys(MemoryStore::new())
        .lease(lease)
        .max_lease_renewal(Duration::from_millis(150))
        .layer(handler);
    let first = tokio::spawn(service.clone().oneshot(keyed("slow")));
    started.notified().await;
    // One renewal (at 100 ms) holds the lease until 400 ms after the claim, which came before
    // the handler started; real time has to pass for it to lapse, there is no signal to await.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let duplicate = service.oneshot(keyed("slow")).await.unwrap();
    proceed.notify_one();
    assert_eq!(
        outcome(&duplicate),
        Some(Outcome::Executed),
        "documented: past the ceiling, a duplicate may run"
    );
    first.await.unwrap().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let logs = captured.text();
    assert_eq!(
        logs.matches("outlived the lease renewal ceiling").count(),
        1,
        "{logs}"
    );
}
