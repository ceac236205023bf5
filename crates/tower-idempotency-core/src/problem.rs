//! RFC 9457 problem details for every request the layer answers itself.

use std::{borrow::Cow, time::Duration};

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use crate::{fingerprint::FingerprintError, key_header::KeyError};

/// Media type of every rejection body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Prefix of every problem `type` this crate emits; the suffix names the cause.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:tower-idempotency:problem:";

/// An RFC 9457 problem: the status, a stable `type` URI per cause, a short title and a detail.
///
/// Details never contain secrets, signatures, raw keys or body content. Error enums of this crate
/// and of the provider crates convert into a `Problem`, which renders as `application/problem+json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// HTTP status.
    pub status: StatusCode,
    /// The cause's slug; the `type` member is [`PROBLEM_TYPE_PREFIX`] followed by it.
    pub slug: &'static str,
    /// Short human-readable summary of the cause, the same for every occurrence.
    pub title: &'static str,
    /// Explanation of this occurrence (no secrets, no key, no body content).
    pub detail: Cow<'static, str>,
    /// Sent as `Retry-After` (whole seconds, at least 1) when set.
    pub retry_after: Option<Duration>,
}

impl Problem {
    /// The full `type` URI.
    pub fn type_uri(&self) -> String {
        format!("{PROBLEM_TYPE_PREFIX}{}", self.slug)
    }

    /// Renders the problem as a response with a `application/problem+json` body.
    pub fn into_response<B: From<Bytes>>(self) -> Response<B> {
        let body = serde_json::json!({
            "type": self.type_uri(),
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        let mut response = Response::new(B::from(Bytes::from(body.to_string())));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(after) = self.retry_after {
            headers.insert(header::RETRY_AFTER, retry_after_value(after));
        }
        response
    }
}

pub(crate) fn retry_after_value(after: Duration) -> HeaderValue {
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    HeaderValue::from(secs.max(1))
}

/// Why the layer answered a request itself instead of running (or replaying) the handler.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// The route requires an `Idempotency-Key` and none was sent. `400`.
    #[error("missing Idempotency-Key header")]
    MissingKey,
    /// The `Idempotency-Key` header is malformed. `400`.
    #[error("invalid Idempotency-Key header: {0}")]
    InvalidKey(KeyError),
    /// The body exceeds the configured cap. `413`.
    #[error("request body exceeds {limit} bytes")]
    PayloadTooLarge {
        /// The cap in bytes.
        limit: usize,
    },
    /// The body could not be read (the client aborted or sent a malformed chunked body). `400`.
    #[error("request body could not be read")]
    BodyUnreadable,
    /// The key was used before with a different request. `422`.
    #[error("idempotency key reused with a different request")]
    KeyReused,
    /// The first request with this key has not finished. `409` by default.
    #[error("a request with this idempotency key is still being processed")]
    InFlight {
        /// The configured status (409, or e.g. 429).
        status: StatusCode,
        /// Suggested wait before retrying.
        retry_after: Duration,
    },
    /// The store failed or timed out; the handler did not run. `503`.
    #[error("idempotency store unavailable")]
    StoreUnavailable {
        /// Suggested wait before retrying.
        retry_after: Duration,
    },
    /// Too many guarded handlers are running, or the layer is shutting down. `503`.
    #[error("server busy")]
    Overloaded {
        /// Suggested wait before retrying.
        retry_after: Duration,
    },
    /// The handler panicked or its response body failed; the key was released. `500`.
    #[error("the handler failed")]
    HandlerFailed,
    /// The layer requires a principal (tenant) to scope keys and the request has none: the
    /// application's auth layer did not run before this one. A configuration problem. `500`.
    #[error("no principal to scope the idempotency key; the server is misconfigured")]
    PrincipalMissing,
    /// A JSON fingerprint mode is configured and the body is not JSON. `400`.
    #[error("request body is not valid JSON")]
    BodyNotJson,
    /// The request's [`Authenticator`](crate::Authenticator) (e.g. a webhook signature) was
    /// already used under a different idempotency key: a captured request re-sent under a new
    /// key. The handler did not run. `401`.
    #[error("this request's signature was already used with a different idempotency key")]
    ReplayedSignature,
    /// Transactional mode: the lease was lost before the handler's transaction committed
    /// (another request holds or completed the key), so the transaction was rolled back and none
    /// of the handler's writes landed. `409`; a retry gets the other holder's result.
    #[error("the lease on this idempotency key was lost; the handler's writes were rolled back")]
    LeaseLost {
        /// Suggested wait before retrying.
        retry_after: Duration,
    },
    /// Transactional mode: the handler's transaction could not be committed; none of its writes
    /// landed and the key was released. `503`; a retry runs the handler again.
    #[error("the handler's transaction could not be committed; nothing was written")]
    CommitFailed {
        /// Suggested wait before retrying.
        retry_after: Duration,
    },
    /// Transactional mode: the connection failed while the handler's transaction was
    /// committing, so whether it committed is unknown. `503`; a retry is safe either way: it
    /// replays the result if the commit landed and runs the handler if it did not.
    #[error("the outcome of the handler's commit is unknown; retry to learn it")]
    CommitOutcomeUnknown {
        /// Suggested wait before retrying.
        retry_after: Duration,
    },
}

impl From<Rejection> for Problem {
    fn from(rejection: Rejection) -> Self {
        let detail: Cow<'static, str> = Cow::Owned(rejection.to_string());
        let (status, slug, title, retry_after) = match rejection {
            Rejection::MissingKey => (
                StatusCode::BAD_REQUEST,
                "missing-key",
                "Idempotency-Key required",
                None,
            ),
            Rejection::InvalidKey(_) => (
                StatusCode::BAD_REQUEST,
                "invalid-key",
                "Invalid Idempotency-Key",
                None,
            ),
            Rejection::PayloadTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload-too-large",
                "Request body too large",
                None,
            ),
            Rejection::BodyUnreadable => (
                StatusCode::BAD_REQUEST,
                "body-unreadable",
                "Request body could not be read",
                None,
            ),
            Rejection::KeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "key-reused",
                "Idempotency-Key reused with a different request",
                None,
            ),
            Rejection::InFlight {
                status,
                retry_after,
            } => (
                status,
                "in-flight",
                "Request with this Idempotency-Key in progress",
                Some(retry_after),
            ),
            Rejection::StoreUnavailable { retry_after } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Idempotency store unavailable",
                Some(retry_after),
            ),
            Rejection::Overloaded { retry_after } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "Server busy",
                Some(retry_after),
            ),
            Rejection::HandlerFailed => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "handler-failed",
                "Handler failed",
                None,
            ),
            Rejection::PrincipalMissing => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "principal-missing",
                "Principal required but missing",
                None,
            ),
            Rejection::BodyNotJson => (
                StatusCode::BAD_REQUEST,
                "body-not-json",
                "Request body is not JSON",
                None,
            ),
            Rejection::ReplayedSignature => (
                StatusCode::UNAUTHORIZED,
                "replayed-signature",
                "Signature already used for another request",
                None,
            ),
            Rejection::LeaseLost { retry_after } => (
                StatusCode::CONFLICT,
                "lease-lost",
                "Idempotency lease lost; writes rolled back",
                Some(retry_after),
            ),
            Rejection::CommitFailed { retry_after } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "commit-failed",
                "Transaction not committed",
                Some(retry_after),
            ),
            Rejection::CommitOutcomeUnknown { retry_after } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "commit-outcome-unknown",
                "Transaction outcome unknown",
                Some(retry_after),
            ),
        };
        Problem {
            status,
            slug,
            title,
            detail,
            retry_after,
        }
    }
}

impl From<FingerprintError> for Rejection {
    fn from(error: FingerprintError) -> Self {
        match error {
            FingerprintError::NotJson => Rejection::BodyNotJson,
        }
    }
}

impl axum_core::response::IntoResponse for Problem {
    fn into_response(self) -> axum_core::response::Response {
        Problem::into_response(self)
    }
}

impl axum_core::response::IntoResponse for Rejection {
    fn into_response(self) -> axum_core::response::Response {
        Problem::from(self).into_response()
    }
}
