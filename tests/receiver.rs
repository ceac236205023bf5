//! Black-box test of `examples/receiver/`: the compiled receiver runs as a child process on a
//! loopback port with a fresh SQLite file, and is driven only over HTTP (and SIGTERM).
#![cfg(unix)]

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, SystemTime, UNIX_EPOCH},
};
use tower_idempotency_testkit::unix_now;

use futures_util::future::join_all;
use serde_json::{json, Value};
use tokio::{
    io::{AsyncBufReadExt, AsyncRead, BufReader},
    process::{Child, Command},
    sync::oneshot,
    task::JoinHandle,
};
use tower_idempotency::webhooks::{github, standard, stripe, twilio};

const STRIPE_SECRET: &str = "whsec_receiver_test_current";
const STRIPE_PREVIOUS: &str = "whsec_receiver_test_previous";
const GITHUB_SECRET: &str = "receiver-test-github-secret";
// `whsec_` + base64("0123456789abcdef0123456789abcdef").
const STANDARD_SECRET: &str = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const TWILIO_TOKEN: &str = "receiver-test-twilio-token";
const PUBLIC_URL: &str = "https://receiver.example.com";
const DUPLICATES: usize = 8;

// ---------------------------------------------------------------------------------------------
// The child process

/// The receiver binary `cargo test` built next to this test's directory (`target/debug`).
/// `cargo test --test receiver` builds no examples, so then (or when the source is newer) it is
/// built here.
fn receiver_binary() -> PathBuf {
    let test_exe = std::env::current_exe().unwrap();
    let profile_dir = test_exe.parent().unwrap().parent().unwrap();
    let binary = profile_dir
        .join("examples")
        .join(format!("receiver{}", std::env::consts::EXE_SUFFIX));
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/receiver");
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let newest_source = std::fs::read_dir(sources)
        .expect("examples/receiver")
        .filter_map(|entry| modified(&entry.ok()?.path()))
        .max();
    if modified(&binary) < newest_source {
        build_receiver(profile_dir.parent().unwrap());
    }
    binary
}

fn build_receiver(target_dir: &Path) {
    let features: Vec<&str> = [
        ("sqlite", cfg!(feature = "sqlite")),
        ("webhooks", cfg!(feature = "webhooks")),
        ("postgres", cfg!(feature = "postgres")),
        ("redis", cfg!(feature = "redis")),
        ("metrics", cfg!(feature = "metrics")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    eprintln!("building the receiver example (features {features:?})");
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "--example", "receiver", "--no-default-features"])
        .arg("--features")
        .arg(features.join(","))
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .status()
        .expect("run cargo");
    assert!(status.success(), "building the receiver example failed");
}

/// Removes the SQLite database and its WAL files when dropped.
struct TempDb(PathBuf);

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
        }
    }
}

/// The running receiver. Dropping it kills the process (`kill_on_drop`), then removes the
/// database.
struct Receiver {
    child: Child,
    base: String,
    logs: JoinHandle<String>,
    _db: TempDb,
}

fn collect_lines(stream: impl AsyncRead + Unpin + Send + 'static) -> JoinHandle<String> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        let mut all = String::new();
        while let Ok(Some(line)) = lines.next_line().await {
            all.push_str(&line);
            all.push('\n');
        }
        all
    })
}

/// Reads stdout until the `listening on` line, then keeps draining so the child never blocks.
fn announced_address(stream: impl AsyncRead + Unpin + Send + 'static) -> oneshot::Receiver<String> {
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let mut tx = Some(tx);
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let (Some(url), Some(tx)) = (line.strip_prefix("listening on "), tx.take()) {
                let _ = tx.send(url.to_owned());
            }
        }
    });
    rx
}

impl Receiver {
    async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Starts the receiver with `extra` environment variables over the defaults of [`start`](Self::start).
    async fn start_with(extra: &[(&str, &str)]) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let db = TempDb(std::env::temp_dir().join(format!(
            "tower-idempotency-receiver-test-{}-{nanos}.db",
            std::process::id()
        )));
        let mut child = Command::new(receiver_binary())
            .env_clear()
            .env("RUST_LOG", "info")
            .env("RECEIVER_ADDR", "127.0.0.1:0")
            .env("IDEMPOTENCY_STORE", format!("sqlite://{}", db.0.display()))
            .env("HANDLER_DELAY_MS", "50")
            .env(
                "STRIPE_WEBHOOK_SECRET",
                format!("{STRIPE_SECRET}, {STRIPE_PREVIOUS}"),
            )
            .env("GITHUB_WEBHOOK_SECRET", GITHUB_SECRET)
            .env("STANDARD_WEBHOOKS_SECRET", STANDARD_SECRET)
            .env("TWILIO_AUTH_TOKEN", TWILIO_TOKEN)
            .env("RECEIVER_PUBLIC_URL", PUBLIC_URL)
            .envs(extra.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the receiver example");
        let address = announced_address(child.stdout.take().unwrap());
        let logs = collect_lines(child.stderr.take().unwrap());
        let base = tokio::time::timeout(Duration::from_secs(60), address)
            .await
            .expect("the receiver announced its address within 60 s")
            .expect("the receiver exited before listening");
        let receiver = Self {
            child,
            base,
            logs,
            _db: db,
        };
        receiver.wait_healthy().await;
        receiver
    }

    async fn wait_healthy(&self) {
        let client = reqwest::Client::new();
        // A deadline, not a count of tries: on a loaded machine each try can take long.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while tokio::time::Instant::now() < deadline {
            if let Ok(response) = client.get(self.url("/health")).send().await {
                if response.status() == 200 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("/health did not answer 200 within 60 s");
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// SIGTERM, then the exit status and everything the receiver logged.
    async fn terminate(mut self) -> (std::process::ExitStatus, String) {
        let pid = self.child.id().expect("still running").to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(sent.success());
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the receiver exits within 30 s of SIGTERM")
            .unwrap();
        let logs = (&mut self.logs).await.unwrap();
        (status, logs)
    }
}

// ---------------------------------------------------------------------------------------------
// Deliveries

/// One HTTP request, replayable any number of times.
#[derive(Clone)]
struct Delivery {
    path: &'static str,
    content_type: &'static str,
    headers: Vec<(&'static str, String)>,
    body: String,
}

struct Answer {
    status: u16,
    replayed: bool,
    body: bytes::Bytes,
}

impl Delivery {
    fn stripe(secret: &str, id: &str) -> Self {
        let body = json!({ "id": id, "object": "event", "type": "invoice.paid" }).to_string();
        let signature = stripe::sign(secret, unix_now(), body.as_bytes());
        Self {
            path: "/webhooks/stripe",
            content_type: "application/json",
            headers: vec![("stripe-signature", signature)],
            body,
        }
    }

    fn github(secret: &str, delivery: &str) -> Self {
        let body = json!({ "action": "opened", "number": 7 }).to_string();
        Self {
            path: "/webhooks/github",
            content_type: "application/json",
            headers: vec![
                ("x-hub-signature-256", github::sign(secret, body.as_bytes())),
                ("x-github-delivery", delivery.to_owned()),
                ("x-github-event", "pull_request".to_owned()),
            ],
            body,
        }
    }

    fn standard(secret: &str, id: &str) -> Self {
        let body = json!({ "type": "user.created", "data": { "id": 42 } }).to_string();
        let key = standard::decode_secret(secret).unwrap();
        let ts = unix_now();
        Self {
            path: "/webhooks/standard",
            content_type: "application/json",
            headers: vec![
                ("webhook-id", id.to_owned()),
                ("webhook-timestamp", ts.to_string()),
                (
                    "webhook-signature",
                    standard::sign(&key, id, ts, body.as_bytes()),
                ),
            ],
            body,
        }
    }

    fn twilio(token: &str, idempotency_token: &str) -> Self {
        let params = [
            ("MessageSid", "SM0123456789abcdef"),
            ("MessageStatus", "delivered"),
        ];
        let url = format!("{PUBLIC_URL}/webhooks/twilio");
        Self {
            path: "/webhooks/twilio",
            content_type: "application/x-www-form-urlencoded",
            headers: vec![
                ("x-twilio-signature", twilio::sign(token, &url, &params)),
                ("i-twilio-idempotency-token", idempotency_token.to_owned()),
            ],
            body: "MessageSid=SM0123456789abcdef&MessageStatus=delivered".to_owned(),
        }
    }

    fn order(key: Option<&str>, body: Value) -> Self {
        Self {
            path: "/orders",
            content_type: "application/json",
            headers: key
                .map(|k| vec![("idempotency-key", k.to_owned())])
                .unwrap_or_default(),
            body: body.to_string(),
        }
    }

    fn with_body(mut self, body: &str) -> Self {
        self.body = body.to_owned();
        self
    }

    async fn send(&self, client: &reqwest::Client, receiver: &Receiver) -> Answer {
        let mut request = client
            .post(receiver.url(self.path))
            .header("content-type", self.content_type)
            .body(self.body.clone());
        for (name, value) in &self.headers {
            request = request.header(*name, value);
        }
        let response = request.send().await.expect("request reaches the receiver");
        Answer {
            status: response.status().as_u16(),
            replayed: response.headers().contains_key("idempotent-replayed"),
            body: response.bytes().await.unwrap(),
        }
    }
}

/// Sends `delivery` [`DUPLICATES`] times at once, then once more; checks exactly one execution
/// answered, the concurrent rest were in flight (409) or replays, and the last one is a
/// byte-identical replay. Returns the executed answer's status.
async fn deliver_duplicates(
    client: &reqwest::Client,
    receiver: &Receiver,
    delivery: &Delivery,
) -> u16 {
    let answers = join_all((0..DUPLICATES).map(|_| delivery.send(client, receiver))).await;
    let executed: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status < 300 && !a.replayed)
        .collect();
    assert_eq!(
        executed.len(),
        1,
        "{}: exactly one execution",
        delivery.path
    );
    for answer in &answers {
        let in_flight = answer.status == 409;
        let replay = answer.replayed && answer.body == executed[0].body;
        assert!(
            in_flight || replay || std::ptr::eq(answer, executed[0]),
            "{}: unexpected answer {} {:?}",
            delivery.path,
            answer.status,
            answer.body
        );
    }
    let again = delivery.send(client, receiver).await;
    assert_eq!(again.status, executed[0].status, "{}", delivery.path);
    assert!(
        again.replayed,
        "{}: a later duplicate is a replay",
        delivery.path
    );
    assert_eq!(
        again.body, executed[0].body,
        "{}: replay is byte-identical",
        delivery.path
    );
    executed[0].status
}

async fn effects(client: &reqwest::Client, receiver: &Receiver) -> Value {
    let response = client.get(receiver.url("/effects")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

fn problem_type(answer: &Answer) -> String {
    let problem: Value = serde_json::from_slice(&answer.body).unwrap();
    problem["type"].as_str().unwrap_or_default().to_owned()
}

// ---------------------------------------------------------------------------------------------
// The test

/// With the `metrics` feature the receiver serves the layer's metrics in the Prometheus text
/// format, the store call latency as a histogram with buckets.
#[cfg(feature = "metrics")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_serves_metrics_in_the_prometheus_text_format() {
    let receiver = Receiver::start().await;
    let client = reqwest::Client::new();

    let order = Delivery::order(Some("metrics-order-1"), json!({ "sku": "M-1" }));
    for _ in 0..3 {
        assert_eq!(order.send(&client, &receiver).await.status, 201);
    }
    let keyless = Delivery::order(None, json!({}))
        .send(&client, &receiver)
        .await;
    assert_eq!(keyless.status, 400);

    let response = client.get(receiver.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let text = response.text().await.unwrap();
    for line in [
        r#"idempotency_requests_total{namespace="orders",outcome="executed"} 1"#,
        r#"idempotency_requests_total{namespace="orders",outcome="replayed"} 2"#,
        r#"idempotency_requests_total{namespace="orders",outcome="rejected"} 1"#,
        r#"idempotency_handlers_in_flight{namespace="orders"} 0"#,
        "# TYPE idempotency_store_call_duration_seconds histogram",
        r#"idempotency_store_call_duration_seconds_count{operation="claim",store="sqlite"} 3"#,
        r#"idempotency_store_call_duration_seconds_count{operation="complete",store="sqlite"} 1"#,
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in:\n{text}"
        );
    }
    assert!(text.contains(r#"idempotency_store_call_duration_seconds_bucket{operation="claim",store="sqlite",le="0.001"}"#), "{text}");
    let (status, _logs) = receiver.terminate().await;
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_runs_each_delivery_once_and_refuses_forgeries() {
    let receiver = Receiver::start().await;
    let client = reqwest::Client::new();

    let stripe_event = Delivery::stripe(STRIPE_SECRET, "evt_receiver_1");
    let rotated = Delivery::stripe(STRIPE_PREVIOUS, "evt_receiver_rotated");
    let github_delivery = Delivery::github(GITHUB_SECRET, "72d3162e-cc78-11e3-81ab-4c9367dc0958");
    let standard_message = Delivery::standard(STANDARD_SECRET, "msg_receiver_1");
    let order = Delivery::order(Some("order-key-1"), json!({ "sku": "A-1", "qty": 2 }));
    let twilio_callback = Delivery::twilio(TWILIO_TOKEN, "twilio-idem-1");
    for delivery in [
        &stripe_event,
        &rotated,
        &github_delivery,
        &standard_message,
        &twilio_callback,
    ] {
        assert_eq!(deliver_duplicates(&client, &receiver, delivery).await, 200);
    }
    assert_eq!(deliver_duplicates(&client, &receiver, &order).await, 201);

    let created = order.send(&client, &receiver).await;
    let created: Value = serde_json::from_slice(&created.body).unwrap();
    assert!(created["order_id"].as_str().unwrap().starts_with("ord_"));
    assert_eq!(created["request"], json!({ "sku": "A-1", "qty": 2 }));
    let reused = Delivery::order(Some("order-key-1"), json!({ "sku": "B-2" }))
        .send(&client, &receiver)
        .await;
    assert_eq!(reused.status, 422);
    let keyless = Delivery::order(None, json!({}))
        .send(&client, &receiver)
        .await;
    assert_eq!(keyless.status, 400);
    assert!(problem_type(&keyless).ends_with(":missing-key"));

    let forgeries = [
        Delivery::stripe("whsec_attacker", "evt_forged_1"),
        Delivery::stripe(STRIPE_SECRET, "evt_forged_2")
            .with_body(r#"{"id":"evt_forged_2","object":"event","type":"payout.paid"}"#),
        Delivery::github("not-the-secret", "forged-delivery"),
        Delivery::standard("whsec_YXR0YWNrZXI=", "msg_forged"),
        Delivery::twilio("not-the-token", "twilio-forged"),
    ];
    for forged in &forgeries {
        let answer = forged.send(&client, &receiver).await;
        assert!(
            answer.status == 400 || answer.status == 401,
            "{}: a forgery is refused, got {}",
            forged.path,
            answer.status
        );
        assert!(problem_type(&answer).contains(":webhook-"));
    }

    // Twilio deliveries are keyed by the digest of the string Twilio signed.
    let twilio_signed =
        format!("{PUBLIC_URL}/webhooks/twilioMessageSidSM0123456789abcdefMessageStatusdelivered");
    let twilio_key = format!(
        "twilio:sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(twilio_signed))
    );
    let mut expected = json!({
        "stripe:evt_receiver_1": 1,
        "stripe:evt_receiver_rotated": 1,
        "github:72d3162e-cc78-11e3-81ab-4c9367dc0958": 1,
        "standard:msg_receiver_1": 1,
        "orders:order-key-1": 1,
    });
    expected[twilio_key] = json!(1);
    assert_eq!(
        effects(&client, &receiver).await,
        expected,
        "every genuine delivery ran exactly once; no forgery and no refused request ran"
    );

    let (status, logs) = receiver.terminate().await;
    assert!(
        status.success(),
        "graceful exit on SIGTERM: {status}\n{logs}"
    );
    for expected in [
        "outcome=\"executed\"",
        "outcome=\"replayed\"",
        "outcome=\"mismatch\"",
        "problem=\"missing-key\"",
        "problem=\"webhook-signature-mismatch\"",
        "all handlers finished",
    ] {
        assert!(logs.contains(expected), "log lacks {expected}:\n{logs}");
    }
}

/// `IDEMPOTENCY_WAIT_MS`: concurrent duplicates of a `POST /orders` whose handler takes 500 ms
/// all get its `201` and body (no `409`), and the order runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_orders_wait_for_the_in_flight_result() {
    let receiver = Receiver::start_with(&[
        ("HANDLER_DELAY_MS", "500"),
        ("IDEMPOTENCY_WAIT_MS", "10000"),
    ])
    .await;
    let client = reqwest::Client::new();
    let key = format!("wait-{}", unix_now());
    let order = Delivery::order(Some(&key), json!({"sku": "book"}));
    let answers = join_all((0..DUPLICATES).map(|_| order.send(&client, &receiver))).await;
    for answer in &answers {
        assert_eq!(
            answer.status, 201,
            "no 409 while waiting: {:?}",
            answer.body
        );
        assert_eq!(
            answer.body, answers[0].body,
            "every caller gets the one order"
        );
    }
    assert_eq!(answers.iter().filter(|a| !a.replayed).count(), 1);
    assert_eq!(
        effects(&client, &receiver).await[format!("orders:{key}")],
        1
    );
    let (status, _) = receiver.terminate().await;
    assert!(status.success());
}
