//! [Stripe](https://docs.stripe.com/webhooks#verify-manually): `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>..]`,
//! HMAC-SHA256 keyed by the endpoint secret used verbatim (`whsec_...` included) over
//! `{t}.{body}`; keyed by the event's `id`.
//!
//! Stripe retries failed live-mode deliveries with exponential back-off for up to three days,
//! so [`DEFAULT_TTL`] is four days. During a secret roll Stripe sends one `v1` per active secret;
//! any match is accepted. `v0` (test-mode legacy) and unknown schemes are ignored; a header with
//! only those is [`VerifyError::UnsupportedVersion`].

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{request::Parts, HeaderName};

use super::timed_secrets::TimedSecrets;
use crate::{
    error::VerifyError,
    event_id, json,
    schemes::TimestampedScheme,
    secret::Secret,
    timestamp::replay_window_methods,
    verified::VerifiedWebhook,
    verifier::{verifier_settings, Verifier},
};

/// The provider name and store namespace.
pub const PROVIDER: &str = "stripe";
/// The signature header.
pub const SIGNATURE_HEADER: &str = "stripe-signature";
/// Four days: longer than Stripe's three days of retries.
pub const DEFAULT_TTL: Duration = Duration::from_secs(4 * 24 * 60 * 60);

static SCHEME: TimestampedScheme = TimestampedScheme {
    header: HeaderName::from_static(SIGNATURE_HEADER),
    separator: ',',
    timestamp_key: "t",
    signature_key: "v1",
    joiner: b".",
};

/// Verifies Stripe deliveries.
#[derive(Clone, Debug)]
pub struct StripeVerifier {
    keys: TimedSecrets,
    api_version: Option<String>,
}

impl StripeVerifier {
    /// Accepts deliveries signed with any of `secrets` (the endpoint's `whsec_...` secrets).
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes.
    pub fn new<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>) -> Self {
        Self {
            keys: TimedSecrets::new(PROVIDER, secrets),
            api_version: None,
        }
    }

    replay_window_methods! {
        /// The replay window around the signed `t` (default 300 s, Stripe's own); zero panics (see
        /// `disable_replay_window`).
        self.keys.tolerance
    }

    /// Rejects correctly signed events rendered for another API version (the body's
    /// `api_version`) with [`VerifyError::ApiVersionMismatch`], so a version drift between the
    /// endpoint's settings and the code shows up as such instead of as parse errors.
    pub fn expected_api_version(mut self, version: impl Into<String>) -> Self {
        self.api_version = Some(version.into());
        self
    }
}

impl Verifier for StripeVerifier {
    fn verify(
        &self,
        parts: &Parts,
        body: &Bytes,
        now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError> {
        let (signed, index) = SCHEME.verify(&parts.headers, body, &self.keys, now)?;
        let pinned = self.api_version.is_some();
        let [id, api_version] = json::fields_until(body, ["/id", "/api_version"], |f| {
            f[0].is_some() && (!pinned || f[1].is_some())
        })?;
        let id = event_id::scalar_id(id, "/id")?;
        if let Some(expected) = &self.api_version {
            let received = api_version
                .as_ref()
                .and_then(json::Scalar::as_str)
                .unwrap_or_default();
            if received != expected {
                return Err(VerifyError::ApiVersionMismatch {
                    expected: expected.clone(),
                    received: received.to_owned(),
                });
            }
        }
        Ok(VerifiedWebhook::new(PROVIDER, id, body.clone())
            .with_signed_at(signed)
            .with_secret_index(index))
    }

    verifier_settings!(PROVIDER, DEFAULT_TTL, replay_window: self.keys.tolerance);
}

/// The `Stripe-Signature` value Stripe would send for `body` at `timestamp` (unix seconds).
///
/// ```
/// let header = tower_idempotency_webhooks::stripe::sign("whsec_test", 1_700_000_000, b"{}");
/// assert!(header.starts_with("t=1700000000,v1="));
/// ```
pub fn sign(secret: impl AsRef<[u8]>, timestamp: u64, body: &[u8]) -> String {
    SCHEME.sign(secret.as_ref(), timestamp, body)
}

/// The fixture the tests and benches sign Stripe deliveries with.
#[cfg(feature = "test-support")]
pub(crate) fn fixture() -> crate::testing::HmacFixture {
    use std::sync::Arc;

    use crate::testing::HmacFixture;

    HmacFixture::new(
        PROVIDER,
        "whsec_fixture_stripe",
        Some(SIGNATURE_HEADER),
        |secret| Arc::new(StripeVerifier::new([secret])),
        |id, _| format!(r#"{{"id":"{id}","type":"invoice.paid","data":{{"amount":4200}}}}"#),
        |secret, signed, sent, now| SCHEME.delivery(secret, signed, sent, now),
    )
}
