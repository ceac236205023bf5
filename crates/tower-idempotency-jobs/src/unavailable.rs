//! [`Unavailable`]: how the operator's routes and pages answer a database failure.

use std::time::Duration;

use axum::response::{IntoResponse, Response};
use tower_idempotency_core::{Problem, Rejection};

/// A database failure, answered as a `503` problem without its details (the caller logs them
/// when it converts its error: the inbox's and the outbox's errors convert into this).
#[derive(Debug)]
pub struct Unavailable;

impl IntoResponse for Unavailable {
    fn into_response(self) -> Response {
        let retry_after = Duration::from_secs(5);
        Problem::from(Rejection::StoreUnavailable { retry_after }).into_response()
    }
}
