//! [`Unavailable`]: how the admin routes and the page answer a database failure (the outbox
//! crate's answer too; not a stable API).

use std::time::Duration;

use axum::response::{IntoResponse, Response};
use tower_idempotency_core::{Problem, Rejection};

use crate::InboxError;

/// A database failure, answered without its details.
pub struct Unavailable;

impl From<InboxError> for Unavailable {
    fn from(error: InboxError) -> Self {
        tracing::warn!(%error, "inbox admin call failed");
        Self
    }
}

impl IntoResponse for Unavailable {
    fn into_response(self) -> Response {
        let retry_after = Duration::from_secs(5);
        Problem::from(Rejection::StoreUnavailable { retry_after }).into_response()
    }
}
