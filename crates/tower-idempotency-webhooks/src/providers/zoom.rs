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

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use axum_core::response::Response;
use bytes::Bytes;
use http::{request::Parts, HeaderName};

use crate::{
    error::VerifyError,
    event_id, json,
    schemes::V0Scheme,
    secret::{self, Secret},
    signature::{self, HmacAlgorithm},
    timestamp::{self, DEFAULT_TOLERANCE},
    verified::{ChallengeResponse, VerifiedWebhook},
    verifier::{Verifier, DEFAULT_WEBHOOK_TTL},
};

/// The provider name and store namespace.
pub const PROVIDER: &str = "zoom";
/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-zm-signature";
/// The signed timestamp header.
pub const TIMESTAMP_HEADER: &str = "x-zm-request-timestamp";
/// One day: longer than Zoom's ~2 hours of retries.
pub const DEFAULT_TTL: Duration = DEFAULT_WEBHOOK_TTL;

static SCHEME: V0Scheme = V0Scheme {
    signature_header: HeaderName::from_static(SIGNATURE_HEADER),
    timestamp_header: HeaderName::from_static(TIMESTAMP_HEADER),
};

/// Verifies Zoom deliveries.
#[derive(Clone, Debug)]
pub struct ZoomVerifier {
    secrets: Arc<[Secret]>,
    tolerance: Option<Duration>,
}

impl ZoomVerifier {
    /// Accepts deliveries signed with any of the app's secret `tokens`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes.
    pub fn new<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>) -> Self {
        Self {
            secrets: secret::collect(PROVIDER, secrets),
            tolerance: Some(DEFAULT_TOLERANCE),
        }
    }

    /// The replay window (default 300 s); zero panics (see `disable_replay_window`).
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = timestamp::tolerance(tolerance);
        self
    }

    /// Turns the replay window off: a captured delivery then verifies at any time, and only
    /// the idempotency record (for its TTL) keeps it from running twice.
    pub fn disable_replay_window(mut self) -> Self {
        self.tolerance = None;
        self
    }
}

impl Verifier for ZoomVerifier {
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
        let (signed, index) =
            SCHEME.verify(&parts.headers, body, &self.secrets, now, self.tolerance)?;
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
                self.secrets[index].expose(),
                &[plain.as_bytes()],
            ));
            webhook = webhook.with_challenge(ChallengeResponse::json(&serde_json::json!({
                "plainToken": plain,
                "encryptedToken": encrypted,
            })));
        }
        Ok(webhook.with_signed_at(signed).with_secret_index(index))
    }
}

/// The `x-zm-signature` value (`v0=<hex>`) Zoom would send for `body` at `timestamp`.
pub fn sign(secret: impl AsRef<[u8]>, timestamp: u64, body: &[u8]) -> String {
    V0Scheme::sign(secret.as_ref(), timestamp, body)
}

/// The answer to Zoom's `endpoint.url_validation` (`200 {"plainToken", "encryptedToken"}`), or
/// `None` when `webhook` is an ordinary event.
pub fn url_validation_response(webhook: &VerifiedWebhook) -> Option<Response> {
    (webhook.provider() == PROVIDER)
        .then(|| webhook.challenge())
        .flatten()
        .map(ChallengeResponse::to_response)
}

/// The fixture the tests and benches sign Zoom deliveries with.
#[cfg(feature = "test-support")]
pub(crate) fn fixture() -> crate::testing::HmacFixture {
    use crate::testing::{Delivery, HmacFixture};

    HmacFixture::new(
        PROVIDER,
        "zoom-fixture-token",
        Some(SIGNATURE_HEADER),
        |secret| Arc::new(ZoomVerifier::new([secret])),
        |id, _| {
            format!(r#"{{"event":"meeting.started","event_ts":1700000000000,"payload":{{"object":{{"uuid":"{id}"}}}}}}"#)
        },
        |secret, signed, sent, now| {
            let headers = vec![
                (SIGNATURE_HEADER, sign(secret, now, signed.body.as_bytes())),
                (TIMESTAMP_HEADER, now.to_string()),
            ];
            Delivery::new(headers, sent.body.clone())
        },
    )
    .key(|_, delivery| event_id::body_digest_id(delivery.body.as_bytes()))
}
