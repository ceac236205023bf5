//! Every provider's fixture (`testing::fixtures()`) behind the layer over real HTTP (axum on
//! 127.0.0.1:0, core's MemoryStore, reqwest): 20 identical deliveries at once run the handler
//! once (the other 19 get `409`), a retry is replayed byte for byte, the same signed bytes sent
//! to another spelling of the route's path are replayed (or refused, where the provider signs
//! the path), a delivery signed with the wrong key and a tampered one get a webhook problem and
//! never reach the handler, a new event runs it again, and no other method reaches the handler:
//! a signed delivery sent with a method the provider never uses is `405`, an unsigned request
//! with any method a webhook problem.
//! Last, the first delivery captured and re-sent with only its unsigned parts changed (a new
//! delivery id, Mailgun's event data) is refused without running the handler.
//!
//! Standard Webhooks is also run under Svix's header names and with Ed25519 (`v1a`) keys, by
//! two fixtures of this file.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use tower_idempotency_testkit::unix_now;

use axum::{extract::State, routing::any, Router};
use base64::{engine::general_purpose::STANDARD as BASE64, Engine as _};
use http::{Extensions, Method};
use tokio::sync::{mpsc, Semaphore};
use tower_idempotency_core::{IdempotencyLayer, MemoryStore};
use tower_idempotency_testkit::serve;
use tower_idempotency_webhooks::{
    standard,
    testing::{self, Delivery, Event, Fixture, Outcome, Recapture, Signer, PATH},
    VerifiedWebhook, Verifier, WebhookLayerExt,
};

const BURST: usize = 20;

struct Shared {
    calls: AtomicUsize,
    /// Signalled by each call as it starts.
    entered: tokio::sync::Notify,
    /// Closed during the burst so that every duplicate arrives while the first still runs.
    gate: Semaphore,
}

/// Counts every request that reaches it, verified or not: one that the layer let through
/// unverified would show up here.
async fn count(State(shared): State<Arc<Shared>>, extensions: Extensions) -> String {
    let n = shared.calls.fetch_add(1, Ordering::SeqCst) + 1;
    shared.entered.notify_one();
    drop(shared.gate.acquire().await.unwrap());
    match extensions.get::<VerifiedWebhook>() {
        Some(webhook) => format!(
            "{} handled {} (call {n})",
            webhook.provider(),
            webhook.event_id()
        ),
        None => format!("unverified (call {n})"),
    }
}

/// The route every fixture is mounted on; deliveries go to [`PATH`].
const ROUTE: &str = "/hook/{account}";
/// Another spelling of [`PATH`]: the same route and the same `Path` value.
const PATH_VARIANT: &str = "/hook/acct_%31";

/// The next burst answer; a timeout rather than a hang if the layer made a duplicate wait.
async fn next(rx: &mut mpsc::UnboundedReceiver<reqwest::Response>) -> reqwest::Response {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("no answer within 10 s")
        .unwrap()
}

/// One fixture's server, its client and its handler's counters.
struct Harness<'f> {
    fixture: &'f dyn Fixture,
    shared: Arc<Shared>,
    base: String,
    client: reqwest::Client,
}

impl<'f> Harness<'f> {
    async fn start(fixture: &'f dyn Fixture) -> Self {
        let shared = Arc::new(Shared {
            calls: AtomicUsize::new(0),
            entered: tokio::sync::Notify::new(),
            gate: Semaphore::new(0),
        });
        let app = Router::new()
            .route(ROUTE, any(count))
            .route_layer(IdempotencyLayer::webhook(
                fixture.verifier(),
                MemoryStore::new(),
            ))
            .with_state(shared.clone());
        Self {
            fixture,
            shared,
            base: serve(app).await,
            client: reqwest::Client::new(),
        }
    }

    fn provider(&self) -> &'static str {
        self.fixture.provider()
    }

    fn calls(&self) -> usize {
        self.shared.calls.load(Ordering::SeqCst)
    }

    fn event(&self, n: u32) -> Event {
        let id = format!("{}-e2e-{n}", self.provider().replace('-', "_"));
        self.fixture.event(&id, unix_now())
    }

    fn deliver(&self, signer: Signer, signed: &Event, sent: &Event) -> Delivery {
        self.fixture.deliver(signer, signed, sent, unix_now())
    }

    fn send_to(
        &self,
        method: Method,
        path: &str,
        delivery: Delivery,
    ) -> impl std::future::Future<Output = reqwest::Response> + Send + 'static {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .body(delivery.body);
        if !delivery
            .headers
            .iter()
            .any(|(name, _)| *name == "content-type")
        {
            request = request.header("content-type", "application/json");
        }
        let request = delivery
            .headers
            .into_iter()
            .fold(request, |r, (name, value)| r.header(name, value));
        async move { request.send().await.unwrap() }
    }

    fn send(
        &self,
        delivery: Delivery,
    ) -> impl std::future::Future<Output = reqwest::Response> + Send + 'static {
        self.send_to(Method::POST, PATH, delivery)
    }

    /// What the handler answers for `event` on its `call`-th run.
    fn expected(&self, event: &Event, delivery: &Delivery, call: usize) -> String {
        let key = self.fixture.key(event, delivery);
        format!("{} handled {key} (call {call})", self.provider())
    }
}

/// The problem `type` of `response`, after asserting it is `application/problem+json`.
async fn problem_type(response: reqwest::Response, context: &str) -> String {
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json",
        "{context}"
    );
    let problem: serde_json::Value =
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    problem["type"].as_str().unwrap_or_default().to_owned()
}

/// Asserts a webhook problem (`application/problem+json`, a `webhook-` type).
async fn assert_webhook_problem(response: reqwest::Response, context: &str) {
    assert!(response.status().is_client_error(), "{context}");
    let kind = problem_type(response, context).await;
    assert!(
        kind.starts_with("urn:tower-idempotency:problem:webhook-"),
        "{context}: {kind}"
    );
}

async fn exercise(fixture: &dyn Fixture) {
    let h = Harness::start(fixture).await;
    let (first, second) = (h.event(1), h.event(2));
    let winner = burst(&h, &first).await;
    retries(&h, &first, &winner).await;
    forgeries(&h, &first, &second).await;
    let delivery = h.deliver(Signer::Genuine, &second, &second);
    let fresh = h.send(delivery.clone()).await;
    assert_eq!(fresh.status(), 200, "{}", h.provider());
    assert_eq!(
        fresh.text().await.unwrap(),
        h.expected(&second, &delivery, 2)
    );
    other_methods(&h).await;
    recaptured(&h, &first).await;
}

/// 20 identical deliveries at once: one runs, the others get `409`. Returns the winner's body.
async fn burst(h: &Harness<'_>, first: &Event) -> bytes::Bytes {
    let delivery = h.deliver(Signer::Genuine, first, first);
    let (tx, mut rx) = mpsc::unbounded_channel();
    for _ in 0..BURST {
        let (tx, pending) = (tx.clone(), h.send(delivery.clone()));
        tokio::spawn(async move { tx.send(pending.await).unwrap() });
    }
    for _ in 1..BURST {
        let response = next(&mut rx).await;
        assert_eq!(
            response.status(),
            409,
            "{}: in-flight duplicate",
            h.provider()
        );
    }
    // The winner's claim answered the others before its handler necessarily started.
    tokio::time::timeout(Duration::from_secs(10), h.shared.entered.notified())
        .await
        .expect("the winner's handler did not start within 10 s");
    assert_eq!(h.calls(), 1, "{}", h.provider());
    h.shared.gate.add_permits(1000);
    let winner = next(&mut rx).await;
    assert_eq!(winner.status(), 200, "{}", h.provider());
    assert!(winner.headers().get("idempotent-replayed").is_none());
    let winner = winner.bytes().await.unwrap();
    assert_eq!(winner, h.expected(first, &delivery, 1).as_bytes());
    winner
}

/// The provider's retry, signed afresh, is replayed; so are the same signed bytes at another
/// spelling of the path (the same route and `Path` value), unless the signature covers the path.
async fn retries(h: &Harness<'_>, first: &Event, winner: &bytes::Bytes) {
    let retry = h.send(h.deliver(Signer::Genuine, first, first)).await;
    assert_eq!(retry.status(), 200, "{}", h.provider());
    assert_eq!(
        retry.headers()["idempotent-replayed"],
        "true",
        "{}",
        h.provider()
    );
    assert_eq!(&retry.bytes().await.unwrap(), winner);

    let delivery = h.deliver(Signer::Genuine, first, first);
    let respelled = h.send_to(Method::POST, PATH_VARIANT, delivery).await;
    let context = format!("{} at {PATH_VARIANT}", h.provider());
    if h.fixture.signs_path() {
        assert_eq!(respelled.status(), 401, "{context}");
    } else {
        assert_eq!(respelled.status(), 200, "{context}");
        assert_eq!(
            respelled.headers()["idempotent-replayed"],
            "true",
            "{context}"
        );
        assert_eq!(&respelled.bytes().await.unwrap(), winner, "{context}");
    }
    assert_eq!(h.calls(), 1, "{context}");
}

/// Forgeries of a new event: were one let through, it would run the handler.
async fn forgeries(h: &Harness<'_>, first: &Event, second: &Event) {
    let mut forgeries = vec![("wrong key", h.deliver(Signer::Attacker, second, second))];
    if h.fixture.detects_tampering() {
        forgeries.push(("tampered", h.deliver(Signer::Genuine, first, second)));
    }
    for (what, forged) in forgeries {
        let context = format!("{} {what}", h.provider());
        assert_webhook_problem(h.send(forged).await, &context).await;
    }
    assert_eq!(h.calls(), 1, "{}: a forgery ran the handler", h.provider());
}

/// Every other method: a genuinely signed new event is `405` where the provider never sends
/// that method, and an unsigned request (a query a handler could read) is a webhook problem.
async fn other_methods(h: &Harness<'_>) {
    let third = h.event(3);
    for method in [Method::GET, Method::PUT, Method::DELETE, Method::PATCH] {
        let context = format!("{} {method}", h.provider());
        if !h.fixture.other_methods().contains(&method) {
            let signed = h.deliver(Signer::Genuine, &third, &third);
            let response = h.send_to(method.clone(), PATH, signed).await;
            assert_eq!(response.status(), 405, "{context} signed");
            assert_eq!(
                response.headers()["content-type"],
                "application/problem+json",
                "{context} signed"
            );
        }
        let unsigned = Delivery::new(Vec::new(), String::new());
        let path = format!("{PATH}?CallSid=CA1&MessageSid=SM1&id={}", third.id);
        let response = h.send_to(method.clone(), &path, unsigned).await;
        let status = response.status();
        assert!(status.is_client_error(), "{context} unsigned: {status}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json",
            "{context} unsigned"
        );
    }
    assert_eq!(
        h.calls(),
        2,
        "{}: a request with another method reached the handler",
        h.provider()
    );
}

/// Someone holding the first delivery re-sends it so that it names a third event.
async fn recaptured(h: &Harness<'_>, first: &Event) {
    let captured = h.deliver(Signer::Genuine, first, first);
    let third = h.event(3);
    let (resent, outcome) = match h.fixture.recapture() {
        Recapture::Signed => return,
        Recapture::Header(name, outcome) => {
            assert!(captured.header(name).is_some(), "the key header is sent");
            (captured.with(name, third.id.clone()), outcome)
        }
        Recapture::Custom(rewrite, outcome) => (rewrite(&captured, &third), outcome),
    };
    let response = h.send(resent).await;
    let context = format!("{}: captured delivery under a new key", h.provider());
    match outcome {
        Outcome::Refused(kind) => {
            assert_eq!(response.status(), 401, "{context}");
            assert_eq!(
                problem_type(response, &context).await,
                format!("urn:tower-idempotency:problem:{kind}"),
                "{context}"
            );
            assert_eq!(h.calls(), 2, "{context} ran");
        }
        Outcome::Runs => {
            assert_eq!(response.status(), 200, "{context}");
            assert_eq!(h.calls(), 3, "{context}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_provider_fixture() {
    let fixtures = testing::fixtures();
    // Every shipped provider: the default features build all of them.
    assert!(fixtures.len() >= 14, "{} fixtures", fixtures.len());
    for fixture in &fixtures {
        exercise(fixture.as_ref()).await;
    }
}

/// Standard Webhooks `v1` (HMAC) under Svix's header names: the Standard Webhooks fixture, its
/// deliveries carrying `svix-id`, `svix-timestamp` and `svix-signature`.
struct SvixHeaders(Box<dyn Fixture>);

impl Fixture for SvixHeaders {
    fn provider(&self) -> &'static str {
        self.0.provider()
    }

    fn verifier(&self) -> Arc<dyn Verifier> {
        self.0.verifier()
    }

    fn event(&self, id: &str, now: u64) -> Event {
        self.0.event(id, now)
    }

    fn deliver(&self, signer: Signer, signed: &Event, sent: &Event, now: u64) -> Delivery {
        let mut delivery = self.0.deliver(signer, signed, sent, now);
        for (name, _) in &mut delivery.headers {
            *name = match *name {
                "webhook-id" => "svix-id",
                "webhook-timestamp" => "svix-timestamp",
                "webhook-signature" => "svix-signature",
                other => panic!("a Standard Webhooks delivery with {other}"),
            };
        }
        delivery
    }

    fn signature_header(&self) -> Option<&'static str> {
        Some("svix-signature")
    }

    fn secret_forms(&self) -> Vec<String> {
        self.0.secret_forms()
    }

    fn recapture(&self) -> Recapture {
        Recapture::Header("svix-id", Outcome::Refused("webhook-signature-mismatch"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_webhooks_v1_under_svix_headers() {
    exercise(&SvixHeaders(testing::fixture(standard::PROVIDER))).await;
}

/// Standard Webhooks `v1a`: Ed25519 signatures checked against a `whpk_` public key.
struct Ed25519Keys;

impl Ed25519Keys {
    fn key(signer: Signer) -> ed25519_dalek::SigningKey {
        ed25519_dalek::SigningKey::from_bytes(&testing::key_seed(signer))
    }
}

impl Fixture for Ed25519Keys {
    fn provider(&self) -> &'static str {
        standard::PROVIDER
    }

    fn verifier(&self) -> Arc<dyn Verifier> {
        let public = Self::key(Signer::Genuine).verifying_key();
        let public = format!("whpk_{}", BASE64.encode(public.as_bytes()));
        Arc::new(standard::StandardWebhooksVerifier::from_public_keys([public]).unwrap())
    }

    fn event(&self, id: &str, now: u64) -> Event {
        testing::fixture(standard::PROVIDER).event(id, now)
    }

    fn deliver(&self, signer: Signer, signed: &Event, sent: &Event, now: u64) -> Delivery {
        use ed25519_dalek::Signer as _;
        let message = format!("{}.{now}.{}", signed.id, signed.body);
        let signature = Self::key(signer).sign(message.as_bytes());
        let headers = vec![
            ("webhook-id", sent.id.clone()),
            ("webhook-timestamp", now.to_string()),
            (
                "webhook-signature",
                format!("v1a,{}", BASE64.encode(signature.to_bytes())),
            ),
        ];
        Delivery::new(headers, sent.body.clone())
    }

    fn signature_header(&self) -> Option<&'static str> {
        Some("webhook-signature")
    }

    fn secret_forms(&self) -> Vec<String> {
        Vec::new()
    }

    fn recapture(&self) -> Recapture {
        Recapture::Header("webhook-id", Outcome::Refused("webhook-signature-mismatch"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_webhooks_v1a_ed25519() {
    exercise(&Ed25519Keys).await;
}
