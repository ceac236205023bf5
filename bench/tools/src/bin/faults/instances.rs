//! The receiver instances: started with the inbox and the outbox on, killed with `SIGKILL`
//! and started again on the same port.

use std::{
    io::Write,
    path::PathBuf,
    process::Stdio,
    sync::{
        atomic::{AtomicBool, AtomicI64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::Mutex,
};

use crate::db::BoxError;

/// The receivers' inbox and relay settings: short enough that a run drains in about a minute.
pub const MAX_ATTEMPTS: u32 = 8;
pub const BACKOFF_MS: u64 = 250;
pub const LEASE_MS: u64 = 3000;
const SWEEP_MS: u64 = 250;

/// The longest a due event or message waits once the faults stop: a lapsed lease, then every
/// backoff of its attempts.
pub fn horizon() -> Duration {
    let backoffs: u64 = (0..MAX_ATTEMPTS - 1).map(|n| BACKOFF_MS << n).sum();
    Duration::from_millis(LEASE_MS + backoffs)
}

/// What every instance is started with.
pub struct Launch {
    pub receiver: PathBuf,
    /// `IDEMPOTENCY_STORE`: the SQLite file, or Postgres through the proxy.
    pub store_url: String,
    pub secret: String,
    pub target_url: String,
    pub logs: PathBuf,
    pub pids: PathBuf,
}

pub struct Slot {
    child: Option<Child>,
    pub starts: u64,
}

pub struct Instances {
    launch: Launch,
    pub ports: Vec<u16>,
    /// Per instance, the handler delay (`HANDLER_DELAY_MS`): one fast, one slow.
    pub delays_ms: Vec<u64>,
    slots: Vec<Mutex<Slot>>,
    /// Acknowledgements in flight, per instance.
    pub acks_in_flight: Vec<AtomicI64>,
    /// `INBOX_ORDERING=skip-stale` for instances started from now on.
    pub skip_stale: AtomicBool,
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Instances {
    pub fn new(launch: Launch, count: usize) -> Result<Arc<Self>, BoxError> {
        let ports = (0..count).map(|_| free_port()).collect::<Result<_, _>>()?;
        let delays_ms = if count == 1 {
            vec![150]
        } else {
            (0..count)
                .map(|i| if i % 2 == 0 { 40 } else { 500 })
                .collect()
        };
        Ok(Arc::new(Self {
            launch,
            ports,
            delays_ms,
            slots: (0..count)
                .map(|_| {
                    Mutex::new(Slot {
                        child: None,
                        starts: 0,
                    })
                })
                .collect(),
            acks_in_flight: (0..count).map(|_| AtomicI64::new(0)).collect(),
            skip_stale: AtomicBool::new(false),
        }))
    }

    pub fn len(&self) -> usize {
        self.ports.len()
    }

    pub fn base(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i])
    }

    /// Starts instance `i` (killing it first if it runs), retrying until it listens or
    /// `within` passes (a receiver cannot start while its database is cut off).
    pub async fn restart(&self, i: usize, within: Duration) -> Result<u32, BoxError> {
        let mut slot = self.slots[i].lock().await;
        if let Some(mut child) = slot.child.take() {
            let _ = child.kill().await;
        }
        let deadline = Instant::now() + within;
        let mut tries = 0;
        loop {
            tries += 1;
            match self.spawn(i).await {
                Ok(child) => {
                    slot.child = Some(child);
                    slot.starts += 1;
                    return Ok(tries);
                }
                Err(error) if Instant::now() >= deadline => return Err(error),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }

    /// `SIGKILL`s instance `i` and waits for it to exit; `false` when it was not running.
    pub async fn kill(&self, i: usize) -> bool {
        let mut slot = self.slots[i].lock().await;
        match slot.child.take() {
            Some(mut child) => {
                let _ = child.kill().await;
                true
            }
            None => false,
        }
    }

    /// Whether instance `i` exited without being killed here: its exit status, once (it is
    /// then not running).
    pub async fn exited(&self, i: usize) -> Option<String> {
        let mut slot = self.slots[i].lock().await;
        let status = slot.child.as_mut()?.try_wait().ok()??;
        slot.child = None;
        Some(status.to_string())
    }

    /// Whether instance `i` was started and not killed since.
    pub async fn running(&self, i: usize) -> bool {
        self.slots[i].lock().await.child.is_some()
    }

    pub async fn starts(&self) -> u64 {
        let mut n = 0;
        for slot in &self.slots {
            n += slot.lock().await.starts;
        }
        n
    }

    /// Kills every instance (the end of the run).
    pub async fn stop_all(&self) {
        for i in 0..self.len() {
            self.kill(i).await;
        }
    }

    async fn spawn(&self, i: usize) -> Result<Child, BoxError> {
        let l = &self.launch;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(l.logs.join(format!("instance-{i}.log")))?;
        let mut command = Command::new(&l.receiver);
        command
            .env("RECEIVER_ADDR", format!("127.0.0.1:{}", self.ports[i]))
            .env("IDEMPOTENCY_STORE", &l.store_url)
            .env("STRIPE_WEBHOOK_SECRET", &l.secret)
            .env("OUTBOX_TARGET_URL", &l.target_url)
            .env("HANDLER_DELAY_MS", self.delays_ms[i].to_string())
            .env("INBOX_MAX_ATTEMPTS", MAX_ATTEMPTS.to_string())
            .env("INBOX_BACKOFF_MS", BACKOFF_MS.to_string())
            .env("INBOX_LEASE_MS", LEASE_MS.to_string())
            .env("INBOX_SWEEP_MS", SWEEP_MS.to_string())
            .env("INBOX_CONCURRENCY", "4")
            .env("INBOX_POOL_SIZE", "8")
            .env("RUST_LOG", "warn")
            .env_remove("INBOX_ORDERING")
            .env_remove("INBOX_RETENTION_SECS")
            .env_remove("INBOX_HEAL_FILE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        if self.skip_stale.load(Ordering::SeqCst) {
            command.env("INBOX_ORDERING", "skip-stale");
        }
        let mut child = command.spawn()?;
        if let Some(pid) = child.id() {
            let mut pids = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&l.pids)?;
            writeln!(pids, "{pid}")?;
        }
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
        match first {
            Ok(Ok(Some(line))) if line.starts_with("listening on ") => {
                // Nothing else is printed on stdout; keep reading so the pipe never fills.
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                Ok(child)
            }
            _ => {
                let _ = child.kill().await;
                Err(format!("instance {i} did not start (see instance-{i}.log)").into())
            }
        }
    }
}
