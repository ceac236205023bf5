//! The command line: flags, their defaults and the usage text.

use std::{path::PathBuf, time::Duration};

use crate::{HarnessError, Result};

const USAGE: &str = "\
tower-idempotency load harness

USAGE: cargo run --release --manifest-path bench/Cargo.toml -p tower-idempotency-loadtest -- [FLAGS]

  --duration-ms N      measured window per cell (default 2000)
  --warmup-ms N        unrecorded lead-in per cell (default 500)
  --rounds N           repeat every throughput group N times (default 3); tables show the
                       median ratio and its range over the rounds
  --concurrency LIST   comma-separated worker counts (default 32)
  --bodies LIST        request body sizes in bytes (default 1024,65536; above 1 KiB only the
                       memory stores and the bare handlers run)
  --stores LIST        memory,memory-constfp,sqlite,sqlite+cache,postgres,redis,postgres+cache,
                       redis+cache,idempotent-memory,idempotent-valkey,peer-bare,sqlite-floor-write,
                       postgres-floor-write,postgres-floor-read,mysql,mysql-floor-write,
                       mysql-floor-read (default all; mysql: MYSQL_URL, default
                       mysql://root@127.0.0.1:3306/test);
                       +cache wraps the store in a LocalReplayCache (local replays);
                       memory-constfp is an experiment: the memory store with a constant
                       fingerprint, to isolate the cost of SHA-256 over the body;
                       idempotent-* is the peer (idempotent 2.0) in a loadtest-peer child,
                       peer-bare the bare handler in that child; *-floor-* run raw SQL in
                       the handler (src/sql_floors.rs)
  --peer-bin PATH      the loadtest-peer binary (default <workspace>/target/peer/release/
                       loadtest-peer, which bench/scripts/bench.sh builds)
  --sustained-ms N     fresh keys for N ms at the highest concurrency against the memory
                       stores with their default capacity, counting 503s (default 10000; 0 skips)
  --store-lanes N      connections the sqlx stores keep checked out (default: half the pool);
                       0 runs every statement through sqlx's pool (an A/B against lanes)
  --coalescing         the Postgres stores coalesce claims and completions while their lanes are
                       busy (PostgresStore::with_coalescing(true); an A/B against the default)
  --runtime MODE       split: server and client on separate 1-worker runtimes (default);
                       shared: one 2-worker runtime for both
  --out DIR            results directory (default <workspace>/target/bench-results)
  --chart PATH         SVG chart path (default <out>/throughput.svg)
  --no-memory          skip the RSS / in-flight / allocation child processes
  --no-scaling         skip the multi-instance scaling runs
  --quick              smoke run: one round, 300 ms cells, 100 ms warm-up, 1 s sustained
                       run, small memory runs
  --from-json PATH     measure nothing: rewrite the Markdown, CSV and chart from a saved JSON
Environment: DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test),
             REDIS_URL (default redis://127.0.0.1:6379)";

/// The parsed flags.
#[derive(Clone, Debug)]
pub(crate) struct Args {
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) rounds: usize,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) bodies: Vec<usize>,
    pub(crate) stores: Vec<String>,
    pub(crate) peer_binary: PathBuf,
    pub(crate) sustained: Duration,
    pub(crate) shared_runtime: bool,
    pub(crate) store_lanes: Option<usize>,
    pub(crate) coalescing: bool,
    pub(crate) out: PathBuf,
    pub(crate) chart: Option<PathBuf>,
    pub(crate) memory: bool,
    pub(crate) scaling: bool,
    pub(crate) quick: bool,
    pub(crate) from_json: Option<PathBuf>,
}

/// Parses the flags (`--help` prints [`USAGE`] and exits).
pub(crate) fn parse_args(raw: &[String]) -> Result<Args> {
    let mut args = Args {
        duration: Duration::from_millis(2000),
        warmup: Duration::from_millis(500),
        rounds: 3,
        concurrency: vec![32],
        bodies: vec![1024, 64 * 1024],
        peer_binary: crate::peer::default_binary(),
        sustained: Duration::from_secs(10),
        stores: crate::setup::TARGETS[1..]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        shared_runtime: false,
        store_lanes: None,
        coalescing: false,
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
            "--rounds" => args.rounds = value()?.parse().map_err(|_| bad(flag))?,
            "--bodies" => {
                args.bodies = value()?
                    .split(',')
                    .map(|c| c.trim().parse().map_err(|_| bad(flag)))
                    .collect::<Result<_>>()?
            }
            "--peer-bin" => args.peer_binary = PathBuf::from(value()?),
            "--sustained-ms" => {
                args.sustained = Duration::from_millis(value()?.parse().map_err(|_| bad(flag))?)
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
            "--coalescing" => args.coalescing = true,
            "--from-json" => args.from_json = Some(PathBuf::from(value()?)),
            "--no-scaling" => args.scaling = false,
            "--quick" => {
                args.quick = true;
                args.rounds = 1;
                args.sustained = Duration::from_millis(1000);
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
