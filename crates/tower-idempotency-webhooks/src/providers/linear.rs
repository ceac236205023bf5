//! [Linear](https://linear.app/developers/webhooks#securing-webhooks): `Linear-Signature: <hex>`,
//! HMAC-SHA256 of the body; keyed by `Linear-Delivery`. The signed body carries
//! `webhookTimestamp` (unix milliseconds, an integer or a float of whole milliseconds, as
//! `@linear/sdk` reads it), checked against the replay window. The signature does not cover
//! `Linear-Delivery`, so the delivery carries its verified MAC as an [`Authenticator`]: the
//! layer refuses it under another delivery id (`401 replayed-signature`).
//!
//! Linear retries a failed delivery three times: after 1 minute, 1 hour and 6 hours; the
//! one-day [`DEFAULT_TTL`] covers it.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::{request::Parts, HeaderName};
use tower_idempotency_core::Authenticator;

use crate::{
    error::VerifyError,
    event_id, headers, json,
    secret::{self, Secret},
    signature::{self, Encoding, HmacAlgorithm},
    timestamp::{self, DEFAULT_TOLERANCE},
    verified::VerifiedWebhook,
    verifier::{Verifier, DEFAULT_WEBHOOK_TTL},
};

/// The provider name and store namespace.
pub const PROVIDER: &str = "linear";
/// The signature header.
pub const SIGNATURE_HEADER: &str = "linear-signature";
/// The delivery id header: the key.
pub const DELIVERY_HEADER: &str = "linear-delivery";

// Parsed once: a name given as text is parsed on every lookup.
static SIGNATURE: HeaderName = HeaderName::from_static(SIGNATURE_HEADER);
static DELIVERY: HeaderName = HeaderName::from_static(DELIVERY_HEADER);
/// One day: longer than Linear's ~7 hours of retries.
pub const DEFAULT_TTL: Duration = DEFAULT_WEBHOOK_TTL;
const TIMESTAMP_FIELD: &str = "webhookTimestamp";

/// Verifies Linear deliveries.
#[derive(Clone, Debug)]
pub struct LinearVerifier {
    secrets: Arc<[Secret]>,
    tolerance: Option<Duration>,
}

impl LinearVerifier {
    /// Accepts deliveries signed with any of `secrets`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes.
    pub fn new<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>) -> Self {
        Self {
            secrets: secret::collect(PROVIDER, secrets),
            tolerance: Some(DEFAULT_TOLERANCE),
        }
    }

    /// The replay window around `webhookTimestamp` (default 300 s; Linear suggests one
    /// minute); zero panics (see `disable_replay_window`).
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

impl Verifier for LinearVerifier {
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
        let value = headers::required(&parts.headers, &SIGNATURE)?;
        let candidates = signature::decode_all(SIGNATURE_HEADER, &[value], Encoding::Hex)?;
        let index =
            signature::match_hmac(HmacAlgorithm::Sha256, &self.secrets, &[body], &candidates)?;
        let [millis] = json::fields(body, ["/webhookTimestamp"])?;
        // `@linear/sdk` compares it as a JavaScript number: `1700000000000.0` is the same.
        let millis = millis.as_ref().and_then(json::Scalar::as_whole).ok_or(
            VerifyError::InvalidTimestamp {
                name: TIMESTAMP_FIELD,
            },
        )?;
        let signed = millis / 1000;
        timestamp::check_window(TIMESTAMP_FIELD, signed, now, self.tolerance)?;
        let id = event_id::header_id(&parts.headers, &DELIVERY)?;
        // The delivery id is not signed: remember the verified MAC.
        let authenticator = Authenticator::digest(PROVIDER, &[candidates[0].as_bytes()]);
        Ok(VerifiedWebhook::new(PROVIDER, id, body.clone())
            .with_signed_at(signed)
            .with_secret_index(index)
            .with_authenticator(authenticator)
            .with_unsigned_event_id())
    }
}

/// The `Linear-Signature` value for `body`.
pub fn sign(secret: impl AsRef<[u8]>, body: &[u8]) -> String {
    hex::encode(signature::hmac(
        HmacAlgorithm::Sha256,
        secret.as_ref(),
        &[body],
    ))
}

/// The fixture the tests and benches sign Linear deliveries with.
#[cfg(feature = "test-support")]
pub(crate) fn fixture() -> crate::testing::HmacFixture {
    use crate::testing::{Delivery, HmacFixture, Outcome, Recapture};

    HmacFixture::new(
        PROVIDER,
        "lin_wh_fixture",
        Some(SIGNATURE_HEADER),
        |secret| Arc::new(LinearVerifier::new([secret])),
        |id, now| {
            let millis = now * 1000;
            format!(r#"{{"action":"create","type":"Issue","data":{{"title":"{id}"}},"webhookTimestamp":{millis}}}"#)
        },
        |secret, signed, sent, _| {
            let headers = vec![
                (SIGNATURE_HEADER, sign(secret, signed.body.as_bytes())),
                (DELIVERY_HEADER, sent.id.clone()),
            ];
            Delivery::new(headers, sent.body.clone())
        },
    )
    .recapture(Recapture::Header(
        DELIVERY_HEADER,
        Outcome::Refused("replayed-signature"),
    ))
}
