//! Checks over real HTTP through the layer: concurrent duplicates run the handler once, on one
//! instance or two; a slow handler keeps its key; records over a store's limit.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::{extract::State, routing::post, Router};
use bytes::Bytes;
use http::StatusCode;

use super::{
    fresh_key, random_u64,
    server::{concurrent_posts, post_once, Server},
    SHORT_LEASE,
};
use crate::{store::Store, IdempotencyLayer};

async fn order(
    State(executions): State<Arc<AtomicUsize>>,
    body: Bytes,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let n = executions.fetch_add(1, Ordering::SeqCst);
    // Simulated work, so that concurrent duplicates overlap with the running handler.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let body = String::from_utf8_lossy(&body).into_owned();
    let id = format!("{:016x}{n}", random_u64());
    let json = serde_json::json!({ "order_id": id, "echo": body }).to_string();
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        json,
    )
}

async fn serve(store: Arc<dyn Store>, executions: Arc<AtomicUsize>) -> Server {
    let app = Router::new()
        .route("/orders", post(order))
        .route_layer(IdempotencyLayer::client_keys(store).namespace("conformance-http"))
        .with_state(executions.clone());
    Server::start(app, executions).await
}

/// One round of 25 concurrent identical POSTs spread over `urls`, then a retry: the handler runs
/// once, every caller gets its body or a `409`, and the retry replays it.
async fn round(client: &reqwest::Client, urls: &[String], executions: &AtomicUsize) {
    let key = fresh_key("http");
    let before = executions.load(Ordering::SeqCst);
    let answers = concurrent_posts(client, urls, &key).await;
    let mut first: Option<Bytes> = None;
    let mut executed = 0;
    for (status, replayed, body) in answers {
        match status.as_u16() {
            201 => {
                executed += usize::from(!replayed);
                match &first {
                    Some(first) => assert_eq!(&body, first, "every caller gets the first body"),
                    None => first = Some(body),
                }
            }
            409 => {}
            other => panic!("unexpected status {other}: {body:?}"),
        }
    }
    assert_eq!(
        executions.load(Ordering::SeqCst) - before,
        1,
        "the handler runs exactly once per round"
    );
    assert_eq!(
        executed, 1,
        "exactly one caller is served by the handler itself"
    );
    // A later retry is a byte-identical replay.
    let retry = client
        .post(&urls[0])
        .header("idempotency-key", &key)
        .body(r#"{"sku":"book","qty":1}"#)
        .send()
        .await
        .expect("retry");
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let body = retry.bytes().await.expect("body");
    if let Some(first) = first {
        assert_eq!(body, first);
    }
    assert_eq!(executions.load(Ordering::SeqCst) - before, 1);
}

/// Over real HTTP: 10 rounds of 25 concurrent identical POSTs run the handler exactly once per
/// round; every caller gets the first response (or `409` while it runs); a retry replays it.
pub async fn http_rounds_run_handler_once(store: Arc<dyn Store>) {
    let server = serve(store, Arc::new(AtomicUsize::new(0))).await;
    let client = reqwest::Client::new();
    for _ in 0..10 {
        round(
            &client,
            std::slice::from_ref(&server.url),
            &server.executions,
        )
        .await;
    }
}

/// Two application instances (two layers, two stores with separate pools or clients over one
/// backend) still run the handler exactly once per key.
pub async fn two_instances_over_http(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let executions = Arc::new(AtomicUsize::new(0));
    let (one, two) = (
        serve(a, executions.clone()).await,
        serve(b, executions.clone()).await,
    );
    let client = reqwest::Client::new();
    let urls = [one.url.clone(), two.url.clone()];
    for _ in 0..5 {
        round(&client, &urls, &executions).await;
    }
}

/// A test server: `POST /orders` behind a layer with a `SHORT_LEASE` (one second), answering `size` bytes;
/// with `gate`, the first execution signals `started` and waits for `gate` before answering.
async fn serve_gated(
    store: Arc<dyn Store>,
    size: usize,
    started: Arc<tokio::sync::Notify>,
    gate: Option<Arc<tokio::sync::Notify>>,
) -> Server {
    let executions = Arc::new(AtomicUsize::new(0));
    let handler = {
        let executions = executions.clone();
        move || {
            let (executions, started, gate) = (executions.clone(), started.clone(), gate.clone());
            async move {
                let n = executions.fetch_add(1, Ordering::SeqCst);
                if let (0, Some(gate)) = (n, gate) {
                    started.notify_one();
                    gate.notified().await;
                }
                (StatusCode::CREATED, vec![b'x'; size])
            }
        }
    };
    let layer = IdempotencyLayer::client_keys(store)
        .namespace("conformance-http")
        .lease(SHORT_LEASE);
    let app = Router::new()
        .route("/orders", post(handler))
        .route_layer(layer);
    Server::start(app, executions).await
}

/// Over real HTTP: a handler running for several lease lengths keeps its key. The layer renews
/// the one-second lease beside the handler; 10 concurrent duplicates sent after two lease lengths
/// all get `409`, the handler runs once, and a retry replays its response.
pub async fn slow_handler_keeps_its_key_over_http(store: Arc<dyn Store>) {
    let started = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Notify::new());
    let server = serve_gated(store, 16, started.clone(), Some(gate.clone())).await;
    let client = reqwest::Client::new();
    let key = fresh_key("slow");
    let first = tokio::spawn({
        let (client, url, key) = (client.clone(), server.url.clone(), key.clone());
        async move {
            post_once(&client, &url, &key, "first request")
                .await
                .status()
        }
    });
    started.notified().await;
    // Real time has to pass for the lease to lapse without renewals; no signal to await.
    tokio::time::sleep(SHORT_LEASE * 2).await;
    let duplicates: Vec<_> = (0..10)
        .map(|_| {
            let (client, url, key) = (client.clone(), server.url.clone(), key.clone());
            tokio::spawn(async move { post_once(&client, &url, &key, "duplicate").await.status() })
        })
        .collect();
    for duplicate in duplicates {
        assert_eq!(
            duplicate.await.expect("task"),
            StatusCode::CONFLICT,
            "the renewed lease still holds the key"
        );
    }
    gate.notify_one();
    assert_eq!(first.await.expect("task"), StatusCode::CREATED);
    let retry = post_once(&client, &server.url, &key, "retry").await;
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(server.executions.load(Ordering::SeqCst), 1);
}

/// Over real HTTP, for a store that refuses records over `limit` bytes (configure it so): a
/// response of twice `limit` is answered whole, completes the key without its body, and is
/// replayed (status, headers, `Idempotent-Body-Omitted: true`, empty body) after the lease,
/// never run a second time.
pub async fn records_over_the_store_limit_complete_without_body(
    store: Arc<dyn Store>,
    limit: usize,
) {
    let server = serve_gated(store, 2 * limit, Arc::default(), None).await;
    let client = reqwest::Client::new();
    let key = fresh_key("too-large");
    let first = post_once(&client, &server.url, &key, "first request").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(first.bytes().await.expect("body").len(), 2 * limit);
    // Past the lease: a replay then cannot be the answer to a request still in flight.
    tokio::time::sleep(SHORT_LEASE * 2).await;
    let retry = post_once(&client, &server.url, &key, "retry").await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.headers()["idempotent-body-omitted"], "true");
    assert!(retry.bytes().await.expect("body").is_empty());
    assert_eq!(server.executions.load(Ordering::SeqCst), 1);
}
