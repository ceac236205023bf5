//! The peer under comparison, `idempotent` 2.0, served by the `loadtest-peer` binary (its own
//! package, `peer/`, outside the workspace: see its Cargo.toml for why) in a child process, one
//! per cell like the in-process targets' fresh servers.

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
};

use crate::{HarnessError, Result};

/// Which `idempotent` store the peer serves, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PeerStore {
    /// The echo handler without a layer, in the peer's process: the control showing that a child
    /// process serves as fast as the harness's own bare server.
    Bare,
    /// `idempotent::memory::MemoryStore` with its defaults.
    Memory,
    /// `idempotent::valkey::ValkeyStore` on the run's Redis.
    Valkey,
}

impl PeerStore {
    /// The name the flags and tables use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            PeerStore::Bare => "peer-bare",
            PeerStore::Memory => "idempotent-memory",
            PeerStore::Valkey => "idempotent-valkey",
        }
    }

    fn flag(self) -> &'static str {
        match self {
            PeerStore::Bare => "bare",
            PeerStore::Memory => "memory",
            PeerStore::Valkey => "valkey",
        }
    }
}

/// Where bench/scripts/bench.sh builds the peer: `target/peer/release/loadtest-peer`.
pub(crate) fn default_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/peer/release/loadtest-peer")
}

/// A running peer; dropping it closes its stdin (its signal to exit), kills it and reaps it.
pub(crate) struct PeerServer {
    /// Its process id.
    pub(crate) pid: u32,
    /// Its loopback address.
    pub(crate) addr: SocketAddr,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `binary` serving `store` (a Valkey store on `redis_url` under `prefix`) and waits for
/// the address it listens on.
pub(crate) fn start(
    binary: &Path,
    store: PeerStore,
    redis_url: &str,
    prefix: &str,
) -> Result<PeerServer> {
    let mut child = Command::new(binary)
        .args(["--store", store.flag(), "--redis-url", redis_url])
        .args(["--prefix", prefix])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    // From here on a failure drops `server`, which stops the child.
    let mut server = PeerServer {
        pid: child.id(),
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        child,
        stdin,
    };
    let mut line = String::new();
    if let Some(stdout) = stdout {
        BufReader::new(stdout).read_line(&mut line)?;
    }
    server.addr = line
        .trim()
        .strip_prefix("listening ")
        .and_then(|addr| addr.parse().ok())
        .ok_or(HarnessError::Child(
            "loadtest-peer did not report its address",
        ))?;
    Ok(server)
}

/// `Err` says why the peer targets are skipped: the binary is missing.
pub(crate) fn check_binary(binary: &Path) -> Result<(), String> {
    if binary.is_file() {
        Ok(())
    } else {
        Err(format!(
            "{} not found (bench/scripts/bench.sh builds it: cargo build --release --ignore-rust-version --manifest-path bench/peer/Cargo.toml --target-dir target/peer)",
            binary.display()
        ))
    }
}

/// The peer's Valkey prefix for the run `run`: `idempotent` refuses `:` in a prefix.
pub(crate) fn valkey_prefix(run: &str) -> String {
    format!("loadtest_peer_{run}")
}
