//! Why a delivery was refused, and how each cause is answered.

use std::borrow::Cow;

use http::StatusCode;
use tower_idempotency_core::Problem;

/// Why a webhook delivery failed verification.
///
/// Every variant converts into a [`Problem`] with its own slug (the `type` is
/// `urn:tower-idempotency:problem:<slug>`) and status:
///
/// | variant | slug | status |
/// |---|---|---|
/// | [`MissingHeader`](Self::MissingHeader) | `webhook-missing-header` | 400 |
/// | [`MalformedHeader`](Self::MalformedHeader) | `webhook-malformed-header` | 400 |
/// | [`DuplicateHeader`](Self::DuplicateHeader) | `webhook-duplicate-header` | 400 |
/// | [`HeaderTooLarge`](Self::HeaderTooLarge) | `webhook-header-too-large` | 400 |
/// | [`InvalidTimestamp`](Self::InvalidTimestamp) | `webhook-invalid-timestamp` | 400 |
/// | [`BodyNotJson`](Self::BodyNotJson) | `webhook-body-not-json` | 400 |
/// | [`MalformedBody`](Self::MalformedBody) | `webhook-malformed-body` | 400 |
/// | [`MissingEventId`](Self::MissingEventId) | `webhook-missing-event-id` | 400 |
/// | [`InvalidEventId`](Self::InvalidEventId) | `webhook-invalid-event-id` | 400 |
/// | [`ApiVersionMismatch`](Self::ApiVersionMismatch) | `webhook-api-version-mismatch` | 400 |
/// | [`UnsupportedVersion`](Self::UnsupportedVersion) | `webhook-unsupported-version` | 401 |
/// | [`SignatureMismatch`](Self::SignatureMismatch) | `webhook-signature-mismatch` | 401 |
/// | [`TimestampOutsideTolerance`](Self::TimestampOutsideTolerance) | `webhook-timestamp-outside-tolerance` | 401 |
/// | [`MethodNotAllowed`](Self::MethodNotAllowed) | `webhook-method-not-allowed` | 405 |
/// | [`MissingConfiguration`](Self::MissingConfiguration) | `webhook-missing-configuration` | 500 |
///
/// The rule: a request that is *structurally* broken is `400`; a well-formed request whose
/// credentials do not authenticate it (wrong secret, tampered body, replayed outside the window,
/// only signature schemes this verifier cannot check) is `401`; a method the provider never sends
/// is `405`. A verifier configured without any
/// secret is a server bug, not the sender's fault, hence `500`. Every status is non-2xx, so the
/// provider retries; none of them caches anything, because verification runs before the store.
///
/// Messages (and so problem details) name headers and limits only: never a secret, an expected
/// or received signature, or body content.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// A required header is absent.
    #[error("missing header `{name}`")]
    MissingHeader {
        /// The header.
        name: &'static str,
    },
    /// A header does not follow the provider's format.
    #[error("malformed header `{name}`: {reason}")]
    MalformedHeader {
        /// The header.
        name: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A header that must appear once appears several times.
    #[error("header `{name}` appears more than once")]
    DuplicateHeader {
        /// The header.
        name: &'static str,
    },
    /// A header exceeds the length this crate parses.
    #[error("header `{name}` is longer than {limit} bytes")]
    HeaderTooLarge {
        /// The header.
        name: &'static str,
        /// The limit in bytes.
        limit: usize,
    },
    /// Only signatures of schemes this verifier does not check are present.
    #[error("header `{name}` carries no signature of a supported version")]
    UnsupportedVersion {
        /// The header.
        name: &'static str,
    },
    /// No signature matches any configured secret: wrong secret or tampered body.
    #[error("signature does not match")]
    SignatureMismatch,
    /// The signed timestamp is further from the clock than the tolerance (a replay or a badly
    /// skewed clock).
    #[error(
        "signed timestamp is {skew_secs} s away from the clock, tolerance is {tolerance_secs} s"
    )]
    TimestampOutsideTolerance {
        /// Signed time minus now, in seconds (negative: in the past).
        skew_secs: i64,
        /// The tolerance in seconds.
        tolerance_secs: u64,
    },
    /// The timestamp is not a decimal number of seconds (or overflows).
    #[error("timestamp in `{name}` is not a valid unix time")]
    InvalidTimestamp {
        /// The header or body field that holds it.
        name: &'static str,
    },
    /// The event id (or another signed field) must be read from a JSON body that is not JSON.
    #[error("body is not valid JSON")]
    BodyNotJson,
    /// The body is JSON (or a form) but lacks a structure the provider guarantees.
    #[error("malformed body: {reason}")]
    MalformedBody {
        /// What is missing.
        reason: &'static str,
    },
    /// The delivery is authentic but carries no event id where the provider puts it.
    #[error("no event id in {location}")]
    MissingEventId {
        /// Where it was looked for (a header or a JSON pointer).
        location: &'static str,
    },
    /// The event id is longer than 255 bytes or contains control characters.
    #[error("event id in {location} is longer than 255 bytes or contains control characters")]
    InvalidEventId {
        /// Where it was read from.
        location: &'static str,
    },
    /// Stripe: the event is correctly signed but rendered for another API version than the one
    /// this endpoint is configured for. A configuration error on one side, not an attack.
    #[error("event was rendered for another API version than the expected `{expected}`")]
    ApiVersionMismatch {
        /// The configured version.
        expected: String,
        /// The version in the event, kept for logs; not part of the message.
        received: String,
    },
    /// The request's method is one the provider never sends deliveries with.
    #[error("the webhook provider does not send requests with this method")]
    MethodNotAllowed,
    /// The verifier has no secret or key to check with.
    #[error("webhook verifier has no {what} configured")]
    MissingConfiguration {
        /// What is missing (e.g. "secret").
        what: &'static str,
    },
}

impl VerifyError {
    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::UnsupportedVersion { .. }
            | Self::SignatureMismatch
            | Self::TimestampOutsideTolerance { .. } => StatusCode::UNAUTHORIZED,
            Self::MissingConfiguration { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// The problem slug (the suffix of the problem `type`).
    pub fn slug(&self) -> &'static str {
        self.slug_and_title().0
    }

    /// The problem's slug and title.
    fn slug_and_title(&self) -> (&'static str, &'static str) {
        match self {
            Self::MissingHeader { .. } => ("webhook-missing-header", "Webhook header missing"),
            Self::MalformedHeader { .. } => {
                ("webhook-malformed-header", "Webhook header malformed")
            }
            Self::DuplicateHeader { .. } => ("webhook-duplicate-header", "Webhook header repeated"),
            Self::HeaderTooLarge { .. } => ("webhook-header-too-large", "Webhook header too large"),
            Self::UnsupportedVersion { .. } => (
                "webhook-unsupported-version",
                "Unsupported webhook signature version",
            ),
            Self::SignatureMismatch => ("webhook-signature-mismatch", "Webhook signature mismatch"),
            Self::TimestampOutsideTolerance { .. } => (
                "webhook-timestamp-outside-tolerance",
                "Webhook timestamp outside tolerance",
            ),
            Self::InvalidTimestamp { .. } => {
                ("webhook-invalid-timestamp", "Invalid webhook timestamp")
            }
            Self::BodyNotJson => ("webhook-body-not-json", "Webhook body is not JSON"),
            Self::MalformedBody { .. } => ("webhook-malformed-body", "Webhook body malformed"),
            Self::MissingEventId { .. } => ("webhook-missing-event-id", "Webhook event id missing"),
            Self::InvalidEventId { .. } => ("webhook-invalid-event-id", "Webhook event id invalid"),
            Self::ApiVersionMismatch { .. } => (
                "webhook-api-version-mismatch",
                "Webhook API version mismatch",
            ),
            Self::MissingConfiguration { .. } => (
                "webhook-missing-configuration",
                "Webhook verifier not configured",
            ),
            Self::MethodNotAllowed => ("webhook-method-not-allowed", "Webhook method not allowed"),
        }
    }
}

impl From<VerifyError> for Problem {
    fn from(error: VerifyError) -> Self {
        Problem {
            status: error.status(),
            slug: error.slug(),
            title: error.slug_and_title().1,
            detail: Cow::Owned(error.to_string()),
            retry_after: None,
        }
    }
}

impl axum_core::response::IntoResponse for VerifyError {
    fn into_response(self) -> axum_core::response::Response {
        Problem::from(self).into_response()
    }
}

/// Why a verifier could not be built from its configuration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A secret is not in the provider's format (e.g. `whsec_` + base64).
    #[error("invalid secret: {reason}")]
    InvalidSecret {
        /// What is wrong (never the secret itself).
        reason: &'static str,
    },
    /// A shared secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN)
    /// bytes: anyone could sign with an empty one, and guess a short one.
    #[error("a secret is empty or shorter than {min_len} bytes")]
    WeakSecret {
        /// The shortest accepted length in bytes.
        min_len: usize,
    },
    /// A public key is not in the provider's format.
    #[error("invalid public key: {reason}")]
    InvalidPublicKey {
        /// What is wrong.
        reason: &'static str,
    },
    /// A URL the verifier needs is not an absolute `http(s)` URL.
    #[error("invalid URL: {reason}")]
    InvalidUrl {
        /// What is wrong.
        reason: &'static str,
    },
    /// A configured header name is not a valid HTTP header name.
    #[error("invalid header name `{name}`")]
    InvalidHeaderName {
        /// The name as configured.
        name: &'static str,
    },
    /// The generic verifier's signed parts would let a forger reuse a signature: they leave
    /// out the body or the header the key comes from, or put two variable parts side by side.
    #[error("signed parts refused: {reason}")]
    InvalidSignedParts {
        /// Why.
        reason: &'static str,
    },
    /// A builder was finished without a required setting.
    #[error("missing setting: {what}")]
    Missing {
        /// The setting.
        what: &'static str,
    },
}
