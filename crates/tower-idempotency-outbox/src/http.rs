//! What the outbox's admin routes and its page share: the listing's query, a message's key
//! as a query, and the answer to a database failure.

use serde::Deserialize;
pub(crate) use tower_idempotency_jobs::Unavailable;

use crate::{MessageState, OutboxError};

/// A database failure, logged and answered as the inbox's are.
impl From<OutboxError> for Unavailable {
    fn from(error: OutboxError) -> Self {
        tracing::warn!(%error, "outbox admin call failed");
        Self
    }
}

/// The listing's query: a state name (empty or absent: any), the cursor and the limit.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Listing {
    pub(crate) state: Option<String>,
    pub(crate) cursor: Option<String>,
    pub(crate) limit: Option<u32>,
}

/// A state's name as a filter: `Ok(None)` is any state, `Err` a name that is none.
pub(crate) fn state_filter(name: &str) -> Result<Option<MessageState>, ()> {
    if name.is_empty() {
        return Ok(None);
    }
    MessageState::named(name).map(Some).ok_or(())
}

#[derive(Deserialize)]
pub(crate) struct KeyQuery {
    pub(crate) key: String,
}
