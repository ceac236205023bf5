//! The idempotency layer in a `tower::ServiceBuilder` with tower-http's layers, in the order
//! docs/composition.md gives, over real HTTP: a caller's timeout does not cancel the handler
//! (the retry gets its recorded result), replays are compressed per caller, and the upload limit
//! answers before the layer buffers.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::{extract::State, http::StatusCode, routing::post, Router};
use tokio::sync::Notify;
use tower::ServiceBuilder;
use tower_http::{
    compression::CompressionLayer, limit::RequestBodyLimitLayer, timeout::TimeoutLayer,
    trace::TraceLayer,
};
use tower_idempotency::{IdempotencyLayer, MemoryStore};
use tower_idempotency_testkit::serve;

#[derive(Clone, Default)]
struct Handler {
    runs: Arc<AtomicUsize>,
    /// Set: the handler waits for it (past the caller's timeout) before it answers.
    release: Arc<Notify>,
    finished: Arc<Notify>,
}

async fn create_order(State(h): State<Handler>, body: String) -> (StatusCode, String) {
    let run = h.runs.fetch_add(1, Ordering::SeqCst) + 1;
    if body.contains("slow") {
        h.release.notified().await;
    }
    h.finished.notify_one();
    (
        StatusCode::CREATED,
        format!("order {run}: {}", body.repeat(20)),
    )
}

async fn app(handler: Handler) -> String {
    let stack = ServiceBuilder::new()
        .layer(TraceLayer::new_for_http())
        .layer(RequestBodyLimitLayer::new(1024))
        // Long enough for the claim to land on a loaded machine (a memory store's claim takes
        // microseconds), so the timeout always cuts a running handler.
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            Duration::from_secs(2),
        ))
        .layer(CompressionLayer::new())
        .layer(IdempotencyLayer::client_keys(MemoryStore::new()).namespace("orders"));
    let router = Router::new()
        .route("/orders", post(create_order))
        .route_layer(stack)
        .with_state(handler);
    serve(router).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_composes_with_tower_http() {
    let handler = Handler::default();
    let base = app(handler.clone()).await;
    let client = reqwest::Client::new();
    let post = |key: &str, body: &str| {
        client
            .post(format!("{base}/orders"))
            .header("idempotency-key", key)
            .body(body.to_owned())
    };

    // The caller's deadline passes while the handler waits: 408, and the handler goes on.
    let timed_out = post("k-slow", "slow").send().await.unwrap();
    assert_eq!(timed_out.status(), StatusCode::REQUEST_TIMEOUT);
    handler.release.notify_one();
    handler.finished.notified().await;
    // The retry gets the result the handler recorded after its caller left: no second run.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let retry = loop {
        let retry = post("k-slow", "slow").send().await.unwrap();
        // The completion may still be on its way to the store: 409 until it lands.
        if retry.status() != StatusCode::CONFLICT || tokio::time::Instant::now() > deadline {
            break retry;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert!(retry.text().await.unwrap().starts_with("order 1: slow"));
    assert_eq!(handler.runs.load(Ordering::SeqCst), 1);

    // Replays are compressed for the caller that asks, and plain for one that does not.
    let first = post("k-gzip", "fast").send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let plain = first.bytes().await.unwrap();
    let gzipped = post("k-gzip", "fast")
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(gzipped.headers()["idempotent-replayed"], "true");
    assert_eq!(gzipped.headers()["content-encoding"], "gzip");
    assert_ne!(gzipped.bytes().await.unwrap(), plain);
    let again = post("k-gzip", "fast").send().await.unwrap();
    assert!(again.headers().get("content-encoding").is_none());
    assert_eq!(again.bytes().await.unwrap(), plain);
    assert_eq!(handler.runs.load(Ordering::SeqCst), 2);

    // A declared length over the limit never reaches the layer or the handler.
    let large = post("k-large", &"x".repeat(2048)).send().await.unwrap();
    assert_eq!(large.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(handler.runs.load(Ordering::SeqCst), 2);
}
