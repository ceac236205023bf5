//! Shared helpers for the facade's fault-injection and bad-input tests: an HTTP server on a free
//! loopback port with an execution counter, a controllable TCP proxy, a restartable
//! `redis-server`, and cleanup guards for the shared Postgres and Redis.
#![allow(dead_code)] // Each test binary uses a different subset.

use std::{
    collections::HashMap,
    hash::{BuildHasher, RandomState},
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{extract::State, http::HeaderMap, response::Response, routing::post, Router};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
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

/// What a [`Proxy`] does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward bytes both ways.
    Pass,
    /// Close every new connection at once (existing ones keep forwarding).
    Drop,
    /// Accept and hold connections, forwarding no bytes either way.
    Stall,
    /// Forward what clients send, hold back what servers answer (a reply lost or late after
    /// the command ran).
    HoldReplies,
}

/// A loopback TCP proxy that can drop, stall or cut connections on command.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: watch::Sender<Mode>,
    cut: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let (mode, _) = watch::channel(Mode::Pass);
        let (cut, _) = watch::channel(0u64);
        let (mode_tx, cut_tx) = (mode.clone(), cut.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *mode_tx.borrow() == Mode::Drop {
                    drop(client);
                    continue;
                }
                let upstream = upstream.clone();
                let (mode, mut cut) = (mode_tx.subscribe(), cut_tx.subscribe());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    // Dropping the pumps drops both halves of both sockets: a hard close.
                    let epoch = *cut.borrow_and_update();
                    let (a, b) = (cut.clone(), cut.clone());
                    tokio::select! {
                        biased;
                        _ = cut.changed() => {}
                        _ = async {
                            tokio::join!(
                                pump(cr, sw, mode.clone(), a, epoch, &[Mode::Stall]),
                                pump(sr, cw, mode, b, epoch, &[Mode::Stall, Mode::HoldReplies])
                            )
                        } => {}
                    }
                });
            }
        });
        Self {
            addr,
            mode,
            cut,
            task,
        }
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Closes every connection currently open through the proxy.
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    cut: watch::Receiver<u64>,
    epoch: u64,
    holds: &[Mode],
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if mode.wait_for(|m| !holds.contains(m)).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        // Bytes read just before a stall began are held back too, and dropped if the
        // connection was cut meanwhile (cut happens before the mode returns to pass).
        if mode.wait_for(|m| !holds.contains(m)).await.is_err() || *cut.borrow() != epoch {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

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
