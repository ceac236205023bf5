//! Load harness for tower-idempotency.
//!
//! In one run it starts, on loopback, a bare echo handler and the same handler behind
//! `IdempotencyLayer::client_keys(store)` for each store (memory, SQLite, Postgres, Redis), the
//! peer (`idempotent` 2.0 with its memory and Valkey stores, in a child process: [`peer`]) and
//! the SQL floors (raw statements in the handler: [`sql_floors`]); drives each with a built-in
//! load generator for three workloads (new keys, replays, hot-key duplicates), in several rounds,
//! and reports throughput, p50/p99 latency, the ratio to the bare handler and to the cell's
//! reference (peer or floor) per round, store round trips per request, raw store floors,
//! sustained fresh keys at default capacity, multi-instance scaling, peak RSS, memory per
//! in-flight request and bytes allocated per request. Results go to JSON, CSV and Markdown under
//! `target/bench-results/`, and a chart to an SVG file.
//!
//! One module per measurement ([`throughput`], [`round_trips`], [`floors`], [`sustained`],
//! [`scaling`], [`memory`]); [`summary`] and [`report`] write the tables; this file parses the
//! flags, opens the targets and runs each measurement in turn.
//!
//! Run `cargo run --release --manifest-path bench/Cargo.toml -p tower-idempotency-loadtest -- --help` for the flags.
#![warn(missing_docs)]

mod alloc;
mod cli;
mod cpu;
mod floors;
mod load;
mod memory;
mod peer;
mod report;
mod round_trips;
mod scaling;
mod server;
mod setup;
mod sql_floors;
mod summary;
mod sustained;
mod throughput;

use std::{process::ExitCode, time::Instant};

use serde::{Deserialize, Serialize};
use tower_idempotency_sqlx::sqlx;

use cli::{parse_args, Args};
use floors::Floor;
use memory::ChildReport;
use round_trips::RoundTrips;
use scaling::ScalingRow;
use setup::{cleanup, loadavg, open_store, run_id, runtimes, Backends, Runtimes, Target};
use sustained::SustainedRow;
use throughput::Cell;

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
    /// Rounds of throughput groups.
    #[serde(default)]
    pub rounds: usize,
    /// Warm-up per cell, ms.
    pub warmup_ms: u64,
    /// Throughput cells.
    pub cells: Vec<Cell>,
    /// Round trips per request.
    pub round_trips: Vec<RoundTrips>,
    /// Raw store floors.
    pub floors: Vec<Floor>,
    /// Fresh keys for a long window against the memory stores.
    #[serde(default)]
    pub sustained: Vec<SustainedRow>,
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
        memory::child(&raw[1..])
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
    let backends = Backends::from_env(run, args.store_lanes, args.peer_binary.clone())
        .with_coalescing(args.coalescing);
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
        rounds: args.rounds,
        warmup_ms: args.warmup.as_millis() as u64,
        cells: Vec::new(),
        round_trips: Vec::new(),
        floors: Vec::new(),
        sustained: Vec::new(),
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

/// Runs every measurement the flags ask for, in turn, into `results`.
fn measure_all(
    args: &Args,
    rts: &Runtimes,
    b: &Backends,
    targets: &[Target],
    results: &mut Results,
) -> Result<()> {
    let started = Instant::now();
    results.cells = throughput::measure(args, rts, b, targets)?;
    eprintln!(
        "loadtest: throughput cells done in {:.0?}",
        started.elapsed()
    );
    if !args.sustained.is_zero() {
        results.sustained = sustained::measure(args, rts, b, targets)?;
    }
    for target in targets {
        results
            .round_trips
            .extend(round_trips::count(args, rts, b, target)?);
    }
    for target in targets {
        results
            .floors
            .extend(floors::measure(args, rts, b, target)?);
    }
    eprintln!(
        "loadtest: round trips and floors done at {:.0?}",
        started.elapsed()
    );
    if args.scaling {
        for target in targets {
            if matches!(target, Target::Postgres(_) | Target::Redis(_)) {
                results
                    .scaling
                    .extend(scaling::measure(args, rts, b, target)?);
            }
        }
        eprintln!("loadtest: scaling done at {:.0?}", started.elapsed());
    }
    if args.memory {
        results.memory = memory::measure(args)?;
        eprintln!(
            "loadtest: memory children done at {:.0?}",
            started.elapsed()
        );
    }
    Ok(())
}
