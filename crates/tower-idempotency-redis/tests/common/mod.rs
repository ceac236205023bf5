//! Test support: connecting to the shared Redis, throw-away redis-server processes and a
//! throw-away 3-master Redis Cluster, all cleaned up even when a test fails.
#![allow(dead_code)] // Each test binary uses a different subset.

use std::{
    hash::{BuildHasher, RandomState},
    io::Write,
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, ChildStdin, Command, Stdio},
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tower_idempotency_redis::RedisStore;

pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Skips loudly outside CI, fails in CI.
pub fn skip(why: &str) {
    if in_ci() {
        panic!("redis store tests cannot run under CI=true: {why}");
    }
    eprintln!("SKIPPED redis store tests: {why}");
}

pub fn random_u64() -> u64 {
    RandomState::new().hash_one(Instant::now())
}

pub fn random_prefix() -> String {
    format!("tidem-test:{:016x}", random_u64())
}

fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(Some(Duration::from_millis(500)))
        .set_number_of_retries(1)
}

pub async fn manager(url: &str) -> redis::RedisResult<ConnectionManager> {
    ConnectionManager::new_with_config(redis::Client::open(url)?, manager_config()).await
}

/// Deletes every key under a prefix on the given nodes when dropped. For a cluster, each master
/// is scanned on its own connection: `SCAN` only sees the keys of the node it is sent to.
pub struct Cleanup {
    nodes: Vec<String>,
    prefix: String,
}

impl Cleanup {
    pub fn new(nodes: Vec<String>, prefix: &str) -> Arc<Self> {
        Arc::new(Self {
            nodes,
            prefix: prefix.to_owned(),
        })
    }

    pub fn count_keys(&self) -> usize {
        self.nodes
            .iter()
            .map(|url| scan(url, &self.prefix).map(|k| k.len()).unwrap_or(0))
            .sum()
    }
}

fn scan(url: &str, prefix: &str) -> redis::RedisResult<Vec<String>> {
    let mut con = redis::Client::open(url)?.get_connection()?;
    let keys: Vec<String> = redis::cmd("SCAN")
        .cursor_arg(0)
        .arg("MATCH")
        .arg(format!("{prefix}:*"))
        .arg("COUNT")
        .arg(1000)
        .clone()
        .iter(&mut con)?
        .collect::<Result<_, _>>()?;
    Ok(keys)
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for url in &self.nodes {
            let Ok(keys) = scan(url, &self.prefix) else {
                continue;
            };
            if let Ok(mut con) = redis::Client::open(url.as_str()).and_then(|c| c.get_connection())
            {
                for key in keys {
                    let _: redis::RedisResult<()> = redis::cmd("DEL").arg(key).query(&mut con);
                }
            }
        }
    }
}

/// A store that deletes its keys when the last clone is dropped.
pub type TestStore = tower_idempotency_core::conformance::Guarded<RedisStore, Arc<Cleanup>>;

/// A store on the shared standalone Redis with its own prefix, or `None` (after saying why) when
/// Redis is unreachable outside CI.
pub async fn standalone_store() -> Option<TestStore> {
    let prefix = random_prefix();
    standalone_store_with_prefix(&prefix).await
}

pub async fn standalone_store_with_prefix(prefix: &str) -> Option<TestStore> {
    let url = redis_url();
    let manager = match manager(&url).await {
        Ok(manager) => manager,
        Err(e) => {
            skip(&format!("cannot connect to REDIS_URL ({e:?})"));
            return None;
        }
    };
    let store = RedisStore::new(manager, prefix).expect("valid prefix");
    store.preload_scripts().await.expect("script load");
    Some(TestStore {
        store,
        guard: Cleanup::new(vec![url], prefix),
    })
}

/// Picks a loopback port that is free right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind loopback")
        .port()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tidem-redis-{name}-{}-{:08x}",
        std::process::id(),
        random_u64() as u32
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A redis-server process of our own on a free loopback port.
///
/// It runs under `sh`, which kills it and removes its directory as soon as our end of its stdin
/// closes: on drop, and also when the test process dies without running destructors (a panic
/// in a static's owner, an abort, a kill). Drop also kills it directly and waits.
pub struct RedisServer {
    pub port: u16,
    wrapper: Child,
    stdin: Option<ChildStdin>,
    dir: PathBuf,
}

impl RedisServer {
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts a server, or returns `None` (after saying why) when `redis-server` is missing.
    pub fn start(extra: &[&str]) -> Option<Self> {
        Self::start_on(free_port(), extra)
    }

    /// Starts a server on the given loopback port.
    pub fn start_on(port: u16, extra: &[&str]) -> Option<Self> {
        if !which("redis-server") {
            skip("redis-server is not installed");
            return None;
        }
        let dir = temp_dir("server");
        let mut args = vec![
            "--port".to_owned(),
            port.to_string(),
            "--bind".to_owned(),
            "127.0.0.1".to_owned(),
            "--save".to_owned(),
            "''".to_owned(),
            "--appendonly".to_owned(),
            "no".to_owned(),
            "--dir".to_owned(),
            dir.display().to_string(),
            "--logfile".to_owned(),
            "redis.log".to_owned(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        // The server's stdin is /dev/null, so only `read` holds the pipe and sees its EOF.
        let script = format!(
            "redis-server {} </dev/null >/dev/null 2>&1 & pid=$!; read _; \
             kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf '{}'",
            args.join(" "),
            dir.display()
        );
        let mut wrapper = match Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(child) => child,
            Err(e) => {
                skip(&format!("cannot run sh ({e})"));
                return None;
            }
        };
        let stdin = wrapper.stdin.take();
        let server = Self {
            port,
            wrapper,
            stdin,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                skip("redis-server did not start within 10 s");
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(server)
    }

    /// Kills the server now (the test goes on without it).
    pub fn kill(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"\n");
        }
        let _ = self.wrapper.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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

/// A 3-master Redis Cluster of our own.
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    pub fn start() -> Result<Self, String> {
        Self::start_announcing(None)
    }

    /// Starts a cluster with `(port, announced port)` per node: each node listens on `port` and
    /// advertises `127.0.0.1` and its announced port (e.g. a proxy in front of it) in
    /// `CLUSTER SLOTS`, so that cluster clients reach every node through those ports only.
    pub fn start_announcing(ports: Option<[(u16, u16); 3]>) -> Result<Self, String> {
        if !which("redis-server") || !which("redis-cli") {
            return Err("redis-server or redis-cli not installed".to_owned());
        }
        let mut nodes = Vec::new();
        for i in 0..3 {
            let bus = free_port().to_string();
            let mut args = vec![
                "--cluster-enabled".to_owned(),
                "yes".to_owned(),
                "--cluster-config-file".to_owned(),
                "nodes.conf".to_owned(),
                "--cluster-port".to_owned(),
                bus.clone(),
            ];
            if let Some(ports) = ports {
                args.extend(
                    [
                        "--cluster-announce-ip",
                        "127.0.0.1",
                        "--cluster-announce-port",
                        &ports[i].1.to_string(),
                        "--cluster-announce-bus-port",
                        &bus,
                    ]
                    .map(str::to_owned),
                );
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let port = ports.map_or_else(free_port, |ports| ports[i].0);
            let node = RedisServer::start_on(port, &args).ok_or("a cluster node did not start")?;
            nodes.push(node);
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("redis-cli --cluster create: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&output.stdout)
            ));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in &nodes {
            loop {
                let info = Command::new("redis-cli")
                    .args(["-p", &node.port.to_string(), "cluster", "info"])
                    .output()
                    .map_err(|e| e.to_string())?;
                if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                    break;
                }
                if Instant::now() > deadline {
                    return Err("cluster_state did not become ok".to_owned());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(Self { nodes })
    }

    /// One cluster per test binary, started on first use. It is never dropped (statics are not),
    /// so its nodes die with the test process through their stdin pipes.
    pub fn shared() -> Option<&'static Cluster> {
        static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
        match CLUSTER.get_or_init(Cluster::start) {
            Ok(cluster) => Some(cluster),
            Err(why) => {
                skip(why);
                None
            }
        }
    }
}

pub async fn cluster_connection(
    cluster: &Cluster,
) -> redis::RedisResult<redis::cluster_async::ClusterConnection> {
    redis::cluster::ClusterClientBuilder::new(cluster.urls())
        .connection_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_secs(2))
        .build()?
        .get_async_connection()
        .await
}

/// A store on the shared test cluster with its own prefix.
pub async fn cluster_store() -> Option<TestStore> {
    let cluster = Cluster::shared()?;
    let prefix = random_prefix();
    let connection = cluster_connection(cluster)
        .await
        .expect("cluster connection");
    let store = RedisStore::cluster(connection, &prefix).expect("valid prefix");
    store.preload_scripts().await.expect("script load");
    Some(TestStore {
        store,
        guard: Cleanup::new(cluster.urls(), &prefix),
    })
}
