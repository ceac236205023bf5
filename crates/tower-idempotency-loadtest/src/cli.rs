//! The command line: flags, their defaults and the usage text.

use std::{path::PathBuf, time::Duration};

use crate::{HarnessError, Result};

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
                       0 runs every statement through sqlx's pool (an A/B against lanes)
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

/// The parsed flags.
#[derive(Clone, Debug)]
pub(crate) struct Args {
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) stores: Vec<String>,
    pub(crate) shared_runtime: bool,
    pub(crate) store_lanes: Option<usize>,
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
