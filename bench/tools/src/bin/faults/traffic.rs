//! The provider's side: signed Stripe events delivered to `POST /inbox/stripe` and retried until
//! acknowledged, duplicate and concurrent copies, and deliveries that must be refused
//! (forgeries, a signed delivery replayed under a new id, a stale timestamp).

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::{faultlog::FaultLog, instances::Instances};

/// What an event asks of the receiver's handler (its `type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Kind {
    Plain,
    /// `test.flaky`: fails its first two attempts.
    Flaky,
    /// `test.poison`: always fails.
    Poison,
    /// `test.permanent`: fails permanently on its first attempt.
    Permanent,
    /// `test.outbox`: enqueues one outbox message.
    Outbox,
    /// Carries `data.object.id` and `created`: ordered under skip-stale.
    Ordered,
}

impl Kind {
    fn type_name(self) -> &'static str {
        match self {
            Self::Plain => "faults.plain",
            Self::Flaky => "test.flaky",
            Self::Poison => "test.poison",
            Self::Permanent => "test.permanent",
            Self::Outbox => "test.outbox",
            Self::Ordered => "faults.ordered",
        }
    }

    /// Whether the handler commits the event (it does not fail it on purpose).
    pub fn succeeds(self) -> bool {
        !matches!(self, Self::Poison | Self::Permanent)
    }
}

/// One event the provider sent.
#[derive(Clone, Debug)]
pub struct Sent {
    pub kind: Kind,
    pub object: Option<String>,
    pub created: i64,
    pub body: String,
    /// Seconds since the start of the run.
    pub first_sent: f64,
    pub acked_at: Option<f64>,
    pub sends: u32,
}

/// A delivery that must never be processed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Refused {
    pub id: String,
    pub how: &'static str,
    pub at: f64,
    pub status: u16,
}

#[derive(Default)]
pub struct Ledger {
    pub events: Mutex<BTreeMap<String, Sent>>,
    pub refused: Mutex<Vec<Refused>>,
    /// Answers by what was sent: `"<what> <status>"`, status 0 a transport error.
    pub answers: Mutex<BTreeMap<String, u64>>,
    /// Acknowledged ids, to pick duplicates from.
    acked: Mutex<Vec<String>>,
}

impl Ledger {
    fn answer(&self, what: &str, status: u16) {
        let label = match status {
            0 => format!("{what} no answer"),
            s => format!("{what} {s}"),
        };
        *self.answers.lock().unwrap().entry(label).or_default() += 1;
    }
}

/// The provider: sends, signs and retries.
pub struct Traffic {
    client: reqwest::Client,
    secret: String,
    pub instances: Arc<Instances>,
    pub ledger: Arc<Ledger>,
    log: Arc<FaultLog>,
    next_id: AtomicU64,
    next_created: AtomicI64,
    /// Deliveries still being retried.
    pub outstanding: AtomicI64,
    /// Ordered events are sent (the skip-stale phase).
    pub ordered: AtomicBool,
}

fn unix_secs() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
}

/// Stripe's `Stripe-Signature` for `body` at time `t`.
fn sign(secret: &str, t: i64, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(format!("{t}.{body}").as_bytes());
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// Decrements the outstanding deliveries when a delivery task ends.
struct Outstanding(Arc<Traffic>);

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Traffic {
    pub fn new(
        secret: String,
        instances: Arc<Instances>,
        log: Arc<FaultLog>,
    ) -> Result<Arc<Self>, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(15))
            .build()?;
        Ok(Arc::new(Self {
            client,
            secret,
            instances,
            ledger: Arc::default(),
            log,
            next_id: AtomicU64::new(1),
            next_created: AtomicI64::new(unix_secs()),
            outstanding: AtomicI64::new(0),
            ordered: AtomicBool::new(false),
        }))
    }

    /// Sends `body` with `signature` to instance `i`: the status, 0 when nothing answered.
    async fn send(&self, i: usize, body: &str, signature: String) -> u16 {
        let in_flight = &self.instances.acks_in_flight[i];
        in_flight.fetch_add(1, Ordering::SeqCst);
        let sent = self
            .client
            .post(format!("{}/inbox/stripe", self.instances.base(i)))
            .header("stripe-signature", signature)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await;
        in_flight.fetch_sub(1, Ordering::SeqCst);
        match sent {
            Ok(response) => {
                let status = response.status().as_u16();
                let _ = response.bytes().await;
                status
            }
            Err(_) => 0,
        }
    }

    fn new_event(&self, kind: Kind, object: Option<String>) -> String {
        let id = format!("evt_{:07}", self.next_id.fetch_add(1, Ordering::SeqCst));
        let created = self.next_created.fetch_add(1, Ordering::SeqCst);
        let mut json = serde_json::json!({
            "id": id, "object": "event", "type": kind.type_name(), "created": created,
        });
        if let Some(object) = &object {
            json["data"] = serde_json::json!({ "object": { "id": object } });
        }
        let sent = Sent {
            kind,
            object,
            created,
            body: json.to_string(),
            first_sent: self.log.now(),
            acked_at: None,
            sends: 0,
        };
        self.ledger.events.lock().unwrap().insert(id.clone(), sent);
        id
    }

    /// Records one send of `id` answered `status`; `true` when it was acknowledged.
    fn sent(&self, id: &str, what: &str, status: u16) -> bool {
        self.ledger.answer(what, status);
        let acked = (200..300).contains(&status);
        let mut events = self.ledger.events.lock().unwrap();
        if let Some(sent) = events.get_mut(id) {
            sent.sends += 1;
            if acked && sent.acked_at.is_none() {
                sent.acked_at = Some(self.log.now());
                self.ledger.acked.lock().unwrap().push(id.to_owned());
            }
        }
        acked
    }

    fn body(&self, id: &str) -> String {
        self.ledger.events.lock().unwrap()[id].body.clone()
    }

    /// Delivers `id` as a provider does: `copies` at once first (to random instances, the
    /// first to `pinned` when given), then one at a time with a doubling pause until one is
    /// acknowledged or eight more have gone unanswered.
    pub fn deliver(self: &Arc<Self>, id: String, copies: usize, pinned: Option<usize>, seed: u64) {
        self.outstanding.fetch_add(1, Ordering::SeqCst);
        let this = self.clone();
        tokio::spawn(async move {
            let _outstanding = Outstanding(this.clone());
            let mut rng = fastrand::Rng::with_seed(seed);
            let n = this.instances.len();
            let body = this.body(&id);
            let what = if copies > 1 {
                "concurrent copy"
            } else {
                "event"
            };
            let sends = (0..copies).map(|c| {
                let i = match (c, pinned) {
                    (0, Some(i)) => i,
                    _ => rng.usize(..n),
                };
                let signature = sign(&this.secret, unix_secs(), &body);
                let (this, body) = (this.clone(), body.clone());
                async move { this.send(i, &body, signature).await }
            });
            let statuses = futures_util::future::join_all(sends.collect::<Vec<_>>()).await;
            let mut acked = false;
            for status in statuses {
                acked |= this.sent(&id, what, status);
            }
            let mut pause = Duration::from_millis(500);
            for _ in 0..8 {
                if acked {
                    return;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(8));
                let signature = sign(&this.secret, unix_secs(), &body);
                let status = this.send(rng.usize(..n), &body, signature).await;
                acked = this.sent(&id, "retry", status);
            }
        });
    }

    /// A delivery that must be refused: sent once, its answer recorded.
    async fn refused(&self, id: String, how: &'static str, body: String, signature: String) {
        let i = fastrand::usize(..self.instances.len());
        let status = self.send(i, &body, signature).await;
        self.ledger.answer(how, status);
        self.ledger.refused.lock().unwrap().push(Refused {
            id,
            how,
            at: self.log.now(),
            status,
        });
    }

    /// One worker: picks an action every 150 to 350 ms until `deadline`.
    pub async fn worker(self: Arc<Self>, seed: u64, deadline: Instant) {
        let mut rng = fastrand::Rng::with_seed(seed);
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(rng.u64(150..350))).await;
            let roll = rng.u32(0..100);
            let ordered = self.ordered.load(Ordering::SeqCst);
            let kind = match roll {
                0..=39 => Kind::Plain,
                40..=46 => Kind::Flaky,
                47..=49 => Kind::Poison,
                50..=51 => Kind::Permanent,
                52..=63 => Kind::Outbox,
                94..=99 if ordered => Kind::Ordered,
                94..=99 => Kind::Plain,
                _ => {
                    self.other(roll, &mut rng).await;
                    continue;
                }
            };
            if kind == Kind::Ordered {
                self.ordered_group(&mut rng);
                continue;
            }
            let id = self.new_event(kind, None);
            self.deliver(id, 1, None, rng.u64(..));
        }
    }

    /// Duplicates, concurrent copies and deliveries that must be refused.
    async fn other(self: &Arc<Self>, roll: u32, rng: &mut fastrand::Rng) {
        match roll {
            64..=73 => {
                let picked = {
                    let acked = self.ledger.acked.lock().unwrap();
                    (!acked.is_empty()).then(|| acked[rng.usize(..acked.len())].clone())
                };
                let Some(id) = picked else { return };
                let body = self.body(&id);
                let i = rng.usize(..self.instances.len());
                let status = self
                    .send(i, &body, sign(&self.secret, unix_secs(), &body))
                    .await;
                self.sent(&id, "duplicate", status);
            }
            74..=79 => {
                let id = self.new_event(Kind::Plain, None);
                self.deliver(id, 3, None, rng.u64(..));
            }
            80..=85 => {
                let id = format!("evt_forged_{}", self.next_id.fetch_add(1, Ordering::SeqCst));
                let body = format!(r#"{{"id":"{id}","object":"event","type":"faults.plain"}}"#);
                let signature = sign("whsec_not_the_secret", unix_secs(), &body);
                self.refused(id, "forgery", body, signature).await;
            }
            86..=90 => {
                // A signed delivery replayed with the id in its body changed: Stripe signs the
                // body, so the signature no longer matches.
                let picked = {
                    let acked = self.ledger.acked.lock().unwrap();
                    (!acked.is_empty()).then(|| acked[rng.usize(..acked.len())].clone())
                };
                let Some(original) = picked else { return };
                let body = self.body(&original);
                let signature = sign(&self.secret, unix_secs(), &body);
                let id = format!("evt_replay_{}", self.next_id.fetch_add(1, Ordering::SeqCst));
                let replayed = body.replace(&original, &id);
                self.refused(id, "replay under a new id", replayed, signature)
                    .await;
            }
            _ => {
                // Signed with the real secret an hour ago: outside Stripe's tolerance.
                let id = format!("evt_stale_{}", self.next_id.fetch_add(1, Ordering::SeqCst));
                let body = format!(r#"{{"id":"{id}","object":"event","type":"faults.plain"}}"#);
                let signature = sign(&self.secret, unix_secs() - 3600, &body);
                self.refused(id, "stale timestamp", body, signature).await;
            }
        }
    }

    /// Two or three events of one object, newer `created` each, delivered at once in a random
    /// order.
    fn ordered_group(self: &Arc<Self>, rng: &mut fastrand::Rng) {
        let object = format!("obj_{:02}", rng.u32(0..24));
        let mut ids: Vec<String> = (0..rng.usize(2..=3))
            .map(|_| self.new_event(Kind::Ordered, Some(object.clone())))
            .collect();
        rng.shuffle(&mut ids);
        for id in ids {
            self.deliver(id, 1, None, rng.u64(..));
        }
    }

    /// Delivers `count` new plain events to instance `i` at once (a kill follows).
    pub fn burst_to(self: &Arc<Self>, i: usize, count: usize, rng: &mut fastrand::Rng) {
        for _ in 0..count {
            let id = self.new_event(Kind::Plain, None);
            self.deliver(id, 1, Some(i), rng.u64(..));
        }
    }

    /// Delivers `count` new `test.outbox` events (a kill mid-delivery follows).
    pub fn outbox_burst(self: &Arc<Self>, count: usize, rng: &mut fastrand::Rng) {
        for _ in 0..count {
            let id = self.new_event(Kind::Outbox, None);
            self.deliver(id, 1, None, rng.u64(..));
        }
    }
}
