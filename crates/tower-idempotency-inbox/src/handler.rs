//! The user's event handler.

use std::future::Future;

use tower_idempotency_sqlx::IdempotentTx;

use futures_util::future::BoxFuture;

use crate::{event::InboxEvent, InboxDatabase};

/// What a handler's failure is: any error. Its `Display` text (with its sources) is kept as the
/// event's last error, cut to [`MAX_ERROR_LEN`] bytes; write errors that name no secret.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

use tower_idempotency_jobs::bounded;
/// The longest last error kept per event, in bytes (the job engine's bound).
pub use tower_idempotency_jobs::MAX_ERROR_LEN;

/// Processes one event. Its database writes go through the [`IdempotentTx`] it is given; the
/// worker commits them together with the event's `processed` state after it returns `Ok`, and
/// rolls them back when it returns `Err` or panics.
///
/// Implemented for every `Fn(InboxEvent, IdempotentTx<DB>) -> impl Future<Output = Result<(), E>>`
/// whose error converts into [`HandlerError`]. Drop the transaction before returning; a handler
/// that keeps it (in a spawned task) fails the attempt.
pub trait InboxHandler<DB: InboxDatabase>: Send + Sync + 'static {
    /// Handles `event` inside `tx`.
    fn handle(
        &self,
        event: InboxEvent,
        tx: IdempotentTx<DB>,
    ) -> BoxFuture<'static, Result<(), HandlerError>>;
}

impl<DB, F, Fut, E> InboxHandler<DB> for F
where
    DB: InboxDatabase,
    F: Fn(InboxEvent, IdempotentTx<DB>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<HandlerError>,
{
    fn handle(
        &self,
        event: InboxEvent,
        tx: IdempotentTx<DB>,
    ) -> BoxFuture<'static, Result<(), HandlerError>> {
        let future = self(event, tx);
        Box::pin(async move { future.await.map_err(Into::into) })
    }
}

/// A failure not worth retrying (a malformed event, an unknown account): the event is failed
/// at once, with this error's text as its last error. Return it through [`permanent`].
#[derive(Debug)]
pub struct Permanent(HandlerError);

impl Permanent {
    /// The error it wraps.
    pub fn into_inner(self) -> HandlerError {
        self.0
    }
}

impl std::fmt::Display for Permanent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Permanent {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// A handler error that says "do not retry": `return Err(permanent("unknown account"))`. The
/// event is failed at once with `error`'s text, whatever attempts remain.
pub fn permanent(error: impl Into<HandlerError>) -> HandlerError {
    Box::new(Permanent(error.into()))
}

/// The error text kept for an event: the error and its sources, at most [`MAX_ERROR_LEN`] bytes.
pub(crate) fn error_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    bounded(text)
}

/// A panic's message when it is text, else a fixed description.
pub(crate) fn panic_text(message: Option<String>) -> String {
    let message = message.unwrap_or_else(|| "a non-text payload".to_owned());
    bounded(format!("the handler panicked: {message}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_cut_at_a_char_boundary() {
        let long = "é".repeat(MAX_ERROR_LEN);
        let cut = bounded(long);
        assert!(cut.len() <= MAX_ERROR_LEN && cut.len() >= MAX_ERROR_LEN - 1);
        assert!(cut.chars().all(|c| c == 'é'));
        let outer = OuterError(std::io::Error::other("inner"));
        assert_eq!(error_text(&outer), "outer: inner");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct OuterError(#[source] std::io::Error);

    #[test]
    fn panic_payloads() {
        assert_eq!(
            panic_text(Some("boom".into())),
            "the handler panicked: boom"
        );
        assert_eq!(panic_text(None), "the handler panicked: a non-text payload");
    }
}
