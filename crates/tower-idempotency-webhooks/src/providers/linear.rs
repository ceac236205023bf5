//! [Linear](https://linear.app/developers/webhooks#securing-webhooks): `Linear-Signature: <hex>`,
//! HMAC-SHA256 of the body; keyed by `Linear-Delivery`. The signed body carries
//! `webhookTimestamp` (unix milliseconds, an integer or a float of whole milliseconds, as
//! `@linear/sdk` reads it), checked against the replay window. The signature does not cover
//! `Linear-Delivery`, so the delivery carries its verified MAC as an [`Authenticator`]: the
//! layer refuses it under another delivery id (`401 replayed-signature`).
//!
//! Linear retries a failed delivery three times: after 1 minute, 1 hour and 6 hours; the
//! one-day [`DEFAULT_TTL`] covers it.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{request::Parts, HeaderName};
use tower_idempotency_core::Authenticator;

use super::timed_secrets::TimedSecrets;
use crate::{
    error::VerifyError,
    event_id, headers, json,
    secret::Secret,
    signature::{self, Encoding, HmacAlgorithm},
    timestamp::replay_window_methods,
    verified::VerifiedWebhook,
    verifier::{verifier_settings, Verifier, DEFAULT_WEBHOOK_TTL},
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
    keys: TimedSecrets,
}

impl LinearVerifier {
    /// Accepts deliveries signed with any of `secrets`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes.
    pub fn new<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>) -> Self {
        Self {
            keys: TimedSecrets::new(PROVIDER, secrets),
        }
    }

    replay_window_methods! {
        /// The replay window around `webhookTimestamp` (default 300 s; Linear suggests one
        /// minute); zero panics (see `disable_replay_window`).
        self.keys.tolerance
    }
}

impl Verifier for LinearVerifier {
    fn verify(
        &self,
        parts: &Parts,
        body: &Bytes,
        now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError> {
        let value = headers::required(&parts.headers, &SIGNATURE)?;
        let candidates = signature::decode_all(SIGNATURE_HEADER, &[value], Encoding::Hex)?;
        let index = self.keys.matching(&[body], &candidates)?;
        let [millis] = json::fields(body, ["/webhookTimestamp"])?;
        // `@linear/sdk` compares it as a JavaScript number: `1700000000000.0` is the same.
        let millis = millis.as_ref().and_then(json::Scalar::as_whole).ok_or(
            VerifyError::InvalidTimestamp {
                name: TIMESTAMP_FIELD,
            },
        )?;
        let signed = millis / 1000;
        self.keys.tolerance.check(TIMESTAMP_FIELD, signed, now)?;
        let id = event_id::header_id(&parts.headers, &DELIVERY)?;
        // The delivery id is not signed: remember the verified MAC.
        let authenticator = Authenticator::digest(PROVIDER, &[candidates[0].as_bytes()]);
        Ok(VerifiedWebhook::new(PROVIDER, id, body.clone())
            .with_signed_at(signed)
            .with_secret_index(index)
            .with_authenticator(authenticator)
            .with_unsigned_event_id())
    }

    verifier_settings!(PROVIDER, DEFAULT_TTL, replay_window: self.keys.tolerance);
}

/// The `Linear-Signature` value for `body`.
pub fn sign(secret: impl AsRef<[u8]>, body: &[u8]) -> String {
    let mac = signature::hmac(HmacAlgorithm::Sha256, secret.as_ref(), &[body]);
    hex::encode(mac)
}

/// The fixture the tests and benches sign Linear deliveries with.
#[cfg(feature = "test-support")]
pub(crate) fn fixture() -> crate::testing::HmacFixture {
    use std::sync::Arc;

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
