//! Traffic generator for `scripts/soak.sh`: mixed traffic against the reference receiver
//! (`examples/receiver.rs`) for a bounded time, then a check that every valid key ran exactly
//! once (`GET /effects`) and that no request was answered `5xx`.
//!
//! ```text
//! cargo run --example soak_client -- http://127.0.0.1:3000 60 whsec_soak
//! ```
//!
//! Arguments: the receiver's base URL (loopback only), the duration in seconds (at most 3600)
//! and its `STRIPE_WEBHOOK_SECRET`. Traffic: new client keys on `POST /orders`, duplicates of
//! earlier keys, new and duplicate Stripe deliveries, and bad input (forged signatures, missing,
//! invalid and reused keys). Prints one summary line; exits non-zero when a check fails.

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
    /// `<route>:<key>` of every valid key that was answered 2xx at least once.
    accepted: HashSet<String>,
    /// Keys sent so far, to pick duplicates from.
    orders: Vec<String>,
    events: Vec<String>,
    unexpected: Vec<String>,
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

async fn worker(
    id: u64,
    client: reqwest::Client,
    base: String,
    secret: String,
    deadline: Instant,
    tally: Arc<Mutex<Tally>>,
) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (id + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mut n = 0u64;
    while Instant::now() < deadline {
        {
            let mut t = tally.lock().unwrap();
            if t.requests >= MAX_REQUESTS {
                return;
            }
            t.requests += 1;
        }
        n += 1;
        if rng.below(100) < 5 {
            // Three identical requests with a new key at once: one runs, the others wait or replay.
            let key = format!("soak-burst-{id}-{n}");
            let send = || {
                client
                    .post(format!("{base}/orders"))
                    .header("idempotency-key", &key)
                    .body(format!("{{\"sku\":\"{key}\"}}"))
                    .send()
            };
            let answers = futures_util::future::join_all([send(), send(), send()]).await;
            let mut t = tally.lock().unwrap();
            t.requests += 2;
            for answer in answers {
                let status = answer.map(|r| r.status().as_u16()).unwrap_or(0);
                *t.by_status.entry(status).or_default() += 1;
                if ![201, 409].contains(&status) && t.unexpected.len() < 20 {
                    t.unexpected.push(format!("burst status {status}"));
                }
                if status == 201 && t.accepted.insert(format!("orders:{key}")) {
                    t.orders.push(key.clone());
                }
            }
            continue;
        }
        let kind = match rng.below(100) {
            0..=29 => Kind::NewOrder,
            30..=54 => Kind::DuplicateOrder,
            55..=64 => Kind::NewEvent,
            65..=74 => Kind::DuplicateEvent,
            75..=81 => Kind::ForgedEvent,
            82..=87 => Kind::MissingKey,
            88..=93 => Kind::InvalidKey,
            _ => Kind::ReusedKey,
        };
        let pick = |list: &Vec<String>, rng: &mut Rng| {
            (!list.is_empty()).then(|| list[rng.below(list.len() as u64) as usize].clone())
        };
        let (request, valid_key, expect): (reqwest::RequestBuilder, Option<String>, &[u16]) =
            match kind {
                Kind::NewOrder | Kind::DuplicateOrder => {
                    let existing = match kind {
                        Kind::DuplicateOrder => pick(&tally.lock().unwrap().orders, &mut rng),
                        _ => None,
                    };
                    // New keys join the duplicate pool only once answered, so that a "reused"
                    // request never races ahead of its key's first request.
                    let key = existing.unwrap_or_else(|| format!("soak-{id}-{n}"));
                    let request = client
                        .post(format!("{base}/orders"))
                        .header("idempotency-key", &key)
                        .body(format!("{{\"sku\":\"{key}\"}}"));
                    (request, Some(format!("orders:{key}")), &[201, 409])
                }
                Kind::NewEvent | Kind::DuplicateEvent => {
                    let existing = match kind {
                        Kind::DuplicateEvent => pick(&tally.lock().unwrap().events, &mut rng),
                        _ => None,
                    };
                    let event = existing.unwrap_or_else(|| format!("evt_soak_{id}_{n}"));
                    let body = format!(r#"{{"id":"{event}","object":"event","type":"soak"}}"#);
                    let request = client
                        .post(format!("{base}/webhooks/stripe"))
                        .header("stripe-signature", stripe_signature(&secret, &body))
                        .body(body);
                    (request, Some(format!("stripe:{event}")), &[200, 409])
                }
                Kind::ForgedEvent => {
                    let body = format!(r#"{{"id":"evt_forged_{id}_{n}","type":"soak"}}"#);
                    let request = client
                        .post(format!("{base}/webhooks/stripe"))
                        .header("stripe-signature", stripe_signature("whsec_wrong", &body))
                        .body(body);
                    (request, None, &[401])
                }
                Kind::MissingKey => (
                    client.post(format!("{base}/orders")).body("{}"),
                    None,
                    &[400],
                ),
                Kind::InvalidKey => (
                    client
                        .post(format!("{base}/orders"))
                        .header("idempotency-key", "has a space")
                        .body("{}"),
                    None,
                    &[400],
                ),
                Kind::ReusedKey => match pick(&tally.lock().unwrap().orders, &mut rng) {
                    // Same key, another body: 422 once completed, 409/422 while running.
                    Some(key) => (
                        client
                            .post(format!("{base}/orders"))
                            .header("idempotency-key", key)
                            .body("{\"sku\":\"something else\"}"),
                        None,
                        &[422, 409],
                    ),
                    None => continue,
                },
            };
        let status = match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let _ = response.bytes().await;
                status
            }
            Err(error) => {
                let mut t = tally.lock().unwrap();
                t.unexpected.push(format!("transport error: {error}"));
                continue;
            }
        };
        let mut t = tally.lock().unwrap();
        *t.by_status.entry(status).or_default() += 1;
        if !expect.contains(&status) && t.unexpected.len() < 20 {
            t.unexpected.push(format!("status {status}"));
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

async fn run(base: String, seconds: u64, secret: String) -> Result<String, String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let tally = Arc::new(Mutex::new(Tally::default()));
    let workers: Vec<_> = (0..WORKERS as u64)
        .map(|id| {
            let (client, base, secret, tally) =
                (client.clone(), base.clone(), secret.clone(), tally.clone());
            tokio::spawn(worker(id, client, base, secret, deadline, tally))
        })
        .collect();
    for worker in workers {
        worker.await.map_err(|e| e.to_string())?;
    }
    let effects: HashMap<String, u64> = serde_json::from_slice(
        &client
            .get(format!("{base}/effects"))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .bytes()
            .await
            .map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;

    let t = tally.lock().unwrap();
    let executions: u64 = effects.values().sum();
    let twice = effects.values().filter(|&&n| n > 1).count();
    let unknown = effects.keys().filter(|k| !t.accepted.contains(*k)).count();
    let server_errors: u64 = t
        .by_status
        .iter()
        .filter(|(s, _)| **s >= 500)
        .map(|(_, n)| n)
        .sum();
    let mut statuses: Vec<_> = t.by_status.iter().collect();
    statuses.sort();
    let summary = format!(
        "requests={} unique_valid_keys={} executions={} keys_run_twice={} unexpected_effects={} \
         5xx={} unexpected_answers={} statuses={:?}",
        t.requests,
        t.accepted.len(),
        executions,
        twice,
        unknown,
        server_errors,
        t.unexpected.len(),
        statuses
    );
    let ok = executions == t.accepted.len() as u64
        && twice == 0
        && unknown == 0
        && server_errors == 0
        && t.unexpected.is_empty();
    if ok {
        Ok(summary)
    } else {
        Err(format!(
            "{summary} first_unexpected={:?}",
            t.unexpected.first()
        ))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [base, seconds, secret] = args.as_slice() else {
        eprintln!("usage: soak_client BASE_URL SECONDS STRIPE_SECRET");
        return ExitCode::from(2);
    };
    if !base.starts_with("http://127.0.0.1:") {
        eprintln!("soak_client only targets http://127.0.0.1");
        return ExitCode::from(2);
    }
    let Ok(seconds) = seconds.parse::<u64>() else {
        eprintln!("SECONDS must be a whole number");
        return ExitCode::from(2);
    };
    match run(
        base.trim_end_matches('/').to_owned(),
        seconds.min(3600),
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
