//! The fault soak of the durable half, for `bench/scripts/faults.sh`: the reference receiver
//! (`examples/receiver/`) with the inbox and the outbox on, one instance on SQLite or two on
//! Postgres, under signed Stripe traffic while faults are injected at random from every side;
//! then the faults stop, the run drains, and invariants are checked against the database, the
//! provider's ledger and the outbox target's counts.
//!
//! Configured by environment variables (the script sets them):
//!
//! | variable | meaning |
//! |---|---|
//! | `FAULT_NAME` | the run's name in the summary (`sqlite`, `postgres`) |
//! | `FAULT_DB_URL` | `sqlite://PATH`, or a Postgres URL on 127.0.0.1 (its `search_path` a throw-away schema) |
//! | `FAULT_INSTANCES` | receiver instances (default 1) |
//! | `FAULT_SECONDS` | seconds of traffic and faults (default 600, at most 3600) |
//! | `FAULT_RECEIVER` | the receiver's binary (built with `--all-features`) |
//! | `FAULT_OUT` | a directory: `summary-<name>.json`, `fault-log-<name>.txt`, the instances' logs |
//! | `FAULT_PIDS` | a file the driver appends every receiver's pid to (the script kills them on exit) |
//! | `FAULT_SEED` | the random seed (default: the clock); printed, so a run's choices can be repeated |
//! | `FAULT_SKIP_STALE` | `1` (default): the second half runs with `INBOX_ORDERING=skip-stale` and ordered events; `0`: no ordering |
//! | `FAULT_COMMIT` | the commit tested, copied into the summary |
//!
//! Faults, each logged with its time: `SIGKILL` and restart of an instance mid-acknowledgement (a
//! burst just sent to it), mid-handler (a claimed event in the table) or mid-delivery (every
//! instance, while the target answers); on Postgres the connections through the test kit's
//! proxy cut, refused for seconds or stalled, and a table locked; on SQLite the write lock held
//! for seconds; the outbox target answering `500`, timing out, redirecting (`301` to a
//! `GET`-only path), dropping the connection, or gone and back. Exits 1 on any violation.

mod check;
mod db;
mod faultlog;
mod instances;
mod target;
mod traffic;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::ExitCode,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use tower_idempotency_testkit::{Mode as ProxyMode, Proxy};

use crate::{
    check::{Inputs, Invariant},
    db::{BoxError, Db},
    faultlog::FaultLog,
    instances::{horizon, Instances, Launch},
    target::{Mode as TargetMode, Target},
    traffic::Traffic,
};

struct Config {
    name: String,
    db_url: String,
    instances: usize,
    seconds: u64,
    receiver: PathBuf,
    out: PathBuf,
    pids: PathBuf,
    seed: u64,
    skip_stale: bool,
    commit: String,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl Config {
    fn from_env() -> Result<Self, BoxError> {
        let required = |name: &str| env(name).ok_or_else(|| format!("{name} is not set"));
        let db_url = required("FAULT_DB_URL")?;
        let loopback = db_url.starts_with("sqlite://")
            || db_url.contains("@127.0.0.1:")
            || db_url.contains("@localhost:");
        if !loopback {
            return Err("FAULT_DB_URL must be sqlite:// or a Postgres URL on 127.0.0.1".into());
        }
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        Ok(Self {
            name: env("FAULT_NAME").unwrap_or_else(|| "run".into()),
            db_url,
            instances: env("FAULT_INSTANCES").map_or(Ok(1), |v| v.parse())?.max(1),
            seconds: env("FAULT_SECONDS")
                .map_or(Ok(600), |v| v.parse())?
                .min(3600),
            receiver: required("FAULT_RECEIVER")?.into(),
            out: required("FAULT_OUT")?.into(),
            pids: required("FAULT_PIDS")?.into(),
            seed: env("FAULT_SEED").map_or(Ok(clock), |v| v.parse())?,
            skip_stale: env("FAULT_SKIP_STALE").is_none_or(|v| v != "0"),
            commit: env("FAULT_COMMIT").unwrap_or_default(),
        })
    }
}

/// Everything the fault loops share.
struct Run {
    log: Arc<FaultLog>,
    db: Db,
    instances: Arc<Instances>,
    traffic: Arc<Traffic>,
    target: Arc<Target>,
    proxy: Option<Proxy>,
}

/// How long a killed or cut-off instance may take to come back.
const RESTART_WITHIN: Duration = Duration::from_secs(60);

impl Run {
    async fn restart(&self, i: usize) {
        match self.instances.restart(i, RESTART_WITHIN).await {
            Ok(1) => self.log.log("-restarted", format!("instance {i}")),
            Ok(tries) => self
                .log
                .log("-restarted", format!("instance {i} after {tries} tries")),
            Err(error) => self
                .log
                .log("-restart failed", format!("instance {i}: {error}")),
        }
    }

    /// `SIGKILL`s of instances, mid-acknowledgement, mid-handler or mid-delivery, each followed
    /// by a restart.
    async fn process_faults(&self, deadline: Instant, seed: u64) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let n = self.instances.len();
        loop {
            tokio::time::sleep(Duration::from_millis(rng.u64(4000..9000))).await;
            if Instant::now() >= deadline {
                return;
            }
            let killed: Vec<usize> = match rng.u32(0..3) {
                0 => {
                    let i = rng.usize(..n);
                    self.traffic.burst_to(i, 8, &mut rng);
                    let waited = Instant::now();
                    while waited.elapsed() < Duration::from_secs(1)
                        && self.instances.acks_in_flight[i].load(Ordering::SeqCst) < 4
                    {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    tokio::time::sleep(Duration::from_millis(rng.u64(1..15))).await;
                    let in_flight = self.instances.acks_in_flight[i].load(Ordering::SeqCst);
                    self.instances.kill(i).await;
                    self.log.log(
                        "kill-mid-ack",
                        format!("instance {i}: {in_flight} acknowledgements in flight"),
                    );
                    vec![i]
                }
                1 => {
                    let i = rng.usize(..n);
                    let waited = Instant::now();
                    let mut claimed = 0;
                    while waited.elapsed() < Duration::from_secs(3) {
                        claimed = self.db.claimed_events().await.unwrap_or(0);
                        if claimed > 0 {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    self.instances.kill(i).await;
                    self.log.log(
                        "kill-mid-handler",
                        format!("instance {i}: {claimed} events claimed (by any instance)"),
                    );
                    vec![i]
                }
                _ => {
                    self.traffic.outbox_burst(4, &mut rng);
                    let waited = Instant::now();
                    while waited.elapsed() < Duration::from_secs(5)
                        && self.target.in_flight.load(Ordering::SeqCst) == 0
                    {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    let in_flight = self.target.in_flight.load(Ordering::SeqCst);
                    for i in 0..n {
                        self.instances.kill(i).await;
                    }
                    self.log.log(
                        "kill-mid-delivery",
                        format!("every instance: {in_flight} deliveries at the target in flight"),
                    );
                    (0..n).collect()
                }
            };
            tokio::time::sleep(Duration::from_millis(rng.u64(300..2000))).await;
            for i in killed {
                self.restart(i).await;
            }
        }
    }

    /// SQLite: the write lock held; Postgres: connections cut, refused or stalled at the proxy,
    /// a table locked.
    async fn database_faults(&self, deadline: Instant, seed: u64) {
        let mut rng = fastrand::Rng::with_seed(seed);
        loop {
            tokio::time::sleep(Duration::from_millis(rng.u64(4000..10000))).await;
            if Instant::now() >= deadline {
                return;
            }
            let hold = Duration::from_millis(rng.u64(1000..6000));
            let Some(proxy) = &self.proxy else {
                self.log.log(
                    "sqlite-write-lock",
                    format!("BEGIN IMMEDIATE held {:.1}s", hold.as_secs_f64()),
                );
                match self.db.hold_write_lock(hold).await {
                    Ok(waited) => self.log.log(
                        "-lock released",
                        format!("(waited {} ms to take it)", waited.as_millis()),
                    ),
                    Err(error) => self.log.log("-lock failed", error.to_string()),
                }
                continue;
            };
            match rng.u32(0..4) {
                0 => {
                    proxy.cut();
                    self.log.log("pg-cut", "every connection to Postgres cut");
                }
                1 => {
                    let hold = hold.min(Duration::from_secs(4));
                    proxy.set(ProxyMode::Drop);
                    proxy.cut();
                    self.log.log(
                        "pg-outage",
                        format!("connections cut and refused for {:.1}s", hold.as_secs_f64()),
                    );
                    tokio::time::sleep(hold).await;
                    proxy.set(ProxyMode::Pass);
                }
                2 => {
                    let hold = hold.min(Duration::from_secs(3));
                    proxy.set(ProxyMode::Stall);
                    self.log.log(
                        "pg-stall",
                        format!(
                            "no bytes forwarded for {:.1}s, then cut",
                            hold.as_secs_f64()
                        ),
                    );
                    tokio::time::sleep(hold).await;
                    proxy.cut();
                    proxy.set(ProxyMode::Pass);
                }
                _ => {
                    let table = [db::INBOX, db::OUTBOX][rng.usize(..2)];
                    self.log.log(
                        "pg-table-lock",
                        format!(
                            "{table} locked ACCESS EXCLUSIVE for {:.1}s",
                            hold.as_secs_f64()
                        ),
                    );
                    match self.db.lock_table(table, hold).await {
                        Ok(waited) => self.log.log(
                            "-lock released",
                            format!("(waited {} ms to take it)", waited.as_millis()),
                        ),
                        Err(error) => self.log.log("-lock failed", error.to_string()),
                    }
                }
            }
        }
    }

    /// The outbox target misbehaving for one to four seconds at a time.
    async fn target_faults(&self, deadline: Instant, seed: u64) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let modes = [
            TargetMode::Error500,
            TargetMode::Timeout,
            TargetMode::Redirect,
            TargetMode::Drop,
            TargetMode::Gone,
        ];
        loop {
            tokio::time::sleep(Duration::from_millis(rng.u64(6000..14000))).await;
            if Instant::now() >= deadline {
                return;
            }
            let mode = modes[rng.usize(..modes.len())];
            let hold = Duration::from_millis(rng.u64(1000..4000));
            self.target.set(mode);
            self.log
                .log(mode.name(), format!("for {:.1}s", hold.as_secs_f64()));
            tokio::time::sleep(hold).await;
            self.target.set(TargetMode::Ok);
        }
    }

    /// Restarts instances that exited on their own (counted: none should).
    async fn supervise(&self, deadline: Instant) -> u64 {
        let mut exits = 0;
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_secs(2)).await;
            for i in 0..self.instances.len() {
                if let Some(status) = self.instances.exited(i).await {
                    exits += 1;
                    self.log.log(
                        "-exited on its own",
                        format!("instance {i}: {status} (see its log)"),
                    );
                    self.restart(i).await;
                }
            }
        }
        exits
    }

    /// Until `stop`, the pending events' attempts and leases, a line at each change (written to
    /// `trace-<name>.txt`: how an event late at the drain spent its time).
    async fn trace(&self, stop: Arc<std::sync::atomic::AtomicBool>) -> Vec<String> {
        let mut lines = Vec::new();
        let mut last = BTreeMap::<String, (i64, bool, i64)>::new();
        while !stop.load(Ordering::SeqCst) {
            if let Ok(rows) = self.db.pending_rows().await {
                let now = unix_ms();
                for (id, row) in &rows {
                    let seen = (row.attempts, row.leased, row.available_at);
                    if last.get(id) != Some(&seen) {
                        lines.push(format!(
                            "[{:>8.3}s] {id} attempts {} leased {} available in {} ms, lease ends in {} ms",
                            self.log.now(),
                            row.attempts,
                            row.leased,
                            row.available_at - now,
                            if row.leased { row.lease_until - now } else { 0 },
                        ));
                    }
                }
                last = rows
                    .into_iter()
                    .map(|(id, row)| (id, (row.attempts, row.leased, row.available_at)))
                    .collect();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        lines
    }

    /// The second half: every instance restarted with `INBOX_ORDERING=skip-stale`, then
    /// ordered events sent.
    async fn skip_stale_phase(&self) {
        self.instances.skip_stale.store(true, Ordering::SeqCst);
        self.log.log(
            "-phase",
            "skip-stale: instances restart with INBOX_ORDERING=skip-stale",
        );
        for i in 0..self.instances.len() {
            self.restart(i).await;
        }
        self.traffic.ordered.store(true, Ordering::SeqCst);
    }

    /// Waits for the provider's retries, then for every inbox event and outbox message to
    /// settle, within the horizon plus `slack`; answers what is still pending.
    async fn drain(&self, slack: Duration) -> Result<(f64, Vec<String>), BoxError> {
        let started = Instant::now();
        let retries_deadline = started + Duration::from_secs(180);
        while self.traffic.outstanding.load(Ordering::SeqCst) > 0
            && Instant::now() < retries_deadline
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let settle_deadline = Instant::now() + horizon() + slack;
        loop {
            let events = self.db.pending_events().await?;
            let messages = self.db.pending_messages().await?;
            if events == 0 && messages == 0 {
                return Ok((started.elapsed().as_secs_f64(), Vec::new()));
            }
            if Instant::now() >= settle_deadline {
                let snapshot = self.db.snapshot().await?;
                let mut pending: Vec<String> = snapshot
                    .inbox
                    .iter()
                    .filter(|(_, row)| row.state == 0)
                    .map(|(id, row)| {
                        let now = unix_ms();
                        format!(
                            "{id}: pending event, attempts {}, available in {} ms, lease token {}, \
                             lease ends in {} ms, last error {:?}",
                            row.attempts,
                            row.available_at - now,
                            row.leased,
                            row.lease_until - now,
                            row.last_error
                        )
                    })
                    .collect();
                pending.extend(
                    snapshot
                        .outbox
                        .iter()
                        .filter(|(_, row)| row.state == 0)
                        .map(|(key, row)| {
                            format!("{key}: pending message, attempts {}", row.attempts)
                        }),
                );
                return Ok((started.elapsed().as_secs_f64(), pending));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The operator's part: events the faults made fail (not poison nor permanent) are
    /// re-queued through `POST /inbox/failed/<id>/retry`. Answers the ids.
    async fn retry_failed(&self, failed: &[String]) -> Vec<String> {
        let client = reqwest::Client::new();
        let mut retried = Vec::new();
        for id in failed {
            let url = format!("{}/inbox/failed/{id}/retry", self.instances.base(0));
            if let Ok(response) = client.post(url).send().await {
                if response.status().as_u16() == 202 {
                    retried.push(id.clone());
                }
            }
        }
        retried
    }
}

/// Now, in Unix milliseconds (the tables' times).
fn unix_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The receiver's Postgres URL through the proxy (the same database, user and options).
fn through_proxy(url: &str, proxy: &Proxy) -> Result<String, BoxError> {
    let mut parsed = reqwest::Url::parse(url)?;
    parsed
        .set_port(Some(proxy.addr.port()))
        .map_err(|()| "the Postgres URL takes no port")?;
    Ok(parsed.to_string())
}

async fn run(config: Config) -> Result<bool, BoxError> {
    std::fs::create_dir_all(&config.out)?;
    println!(
        "faults[{}]: seed {} ({} s, {} instance(s), skip-stale half: {})",
        config.name, config.seed, config.seconds, config.instances, config.skip_stale
    );
    let log = Arc::new(FaultLog::new());
    let db = Db::open(&config.db_url).await?;
    let target = Target::start(config.seed ^ 0x7a).await?;
    let (store_url, proxy) = if config.db_url.starts_with("sqlite://") {
        (config.db_url.clone(), None)
    } else {
        let parsed = reqwest::Url::parse(&config.db_url)?;
        let upstream = format!(
            "{}:{}",
            parsed.host_str().unwrap_or("127.0.0.1"),
            parsed.port().unwrap_or(5432)
        );
        let proxy = Proxy::start(upstream).await;
        (through_proxy(&config.db_url, &proxy)?, Some(proxy))
    };
    let secret = format!("whsec_faults_{}", config.seed);
    let instances = Instances::new(
        Launch {
            receiver: config.receiver.clone(),
            store_url,
            secret: secret.clone(),
            target_url: target.url(),
            logs: config.out.clone(),
            pids: config.pids.clone(),
        },
        config.instances,
    )?;
    let traffic = Traffic::new(secret, instances.clone(), log.clone())?;
    let run = Arc::new(Run {
        log: log.clone(),
        db,
        instances: instances.clone(),
        traffic: traffic.clone(),
        target: target.clone(),
        proxy,
    });
    for i in 0..instances.len() {
        // The first start creates the tables: one at a time.
        instances.restart(i, RESTART_WITHIN).await?;
    }
    log.log(
        "-started",
        format!(
            "{} instance(s), handler delays {:?} ms, target {}",
            instances.len(),
            instances.delays_ms,
            target.url()
        ),
    );

    let started = Instant::now();
    let deadline = started + Duration::from_secs(config.seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..3u64 {
        tasks.spawn(
            traffic
                .clone()
                .worker(config.seed.wrapping_add(w), deadline),
        );
    }
    let r = run.clone();
    let seed = config.seed;
    tasks.spawn(async move { r.process_faults(deadline, seed ^ 1).await });
    let r = run.clone();
    tasks.spawn(async move { r.database_faults(deadline, seed ^ 2).await });
    let r = run.clone();
    tasks.spawn(async move { r.target_faults(deadline, seed ^ 3).await });
    let tracing_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (r, stop) = (run.clone(), tracing_stop.clone());
    let tracer = tokio::spawn(async move { r.trace(stop).await });
    let r = run.clone();
    let supervisor = tokio::spawn(async move { r.supervise(deadline).await });
    if config.skip_stale {
        tokio::time::sleep(Duration::from_secs(config.seconds / 2)).await;
        run.skip_stale_phase().await;
    }
    while tasks.join_next().await.is_some() {}
    let exits = supervisor.await.unwrap_or(0);

    // The faults stop; everything comes back and the run drains.
    target.set(TargetMode::Ok);
    if let Some(proxy) = &run.proxy {
        proxy.set(ProxyMode::Pass);
    }
    for i in 0..instances.len() {
        if instances.exited(i).await.is_some() || !instances.running(i).await {
            run.restart(i).await;
        }
    }
    log.log("-faults stopped", "draining");
    let slack = Duration::from_secs(30);
    let (first_drain, mut pending) = run.drain(slack).await?;
    log.log(
        "-drained",
        format!("in {first_drain:.1}s, {} pending", pending.len()),
    );
    let first = run.db.snapshot().await?;
    let events = traffic.ledger.events.lock().unwrap().clone();
    let mut failed_rows: BTreeMap<String, (i64, String)> = first
        .inbox
        .iter()
        .filter(|(_, row)| row.state == 2)
        .map(|(id, row)| (id.clone(), (row.attempts, row.last_error.clone())))
        .collect();
    let faulted: Vec<String> = failed_rows
        .keys()
        .filter(|id| events.get(*id).is_some_and(|sent| sent.kind.succeeds()))
        .cloned()
        .collect();
    let retried = run.retry_failed(&faulted).await;
    let mut second_drain = 0.0;
    if !retried.is_empty() {
        log.log(
            "-operator retry",
            format!(
                "{} events failed by faults re-queued: {retried:?}",
                retried.len()
            ),
        );
        let (took, still) = run.drain(slack).await?;
        second_drain = took;
        pending = still;
    }
    let last = run.db.snapshot().await?;
    for (id, row) in last.inbox.iter().filter(|(_, row)| row.state == 2) {
        failed_rows.insert(id.clone(), (row.attempts, row.last_error.clone()));
    }
    tracing_stop.store(true, Ordering::SeqCst);
    let trace = tracer.await.unwrap_or_default();
    std::fs::write(
        config.out.join(format!("trace-{}.txt", config.name)),
        trace.join("\n"),
    )?;
    let starts = instances.starts().await;
    instances.stop_all().await;

    let refused = traffic.ledger.refused.lock().unwrap().clone();
    let target_keys = target.keys.lock().unwrap().clone();
    let invariants = check::check(&Inputs {
        events: &events,
        refused: &refused,
        last: &last,
        failed_rows: &failed_rows,
        pending_after_drain: &pending,
        target: &target_keys,
        target_keyless: target.keyless.load(Ordering::SeqCst),
        landing_gets: target.landing_gets.load(Ordering::SeqCst),
    });

    let faults = log.counts();
    let answers = traffic.ledger.answers.lock().unwrap().clone();
    let target_answers = target.answers.lock().unwrap().clone();
    let mut deliveries = BTreeMap::<String, u64>::new();
    let acked = events.values().filter(|s| s.acked_at.is_some()).count() as u64;
    deliveries.insert("events sent (new ids)".into(), events.len() as u64);
    deliveries.insert("events acknowledged".into(), acked);
    for (kind, n) in events
        .values()
        .fold(BTreeMap::<String, u64>::new(), |mut m, s| {
            *m.entry(format!("events of kind {:?}", s.kind)).or_default() += 1;
            m
        })
    {
        deliveries.insert(kind, n);
    }
    for (label, n) in answers {
        deliveries.insert(format!("answered: {label}"), n);
    }
    for (label, n) in target_answers {
        deliveries.insert(format!("target: {label}"), n);
    }
    let states = last
        .inbox
        .values()
        .fold(BTreeMap::<i64, u64>::new(), |mut m, r| {
            *m.entry(r.state).or_default() += 1;
            m
        });
    for (state, n) in states {
        let name = ["pending", "processed", "failed", "skipped"]
            .get(state as usize)
            .copied()
            .unwrap_or("other");
        deliveries.insert(format!("inbox rows {name}"), n);
    }
    deliveries.insert("outbox messages".into(), last.outbox.len() as u64);
    let failed_messages: Vec<&String> = last
        .outbox
        .iter()
        .filter(|(_, row)| row.state == 2)
        .map(|(key, _)| key)
        .collect();
    deliveries.insert(
        "outbox messages failed, attempts spent".into(),
        failed_messages.len() as u64,
    );
    deliveries.insert(
        "outbox messages failed, attempts spent, yet run by the target".into(),
        failed_messages
            .iter()
            .filter(|key| target_keys.get(**key).is_some_and(|seen| seen.runs == 1))
            .count() as u64,
    );
    deliveries.insert(
        "events failed by faults, retried by the operator".into(),
        retried.len() as u64,
    );
    deliveries.insert("instance starts".into(), starts);
    deliveries.insert("instances that exited on their own".into(), exits);

    print_tables(
        &config,
        &faults,
        &deliveries,
        &invariants,
        first_drain,
        second_drain,
    );
    let held = invariants.iter().all(|i| i.violations.is_empty());
    let summary = serde_json::json!({
        "name": config.name,
        "commit": config.commit,
        "seed": config.seed,
        "seconds": config.seconds,
        "instances": config.instances,
        "skip_stale_half": config.skip_stale,
        "horizon_seconds": horizon().as_secs_f64(),
        "drain_seconds": [first_drain, second_drain],
        "faults": faults,
        "deliveries": deliveries,
        "invariants": invariants,
        "held": held,
        "fault_log": log.entries(),
    });
    let json_path = config.out.join(format!("summary-{}.json", config.name));
    std::fs::write(&json_path, serde_json::to_string_pretty(&summary)?)?;
    let text: String = log
        .entries()
        .iter()
        .map(|e| format!("[{:>8.3}s] {:<24} {}\n", e.at, e.kind, e.detail))
        .collect();
    std::fs::write(
        config.out.join(format!("fault-log-{}.txt", config.name)),
        text,
    )?;
    println!("summary written to {}", json_path.display());
    if !held {
        report_violations(&invariants, &events, &log);
    }
    Ok(held)
}

fn print_tables(
    config: &Config,
    faults: &BTreeMap<String, u64>,
    deliveries: &BTreeMap<String, u64>,
    invariants: &[Invariant],
    first_drain: f64,
    second_drain: f64,
) {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(vec![
        format!("faults injected ({})", config.name),
        "count".into(),
    ]);
    for (kind, n) in faults {
        table.add_row(vec![kind.clone(), n.to_string()]);
    }
    table.add_row(vec![
        "total".to_owned(),
        faults.values().sum::<u64>().to_string(),
    ]);
    println!("{table}");
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(vec![
        format!("deliveries ({})", config.name),
        "count".into(),
    ]);
    for (label, n) in deliveries {
        table.add_row(vec![label.clone(), n.to_string()]);
    }
    println!("{table}");
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(vec![
        format!("invariant ({})", config.name),
        "checked".into(),
        "violations".into(),
        "held".into(),
    ]);
    for invariant in invariants {
        table.add_row(vec![
            invariant.name.to_owned(),
            invariant.checked.to_string(),
            invariant.violations.len().to_string(),
            if invariant.violations.is_empty() {
                "yes"
            } else {
                "NO"
            }
            .to_owned(),
        ]);
    }
    println!("{table}");
    println!(
        "drained in {first_drain:.1}s (then {second_drain:.1}s after the operator's retries); \
         horizon {:.1}s (lease plus backoffs) + 30s slack",
        horizon().as_secs_f64()
    );
}

/// Prints each violation's ids and, for the first few, the fault log around the event.
fn report_violations(
    invariants: &[Invariant],
    events: &BTreeMap<String, traffic::Sent>,
    log: &FaultLog,
) {
    for invariant in invariants.iter().filter(|i| !i.violations.is_empty()) {
        println!(
            "VIOLATION: {} ({} cases)",
            invariant.name,
            invariant.violations.len()
        );
        for (n, case) in invariant.violations.iter().enumerate().take(20) {
            println!("  {case}");
            let id = case
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .trim_end_matches(':');
            let Some(sent) = events.get(id) else { continue };
            if n >= 5 {
                continue;
            }
            println!(
                "    sent at {:.3}s, acknowledged at {:?}, {} sends; faults around it:",
                sent.first_sent, sent.acked_at, sent.sends
            );
            let until = sent.acked_at.unwrap_or(sent.first_sent) + 40.0;
            for e in log.between(sent.first_sent - 5.0, until) {
                println!("      [{:>8.3}s] {:<24} {}", e.at, e.kind, e.detail);
            }
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("faults: {error}");
            return ExitCode::from(2);
        }
    };
    match run(config).await {
        Ok(true) => {
            println!("faults: PASS");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("faults: FAIL");
            ExitCode::FAILURE
        }
        Err(error) => {
            println!("faults: ERROR {error}");
            ExitCode::from(2)
        }
    }
}
