//! Load harness for tower-idempotency.
//!
//! In one run it starts, on loopback, a bare echo handler and the same handler behind
//! `IdempotencyLayer::client_keys(store)` for each store (memory, SQLite, Postgres, Redis), drives
//! each with a built-in load generator for three workloads (new keys, replays, hot-key
//! duplicates) at several concurrency levels, and reports throughput, p50/p99 latency, the
//! layer/bare throughput ratio, store round trips per request, raw store floors, multi-instance
//! scaling, peak RSS, memory per in-flight request and bytes allocated per request. Results go to
//! JSON, CSV and Markdown under `target/bench-results/`, and a chart to an SVG file.
//!
//! Run `cargo run --release -p tower-idempotency-loadtest -- --help` for the flags.
#![warn(missing_docs)]

mod alloc;
mod load;
mod proxy;
mod report;
mod server;

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::PathBuf,
    process::ExitCode,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::runtime::{Handle, Runtime};
use tower_idempotency_core::{
    scope::Scope, Fingerprint, FingerprintMode, IdempotencyLayer, LocalReplayCache, MemoryStore,
    PrincipalSource,
};
use tower_idempotency_redis::RedisStore;
use tower_idempotency_sqlx::{sqlx, PostgresStore, SqliteStore};

use load::{drive, Keys, LoadResult, Plan, Stop, Workload, REPLAY_KEYS};
use server::{router, serve, App, Gate};

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

/// Everything that can stop the harness.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// Socket or file I/O.
    #[error("i/o error")]
    Io(#[from] std::io::Error),
    /// The load generator failed.
    #[error(transparent)]
    Load(#[from] load::LoadError),
    /// A SQL statement of the harness itself failed.
    #[error("sql error")]
    Sql(#[from] sqlx::Error),
    /// A Redis command of the harness itself failed.
    #[error("redis error")]
    Redis(#[from] redis::RedisError),
    /// Results could not be serialised.
    #[error("json error")]
    Json(#[from] serde_json::Error),
    /// A measurement child process failed.
    #[error("measurement child `{0}` failed")]
    Child(&'static str),
    /// A bad command-line flag.
    #[error("bad flag {0}")]
    Usage(String),
}

type Result<T, E = HarnessError> = std::result::Result<T, E>;

const USAGE: &str = "\
tower-idempotency load harness

USAGE: cargo run --release -p tower-idempotency-loadtest -- [FLAGS]

  --duration-ms N      measured window per cell (default 2000)
  --warmup-ms N        unrecorded lead-in per cell (default 500)
  --concurrency LIST   comma-separated worker counts (default 1,16,64)
  --stores LIST        memory,memory-constfp,sqlite,postgres,redis,postgres+cache,redis+cache
                       (default all); +cache wraps the store in a LocalReplayCache (local
                       replays); memory-constfp is an experiment: the memory store with a
                       constant fingerprint, to isolate the cost of SHA-256 over the body
  --store-lanes N      connections the sqlx stores keep checked out (default: half the pool);
                       0 runs every statement through the pool, as before session 6
  --runtime MODE       split: server and client on separate 1-worker runtimes (default);
                       shared: one 2-worker runtime for both
  --out DIR            results directory (default <workspace>/target/bench-results)
  --chart PATH         SVG chart path (default <out>/throughput.svg)
  --no-memory          skip the RSS / in-flight / allocation child processes
  --no-scaling         skip the multi-instance scaling runs
  --quick              smoke run: 300 ms cells, 100 ms warm-up, small memory runs
  --from-json PATH     measure nothing: rewrite the Markdown, CSV and chart from a saved JSON
Environment: DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test),
             REDIS_URL (default redis://127.0.0.1:6379)";

#[derive(Clone, Debug)]
struct Args {
    duration: Duration,
    warmup: Duration,
    concurrency: Vec<usize>,
    stores: Vec<String>,
    shared_runtime: bool,
    store_lanes: Option<usize>,
    out: PathBuf,
    chart: Option<PathBuf>,
    memory: bool,
    scaling: bool,
    quick: bool,
    from_json: Option<PathBuf>,
}

fn parse_args(raw: &[String]) -> Result<Args> {
    let mut args = Args {
        duration: Duration::from_millis(2000),
        warmup: Duration::from_millis(500),
        concurrency: vec![1, 16, 64],
        stores: [
            "memory",
            "memory-constfp",
            "sqlite",
            "postgres",
            "redis",
            "postgres+cache",
            "redis+cache",
        ]
        .map(String::from)
        .to_vec(),
        shared_runtime: false,
        store_lanes: None,
        out: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-results"),
        chart: None,
        memory: true,
        scaling: true,
        quick: false,
        from_json: None,
    };
    let mut it = raw.iter();
    let bad = |flag: &str| HarnessError::Usage(flag.to_owned());
    while let Some(flag) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| bad(flag));
        match flag.as_str() {
            "--duration-ms" => {
                args.duration = Duration::from_millis(value()?.parse().map_err(|_| bad(flag))?)
            }
            "--warmup-ms" => {
                args.warmup = Duration::from_millis(value()?.parse().map_err(|_| bad(flag))?)
            }
            "--concurrency" => {
                args.concurrency = value()?
                    .split(',')
                    .map(|c| c.trim().parse().map_err(|_| bad(flag)))
                    .collect::<Result<_>>()?
            }
            "--stores" => args.stores = value()?.split(',').map(|s| s.trim().to_owned()).collect(),
            "--runtime" => {
                args.shared_runtime = match value()?.as_str() {
                    "shared" => true,
                    "split" => false,
                    _ => return Err(bad(flag)),
                }
            }
            "--store-lanes" => args.store_lanes = Some(value()?.parse().map_err(|_| bad(flag))?),
            "--out" => args.out = PathBuf::from(value()?),
            "--chart" => args.chart = Some(PathBuf::from(value()?)),
            "--no-memory" => args.memory = false,
            "--from-json" => args.from_json = Some(PathBuf::from(value()?)),
            "--no-scaling" => args.scaling = false,
            "--quick" => {
                args.quick = true;
                args.duration = Duration::from_millis(300);
                args.warmup = Duration::from_millis(100);
            }
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => return Err(bad(flag)),
        }
    }
    Ok(args)
}

/// The two runtimes: the servers (and stores) on one, the load generator on the other.
struct Runtimes {
    _owned: Vec<Runtime>,
    server: Handle,
    client: Handle,
}

fn runtimes(shared: bool) -> Result<Runtimes> {
    let build = |name: &str, workers: usize, server: bool| {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder
            .worker_threads(workers)
            .thread_name(name)
            .enable_all();
        if server {
            builder.on_thread_start(alloc::mark_server_thread);
        }
        builder.build()
    };
    if shared {
        let rt = build("loadtest", 2, false)?;
        let handle = rt.handle().clone();
        Ok(Runtimes {
            server: handle.clone(),
            client: handle,
            _owned: vec![rt],
        })
    } else {
        let server = build("lt-server", 1, true)?;
        let client = build("lt-client", 1, false)?;
        Ok(Runtimes {
            server: server.handle().clone(),
            client: client.handle().clone(),
            _owned: vec![server, client],
        })
    }
}

/// A store under test.
#[derive(Clone)]
enum Target {
    Bare,
    Memory,
    /// An experiment, not a configuration to ship: the memory store with the request fingerprint
    /// replaced by a constant, to show how much of the layer's cost is the SHA-256 of the body.
    MemoryConstantFingerprint,
    Sqlite(Arc<SqliteStore>),
    Postgres(Arc<PostgresStore>),
    Redis(RedisStore),
    /// The Postgres store behind a `LocalReplayCache`.
    PostgresCached(Arc<PostgresStore>),
    /// The Redis store behind a `LocalReplayCache`.
    RedisCached(RedisStore),
}

impl Target {
    fn name(&self) -> &'static str {
        match self {
            Target::Bare => "bare",
            Target::Memory => "memory",
            Target::MemoryConstantFingerprint => "memory-constfp",
            Target::Sqlite(_) => "sqlite",
            Target::Postgres(_) => "postgres",
            Target::Redis(_) => "redis",
            Target::PostgresCached(_) => "postgres+cache",
            Target::RedisCached(_) => "redis+cache",
        }
    }

    /// A fresh layer; the memory store (and a local cache) is new each time so a cell's records
    /// are freed after it.
    fn layer(&self) -> Option<IdempotencyLayer> {
        Some(match self {
            Target::Bare => return None,
            Target::Memory => {
                IdempotencyLayer::client_keys(MemoryStore::new().with_max_entries(50_000_000))
            }
            Target::MemoryConstantFingerprint => {
                IdempotencyLayer::client_keys(MemoryStore::new().with_max_entries(50_000_000))
                    .fingerprint(FingerprintMode::Custom(Arc::new(|_, _| {
                        Fingerprint([0; 32])
                    })))
            }
            Target::Sqlite(s) => IdempotencyLayer::client_keys(s.clone()),
            Target::Postgres(s) => IdempotencyLayer::client_keys(s.clone()),
            Target::Redis(s) => IdempotencyLayer::client_keys(s.clone()),
            Target::PostgresCached(s) => {
                IdempotencyLayer::client_keys(LocalReplayCache::new(s.clone()))
            }
            Target::RedisCached(s) => {
                IdempotencyLayer::client_keys(LocalReplayCache::new(s.clone()))
            }
        })
    }

    /// Like [`Target::layer`], plus a handle on the memory stores' allocation: once it is the
    /// last reference, the cell's records are gone and their memory can be handed back.
    fn layer_with_handle(
        &self,
    ) -> (
        Option<IdempotencyLayer>,
        Option<Arc<dyn std::any::Any + Send + Sync>>,
    ) {
        match self {
            Target::Memory => {
                let store = Arc::new(MemoryStore::new().with_max_entries(50_000_000));
                (
                    Some(IdempotencyLayer::client_keys(store.clone())),
                    Some(store),
                )
            }
            _ => (self.layer(), None),
        }
    }

    /// SQL statements executed so far, for the stores that count them.
    fn statements(&self) -> Option<u64> {
        match self {
            Target::Sqlite(s) => Some(s.statements_executed()),
            Target::Postgres(s) | Target::PostgresCached(s) => Some(s.statements_executed()),
            _ => None,
        }
    }
}

/// One measured configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cell {
    /// `bare` or the store.
    pub target: String,
    /// The workload (the bare handler runs the new-key pattern: it ignores keys).
    pub workload: Workload,
    /// Workers.
    pub concurrency: usize,
    /// Request (and echoed response) body size.
    pub body_bytes: usize,
    /// What the generator measured.
    pub result: LoadResult,
    /// This cell's throughput over the bare handler's at the same concurrency and body size.
    pub ratio_vs_bare: Option<f64>,
    /// SQL statements per request over the whole cell (warm-up included), sqlx stores only.
    pub statements_per_request: Option<f64>,
}

/// Store round trips per request, from a dedicated counting pass.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RoundTrips {
    /// The store.
    pub store: String,
    /// The workload.
    pub workload: Workload,
    /// Workers in the pass.
    pub concurrency: usize,
    /// Requests sent.
    pub requests: u64,
    /// `statements` (sqlx counter) or `commands` (counted on the wire by a proxy).
    pub unit: String,
    /// Round trips in total.
    pub round_trips: u64,
    /// Per request.
    pub per_request: f64,
    /// Status mix of the pass.
    pub executed: u64,
    /// Replays.
    pub replayed: u64,
    /// `409`s.
    pub conflicts: u64,
}

/// A raw store round trip, without the layer or HTTP.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Floor {
    /// The store.
    pub store: String,
    /// What was sent.
    pub operation: String,
    /// Concurrent callers.
    pub concurrency: usize,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Median, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
}

/// Several receiver instances sharing one backend.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScalingRow {
    /// The store.
    pub store: String,
    /// Receiver instances (own layer, own pool or connection, own listener).
    pub instances: usize,
    /// The workload.
    pub workload: Workload,
    /// Workers, spread round-robin over the instances.
    pub concurrency: usize,
    /// What the generator measured.
    pub result: LoadResult,
    /// Handler executions over all instances.
    pub handler_runs: u64,
    /// Keys whose handler ran more than once (must be 0).
    pub keys_run_twice: u64,
}

/// Output of a measurement child process, one JSON object on stdout.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChildReport {
    /// Which measurement.
    pub kind: String,
    /// `bare` or `memory`.
    pub target: String,
    /// Body size.
    pub body_bytes: usize,
    /// Requests sent (or held in flight).
    pub requests: u64,
    /// VmRSS before the load, KiB.
    pub rss_before_kib: u64,
    /// VmRSS after (or while in flight), KiB.
    pub rss_after_kib: u64,
    /// VmHWM at the end, KiB.
    pub hwm_kib: u64,
    /// Live heap bytes (counting allocator) before.
    pub live_before: i64,
    /// Live heap bytes after (or while in flight).
    pub live_after: i64,
    /// Live heap bytes allocated by server threads, before.
    pub server_live_before: i64,
    /// Live heap bytes allocated by server threads, after (or while in flight).
    pub server_live_after: i64,
    /// Bytes allocated on server threads per request.
    pub server_bytes_per_request: Option<f64>,
    /// Allocation calls on server threads per request.
    pub server_allocs_per_request: Option<f64>,
    /// Requests per second of the child's run.
    pub rps: f64,
}

/// Everything one run produced.
#[derive(Debug, Serialize, Deserialize)]
pub struct Results {
    /// Unix time of the start.
    pub started_unix: u64,
    /// `/proc/loadavg` at the start.
    pub loadavg_start: String,
    /// `/proc/loadavg` at the end.
    pub loadavg_end: String,
    /// Logical CPUs.
    pub cpus: usize,
    /// `split` (1 server worker + 1 client worker) or `shared` (one 2-worker runtime).
    pub runtime: String,
    /// Measured window per cell, ms.
    pub duration_ms: u64,
    /// Warm-up per cell, ms.
    pub warmup_ms: u64,
    /// Throughput cells.
    pub cells: Vec<Cell>,
    /// Round trips per request.
    pub round_trips: Vec<RoundTrips>,
    /// Raw store floors.
    pub floors: Vec<Floor>,
    /// Multi-instance runs.
    pub scaling: Vec<ScalingRow>,
    /// Child-process memory measurements.
    pub memory: Vec<ChildReport>,
    /// What was skipped, and why.
    pub skipped: Vec<String>,
}

fn main() -> ExitCode {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let outcome = if raw.first().map(String::as_str) == Some("--child") {
        child(&raw[1..])
    } else {
        parse_args(&raw).and_then(run)
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let mut message = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            eprintln!("loadtest: {message}");
            ExitCode::FAILURE
        }
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}{:x}", std::process::id(), nanos & 0xffff_ffff)
}

fn body(size: usize) -> Bytes {
    Bytes::from(vec![b'x'; size])
}

struct Backends {
    run: String,
    sqlite_path: PathBuf,
    pg_url: String,
    pg_table: String,
    redis_url: String,
    redis_prefix: String,
    /// `--store-lanes`, applied to every sqlx store the harness opens.
    store_lanes: Option<usize>,
}

impl Backends {
    fn postgres(&self, store: PostgresStore) -> PostgresStore {
        match self.store_lanes {
            Some(lanes) => store.with_connection_lanes(lanes),
            None => store,
        }
    }
}

fn run(args: Args) -> Result<()> {
    if let Some(path) = &args.from_json {
        let results: Results = serde_json::from_slice(&std::fs::read(path)?)?;
        return report::write_all(&args, &results);
    }
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let loadavg_start = loadavg();
    let rts = runtimes(args.shared_runtime)?;
    let run = run_id();
    let backends = Backends {
        sqlite_path: std::env::temp_dir().join(format!("tower-idempotency-loadtest-{run}.db")),
        pg_url: std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
        pg_table: format!("loadtest_{run}"),
        redis_url: std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
        redis_prefix: format!("loadtest:{run}"),
        store_lanes: args.store_lanes,
        run,
    };
    eprintln!(
        "loadtest: run {} (load average {loadavg_start}); runtime {}",
        backends.run,
        if args.shared_runtime {
            "shared 2-worker"
        } else {
            "split 1+1 workers"
        }
    );
    let mut skipped = Vec::new();
    let mut targets = vec![Target::Bare];
    for store in &args.stores {
        match rts.server.block_on(open_store(store, &backends)) {
            Ok(target) => targets.push(target),
            Err(why) => {
                eprintln!("loadtest: SKIPPING store {store}: {why}");
                skipped.push(format!("{store}: {why}"));
            }
        }
    }

    let mut results = Results {
        started_unix,
        loadavg_start,
        loadavg_end: String::new(),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        runtime: if args.shared_runtime {
            "shared"
        } else {
            "split"
        }
        .to_owned(),
        duration_ms: args.duration.as_millis() as u64,
        warmup_ms: args.warmup.as_millis() as u64,
        cells: Vec::new(),
        round_trips: Vec::new(),
        floors: Vec::new(),
        scaling: Vec::new(),
        memory: Vec::new(),
        skipped,
    };
    let outcome = measure_all(&args, &rts, &backends, &targets, &mut results);
    drop(targets);
    cleanup(&rts, &backends);
    outcome?;
    results.loadavg_end = loadavg();
    report::write_all(&args, &results)
}

async fn open_store(name: &str, b: &Backends) -> Result<Target, String> {
    let describe = |e: &dyn std::error::Error| {
        let mut text = e.to_string();
        if let Some(source) = e.source() {
            text.push_str(&format!(": {source}"));
        }
        text
    };
    match name {
        "memory" => Ok(Target::Memory),
        "memory-constfp" => Ok(Target::MemoryConstantFingerprint),
        "sqlite" => {
            let url = format!("sqlite://{}", b.sqlite_path.display());
            let store = SqliteStore::connect(&url).await.map_err(|e| describe(&e))?;
            let store = match b.store_lanes {
                Some(lanes) => store.with_connection_lanes(lanes),
                None => store,
            };
            store.migrate().await.map_err(|e| describe(&e))?;
            Ok(Target::Sqlite(Arc::new(store)))
        }
        // Both Postgres targets share the table (each cell uses keys of its own run); the
        // migration is idempotent, and needed by whichever of them runs first.
        "postgres" | "postgres+cache" => {
            let store = PostgresStore::connect_with_table(&b.pg_url, &b.pg_table)
                .await
                .map_err(|e| describe(&e))?;
            let store = b.postgres(store);
            store.migrate().await.map_err(|e| describe(&e))?;
            let store = Arc::new(store);
            Ok(if name == "postgres" {
                Target::Postgres(store)
            } else {
                Target::PostgresCached(store)
            })
        }
        // Both Redis targets share the prefix too.
        "redis" | "redis+cache" => {
            let store = RedisStore::connect(&b.redis_url, &b.redis_prefix)
                .await
                .map_err(|e| describe(&e))?;
            Ok(if name == "redis" {
                Target::Redis(store)
            } else {
                Target::RedisCached(store)
            })
        }
        other => Err(format!("unknown store {other:?}")),
    }
}

fn cleanup(rts: &Runtimes, b: &Backends) {
    let pg = async {
        let pool = sqlx::PgPool::connect(&b.pg_url).await?;
        sqlx::raw_sql(&format!(
            "DROP TABLE IF EXISTS \"{0}\"; DROP SEQUENCE IF EXISTS \"{0}_token_seq\";",
            b.pg_table
        ))
        .execute(&pool)
        .await?;
        pool.close().await;
        Ok::<_, sqlx::Error>(())
    };
    if let Err(e) = rts.server.block_on(pg) {
        eprintln!("loadtest: could not drop table {}: {e}", b.pg_table);
    }
    let redis = async {
        let client = redis::Client::open(b.redis_url.as_str())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let pattern = format!("{}:*", b.redis_prefix);
        let mut cursor: u64 = 0;
        let mut deleted = 0usize;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(5000)
                .query_async(&mut conn)
                .await?;
            if !keys.is_empty() {
                deleted += keys.len();
                let () = redis::cmd("UNLINK")
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await?;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        Ok::<_, redis::RedisError>(deleted)
    };
    match rts.server.block_on(redis) {
        Ok(n) => eprintln!("loadtest: deleted {n} redis keys under {}", b.redis_prefix),
        Err(e) => eprintln!(
            "loadtest: could not clean redis prefix {}: {e}",
            b.redis_prefix
        ),
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut path = b.sqlite_path.clone().into_os_string();
        path.push(suffix);
        let _ = std::fs::remove_file(path);
    }
}

fn measure_all(
    args: &Args,
    rts: &Runtimes,
    b: &Backends,
    targets: &[Target],
    results: &mut Results,
) -> Result<()> {
    let started = Instant::now();
    let mut cell_no = 0usize;
    // 1 KiB for every store; 64 KiB for the memory store only.
    for size in [1024usize, 64 * 1024] {
        for &concurrency in &args.concurrency {
            let group_start = results.cells.len();
            // The bare handler runs first and again last in each group; ratios use the mean, so
            // a drift in machine load during the group shows up as a spread between the two.
            let mut group: Vec<&Target> = targets.iter().collect();
            group.extend(targets.iter().filter(|t| matches!(t, Target::Bare)));
            for target in group {
                if size > 1024
                    && !matches!(
                        target,
                        Target::Bare | Target::Memory | Target::MemoryConstantFingerprint
                    )
                {
                    continue;
                }
                let workloads: &[Workload] = match target {
                    Target::Bare => &[Workload::New],
                    _ => &Workload::ALL,
                };
                for &workload in workloads {
                    cell_no += 1;
                    let run = format!("{}-c{cell_no}", b.run);
                    let cell = run_cell(args, rts, target, workload, concurrency, size, run)?;
                    eprintln!(
                        "  {:>8} {:>6} c={:<3} {:>3}KiB {:>9.0} req/s  p50 {:>7.0} us  p99 {:>7.0} us  [{} exec, {} replay, {} 409, {} other, {} err]",
                        cell.target,
                        workload.name(),
                        concurrency,
                        size / 1024,
                        cell.result.rps,
                        cell.result.p50_us,
                        cell.result.p99_us,
                        cell.result.executed,
                        cell.result.replayed,
                        cell.result.conflicts,
                        cell.result.other_status,
                        cell.result.errors,
                    );
                    results.cells.push(cell);
                }
            }
            let group = &mut results.cells[group_start..];
            let bare: Vec<f64> = group
                .iter()
                .filter(|c| c.target == "bare")
                .map(|c| c.result.rps)
                .collect();
            let bare_mean = bare.iter().sum::<f64>() / bare.len().max(1) as f64;
            for cell in group.iter_mut().filter(|c| c.target != "bare") {
                cell.ratio_vs_bare = (bare_mean > 0.0).then(|| cell.result.rps / bare_mean);
            }
            eprintln!(
                "  bare runs of this group: {:?} req/s",
                bare.iter().map(|r| r.round()).collect::<Vec<_>>()
            );
        }
    }
    eprintln!(
        "loadtest: throughput cells done in {:.0?}",
        started.elapsed()
    );

    for target in targets {
        results
            .round_trips
            .extend(count_round_trips(args, rts, b, target)?);
    }
    for target in targets {
        results.floors.extend(floors(args, rts, b, target)?);
    }
    eprintln!(
        "loadtest: round trips and floors done at {:.0?}",
        started.elapsed()
    );
    if args.scaling {
        for target in targets {
            if matches!(target, Target::Postgres(_) | Target::Redis(_)) {
                results.scaling.extend(scaling(args, rts, b, target)?);
            }
        }
        eprintln!("loadtest: scaling done at {:.0?}", started.elapsed());
    }
    if args.memory {
        results.memory = memory_children(args)?;
        eprintln!(
            "loadtest: memory children done at {:.0?}",
            started.elapsed()
        );
    }
    Ok(())
}

fn run_cell(
    args: &Args,
    rts: &Runtimes,
    target: &Target,
    workload: Workload,
    concurrency: usize,
    size: usize,
    run: String,
) -> Result<Cell> {
    let (layer, store_handle) = target.layer_with_handle();
    let server = rts.server.block_on(serve(router(App::default(), layer)))?;
    let body = body(size);
    let keys = match workload {
        Workload::New => Keys::Unique,
        Workload::Replay => Keys::Cycle(REPLAY_KEYS),
        Workload::Hot => Keys::Hot,
    };
    if workload == Workload::Replay {
        rts.client.block_on(drive(Plan {
            targets: vec![server.addr],
            run: run.clone(),
            keys,
            body: body.clone(),
            concurrency: 16,
            stop: Stop::Count(REPLAY_KEYS),
        }))?;
    }
    let statements_before = target.statements();
    let result = rts.client.block_on(drive(Plan {
        targets: vec![server.addr],
        run,
        keys,
        body,
        concurrency,
        stop: Stop::Timed {
            warmup: args.warmup,
            measure: args.duration,
        },
    }))?;
    let statements_per_request = statements_before
        .zip(target.statements())
        .map(|(before, after)| (after - before) as f64 / result.total_requests.max(1) as f64);
    drop(server);
    if let Some(handle) = store_handle {
        release_memory(handle);
    }
    Ok(Cell {
        target: target.name().into(),
        workload,
        concurrency,
        body_bytes: size,
        result,
        ratio_vs_bare: None,
        statements_per_request,
    })
}

/// Waits until a memory store's last other reference is gone (the server's connection tasks
/// end shortly after the load generator closes its connections), then hands freed heap pages
/// back to the OS. Otherwise the next cell would reuse this cell's already-faulted pages and be
/// measured as cheaper than the one before it.
fn release_memory(handle: Arc<dyn std::any::Any + Send + Sync>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    // Polling is fine here: nothing signals the drop of the last connection task's router clone.
    while Arc::strong_count(&handle) > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(handle);
    trim_heap();
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_heap() {
    extern "C" {
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    // SAFETY: glibc's malloc_trim takes a byte count and only releases free heap memory.
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_heap() {}

/// A counting pass per workload: 16 workers, a fixed number of requests, round trips counted on
/// the wire by a proxy (Redis commands, Postgres exchanges) or, for SQLite, which has no wire,
/// by the store's statement counter.
fn count_round_trips(
    args: &Args,
    rts: &Runtimes,
    b: &Backends,
    target: &Target,
) -> Result<Vec<RoundTrips>> {
    // The Redis store under count connects through the proxy, with the same prefix.
    let (counted, proxy, unit) = match target {
        Target::Bare | Target::Memory | Target::MemoryConstantFingerprint => return Ok(Vec::new()),
        Target::Sqlite(_) => (target.clone(), None, "statements"),
        Target::Postgres(_) | Target::PostgresCached(_) => {
            use std::str::FromStr;
            let options = sqlx::postgres::PgConnectOptions::from_str(&b.pg_url)?;
            use std::net::ToSocketAddrs;
            let upstream = (options.get_host(), options.get_port())
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| HarnessError::Usage("DATABASE_URL host does not resolve".into()))?;
            let proxy = rts
                .server
                .block_on(proxy::start(upstream, proxy::Protocol::Postgres))?;
            let options = options
                .host("127.0.0.1")
                .port(proxy.addr.port())
                .ssl_mode(sqlx::postgres::PgSslMode::Disable);
            let store = rts.server.block_on(async {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(10)
                    .connect_with(options)
                    .await?;
                Ok::<_, sqlx::Error>(Arc::new(
                    b.postgres(
                        PostgresStore::new(pool, &b.pg_table)
                            .expect("the harness's table name is valid"),
                    ),
                ))
            })?;
            let counted = match target {
                Target::PostgresCached(_) => Target::PostgresCached(store),
                _ => Target::Postgres(store),
            };
            (counted, Some(proxy), "round trips")
        }
        Target::Redis(_) | Target::RedisCached(_) => {
            let upstream = redis_addr(&b.redis_url)?;
            let proxy = rts
                .server
                .block_on(proxy::start(upstream, proxy::Protocol::Resp))?;
            let url = format!("redis://{}", proxy.addr);
            let store = rts
                .server
                .block_on(RedisStore::connect(&url, &b.redis_prefix))
                .map_err(|_| HarnessError::Child("redis through the counting proxy"))?;
            let counted = match target {
                Target::RedisCached(_) => Target::RedisCached(store),
                _ => Target::Redis(store),
            };
            (counted, Some(proxy), "commands")
        }
    };
    let counter = || match (&proxy, &counted) {
        (Some(p), _) => p.count.load(Ordering::SeqCst),
        (None, t) => t.statements().unwrap_or(0),
    };
    let requests = if args.quick { 200 } else { 2000 };
    let mut rows = Vec::new();
    for workload in Workload::ALL {
        let server = rts
            .server
            .block_on(serve(router(App::default(), counted.layer())))?;
        let run = format!("{}-rt-{}-{}", b.run, target.name(), workload.name());
        let keys = match workload {
            Workload::New => Keys::Unique,
            Workload::Replay => Keys::Cycle(REPLAY_KEYS),
            Workload::Hot => Keys::Hot,
        };
        let plan = |stop| Plan {
            targets: vec![server.addr],
            run: run.clone(),
            keys,
            body: body(1024),
            concurrency: 16,
            stop,
        };
        if workload == Workload::Replay {
            rts.client.block_on(drive(plan(Stop::Count(REPLAY_KEYS))))?;
        } else {
            // Outside the count: the store's first statements on each connection (taking it
            // from the pool, preparing each statement once), on keys of their own.
            let warm = Plan {
                run: format!("{run}-warm"),
                ..plan(Stop::Count(64))
            };
            rts.client.block_on(drive(warm))?;
        }
        let before = counter();
        let result = rts.client.block_on(drive(plan(Stop::Count(requests))))?;
        let trips = counter() - before;
        rows.push(RoundTrips {
            store: target.name().into(),
            workload,
            concurrency: 16,
            requests: result.total_requests,
            unit: unit.into(),
            round_trips: trips,
            per_request: trips as f64 / result.total_requests.max(1) as f64,
            executed: result.executed,
            replayed: result.replayed,
            conflicts: result.conflicts,
        });
        eprintln!(
            "  {:>8} {:>6} {:.2} {unit}/request",
            target.name(),
            workload.name(),
            rows.last().map_or(0.0, |r| r.per_request)
        );
    }
    Ok(rows)
}

fn redis_addr(url: &str) -> Result<SocketAddr> {
    let rest = url
        .strip_prefix("redis://")
        .ok_or_else(|| HarnessError::Usage("REDIS_URL must be redis://host:port".into()))?;
    let hostport = rest.split('/').next().unwrap_or(rest);
    let hostport = hostport.rsplit('@').next().unwrap_or(hostport);
    let hostport = if hostport.contains(':') {
        hostport.to_owned()
    } else {
        format!("{hostport}:6379")
    };
    use std::net::ToSocketAddrs;
    hostport
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| HarnessError::Usage("REDIS_URL host does not resolve".into()))
}

/// Runs `op` from `concurrency` tasks on the server runtime for the cell's duration.
fn floor_run<F, Fut>(
    args: &Args,
    rts: &Runtimes,
    concurrency: usize,
    op: F,
) -> (f64, Histogram<u64>)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let warmup = args.warmup.min(Duration::from_millis(300));
    let measure = args.duration.min(Duration::from_millis(1500));
    rts.server.block_on(async move {
        let start = Instant::now();
        let measure_start = start + warmup;
        let end = measure_start + measure;
        let tasks: Vec<_> = (0..concurrency)
            .map(|task| {
                let op = op.clone();
                tokio::spawn(async move {
                    let mut h = load::histogram();
                    loop {
                        let t = Instant::now();
                        if t >= end {
                            break;
                        }
                        if !op(task).await {
                            break;
                        }
                        if t >= measure_start {
                            let _ = h.record((t.elapsed().as_nanos() as u64).max(1));
                        }
                    }
                    h
                })
            })
            .collect();
        let mut merged = load::histogram();
        for task in tasks {
            if let Ok(h) = task.await {
                let _ = merged.add(&h);
            }
        }
        (merged.len() as f64 / measure.as_secs_f64(), merged)
    })
}

fn floors(args: &Args, rts: &Runtimes, b: &Backends, target: &Target) -> Result<Vec<Floor>> {
    let mut rows = Vec::new();
    let mut push = |store: &str, operation: &str, concurrency, (ops, h): (f64, Histogram<u64>)| {
        let row = Floor {
            store: store.into(),
            operation: operation.into(),
            concurrency,
            ops_per_s: ops,
            p50_us: h.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: h.value_at_quantile(0.99) as f64 / 1000.0,
        };
        eprintln!(
            "  floor {:>8} {:<40} c={:<3} p50 {:>6.0} us p99 {:>6.0} us",
            row.store, row.operation, concurrency, row.p50_us, row.p99_us
        );
        rows.push(row);
    };
    match target {
        Target::Postgres(store) => {
            let pool = store.pool().clone();
            let table = store.table().to_owned();
            // A completed row written by the replay cells (1 KiB body).
            let key: Option<String> = rts.server.block_on(
                sqlx::query_scalar(&format!(
                    "SELECT key FROM \"{table}\" WHERE state = 1 AND length(body) = 1024 LIMIT 1"
                ))
                .fetch_optional(&pool),
            )?;
            let Some(key) = key else { return Ok(rows) };
            let select = Arc::new(format!("SELECT * FROM \"{table}\" WHERE key = $1"));
            for &c in &args.concurrency {
                // One connection per caller, outside the pool: a raw round trip, not the pool's
                // hand-out and return pings around it.
                let connections = rts.server.block_on(async {
                    let mut connections = Vec::with_capacity(c);
                    for _ in 0..c {
                        let connection =
                            <sqlx::PgConnection as sqlx::Connection>::connect(&b.pg_url).await?;
                        connections.push(tokio::sync::Mutex::new(connection));
                    }
                    Ok::<_, sqlx::Error>(Arc::new(connections))
                })?;
                let (key, select) = (key.clone(), select.clone());
                let op = move |task: usize| {
                    let (connections, key, select) =
                        (connections.clone(), key.clone(), select.clone());
                    async move {
                        let mut connection = connections[task].lock().await;
                        sqlx::query(&select)
                            .bind(&key)
                            .fetch_optional(&mut *connection)
                            .await
                            .is_ok()
                    }
                };
                push(
                    "postgres",
                    "SELECT * WHERE key = $1 (1 KiB row, own connection)",
                    c,
                    floor_run(args, rts, c, op),
                );
            }
        }
        Target::Redis(store) => {
            let client = redis::Client::open(b.redis_url.as_str())?;
            let conn = rts
                .server
                .block_on(client.get_multiplexed_async_connection())?;
            // The record of a replay key: same size and layout as what a replay reads.
            let scope = Scope::new("idempotency", PrincipalSource::Extension);
            let (parts, ()) = http::Request::post("/orders")
                .body(())
                .expect("valid request")
                .into_parts();
            let key = store.redis_key(&scope.store_key(&parts, &format!("{}-floor-0", b.run)));
            let mut setup = conn.clone();
            let value = vec![b'x'; 1024 + 120];
            let () = rts.server.block_on(
                redis::cmd("SET")
                    .arg(&key)
                    .arg(&value)
                    .arg("PX")
                    .arg(600_000)
                    .query_async(&mut setup),
            )?;
            let key = Arc::new(key);
            for &c in &args.concurrency {
                let (conn, key) = (conn.clone(), key.clone());
                let op = move |_task: usize| {
                    let (mut conn, key) = (conn.clone(), key.clone());
                    async move {
                        redis::cmd("GET")
                            .arg(key.as_str())
                            .query_async::<Vec<u8>>(&mut conn)
                            .await
                            .is_ok()
                    }
                };
                push(
                    "redis",
                    "GET (1.1 KiB value)",
                    c,
                    floor_run(args, rts, c, op),
                );
            }
        }
        _ => {}
    }
    Ok(rows)
}

/// 1 to 4 receiver instances (each its own store connection/pool, layer and listener) sharing
/// one backend; workers are assigned to instances round-robin.
fn scaling(args: &Args, rts: &Runtimes, b: &Backends, target: &Target) -> Result<Vec<ScalingRow>> {
    let concurrency = args.concurrency.iter().copied().max().unwrap_or(64);
    let mut rows = Vec::new();
    for instances in 1..=4usize {
        let mut servers = Vec::new();
        let mut apps = Vec::new();
        let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
        for _ in 0..instances {
            let layer = match target {
                Target::Postgres(_) => {
                    let store = rts
                        .server
                        .block_on(PostgresStore::connect_with_table(&b.pg_url, &b.pg_table))
                        .map_err(|_| HarnessError::Child("postgres scaling instance"))?;
                    IdempotencyLayer::client_keys(b.postgres(store))
                }
                Target::Redis(_) => {
                    let store = rts
                        .server
                        .block_on(RedisStore::connect(&b.redis_url, &b.redis_prefix))
                        .map_err(|_| HarnessError::Child("redis scaling instance"))?;
                    IdempotencyLayer::client_keys(store)
                }
                _ => return Ok(rows),
            };
            let app = App {
                seen: Some(seen.clone()),
                ..App::default()
            };
            servers.push(
                rts.server
                    .block_on(serve(router(app.clone(), Some(layer))))?,
            );
            apps.push(app);
        }
        for workload in [Workload::New, Workload::Hot] {
            seen.lock().unwrap_or_else(|p| p.into_inner()).clear();
            let runs_before: u64 = apps.iter().map(|a| a.runs.load(Ordering::SeqCst)).sum();
            let result = rts.client.block_on(drive(Plan {
                targets: servers.iter().map(|s| s.addr).collect(),
                run: format!(
                    "{}-scale-{}-{instances}-{}",
                    b.run,
                    target.name(),
                    workload.name()
                ),
                keys: if workload == Workload::New {
                    Keys::Unique
                } else {
                    Keys::Hot
                },
                body: body(1024),
                concurrency,
                stop: Stop::Timed {
                    warmup: args.warmup,
                    measure: args.duration,
                },
            }))?;
            let runs_after: u64 = apps.iter().map(|a| a.runs.load(Ordering::SeqCst)).sum();
            let keys_run_twice = seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .filter(|&&n| n > 1)
                .count() as u64;
            eprintln!(
                "  scale {:>8} x{instances} {:>4} c={concurrency} {:>8.0} req/s p99 {:>7.0} us, keys run twice: {keys_run_twice}",
                target.name(),
                workload.name(),
                result.rps,
                result.p99_us
            );
            rows.push(ScalingRow {
                store: target.name().into(),
                instances,
                workload,
                concurrency,
                result,
                handler_runs: runs_after - runs_before,
                keys_run_twice,
            });
        }
    }
    Ok(rows)
}

// ---------------------------------------------------------------------------------------------
// Memory measurements, each in a child process so that peaks are separable.

fn memory_children(args: &Args) -> Result<Vec<ChildReport>> {
    let (small, large, in_flight, alloc_requests) = if args.quick {
        (2_000u64, 500u64, 200u64, 300u64)
    } else {
        (20_000, 5_000, 1_000, 2_000)
    };
    let mut jobs: Vec<Vec<String>> = Vec::new();
    for target in ["bare", "memory"] {
        jobs.push(vec![
            "rss".into(),
            target.into(),
            "1024".into(),
            small.to_string(),
        ]);
        jobs.push(vec![
            "rss".into(),
            target.into(),
            "65536".into(),
            large.to_string(),
        ]);
    }
    for target in ["bare", "memory"] {
        jobs.push(vec![
            "inflight".into(),
            target.into(),
            "1024".into(),
            in_flight.to_string(),
        ]);
    }
    for workload in ["bare", "new", "replay"] {
        for size in ["1024", "65536"] {
            jobs.push(vec![
                "alloc".into(),
                workload.into(),
                size.into(),
                alloc_requests.to_string(),
            ]);
        }
    }
    let exe = std::env::current_exe()?;
    let mut reports = Vec::new();
    for job in jobs {
        let output = std::process::Command::new(&exe)
            .arg("--child")
            .args(&job)
            .stderr(std::process::Stdio::inherit())
            .output()?;
        if !output.status.success() {
            return Err(HarnessError::Child("memory measurement"));
        }
        let report: ChildReport = serde_json::from_slice(&output.stdout)?;
        eprintln!(
            "  memory {:>8} {:>6} {:>5}B x{:<6} rss {:>7} -> {:>7} KiB (hwm {:>7}), live {:>+10} B, server {:>9} B/req {:>6} allocs/req",
            report.kind,
            report.target,
            report.body_bytes,
            report.requests,
            report.rss_before_kib,
            report.rss_after_kib,
            report.hwm_kib,
            report.live_after - report.live_before,
            report.server_bytes_per_request.map_or("-".into(), |v| format!("{v:.0}")),
            report.server_allocs_per_request.map_or("-".into(), |v| format!("{v:.1}")),
        );
        reports.push(report);
    }
    Ok(reports)
}

fn proc_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix(field)?
                    .trim_start_matches(':')
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .ok()
            })
        })
        .unwrap_or(0)
}

fn child(raw: &[String]) -> Result<()> {
    let usage = || HarnessError::Usage("--child KIND TARGET BODY REQUESTS".into());
    let [kind, target, size, requests] = raw else {
        return Err(usage());
    };
    let size: usize = size.parse().map_err(|_| usage())?;
    let requests: u64 = requests.parse().map_err(|_| usage())?;
    alloc::enable(true);
    let rts = runtimes(false)?;
    let run = run_id();
    let layer = || match target.as_str() {
        "bare" => None,
        _ => Some(IdempotencyLayer::client_keys(
            MemoryStore::new().with_max_entries(50_000_000),
        )),
    };
    let mut report = ChildReport {
        kind: kind.clone(),
        target: target.clone(),
        body_bytes: size,
        requests,
        rss_before_kib: 0,
        rss_after_kib: 0,
        hwm_kib: 0,
        live_before: 0,
        live_after: 0,
        server_live_before: 0,
        server_live_after: 0,
        server_bytes_per_request: None,
        server_allocs_per_request: None,
        rps: 0.0,
    };
    let plan = |addr, keys, concurrency, stop| Plan {
        targets: vec![addr],
        run: run.clone(),
        keys,
        body: body(size),
        concurrency,
        stop,
    };
    match kind.as_str() {
        // Peak RSS under the new-key workload (16 workers, fixed request count).
        "rss" => {
            let server = rts
                .server
                .block_on(serve(router(App::default(), layer())))?;
            report.rss_before_kib = proc_status_kib("VmRSS");
            let snap = alloc::snapshot();
            report.live_before = snap.live_bytes;
            report.server_live_before = snap.server_live_bytes;
            let result = rts.client.block_on(drive(plan(
                server.addr,
                Keys::Unique,
                16,
                Stop::Count(requests),
            )))?;
            report.rps = result.rps;
            report.rss_after_kib = proc_status_kib("VmRSS");
            let snap = alloc::snapshot();
            report.live_after = snap.live_bytes;
            report.server_live_after = snap.server_live_bytes;
        }
        // Memory held per request in flight: `requests` requests parked inside the handler.
        "inflight" => {
            let (open, gate_rx) = tokio::sync::watch::channel(false);
            let gate = Gate {
                entered: Arc::new(AtomicU64::new(0)),
                open: gate_rx,
            };
            let app = App {
                gate: Some(gate.clone()),
                ..App::default()
            };
            let server = rts.server.block_on(serve(router(app, layer())))?;
            report.rss_before_kib = proc_status_kib("VmRSS");
            let snap = alloc::snapshot();
            report.live_before = snap.live_bytes;
            report.server_live_before = snap.server_live_bytes;
            let load = rts.client.spawn(drive(plan(
                server.addr,
                Keys::Unique,
                requests as usize,
                Stop::Count(requests),
            )));
            let deadline = Instant::now() + Duration::from_secs(60);
            while gate.entered.load(Ordering::SeqCst) < requests && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            report.rss_after_kib = proc_status_kib("VmRSS");
            let snap = alloc::snapshot();
            report.live_after = snap.live_bytes;
            report.server_live_after = snap.server_live_bytes;
            let _ = open.send(true);
            rts.client.block_on(load).map_err(load::LoadError::from)??;
        }
        // Bytes allocated on the server thread per request, one request at a time.
        "alloc" => {
            let guarded = target != "bare";
            let app_layer = guarded.then(|| {
                IdempotencyLayer::client_keys(MemoryStore::new().with_max_entries(50_000_000))
            });
            let server = rts
                .server
                .block_on(serve(router(App::default(), app_layer)))?;
            let keys = if target == "replay" {
                Keys::Cycle(REPLAY_KEYS)
            } else {
                Keys::Unique
            };
            // Warm-up: connections, lazily-initialised statics and, for replays, the key set.
            // New keys get their own run id so the measured pass does not replay them.
            let mut warm = plan(server.addr, keys, 1, Stop::Count(REPLAY_KEYS));
            if target != "replay" {
                warm.run.push_str("-warm");
            }
            rts.client.block_on(drive(warm))?;
            let before = alloc::snapshot();
            let result =
                rts.client
                    .block_on(drive(plan(server.addr, keys, 1, Stop::Count(requests))))?;
            let after = alloc::snapshot();
            report.rps = result.rps;
            let n = result.total_requests.max(1) as f64;
            report.server_bytes_per_request =
                Some((after.server_bytes - before.server_bytes) as f64 / n);
            report.server_allocs_per_request =
                Some((after.server_calls - before.server_calls) as f64 / n);
            report.live_before = before.live_bytes;
            report.live_after = after.live_bytes;
            report.rss_after_kib = proc_status_kib("VmRSS");
        }
        _ => return Err(usage()),
    }
    report.hwm_kib = proc_status_kib("VmHWM");
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
