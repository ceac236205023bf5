//! An operator's calls on an [`Inbox`]: list events by filters with a cursor, show one event,
//! discard a failed one, retry failed events in bulk (with a dry run and a release rate), and
//! the counts per provider and the lag the operator's page shows.

use std::{
    num::NonZeroU32,
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};

use crate::{
    event::{from_unix_ms, now_ms, unix_ms},
    ops_sql::{OpsDatabase, ScanParams},
    EventKey, EventState, EventSummary, Inbox, InboxDatabase, InboxError,
};

/// The most events one page of [`Inbox::events`] holds.
pub const MAX_PAGE: u32 = 500;

/// Rows read per statement while a listing or a bulk retry scans.
const SCAN_BATCH: i64 = 500;

/// Header and body field names whose values [`Inbox::event`] never shows: a name containing one
/// of these (ASCII case-insensitive) is redacted.
const SECRET_NAME_PARTS: [&str; 14] = [
    "authorization",
    "cookie",
    "signature",
    "secret",
    "token",
    "hmac",
    "api-key",
    "api_key",
    "apikey",
    "auth-key",
    "password",
    "passwd",
    "session",
    "credential",
];

/// What a redacted header's value reads.
pub const REDACTED: &str = "[redacted]";

/// What a masked query value or fragment of a shown URL reads.
pub const MASKED: &str = "***";

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

/// Formats `time` as RFC 3339 in UTC with milliseconds (`2026-01-02T03:04:05.678Z`).
pub fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

fn rfc3339_ms(ms: i64) -> String {
    rfc3339(from_unix_ms(ms))
}

/// Parses an RFC 3339 time (`2026-01-02T03:04:05Z`, fractions and offsets `Z` only).
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(text.trim_end_matches(['Z', 'z'])).ok()
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
            Some(_) => Err(D::Error::custom(
                "the state is pending, processed or failed",
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
    let json = serde_json::json!([received_at, key.provider, key.event_id]);
    hex::encode(json.to_string())
}

fn decode_cursor(cursor: &str) -> Result<(i64, String, String), InboxError> {
    let bytes = hex::decode(cursor).map_err(|_| InboxError::InvalidCursor)?;
    serde_json::from_slice(&bytes).map_err(|_| InboxError::InvalidCursor)
}

/// Whether a header or body field `name` looks like a credential's: it contains (ASCII
/// case-insensitive) `authorization`, `cookie`, `signature`, `secret`, `token`, `hmac`,
/// `api-key`, `api_key`, `apikey`, `auth-key`, `password`, `passwd`, `session` or `credential`.
pub fn is_secret_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    SECRET_NAME_PARTS.iter().any(|part| lower.contains(part))
}

/// `value`, or [`REDACTED`] when the header `name` looks like a credential's
/// ([`is_secret_name`]); an `http(s)` URL value as [`redact_url`] shows it. The rule of
/// [`Inbox::event`], which the outbox's page shares.
#[doc(hidden)]
pub fn redact(name: &str, value: String) -> String {
    if is_secret_name(name) {
        REDACTED.to_owned()
    } else {
        redact_url_text(value)
    }
}

/// A URL as an operator is shown it: without user-info, each query value and the fragment
/// [`MASKED`] (names stay), parsed by the `url` crate. Text that is not an absolute URL reads
/// [`REDACTED`]: it cannot be told apart from a credential.
///
/// ```
/// use tower_idempotency_inbox::page::redact_url;
///
/// assert_eq!(
///     redact_url("https://user:pass@api.example.com/hook?token=abc&mode=live#sig"),
///     "https://api.example.com/hook?token=***&mode=***#***"
/// );
/// assert_eq!(redact_url("https://api.example.com/hook"), "https://api.example.com/hook");
/// ```
pub fn redact_url(text: &str) -> String {
    match url::Url::parse(text) {
        Ok(url) => masked_url(url),
        Err(_) => REDACTED.to_owned(),
    }
}

fn masked_url(mut url: url::Url) -> String {
    if url.cannot_be_a_base() {
        // `mailto:`, `data:`, ...: nothing of a host, user-info or path to keep apart.
        return REDACTED.to_owned();
    }
    // Both succeed on a URL that can be a base.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    if url.query().is_some() {
        let pairs: Vec<(String, &str)> = url
            .query_pairs()
            .map(|(name, value)| {
                let value = if value.is_empty() { "" } else { MASKED };
                (name.into_owned(), value)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    if url.fragment().is_some_and(|fragment| !fragment.is_empty()) {
        url.set_fragment(Some(MASKED));
    }
    url.to_string()
}

/// `text` as [`redact_url`] shows it when it is an `http(s)` URL carrying user-info, a query or
/// a fragment; else unchanged.
fn redact_url_text(text: String) -> String {
    let lower = text.get(..8).unwrap_or(&text).to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return text;
    }
    match url::Url::parse(text.trim()) {
        Ok(url)
            if !url.username().is_empty()
                || url.password().is_some()
                || url.query().is_some()
                || url.fragment().is_some() =>
        {
            masked_url(url)
        }
        Ok(_) => text,
        Err(_) => REDACTED.to_owned(),
    }
}

/// Masks a JSON value for an operator: the string or number of a field whose name looks like a
/// credential's ([`is_secret_name`]) reads [`REDACTED`] (an object or array under such a name
/// is masked field by field: Mailgun's `signature` object keeps its `timestamp`), and a URL
/// string reads as [`redact_url`] shows it. Answers whether anything changed.
fn redact_json(value: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::Object(fields) => {
            let mut changed = false;
            for (name, field) in fields.iter_mut() {
                match field {
                    Value::String(_) | Value::Number(_) if is_secret_name(name) => {
                        *field = Value::String(REDACTED.to_owned());
                        changed = true;
                    }
                    _ => changed |= redact_json(field),
                }
            }
            changed
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |changed, item| redact_json(item) | changed),
        Value::String(text) => {
            let shown = redact_url_text(text.clone());
            let changed = shown != *text;
            *text = shown;
            changed
        }
        _ => false,
    }
}

/// A body as an operator is shown it: as text, and pretty-printed when it is JSON, with
/// credential fields and URLs masked as [`Inbox::event`] says (the outbox's page shares it). A
/// JSON body that needed masking is shown re-serialized.
#[doc(hidden)]
pub fn shown_body(body: &[u8]) -> (String, Option<String>) {
    let Ok(mut json) = serde_json::from_slice::<serde_json::Value>(body) else {
        return (String::from_utf8_lossy(body).into_owned(), None);
    };
    let changed = redact_json(&mut json);
    let pretty = serde_json::to_string_pretty(&json).ok();
    let text = if changed {
        json.to_string()
    } else {
        String::from_utf8_lossy(body).into_owned()
    };
    (text, pretty)
}

impl<DB: InboxDatabase> Inbox<DB> {
    /// Calls `take` with every event matching `filter` after `after`, newest first, reading
    /// `batch` rows a statement, until it answers `false` (then answers `false`) or the events
    /// run out (`true`).
    async fn scan(
        &self,
        filter: &EventFilter,
        after: Option<(i64, String, String)>,
        batch: i64,
        mut take: impl FnMut(EventSummary, &[u8]) -> bool,
    ) -> Result<bool, InboxError> {
        let mut params = ScanParams {
            state: filter.state.map(EventState::code),
            provider: filter.provider.clone(),
            from: filter.received_after.map(unix_ms),
            until: filter.received_before.map(unix_ms),
            after,
            limit: batch.clamp(1, SCAN_BATCH),
        };
        loop {
            let rows = <DB as OpsDatabase>::scan(&self.pool, self.table(), &params).await?;
            let exhausted = rows.len() < usize::try_from(params.limit).unwrap_or(usize::MAX);
            for row in rows {
                let position = (
                    row.summary.received_at_ms,
                    row.summary.provider.clone(),
                    row.summary.event_id.clone(),
                );
                params.after = Some(position);
                let matches = filter
                    .event_type
                    .as_ref()
                    .is_none_or(|kind| event_type(&row.body).as_ref() == Some(kind));
                if matches && !take(row.summary, &row.body) {
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
        let Some(row) = <DB as OpsDatabase>::detail(&self.pool, self.table(), key).await? else {
            return Ok(None);
        };
        let headers: Vec<(String, String)> = serde_json::from_str(&row.headers).unwrap_or_default();
        let headers = headers
            .into_iter()
            .map(|(name, value)| {
                let value = redact(&name, value);
                (name, value)
            })
            .collect();
        let (body, body_pretty) = shown_body(&row.body);
        Ok(Some(EventDetail {
            body,
            record: record(row.summary, &row.body),
            headers,
            body_pretty,
        }))
    }

    /// Discards a failed event; answers `false` when the event is not failed. It is deleted,
    /// and a provider's later redelivery of it is stored and processed as a new event; but an
    /// event whose delivery carried an authenticator (GitHub, Shopify, Linear, Mailgun) is kept
    /// until its provider's retry horizon, without its body and headers, as
    /// [`Skipped`](EventState::Skipped) with a last error that says so: its authenticator
    /// still refuses the captured delivery re-sent under a new id (and a redelivery under the
    /// same id is a duplicate), and the retention purges it after the horizon.
    pub async fn discard(&self, key: &EventKey) -> Result<bool, InboxError> {
        Ok(<DB as OpsDatabase>::discard(&self.pool, self.table(), key, now_ms()).await?)
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
        let mut keys = Vec::new();
        self.scan(&filter, None, SCAN_BATCH, |summary, _| {
            keys.push(EventKey::new(summary.provider, summary.event_id));
            true
        })
        .await?;
        let matched = u64::try_from(keys.len()).unwrap_or(u64::MAX);
        if options.dry_run {
            return Ok(BulkRetry {
                dry_run: true,
                matched,
                retried: 0,
                last_due_at: None,
            });
        }
        let now = now_ms();
        let mut retried = 0;
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
            if DB::retry(&self.pool, &self.sql, key, due).await? {
                retried += 1;
                last_due = Some(due);
                if offset == 0 {
                    self.notify(key.clone());
                }
            }
        }
        Ok(BulkRetry {
            dry_run: false,
            matched,
            retried,
            last_due_at: last_due.map(rfc3339_ms),
        })
    }

    /// Events per state for each provider that has any, by provider name.
    pub async fn counts_by_provider(&self) -> Result<Vec<ProviderCounts>, InboxError> {
        let rows = <DB as OpsDatabase>::provider_counts(&self.pool, self.table()).await?;
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
            let count = u64::try_from(count).unwrap_or(0);
            match EventState::from_code(state) {
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
        let oldest = <DB as OpsDatabase>::oldest_pending(&self.pool, self.table()).await?;
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
            (42, "stripe".to_owned(), "evt_\"1".to_owned())
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

    #[test]
    fn credential_headers_are_redacted() {
        assert_eq!(redact("Stripe-Signature", "t=1,v1=ab".into()), REDACTED);
        assert_eq!(redact("x-api-key", "k".into()), REDACTED);
        assert_eq!(
            redact("content-type", "application/json".into()),
            "application/json"
        );
    }

    #[test]
    fn credential_names_are_redacted_whatever_their_case() {
        for name in [
            "apikey",
            "X-ApiKey",
            "api_key",
            "x-api-key",
            "Password",
            "x-session-id",
            "X-Auth-Key",
            "cookie",
            "Set-Cookie",
            "Proxy-Authorization",
            "x-amz-security-token",
            "X-Shopify-Hmac-Sha256",
            "client_secret",
            "X-Hub-Signature-256",
            "x-client-credential",
        ] {
            assert_eq!(redact(name, "v".into()), REDACTED, "{name}");
        }
        for name in [
            "content-type",
            "x-github-event",
            "user-agent",
            "x-request-id",
        ] {
            assert_eq!(redact(name, "v".into()), "v", "{name}");
        }
    }

    #[test]
    fn urls_lose_their_user_info_and_query_values() {
        assert_eq!(
            redact_url("https://user:pa%20ss@api.example.com:8443/hook?token=a%26b&flag&x=1#frag"),
            "https://api.example.com:8443/hook?token=***&flag=&x=***#***"
        );
        assert_eq!(redact_url("http://token@h.example/p"), "http://h.example/p");
        assert_eq!(redact_url("https://h.example/p/q"), "https://h.example/p/q");
        // Not an absolute URL, or nothing but an opaque payload: nothing of it is shown.
        for text in [
            "not a url",
            "/relative?token=x",
            "mailto:someone@example.com",
        ] {
            assert_eq!(redact_url(text), REDACTED, "{text}");
        }
        // A header value that is a URL is shown as one; other values stay whole.
        assert_eq!(
            redact("referer", "https://u:p@h.example/?code=1".into()),
            "https://h.example/?code=***"
        );
        assert_eq!(
            redact("referer", "https://h.example/a".into()),
            "https://h.example/a"
        );
        assert_eq!(redact("x-note", "see https:".into()), "see https:");
    }

    #[test]
    fn mailgun_signature_fields_and_body_urls_are_masked() {
        let body = serde_json::json!({
            "signature": {"timestamp": "1700000000", "token": "tok", "signature": "ab12"},
            "event-data": {
                "id": "e1",
                "client_secret": 42,
                "tokens": ["kept: an array under a credential name is masked field by field"],
                "links": [{"href": "https://u:p@h.example/x?k=v"}, "https://h.example/plain"],
            },
        });
        let (text, pretty) = shown_body(body.to_string().as_bytes());
        let shown: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            shown,
            serde_json::json!({
                "signature": {"timestamp": "1700000000", "token": REDACTED, "signature": REDACTED},
                "event-data": {
                    "id": "e1",
                    "client_secret": REDACTED,
                    "tokens": ["kept: an array under a credential name is masked field by field"],
                    "links": [{"href": "https://h.example/x?k=***"}, "https://h.example/plain"],
                },
            })
        );
        assert_eq!(pretty, serde_json::to_string_pretty(&shown).ok());
        // A body with nothing to mask is shown as it came; one that is not JSON as text.
        let plain = br#"{"b": 1,  "a": "x"}"#;
        assert_eq!(shown_body(plain).0, r#"{"b": 1,  "a": "x"}"#);
        assert_eq!(shown_body(b"token=abc"), ("token=abc".to_owned(), None));
    }

    #[test]
    fn times_are_rfc3339_both_ways() {
        let time = from_unix_ms(1_700_000_000_123);
        assert_eq!(rfc3339(time), "2023-11-14T22:13:20.123Z");
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20.123Z"), Some(time));
        assert_eq!(parse_rfc3339("yesterday"), None);
    }
}
