//! What the layer did with a request, recorded in the tracing span and in the response
//! extensions so applications can log or count it.

use std::fmt;

/// What the layer did with a request. Read it from the response extensions:
///
/// ```
/// # let response = http::Response::new(());
/// use tower_idempotency_core::Outcome;
/// if let Some(Outcome::Replayed) = response.extensions().get::<Outcome>() {
///     // count a replay
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Not guarded: the method is not filtered, or the key is optional and absent.
    PassedThrough,
    /// The handler ran and its response completed the key.
    Executed,
    /// The handler ran and the cache policy released the key (a retry runs it again).
    ExecutedReleased,
    /// The handler ran, but storing its result failed; the key stays in flight until its lease
    /// expires.
    ExecutedUnrecorded,
    /// A cached response was replayed.
    Replayed,
    /// Another request holds the key: `409` (or the configured status).
    InFlight,
    /// The key was reused with a different request: `422`.
    Mismatch,
    /// The request was refused before the store was asked (bad key, body, signature).
    Rejected,
    /// The request's signature was already used under another key: `401`, the handler did not
    /// run (see [`Authenticator`](crate::Authenticator)).
    ReplayedSignature,
    /// The store failed or timed out: `503`, the handler did not run.
    StoreUnavailable,
    /// The in-flight bound was reached or the layer is shutting down: `503`.
    Overloaded,
    /// The handler panicked or failed; the key was released.
    HandlerFailed,
    /// The store failed and the layer was explicitly configured to fail open: the handler ran
    /// unguarded.
    FailedOpen,
    /// Transactional mode: the handler ran, but its transaction was rolled back (the lease was
    /// lost, or the completion or the commit failed); none of its writes landed.
    RolledBack,
    /// Transactional mode: the connection failed during the commit; whether the handler's
    /// writes and the completion landed is unknown until the key is read again.
    CommitUnknown,
}

impl Outcome {
    /// A short lowercase name for logs and metrics labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::PassedThrough => "passed_through",
            Self::Executed => "executed",
            Self::ExecutedReleased => "executed_released",
            Self::ExecutedUnrecorded => "executed_unrecorded",
            Self::Replayed => "replayed",
            Self::InFlight => "in_flight",
            Self::Mismatch => "mismatch",
            Self::Rejected => "rejected",
            Self::ReplayedSignature => "replayed_signature",
            Self::StoreUnavailable => "store_unavailable",
            Self::Overloaded => "overloaded",
            Self::HandlerFailed => "handler_failed",
            Self::FailedOpen => "failed_open",
            Self::RolledBack => "rolled_back",
            Self::CommitUnknown => "commit_unknown",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
