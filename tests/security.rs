//! Security properties over real HTTP: secrets, expected signatures and raw keys never appear
//! in a response or a log line; secret-holding types print redacted; tenants never share a
//! cached response; credentials are never replayed; a captured delivery cannot be replayed
//! once the clock has moved past the tolerance. Every provider's fixture
//! (`tower_idempotency_webhooks::testing`) is checked for leaks the same way.
#![cfg(feature = "webhooks")]

mod support;

use std::{
    io::Write,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};
use tower_idempotency_testkit::unix_now;

use axum::{
    extract::{Request, State},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::post,
    Router,
};
use http::{HeaderMap, StatusCode};
use support::{problem_type, serve};
use tower_idempotency::{
    webhooks::{
        github, gitlab::GitLabVerifier, linear::LinearVerifier, paddle::PaddleVerifier,
        shopify::ShopifyVerifier, slack::SlackVerifier, standard::StandardWebhooksVerifier, stripe,
        stripe::StripeVerifier, zoom::ZoomVerifier, Secret, WebhookKeys,
    },
    IdempotencyLayer, MemoryStore, Principal, WebhookLayerExt,
};
use tower_idempotency_webhooks::testing::{self, Fixture};

/// Everything every test in this binary logs, at TRACE, in one buffer.
fn captured_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || LogWriter(sink.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
        logs
    })
    .clone()
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn count(State(calls): State<Arc<AtomicUsize>>) -> &'static str {
    calls.fetch_add(1, Ordering::SeqCst);
    "handled"
}

/// Status line, headers and body of a response, as one string to search.
async fn everything(response: reqwest::Response) -> (StatusCode, String) {
    let status = response.status();
    let mut text = format!("{status}\n");
    for (name, value) in response.headers() {
        text.push_str(&format!(
            "{name}: {}\n",
            String::from_utf8_lossy(value.as_bytes())
        ));
    }
    text.push_str(&String::from_utf8_lossy(&response.bytes().await.unwrap()));
    (status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_signature_or_raw_key_in_responses_or_logs() {
    let logs = captured_logs();
    const STRIPE_SECRET: &str = "whsec_LEAKCHECK_stripe_9f2c1e";
    const GITHUB_SECRET: &str = "LEAKCHECK_github_secret_77aa";
    const GITLAB_TOKEN: &str = "LEAKCHECK_gitlab_token_5b5b";
    const RAW_KEY: &str = "LEAKCHECK-raw-client-key-3c3c";
    const BODY_MARKER: &str = "LEAKCHECK_body_marker_d00d";
    let calls = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(MemoryStore::new());
    let layers = [
        (
            "/stripe",
            IdempotencyLayer::stripe([STRIPE_SECRET], store.clone()),
        ),
        (
            "/github",
            IdempotencyLayer::github([GITHUB_SECRET], store.clone()),
        ),
        (
            "/gitlab",
            IdempotencyLayer::gitlab([GITLAB_TOKEN], store.clone()),
        ),
        ("/orders", IdempotencyLayer::client_keys(store.clone())),
    ];
    let app = layers
        .into_iter()
        .fold(Router::new(), |app, (route, layer)| {
            app.merge(Router::new().route(route, post(count)).route_layer(layer))
        })
        .with_state(calls.clone());
    let base = serve(app).await;
    let client = reqwest::Client::new();
    let t = unix_now();
    let mut forbidden: Vec<String> = vec![
        STRIPE_SECRET.into(),
        GITHUB_SECRET.into(),
        GITLAB_TOKEN.into(),
        RAW_KEY.into(),
    ];
    let mut responses = Vec::new();
    let mut problems = Vec::new();
    let send = |route: &str, headers: Vec<(&'static str, String)>, body: String| {
        let request = client.post(format!("{base}/{route}")).body(body);
        headers
            .into_iter()
            .fold(request, |request, (name, value)| {
                request.header(name, value)
            })
            .send()
    };

    // Stripe: good, duplicate, wrong secret, tampered body.
    let body = format!(r#"{{"id":"evt_leak","type":"x","note":"{BODY_MARKER}"}}"#);
    let good = stripe::sign(STRIPE_SECRET, t, body.as_bytes());
    let tampered = body.replace("\"x\"", "\"y\"");
    let wrong = stripe::sign("whsec_other", t, body.as_bytes());
    // What the verifier computes for each refused request: it must not be disclosed.
    forbidden.push(good.split_once("v1=").unwrap().1.to_owned());
    forbidden.push(
        stripe::sign(STRIPE_SECRET, t, tampered.as_bytes())
            .split_once("v1=")
            .unwrap()
            .1
            .to_owned(),
    );
    for (sig, body) in [
        (good.clone(), body.clone()),
        (good.clone(), body.clone()),
        (wrong, body.clone()),
        (good.clone(), tampered),
    ] {
        let response = send("stripe", vec![("stripe-signature", sig)], body);
        responses.push(everything(response.await.unwrap()).await);
    }

    // GitHub: wrong secret.
    let gh_body = format!(r#"{{"note":"{BODY_MARKER}"}}"#);
    forbidden.push(github::sign(GITHUB_SECRET, gh_body.as_bytes()));
    let headers = vec![
        (
            "x-hub-signature-256",
            github::sign("other", gh_body.as_bytes()),
        ),
        ("x-github-delivery", "d-leak".to_owned()),
    ];
    let response = send("github", headers, gh_body);
    responses.push(everything(response.await.unwrap()).await);

    // GitLab: a token that shares a prefix with the real one.
    let headers = vec![
        ("x-gitlab-token", GITLAB_TOKEN[..20].to_owned()),
        ("idempotency-key", "gl-leak".to_owned()),
    ];
    let response = send("gitlab", headers, BODY_MARKER.to_owned());
    responses.push(everything(response.await.unwrap()).await);

    // Client keys: run, replay, reuse with another body, and an invalid key carrying the raw key.
    for (key, body) in [
        (RAW_KEY.to_owned(), "first".to_owned()),
        (RAW_KEY.to_owned(), "first".to_owned()),
        (RAW_KEY.to_owned(), BODY_MARKER.to_owned()),
        (format!("{RAW_KEY} with a space"), BODY_MARKER.to_owned()),
        (format!("\"{RAW_KEY}"), BODY_MARKER.to_owned()),
    ] {
        let response = send("orders", vec![("idempotency-key", key)], body);
        responses.push(everything(response.await.unwrap()).await);
    }

    let statuses: Vec<u16> = responses.iter().map(|(s, _)| s.as_u16()).collect();
    assert_eq!(
        statuses,
        [200, 200, 401, 401, 401, 401, 200, 200, 422, 400, 400],
        "the requests did what the test intends"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    for (status, text) in &responses {
        if !status.is_success() {
            problems.push(text.clone());
        }
    }
    let logs = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    assert!(
        logs.contains("key_hash") && logs.contains("idempotency outcome"),
        "the capture saw the layer's TRACE/DEBUG output"
    );
    for secret in &forbidden {
        assert!(!logs.contains(secret.as_str()), "a log line holds {secret}");
        for (_, text) in &responses {
            assert!(!text.contains(secret.as_str()), "a response holds {secret}");
        }
    }
    assert!(!logs.contains(BODY_MARKER), "a log line holds body content");
    for text in &problems {
        assert!(!text.contains(BODY_MARKER), "a problem holds body content");
    }
}

/// The long tokens of a delivery's signature header (signatures, a bare token), which no
/// response or log line may hold.
fn signature_tokens(fixture: &dyn Fixture, delivery: &testing::Delivery) -> Vec<String> {
    let value = fixture
        .signature_header()
        .and_then(|name| delivery.header(name))
        .unwrap_or_default();
    value
        .split([',', '=', ';', ' '])
        .filter(|token| token.len() >= 16)
        .map(str::to_owned)
        .collect()
}

/// Every provider's fixture over HTTP: its valid delivery, a duplicate of it and its negatives
/// leave no spelling of its credential and no signature in a response or a log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_fixture_secret_or_signature_in_responses_or_logs() {
    let logs = captured_logs();
    let calls = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(MemoryStore::new());
    let fixtures = testing::fixtures();
    let app = fixtures.iter().fold(Router::new(), |app, fixture| {
        let layer = IdempotencyLayer::webhook(fixture.verifier(), store.clone());
        let route = Router::new()
            .route(testing::PATH, post(count))
            .route_layer(layer);
        app.nest(&format!("/{}", fixture.provider()), route)
    });
    let base = serve(app.with_state(calls.clone())).await;
    let client = reqwest::Client::new();
    let t = unix_now();
    let (mut forbidden, mut texts) = (Vec::new(), Vec::new());
    for fixture in &fixtures {
        let provider = fixture.provider();
        let valid = fixture.sign(&fixture.event(&format!("{provider}_leak"), t), t);
        let mut sends = vec![(valid.clone(), 200), (valid, 200)];
        let negatives = fixture.negatives(t).into_iter();
        sends.extend(negatives.map(|n| (n.delivery, n.status.as_u16())));
        forbidden.extend(fixture.secret_forms());
        for (delivery, status) in sends {
            forbidden.extend(signature_tokens(fixture.as_ref(), &delivery));
            let url = format!("{base}/{provider}{}", testing::PATH);
            let request = delivery
                .headers
                .iter()
                .fold(client.post(url), |r, (name, value)| r.header(*name, value));
            let response = request.body(delivery.body).send().await.unwrap();
            let (got, text) = everything(response).await;
            assert_eq!(got.as_u16(), status, "{provider}: {text}");
            texts.push(text);
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), fixtures.len());
    let logs = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    for secret in &forbidden {
        assert!(!logs.contains(secret.as_str()), "a log line holds {secret}");
        for text in &texts {
            assert!(!text.contains(secret.as_str()), "a response holds {secret}");
        }
    }
}

#[test]
fn debug_of_secret_holding_types_is_redacted() {
    const S: &str = "whsec_REDACTCHECK_0123456789";
    // A valid Standard Webhooks secret; its decoded bytes must not show either.
    const STANDARD: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let standard_bytes = format!(
        "{:?}",
        tower_idempotency::webhooks::standard::decode_secret(STANDARD).unwrap()
    );
    let standard_bytes = standard_bytes.trim_matches(|c| c == '[' || c == ']');
    let printed = [
        format!("{:?}", Secret::new(S)),
        format!("{:?}", StripeVerifier::new([S])),
        format!("{:?}", SlackVerifier::new([S])),
        format!("{:?}", github::GitHubVerifier::new([S])),
        format!("{:?}", ShopifyVerifier::new([S])),
        format!("{:?}", PaddleVerifier::new([S])),
        format!("{:?}", LinearVerifier::new([S])),
        format!("{:?}", GitLabVerifier::new([S])),
        format!("{:?}", ZoomVerifier::new([S])),
        format!(
            "{:?}",
            tower_idempotency::webhooks::mailgun::MailgunVerifier::new([S])
        ),
        format!("{:?}", StandardWebhooksVerifier::new([STANDARD]).unwrap()),
        format!("{:?}", WebhookKeys::new(StripeVerifier::new([S]))),
        format!("{:?}", IdempotencyLayer::stripe([S], MemoryStore::new())),
        format!("{:?}", Principal::new("tenant-REDACTCHECK")),
    ];
    for text in &printed {
        assert!(!text.contains("REDACTCHECK"), "leaks a secret: {text}");
        assert!(!text.contains(&STANDARD[6..]), "leaks a secret: {text}");
        assert!(!text.contains(standard_bytes), "leaks key bytes: {text}");
    }
    assert!(printed[0].contains("redacted"));
}

async fn set_principal(mut request: Request, next: Next) -> Response {
    if let Some(tenant) = request
        .headers()
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    {
        request.extensions_mut().insert(Principal::new(tenant));
    }
    next.run(request).await
}

async fn per_tenant(State(calls): State<Arc<AtomicUsize>>, headers: HeaderMap) -> String {
    let n = calls.fetch_add(1, Ordering::SeqCst);
    let tenant = headers
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("nobody");
    format!("private data of {tenant} #{n}")
}

#[tokio::test]
async fn tenants_never_receive_each_others_cached_response() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/orders", post(per_tenant))
        .route_layer(IdempotencyLayer::client_keys(MemoryStore::new()))
        .layer(middleware::from_fn(set_principal))
        .with_state(calls.clone());
    let base = serve(app).await;
    let client = reqwest::Client::new();
    let send = |tenant: Option<&'static str>| {
        let mut request = client
            .post(format!("{base}/orders"))
            .header("idempotency-key", "shared-key-1")
            .body("same body");
        if let Some(tenant) = tenant {
            request = request.header("x-tenant", tenant);
        }
        async move {
            let response = request.send().await.unwrap();
            let replayed = response.headers().contains_key("idempotent-replayed");
            (response.text().await.unwrap(), replayed)
        }
    };
    let (a, replayed) = send(Some("alice")).await;
    assert!(a.starts_with("private data of alice") && !replayed);
    let (b, replayed) = send(Some("bob")).await;
    assert!(b.starts_with("private data of bob") && !replayed, "{b}");
    let (anon, replayed) = send(None).await;
    assert!(anon.starts_with("private data of nobody") && !replayed);
    for _ in 0..3 {
        assert_eq!(send(Some("alice")).await, (a.clone(), true));
        assert_eq!(send(Some("bob")).await, (b.clone(), true));
        assert_eq!(send(None).await, (anon.clone(), true));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

async fn with_credentials() -> Response {
    (
        StatusCode::CREATED,
        [
            ("set-cookie", "session=SESSIONSECRET; HttpOnly"),
            ("authorization", "Bearer RESPONSETOKEN"),
            ("proxy-authorization", "Basic UFJPWFk="),
            ("x-order", "42"),
        ],
        "created",
    )
        .into_response()
}

#[tokio::test]
async fn set_cookie_and_authorization_are_never_replayed() {
    let app = Router::new()
        .route("/orders", post(with_credentials))
        .route_layer(IdempotencyLayer::client_keys(MemoryStore::new()));
    let base = serve(app).await;
    let client = reqwest::Client::new();
    let send = || {
        client
            .post(format!("{base}/orders"))
            .header("idempotency-key", "cred-1")
            .body("x")
            .send()
    };
    let first = send().await.unwrap();
    assert!(first.headers().contains_key("set-cookie"));
    assert!(first.headers().contains_key("authorization"));
    for _ in 0..2 {
        let replay = send().await.unwrap();
        assert_eq!(replay.status(), StatusCode::CREATED);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.headers()["x-order"], "42");
        for name in ["set-cookie", "authorization", "proxy-authorization"] {
            assert!(!replay.headers().contains_key(name), "{name} was replayed");
        }
        let (_, text) = everything(replay).await;
        assert!(!text.contains("SESSIONSECRET") && !text.contains("RESPONSETOKEN"));
    }
}

#[tokio::test]
async fn captured_delivery_is_refused_once_the_clock_moves_past_the_tolerance() {
    const SECRET: &str = "whsec_replay_window";
    let t0 = SystemTime::now();
    let clock = Arc::new(Mutex::new(t0));
    let layer = {
        let clock = clock.clone();
        WebhookKeys::new(StripeVerifier::new([SECRET]))
            .clock(move || *clock.lock().unwrap())
            .into_layer(MemoryStore::new())
            // Shorter than the window: the webhook layer raises it to twice the window.
            .ttl(Duration::from_millis(300))
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/stripe", post(count))
        .route_layer(layer)
        .with_state(calls.clone());
    let base = serve(app).await;
    let client = reqwest::Client::new();
    let ts = t0.duration_since(UNIX_EPOCH).unwrap().as_secs();
    let body = r#"{"id":"evt_captured","type":"charge.succeeded"}"#;
    let captured = stripe::sign(SECRET, ts, body.as_bytes());
    let replay = |signature: String, body: String| {
        let request = client
            .post(format!("{base}/stripe"))
            .header("stripe-signature", signature)
            .body(body);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status();
            (status, problem_type(&response.bytes().await.unwrap()))
        }
    };
    let outside = "urn:tower-idempotency:problem:webhook-timestamp-outside-tolerance";
    let set = |offset: i64| {
        let at = if offset >= 0 {
            t0 + Duration::from_secs(offset as u64)
        } else {
            t0 - Duration::from_secs(offset.unsigned_abs())
        };
        *clock.lock().unwrap() = at;
    };

    assert_eq!(
        replay(captured.clone(), body.into()).await.0,
        StatusCode::OK
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Past the 300 s tolerance: refused even though its record still exists.
    set(301);
    let (status, problem) = replay(captured.clone(), body.into()).await;
    assert_eq!(
        (status, problem.as_str()),
        (StatusCode::UNAUTHORIZED, outside)
    );
    // Or with the clock behind it (captured "from the future").
    set(-301);
    let (status, problem) = replay(captured.clone(), body.into()).await;
    assert_eq!(
        (status, problem.as_str()),
        (StatusCode::UNAUTHORIZED, outside)
    );

    // Past the configured 300 ms TTL: the record was kept (the TTL covers the window) and the
    // window refuses the capture anyway.
    tokio::time::sleep(Duration::from_millis(400)).await;
    set(301);
    let (status, problem) = replay(captured.clone(), body.into()).await;
    assert_eq!(
        (status, problem.as_str()),
        (StatusCode::UNAUTHORIZED, outside)
    );

    // A new event id under the captured signature: the signature covers the id.
    let renamed = body.replace("evt_captured", "evt_renamed");
    set(0);
    let (status, problem) = replay(captured.clone(), renamed).await;
    assert_eq!(
        (status, problem.as_str()),
        (
            StatusCode::UNAUTHORIZED,
            "urn:tower-idempotency:problem:webhook-signature-mismatch"
        )
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no replay ran the handler");

    // Inside the window, past the configured TTL: replayed from the record, not run again,
    // because the webhook layer keeps records at least twice the window.
    let response = client
        .post(format!("{base}/stripe"))
        .header("stripe-signature", captured)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// `shown`, what prints `what`, does not carry `password`.
#[cfg(any(feature = "postgres", feature = "redis"))]
fn assert_hides(what: &str, shown: String, password: &str) {
    assert!(
        !shown.contains(password),
        "{what} leaks the password: {shown}"
    );
}

/// Connecting to `url` (nothing listens on port 1) fails, and the error, shown either way,
/// does not carry `password`.
#[cfg(any(feature = "postgres", feature = "redis"))]
async fn connect_error_hides(url: &str, password: &str) {
    let error = tower_idempotency::connect_store(url)
        .await
        .err()
        .expect("fails");
    assert_hides("connect error", format!("{error} {error:?}"), password);
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn store_debug_and_connect_errors_do_not_print_passwords() {
    const PASSWORD: &str = "PWCHECK_pg_password_41";
    // Nothing listens on port 1: connecting fails, and the error must not carry the password.
    connect_error_hides(
        &format!("postgres://postgres:{PASSWORD}@127.0.0.1:1/test"),
        PASSWORD,
    )
    .await;

    if !support::postgres_or_skip("store Debug with a password") {
        return;
    }
    let url = support::database_url();
    // Trust authentication accepts any password, so the URL can carry one.
    let with_password = url.replacen("postgres@", &format!("postgres:{PASSWORD}@"), 1);
    if with_password == url {
        return; // A DATABASE_URL of another shape: nothing to check.
    }
    let store = tower_idempotency::PostgresStore::connect(&with_password)
        .await
        .expect("connect");
    assert_hides("PostgresStore Debug", format!("{store:?}"), PASSWORD);
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_connect_errors_do_not_print_passwords() {
    const PASSWORD: &str = "PWCHECK_redis_password_42";
    connect_error_hides(&format!("redis://:{PASSWORD}@127.0.0.1:1/0"), PASSWORD).await;
}
