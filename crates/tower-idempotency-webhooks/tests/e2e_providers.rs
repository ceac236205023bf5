//! Every provider, through its `IdempotencyLayer` constructor over real HTTP (axum on
//! 127.0.0.1:0, core's MemoryStore, reqwest), driven by one table-driven helper: 20 identical
//! deliveries at once run the handler once (the other 19 get `409`), a retry is replayed byte
//! for byte, the same signed bytes sent to another spelling of the route's path are replayed
//! (or refused, where the provider signs the path), a delivery signed with the wrong key and a
//! tampered one get a webhook problem and never reach the handler, a new event runs it again,
//! and no other method reaches the handler: a signed delivery sent with a method the provider
//! never uses is `405`, an unsigned request with any method a webhook problem.
//! Last, the first delivery captured and re-sent with only its unsigned parts changed (a new
//! delivery id, Mailgun's event data) is refused without running the handler.

use std::{
    collections::hash_map::RandomState,
    hash::BuildHasher,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::{extract::State, routing::any, Router};
use base64::{engine::general_purpose::STANDARD as BASE64, Engine as _};
use http::{Extensions, Method};
use sha2::{Digest as _, Sha256};
use tokio::sync::{mpsc, Semaphore};
use tower_idempotency_core::{IdempotencyLayer, MemoryStore};
use tower_idempotency_testkit::serve;
use tower_idempotency_webhooks::{
    github, linear, mailgun, paddle, shopify, slack, square, standard, stripe, twilio, zoom,
    VerifiedWebhook, WebhookLayerExt,
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

/// The route every case is mounted on, and the path deliveries are sent to.
const ROUTE: &str = "/hook/{account}";
const PATH: &str = "/hook/acct_1";
/// Another spelling of [`PATH`]: the same route and the same `Path` value.
const PATH_VARIANT: &str = "/hook/acct_%31";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// 32 bytes that differ on every call and every run: std's `RandomState` is seeded from the
/// OS, so asymmetric test keys are fresh without an RNG dependency.
fn seed() -> [u8; 32] {
    let state = RandomState::new();
    let words = [state.hash_one(0u8), state.hash_one(1u8)];
    Sha256::digest(format!("{words:?}")).into()
}

/// One event: its id and the body the provider would send (before any in-body signature).
struct Msg {
    id: String,
    body: String,
}

/// Headers and body of one HTTP delivery.
#[derive(Clone)]
struct Delivery(Vec<(&'static str, String)>, String);

/// `make(genuine, signed, sent)`: a delivery of `sent`, carrying a signature over `signed` made
/// with the real key (`genuine`) or an attacker's. `signed != sent` is a tampered delivery.
type Make = Box<dyn Fn(bool, &Msg, &Msg) -> Delivery>;

/// What the idempotency key of a delivery is.
#[derive(Clone, Copy)]
enum Key {
    /// The id the provider sends.
    EventId,
    /// `sha256:<hex>` of the body.
    BodyDigest,
    /// `sha256:<hex>` of what Twilio signed: the URL, then the form parameters sorted.
    TwilioSigned,
}

struct Case {
    provider: &'static str,
    layer: IdempotencyLayer,
    body: fn(&str) -> String,
    make: Make,
    key: Key,
    /// False where the provider's credential does not cover the body (GitLab's bare token).
    detects_tampering: bool,
    /// The captured first delivery made to name another event without re-signing it.
    recapture: Recapture,
    /// The signature covers the request's path (Twilio, Square): bytes signed for [`PATH`]
    /// are refused at [`PATH_VARIANT`] rather than replayed.
    signs_path: bool,
    /// Methods besides `POST` the provider sends deliveries with.
    other_methods: &'static [Method],
}

/// How a captured delivery can be re-sent under another key without a new signature, and what
/// that must get. Every case states it, so a new provider is checked by default.
enum Recapture {
    /// The key is read from this header; the re-send changes only its value.
    Header(&'static str, Expect),
    /// `(captured delivery, other event) -> re-send`, changing only what is not signed.
    Custom(Rewrite, Expect),
    /// Everything the key is made of is signed: a change is the tampered delivery, checked above.
    Signed,
}

/// `(captured delivery, other event) -> re-send`.
type Rewrite = Box<dyn Fn(&Delivery, &Msg) -> Delivery>;

/// What a re-sent capture gets.
enum Expect {
    /// `401` with this problem type (the suffix after `urn:tower-idempotency:problem:`); the
    /// handler does not run.
    Refused(&'static str),
    /// The handler runs again: the provider's credential does not bind the delivery.
    Runs,
}

/// The problem type of a captured signature re-sent under another key.
const REPLAYED: Expect = Expect::Refused("replayed-signature");

/// The next burst answer; a timeout rather than a hang if the layer made a duplicate wait.
async fn next(rx: &mut mpsc::UnboundedReceiver<reqwest::Response>) -> reqwest::Response {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("no answer within 10 s")
        .unwrap()
}

async fn exercise(case: Case) {
    let shared = Arc::new(Shared {
        calls: AtomicUsize::new(0),
        entered: tokio::sync::Notify::new(),
        gate: Semaphore::new(0),
    });
    let app = Router::new()
        .route(ROUTE, any(count))
        .route_layer(case.layer)
        .with_state(shared.clone());
    let base = serve(app).await;
    let client = reqwest::Client::new();
    let send_to = |method: Method, path: &str, Delivery(headers, body): Delivery| {
        let mut request = client.request(method, format!("{base}{path}")).body(body);
        if !headers.iter().any(|(name, _)| *name == "content-type") {
            request = request.header("content-type", "application/json");
        }
        headers
            .into_iter()
            .fold(request, |r, (name, value)| r.header(name, value))
            .send()
    };
    let send = |delivery: Delivery| send_to(Method::POST, PATH, delivery);
    let msg = |n: u32| {
        let id = format!("{}-e2e-{n}", case.provider.replace('-', "_"));
        Msg {
            body: (case.body)(&id),
            id,
        }
    };
    let (first, second) = (msg(1), msg(2));
    let expected = |msg: &Msg, delivery: &Delivery, call: usize| {
        let key = match case.key {
            Key::EventId => msg.id.clone(),
            Key::BodyDigest => format!("sha256:{}", hex::encode(Sha256::digest(&delivery.1))),
            Key::TwilioSigned => {
                let mut params = form_params(&delivery.1);
                params.sort_unstable();
                let signed: String = params.concat();
                let url = format!("{TWILIO_URL}{PATH}{signed}");
                format!("sha256:{}", hex::encode(Sha256::digest(url)))
            }
        };
        format!("{} handled {key} (call {call})", case.provider)
    };
    let delivery = (case.make)(true, &first, &first);
    let (tx, mut rx) = mpsc::unbounded_channel();
    for _ in 0..BURST {
        let (tx, pending) = (tx.clone(), send(delivery.clone()));
        tokio::spawn(async move { tx.send(pending.await.unwrap()).unwrap() });
    }
    for _ in 1..BURST {
        let response = next(&mut rx).await;
        assert_eq!(
            response.status(),
            409,
            "{}: in-flight duplicate",
            case.provider
        );
    }
    // The winner's claim answered the others before its handler necessarily started.
    tokio::time::timeout(Duration::from_secs(10), shared.entered.notified())
        .await
        .expect("the winner's handler did not start within 10 s");
    assert_eq!(shared.calls.load(Ordering::SeqCst), 1, "{}", case.provider);
    shared.gate.add_permits(1000);
    let winner = next(&mut rx).await;
    assert_eq!(winner.status(), 200, "{}", case.provider);
    assert!(winner.headers().get("idempotent-replayed").is_none());
    let winner = winner.bytes().await.unwrap();
    assert_eq!(winner, expected(&first, &delivery, 1).as_bytes());

    // The provider's retry, signed afresh.
    let retry = send((case.make)(true, &first, &first)).await.unwrap();
    assert_eq!(retry.status(), 200, "{}", case.provider);
    assert_eq!(
        retry.headers()["idempotent-replayed"],
        "true",
        "{}",
        case.provider
    );
    assert_eq!(retry.bytes().await.unwrap(), winner);

    // The same signed bytes at another spelling of the path: the same route and `Path` value,
    // so the same event. Replayed, or refused where the signature covers the path.
    let respelled = send_to(
        Method::POST,
        PATH_VARIANT,
        (case.make)(true, &first, &first),
    )
    .await
    .unwrap();
    let context = format!("{} at {PATH_VARIANT}", case.provider);
    if case.signs_path {
        assert_eq!(respelled.status(), 401, "{context}");
    } else {
        assert_eq!(respelled.status(), 200, "{context}");
        assert_eq!(
            respelled.headers()["idempotent-replayed"],
            "true",
            "{context}"
        );
        assert_eq!(respelled.bytes().await.unwrap(), winner, "{context}");
    }
    assert_eq!(shared.calls.load(Ordering::SeqCst), 1, "{context}");

    // Forgeries of a new event: were one let through, it would run the handler.
    let mut forgeries = vec![("wrong key", (case.make)(false, &second, &second))];
    if case.detects_tampering {
        forgeries.push(("tampered", (case.make)(true, &first, &second)));
    }
    for (what, forged) in forgeries {
        let response = send(forged).await.unwrap();
        let context = format!("{} {what}", case.provider);
        assert!(response.status().is_client_error(), "{context}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json",
            "{context}"
        );
        let problem: serde_json::Value =
            serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        let kind = problem["type"].as_str().unwrap_or_default();
        assert!(
            kind.starts_with("urn:tower-idempotency:problem:webhook-"),
            "{context}: {kind}"
        );
    }
    assert_eq!(
        shared.calls.load(Ordering::SeqCst),
        1,
        "{}: a forgery ran the handler",
        case.provider
    );

    let delivery = (case.make)(true, &second, &second);
    let fresh = send(delivery.clone()).await.unwrap();
    assert_eq!(fresh.status(), 200, "{}", case.provider);
    assert_eq!(fresh.text().await.unwrap(), expected(&second, &delivery, 2));

    // Every other method: a genuinely signed new event is `405` where the provider never sends
    // that method, and an unsigned request (a query a handler could read) is a webhook problem.
    let third = msg(3);
    for method in [Method::GET, Method::PUT, Method::DELETE, Method::PATCH] {
        let context = format!("{} {method}", case.provider);
        if !case.other_methods.contains(&method) {
            let signed = send_to(method.clone(), PATH, (case.make)(true, &third, &third));
            let response = signed.await.unwrap();
            assert_eq!(response.status(), 405, "{context} signed");
            assert_eq!(
                response.headers()["content-type"],
                "application/problem+json",
                "{context} signed"
            );
        }
        let unsigned = Delivery(Vec::new(), String::new());
        let path = format!("{PATH}?CallSid=CA1&MessageSid=SM1&id={}", third.id);
        let response = send_to(method.clone(), &path, unsigned).await.unwrap();
        assert!(
            response.status().is_client_error(),
            "{context} unsigned: {}",
            response.status()
        );
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json",
            "{context} unsigned"
        );
    }
    assert_eq!(
        shared.calls.load(Ordering::SeqCst),
        2,
        "{}: a request with another method reached the handler",
        case.provider
    );
    // Someone holding the first delivery re-sends it so that it names a third event.
    let captured = (case.make)(true, &first, &first);
    let third = msg(3);
    let (resent, expect) = match &case.recapture {
        Recapture::Signed => return,
        Recapture::Header(name, expect) => {
            let Delivery(mut headers, body) = captured;
            let header = headers.iter_mut().find(|(n, _)| n == name);
            header.expect("the key header is in the delivery").1 = third.id.clone();
            (Delivery(headers, body), expect)
        }
        Recapture::Custom(change, expect) => (change(&captured, &third), expect),
    };
    let response = send(resent).await.unwrap();
    let context = format!("{}: captured delivery under a new key", case.provider);
    match expect {
        Expect::Refused(kind) => {
            assert_eq!(response.status(), 401, "{context}");
            assert_eq!(
                response.headers()["content-type"],
                "application/problem+json",
                "{context}"
            );
            let problem: serde_json::Value =
                serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
            assert_eq!(
                problem["type"],
                format!("urn:tower-idempotency:problem:{kind}"),
                "{context}"
            );
            assert_eq!(shared.calls.load(Ordering::SeqCst), 2, "{context} ran");
        }
        Expect::Runs => {
            assert_eq!(response.status(), 200, "{context}");
            assert_eq!(shared.calls.load(Ordering::SeqCst), 3, "{context}");
        }
    }
}

/// The `name=value` pairs of a test form body (no percent-encoding in these bodies).
fn form_params(body: &str) -> Vec<String> {
    body.split('&')
        .map(|pair| pair.replacen('=', "", 1))
        .collect()
}

fn key(genuine: bool, real: &'static str) -> &'static str {
    if genuine {
        real
    } else {
        "attacker-secret"
    }
}

fn json_event(id: &str) -> String {
    format!(r#"{{"id":"{id}","type":"invoice.paid","data":{{"amount":4200}}}}"#)
}

fn event_id_body(id: &str) -> String {
    format!(r#"{{"event_id":"{id}","event_type":"transaction.completed","data":{{"id":"txn_1"}}}}"#)
}

/// Standard Webhooks `v1` (HMAC) under the given `[id, timestamp, signature]` header names.
fn standard_case(names: [&'static str; 3]) -> Case {
    let secret = format!("whsec_{}", BASE64.encode("e2e standard webhooks key"));
    let attacker = format!("whsec_{}", BASE64.encode("attacker key"));
    let layer = IdempotencyLayer::standard_webhooks([&secret], MemoryStore::new()).unwrap();
    let make: Make = Box::new(move |genuine, signed, sent| {
        let key = standard::decode_secret(if genuine { &secret } else { &attacker }).unwrap();
        let ts = now();
        let signature = standard::sign(&key, &signed.id, ts, signed.body.as_bytes());
        let [id, timestamp, sig] = names;
        let headers = vec![
            (id, sent.id.clone()),
            (timestamp, ts.to_string()),
            (sig, signature),
        ];
        Delivery(headers, sent.body.clone())
    });
    Case {
        provider: standard::PROVIDER,
        layer,
        body: json_event,
        make,
        key: Key::EventId,
        signs_path: false,
        other_methods: &[],
        detects_tampering: true,
        recapture: Recapture::Header(names[0], Expect::Refused("webhook-signature-mismatch")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_webhooks_v1() {
    exercise(standard_case([
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    ]))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_webhooks_v1_under_svix_headers() {
    exercise(standard_case([
        "svix-id",
        "svix-timestamp",
        "svix-signature",
    ]))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_webhooks_v1a_ed25519() {
    use ed25519_dalek::{Signer as _, SigningKey};
    let (real, attacker) = (
        SigningKey::from_bytes(&seed()),
        SigningKey::from_bytes(&seed()),
    );
    let public = format!("whpk_{}", BASE64.encode(real.verifying_key().as_bytes()));
    let make: Make = Box::new(move |genuine, signed, sent| {
        let ts = now().to_string();
        let message = format!("{}.{ts}.{}", signed.id, signed.body);
        let signature = if genuine { &real } else { &attacker }.sign(message.as_bytes());
        let headers = vec![
            ("webhook-id", sent.id.clone()),
            ("webhook-timestamp", ts),
            (
                "webhook-signature",
                format!("v1a,{}", BASE64.encode(signature.to_bytes())),
            ),
        ];
        Delivery(headers, sent.body.clone())
    });
    exercise(Case {
        provider: standard::PROVIDER,
        layer: IdempotencyLayer::standard_webhooks_public_keys([public], MemoryStore::new())
            .unwrap(),
        body: json_event,
        make,
        key: Key::EventId,
        signs_path: false,
        other_methods: &[],
        detects_tampering: true,
        recapture: Recapture::Header("webhook-id", Expect::Refused("webhook-signature-mismatch")),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shopify() {
    exercise(Case {
        provider: shopify::PROVIDER,
        layer: IdempotencyLayer::shopify(["shpss_e2e"], MemoryStore::new()),
        body: |id| format!(r#"{{"id":820982911946154508,"note":"{id}","total_price":"42.00"}}"#),
        make: Box::new(|genuine, signed, sent| {
            let signature = shopify::sign(key(genuine, "shpss_e2e"), signed.body.as_bytes());
            let headers = vec![
                (shopify::SIGNATURE_HEADER, signature),
                (shopify::EVENT_ID_HEADER, sent.id.clone()),
                ("x-shopify-topic", "orders/create".into()),
            ];
            Delivery(headers, sent.body.clone())
        }),
        key: Key::EventId,
        signs_path: false,
        other_methods: &[],
        detects_tampering: true,
        recapture: Recapture::Header(shopify::EVENT_ID_HEADER, REPLAYED),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paddle() {
    exercise(Case {
        provider: paddle::PROVIDER,
        layer: IdempotencyLayer::paddle(["pdl_ntfset_e2e"], MemoryStore::new()),
        body: event_id_body,
        make: Box::new(|genuine, signed, sent| {
            let signature = paddle::sign(
                key(genuine, "pdl_ntfset_e2e"),
                now(),
                signed.body.as_bytes(),
            );
            Delivery(
                vec![(paddle::SIGNATURE_HEADER, signature)],
                sent.body.clone(),
            )
        }),
        key: Key::EventId,
        signs_path: false,
        other_methods: &[],
        detects_tampering: true,
        recapture: Recapture::Signed,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linear() {
    exercise(Case {
        provider: linear::PROVIDER,
        layer: IdempotencyLayer::linear(["lin_wh_e2e"], MemoryStore::new()),
        body: |id| {
            let millis = now() * 1000;
            format!(r#"{{"action":"create","type":"Issue","data":{{"title":"{id}"}},"webhookTimestamp":{millis}}}"#)
        },
        make: Box::new(|genuine, signed, sent| {
            let signature = linear::sign(key(genuine, "lin_wh_e2e"), signed.body.as_bytes());
            let headers = vec![
                (linear::SIGNATURE_HEADER, signature),
                (linear::DELIVERY_HEADER, sent.id.clone()),
            ];
            Delivery(headers, sent.body.clone())
        }),
        key: Key::EventId,
        signs_path: false,
        other_methods: &[],
        detects_tampering: true,
        recapture: Recapture::Header(linear::DELIVERY_HEADER, REPLAYED),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab() {
    use tower_idempotency_webhooks::gitlab;
    exercise(Case {
        provider: gitlab::PROVIDER,
        layer: IdempotencyLayer::gitlab(["glpat-e2e-token"], MemoryStore::new()),
        body: |id| format!(r#"{{"object_kind":"push","ref":"refs/heads/{id}"}}"#),
        make: Box::new(|genuine, _, sent| {
            let headers = vec![
                (gitlab::TOKEN_HEADER, key(genuine, "glpat-e2e-token").into()),
                (gitlab::IDEMPOTENCY_HEADER, sent.id.clone()),
                ("x-gitlab-event", "Push Hook".into()),
            ];
            Delivery(headers, sent.body.clone())
        }),
        key: Key::EventId,
        signs_path: false,
        other_methods: &[],
        // The token is a bare shared secret: the body is protected by TLS only.
        detects_tampering: false,
        // A bare token: a captured delivery holds the credential itself, nothing to record.
        recapture: Recapture::Header(gitlab::IDEMPOTENCY_HEADER, Expect::Runs),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zoom() {
    exercise(Case {
        provider: zoom::PROVIDER,
        layer: IdempotencyLayer::zoom(["zoom-secret-token"], MemoryStore::new()),
        body: |id| {
            format!(r#"{{"event":"meeting.started","event_ts":1700000000000,"payload":{{"object":{{"uuid":"{id}"}}}}}}"#)
        },
        make: Box::new(|genuine, signed, sent| {
            let ts = now();
            let signature = zoom::sign(key(genuine, "zoom-secret-token"), ts, signed.body.as_bytes());
            let headers = vec![
                (zoom::SIGNATURE_HEADER, signature),
                (zoom::TIMESTAMP_HEADER, ts.to_string()),
            ];
            Delivery(headers, sent.body.clone())
        }),
        key: Key::BodyDigest,
        signs_path: false,
        other_methods: &[],
        detects_tampering: true,
        recapture: Recapture::Signed,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discord() {
    use ed25519_dalek::{Signer as _, SigningKey};
    use tower_idempotency_webhooks::discord;
    let (real, attacker) = (
        SigningKey::from_bytes(&seed()),
        SigningKey::from_bytes(&seed()),
    );
    let layer = IdempotencyLayer::discord(
        [hex::encode(real.verifying_key().as_bytes())],
        MemoryStore::new(),
    )
    .unwrap();
    exercise(Case {
        provider: discord::PROVIDER,
        layer,
        // Type 2 (an application command), not the PING answered by `ping_response`.
        body: |id| format!(r#"{{"id":"{id}","type":2,"data":{{"name":"e2e"}}}}"#),
        make: Box::new(move |genuine, signed, sent| {
            let ts = now().to_string();
            let signature = if genuine { &real } else { &attacker }
                .sign(format!("{ts}{}", signed.body).as_bytes());
            let headers = vec![
                (discord::SIGNATURE_HEADER, hex::encode(signature.to_bytes())),
                (discord::TIMESTAMP_HEADER, ts),
            ];
            Delivery(headers, sent.body.clone())
        }),
        key: Key::EventId,
        signs_path: false,
        other_methods: &[],
        detects_tampering: true,
        recapture: Recapture::Signed,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sendgrid() {
    use p256::{
        ecdsa::{signature::Signer as _, Signature, SigningKey},
        pkcs8::EncodePublicKey as _,
    };
    use tower_idempotency_webhooks::sendgrid;
    let keypair = || SigningKey::from_slice(&seed()).unwrap();
    let (real, attacker) = (keypair(), keypair());
    let der = real.verifying_key().to_public_key_der().unwrap();
    let layer =
        IdempotencyLayer::sendgrid([BASE64.encode(der.as_bytes())], MemoryStore::new()).unwrap();
    exercise(Case {
        provider: sendgrid::PROVIDER,
        layer,
        body: |id| {
            format!(r#"[{{"email":"a@example.com","event":"delivered","sg_event_id":"{id}","timestamp":1700000000}}]"#)
        },
        make: Box::new(move |genuine, signed, sent| {
            let ts = now().to_string();
            let signature: Signature = if genuine { &real } else { &attacker }
                .sign(format!("{ts}{}", signed.body).as_bytes());
            let headers = vec![
                (sendgrid::SIGNATURE_HEADER, BASE64.encode(signature.to_der())),
                (sendgrid::TIMESTAMP_HEADER, ts),
            ];
            Delivery(headers, sent.body.clone())
        }),
        key: Key::BodyDigest,
        signs_path: false,
        other_methods: &[],
        detects_tampering: true,
        recapture: Recapture::Signed,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn square() {
    // Square signs the URL as registered, not the loopback address the test connects to.
    const URL: &str = "https://hooks.example.com/hook/acct_1";
    exercise(Case {
        provider: square::PROVIDER,
        layer: IdempotencyLayer::square(URL, ["sq-signature-key"], MemoryStore::new()).unwrap(),
        body: event_id_body,
        make: Box::new(|genuine, signed, sent| {
            let signature = square::sign(
                key(genuine, "sq-signature-key"),
                URL,
                signed.body.as_bytes(),
            );
            Delivery(
                vec![(square::SIGNATURE_HEADER, signature)],
                sent.body.clone(),
            )
        }),
        key: Key::EventId,
        signs_path: true,
        other_methods: &[],
        detects_tampering: true,
        recapture: Recapture::Signed,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mailgun() {
    // Mailgun signs `{timestamp}{token}`, not the event data: the tampered delivery carries the
    // signature of one token next to another token.
    let token = |msg: &Msg| hex::encode(&Sha256::digest(&msg.body)[..25]);
    exercise(Case {
        provider: mailgun::PROVIDER,
        layer: IdempotencyLayer::mailgun(["mailgun-signing-key"], MemoryStore::new()),
        body: |id| format!(r#"{{"event-data":{{"id":"{id}","event":"delivered"}}}}"#),
        make: Box::new(move |genuine, signed, sent| {
            let mut signature =
                mailgun::sign(key(genuine, "mailgun-signing-key"), now(), &token(signed));
            signature["token"] = token(sent).into();
            let mut body: serde_json::Value = serde_json::from_str(&sent.body).unwrap();
            body["signature"] = signature;
            Delivery(Vec::new(), body.to_string())
        }),
        key: Key::EventId,
        signs_path: false,
        other_methods: &[],
        detects_tampering: true,
        // The same signature block (timestamp, token, signature) next to another event's data.
        recapture: Recapture::Custom(
            Box::new(|Delivery(headers, body), other| {
                let mut body: serde_json::Value = serde_json::from_str(body).unwrap();
                let other: serde_json::Value = serde_json::from_str(&other.body).unwrap();
                body["event-data"] = other["event-data"].clone();
                Delivery(headers.clone(), body.to_string())
            }),
            REPLAYED,
        ),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe() {
    exercise(Case {
        provider: stripe::PROVIDER,
        layer: IdempotencyLayer::stripe(["whsec_e2e_stripe"], MemoryStore::new()),
        body: json_event,
        make: Box::new(|genuine, signed, sent| {
            let signature = stripe::sign(
                key(genuine, "whsec_e2e_stripe"),
                now(),
                signed.body.as_bytes(),
            );
            Delivery(
                vec![(stripe::SIGNATURE_HEADER, signature)],
                sent.body.clone(),
            )
        }),
        key: Key::EventId,
        detects_tampering: true,
        signs_path: false,
        other_methods: &[],
        recapture: Recapture::Signed,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github() {
    exercise(Case {
        provider: github::PROVIDER,
        layer: IdempotencyLayer::github(["gh-e2e-secret"], MemoryStore::new()),
        body: |id| format!(r#"{{"action":"opened","number":1,"ref":"{id}"}}"#),
        make: Box::new(|genuine, signed, sent| {
            let signature = github::sign(key(genuine, "gh-e2e-secret"), signed.body.as_bytes());
            let headers = vec![
                ("x-hub-signature-256", signature),
                ("x-github-delivery", sent.id.clone()),
                ("x-github-event", "pull_request".into()),
            ];
            Delivery(headers, sent.body.clone())
        }),
        key: Key::EventId,
        detects_tampering: true,
        signs_path: false,
        other_methods: &[],
        recapture: Recapture::Header(github::DELIVERY_HEADER, REPLAYED),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack() {
    exercise(Case {
        provider: slack::PROVIDER,
        layer: IdempotencyLayer::slack(["slack-e2e-secret"], MemoryStore::new()),
        body: |id| {
            format!(r#"{{"type":"event_callback","event_id":"{id}","event":{{"type":"message"}}}}"#)
        },
        make: Box::new(|genuine, signed, sent| {
            let ts = now();
            let signature =
                slack::sign(key(genuine, "slack-e2e-secret"), ts, signed.body.as_bytes());
            let headers = vec![
                ("x-slack-signature", signature),
                ("x-slack-request-timestamp", ts.to_string()),
            ];
            Delivery(headers, sent.body.clone())
        }),
        key: Key::EventId,
        detects_tampering: true,
        signs_path: false,
        other_methods: &[],
        recapture: Recapture::Signed,
    })
    .await;
}

/// The public base URL Twilio calls (behind a proxy: not the loopback address).
const TWILIO_URL: &str = "https://sms.example.com";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twilio() {
    exercise(Case {
        provider: twilio::PROVIDER,
        layer: IdempotencyLayer::twilio(TWILIO_URL, ["twilio-e2e-token"], MemoryStore::new())
            .unwrap(),
        body: |id| format!("MessageSid={id}&MessageStatus=delivered&To=15551230000"),
        make: Box::new(|genuine, signed, sent| {
            let pairs: Vec<(&str, &str)> = signed
                .body
                .split('&')
                .map(|pair| pair.split_once('=').unwrap())
                .collect();
            let url = format!("{TWILIO_URL}{PATH}");
            let signature = twilio::sign(key(genuine, "twilio-e2e-token"), &url, &pairs);
            let headers = vec![
                ("x-twilio-signature", signature),
                ("content-type", "application/x-www-form-urlencoded".into()),
            ];
            Delivery(headers, sent.body.clone())
        }),
        key: Key::TwilioSigned,
        detects_tampering: true,
        signs_path: true,
        other_methods: &[Method::GET],
        recapture: Recapture::Signed,
    })
    .await;
}
