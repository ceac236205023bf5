//! The load generator: N workers, each with one keep-alive HTTP/1.1 connection (hyper's
//! low-level client, no pool), sending `POST /orders` with an `Idempotency-Key` back to back.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;

/// Which keys the workers send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// Every request has a key never seen before: claim, handler, complete.
    New,
    /// Requests cycle over a pre-warmed key set: every request is a replay.
    Replay,
    /// Many concurrent requests on a few keys: one runs, the others get `409` or a replay.
    Hot,
}

impl Workload {
    /// All workloads, in report order.
    pub const ALL: [Workload; 3] = [Workload::New, Workload::Replay, Workload::Hot];

    /// Short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Workload::New => "new",
            Workload::Replay => "replay",
            Workload::Hot => "hot",
        }
    }
}

/// Keys of the replay set.
pub const REPLAY_KEYS: u64 = 256;
/// Keys hot at once in the hot-key workload.
pub const HOT_KEYS: u64 = 4;
/// Requests per hot key before the workload moves to fresh keys.
pub const HOT_REQUESTS_PER_KEY: u64 = 16;

/// How request number `n` is keyed.
#[derive(Clone, Copy, Debug)]
pub enum Keys {
    /// `n` itself: never repeats.
    Unique,
    /// `n % count`: the replay set (and its pre-warm pass).
    Cycle(u64),
    /// `HOT_KEYS` keys at a time, each receiving `HOT_REQUESTS_PER_KEY` requests.
    Hot,
}

impl Keys {
    /// The key of request number `n` of the run `run`.
    pub fn key(self, run: &str, n: u64) -> String {
        match self {
            Keys::Unique => format!("{run}-n-{n}"),
            Keys::Cycle(count) => format!("{run}-r-{}", n % count),
            Keys::Hot => {
                let generation = n / (HOT_KEYS * HOT_REQUESTS_PER_KEY);
                format!("{run}-h-{generation}-{}", n % HOT_KEYS)
            }
        }
    }
}

/// When the workers stop.
#[derive(Clone, Copy, Debug)]
pub enum Stop {
    /// Run for `warmup + measure`; only requests started after the warm-up are recorded.
    Timed {
        /// Unrecorded lead-in.
        warmup: Duration,
        /// Recorded window.
        measure: Duration,
    },
    /// Send exactly this many requests in total, all recorded.
    Count(u64),
}

/// One load run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Servers; worker `i` connects to `targets[i % len]` (round robin).
    pub targets: Vec<SocketAddr>,
    /// Key prefix unique to this run.
    pub run: String,
    /// Key pattern.
    pub keys: Keys,
    /// Request body.
    pub body: Bytes,
    /// Workers (= connections = requests in flight).
    pub concurrency: usize,
    /// Stop condition.
    pub stop: Stop,
}

/// What a run measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LoadResult {
    /// Requests recorded (started inside the measured window).
    pub requests: u64,
    /// Requests sent in total, warm-up included.
    pub total_requests: u64,
    /// Length of the measured window, seconds.
    pub seconds: f64,
    /// Recorded requests per second.
    pub rps: f64,
    /// Latency percentiles, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// 99.9th percentile, microseconds.
    pub p999_us: f64,
    /// Mean, microseconds.
    pub mean_us: f64,
    /// Answers that ran the handler (`201` without `Idempotent-Replayed`).
    pub executed: u64,
    /// Replays (`Idempotent-Replayed: true`).
    pub replayed: u64,
    /// `409` in-flight answers.
    pub conflicts: u64,
    /// Any other status.
    pub other_status: u64,
    /// Connection or protocol errors.
    pub errors: u64,
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A worker could not connect or handshake.
    #[error("cannot connect a load worker to {addr}")]
    Connect {
        /// The target.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A worker task panicked.
    #[error("a load worker panicked")]
    Worker(#[from] tokio::task::JoinError),
    /// Some answers were neither `201`, a replay nor `409` (e.g. `503` from a store that is
    /// unreachable or not migrated), or the connection failed: cheap error answers would make
    /// the numbers meaningless, so the run stops instead of reporting them.
    #[error("{other_status} answers with an unexpected status and {errors} connection errors out of {total} requests to {target}")]
    Unexpected {
        /// The first target of the plan.
        target: SocketAddr,
        /// Answers that were not `201`, a replay or `409`.
        other_status: u64,
        /// Connection or protocol errors.
        errors: u64,
        /// Every request sent, warm-up included.
        total: u64,
    },
}

struct WorkerOut {
    histogram: Histogram<u64>,
    result: LoadResult,
}

/// A latency histogram in nanoseconds, 1 ns .. 100 s. Two significant digits (1 % resolution)
/// keep it at ~30 KB, which matters when 1000 workers each hold one.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 2).expect("valid histogram bounds")
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> Result<Sender, LoadError> {
    let fail =
        |source: Box<dyn std::error::Error + Send + Sync>| LoadError::Connect { addr, source };
    let stream = TcpStream::connect(addr).await.map_err(|e| fail(e.into()))?;
    stream.set_nodelay(true).map_err(|e| fail(e.into()))?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| fail(e.into()))?;
    tokio::spawn(connection);
    Ok(sender)
}

/// Runs `plan` on the current runtime (workers are spawned onto it) and merges the results.
pub async fn drive(plan: Plan) -> Result<LoadResult, LoadError> {
    let plan = Arc::new(plan);
    let counter = Arc::new(AtomicU64::new(0));
    let mut senders = Vec::with_capacity(plan.concurrency);
    for worker in 0..plan.concurrency {
        senders.push(connect(plan.targets[worker % plan.targets.len()]).await?);
    }
    let start = Instant::now();
    let (measure_start, end) = match plan.stop {
        Stop::Timed { warmup, measure } => (start + warmup, Some(start + warmup + measure)),
        Stop::Count(_) => (start, None),
    };
    let workers: Vec<_> = senders
        .into_iter()
        .enumerate()
        .map(|(worker, sender)| {
            let plan = plan.clone();
            let counter = counter.clone();
            tokio::spawn(run_worker(
                plan,
                worker,
                sender,
                counter,
                measure_start,
                end,
            ))
        })
        .collect();
    let mut merged = histogram();
    let mut total = LoadResult::default();
    for worker in workers {
        let out = worker.await?;
        merged.add(&out.histogram).expect("same histogram bounds");
        let r = out.result;
        total.requests += r.requests;
        total.total_requests += r.total_requests;
        total.executed += r.executed;
        total.replayed += r.replayed;
        total.conflicts += r.conflicts;
        total.other_status += r.other_status;
        total.errors += r.errors;
    }
    let window = match end {
        Some(end) => end.duration_since(measure_start),
        None => start.elapsed(),
    };
    total.seconds = window.as_secs_f64();
    total.rps = total.requests as f64 / total.seconds;
    let us = |v: u64| v as f64 / 1000.0;
    total.p50_us = us(merged.value_at_quantile(0.50));
    total.p99_us = us(merged.value_at_quantile(0.99));
    total.p999_us = us(merged.value_at_quantile(0.999));
    total.mean_us = merged.mean() / 1000.0;
    if total.other_status > 0 || total.errors > 0 {
        return Err(LoadError::Unexpected {
            target: plan.targets[0],
            other_status: total.other_status,
            errors: total.errors,
            total: total.total_requests,
        });
    }
    Ok(total)
}

async fn run_worker(
    plan: Arc<Plan>,
    worker: usize,
    mut sender: Sender,
    counter: Arc<AtomicU64>,
    measure_start: Instant,
    end: Option<Instant>,
) -> WorkerOut {
    let addr = plan.targets[worker % plan.targets.len()];
    let host = addr.to_string();
    let mut out = WorkerOut {
        histogram: histogram(),
        result: LoadResult::default(),
    };
    loop {
        let n = counter.fetch_add(1, Ordering::Relaxed);
        match (plan.stop, end) {
            (Stop::Count(limit), _) if n >= limit => break,
            (_, Some(end)) if Instant::now() >= end => break,
            _ => {}
        }
        let request = Request::post("/orders")
            .header(header::HOST, &host)
            .header("idempotency-key", plan.keys.key(&plan.run, n))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(plan.body.clone()))
            .expect("valid request");
        let started = Instant::now();
        let answer = async {
            sender.ready().await?;
            let response = sender.send_request(request).await?;
            let status = response.status();
            let replayed = response.headers().contains_key("idempotent-replayed");
            response.into_body().collect().await?;
            Ok::<_, hyper::Error>((status, replayed))
        }
        .await;
        let elapsed = started.elapsed();
        out.result.total_requests += 1;
        let recorded = started >= measure_start;
        match answer {
            Ok((status, replayed)) => {
                if recorded {
                    out.result.requests += 1;
                    out.histogram
                        .record((elapsed.as_nanos() as u64).max(1))
                        .expect("latency within bounds");
                }
                let r = &mut out.result;
                match status {
                    _ if replayed => r.replayed += 1,
                    StatusCode::CREATED => r.executed += 1,
                    StatusCode::CONFLICT => r.conflicts += 1,
                    _ => r.other_status += 1,
                }
            }
            Err(_) => {
                out.result.errors += 1;
                // The connection is unusable after a protocol error: open a new one.
                match connect(addr).await {
                    Ok(fresh) => sender = fresh,
                    Err(_) => break,
                }
            }
        }
    }
    out
}
