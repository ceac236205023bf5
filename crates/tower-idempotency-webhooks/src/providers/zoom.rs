//! [Zoom](https://developers.zoom.us/docs/api/webhooks/#verify-webhook-events):
//! `x-zm-signature: v0=<hex>` = HMAC-SHA256 keyed by the app's secret token over
//! `v0:{x-zm-request-timestamp}:{body}`.
//!
//! Zoom events carry no delivery id, and retries resend the same bytes, so the key is
//! `sha256:<hex>` of the body (a documented choice: two distinct events always differ in
//! `event_ts` and payload). Zoom retries three times (after 5, 30 and 90 minutes) when it gets
//! no 2xx within 3 seconds; the one-day [`DEFAULT_TTL`] covers it.
//!
//! The `endpoint.url_validation` challenge is authenticated like any event; answer it with
//! [`url_validation_response`].

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
    signature::{self, HmacAlgorithm},
    timestamp::replay_window_methods,
    verified::{ChallengeResponse, VerifiedWebhook},
    verifier::{verifier_settings, Verifier, DEFAULT_WEBHOOK_TTL},
};

/// The provider name and store namespace.
pub const PROVIDER: &str = "zoom";
/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-zm-signature";
/// The signed timestamp header.
pub const TIMESTAMP_HEADER: &str = "x-zm-request-timestamp";
/// One day: longer than Zoom's ~2 hours of retries.
pub const DEFAULT_TTL: Duration = DEFAULT_WEBHOOK_TTL;

static SCHEME: V0Scheme = V0Scheme::new(SIGNATURE_HEADER, TIMESTAMP_HEADER);

/// Verifies Zoom deliveries.
#[derive(Clone, Debug)]
pub struct ZoomVerifier {
    keys: TimedSecrets,
}

impl ZoomVerifier {
    /// Accepts deliveries signed with any of the app's secret `tokens`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes.
    pub fn new<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>) -> Self {
        Self {
            keys: TimedSecrets::new(PROVIDER, secrets),
        }
    }

    replay_window_methods! {
        /// The replay window (default 300 s); zero panics (see `disable_replay_window`).
        self.keys.tolerance
    }
}

impl Verifier for ZoomVerifier {
    fn verify(
        &self,
        parts: &Parts,
        body: &Bytes,
        now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError> {
        let (signed, index) = SCHEME.verify(&parts.headers, body, &self.keys, now)?;
        let [event, plain] =
            json::fields_until(body, ["/event", "/payload/plainToken"], |f| {
                match f[0].as_ref().and_then(json::Scalar::as_str) {
                    Some("endpoint.url_validation") => f[1].is_some(),
                    Some(_) => true,
                    None => false,
                }
            })?;
        let mut webhook =
            VerifiedWebhook::new(PROVIDER, event_id::body_digest_id(body), body.clone())
                .with_signed_headers([TIMESTAMP_HEADER]);
        if event.as_ref().and_then(json::Scalar::as_str) == Some("endpoint.url_validation") {
            let plain = plain.as_ref().and_then(json::Scalar::as_str).ok_or(
                VerifyError::MalformedBody {
                    reason: "endpoint.url_validation without payload.plainToken",
                },
            )?;
            // Zoom expects the token signed with the secret it signed the request with.
            let encrypted = hex::encode(signature::hmac(
                HmacAlgorithm::Sha256,
                self.keys.secrets[index].expose(),
                &[plain.as_bytes()],
            ));
            webhook = webhook.with_challenge(ChallengeResponse::json(&serde_json::json!({
                "plainToken": plain,
                "encryptedToken": encrypted,
            })));
        }
        Ok(webhook.with_signed_at(signed).with_secret_index(index))
    }

    verifier_settings!(PROVIDER, DEFAULT_TTL, replay_window: self.keys.tolerance);
}

/// The `x-zm-signature` value (`v0=<hex>`) Zoom would send for `body` at `timestamp`.
pub fn sign(secret: impl AsRef<[u8]>, timestamp: u64, body: &[u8]) -> String {
    V0Scheme::sign(secret.as_ref(), timestamp, body)
}

/// The answer to Zoom's `endpoint.url_validation` (`200 {"plainToken", "encryptedToken"}`), or
/// `None` when `webhook` is an ordinary event.
pub fn url_validation_response(webhook: &VerifiedWebhook) -> Option<Response> {
    super::challenge_response(webhook, PROVIDER)
}

/// The fixture the tests and benches sign Zoom deliveries with.
#[cfg(feature = "test-support")]
pub(crate) fn fixture() -> crate::testing::HmacFixture {
    use std::sync::Arc;

    use crate::testing::HmacFixture;

    HmacFixture::new(
        PROVIDER,
        "zoom-fixture-token",
        Some(SIGNATURE_HEADER),
        |secret| Arc::new(ZoomVerifier::new([secret])),
        |id, _| {
            format!(r#"{{"event":"meeting.started","event_ts":1700000000000,"payload":{{"object":{{"uuid":"{id}"}}}}}}"#)
        },
        |secret, signed, sent, now| SCHEME.delivery(secret, signed, sent, now),
    )
    .key(|_, delivery| event_id::body_digest_id(delivery.body.as_bytes()))
}
