//! Shared helpers for the facade's fault-injection and bad-input tests: an HTTP server on a free
//! loopback port with an execution counter, a controllable TCP proxy, a restartable
//! `redis-server`, and cleanup guards for the shared Postgres and Redis.
#![allow(dead_code)] // Each test binary uses a different subset.

use std::{
    collections::HashMap,
    hash::{BuildHasher, RandomState},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{extract::State, http::HeaderMap, response::Response, routing::post, Router};
use tokio::{
    net::TcpListener,
    sync::{watch, Notify},
};
use tower_idempotency::Outcome;

/// The response header the test middleware copies the layer's [`Outcome`] into.
pub const OUTCOME_HEADER: &str = "x-test-outcome";

pub fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Skips loudly outside CI, fails under `CI=true`.
pub fn skip(test: &str, why: &str) {
    if in_ci() {
        panic!("{test} cannot run under CI=true: {why}");
    }
    eprintln!("SKIPPED {test}: {why}");
}

pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

pub fn random_suffix() -> String {
    format!("{:016x}", RandomState::new().hash_one(Instant::now()))
}

/// `host:port` of a `scheme://[user@]host:port[/db]` URL.
pub fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

/// Serves `app` on a free loopback port; the server lives as long as the test's runtime.
pub async fn serve(app: Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    format!("http://{addr}")
}

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

mod proxy;
#[allow(unused_imports)] // Each test binary uses a different subset.
pub use proxy::{Mode, Proxy};

/// A `redis-server` of our own on a fixed loopback port and directory, with an fsync-always
/// append-only file so that a SIGKILL loses no acknowledged write, restartable on the same port.
pub struct RedisProcess {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind loopback")
        .port()
}

pub fn which(binary: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {binary}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

impl RedisProcess {
    /// Starts a server, or `None` when `redis-server` is not installed.
    pub fn start() -> Option<Self> {
        if !which("redis-server") {
            return None;
        }
        let dir = std::env::temp_dir().join(format!("tidem-faults-redis-{}", random_suffix()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut server = Self {
            port: free_port(),
            dir,
            child: None,
        };
        server.restart();
        Some(server)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// (Re)starts the server on its port and directory and waits until it accepts connections.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--logfile", "redis.log"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                use std::io::{Read, Write};
                // Loading the AOF answers -LOADING; wait for a real PONG.
                let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
                let mut reply = [0u8; 64];
                if s.write_all(b"PING\r\n").is_ok()
                    && s.read(&mut reply)
                        .is_ok_and(|n| reply[..n].starts_with(b"+PONG"))
                {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Drops a Postgres table when the test ends, even when it panics (through `psql`).
pub struct PgTableGuard {
    pub table: String,
}

impl Drop for PgTableGuard {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .arg(database_url())
            .args(["-q", "-c", &format!("DROP TABLE IF EXISTS {}", self.table)])
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

/// Whether something listens on `host:port`.
pub fn reachable(host_port: &str) -> bool {
    use std::net::ToSocketAddrs;
    host_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_secs(1)).is_ok())
}
