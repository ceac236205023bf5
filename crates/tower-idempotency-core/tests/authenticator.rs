//! The [`Authenticator`] check over real HTTP (axum on 127.0.0.1:0, reqwest, the memory store):
//! one credential under many keys at once runs the handler once, the same credential under its
//! own key is replayed, a refused key is not left claimed, one delivery may reach two routes of
//! one namespace, and a failing record fails closed.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::{extract::State, http::HeaderMap, routing::post, Router};
use bytes::Bytes;
use http::request::Parts;
use tokio::sync::{mpsc, Semaphore};
use tower_idempotency_core::{
    Authenticator, IdempotencyLayer, KeySource, MemoryStore, Problem, Store, StoreError,
};
use tower_idempotency_testkit::{Call, Hooked, Hooks};

/// Keys by `x-key`; the credential is `x-sig`, which does not cover the key (like GitHub's
/// signature and `X-GitHub-Delivery`).
struct UnsignedKey;

impl KeySource for UnsignedKey {
    fn derive(&self, parts: &mut Parts, _body: &Bytes) -> Result<Option<String>, Problem> {
        let header = |name| parts.headers[name].to_str().unwrap().to_owned();
        let (key, signature) = (header("x-key"), header("x-sig"));
        parts
            .extensions
            .insert(Authenticator::digest("test", &[signature.as_bytes()]));
        Ok(Some(key))
    }
}

struct Shared {
    calls: AtomicUsize,
    gate: Semaphore,
}

async fn handler(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> String {
    shared.calls.fetch_add(1, Ordering::SeqCst);
    drop(shared.gate.acquire().await.unwrap());
    format!("ran {}", headers["x-key"].to_str().unwrap())
}

async fn serve(store: impl Store) -> (String, Arc<Shared>) {
    let shared = Arc::new(Shared {
        calls: AtomicUsize::new(0),
        gate: Semaphore::new(0),
    });
    let app = Router::new()
        .route("/hook", post(handler))
        .route("/other-hook", post(handler))
        .route_layer(IdempotencyLayer::new(UnsignedKey, store).namespace("signed"))
        .with_state(shared.clone());
    let base = tower_idempotency_testkit::serve(app).await;
    (format!("{base}/hook"), shared)
}

fn send(client: &reqwest::Client, url: &str, key: &str, sig: &str) -> reqwest::RequestBuilder {
    client
        .post(url)
        .header("x-key", key)
        .header("x-sig", sig)
        .body("{}")
}

async fn problem_type(response: reqwest::Response) -> String {
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: serde_json::Value =
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    problem["type"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_signature_under_many_keys_at_once_runs_once() {
    const N: usize = 20;
    let (url, shared) = serve(MemoryStore::new()).await;
    let client = reqwest::Client::new();
    let (tx, mut rx) = mpsc::unbounded_channel();
    for n in 0..N {
        let (tx, pending) = (
            tx.clone(),
            send(&client, &url, &format!("k{n}"), "sig-1").send(),
        );
        tokio::spawn(async move { tx.send(pending.await.unwrap()).unwrap() });
    }
    // The winner waits at the gate: every other answer arrives while it runs.
    for _ in 1..N {
        let response = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("an answer within 10 s")
            .unwrap();
        assert_eq!(response.status(), 401);
        assert_eq!(
            problem_type(response).await,
            "urn:tower-idempotency:problem:replayed-signature"
        );
    }
    assert_eq!(shared.calls.load(Ordering::SeqCst), 1);
    shared.gate.add_permits(100);
    let winner = rx.recv().await.unwrap();
    assert_eq!(winner.status(), 200);
    let winner = winner.text().await.unwrap();
    let key = winner.strip_prefix("ran ").unwrap().to_owned();

    // The same credential under its own key: a retry, replayed.
    let retry = send(&client, &url, &key, "sig-1").send().await.unwrap();
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.text().await.unwrap(), winner);

    // A refused key was released, not left claimed: with a credential of its own it runs.
    let refused = if key == "k0" { "k1" } else { "k0" };
    let own = send(&client, &url, refused, "sig-2").send().await.unwrap();
    assert_eq!(own.status(), 200);
    assert!(own.headers().get("idempotent-replayed").is_none());
    assert_eq!(own.text().await.unwrap(), format!("ran {refused}"));
    assert_eq!(shared.calls.load(Ordering::SeqCst), 2);
}

/// Hooks failing the claims of authenticator records while `fail` is set.
struct FailingRecords {
    fail: AtomicBool,
}

#[async_trait::async_trait]
impl Hooks for FailingRecords {
    async fn before(&self, call: Call, key: &str) -> Result<(), StoreError> {
        if call == Call::Claim && key.contains(".auth:") && self.fail.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("injected".into()));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_record_fails_closed_and_releases_the_key() {
    let store = Arc::new(Hooked::wrap(
        MemoryStore::new(),
        FailingRecords {
            fail: AtomicBool::new(true),
        },
    ));
    let (url, shared) = serve(store.clone()).await;
    shared.gate.add_permits(100);
    let client = reqwest::Client::new();
    let failed = send(&client, &url, "k", "sig").send().await.unwrap();
    assert_eq!(failed.status(), 503);
    assert_eq!(
        problem_type(failed).await,
        "urn:tower-idempotency:problem:store-unavailable"
    );
    assert_eq!(shared.calls.load(Ordering::SeqCst), 0);

    // The key was released: the next attempt runs (a key left claimed would answer 409).
    store.hooks.fail.store(false, Ordering::SeqCst);
    let next = send(&client, &url, "k", "sig").send().await.unwrap();
    assert_eq!(next.status(), 200);
    assert_eq!(next.text().await.unwrap(), "ran k");
    assert_eq!(shared.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_delivery_to_two_routes_of_a_namespace_runs_on_each() {
    let (url, shared) = serve(MemoryStore::new()).await;
    shared.gate.add_permits(100);
    let client = reqwest::Client::new();
    let other = url.replace("/hook", "/other-hook");
    for url in [&url, &other] {
        let response = send(&client, url, "k", "sig").send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert!(response.headers().get("idempotent-replayed").is_none());
    }
    assert_eq!(shared.calls.load(Ordering::SeqCst), 2);
    // Under another key the credential is still refused, on either route.
    for url in [&url, &other] {
        let response = send(&client, url, "k2", "sig").send().await.unwrap();
        assert_eq!(response.status(), 401);
    }
    assert_eq!(shared.calls.load(Ordering::SeqCst), 2);
}

/// Hooks recording every key claimed, the layer's own and the authenticator records'.
#[derive(Default)]
struct ClaimedKeys {
    keys: std::sync::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl Hooks for ClaimedKeys {
    async fn before(&self, call: Call, key: &str) -> Result<(), StoreError> {
        let mut keys = self.keys.lock().unwrap();
        if call == Call::Claim && !keys.iter().any(|k| k == key) {
            keys.push(key.to_owned());
        }
        Ok(())
    }
}

impl ClaimedKeys {
    /// The first key and the first authenticator record claimed.
    fn first_pair(&self) -> (String, String) {
        let keys = self.keys.lock().unwrap();
        let find = |auth: bool| {
            keys.iter()
                .find(|k| k.contains(".auth:") == auth)
                .expect("a claimed key")
                .clone()
        };
        (find(false), find(true))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticated_deliveries_past_the_memory_bound_are_never_refused() {
    const DELIVERIES: usize = 200;
    let store = MemoryStore::new().with_max_entries(160);
    let store = Arc::new(Hooked::wrap(store, ClaimedKeys::default()));
    let (url, shared) = serve(store.clone()).await;
    shared.gate.add_permits(10_000);
    let client = reqwest::Client::new();
    for n in 0..DELIVERIES {
        let response = send(&client, &url, &format!("d{n}"), &format!("sig-{n}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "delivery {n} was refused");
    }
    assert_eq!(shared.calls.load(Ordering::SeqCst), DELIVERIES);
    assert!(store.store.evictions() > 0, "the bound was never reached");
    // The newest delivery is still held (evictions take the oldest): a retry replays it.
    let last = DELIVERIES - 1;
    let retry = send(&client, &url, &format!("d{last}"), &format!("sig-{last}"))
        .send()
        .await
        .unwrap();
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(shared.calls.load(Ordering::SeqCst), DELIVERIES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authenticator_record_is_settled_with_its_key_and_stands_in_for_a_lost_record() {
    let store = Arc::new(Hooked::wrap(MemoryStore::new(), ClaimedKeys::default()));
    let (url, shared) = serve(store.clone()).await;
    shared.gate.add_permits(100);
    let client = reqwest::Client::new();
    let first = send(&client, &url, "k", "sig").send().await.unwrap();
    assert_eq!(first.status(), 200);
    let (key_record, auth_record) = store.hooks.first_pair();

    // Settled with the key: completed with its status, no longer in flight.
    match store.store.get(&auth_record).await.unwrap() {
        Some(tower_idempotency_core::RecordState::Completed { record, .. }) => {
            assert_eq!(record.response.status, 200);
            assert!(record.response.body_omitted && record.response.body.is_empty());
        }
        other => panic!("the authenticator's record is {other:?}"),
    }

    // The key's own record is lost (as an eviction drops it): the retry is answered from the
    // authenticator's record, without running the handler again.
    assert!(store.store.forget(&key_record).await.unwrap());
    let retry = send(&client, &url, "k", "sig").send().await.unwrap();
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.headers()["idempotent-body-omitted"], "true");
    assert_eq!(shared.calls.load(Ordering::SeqCst), 1);
    // The key was not left claimed by that answer, and the credential is still refused
    // under another key.
    assert!(store.store.get(&key_record).await.unwrap().is_none());
    let other = send(&client, &url, "k2", "sig").send().await.unwrap();
    assert_eq!(other.status(), 401);
    assert_eq!(shared.calls.load(Ordering::SeqCst), 1);
}

/// Answers 500 (not cached, so the key is released) while `fail` is set.
async fn flaky(State(shared): State<Arc<(AtomicUsize, AtomicBool)>>) -> http::StatusCode {
    shared.0.fetch_add(1, Ordering::SeqCst);
    if shared.1.load(Ordering::SeqCst) {
        http::StatusCode::INTERNAL_SERVER_ERROR
    } else {
        http::StatusCode::OK
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_keys_authenticator_record_refuses_other_keys_but_lets_its_retry_run() {
    let store = Arc::new(Hooked::wrap(MemoryStore::new(), ClaimedKeys::default()));
    let shared = Arc::new((AtomicUsize::new(0), AtomicBool::new(true)));
    let app = Router::new()
        .route("/hook", post(flaky))
        .route_layer(IdempotencyLayer::new(UnsignedKey, store.clone()).namespace("signed"))
        .with_state(shared.clone());
    let url = format!("{}/hook", tower_idempotency_testkit::serve(app).await);
    let client = reqwest::Client::new();
    let failed = send(&client, &url, "k", "sig").send().await.unwrap();
    assert_eq!(failed.status(), 500);
    let (_, auth_record) = store.hooks.first_pair();
    // Not left in flight for the TTL: completed, holding no result.
    assert!(matches!(
        store.store.get(&auth_record).await.unwrap(),
        Some(tower_idempotency_core::RecordState::Completed { .. })
    ));
    let other = send(&client, &url, "k2", "sig").send().await.unwrap();
    assert_eq!(other.status(), 401);
    shared.1.store(false, Ordering::SeqCst);
    let retry = send(&client, &url, "k", "sig").send().await.unwrap();
    assert_eq!(retry.status(), 200);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(shared.0.load(Ordering::SeqCst), 2);
}
