//! The invariants, checked after the drain against the database, the provider's ledger and the
//! target's counts.

use std::collections::{BTreeMap, BTreeSet};

use crate::{
    db::Snapshot,
    instances::MAX_ATTEMPTS,
    target::KeySeen,
    traffic::{Kind, Refused, Sent},
};

/// One invariant: how many things it checked and the ids that break it.
#[derive(Debug, serde::Serialize)]
pub struct Invariant {
    pub name: &'static str,
    pub checked: u64,
    pub violations: Vec<String>,
}

impl Invariant {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            checked: 0,
            violations: Vec::new(),
        }
    }

    fn check(&mut self, ok: bool, id: impl FnOnce() -> String) {
        self.checked += 1;
        if !ok {
            self.violations.push(id());
        }
    }
}

/// What the checks read.
pub struct Inputs<'a> {
    pub events: &'a BTreeMap<String, Sent>,
    pub refused: &'a [Refused],
    /// The state after the last drain.
    pub last: &'a Snapshot,
    /// Failed rows seen after the first drain (before the operator's retries) and after the last.
    pub failed_rows: &'a BTreeMap<String, (i64, String)>,
    /// Inbox events and outbox keys still pending at the end of a drain.
    pub pending_after_drain: &'a [String],
    pub target: &'a BTreeMap<String, KeySeen>,
    pub target_keyless: u64,
    pub landing_gets: u64,
}

const PROCESSED: i64 = 1;
const FAILED: i64 = 2;
const SKIPPED: i64 = 3;
const DELIVERED: i64 = 1;

pub fn check(i: &Inputs<'_>) -> Vec<Invariant> {
    let effects = |id: &str| i.last.effects.get(id).copied().unwrap_or(0);
    let state = |id: &str| i.last.inbox.get(id).map(|row| row.state);

    let mut stored = Invariant::new("every acknowledged event is stored");
    let mut once = Invariant::new(
        "every acknowledged event processed exactly once (poison/permanent: failed, never committed; stale under skip-stale: skipped)",
    );
    let mut at_most_once =
        Invariant::new("no event committed twice, nothing committed that was not sent");
    for (id, sent) in i.events {
        let n = effects(id);
        at_most_once.check(n <= 1, || format!("{id} committed {n} times"));
        let Some(_) = sent.acked_at else { continue };
        stored.check(state(id).is_some(), || id.clone());
        let ok = match (sent.kind.succeeds(), state(id)) {
            (true, Some(SKIPPED)) => sent.kind == Kind::Ordered && n == 0,
            (true, _) => n == 1 && state(id) == Some(PROCESSED),
            (false, s) => n == 0 && s == Some(FAILED),
        };
        once.check(ok, || {
            format!(
                "{id} ({:?}) state {:?} committed {n} times",
                sent.kind,
                state(id)
            )
        });
    }
    for id in i.last.effects.keys() {
        if !i.events.contains_key(id) {
            at_most_once.check(false, || format!("{id} committed but never sent"));
        }
    }

    let mut refused =
        Invariant::new("no forgery, replay under a new id or stale delivery stored or processed");
    for r in i.refused {
        let ok = !(200..300).contains(&r.status)
            && !i.last.inbox.contains_key(&r.id)
            && effects(&r.id) == 0;
        refused.check(ok, || {
            format!("{} ({}, answered {})", r.id, r.how, r.status)
        });
    }

    let mut failed = Invariant::new(
        "every failed event or message spent its attempts (an event: or failed permanently)",
    );
    for (id, (attempts, error)) in i.failed_rows {
        let ok = *attempts >= i64::from(MAX_ATTEMPTS) || error.contains("permanent");
        failed.check(ok, || {
            format!("{id} failed after {attempts} attempts: {error}")
        });
    }
    for (key, row) in &i.last.outbox {
        if row.state == FAILED {
            failed.check(row.attempts >= i64::from(MAX_ATTEMPTS), || {
                format!("message {key} failed after {} attempts", row.attempts)
            });
        }
    }

    let mut pending =
        Invariant::new("nothing pending after the drain (lease plus backoff horizon)");
    pending.checked = (i.last.inbox.len() + i.last.outbox.len()) as u64;
    pending.violations = i.pending_after_drain.to_vec();

    // The outbox: the receiver's message for event E has scope `E`.
    let by_scope: BTreeMap<&str, (&String, &crate::db::OutboxRow)> = i
        .last
        .outbox
        .iter()
        .map(|(key, row)| (row.scope.as_str(), (key, row)))
        .collect();
    let mut delivered = Invariant::new(
        "every committed test.outbox event's message reached the target and ran there once",
    );
    for (id, sent) in i.events {
        if sent.kind != Kind::Outbox || effects(id) != 1 {
            continue;
        }
        let scope = id.clone();
        // At least once: a message whose answer was lost (a kill, a cut connection) and whose
        // attempts were then spent is failed in the table, yet it reached the target.
        let ok = by_scope
            .get(scope.as_str())
            .is_some_and(|(key, _)| i.target.get(*key).is_some_and(|seen| seen.runs == 1));
        delivered.check(ok, || {
            let row = by_scope.get(scope.as_str());
            format!(
                "{id}: outbox {:?}, target {:?}",
                row.map(|(key, row)| (key, row.state, row.attempts)),
                row.and_then(|(key, _)| i.target.get(*key))
            )
        });
    }

    let mut same_key = Invariant::new(
        "each message always sent with the same key, each key naming one event, none without a key",
    );
    let mut keys_of_event = BTreeMap::<&str, BTreeSet<&str>>::new();
    for (key, seen) in i.target {
        for event in &seen.events {
            keys_of_event.entry(event).or_default().insert(key);
        }
        let expected = seen.events.iter().next().map(|event| {
            i.last
                .outbox
                .get(key)
                .is_some_and(|row| row.scope == event.clone())
        });
        same_key.check(
            seen.events.len() == 1 && expected == Some(true) && seen.runs <= 1,
            || format!("key {key}: events {:?}, runs {}", seen.events, seen.runs),
        );
    }
    for (event, keys) in &keys_of_event {
        if keys.len() > 1 {
            same_key.check(false, || format!("event {event} sent under keys {keys:?}"));
        }
    }
    if i.target_keyless > 0 {
        same_key.check(false, || {
            format!("{} POSTs without a key", i.target_keyless)
        });
    }

    let mut received = Invariant::new(
        "no message counted delivered that the target did not receive (no redirect followed)",
    );
    for (key, row) in &i.last.outbox {
        if row.state == DELIVERED {
            received.check(i.target.get(key).is_some_and(|seen| seen.runs == 1), || {
                format!("{key} delivered, target saw {:?}", i.target.get(key))
            });
        }
    }
    if i.landing_gets > 0 {
        received.check(false, || {
            format!("{} GETs of the redirect's landing path", i.landing_gets)
        });
    }

    let mut uncommitted =
        Invariant::new("no message of an event that was never committed reached the target");
    for seen in i.target.values() {
        for event in &seen.events {
            uncommitted.check(effects(event) == 1, || {
                format!("{event} (committed {})", effects(event))
            });
        }
    }

    let mut stale = Invariant::new(
        "skip-stale: no older event run after a newer one of its object; a skipped event has a newer one run",
    );
    let created = |id: &str| i.events.get(id).map(|s| s.created);
    for (object, run) in &i.last.order {
        let times: Vec<Option<i64>> = run.iter().map(|id| created(id)).collect();
        let ok = times.iter().all(Option::is_some) && times.windows(2).all(|w| w[0] < w[1]);
        stale.check(ok, || {
            format!("{object}: run in the order {run:?} (created {times:?})")
        });
    }
    for (id, sent) in i.events {
        if sent.kind != Kind::Ordered || state(id) != Some(SKIPPED) {
            continue;
        }
        let object = sent.object.as_deref().unwrap_or_default();
        let newer_run = i.last.order.get(object).is_some_and(|run| {
            run.iter()
                .any(|other| created(other).is_some_and(|t| t > sent.created))
        });
        stale.check(newer_run, || {
            format!("{id} skipped with no newer event of {object} run")
        });
    }

    vec![
        stored,
        once,
        at_most_once,
        refused,
        failed,
        pending,
        delivered,
        same_key,
        received,
        uncommitted,
        stale,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::{InboxRow, OutboxRow};

    fn sent(kind: Kind, created: i64, object: Option<&str>) -> Sent {
        Sent {
            kind,
            object: object.map(str::to_owned),
            created,
            body: String::new(),
            first_sent: 0.0,
            acked_at: Some(0.1),
            sends: 1,
        }
    }

    fn row(state: i64) -> InboxRow {
        InboxRow {
            state,
            attempts: 1,
            last_error: String::new(),
            available_at: 0,
            lease_until: 0,
            leased: false,
        }
    }

    /// A consistent run: one plain event, one outbox event delivered, two ordered events run in
    /// order and an older one skipped.
    struct World {
        events: BTreeMap<String, Sent>,
        refused: Vec<Refused>,
        last: Snapshot,
        target: BTreeMap<String, KeySeen>,
        landing_gets: u64,
    }

    impl World {
        fn new() -> Self {
            let events = BTreeMap::from([
                ("evt_1".to_owned(), sent(Kind::Plain, 1, None)),
                ("evt_2".to_owned(), sent(Kind::Outbox, 2, None)),
                ("evt_3".to_owned(), sent(Kind::Ordered, 3, Some("obj"))),
                ("evt_4".to_owned(), sent(Kind::Ordered, 4, Some("obj"))),
                ("evt_5".to_owned(), sent(Kind::Ordered, 2, Some("obj"))),
            ]);
            let last = Snapshot {
                inbox: BTreeMap::from([
                    ("evt_1".to_owned(), row(PROCESSED)),
                    ("evt_2".to_owned(), row(PROCESSED)),
                    ("evt_3".to_owned(), row(PROCESSED)),
                    ("evt_4".to_owned(), row(PROCESSED)),
                    ("evt_5".to_owned(), row(SKIPPED)),
                ]),
                effects: ["evt_1", "evt_2", "evt_3", "evt_4"]
                    .into_iter()
                    .map(|id| (id.to_owned(), 1))
                    .collect(),
                order: BTreeMap::from([("obj".to_owned(), vec!["evt_3".into(), "evt_4".into()])]),
                outbox: BTreeMap::from([(
                    "evt_2/0".to_owned(),
                    OutboxRow {
                        scope: "evt_2".into(),
                        state: DELIVERED,
                        attempts: 2,
                    },
                )]),
            };
            let target = BTreeMap::from([(
                "evt_2/0".to_owned(),
                KeySeen {
                    posts: 2,
                    runs: 1,
                    answered_ok: 1,
                    events: BTreeSet::from(["evt_2".to_owned()]),
                },
            )]);
            Self {
                events,
                refused: vec![Refused {
                    id: "evt_forged_9".into(),
                    how: "forgery",
                    at: 1.0,
                    status: 401,
                }],
                last,
                target,
                landing_gets: 0,
            }
        }

        /// The invariants that fail, by name.
        fn broken(&self) -> Vec<&'static str> {
            let failed = BTreeMap::new();
            check(&Inputs {
                events: &self.events,
                refused: &self.refused,
                last: &self.last,
                failed_rows: &failed,
                pending_after_drain: &[],
                target: &self.target,
                target_keyless: 0,
                landing_gets: self.landing_gets,
            })
            .into_iter()
            .filter(|i| !i.violations.is_empty())
            .map(|i| i.name)
            .collect()
        }
    }

    #[test]
    fn a_consistent_run_holds_every_invariant() {
        assert_eq!(World::new().broken(), Vec::<&str>::new());
    }

    #[test]
    fn an_acknowledged_event_never_committed_is_a_violation() {
        let mut world = World::new();
        world.last.effects.remove("evt_1");
        world.last.inbox.insert("evt_1".into(), row(0));
        assert_eq!(world.broken(), vec![
            "every acknowledged event processed exactly once (poison/permanent: failed, never committed; stale under skip-stale: skipped)"
        ]);
    }

    #[test]
    fn a_forgery_stored_is_a_violation() {
        let mut world = World::new();
        world
            .last
            .inbox
            .insert("evt_forged_9".into(), row(PROCESSED));
        assert!(world
            .broken()
            .iter()
            .any(|name| name.starts_with("no forgery")));
    }

    #[test]
    fn a_redirect_counted_delivered_is_a_violation() {
        let mut world = World::new();
        // The relay followed the 301 as a GET: the target never ran the key.
        world.target.clear();
        world.landing_gets = 1;
        let broken = world.broken();
        assert!(broken
            .iter()
            .any(|name| name.starts_with("no message counted delivered")));
        assert!(broken
            .iter()
            .any(|name| name.starts_with("every committed test.outbox")));
    }

    #[test]
    fn a_message_failed_after_reaching_the_target_holds_only_with_its_attempts_spent() {
        let mut world = World::new();
        let row = world.last.outbox.get_mut("evt_2/0").unwrap();
        row.state = FAILED;
        row.attempts = i64::from(MAX_ATTEMPTS);
        assert_eq!(world.broken(), Vec::<&str>::new());
        world.last.outbox.get_mut("evt_2/0").unwrap().attempts = 3;
        assert_eq!(
            world.broken(),
            vec!["every failed event or message spent its attempts (an event: or failed permanently)"]
        );
    }

    #[test]
    fn an_older_event_run_after_a_newer_one_is_a_violation() {
        let mut world = World::new();
        world
            .last
            .order
            .insert("obj".into(), vec!["evt_4".into(), "evt_3".into()]);
        assert_eq!(world.broken(), vec![
            "skip-stale: no older event run after a newer one of its object; a skipped event has a newer one run"
        ]);
    }
}
