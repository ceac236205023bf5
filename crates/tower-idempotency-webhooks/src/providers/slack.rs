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

use std::time::{Duration, SystemTime};

use axum_core::response::Response;
use bytes::Bytes;
use http::request::Parts;

use super::timed_secrets::TimedSecrets;
use crate::{
    error::VerifyError,
    event_id, json,
    schemes::V0Scheme,
    secret::Secret,
    timestamp::replay_window_methods,
    verified::{ChallengeResponse, VerifiedWebhook},
    verifier::{verifier_settings, Verifier, DEFAULT_WEBHOOK_TTL},
};

/// The provider name and store namespace.
pub const PROVIDER: &str = "slack";
/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-slack-signature";
/// The signed timestamp header.
pub const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";
/// One day: Slack's retries end within ten minutes.
pub const DEFAULT_TTL: Duration = DEFAULT_WEBHOOK_TTL;

static SCHEME: V0Scheme = V0Scheme::new(SIGNATURE_HEADER, TIMESTAMP_HEADER);

/// Verifies Slack Events API deliveries.
#[derive(Clone, Debug)]
pub struct SlackVerifier {
    keys: TimedSecrets,
}

impl SlackVerifier {
    /// Accepts deliveries signed with any of the app's signing `secrets`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes.
    pub fn new<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>) -> Self {
        Self {
            keys: TimedSecrets::new(PROVIDER, secrets),
        }
    }

    replay_window_methods! {
        /// The replay window (default 300 s, Slack's recommendation); zero panics (see
        /// `disable_replay_window`).
        self.keys.tolerance
    }
}

impl Verifier for SlackVerifier {
    fn verify(
        &self,
        parts: &Parts,
        body: &Bytes,
        now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError> {
        let (signed, index) = SCHEME.verify(&parts.headers, body, &self.keys, now)?;
        let [kind, challenge, event_id] =
            json::fields_until(body, ["/type", "/challenge", "/event_id"], |f| {
                match f[0].as_ref().and_then(json::Scalar::as_str) {
                    Some("url_verification") => f[1].is_some(),
                    Some(_) => f[2].is_some(),
                    None => false,
                }
            })?;
        let webhook = if kind.as_ref().and_then(json::Scalar::as_str) == Some("url_verification") {
            let challenge = challenge
                .as_ref()
                .and_then(json::Scalar::as_str)
                .ok_or(VerifyError::MalformedBody {
                    reason: "url_verification without a challenge",
                })?
                .to_owned();
            let id = event_id::check_id(format!("url_verification:{challenge}"), "/challenge")?;
            VerifiedWebhook::new(PROVIDER, id, body.clone()).with_challenge(
                ChallengeResponse::json(&serde_json::json!({ "challenge": challenge })),
            )
        } else {
            VerifiedWebhook::new(
                PROVIDER,
                event_id::scalar_id(event_id, "/event_id")?,
                body.clone(),
            )
        };
        Ok(webhook
            .with_signed_at(signed)
            .with_secret_index(index)
            .with_signed_headers([TIMESTAMP_HEADER]))
    }

    verifier_settings!(PROVIDER, DEFAULT_TTL, replay_window: self.keys.tolerance);
}

/// The `X-Slack-Signature` value (`v0=<hex>`) Slack would send for `body` at `timestamp`.
pub fn sign(secret: impl AsRef<[u8]>, timestamp: u64, body: &[u8]) -> String {
    V0Scheme::sign(secret.as_ref(), timestamp, body)
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
    super::challenge_response(webhook, PROVIDER)
}

/// The fixture the tests and benches sign Slack deliveries with.
#[cfg(feature = "test-support")]
pub(crate) fn fixture() -> crate::testing::HmacFixture {
    use std::sync::Arc;

    use crate::testing::HmacFixture;

    HmacFixture::new(
        PROVIDER,
        "slack-fixture-secret",
        Some(SIGNATURE_HEADER),
        |secret| Arc::new(SlackVerifier::new([secret])),
        |id, _| {
            format!(r#"{{"type":"event_callback","event_id":"{id}","event":{{"type":"message"}}}}"#)
        },
        |secret, signed, sent, now| SCHEME.delivery(secret, signed, sent, now),
    )
}
