//! What the outbox's admin routes and its page share: the listing's query, a message's key
//! as a query, and the answer to a database failure.

use std::time::Duration;

use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tower_idempotency_core::{Problem, Rejection};

use crate::{MessageState, OutboxError};

/// A database failure, answered without its details.
pub(crate) struct Unavailable;

impl From<OutboxError> for Unavailable {
    fn from(error: OutboxError) -> Self {
        tracing::warn!(%error, "outbox admin call failed");
        Self
    }
}

impl IntoResponse for Unavailable {
    fn into_response(self) -> Response {
        let retry_after = Duration::from_secs(5);
        Problem::from(Rejection::StoreUnavailable { retry_after }).into_response()
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
    Ok(Some(match name {
        "" => return Ok(None),
        "pending" => MessageState::Pending,
        "delivered" => MessageState::Delivered,
        "failed" => MessageState::Failed,
        "discarded" => MessageState::Discarded,
        _ => return Err(()),
    }))
}

#[derive(Deserialize)]
pub(crate) struct KeyQuery {
    pub(crate) key: String,
}
