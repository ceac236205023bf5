//! Ordering the events of one object: see [`Ordering`].

use std::{fmt, sync::Arc};

use tower_idempotency_jobs::Prepared;

use crate::dialect::Db;

/// What the worker does with events of one ordering key that arrive out of order; see
/// [`Ordering`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderingPolicy {
    /// One at a time per key, earliest pending first.
    Sequential,
    /// An event older than the newest processed one of its key is skipped.
    SkipStale,
}

/// Where an event stands among its object's events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrderPosition {
    /// The object the event is about (Stripe: `data.object.id`).
    pub key: String,
    /// When the event happened, in any integer unit the provider uses consistently (Stripe:
    /// `created`, Unix seconds).
    pub time: i64,
}

type Extract = dyn Fn(&[u8]) -> Option<OrderPosition> + Send + Sync;

/// How an inbox orders the events of one object: a function reading an [`OrderPosition`] from
/// an event's body, and the [`OrderingPolicy`]. Set with
/// [`Inbox::ordering`](crate::Inbox::ordering). The position is read and stored at
/// acknowledgement; the policy decides what the worker does with an event that arrives out of
/// order.
///
/// Providers do not promise order (Stripe's `payment_intent.succeeded` can arrive before its
/// `payment_intent.processing`), so a handler that writes an object's latest status can write the
/// wrong one. Two policies:
///
/// - [`OrderingPolicy::Sequential`]: events of one key never run at once, and among the key's
///   pending events the earliest runs first. An event is claimed only when no other pending
///   event of its key is earlier and none is running; the next one is handed to the worker when
///   it ends. A later event waits while an earlier one waits for its retry; a failed (dead-lettered)
///   event no longer holds the others back. On Postgres the claim takes a transaction-scoped
///   advisory lock on the key, so instances sharing the table keep the order.
/// - [`OrderingPolicy::SkipStale`]: an event older than the newest *processed* event of its key
///   is marked [`Skipped`](crate::EventState::Skipped) and never handed to the handler: its
///   news is already out of date, and a handler that cannot tell would overwrite newer state.
///   The check and the handler's writes commit in one transaction that holds the key's lock (an
///   advisory lock on Postgres, the write lock on SQLite), so two events of one key are decided
///   one after the other, never both against a stale view.
///
/// **Ties.** Events are ordered by event time, then by when they were acknowledged, then by
/// event id. Under `SkipStale` an event is stale only when a processed event of its key is
/// strictly newer: two events of the same second (Stripe's `created` counts seconds; a charge
/// and its refund can share one) are both handed to the handler, in the order they are claimed,
/// since the provider's clock cannot tell which is newer. Make such handlers commutative (a
/// refund applies whether or not its charge was seen).
///
/// An event from which no key or time can be read is not ordered: it runs as without a policy.
///
/// ```
/// use tower_idempotency_inbox::{Ordering, OrderingPolicy};
///
/// // Stripe: `data.object.id` and `created`.
/// let ordering = Ordering::stripe(OrderingPolicy::SkipStale);
/// // Any JSON webhook, by two JSON pointers (the time must be an integer).
/// let ordering = Ordering::json("/object/id", "/occurred_at", OrderingPolicy::Sequential);
/// # let _ = ordering;
/// ```
#[derive(Clone)]
pub struct Ordering {
    extract: Arc<Extract>,
    policy: OrderingPolicy,
}

impl fmt::Debug for Ordering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ordering")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Ordering {
    /// Stripe events, keyed by `data.object.id` and timed by `created`.
    pub fn stripe(policy: OrderingPolicy) -> Self {
        Self::json("/data/object/id", "/created", policy)
    }

    /// Keyed by the string at the JSON pointer `key` and timed by the integer at `time`
    /// (RFC 6901 pointers, e.g. `/data/object/id`).
    pub fn json(key: &str, time: &str, policy: OrderingPolicy) -> Self {
        let (key, time) = (key.to_owned(), time.to_owned());
        Self::with(policy, move |body| {
            let json: serde_json::Value = serde_json::from_slice(body).ok()?;
            Some(OrderPosition {
                key: json.pointer(&key)?.as_str()?.to_owned(),
                time: json.pointer(&time)?.as_i64()?,
            })
        })
    }

    /// Positions read by `extract` from an event's raw body; `None` leaves the event unordered.
    pub fn with(
        policy: OrderingPolicy,
        extract: impl Fn(&[u8]) -> Option<OrderPosition> + Send + Sync + 'static,
    ) -> Self {
        Self {
            extract: Arc::new(extract),
            policy,
        }
    }

    /// The policy.
    pub fn policy(&self) -> OrderingPolicy {
        self.policy
    }

    /// The event's position, when it has one.
    pub fn position(&self, body: &[u8]) -> Option<OrderPosition> {
        (self.extract)(body)
    }
}

/// The statements of an ordered inbox table (see `backend.rs` for the others).
#[derive(Debug)]
pub struct OrderedSql {
    /// Postgres and MySQL: locks the event's ordering key for the transaction (no row for an
    /// unordered event; Postgres: an advisory lock, MySQL: the rows of the key). Bound:
    /// provider, event id.
    pub(crate) lock: Option<Prepared>,
    /// The claim under [`OrderingPolicy::Sequential`]: as the plain claim, and only when no
    /// other pending event of its key is earlier or running. Bound as the plain claim (MySQL:
    /// the locking `SELECT` that picks the event, followed by [`Self::unreturned`]).
    pub(crate) claim: Prepared,
    /// MySQL, which has no `RETURNING`: the claim's `UPDATE` of the picked event (bound as the
    /// plain claim) and the read of its claimed row (bound: provider, event id).
    pub(crate) unreturned: Option<(Prepared, Prepared)>,
    /// The sweep under [`OrderingPolicy::Sequential`]: the due events a claim would take now
    /// (no earlier pending or running event of their key), so a backlog of events waiting for
    /// an earlier one never fills the sweep's batch. Bound as the plain sweep.
    pub(crate) due: Prepared,
    /// Whether a processed event of the event's key is strictly newer, in the table or in the
    /// positions the retention kept; answers its event id.
    pub(crate) newer: Prepared,
    /// Marks a claimed event skipped (fenced by its token).
    pub(crate) skip: Prepared,
    /// The earliest pending event of the event's key, other than the event.
    pub(crate) next: Prepared,
}

impl OrderedSql {
    /// `due` selects due events; `due_by_key` is the same condition for a statement that names
    /// its event's key (kept on the primary key).
    pub(crate) fn new(table: &str, (due, due_by_key): (&str, &str), db: Db) -> Self {
        let sql = |text: String| Prepared::new(text, db.placeholders());
        // `o.state + 0` keeps the planner on the ordering index, which holds the key's events:
        // one led by `state` would walk every pending event of the provider instead.
        let earlier_or_running = |e: &str| {
            format!(
                "NOT EXISTS (SELECT 1 FROM {table} o WHERE o.provider = {e}.provider \
                 AND o.order_key = {e}.order_key AND o.state + 0 = 0 \
                 AND o.event_id <> {e}.event_id \
                 AND ((o.event_time, o.received_at, o.event_id) \
                 < ({e}.event_time, {e}.received_at, {e}.event_id) OR o.lease_until > $1))"
            )
        };
        let returned = "headers, body, received_at, attempts";
        let take = "attempts = attempts + 1, lease_token = $4, lease_until = $5";
        let (lock, claim, unreturned) = match db {
            Db::Postgres => {
                let lock = format!(
                "SELECT pg_advisory_xact_lock(hashtextextended(provider || ':' || order_key, 0)) \
                 FROM {table} WHERE provider = $1 AND event_id = $2 AND order_key IS NOT NULL"
            );
                let claim = format!(
                    "UPDATE {table} SET {take} \
                 WHERE (provider, event_id) = (SELECT provider, event_id FROM {table} e \
                 WHERE provider = $2 AND event_id = $3 AND {due_by_key} AND attempts < $6 AND {} \
                 FOR UPDATE SKIP LOCKED) \
                 RETURNING {returned}",
                    earlier_or_running("e")
                );
                (Some(sql(lock)), sql(claim), None)
            }
            // The rows of the key, locked: a claim of the key's other events waits for this
            // one's commit. The pick, the update and the read of the claimed row follow in
            // the same transaction. A join, not a subquery: a locking read takes no snapshot,
            // so under REPEATABLE READ the transaction's reads after it see what the key's
            // previous holder committed.
            Db::MySql => {
                let lock = format!(
                    "SELECT 1 FROM {table} e JOIN {table} o ON o.provider = e.provider \
                     AND o.order_key = e.order_key \
                     WHERE e.provider = $1 AND e.event_id = $2 FOR UPDATE"
                );
                let pick = format!(
                    "SELECT provider FROM {table} e \
                     WHERE provider = $2 AND event_id = $3 AND {due_by_key} AND attempts < $6 \
                     AND {} FOR UPDATE",
                    earlier_or_running("e")
                );
                let update =
                    format!("UPDATE {table} SET {take} WHERE provider = $2 AND event_id = $3");
                let read =
                    format!("SELECT {returned} FROM {table} WHERE provider = $1 AND event_id = $2");
                (Some(sql(lock)), sql(pick), Some((sql(update), sql(read))))
            }
            Db::Sqlite => {
                let claim = format!(
                    "UPDATE {table} SET {take} \
                 WHERE provider = $2 AND event_id = $3 AND {due_by_key} AND attempts < $6 AND {} \
                 RETURNING {returned}",
                    earlier_or_running(table)
                );
                (None, sql(claim), None)
            }
        };
        let due_now = format!(
            "SELECT provider, event_id FROM {table} e WHERE {due} AND attempts < $3 AND {} \
             ORDER BY attempts = 0, available_at LIMIT $2",
            earlier_or_running("e")
        );
        Self {
            lock,
            claim,
            unreturned,
            due: sql(due_now),
            // A processed event still in the table, or the position the purge kept of the
            // processed events it deleted: one statement, so a purge committing meanwhile is
            // seen before or after, never half.
            newer: sql(format!(
                "SELECT o.event_id FROM {table} e JOIN {table} o ON o.provider = e.provider \
                 AND o.order_key = e.order_key \
                 WHERE e.provider = $1 AND e.event_id = $2 AND o.state = 1 \
                 AND o.event_time > e.event_time \
                 UNION ALL \
                 SELECT p.event_id FROM {table} e JOIN {table}_positions p \
                 ON p.provider = e.provider AND p.order_key = e.order_key \
                 WHERE e.provider = $1 AND e.event_id = $2 AND p.event_time > e.event_time \
                 LIMIT 1"
            )),
            skip: sql(format!(
                "UPDATE {table} SET state = 3, finished_at = $3, last_error = $5, \
                 lease_token = NULL, lease_until = NULL \
                 WHERE provider = $1 AND event_id = $2 AND lease_token = $4"
            )),
            next: sql(format!(
                "SELECT n.event_id FROM {table} e JOIN {table} n ON n.provider = e.provider \
                 AND n.order_key = e.order_key \
                 WHERE e.provider = $1 AND e.event_id = $2 AND n.state = 0 \
                 AND n.event_id <> e.event_id \
                 ORDER BY n.event_time, n.received_at, n.event_id LIMIT 1"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripe_positions_come_from_the_object_id_and_created() {
        let ordering = Ordering::stripe(OrderingPolicy::Sequential);
        let body = br#"{"id":"evt_1","created":1700000003,"data":{"object":{"id":"pi_9"}}}"#;
        assert_eq!(
            ordering.position(body),
            Some(OrderPosition {
                key: "pi_9".into(),
                time: 1_700_000_003
            })
        );
        assert_eq!(ordering.position(br#"{"id":"evt_1","created":1}"#), None);
        assert_eq!(ordering.position(b"not json"), None);
        assert_eq!(ordering.policy(), OrderingPolicy::Sequential);
    }
}
