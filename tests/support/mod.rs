//! Shared helpers for the facade's fault-injection and bad-input tests: an app counting its
//! executions per key, the layer's outcome as a header, and cleanup guards for the shared
//! Postgres and Redis; the workspace's test kit (servers, proxy, `redis-server`, skip rule) too.
#![allow(dead_code)] // Each test binary uses a different subset.

use std::{
    collections::HashMap,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{extract::State, http::HeaderMap, response::Response, routing::post, Router};
use tokio::sync::{watch, Notify};
use tower_idempotency::Outcome;

#[allow(unused_imports)] // Each test binary uses a different subset.
pub use tower_idempotency_testkit::{
    database_url, host_port, poll_until, postgres_or_skip, random_suffix, reachable, redis_url,
    serve, skip, which, Mode, Proxy, RedisServer, DURABLE,
};

/// Returns from the calling test, skipped ([`postgres_or_skip`]), when the shared Postgres is not
/// reachable; `$what` names the test.
#[allow(unused_macros)] // Each test binary uses a different subset.
macro_rules! require_postgres {
    ($what:expr) => {
        if !postgres_or_skip($what) {
            return;
        }
    };
}
#[allow(unused_imports)] // Each test binary uses a different subset.
pub(crate) use require_postgres;

/// The response header the test middleware copies the layer's [`Outcome`] into.
pub const OUTCOME_HEADER: &str = "x-test-outcome";

/// Copies the layer's [`Outcome`] extension into [`OUTCOME_HEADER`] so tests see it over HTTP.
pub async fn outcome_header(response: Response) -> Response {
    let mut response = response;
    if let Some(outcome) = response.extensions().get::<Outcome>().copied() {
        response.headers_mut().insert(
            OUTCOME_HEADER,
            http::HeaderValue::from_static(outcome.as_str()),
        );
    }
    response
}

/// Handler executions per `Idempotency-Key`, plus a gate tests can hold handlers at.
#[derive(Clone, Default)]
pub struct Executions {
    counts: Arc<Mutex<HashMap<String, usize>>>,
    running: Arc<Mutex<HashMap<String, usize>>>,
    max_concurrent_same_key: Arc<Mutex<usize>>,
    started: Arc<Notify>,
    /// While `true`, handlers of keys starting with `held` wait for it to turn `false`.
    pub hold: Arc<watch::Sender<bool>>,
}

impl Executions {
    pub fn new() -> Self {
        Self {
            hold: Arc::new(watch::channel(false).0),
            ..Self::default()
        }
    }

    pub fn total(&self) -> usize {
        self.counts.lock().unwrap().values().sum()
    }

    pub fn of(&self, key: &str) -> usize {
        self.counts.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    pub fn snapshot(&self) -> HashMap<String, usize> {
        self.counts.lock().unwrap().clone()
    }

    /// The most handlers that ever ran at once for one key (must stay 1).
    pub fn max_concurrent_same_key(&self) -> usize {
        *self.max_concurrent_same_key.lock().unwrap()
    }

    /// Waits until at least `n` executions have started in total.
    pub async fn wait_started(&self, n: usize, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let notified = self.started.notified();
            if self.total() >= n {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("only {} of {n} executions started", self.total());
            }
        }
    }

    async fn run(&self, key: String) {
        {
            *self.counts.lock().unwrap().entry(key.clone()).or_default() += 1;
            let mut running = self.running.lock().unwrap();
            let now = running.entry(key.clone()).or_default();
            *now += 1;
            let mut max = self.max_concurrent_same_key.lock().unwrap();
            *max = (*max).max(*now);
        }
        self.started.notify_waiters();
        if key.starts_with("held") {
            let mut hold = self.hold.subscribe();
            let _ = hold.wait_for(|held| !held).await;
        }
        *self.running.lock().unwrap().get_mut(&key).unwrap() -= 1;
    }
}

async fn counted(State(executions): State<Executions>, headers: HeaderMap, body: String) -> String {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    executions.run(key.clone()).await;
    format!("done {key} {}", body.len())
}

/// `POST /op` counting executions per key, guarded by `layer`, with [`OUTCOME_HEADER`].
pub fn counted_app(layer: tower_idempotency::IdempotencyLayer, executions: Executions) -> Router {
    Router::new()
        .route("/op", post(counted))
        .route_layer(layer)
        .layer(axum::middleware::map_response(outcome_header))
        .with_state(executions)
}

/// The `type` of a problem+json body, or `""`.
pub fn problem_type(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

pub const STORE_UNAVAILABLE: &str = "urn:tower-idempotency:problem:store-unavailable";

/// Drops a Postgres table when the test ends, even when it panics (through `psql`).
pub struct PgTableGuard {
    pub table: String,
}

impl Drop for PgTableGuard {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .arg(database_url())
            .args([
                "-q",
                "-c",
                &tower_idempotency_testkit::drop_job_tables_sql(&self.table),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Deletes every key under a prefix on the shared Redis when the test ends (through `redis-cli`).
pub struct RedisPrefixGuard {
    pub url: String,
    pub prefix: String,
}

impl Drop for RedisPrefixGuard {
    fn drop(&mut self) {
        let hp = host_port(&self.url);
        let (host, port) = hp.split_once(':').unwrap_or((&hp, "6379"));
        let script = format!(
            "redis-cli -h {host} -p {port} --scan --pattern '{p}:*' | xargs -r redis-cli -h {host} -p {port} DEL",
            p = self.prefix
        );
        let _ = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs the built `tower-idempotency` tool with `args` (and no `IDEMPOTENCY_STORE` or
/// `IDEMPOTENCY_OPERATOR` from the environment).
#[cfg(feature = "cli")]
pub async fn cli<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_tower-idempotency"))
        .args(args)
        .env_remove("IDEMPOTENCY_STORE")
        .env_remove("IDEMPOTENCY_OPERATOR")
        .kill_on_drop(true)
        .output()
        .await
        .expect("run the tool")
}

/// What the tool printed to standard output, which must have succeeded.
#[cfg(feature = "cli")]
pub fn stdout(output: &std::process::Output) -> String {
    assert!(
        output.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// What the tool prints for `args` (with `--json`), which must succeed.
#[cfg(feature = "cli")]
pub async fn json(args: &[String]) -> serde_json::Value {
    serde_json::from_str(&stdout(&cli(args).await)).unwrap()
}
