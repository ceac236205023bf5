//! [Paddle Billing](https://developer.paddle.com/webhooks/signature-verification):
//! `Paddle-Signature: ts=<unix>;h1=<hex>[;h1=<hex>..]`, HMAC-SHA256 keyed by the notification
//! destination's secret over `{ts}:{body}`; keyed by the body's `event_id`.
//!
//! Paddle retries failed live deliveries 60 times over 3 days (sandbox: 3 times in 15 minutes),
//! so [`DEFAULT_TTL`] is four days. Paddle's SDKs use a 5 s window; this verifier defaults to the
//! crate-wide 300 s: tighten it with [`PaddleVerifier::tolerance`].

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
pub const PROVIDER: &str = "paddle";
/// The signature header.
pub const SIGNATURE_HEADER: &str = "paddle-signature";
/// Four days: longer than Paddle's three days of retries.
pub const DEFAULT_TTL: Duration = Duration::from_secs(4 * 24 * 60 * 60);

static SCHEME: TimestampedScheme = TimestampedScheme {
    header: HeaderName::from_static(SIGNATURE_HEADER),
    separator: ';',
    timestamp_key: "ts",
    signature_key: "h1",
    joiner: b":",
};

/// Verifies Paddle Billing deliveries.
#[derive(Clone, Debug)]
pub struct PaddleVerifier {
    keys: TimedSecrets,
}

impl PaddleVerifier {
    /// Accepts deliveries signed with any of the destination's `secrets`.
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

impl Verifier for PaddleVerifier {
    fn verify(
        &self,
        parts: &Parts,
        body: &Bytes,
        now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError> {
        let (signed, index) = SCHEME.verify(&parts.headers, body, &self.keys, now)?;
        let [id] = json::fields(body, ["/event_id"])?;
        let id = event_id::scalar_id(id, "/event_id")?;
        Ok(VerifiedWebhook::new(PROVIDER, id, body.clone())
            .with_signed_at(signed)
            .with_secret_index(index))
    }

    verifier_settings!(PROVIDER, DEFAULT_TTL, replay_window: self.keys.tolerance);
}

/// The `Paddle-Signature` value for `body` at `timestamp`.
pub fn sign(secret: impl AsRef<[u8]>, timestamp: u64, body: &[u8]) -> String {
    SCHEME.sign(secret.as_ref(), timestamp, body)
}

/// The fixture the tests and benches sign Paddle deliveries with.
#[cfg(feature = "test-support")]
pub(crate) fn fixture() -> crate::testing::HmacFixture {
    use std::sync::Arc;

    use crate::testing::HmacFixture;

    HmacFixture::new(
        PROVIDER,
        "pdl_ntfset_fixture",
        Some(SIGNATURE_HEADER),
        |secret| Arc::new(PaddleVerifier::new([secret])),
        |id, _| {
            format!(
                r#"{{"event_id":"{id}","event_type":"transaction.completed","data":{{"id":"txn_1"}}}}"#
            )
        },
        |secret, signed, sent, now| SCHEME.delivery(secret, signed, sent, now),
    )
}
