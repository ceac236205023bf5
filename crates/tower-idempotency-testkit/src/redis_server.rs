//! Throw-away `redis-server` processes on loopback ports, and a 3-master Redis Cluster of them.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::{Child, ChildStdin, Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use crate::{env::random_u64, skip, which, ReservedPort, TestCertificates};

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

/// A `redis-server` process of our own on a [`ReservedPort`] of 127.0.0.1, in a directory of its
/// own.
pub struct RedisServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    _ports: Vec<ReservedPort>,
    extra: Vec<String>,
    dir: PathBuf,
    running: Option<(Child, ChildStdin)>,
    tls: Option<Tls>,
}

/// A server's TLS port and the certificates it serves.
struct Tls {
    port: u16,
    certificates: TestCertificates,
}

/// Why a `redis-server` did not come up.
#[derive(Debug)]
enum StartError {
    /// Something outside the tests holds one of its ports (`Address already in use`).
    PortTaken,
    /// Anything else, said.
    Failed(String),
}

/// How many times a server is started again on other ports when something outside the tests
/// holds one of its ports.
const PORT_ATTEMPTS: usize = 5;

/// How long a server may take to answer `PING` on a loaded machine.
const START_WITHIN: Duration = Duration::from_secs(30);

impl RedisServer {
    /// Starts a server on a reserved port with `extra` arguments (later arguments win over the
    /// defaults: no snapshots, no append-only file), or answers `None` after [`skip`]ping when
    /// it cannot run (fails under CI).
    pub fn start(extra: &[&str]) -> Option<Self> {
        match Self::start_with(extra, None, false) {
            Ok(server) => Some(server),
            Err(why) => {
                skip("a throw-away redis-server", &why);
                None
            }
        }
    }

    /// Starts a server that serves TLS on a second reserved port ([`tls_url`](Self::tls_url))
    /// with a certificate for 127.0.0.1 signed by a CA of its own ([`ca_pem`](Self::ca_pem)),
    /// besides plain connections on [`port`](Self::port); clients need no certificate. Answers
    /// `None` after [`skip`]ping when it cannot run (fails under CI), e.g. when the
    /// `redis-server` binary was built without TLS.
    pub fn start_tls() -> Option<Self> {
        match Self::start_with(&[], None, true) {
            Ok(server) => Some(server),
            Err(why) => {
                skip("a throw-away TLS redis-server", &why);
                None
            }
        }
    }

    /// Starts a server on a reserved port with `extra` arguments, plus the arguments `bus` makes
    /// from a second reserved port of its own (a cluster node's bus port), plus a TLS port with
    /// fresh certificates when `tls`; on ports that something outside the tests holds, it tries
    /// again on new ones.
    fn start_with(
        extra: &[&str],
        bus: Option<&dyn Fn(u16) -> Vec<String>>,
        tls: bool,
    ) -> Result<Self, String> {
        if !which("redis-server") {
            return Err("redis-server is not installed".to_owned());
        }
        let mut certificates = tls.then(TestCertificates::generate);
        for _ in 0..PORT_ATTEMPTS {
            let dir = std::env::temp_dir().join(format!(
                "tidem-redis-{}-{:08x}",
                std::process::id(),
                random_u64() as u32
            ));
            std::fs::create_dir_all(&dir).map_err(|e| format!("no directory ({e})"))?;
            let mut ports = vec![ReservedPort::new()];
            let mut extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
            if let Some(bus) = bus {
                let bus_port = ReservedPort::new();
                extra.extend(bus(bus_port.port()));
                ports.push(bus_port);
            }
            let tls = certificates.take().map(|certificates| {
                let tls_port = ReservedPort::new();
                let port = tls_port.port();
                ports.push(tls_port);
                Tls { port, certificates }
            });
            let mut server = Self {
                port: ports[0].port(),
                _ports: ports,
                extra,
                dir,
                running: None,
                tls,
            };
            match server.run() {
                Ok(()) => return Ok(server),
                Err(StartError::PortTaken) => {
                    // The next attempt serves the same certificates.
                    certificates = server.tls.take().map(|tls| tls.certificates);
                    continue;
                }
                Err(StartError::Failed(why)) => return Err(why),
            }
        }
        Err(format!(
            "every one of {PORT_ATTEMPTS} reserved ports was taken by another program"
        ))
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `rediss://127.0.0.1:tls_port` of a server from [`start_tls`](Self::start_tls).
    ///
    /// # Panics
    ///
    /// When the server serves no TLS.
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls().port)
    }

    /// The PEM certificate of the CA that signed the TLS certificate of a server from
    /// [`start_tls`](Self::start_tls).
    ///
    /// # Panics
    ///
    /// When the server serves no TLS.
    pub fn ca_pem(&self) -> &str {
        &self.tls().certificates.ca_pem
    }

    fn tls(&self) -> &Tls {
        self.tls.as_ref().expect("a server started with start_tls")
    }

    /// Kills the server with SIGKILL, as a crash would; its directory (and append-only file) and
    /// its reserved ports stay for [`RedisServer::restart`].
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
        if let Err(e) = self.run() {
            panic!("redis-server restarts: {e:?}");
        }
    }

    /// The server's arguments: its port and the defaults, then the caller's.
    fn args(&self) -> Vec<String> {
        let port = self.port.to_string();
        let dir = self.dir.display().to_string();
        let mut args: Vec<String> = ["--port", &port, "--bind", "127.0.0.1", "--dir", &dir]
            .into_iter()
            .chain(["--save", "", "--appendonly", "no", "--logfile", "redis.log"])
            .map(str::to_owned)
            .collect();
        if let Some(tls) = &self.tls {
            let file = |name: &str| self.dir.join(name).display().to_string();
            args.extend([
                "--tls-port".to_owned(),
                tls.port.to_string(),
                "--tls-cert-file".to_owned(),
                file("cert.pem"),
                "--tls-key-file".to_owned(),
                file("key.pem"),
                "--tls-ca-cert-file".to_owned(),
                file("ca.pem"),
                "--tls-auth-clients".to_owned(),
                "no".to_owned(),
            ]);
        }
        args.extend(self.extra.iter().cloned());
        args
    }

    fn run(&mut self) -> Result<(), StartError> {
        let log = self.dir.join("redis.log");
        // A log left by an earlier run (before a restart) would be read as this run's.
        let _ = std::fs::remove_file(&log);
        if let Some(tls) = &self.tls {
            tls.certificates
                .write(&self.dir)
                .map_err(|e| StartError::Failed(format!("cannot write the certificates ({e})")))?;
        }
        let mut wrapper = Command::new("sh")
            .arg("-c")
            .arg(WRAPPER)
            .arg("sh")
            .arg(&self.dir)
            .args(self.args())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| StartError::Failed(format!("cannot run sh ({e})")))?;
        let stdin = wrapper.stdin.take().expect("piped stdin");
        self.running = Some((wrapper, stdin));
        let deadline = Instant::now() + START_WITHIN;
        while !self.answers_ping() {
            let written = std::fs::read_to_string(&log).unwrap_or_default();
            let failed = if written.contains("Address already in use") {
                Some(StartError::PortTaken)
            } else if written.contains("aborting")
                || written.contains("FATAL")
                || written.contains("Failed to configure TLS")
            {
                Some(StartError::Failed(format!(
                    "redis-server exited: {}",
                    written.lines().last().unwrap_or_default()
                )))
            } else if Instant::now() > deadline {
                Some(StartError::Failed(format!(
                    "redis-server did not answer within {START_WITHIN:?}"
                )))
            } else {
                None
            };
            if let Some(failed) = failed {
                self.kill();
                return Err(failed);
            }
            // A process starting has no signal to await; this polls its port and its log.
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

    /// Starts a cluster on reserved ports.
    pub fn start() -> Result<Self, String> {
        let cluster = Self::nodes_announcing(None)?;
        cluster.create()?;
        Ok(cluster)
    }

    /// Starts three cluster nodes, not yet one cluster ([`Cluster::create`] makes it), whose node
    /// `i` advertises `127.0.0.1` and `announced[i]` (e.g. a proxy in front of it, listening
    /// already) in `CLUSTER SLOTS`, so that cluster clients reach every node through those ports
    /// only.
    pub fn nodes_announcing(announced: Option<[u16; 3]>) -> Result<Self, String> {
        if !which("redis-cli") {
            return Err("redis-cli is not installed".to_owned());
        }
        let mut nodes = Vec::new();
        for i in 0..3 {
            let bus_args = |bus: u16| {
                let bus = bus.to_string();
                let mut args = vec!["--cluster-port".to_owned(), bus.clone()];
                if let Some(announced) = announced {
                    args.extend(["--cluster-announce-ip".to_owned(), "127.0.0.1".to_owned()]);
                    args.extend([
                        "--cluster-announce-port".to_owned(),
                        announced[i].to_string(),
                    ]);
                    args.extend(["--cluster-announce-bus-port".to_owned(), bus]);
                }
                args
            };
            let cluster_args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ];
            let node = RedisServer::start_with(&cluster_args, Some(&bus_args), false)
                .map_err(|why| format!("a cluster node did not start: {why}"))?;
            nodes.push(node);
        }
        Ok(Self { nodes })
    }

    /// Assigns the slots (`redis-cli --cluster create`) and waits until every node reports
    /// `cluster_state:ok`.
    pub fn create(&self) -> Result<(), String> {
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
        // Generous: three nodes agreeing over their bus on a loaded 2-core machine.
        let deadline = Instant::now() + Duration::from_secs(60);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A server whose port another program holds is told apart from one that did not start,
    /// so that [`RedisServer::start`] tries again on another port.
    #[test]
    fn a_port_held_by_another_program_is_reported_as_taken() {
        if !which("redis-server") {
            skip("a throw-away redis-server", "redis-server is not installed");
            return;
        }
        // A program outside the tests may take a reserved port between its check and any later
        // bind (what `start` answers by trying another port); this test takes another too.
        let (reserved, _other_program) = (0..10)
            .find_map(|_| {
                let reserved = ReservedPort::new();
                let listener = std::net::TcpListener::bind(("127.0.0.1", reserved.port())).ok()?;
                Some((reserved, listener))
            })
            .expect("a reserved port this test can listen on");
        let dir = std::env::temp_dir().join(format!("tidem-redis-taken-{:08x}", random_u64()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = RedisServer {
            port: reserved.port(),
            _ports: vec![reserved],
            extra: Vec::new(),
            dir,
            running: None,
            tls: None,
        };
        let outcome = server.run();
        assert!(matches!(outcome, Err(StartError::PortTaken)), "{outcome:?}");
        assert!(
            server.running.is_none(),
            "the failed server's wrapper is gone"
        );
    }

    #[test]
    fn a_started_server_answers_and_restarts_on_its_port() {
        let Some(mut server) = RedisServer::start(&[]) else {
            return;
        };
        let port = server.port;
        assert!(server.answers_ping());
        server.kill();
        assert!(!server.answers_ping(), "killed");
        server.restart();
        assert_eq!(server.port, port);
        assert!(server.answers_ping(), "restarted");
    }
}
