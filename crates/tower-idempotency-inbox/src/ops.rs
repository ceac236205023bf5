//! An operator's calls on an [`Inbox`]: list events by filters with a cursor, show one event,
//! discard a failed one, retry failed events in bulk (with a dry run and a release rate), and
//! the counts per provider and the lag the operator's page shows.

use std::{
    num::NonZeroU32,
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};

pub use tower_idempotency_jobs::redact::REDACTED;
use tower_idempotency_jobs::redact::{redact, shown_body};

pub use tower_idempotency_jobs::time::{parse_rfc3339, rfc3339};
use tower_idempotency_jobs::{audit::AuditEntry, cursor, time::rfc3339_ms, JobKey, PageFilter};

use crate::{
    backend,
    event::{now_ms, unix_ms},
    EventKey, EventState, EventSummary, Inbox, InboxDatabase, InboxError,
};

/// The most events one page of [`Inbox::events`] holds.
pub const MAX_PAGE: u32 = 500;

/// Rows read per statement while a listing or a bulk retry scans.
const SCAN_BATCH: i64 = 500;

/// Which events a listing or a bulk retry takes. Every field left `None` matches all.
///
/// Deserializes from a JSON object or a URL query (`state=failed&provider=stripe&type=..&
/// received_after=2026-01-02T00:00:00Z&received_before=..`); an empty field (as an HTML form
/// sends it) is `None`, a time is RFC 3339.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct EventFilter {
    /// Only events in this state.
    #[serde(default, deserialize_with = "filter_fields::state")]
    pub state: Option<EventState>,
    /// Only events from this provider (`stripe`, `github`, ...).
    #[serde(default, deserialize_with = "filter_fields::text")]
    pub provider: Option<String>,
    /// Only events of this type: the body's top-level `"type"` string, as the attempt's span
    /// names it (Stripe, Slack and most JSON webhooks).
    #[serde(default, rename = "type", deserialize_with = "filter_fields::text")]
    pub event_type: Option<String>,
    /// Only events acknowledged at or after this time.
    #[serde(default, deserialize_with = "filter_fields::time")]
    pub received_after: Option<SystemTime>,
    /// Only events acknowledged before this time.
    #[serde(default, deserialize_with = "filter_fields::time")]
    pub received_before: Option<SystemTime>,
}

/// One event in a listing; times are RFC 3339 (UTC, milliseconds).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventRecord {
    /// The provider's name.
    pub provider: String,
    /// The provider's event id.
    pub event_id: String,
    /// The body's top-level `"type"` string, when it has one.
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// Its state.
    pub state: EventState,
    /// Attempts started so far.
    pub attempts: u32,
    /// When it was acknowledged.
    pub received_at: String,
    /// Pending: not attempted before this time.
    pub available_at: String,
    /// When it was processed or failed.
    pub finished_at: Option<String>,
    /// The last attempt's error.
    pub last_error: Option<String>,
}

/// One page of [`Inbox::events`]: newest first, and the cursor of the next page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventPage {
    /// The events, newest acknowledgement first.
    pub events: Vec<EventRecord>,
    /// Pass it back for the events after these; `None` on the last page.
    pub next_cursor: Option<String>,
}

/// One event in full, as an operator reads it: [`Inbox::event`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventDetail {
    /// Its listing fields.
    #[serde(flatten)]
    pub record: EventRecord,
    /// The headers the acknowledgement kept, `[name, value]`; a value whose name looks like a
    /// credential (signature, token, authorization, cookie, apikey, password, session, ...)
    /// reads [`REDACTED`], and a URL value is shown without user-info and with its query values
    /// masked.
    pub headers: Vec<(String, String)>,
    /// The body as text (invalid UTF-8 replaced). A JSON body is shown with the string or
    /// number of each field named like a credential (Mailgun's `signature.token` and
    /// `signature.signature`, a `client_secret`, ...) reading [`REDACTED`] and its URLs masked
    /// as the headers' (then re-serialized); other bodies as they came.
    pub body: String,
    /// The body pretty-printed, when it is JSON, masked as `body`.
    pub body_pretty: Option<String>,
    /// Its recorded attempts, oldest first (the first and the newest kept:
    /// [`WorkerBuilder::history`](crate::WorkerBuilder::history)).
    pub history: Vec<tower_idempotency_jobs::Attempt>,
}

/// How [`Inbox::retry_matching`] runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct BulkRetryOptions {
    /// Only count the failed events that match; change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Release the retried events at this many per second (their due times spread from now);
    /// `None`: all due at once.
    #[serde(default)]
    pub per_second: Option<NonZeroU32>,
}

/// What a bulk retry did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BulkRetry {
    /// Whether it was a dry run.
    pub dry_run: bool,
    /// The failed events that matched the filter.
    pub matched: u64,
    /// The events put back to pending (0 on a dry run; fewer than `matched` when some were
    /// retried or discarded meanwhile).
    pub retried: u64,
    /// When the last retried event is due.
    pub last_due_at: Option<String>,
}

/// What a bulk replay did ([`Inbox::replay_matching`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BulkReplay {
    /// Whether it was a dry run.
    pub dry_run: bool,
    /// The processed and skipped events that matched the filter.
    pub matched: u64,
    /// The events put back to pending (0 on a dry run; fewer than `matched` when some changed
    /// meanwhile or were discarded events kept without their body).
    pub replayed: u64,
    /// When the last replayed event is due.
    pub last_due_at: Option<String>,
}

/// How a bulk call puts an event back to pending.
#[derive(Clone, Copy)]
enum Requeue {
    Retry,
    Replay,
}

/// What a bulk call did: the events matched, those changed, the last one's due time.
struct Requeued {
    matched: u64,
    changed: u64,
    last_due_at: Option<String>,
}

/// Events per state of one provider.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProviderCounts {
    /// The provider's name.
    pub provider: String,
    /// Pending events.
    pub pending: u64,
    /// Processed events.
    pub processed: u64,
    /// Failed events.
    pub failed: u64,
    /// Skipped (stale) events.
    pub skipped: u64,
}

/// The filter's fields from text: empty is `None`.
pub(crate) mod filter_fields {
    use std::time::SystemTime;

    use serde::{de::Error, Deserialize, Deserializer};

    use crate::EventState;

    pub fn text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        Ok(text.filter(|text| !text.is_empty()))
    }

    pub fn state<'de, D: Deserializer<'de>>(d: D) -> Result<Option<EventState>, D::Error> {
        match text(d)?.as_deref() {
            None => Ok(None),
            Some("pending") => Ok(Some(EventState::Pending)),
            Some("processed") => Ok(Some(EventState::Processed)),
            Some("failed") => Ok(Some(EventState::Failed)),
            Some("skipped") => Ok(Some(EventState::Skipped)),
            Some(_) => Err(D::Error::custom(
                "the state is pending, processed, failed or skipped",
            )),
        }
    }

    pub fn time<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SystemTime>, D::Error> {
        match text(d)? {
            None => Ok(None),
            Some(text) => super::parse_rfc3339(&text)
                .map(Some)
                .ok_or_else(|| D::Error::custom("not an RFC 3339 time")),
        }
    }
}

/// The event's type: the body's top-level `"type"` string (Stripe, Slack's envelope and most
/// JSON webhooks); `None` for a body without one.
pub(crate) fn event_type(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Typed {
        #[serde(rename = "type")]
        kind: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<Typed>(body).ok()?.kind? {
        serde_json::Value::String(kind) => Some(kind),
        _ => None,
    }
}

fn record(summary: EventSummary, body: &[u8]) -> EventRecord {
    EventRecord {
        event_type: event_type(body),
        provider: summary.provider,
        event_id: summary.event_id,
        state: summary.state,
        attempts: summary.attempts,
        received_at: rfc3339_ms(summary.received_at_ms),
        available_at: rfc3339_ms(summary.available_at_ms),
        finished_at: summary.finished_at_ms.map(rfc3339_ms),
        last_error: summary.last_error,
    }
}

/// A cursor: the last row's position in the scan, as hex of a JSON array (opaque to callers).
fn encode_cursor(received_at: i64, key: &EventKey) -> String {
    cursor::encode(received_at, &backend::job_key(key))
}

fn decode_cursor(text: &str) -> Result<(i64, JobKey), InboxError> {
    cursor::decode(text, 2).ok_or(InboxError::InvalidCursor)
}

impl<DB: InboxDatabase> Inbox<DB> {
    /// Calls `take` with every event matching `filter` after `after`, newest first, reading
    /// `batch` rows a statement, until it answers `false` (then answers `false`) or the events
    /// run out (`true`).
    async fn scan(
        &self,
        filter: &EventFilter,
        after: Option<(i64, JobKey)>,
        batch: i64,
        mut take: impl FnMut(EventSummary, &[u8]) -> bool,
    ) -> Result<bool, InboxError> {
        let mut params = PageFilter {
            state: filter.state.map(EventState::job),
            group: filter.provider.clone(),
            from_ms: filter.received_after.map(unix_ms),
            until_ms: filter.received_before.map(unix_ms),
            after,
        };
        let limit = batch.clamp(1, SCAN_BATCH);
        loop {
            let rows = backend::page(&self.pool, &self.sql, &params, limit).await?;
            let exhausted = rows.len() < usize::try_from(limit).unwrap_or(usize::MAX);
            for (summary, body) in rows {
                let key = EventKey::new(&summary.provider, &summary.event_id);
                params.after = Some((summary.received_at_ms, backend::job_key(&key)));
                let matches = filter
                    .event_type
                    .as_ref()
                    .is_none_or(|kind| event_type(&body).as_ref() == Some(kind));
                if matches && !take(summary, &body) {
                    return Ok(false);
                }
            }
            if exhausted {
                return Ok(true);
            }
        }
    }

    /// Up to `limit` (at most [`MAX_PAGE`]) events matching `filter`, newest acknowledgement
    /// first, after `cursor` (a previous page's [`EventPage::next_cursor`]). Pages follow the
    /// keys, not an offset: events acknowledged meanwhile do not shift them.
    pub async fn events(
        &self,
        filter: &EventFilter,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<EventPage, InboxError> {
        let after = cursor.map(decode_cursor).transpose()?;
        let limit = limit.clamp(1, MAX_PAGE);
        // Without a type to match, one row past the page tells whether another page follows.
        let batch = match filter.event_type {
            None => i64::from(limit) + 1,
            Some(_) => SCAN_BATCH,
        };
        let limit = usize::try_from(limit).unwrap_or(1);
        let mut events = Vec::new();
        let mut last = None;
        let mut more = false;
        self.scan(filter, after, batch, |summary, body| {
            if events.len() == limit {
                more = true;
                return false;
            }
            last = Some((
                summary.received_at_ms,
                EventKey::new(&summary.provider, &summary.event_id),
            ));
            events.push(record(summary, body));
            true
        })
        .await?;
        let next_cursor = match (more, last) {
            (true, Some((at, key))) => Some(encode_cursor(at, &key)),
            _ => None,
        };
        Ok(EventPage {
            events,
            next_cursor,
        })
    }

    /// One event in full (kept headers, body, attempts, last error), when the inbox holds it;
    /// credentials in the headers and a JSON body are masked as [`EventDetail`] says.
    pub async fn event(&self, key: &EventKey) -> Result<Option<EventDetail>, InboxError> {
        let Some((summary, headers, body)) = backend::detail(&self.pool, &self.sql, key).await?
        else {
            return Ok(None);
        };
        let headers: Vec<(String, String)> = serde_json::from_str(&headers).unwrap_or_default();
        let headers = headers
            .into_iter()
            .map(|(name, value)| {
                let value = redact(&name, value);
                (name, value)
            })
            .collect();
        let (shown, body_pretty) = shown_body(&body);
        Ok(Some(EventDetail {
            record: record(summary, &body),
            body: shown,
            headers,
            body_pretty,
            history: self.attempts(key).await?,
        }))
    }

    /// The recorded attempts of the event `key`, oldest first: its first and its newest
    /// ([`WorkerBuilder::history`](crate::WorkerBuilder::history)), each with its start,
    /// duration, outcome and error.
    pub async fn attempts(
        &self,
        key: &EventKey,
    ) -> Result<Vec<tower_idempotency_jobs::Attempt>, InboxError> {
        self.sql.sent();
        let key = crate::backend::job_key(key);
        Ok(DB::attempts(&self.pool, &self.sql.jobs, &key).await?)
    }

    /// Deletes the attempt history of events no longer in the table (purged or discarded), a
    /// batch of `limit` rows per statement; answers how many rows.
    pub(crate) async fn purge_orphan_attempts(&self, limit: u32) -> Result<u64, InboxError> {
        let mut purged = 0;
        loop {
            self.sql.sent();
            let batch = DB::purge_attempts(&self.pool, &self.sql.jobs, i64::from(limit)).await?;
            purged += batch;
            if batch < u64::from(limit) {
                return Ok(purged);
            }
        }
    }

    /// Discards a failed event; answers `false` when the event is not failed. It is deleted,
    /// and a provider's later redelivery of it is stored and processed as a new event; but an
    /// event whose delivery carried an authenticator (GitHub, Shopify, Linear, Mailgun) is kept
    /// until its provider's retry horizon, without its body and headers, as
    /// [`Skipped`](EventState::Skipped) with a last error that says so: its authenticator
    /// still refuses the captured delivery re-sent under a new id (and a redelivery under the
    /// same id is a duplicate), and the retention purges it after the horizon.
    pub async fn discard(&self, key: &EventKey) -> Result<bool, InboxError> {
        Ok(
            <DB as backend::sealed::InboxSql>::discard(&self.pool, &self.sql, key, now_ms())
                .await?,
        )
    }

    /// Puts every failed event matching `filter` (its `state` is ignored: only failed events
    /// are retried) back to pending with a fresh count of attempts. With
    /// [`per_second`](BulkRetryOptions::per_second) their due times are spread from now at that
    /// rate, newest acknowledgement first; a dry run only counts them.
    pub async fn retry_matching(
        &self,
        filter: &EventFilter,
        options: BulkRetryOptions,
    ) -> Result<BulkRetry, InboxError> {
        let filter = EventFilter {
            state: Some(EventState::Failed),
            ..filter.clone()
        };
        let requeued = self
            .requeue_matching(&filter, options, |_| true, Requeue::Retry)
            .await?;
        Ok(BulkRetry {
            dry_run: options.dry_run,
            matched: requeued.matched,
            retried: requeued.changed,
            last_due_at: requeued.last_due_at,
        })
    }

    /// Replays a processed or skipped event: puts it back to pending with a fresh count of
    /// attempts, so the handler runs it again, and records the replay in its attempt history
    /// (outcome [`Replayed`](tower_idempotency_jobs::AttemptOutcome::Replayed)); answers
    /// `false` when the event is not processed or skipped, or is a discarded event kept without
    /// its body. Under [`OrderingPolicy::SkipStale`](crate::OrderingPolicy::SkipStale) a
    /// replayed event older than its object's newest processed one is skipped again.
    pub async fn replay(&self, key: &EventKey) -> Result<bool, InboxError> {
        let replayed = backend::replay(&self.pool, &self.sql, key, now_ms()).await?;
        if replayed {
            self.notify(key.clone());
        }
        Ok(replayed)
    }

    /// Replays every processed and skipped event matching `filter` ([`replay`](Self::replay));
    /// a `state` of `processed` or `skipped` takes only those, another state matches nothing.
    /// With [`per_second`](BulkRetryOptions::per_second) their due times are spread from now at
    /// that rate, newest acknowledgement first; a dry run only counts them.
    pub async fn replay_matching(
        &self,
        filter: &EventFilter,
        options: BulkRetryOptions,
    ) -> Result<BulkReplay, InboxError> {
        let replayable = |state: EventState| match filter.state {
            None => matches!(state, EventState::Processed | EventState::Skipped),
            Some(wanted) => {
                wanted == state && matches!(state, EventState::Processed | EventState::Skipped)
            }
        };
        let requeued = self
            .requeue_matching(filter, options, replayable, Requeue::Replay)
            .await?;
        Ok(BulkReplay {
            dry_run: options.dry_run,
            matched: requeued.matched,
            replayed: requeued.changed,
            last_due_at: requeued.last_due_at,
        })
    }

    /// Scans the events matching `filter` whose state `wanted` takes, then (unless a dry run)
    /// requeues each with `how`, due times spread at the options' rate.
    async fn requeue_matching(
        &self,
        filter: &EventFilter,
        options: BulkRetryOptions,
        wanted: impl Fn(EventState) -> bool,
        how: Requeue,
    ) -> Result<Requeued, InboxError> {
        let mut keys = Vec::new();
        self.scan(filter, None, SCAN_BATCH, |summary, _| {
            if wanted(summary.state) {
                keys.push(EventKey::new(summary.provider, summary.event_id));
            }
            true
        })
        .await?;
        let matched = u64::try_from(keys.len()).unwrap_or(u64::MAX);
        if options.dry_run {
            return Ok(Requeued {
                matched,
                changed: 0,
                last_due_at: None,
            });
        }
        let now = now_ms();
        let mut changed = 0;
        let mut last_due = None;
        for (index, key) in keys.iter().enumerate() {
            let offset = match options.per_second {
                Some(rate) => {
                    let index = u64::try_from(index).unwrap_or(u64::MAX);
                    let ms = index.saturating_mul(1000) / u64::from(rate.get());
                    i64::try_from(ms).unwrap_or(i64::MAX)
                }
                None => 0,
            };
            let due = now.saturating_add(offset);
            let done = match how {
                Requeue::Retry => backend::retry(&self.pool, &self.sql, key, due).await?,
                Requeue::Replay => backend::replay(&self.pool, &self.sql, key, due).await?,
            };
            if done {
                changed += 1;
                last_due = Some(due);
                if offset == 0 {
                    self.notify(key.clone());
                }
            }
        }
        Ok(Requeued {
            matched,
            changed,
            last_due_at: last_due.map(rfc3339_ms),
        })
    }

    /// Logs and stores an operator's change in the inbox's audit table
    /// ([`audit`](tower_idempotency_jobs::audit)).
    pub async fn audit(&self, entry: &AuditEntry) -> Result<(), InboxError> {
        self.sql.sent();
        Ok(tower_idempotency_jobs::audit::record(&self.pool, &self.sql.jobs, entry).await?)
    }

    /// The newest `limit` entries of the inbox's audit, newest first.
    pub async fn audit_log(&self, limit: u32) -> Result<Vec<AuditEntry>, InboxError> {
        self.sql.sent();
        Ok(DB::audit_log(&self.pool, &self.sql.jobs, i64::from(limit)).await?)
    }

    /// Events per state for each provider that has any, by provider name.
    pub async fn counts_by_provider(&self) -> Result<Vec<ProviderCounts>, InboxError> {
        let rows = backend::provider_counts(&self.pool, &self.sql).await?;
        let mut counts: Vec<ProviderCounts> = Vec::new();
        for (provider, state, count) in rows {
            if counts.last().is_none_or(|last| last.provider != provider) {
                counts.push(ProviderCounts {
                    provider,
                    ..ProviderCounts::default()
                });
            }
            let Some(entry) = counts.last_mut() else {
                continue;
            };
            match EventState::from_job(state) {
                EventState::Pending => entry.pending = count,
                EventState::Processed => entry.processed = count,
                EventState::Failed => entry.failed = count,
                EventState::Skipped => entry.skipped = count,
            }
        }
        Ok(counts)
    }

    /// How long the oldest pending event has waited since its acknowledgement (the lag);
    /// `None` when nothing is pending.
    pub async fn oldest_pending_age(&self) -> Result<Option<Duration>, InboxError> {
        let oldest = backend::oldest_pending(&self.pool, &self.sql).await?;
        Ok(oldest.map(|received| {
            Duration::from_millis(u64::try_from(now_ms().saturating_sub(received)).unwrap_or(0))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_a_forged_one_is_refused() {
        let cursor = encode_cursor(42, &EventKey::new("stripe", "evt_\"1"));
        assert_eq!(
            decode_cursor(&cursor).unwrap(),
            (42, backend::job_key(&EventKey::new("stripe", "evt_\"1")))
        );
        assert!(matches!(
            decode_cursor("zz"),
            Err(InboxError::InvalidCursor)
        ));
        assert!(matches!(
            decode_cursor(&hex::encode("[1]")),
            Err(InboxError::InvalidCursor)
        ));
    }
}
