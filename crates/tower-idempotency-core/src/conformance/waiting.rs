//! Checks of `wait_for_result` over real HTTP: waiting duplicates get the one result, run once
//! after a release, and stop at `max_wait` or when their caller leaves.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::{routing::post, Router};
use bytes::Bytes;
use http::StatusCode;

use super::{
    fresh_key, random_u64,
    server::{concurrent_posts, until, Server},
    MAX_WAIT,
};
use crate::{store::Store, IdempotencyLayer};

/// What the handler of [`serve_waiting`] does on its first execution (later ones sleep
/// [`WAITED_WORK`] and answer `201`).
#[derive(Clone)]
pub(super) enum First {
    /// Sleeps [`WAITED_WORK`] and answers `201`.
    Succeeds,
    /// Sleeps [`WAITED_WORK`] and answers `500`: the key is released.
    Fails,
    /// Signals `started`, waits for `gate`, answers `201`.
    Gated(Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>),
}

/// The simulated work of the handler behind [`serve_waiting`].
pub(super) const WAITED_WORK: Duration = Duration::from_millis(500);

/// The `max_wait` of the check that a wait ends at it.
const BOUNDED_WAIT: Duration = Duration::from_secs(3);

/// A test server: `POST /orders` behind a layer with `wait_for_result(max_wait)`, answering a
/// JSON body unique to each execution. Returns the layer too, to read its waiters.
pub(super) async fn serve_waiting(
    store: Arc<dyn Store>,
    executions: Arc<AtomicUsize>,
    max_wait: Duration,
    first: First,
) -> (Server, IdempotencyLayer) {
    let handler = {
        let executions = executions.clone();
        move || {
            let (executions, first) = (executions.clone(), first.clone());
            async move {
                let n = executions.fetch_add(1, Ordering::SeqCst);
                let status = match (n, first) {
                    (0, First::Gated(started, gate)) => {
                        started.notify_one();
                        gate.notified().await;
                        StatusCode::CREATED
                    }
                    (0, First::Fails) => {
                        tokio::time::sleep(WAITED_WORK).await;
                        StatusCode::INTERNAL_SERVER_ERROR
                    }
                    _ => {
                        tokio::time::sleep(WAITED_WORK).await;
                        StatusCode::CREATED
                    }
                };
                let id = format!("{:016x}{n}", random_u64());
                (status, serde_json::json!({ "order_id": id }).to_string())
            }
        }
    };
    let layer = IdempotencyLayer::client_keys(store)
        .namespace("conformance-http")
        .wait_for_result(max_wait);
    let app = Router::new()
        .route("/orders", post(handler))
        .route_layer(layer.clone());
    (Server::start(app, executions).await, layer)
}

/// Asserts that every answer is a `201` with one body, exactly one of them not a replay.
pub(super) fn one_result_for_all(answers: &[(StatusCode, bool, Bytes)]) {
    let first = &answers[0].2;
    for (status, _, body) in answers {
        assert_eq!(
            *status,
            StatusCode::CREATED,
            "no 409 while waiting: {body:?}"
        );
        assert_eq!(body, first, "every caller gets the one result");
    }
    let executed = answers.iter().filter(|(_, replayed, _)| !replayed).count();
    assert_eq!(
        executed, 1,
        "exactly one caller is served by the handler itself"
    );
}

/// Over real HTTP, with `wait_for_result`: 25 concurrent identical POSTs to a handler taking
/// 500 ms run it once, and all 25 get its `201` and body: no `409`. Nobody waits afterwards.
pub async fn waiting_duplicates_get_the_result_over_http(store: Arc<dyn Store>) {
    let executions = Arc::new(AtomicUsize::new(0));
    let (server, layer) = serve_waiting(store, executions, MAX_WAIT, First::Succeeds).await;
    let answers = server.concurrent_posts(&fresh_key("wait")).await;
    one_result_for_all(&answers);
    assert_eq!(server.executions.load(Ordering::SeqCst), 1);
    assert_eq!(layer.waiting(), 0);
}

/// Over real HTTP, with `wait_for_result`: the first execution answers `500` (the key is
/// released); exactly one waiter claims the key and runs the handler, the other 23 get its
/// `201` and body.
pub async fn waiting_duplicates_run_once_after_a_release_over_http(store: Arc<dyn Store>) {
    let executions = Arc::new(AtomicUsize::new(0));
    let (server, layer) = serve_waiting(store, executions, MAX_WAIT, First::Fails).await;
    let answers = server.concurrent_posts(&fresh_key("wait-release")).await;
    let (failed, succeeded): (Vec<_>, Vec<_>) = answers
        .into_iter()
        .partition(|(status, _, _)| *status == StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.len(), 1, "only the first execution fails");
    one_result_for_all(&succeeded);
    assert_eq!(
        server.executions.load(Ordering::SeqCst),
        2,
        "the failed run, then exactly one waiter's"
    );
    assert_eq!(layer.waiting(), 0);
}

/// Over real HTTP, with `wait_for_result`: a duplicate waiting past `max_wait` gets the `409`
/// with a `Retry-After`; a waiting duplicate whose caller disconnects stops waiting and leaves
/// nothing behind; the first request then completes and is replayed, run once.
pub async fn waiting_ends_at_max_wait_or_disconnect_over_http(store: Arc<dyn Store>) {
    let started = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Notify::new());
    let executions = Arc::new(AtomicUsize::new(0));
    let first = First::Gated(started.clone(), gate.clone());
    // The wait that ends in a 409 is what this checks; it is still a few seconds long, so that
    // the waiting duplicate below is seen waiting (polled) before its wait ends on a loaded machine.
    let (server, layer) = serve_waiting(store, executions, BOUNDED_WAIT, first).await;
    let client = reqwest::Client::new();
    let key = fresh_key("wait-bounds");
    let post = |client: &reqwest::Client| {
        client
            .post(&server.url)
            .header("idempotency-key", &key)
            .body("{}")
            .send()
    };
    let holder = tokio::spawn(post(&client));
    started.notified().await;

    let late = post(&client).await.expect("duplicate");
    assert_eq!(late.status(), StatusCode::CONFLICT, "past max_wait: 409");
    assert!(late.headers().contains_key("retry-after"));
    assert_eq!(layer.waiting(), 0);

    // A caller that goes away while its request waits: its own client, dropped with the task.
    let leaving = tokio::spawn(post(&reqwest::Client::new()));
    until("the duplicate waits", || layer.waiting() == 1).await;
    leaving.abort();
    let _ = leaving.await;
    until("the abandoned wait is gone", || layer.waiting() == 0).await;

    gate.notify_one();
    let first = holder.await.expect("task").expect("first request");
    assert_eq!(first.status(), StatusCode::CREATED);
    let retry = post(&client).await.expect("retry");
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(server.executions.load(Ordering::SeqCst), 1);
    assert_eq!(layer.waiting(), 0);
}

/// Two application instances (see [`two_instances_over_http`](super::two_instances_over_http))
/// with `wait_for_result`: 25 concurrent identical POSTs spread over both run the handler once
/// and all get its `201`. The waiters on the instance not running it learn the result from the
/// store's notices ([`Store::settlements`]) or, for a store without them, by claiming again on
/// their timer; [`waiting_across_instances_is_notified_over_http`] tells the two apart.
///
/// [`waiting_across_instances_is_notified_over_http`]:
///     super::waiting_across_instances_is_notified_over_http
pub async fn waiting_across_instances_over_http(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let executions = Arc::new(AtomicUsize::new(0));
    let wait = MAX_WAIT;
    let (one, _) = serve_waiting(a, executions.clone(), wait, First::Succeeds).await;
    let (two, _) = serve_waiting(b, executions.clone(), wait, First::Succeeds).await;
    let client = reqwest::Client::new();
    let urls = [one.url.clone(), two.url.clone()];
    let answers = concurrent_posts(&client, &urls, &fresh_key("wait-two")).await;
    one_result_for_all(&answers);
    assert_eq!(executions.load(Ordering::SeqCst), 1);
}
