//! Throw-away `redis-server` processes on loopback ports, and a 3-master Redis Cluster of them.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::{Child, ChildStdin, Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use crate::{env::random_u64, free_port, skip, which};

/// Extra arguments for a server that loses no acknowledged write to a SIGKILL (an append-only
/// file, fsynced on every write), for tests that kill and restart it.
pub const DURABLE: [&str; 4] = ["--appendonly", "yes", "--appendfsync", "always"];

/// The shell that runs a server: it kills the server and removes its directory as soon as our
/// end of its stdin closes (on drop, and when the test process dies without running destructors:
/// a panic in a static's owner, an abort, a kill), and kills it but keeps the directory when it
/// reads a line ([`RedisServer::kill`], which a restart follows). The server's stdin is
/// /dev/null, so only `read` holds the pipe.
const WRAPPER: &str = r#"dir=$1; shift
redis-server "$@" </dev/null >/dev/null 2>&1 &
pid=$!
read _ || gone=1
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
[ -z "$gone" ] || rm -rf "$dir""#;

/// A `redis-server` process of our own on a loopback port, in a directory of its own.
pub struct RedisServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    args: Vec<String>,
    dir: PathBuf,
    running: Option<(Child, ChildStdin)>,
}

impl RedisServer {
    /// Starts a server on a free port with `extra` arguments, or answers `None` after
    /// [`skip`]ping when it cannot run (fails under CI).
    pub fn start(extra: &[&str]) -> Option<Self> {
        Self::start_on(free_port(), extra)
    }

    /// Starts a server on `port` with `extra` arguments (later arguments win over the defaults:
    /// no snapshots, no append-only file).
    pub fn start_on(port: u16, extra: &[&str]) -> Option<Self> {
        if !which("redis-server") {
            skip("a throw-away redis-server", "redis-server is not installed");
            return None;
        }
        let dir = std::env::temp_dir().join(format!(
            "tidem-redis-{}-{:08x}",
            std::process::id(),
            random_u64() as u32
        ));
        if let Err(e) = std::fs::create_dir_all(&dir) {
            skip("a throw-away redis-server", &format!("no directory ({e})"));
            return None;
        }
        let mut args: Vec<String> = ["--port", &port.to_string(), "--bind", "127.0.0.1"]
            .into_iter()
            .chain(["--save", "", "--appendonly", "no", "--logfile", "redis.log"])
            .map(str::to_owned)
            .collect();
        args.extend(["--dir".to_owned(), dir.display().to_string()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut server = Self {
            port,
            args,
            dir,
            running: None,
        };
        match server.run() {
            Ok(()) => Some(server),
            Err(why) => {
                skip("a throw-away redis-server", &why);
                None
            }
        }
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server with SIGKILL, as a crash would; its directory (and append-only file)
    /// stays for [`RedisServer::restart`].
    pub fn kill(&mut self) {
        if let Some((mut wrapper, mut stdin)) = self.running.take() {
            let _ = stdin.write_all(b"\n");
            drop(stdin);
            let _ = wrapper.wait();
        }
    }

    /// Starts the killed server again on its port, directory and arguments, and waits until it
    /// answers (it loads its append-only file first, if it has one).
    ///
    /// # Panics
    ///
    /// When it is running, or does not start.
    pub fn restart(&mut self) {
        assert!(self.running.is_none(), "already running");
        self.run().expect("redis-server restarts");
    }

    fn run(&mut self) -> Result<(), String> {
        let mut wrapper = Command::new("sh")
            .arg("-c")
            .arg(WRAPPER)
            .arg("sh")
            .arg(&self.dir)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run sh ({e})"))?;
        let stdin = wrapper.stdin.take().expect("piped stdin");
        self.running = Some((wrapper, stdin));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.answers_ping() {
            if Instant::now() > deadline {
                self.kill();
                return Err("redis-server did not start within 10 s".to_owned());
            }
            // A process starting has no signal to await; this polls its port.
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Whether the server answers `PING` with `PONG` (while it loads its data it answers
    /// `-LOADING`).
    fn answers_ping(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        let mut reply = [0u8; 64];
        stream.write_all(b"PING\r\n").is_ok()
            && stream
                .read(&mut reply)
                .is_ok_and(|n| reply[..n].starts_with(b"+PONG"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A 3-master Redis Cluster of our own.
pub struct Cluster {
    /// Its nodes.
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    /// The nodes' `redis://` URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Starts a cluster on free ports.
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
            let mut args = vec!["--cluster-enabled", "yes"];
            args.extend([
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-port",
                &bus,
            ]);
            let announced = ports.map(|ports| ports[i].1.to_string());
            if let Some(announced) = &announced {
                args.extend(["--cluster-announce-ip", "127.0.0.1"]);
                args.extend(["--cluster-announce-port", announced]);
                args.extend(["--cluster-announce-bus-port", &bus]);
            }
            let port = ports.map_or_else(free_port, |ports| ports[i].0);
            let node = RedisServer::start_on(port, &args).ok_or("a cluster node did not start")?;
            nodes.push(node);
        }
        let cluster = Self { nodes };
        cluster.create()?;
        Ok(cluster)
    }

    /// Assigns the slots (`redis-cli --cluster create`) and waits until every node reports
    /// `cluster_state:ok`.
    fn create(&self) -> Result<(), String> {
        let addresses = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port));
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(addresses)
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
        for node in &self.nodes {
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
                // The nodes agree over their bus with no signal to await; this polls them.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// One cluster per test binary, started on first use, or `None` after [`skip`]ping (fails
    /// under CI). It is never dropped (statics are not), so its nodes die with the test process
    /// through their stdin pipes.
    pub fn shared() -> Option<&'static Cluster> {
        static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
        match CLUSTER.get_or_init(Cluster::start) {
            Ok(cluster) => Some(cluster),
            Err(why) => {
                skip("the Redis Cluster tests", why);
                None
            }
        }
    }
}
