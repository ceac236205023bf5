//! Throughput and latency: the bare handler and every target, per round, workload, concurrency
//! and body size, each cell a fresh server (in process, or a child for the peer).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use crate::{
    load::{drive, Keys, LoadResult, Plan, Stop, Workload, REPLAY_KEYS},
    peer::{self, PeerServer},
    server::{router, serve, App, Server},
    setup::{body, Backends, Runtimes, Target},
    sql_floors, Args, Result,
};

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
    /// The round of the run (1-based) the cell belongs to (`--rounds`).
    #[serde(default)]
    pub round: usize,
    /// The server's CPU time per request over the cell, warm-up included, µs: its runtime's
    /// threads in process, every thread of a peer's process (the SQL stores' own threads, such
    /// as SQLite's, are not counted).
    #[serde(default)]
    pub server_cpu_us: Option<f64>,
}

/// Every throughput cell: per round, body size and concurrency, one group of the bare handler
/// (first and last) and each target's workloads, with ratios against the group's bare runs.
pub(crate) fn measure(
    args: &Args,
    rts: &Runtimes,
    b: &Backends,
    targets: &[Target],
) -> Result<Vec<Cell>> {
    let mut cells = Vec::new();
    for round in 1..=args.rounds {
        for &size in &args.bodies {
            for &concurrency in &args.concurrency {
                let group_start = cells.len();
                // The bare handler runs first and again last in each group; ratios use the mean,
                // so a drift in machine load during the group shows up as a spread between the two.
                let mut group: Vec<&Target> = targets.iter().collect();
                group.extend(targets.iter().filter(|t| matches!(t, Target::Bare)));
                for target in group.into_iter().filter(|t| size <= 1024 || runs_large(t)) {
                    for &workload in workloads(target) {
                        let run = format!("{}-c{}", b.run, cells.len() + 1);
                        let mut cell =
                            run_cell(args, rts, b, target, workload, concurrency, size, run)?;
                        cell.round = round;
                        print_cell(&cell);
                        cells.push(cell);
                    }
                }
                set_ratios(&mut cells[group_start..]);
            }
        }
    }
    Ok(cells)
}

/// Whether `target` also runs with bodies above 1 KiB: the bare handlers and the memory stores.
fn runs_large(target: &Target) -> bool {
    matches!(
        target,
        Target::Bare | Target::Memory | Target::MemoryConstantFingerprint | Target::Peer(_)
    ) && !matches!(target, Target::Peer(peer::PeerStore::Valkey))
}

/// The workloads a target runs: all three for a store, the new-key pattern for a bare handler
/// (it ignores keys), and the one its statements serve for a SQL floor.
pub(crate) fn workloads(target: &Target) -> &'static [Workload] {
    match target {
        Target::Bare | Target::Peer(peer::PeerStore::Bare) => &[Workload::New],
        Target::SqlFloor(floor) if floor.kind().reads() => &[Workload::Replay],
        Target::SqlFloor(_) => &[Workload::New],
        _ => &Workload::ALL,
    }
}

/// A target's server for one cell, in process or in a child.
pub(crate) enum Running {
    /// Served on the harness's server runtime, with the memory store's allocation when it has
    /// one (see [`release_memory`]).
    InProcess(Server, Option<Arc<dyn std::any::Any + Send + Sync>>),
    /// A `loadtest-peer` child process.
    Child(PeerServer),
}

impl Running {
    /// Where the load generator connects.
    pub(crate) fn addr(&self) -> std::net::SocketAddr {
        match self {
            Running::InProcess(server, _) => server.addr,
            Running::Child(child) => child.addr,
        }
    }

    /// The server's CPU time so far, ns.
    pub(crate) fn cpu_ns(&self) -> u64 {
        match self {
            Running::InProcess(..) => crate::cpu::server_threads_ns(),
            Running::Child(child) => crate::cpu::process_ns(child.pid),
        }
    }

    /// Stops the server and hands a memory store's freed pages back.
    fn stop(self) {
        if let Running::InProcess(server, Some(handle)) = self {
            drop(server);
            release_memory(handle);
        }
    }
}

/// Starts a fresh server for `target`; a peer's Valkey store connects to `redis_url`.
pub(crate) fn launch(
    rts: &Runtimes,
    b: &Backends,
    target: &Target,
    redis_url: &str,
) -> Result<Running> {
    Ok(match target {
        Target::Peer(store) => Running::Child(peer::start(
            &b.peer_binary,
            *store,
            redis_url,
            &b.peer_prefix,
        )?),
        Target::SqlFloor(floor) => Running::InProcess(
            rts.server
                .block_on(serve(sql_floors::router(floor.clone())))?,
            None,
        ),
        _ => {
            let (layer, handle) = target.layer_with_handle();
            Running::InProcess(
                rts.server.block_on(serve(router(App::default(), layer)))?,
                handle,
            )
        }
    })
}

fn print_cell(cell: &Cell) {
    eprintln!(
        "  {:>8} {:>6} c={:<3} {:>3}KiB {:>9.0} req/s  p50 {:>7.0} us  p99 {:>7.0} us  cpu {:>5.1} us/req  [{} exec, {} replay, {} 409, {} other, {} err]",
        cell.target,
        cell.workload.name(),
        cell.concurrency,
        cell.body_bytes / 1024,
        cell.result.rps,
        cell.result.p50_us,
        cell.result.p99_us,
        cell.server_cpu_us.unwrap_or(0.0),
        cell.result.executed,
        cell.result.replayed,
        cell.result.conflicts,
        cell.result.other_status,
        cell.result.errors,
    );
}

/// Each cell's throughput over the mean of its group's bare runs.
fn set_ratios(group: &mut [Cell]) {
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

#[allow(clippy::too_many_arguments)] // one cell's coordinates, each used once
fn run_cell(
    args: &Args,
    rts: &Runtimes,
    b: &Backends,
    target: &Target,
    workload: Workload,
    concurrency: usize,
    size: usize,
    run: String,
) -> Result<Cell> {
    let server = launch(rts, b, target, &b.redis_url)?;
    let body = body(size);
    let keys = match workload {
        Workload::New => Keys::Unique,
        Workload::Replay => Keys::Cycle(REPLAY_KEYS),
        Workload::Hot => Keys::Hot,
    };
    match target {
        Target::SqlFloor(floor) if floor.kind().reads() => {
            rts.server.block_on(floor.prepare_reads(&run, &body))?;
        }
        _ if workload == Workload::Replay => {
            rts.client.block_on(drive(Plan {
                targets: vec![server.addr()],
                run: run.clone(),
                keys,
                body: body.clone(),
                concurrency: 16,
                stop: Stop::Count(REPLAY_KEYS),
            }))?;
        }
        _ => {}
    }
    let statements_before = target.statements();
    let cpu_before = server.cpu_ns();
    let result = rts.client.block_on(drive(Plan {
        targets: vec![server.addr()],
        run,
        keys,
        body,
        concurrency,
        stop: Stop::Timed {
            warmup: args.warmup,
            measure: args.duration,
        },
    }))?;
    let server_cpu_us = Some(
        server.cpu_ns().saturating_sub(cpu_before) as f64
            / 1000.0
            / result.total_requests.max(1) as f64,
    );
    let statements_per_request = statements_before
        .zip(target.statements())
        .map(|(before, after)| (after - before) as f64 / result.total_requests.max(1) as f64);
    server.stop();
    Ok(Cell {
        target: target.name().into(),
        workload,
        concurrency,
        body_bytes: size,
        result,
        ratio_vs_bare: None,
        statements_per_request,
        round: 0,
        server_cpu_us,
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
