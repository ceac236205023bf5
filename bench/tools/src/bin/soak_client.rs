//! Traffic generator for `bench/scripts/soak.sh`: mixed traffic against the reference receiver
//! (`examples/receiver/`) for a bounded time, then a check that every valid key ran exactly
//! once (`GET /effects`) and that no request was answered `5xx`; then, optionally, a "flat"
//! phase that creates no key at all, to show the receiver's memory stays flat.
//!
//! ```text
//! cargo run --manifest-path bench/Cargo.toml -p tower-idempotency-tools --bin soak_client -- http://127.0.0.1:3000 60 whsec_soak [FLAT_SECONDS]
//! ```
//!
//! Arguments: the receiver's base URL (loopback only), the duration in seconds (at most 3600)
//! and its `STRIPE_WEBHOOK_SECRET`. Traffic: new client keys on `POST /orders`, duplicates of
//! earlier keys, new and duplicate Stripe deliveries, and bad input (forged signatures, missing,
//! invalid and reused keys).
//!
//! With `FLAT_SECONDS` (at most 3600), a second phase of that length follows with only
//! duplicates of the keys the first phase completed (each must be a replay) and bad input. The
//! receiver keeps one `/effects` entry per executed key by design, so its memory grows with new
//! keys; with none, it must stay flat. The flat phase must not add a single execution.
//!
//! Prints `phase mixed`, `phase flat` (after the first phase's check) and `phase done` (before
//! the final check) as they begin, so a script can attribute memory samples to a phase, then one
//! summary line; exits non-zero when a check fails.

use std::{
    collections::{HashMap, HashSet},
    process::ExitCode,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use sha2::{Digest, Sha256};

const WORKERS: usize = 16;
/// Upper bound on requests, whatever the duration.
const MAX_REQUESTS: u64 = 5_000_000;

fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

fn stripe_signature(secret: &str, body: &str) -> String {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let mac = hmac_sha256(secret.as_bytes(), format!("{t}.{body}").as_bytes());
    format!("t={t},v1={}", hex::encode(mac))
}

/// A small xorshift generator: the traffic mix needs no cryptographic randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Default)]
struct Tally {
    requests: u64,
    by_status: HashMap<u16, u64>,
    /// Requests and answers of the flat phase.
    flat_requests: u64,
    flat_by_status: HashMap<u16, u64>,
    /// Duplicates answered as a replay in the flat phase.
    flat_replays: u64,
    /// `<route>:<key>` of every valid key that was answered 2xx at least once.
    accepted: HashSet<String>,
    /// Keys sent so far, to pick duplicates from.
    orders: Vec<String>,
    events: Vec<String>,
    unexpected: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// New keys, duplicates and bad input.
    Mixed,
    /// Duplicates of completed keys and bad input only: no new key.
    Flat,
}

enum Kind {
    NewOrder,
    DuplicateOrder,
    NewEvent,
    DuplicateEvent,
    ForgedEvent,
    MissingKey,
    InvalidKey,
    ReusedKey,
}

/// One worker's loop: its own generator, and the shared tally.
struct Worker {
    id: u64,
    client: reqwest::Client,
    base: String,
    secret: String,
    tally: Arc<Mutex<Tally>>,
    phase: Phase,
    rng: Rng,
    /// Requests this worker has begun, for its keys' names.
    n: u64,
}

/// A request to send, the `<route>:<key>` it executes (none for bad input) and the statuses
/// that may answer it.
struct Planned {
    request: reqwest::RequestBuilder,
    valid_key: Option<String>,
    expect: &'static [u16],
}

/// Keeps the first 20 surprises: enough to diagnose, bounded in memory.
fn note(t: &mut Tally, unexpected: impl FnOnce() -> String) {
    if t.unexpected.len() < 20 {
        t.unexpected.push(unexpected());
    }
}

async fn worker(
    id: u64,
    client: reqwest::Client,
    base: String,
    secret: String,
    deadline: Instant,
    tally: Arc<Mutex<Tally>>,
    phase: Phase,
) {
    let flat = phase == Phase::Flat;
    let seed = (id + 1 + if flat { WORKERS as u64 } else { 0 }).wrapping_mul(0x2545_f491_4f6c_dd1d);
    let mut worker = Worker {
        id,
        client,
        base,
        secret,
        tally,
        phase,
        rng: Rng(0x9e37_79b9_7f4a_7c15 ^ seed),
        n: 0,
    };
    while Instant::now() < deadline {
        if !worker.count_request() {
            return;
        }
        worker.n += 1;
        if !flat && worker.rng.below(100) < 5 {
            worker.burst().await;
            continue;
        }
        let kind = worker.kind();
        let Some(planned) = worker.plan(kind) else {
            continue;
        };
        if let Some((status, replayed)) = worker.send(planned.request).await {
            worker.record(planned.valid_key, planned.expect, status, replayed);
        }
    }
}

impl Worker {
    fn flat(&self) -> bool {
        self.phase == Phase::Flat
    }

    /// Counts the request about to begin; `false` once `MAX_REQUESTS` are reached.
    fn count_request(&self) -> bool {
        let mut t = self.tally.lock().unwrap();
        if t.requests >= MAX_REQUESTS {
            return false;
        }
        t.requests += 1;
        if self.flat() {
            t.flat_requests += 1;
        }
        true
    }

    /// Three identical requests with a new key at once: one runs, the others wait or replay.
    async fn burst(&self) {
        let key = format!("soak-burst-{}-{}", self.id, self.n);
        let send = || self.order(&key, format!("{{\"sku\":\"{key}\"}}")).send();
        let answers = futures_util::future::join_all([send(), send(), send()]).await;
        let mut t = self.tally.lock().unwrap();
        t.requests += 2;
        for answer in answers {
            let status = answer.map(|r| r.status().as_u16()).unwrap_or(0);
            *t.by_status.entry(status).or_default() += 1;
            if ![201, 409].contains(&status) {
                note(&mut t, || format!("burst status {status}"));
            }
            if status == 201 && t.accepted.insert(format!("orders:{key}")) {
                t.orders.push(key.clone());
            }
        }
    }

    /// The traffic mix of the phase.
    fn kind(&mut self) -> Kind {
        match (self.phase, self.rng.below(100)) {
            (Phase::Mixed, 0..=29) => Kind::NewOrder,
            (Phase::Mixed, 30..=54) => Kind::DuplicateOrder,
            (Phase::Mixed, 55..=64) => Kind::NewEvent,
            (Phase::Mixed, 65..=74) => Kind::DuplicateEvent,
            (Phase::Mixed, 75..=81) => Kind::ForgedEvent,
            (Phase::Mixed, 82..=87) => Kind::MissingKey,
            (Phase::Mixed, 88..=93) => Kind::InvalidKey,
            (Phase::Flat, 0..=39) => Kind::DuplicateOrder,
            (Phase::Flat, 40..=64) => Kind::DuplicateEvent,
            (Phase::Flat, 65..=74) => Kind::ForgedEvent,
            (Phase::Flat, 75..=82) => Kind::MissingKey,
            (Phase::Flat, 83..=90) => Kind::InvalidKey,
            _ => Kind::ReusedKey,
        }
    }

    /// A key answered before, from the orders' or the events' pool.
    fn pick(&mut self, events: bool) -> Option<String> {
        let t = self.tally.lock().unwrap();
        let list = if events { &t.events } else { &t.orders };
        (!list.is_empty()).then(|| list[self.rng.below(list.len() as u64) as usize].clone())
    }

    /// `POST /orders` with `key` and `body`.
    fn order(&self, key: &str, body: String) -> reqwest::RequestBuilder {
        self.client
            .post(format!("{}/orders", self.base))
            .header("idempotency-key", key)
            .body(body)
    }

    /// A Stripe delivery of `body` signed with `secret`.
    fn event(&self, secret: &str, body: String) -> reqwest::RequestBuilder {
        self.client
            .post(format!("{}/webhooks/stripe", self.base))
            .header("stripe-signature", stripe_signature(secret, &body))
            .body(body)
    }

    /// The request of `kind`; `None` when it needs an answered key and there is none yet (in
    /// the flat phase, a new key is never sent).
    fn plan(&mut self, kind: Kind) -> Option<Planned> {
        let (flat, id, n) = (self.flat(), self.id, self.n);
        let planned = |request, valid_key, expect| Planned {
            request,
            valid_key,
            expect,
        };
        Some(match kind {
            Kind::NewOrder | Kind::DuplicateOrder => {
                // New keys join the duplicate pool only once answered, so that a "reused"
                // request never races ahead of its key's first request.
                let existing = match kind {
                    Kind::DuplicateOrder => self.pick(false),
                    _ => None,
                };
                if flat && existing.is_none() {
                    return None;
                }
                let key = existing.unwrap_or_else(|| format!("soak-{id}-{n}"));
                let request = self.order(&key, format!("{{\"sku\":\"{key}\"}}"));
                let expect: &[u16] = if flat { &[201] } else { &[201, 409] };
                planned(request, Some(format!("orders:{key}")), expect)
            }
            Kind::NewEvent | Kind::DuplicateEvent => {
                let existing = match kind {
                    Kind::DuplicateEvent => self.pick(true),
                    _ => None,
                };
                if flat && existing.is_none() {
                    return None;
                }
                let event = existing.unwrap_or_else(|| format!("evt_soak_{id}_{n}"));
                let body = format!(r#"{{"id":"{event}","object":"event","type":"soak"}}"#);
                let request = self.event(&self.secret, body);
                let expect: &[u16] = if flat { &[200] } else { &[200, 409] };
                planned(request, Some(format!("stripe:{event}")), expect)
            }
            Kind::ForgedEvent => {
                let body = format!(r#"{{"id":"evt_forged_{id}_{n}","type":"soak"}}"#);
                planned(self.event("whsec_wrong", body), None, &[401])
            }
            Kind::MissingKey => {
                let request = self.client.post(format!("{}/orders", self.base));
                planned(request.body("{}"), None, &[400])
            }
            Kind::InvalidKey => planned(self.order("has a space", "{}".into()), None, &[400]),
            // Same key, another body: 422 once completed, 409/422 while running.
            Kind::ReusedKey => {
                let key = self.pick(false)?;
                let request = self.order(&key, "{\"sku\":\"something else\"}".into());
                planned(request, None, if flat { &[422] } else { &[422, 409] })
            }
        })
    }

    /// Sends the request: its status and whether it was a replay; `None` (noted) on a transport
    /// error.
    async fn send(&self, request: reqwest::RequestBuilder) -> Option<(u16, bool)> {
        match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let replayed = response
                    .headers()
                    .get("idempotent-replayed")
                    .is_some_and(|v| v == "true");
                let _ = response.bytes().await;
                Some((status, replayed))
            }
            Err(error) => {
                note(&mut self.tally.lock().unwrap(), || {
                    format!("transport error: {error}")
                });
                None
            }
        }
    }

    /// Tallies the answer; an answered valid key joins the duplicate pools.
    fn record(&self, valid_key: Option<String>, expect: &[u16], status: u16, replayed: bool) {
        let flat = self.flat();
        let mut t = self.tally.lock().unwrap();
        let by_status = if flat {
            &mut t.flat_by_status
        } else {
            &mut t.by_status
        };
        *by_status.entry(status).or_default() += 1;
        if !expect.contains(&status) {
            note(&mut t, || format!("status {status}"));
        }
        if flat && valid_key.is_some() {
            if replayed {
                t.flat_replays += 1;
            } else {
                note(&mut t, || {
                    format!("flat phase: status {status} without replay")
                });
            }
        }
        if let (Some(key), true) = (valid_key, (200..300).contains(&status)) {
            if t.accepted.insert(key.clone()) {
                match key.split_once(':') {
                    Some(("orders", k)) => t.orders.push(k.to_owned()),
                    Some(("stripe", e)) => t.events.push(e.to_owned()),
                    _ => {}
                }
            }
        }
    }
}

/// Runs `WORKERS` workers in `phase` for `seconds`.
async fn run_phase(
    phase: Phase,
    seconds: u64,
    client: &reqwest::Client,
    base: &str,
    secret: &str,
    tally: &Arc<Mutex<Tally>>,
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let workers: Vec<_> = (0..WORKERS as u64)
        .map(|id| {
            let (client, base, secret, tally) = (
                client.clone(),
                base.to_owned(),
                secret.to_owned(),
                tally.clone(),
            );
            tokio::spawn(worker(id, client, base, secret, deadline, tally, phase))
        })
        .collect();
    for worker in workers {
        worker.await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

async fn effects(client: &reqwest::Client, base: &str) -> Result<HashMap<String, u64>, String> {
    let body = client
        .get(format!("{base}/effects"))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .bytes()
        .await
        .map_err(|e| e.to_string())?;
    serde_json::from_slice(&body).map_err(|e| e.to_string())
}

fn server_errors(by_status: &HashMap<u16, u64>) -> u64 {
    by_status
        .iter()
        .filter(|(s, _)| **s >= 500)
        .map(|(_, n)| n)
        .sum()
}

fn sorted(by_status: &HashMap<u16, u64>) -> Vec<(u16, u64)> {
    let mut statuses: Vec<_> = by_status.iter().map(|(s, n)| (*s, *n)).collect();
    statuses.sort();
    statuses
}

async fn run(
    base: String,
    seconds: u64,
    flat_seconds: u64,
    secret: String,
) -> Result<String, String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    let tally = Arc::new(Mutex::new(Tally::default()));
    println!("phase mixed");
    run_phase(Phase::Mixed, seconds, &client, &base, &secret, &tally).await?;
    let after_mixed = effects(&client, &base).await?;
    let (mut summary, mut ok) = check_mixed(&tally.lock().unwrap(), &after_mixed);
    if flat_seconds > 0 {
        {
            let t = tally.lock().unwrap();
            if t.orders.is_empty() || t.events.is_empty() {
                return Err(format!("{summary} flat: no completed keys to replay"));
            }
        }
        println!("phase flat");
        run_phase(Phase::Flat, flat_seconds, &client, &base, &secret, &tally).await?;
        println!("phase done");
        let after_flat = effects(&client, &base).await?;
        let (flat_summary, flat_ok) = check_flat(&tally.lock().unwrap(), &after_mixed, &after_flat);
        summary = format!("{summary} | {flat_summary}");
        ok &= flat_ok;
    } else {
        println!("phase done");
    }
    let t = tally.lock().unwrap();
    if ok {
        Ok(summary)
    } else {
        Err(format!(
            "{summary} first_unexpected={:?}",
            t.unexpected.first()
        ))
    }
}

/// The mixed phase's summary, and whether every answered valid key ran exactly once with no
/// `5xx` and nothing unexpected.
fn check_mixed(t: &Tally, after_mixed: &HashMap<String, u64>) -> (String, bool) {
    let executions: u64 = after_mixed.values().sum();
    let twice = after_mixed.values().filter(|&&n| n > 1).count();
    let unknown = after_mixed
        .keys()
        .filter(|k| !t.accepted.contains(*k))
        .count();
    let server_errors = server_errors(&t.by_status);
    let summary = format!(
        "requests={} unique_valid_keys={} executions={} keys_run_twice={} \
         unexpected_effects={} 5xx={} unexpected_answers={} statuses={:?}",
        t.requests,
        t.accepted.len(),
        executions,
        twice,
        unknown,
        server_errors,
        t.unexpected.len(),
        sorted(&t.by_status)
    );
    let ok = executions == t.accepted.len() as u64
        && twice == 0
        && unknown == 0
        && server_errors == 0
        && t.unexpected.is_empty();
    (summary, ok)
}

/// The flat phase's summary, and whether it executed nothing, with no `5xx` and nothing
/// unexpected.
fn check_flat(
    t: &Tally,
    after_mixed: &HashMap<String, u64>,
    after_flat: &HashMap<String, u64>,
) -> (String, bool) {
    let added = after_flat.values().sum::<u64>() - after_mixed.values().sum::<u64>();
    let changed = after_flat != after_mixed;
    let server_errors = server_errors(&t.flat_by_status);
    let summary = format!(
        "flat: requests={} replays={} executions_added={added} \
         effects_changed={changed} 5xx={server_errors} statuses={:?}",
        t.flat_requests,
        t.flat_replays,
        sorted(&t.flat_by_status)
    );
    (
        summary,
        !changed && server_errors == 0 && t.unexpected.is_empty(),
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (base, seconds, secret, flat) = match args.as_slice() {
        [base, seconds, secret] => (base, seconds, secret, "0"),
        [base, seconds, secret, flat] => (base, seconds, secret, flat.as_str()),
        _ => {
            eprintln!("usage: soak_client BASE_URL SECONDS STRIPE_SECRET [FLAT_SECONDS]");
            return ExitCode::from(2);
        }
    };
    if !base.starts_with("http://127.0.0.1:") {
        eprintln!("soak_client only targets http://127.0.0.1");
        return ExitCode::from(2);
    }
    let (Ok(seconds), Ok(flat)) = (seconds.parse::<u64>(), flat.parse::<u64>()) else {
        eprintln!("SECONDS and FLAT_SECONDS must be whole numbers");
        return ExitCode::from(2);
    };
    match run(
        base.trim_end_matches('/').to_owned(),
        seconds.min(3600),
        flat.min(3600),
        secret.clone(),
    )
    .await
    {
        Ok(summary) => {
            println!("PASS {summary}");
            ExitCode::SUCCESS
        }
        Err(summary) => {
            println!("FAIL {summary}");
            ExitCode::FAILURE
        }
    }
}
