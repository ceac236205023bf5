//! Through the layer over real HTTP: axum on 127.0.0.1:0, core's MemoryStore, reqwest.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, UNIX_EPOCH},
};
use tower_idempotency_testkit::unix_now;

use axum::{extract::State, routing::post, Router};
use tower_idempotency_core::{IdempotencyLayer, MemoryStore};
use tower_idempotency_testkit::serve;
use tower_idempotency_webhooks::{
    github, slack, stripe, VerifiedWebhook, WebhookKeys, WebhookLayerExt,
};

async fn count(State(calls): State<Arc<AtomicUsize>>, webhook: VerifiedWebhook) -> String {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    format!(
        "{} handled {} (call {n})",
        webhook.provider(),
        webhook.event_id()
    )
}

#[tokio::test]
async fn stripe_duplicate_is_replayed_and_forgery_never_reaches_the_handler() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/stripe", post(count))
        .route_layer(IdempotencyLayer::stripe(["whsec_e2e"], MemoryStore::new()))
        .with_state(calls.clone());
    let base = serve(app).await;
    let client = reqwest::Client::new();
    let body = r#"{"id":"evt_e2e_1","object":"event","type":"invoice.paid","pending_webhooks":2}"#;
    let sign = |secret: &str, at: u64, body: &str| stripe::sign(secret, at, body.as_bytes());
    let post = |body: &'static str| client.post(format!("{base}/stripe")).body(body);
    let send = |signature: String, body: &'static str| {
        post(body)
            .header("stripe-signature", signature)
            .header("content-type", "application/json")
            .send()
    };

    let first = send(sign("whsec_e2e", unix_now(), body), body)
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first_text = first.text().await.unwrap();
    assert_eq!(first_text, "stripe handled evt_e2e_1 (call 1)");

    // Stripe's retry: a fresh signature, and `pending_webhooks` re-rendered.
    let retry_body =
        r#"{"id":"evt_e2e_1","object":"event","type":"invoice.paid","pending_webhooks":1}"#;
    let second = send(sign("whsec_e2e", unix_now(), retry_body), retry_body)
        .await
        .unwrap();
    assert_eq!(second.status(), 200);
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    assert_eq!(second.text().await.unwrap(), first_text);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Forged: signed with another secret.
    let forged = send(sign("whsec_attacker", unix_now(), body), body)
        .await
        .unwrap();
    assert_eq!(forged.status(), 401);
    assert_eq!(forged.headers()["content-type"], "application/problem+json");
    let problem: serde_json::Value =
        serde_json::from_slice(&forged.bytes().await.unwrap()).unwrap();
    assert_eq!(
        problem["type"],
        "urn:tower-idempotency:problem:webhook-signature-mismatch"
    );
    assert!(!problem.to_string().contains("whsec"));

    // Tampered body with a genuine signature of another body; and a replay from an hour ago.
    let other = r#"{"id":"evt_e2e_2","object":"event","type":"invoice.paid"}"#;
    let tampered = send(sign("whsec_e2e", unix_now(), body), other)
        .await
        .unwrap();
    assert_eq!(tampered.status(), 401);
    let stale = send(sign("whsec_e2e", unix_now() - 3600, other), other)
        .await
        .unwrap();
    assert_eq!(stale.status(), 401);
    let problem: serde_json::Value = serde_json::from_slice(&stale.bytes().await.unwrap()).unwrap();
    assert_eq!(
        problem["type"],
        "urn:tower-idempotency:problem:webhook-timestamp-outside-tolerance"
    );
    let unsigned = post(other).send().await.unwrap();
    assert_eq!(unsigned.status(), 400);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "no forged delivery ran the handler"
    );

    // A new event runs the handler.
    let fresh = send(sign("whsec_e2e", unix_now(), other), other)
        .await
        .unwrap();
    assert_eq!(
        fresh.text().await.unwrap(),
        "stripe handled evt_e2e_2 (call 2)"
    );
}

#[tokio::test]
async fn injected_clock_github_and_slack_challenge_over_http() {
    let calls = Arc::new(AtomicUsize::new(0));
    // A clock pinned in 2001: a delivery signed "now" is in its future.
    let pinned = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let slack_layer = WebhookKeys::new(slack::SlackVerifier::new(["slack-secret"]))
        .clock(move || pinned)
        .into_layer(MemoryStore::new());
    let app = Router::new()
        .route("/github", post(count))
        .route_layer(IdempotencyLayer::github(["gh-secret"], MemoryStore::new()))
        .merge(
            Router::new()
                .route(
                    "/slack",
                    post(|webhook: VerifiedWebhook| async move {
                        slack::url_verification_response(&webhook)
                            .unwrap_or_else(|| axum::response::IntoResponse::into_response("ok"))
                    }),
                )
                .route_layer(slack_layer),
        )
        .route("/unguarded", post(count))
        .with_state(calls.clone());
    let base = serve(app).await;
    let client = reqwest::Client::new();

    let body = r#"{"action":"opened","number":1}"#;
    for round in 0..3 {
        let response = client
            .post(format!("{base}/github"))
            .header(
                "x-hub-signature-256",
                github::sign("gh-secret", body.as_bytes()),
            )
            .header("x-github-delivery", "b3c5a2f0-0000-11ef-8000-000000000001")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers().get("idempotent-replayed").is_some(),
            round > 0
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let challenge = r#"{"token":"t","challenge":"c-123","type":"url_verification"}"#;
    let signed = |at: u64| {
        client
            .post(format!("{base}/slack"))
            .header("x-slack-request-timestamp", at.to_string())
            .header(
                "x-slack-signature",
                slack::sign("slack-secret", at, challenge.as_bytes()),
            )
            .body(challenge)
            .send()
    };
    let response = signed(1_000_000_000).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    assert_eq!(response.text().await.unwrap(), r#"{"challenge":"c-123"}"#);
    let response = signed(unix_now()).await.unwrap();
    assert_eq!(
        response.status(),
        401,
        "the injected clock is the one checked"
    );

    // The extractor without the layer: a 500 problem naming the missing layer.
    let response = client
        .post(format!("{base}/unguarded"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 500);
    let problem: serde_json::Value =
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(
        problem["type"],
        "urn:tower-idempotency:problem:webhook-layer-missing"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn twilio_behind_a_proxy_replays_retries_and_keeps_status_callbacks_apart() {
    use tower_idempotency_webhooks::twilio;

    let calls = Arc::new(AtomicUsize::new(0));
    // The public URL Twilio calls is not the loopback address the test connects to, as behind
    // a TLS-terminating proxy.
    let public = "https://sms.example.com";
    let app = Router::new()
        .route("/twilio/status", post(count))
        .route_layer(
            IdempotencyLayer::twilio(public, ["twilio-auth-token"], MemoryStore::new()).unwrap(),
        )
        .with_state(calls.clone());
    let base = serve(app).await;
    let client = reqwest::Client::new();
    let send = |params: Vec<(&'static str, &'static str)>, token: &'static str| {
        let signature = twilio::sign(token, &format!("{public}/twilio/status?account=7"), &params);
        client
            .post(format!("{base}/twilio/status?account=7"))
            .header("x-twilio-signature", signature)
            .form(&params)
            .send()
    };
    let sent = vec![
        ("MessageSid", "SM123"),
        ("MessageStatus", "sent"),
        ("To", "+15551230000"),
    ];
    let first = send(sent.clone(), "twilio-auth-token").await.unwrap();
    assert_eq!(first.status(), 200);
    let first_text = first.text().await.unwrap();
    assert!(first_text.ends_with("(call 1)"), "{first_text}");
    let retry = send(sent.clone(), "twilio-auth-token").await.unwrap();
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.text().await.unwrap(), first_text);
    // The next status of the same message is another event.
    let delivered = vec![("MessageSid", "SM123"), ("MessageStatus", "delivered")];
    let response = send(delivered, "twilio-auth-token").await.unwrap();
    assert!(response.text().await.unwrap().ends_with("(call 2)"));
    // The same parameters re-split under the same signature (Twilio concatenates names and
    // values without separators): it verifies, and is the same event, so it is replayed.
    let signature = twilio::sign(
        "twilio-auth-token",
        &format!("{public}/twilio/status?account=7"),
        &sent,
    );
    let re_split = client
        .post(format!("{base}/twilio/status?account=7"))
        .header("x-twilio-signature", signature)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("MessageSid=SM123&MessageStatus=sentTo%2B15551230000")
        .send()
        .await
        .unwrap();
    assert_eq!(re_split.status(), 200);
    assert_eq!(re_split.headers()["idempotent-replayed"], "true");
    assert_eq!(re_split.text().await.unwrap(), first_text);
    // Forged with another token: 401 problem, handler untouched.
    let forged = send(sent, "not-the-token").await.unwrap();
    assert_eq!(forged.status(), 401);
    assert_eq!(forged.headers()["content-type"], "application/problem+json");
    assert!(!forged.text().await.unwrap().contains("twilio-auth-token"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A TTL shorter than the replay window would let a captured delivery, replayed inside the
/// window after its record expired, run again: the webhook layer keeps records at least twice
/// the window (the window reaches both ways from the signed time) whatever `ttl` is set.
#[tokio::test]
async fn a_ttl_shorter_than_the_replay_window_is_raised_to_cover_it() {
    let calls = Arc::new(AtomicUsize::new(0));
    let secret = "whsec_ttl_window";
    let layer =
        WebhookKeys::new(stripe::StripeVerifier::new([secret]).tolerance(Duration::from_secs(60)))
            .into_layer(MemoryStore::new())
            .ttl(Duration::from_secs(1));
    let app = Router::new()
        .route("/stripe", post(count))
        .route_layer(layer)
        .with_state(calls.clone());
    let base = serve(app).await;
    let body = r#"{"id":"evt_ttl","type":"charge.succeeded"}"#;
    let signature = stripe::sign(secret, unix_now(), body.as_bytes());
    let client = reqwest::Client::new();
    let send = || {
        client
            .post(format!("{base}/stripe"))
            .header("stripe-signature", signature.clone())
            .body(body)
            .send()
    };
    assert_eq!(send().await.unwrap().status(), 200);
    // Past the configured one-second TTL (real time has to pass for it), well inside the
    // 60-second window even on a loaded machine.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let replay = send().await.unwrap();
    assert_eq!(replay.status(), 200);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// `tolerance(Duration::ZERO)` read as "no tolerance" but disabled the window: zero is refused,
/// and turning the window off has its own name.
#[test]
fn a_zero_tolerance_is_refused() {
    let zero = std::panic::catch_unwind(|| {
        stripe::StripeVerifier::new(["whsec_zero_window"]).tolerance(Duration::ZERO)
    });
    assert!(zero.is_err());
}
