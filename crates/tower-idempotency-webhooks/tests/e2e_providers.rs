//! Every provider not covered by `e2e.rs`, through its `IdempotencyLayer` constructor over real
//! HTTP (axum on 127.0.0.1:0, core's MemoryStore, reqwest), driven by one table-driven helper:
//! 20 identical deliveries at once run the handler once (the other 19 get `409`), a retry is
//! replayed byte for byte, a delivery signed with the wrong key and a tampered one get a webhook
//! problem and never reach the handler, a new event runs it again, and the first delivery
//! captured and re-sent with only its unsigned parts changed (a new delivery id, Mailgun's event
//! data) is refused without running the handler.

use std::{
    collections::hash_map::RandomState,
    hash::BuildHasher,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::{extract::State, routing::post, Router};
use base64::{engine::general_purpose::STANDARD as BASE64, Engine as _};
use sha2::{Digest as _, Sha256};
use tokio::sync::{mpsc, Semaphore};
use tower_idempotency_core::{IdempotencyLayer, MemoryStore};
use tower_idempotency_webhooks::{
    github, linear, mailgun, paddle, shopify, square, standard, zoom, VerifiedWebhook,
    WebhookLayerExt,
};

const BURST: usize = 20;

struct Shared {
    calls: AtomicUsize,
    /// Closed during the burst so that every duplicate arrives while the first still runs.
    gate: Semaphore,
}

async fn count(State(shared): State<Arc<Shared>>, webhook: VerifiedWebhook) -> String {
    let n = shared.calls.fetch_add(1, Ordering::SeqCst) + 1;
    drop(shared.gate.acquire().await.unwrap());
    format!(
        "{} handled {} (call {n})",
        webhook.provider(),
        webhook.event_id()
    )
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/hook")
}

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

struct Case {
    provider: &'static str,
    layer: IdempotencyLayer,
    body: fn(&str) -> String,
    make: Make,
    /// The key is `sha256:<hex>` of the body rather than an id the provider sends.
    digest_key: bool,
    /// False where the provider's credential does not cover the body (GitLab's bare token).
    detects_tampering: bool,
    /// The captured first delivery made to name another event without re-signing it.
    recapture: Recapture,
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
        gate: Semaphore::new(0),
    });
    let app = Router::new()
        .route("/hook", post(count))
        .route_layer(case.layer)
        .with_state(shared.clone());
    let url = serve(app).await;
    let client = reqwest::Client::new();
    let send = |Delivery(headers, body): Delivery| {
        let request = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body);
        headers
            .into_iter()
            .fold(request, |r, (name, value)| r.header(name, value))
            .send()
    };
    let msg = |n: u32| {
        let id = format!("{}-e2e-{n}", case.provider.replace('-', "_"));
        Msg {
            body: (case.body)(&id),
            id,
        }
    };
    let (first, second) = (msg(1), msg(2));
    let expected = |msg: &Msg, delivery: &Delivery, call: usize| {
        let key = if case.digest_key {
            format!("sha256:{}", hex::encode(Sha256::digest(&delivery.1)))
        } else {
            msg.id.clone()
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
        digest_key: false,
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
        digest_key: false,
        detects_tampering: true,
        recapture: Recapture::Header("webhook-id", Expect::Refused("webhook-signature-mismatch")),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github() {
    const SECRET: &str = "gh-e2e-webhook-secret-7f3a9c1e5b2d";
    exercise(Case {
        provider: github::PROVIDER,
        layer: IdempotencyLayer::github([SECRET], MemoryStore::new()),
        body: |id| format!(r#"{{"action":"opened","issue":{{"title":"{id}"}}}}"#),
        make: Box::new(|genuine, signed, sent| {
            let signature = github::sign(key(genuine, SECRET), signed.body.as_bytes());
            let headers = vec![
                (github::SIGNATURE_HEADER, signature),
                (github::DELIVERY_HEADER, sent.id.clone()),
                ("x-github-event", "issues".into()),
            ];
            Delivery(headers, sent.body.clone())
        }),
        digest_key: false,
        detects_tampering: true,
        recapture: Recapture::Header(github::DELIVERY_HEADER, REPLAYED),
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
        digest_key: false,
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
        digest_key: false,
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
        digest_key: false,
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
        digest_key: false,
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
        digest_key: true,
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
        digest_key: false,
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
        digest_key: true,
        detects_tampering: true,
        recapture: Recapture::Signed,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn square() {
    // Square signs the URL as registered, not the loopback address the test connects to.
    const URL: &str = "https://hooks.example.com/square?shop=7";
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
        digest_key: false,
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
        digest_key: false,
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
