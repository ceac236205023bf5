//! Memory: peak RSS under new keys, memory per in-flight request and bytes allocated per
//! request, each measured in a child process of the harness so that peaks are separable.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use tower_idempotency_core::{IdempotencyLayer, MemoryStore};

use crate::{
    alloc,
    load::{self, drive, Keys, Plan, Stop, REPLAY_KEYS},
    server::{router, serve, App, Gate},
    setup::{body, run_id, runtimes, Runtimes},
    Args, HarnessError, Result,
};

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

/// Runs every memory measurement, each in a child process of this binary.
pub(crate) fn measure(args: &Args) -> Result<Vec<ChildReport>> {
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

/// Runs one measurement (`--child KIND TARGET BODY REQUESTS`) and prints its [`ChildReport`]
/// as JSON on stdout.
pub(crate) fn child(raw: &[String]) -> Result<()> {
    let usage = || HarnessError::Usage("--child KIND TARGET BODY REQUESTS".into());
    let [kind, target, size, requests] = raw else {
        return Err(usage());
    };
    let size: usize = size.parse().map_err(|_| usage())?;
    let requests: u64 = requests.parse().map_err(|_| usage())?;
    alloc::enable(true);
    let child = Child {
        rts: runtimes(false)?,
        run: run_id(),
        target: target.clone(),
        size,
        requests,
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
    match kind.as_str() {
        "rss" => child.peak_rss(&mut report)?,
        "inflight" => child.in_flight(&mut report)?,
        "alloc" => child.allocations(&mut report)?,
        _ => return Err(usage()),
    }
    report.hwm_kib = proc_status_kib("VmHWM");
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// One measurement child's set-up.
struct Child {
    rts: Runtimes,
    run: String,
    /// `bare`, `memory`, or for allocations the workload (`bare`, `new`, `replay`).
    target: String,
    size: usize,
    requests: u64,
}

impl Child {
    /// The memory store's layer, or none for the bare handler.
    fn layer(&self) -> Option<IdempotencyLayer> {
        (self.target != "bare")
            .then(|| IdempotencyLayer::client_keys(MemoryStore::new().with_max_entries(50_000_000)))
    }

    fn plan(&self, addr: SocketAddr, keys: Keys, concurrency: usize, stop: Stop) -> Plan {
        Plan {
            targets: vec![addr],
            run: self.run.clone(),
            keys,
            body: body(self.size),
            concurrency,
            stop,
        }
    }

    /// RSS and live heap now, as the "before" (`after == false`) or "after" figures.
    fn sample(report: &mut ChildReport, after: bool) {
        let rss = proc_status_kib("VmRSS");
        let snap = alloc::snapshot();
        if after {
            report.rss_after_kib = rss;
            report.live_after = snap.live_bytes;
            report.server_live_after = snap.server_live_bytes;
        } else {
            report.rss_before_kib = rss;
            report.live_before = snap.live_bytes;
            report.server_live_before = snap.server_live_bytes;
        }
    }

    /// Peak RSS under the new-key workload (16 workers, fixed request count).
    fn peak_rss(&self, report: &mut ChildReport) -> Result<()> {
        let server = self
            .rts
            .server
            .block_on(serve(router(App::default(), self.layer())))?;
        Self::sample(report, false);
        let plan = self.plan(server.addr, Keys::Unique, 16, Stop::Count(self.requests));
        report.rps = self.rts.client.block_on(drive(plan))?.rps;
        Self::sample(report, true);
        Ok(())
    }

    /// Memory held per request in flight: `requests` requests parked inside the handler.
    fn in_flight(&self, report: &mut ChildReport) -> Result<()> {
        let (open, gate_rx) = tokio::sync::watch::channel(false);
        let gate = Gate {
            entered: Arc::new(AtomicU64::new(0)),
            open: gate_rx,
        };
        let app = App {
            gate: Some(gate.clone()),
            ..App::default()
        };
        let server = self.rts.server.block_on(serve(router(app, self.layer())))?;
        Self::sample(report, false);
        let requests = self.requests;
        let plan = self.plan(
            server.addr,
            Keys::Unique,
            requests as usize,
            Stop::Count(requests),
        );
        let load = self.rts.client.spawn(drive(plan));
        let deadline = Instant::now() + Duration::from_secs(60);
        while gate.entered.load(Ordering::SeqCst) < requests && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        Self::sample(report, true);
        let _ = open.send(true);
        self.rts
            .client
            .block_on(load)
            .map_err(load::LoadError::from)??;
        Ok(())
    }

    /// Bytes allocated on the server thread per request, one request at a time.
    fn allocations(&self, report: &mut ChildReport) -> Result<()> {
        let server = self
            .rts
            .server
            .block_on(serve(router(App::default(), self.layer())))?;
        let replay = self.target == "replay";
        let keys = if replay {
            Keys::Cycle(REPLAY_KEYS)
        } else {
            Keys::Unique
        };
        // Warm-up: connections, lazily-initialised statics and, for replays, the key set.
        // New keys get their own run id so the measured pass does not replay them.
        let mut warm = self.plan(server.addr, keys, 1, Stop::Count(REPLAY_KEYS));
        if !replay {
            warm.run.push_str("-warm");
        }
        self.rts.client.block_on(drive(warm))?;
        let before = alloc::snapshot();
        let plan = self.plan(server.addr, keys, 1, Stop::Count(self.requests));
        let result = self.rts.client.block_on(drive(plan))?;
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
        Ok(())
    }
}
