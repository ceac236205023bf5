//! The inbox's records: the event a handler receives, and the summaries operators list.

use std::time::SystemTime;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tower_idempotency_jobs::{JobCounts, JobState};

/// Names one event: the provider that sent it and the provider's event id. The inbox's primary
/// key, so a provider's retry of an event is the same row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct EventKey {
    /// The verifier's provider name (`stripe`, `github`, ...).
    pub provider: String,
    /// The provider's event id.
    pub event_id: String,
}

impl EventKey {
    /// The key of `event_id` from `provider`.
    pub fn new(provider: impl Into<String>, event_id: impl Into<String>) -> Self {
        Self {
            provider: provider.into(),
            event_id: event_id.into(),
        }
    }
}

/// Where an event is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventState {
    /// Waiting for its first or next attempt, or being processed under a lease.
    Pending,
    /// The handler succeeded; its writes and this state committed together.
    Processed,
    /// Every attempt failed; kept with its last error until retried or purged.
    Failed,
    /// Older than the newest processed event of its ordering key under
    /// [`OrderingPolicy::SkipStale`](crate::OrderingPolicy::SkipStale): never handed to the
    /// handler. Its last error says which event made it stale. Also a failed event an operator
    /// discarded while its authenticator must still refuse replays
    /// ([`Inbox::discard`](crate::Inbox::discard)).
    Skipped,
}

impl EventState {
    /// Every state.
    pub const ALL: [Self; 4] = [Self::Pending, Self::Processed, Self::Failed, Self::Skipped];

    /// The job engine's state of an event in this state.
    pub(crate) fn job(self) -> JobState {
        match self {
            Self::Pending => JobState::Pending,
            Self::Processed => JobState::Done,
            Self::Failed => JobState::Failed,
            Self::Skipped => JobState::Discarded,
        }
    }

    pub(crate) fn from_job(state: JobState) -> Self {
        match state {
            JobState::Pending => Self::Pending,
            JobState::Done => Self::Processed,
            JobState::Failed => Self::Failed,
            JobState::Discarded => Self::Skipped,
        }
    }

    pub(crate) fn from_code(code: i16) -> Self {
        Self::from_job(JobState::from_code(code))
    }

    /// The lowercase name (`pending`, `processed`, `failed`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Processed => "processed",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
        }
    }
}

/// A verified delivery as the worker hands it to the handler.
#[derive(Clone, Debug)]
pub struct InboxEvent {
    /// Which event this is.
    pub key: EventKey,
    /// The request headers the acknowledgement kept ([`Ack::keep_header`](crate::Ack::keep_header)),
    /// lowercase names, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The exact body the signature was verified over.
    pub body: Bytes,
    /// When the delivery was acknowledged.
    pub received_at: SystemTime,
    /// This attempt's number, from 1.
    pub attempt: u32,
}

impl InboxEvent {
    /// The first kept header named `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON. Of an object key repeated in the body, the first is kept, as
    /// the verifier that keyed the delivery read it and as `VerifiedWebhook::json` does
    /// ([`parse_json`](tower_idempotency_webhooks::parse_json)), so `json()["id"]` is the id the
    /// event is keyed by. (serde_json's own `Value` keeps the last; [`deserialize`](Self::deserialize)
    /// into a struct refuses repeated fields.)
    pub fn json(&self) -> Result<serde_json::Value, serde_json::Error> {
        tower_idempotency_webhooks::parse_json(&self.body)
    }

    /// The body deserialized into the caller's own event type (async-stripe's `Event`, a struct
    /// of the fields the handler reads), from the exact bytes that were verified.
    pub fn deserialize<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }
}

/// One event as operators see it: everything but the body and headers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventSummary {
    /// The provider's name.
    pub provider: String,
    /// The provider's event id.
    pub event_id: String,
    /// Its state.
    pub state: EventState,
    /// Attempts started so far (a crash during one counts too).
    pub attempts: u32,
    /// When it was acknowledged, unix milliseconds.
    pub received_at_ms: i64,
    /// Pending: not attempted before this time, unix milliseconds.
    pub available_at_ms: i64,
    /// When it was processed or failed, unix milliseconds.
    pub finished_at_ms: Option<i64>,
    /// The last attempt's error (bounded, see [`MAX_ERROR_LEN`](crate::MAX_ERROR_LEN)).
    pub last_error: Option<String>,
}

/// How many events are in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StateCounts {
    /// [`EventState::Pending`].
    pub pending: u64,
    /// [`EventState::Processed`].
    pub processed: u64,
    /// [`EventState::Failed`].
    pub failed: u64,
    /// [`EventState::Skipped`].
    pub skipped: u64,
}

impl From<JobCounts> for StateCounts {
    fn from(counts: JobCounts) -> Self {
        Self {
            pending: counts.pending,
            processed: counts.done,
            failed: counts.failed,
            skipped: counts.discarded,
        }
    }
}

pub(crate) use tower_idempotency_jobs::time::{duration_ms, from_unix_ms, now_ms, unix_ms};

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Paid {
        id: String,
        #[serde(rename = "type")]
        type_: String,
        data: Data,
    }

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Data {
        object: Object,
    }

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Object {
        id: String,
        amount: i64,
    }

    fn event(body: &'static str) -> InboxEvent {
        InboxEvent {
            key: EventKey::new("stripe", "evt_1"),
            headers: Vec::new(),
            body: Bytes::from_static(body.as_bytes()),
            received_at: SystemTime::UNIX_EPOCH,
            attempt: 1,
        }
    }

    #[test]
    fn an_event_deserializes_into_the_callers_type() {
        let paid = event(
            r#"{"id":"evt_1","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1","amount":5}}}"#,
        );
        let expected = Paid {
            id: "evt_1".to_owned(),
            type_: "payment_intent.succeeded".to_owned(),
            data: Data {
                object: Object {
                    id: "pi_1".to_owned(),
                    amount: 5,
                },
            },
        };
        assert_eq!(paid.deserialize::<Paid>().unwrap(), expected);
        let repeated = event(
            r#"{"id":"evt_1","id":"evt_2","type":"t","data":{"object":{"id":"pi_1","amount":5}}}"#,
        );
        assert!(
            repeated.deserialize::<Paid>().is_err(),
            "a repeated field is refused"
        );
    }

    /// The document keeps the first of repeated keys, as the verifier that keyed the delivery
    /// read it and as `VerifiedWebhook::json` does, so `json()["id"]` is the id it was keyed by.
    #[test]
    fn json_keeps_the_first_of_repeated_keys() {
        let repeated = event(r#"{"id":"a","id":"b"}"#);
        assert_eq!(repeated.json().unwrap()["id"], "a");
        assert!(event("a=1").json().is_err(), "not JSON");
    }
}
