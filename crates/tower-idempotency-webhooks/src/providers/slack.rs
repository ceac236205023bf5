//! [Slack](https://api.slack.com/authentication/verifying-requests-from-slack):
//! `X-Slack-Signature: v0=<hex>` = HMAC-SHA256 of `v0:{X-Slack-Request-Timestamp}:{body}`;
//! keyed by the Events API body's `event_id`.
//!
//! Slack retries an Events API delivery three times (almost immediately, after 1 minute, after
//! 5 minutes), so the one-day [`DEFAULT_TTL`] is ample. Slash commands and interactivity
//! payloads are form-encoded and carry no event id: use this verifier for the Events API
//! endpoint only.
//!
//! The `url_verification` handshake is authenticated like any delivery and keyed by its
//! challenge; answer it with [`url_verification_response`].

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use axum_core::response::Response;
use bytes::Bytes;
use http::{request::Parts, HeaderName};

use crate::{
    error::VerifyError,
    providers::github::prefixed,
    secret::{self, Secret},
    util::{self, Encoding, HmacAlgorithm, DEFAULT_TOLERANCE},
    verified::{ChallengeResponse, VerifiedWebhook},
    verifier::{Verifier, DEFAULT_WEBHOOK_TTL},
};

/// The provider name and store namespace.
pub const PROVIDER: &str = "slack";
/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-slack-signature";
/// The signed timestamp header.
pub const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";
/// One day: Slack's retries end within ten minutes.
pub const DEFAULT_TTL: Duration = DEFAULT_WEBHOOK_TTL;

static SCHEME: V0Scheme = V0Scheme {
    signature_header: HeaderName::from_static(SIGNATURE_HEADER),
    timestamp_header: HeaderName::from_static(TIMESTAMP_HEADER),
};

/// Verifies Slack Events API deliveries.
#[derive(Clone, Debug)]
pub struct SlackVerifier {
    secrets: Arc<[Secret]>,
    tolerance: Option<Duration>,
}

impl SlackVerifier {
    /// Accepts deliveries signed with any of the app's signing `secrets`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes.
    pub fn new<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>) -> Self {
        Self {
            secrets: secret::collect(PROVIDER, secrets),
            tolerance: Some(DEFAULT_TOLERANCE),
        }
    }

    /// The replay window (default 300 s, Slack's recommendation); zero panics (see `disable_replay_window`).
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = util::tolerance(tolerance);
        self
    }

    /// Turns the replay window off: a captured delivery then verifies at any time, and only
    /// the idempotency record (for its TTL) keeps it from running twice.
    pub fn disable_replay_window(mut self) -> Self {
        self.tolerance = None;
        self
    }
}

impl Verifier for SlackVerifier {
    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn default_ttl(&self) -> Duration {
        DEFAULT_TTL
    }

    fn replay_window(&self) -> Option<Duration> {
        self.tolerance
    }

    fn verify(
        &self,
        parts: &Parts,
        body: &Bytes,
        now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError> {
        let (signed, index) = SCHEME.verify(parts, body, &self.secrets, now, self.tolerance)?;
        let [kind, challenge, event_id] =
            util::json_fields_until(body, ["/type", "/challenge", "/event_id"], |f| {
                match f[0].as_ref().and_then(util::Scalar::as_str) {
                    Some("url_verification") => f[1].is_some(),
                    Some(_) => f[2].is_some(),
                    None => false,
                }
            })?;
        let webhook = if kind.as_ref().and_then(util::Scalar::as_str) == Some("url_verification") {
            let challenge = challenge
                .as_ref()
                .and_then(util::Scalar::as_str)
                .ok_or(VerifyError::MalformedBody {
                    reason: "url_verification without a challenge",
                })?
                .to_owned();
            let id = util::check_id(format!("url_verification:{challenge}"), "/challenge")?;
            VerifiedWebhook::new(PROVIDER, id, body.clone()).with_challenge(
                ChallengeResponse::json(&serde_json::json!({ "challenge": challenge })),
            )
        } else {
            VerifiedWebhook::new(
                PROVIDER,
                util::scalar_id(event_id, "/event_id")?,
                body.clone(),
            )
        };
        Ok(webhook
            .with_signed_at(signed)
            .with_secret_index(index)
            .with_signed_headers([TIMESTAMP_HEADER]))
    }
}

/// The `v0` scheme shared by Slack and Zoom: `v0=<hex>` in one header, the signed unix time in
/// another, HMAC-SHA256 over `v0:{timestamp}:{body}`.
pub(crate) struct V0Scheme {
    /// The signature header.
    pub(crate) signature_header: HeaderName,
    /// The signed timestamp header.
    pub(crate) timestamp_header: HeaderName,
}

impl V0Scheme {
    /// Verifies the headers against `body`, replay window included: returns the signed time and
    /// the matching secret.
    pub(crate) fn verify(
        &'static self,
        parts: &Parts,
        body: &[u8],
        secrets: &[Secret],
        now: SystemTime,
        tolerance: Option<Duration>,
    ) -> Result<(u64, usize), VerifyError> {
        let timestamp = util::required(&parts.headers, &self.timestamp_header)?;
        let value = util::required(&parts.headers, &self.signature_header)?;
        let (signature_header, timestamp_header) = (
            self.signature_header.as_str(),
            self.timestamp_header.as_str(),
        );
        let signature = prefixed(signature_header, value, "v0=")?;
        let signed = util::parse_unix(timestamp_header, timestamp)?;
        let candidates = util::decode_all(signature_header, &[signature], Encoding::Hex)?;
        let index = util::match_hmac(
            HmacAlgorithm::Sha256,
            secrets,
            &[b"v0:", timestamp.as_bytes(), b":", body],
            &candidates,
        )?;
        util::check_window(timestamp_header, signed, now, tolerance)?;
        Ok((signed, index))
    }
}

/// The `v0=<hex>` signature for `body` at `timestamp` (Slack and Zoom).
pub fn sign(secret: impl AsRef<[u8]>, timestamp: u64, body: &[u8]) -> String {
    let ts = timestamp.to_string();
    let mac = util::hmac(
        HmacAlgorithm::Sha256,
        secret.as_ref(),
        &[b"v0:", ts.as_bytes(), b":", body],
    );
    format!("v0={}", hex::encode(mac))
}

/// The answer to Slack's `url_verification` handshake (`200 {"challenge": ...}`), or `None`
/// when `webhook` is an ordinary event.
///
/// ```
/// use axum::response::{IntoResponse, Response};
/// use tower_idempotency_webhooks::{slack, VerifiedWebhook};
///
/// async fn events(webhook: VerifiedWebhook) -> Response {
///     if let Some(answer) = slack::url_verification_response(&webhook) {
///         return answer;
///     }
///     // ... handle webhook.json() ...
///     "ok".into_response()
/// }
/// # let _ = events;
/// ```
pub fn url_verification_response(webhook: &VerifiedWebhook) -> Option<Response> {
    (webhook.provider() == PROVIDER)
        .then(|| webhook.challenge())
        .flatten()
        .map(ChallengeResponse::to_response)
}
