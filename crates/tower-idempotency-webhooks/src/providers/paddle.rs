//! [Paddle Billing](https://developer.paddle.com/webhooks/signature-verification):
//! `Paddle-Signature: ts=<unix>;h1=<hex>[;h1=<hex>..]`, HMAC-SHA256 keyed by the notification
//! destination's secret over `{ts}:{body}`; keyed by the body's `event_id`.
//!
//! Paddle retries failed live deliveries 60 times over 3 days (sandbox: 3 times in 15 minutes),
//! so [`DEFAULT_TTL`] is four days. Paddle's SDKs use a 5 s window; this verifier defaults to the
//! crate-wide 300 s: tighten it with [`PaddleVerifier::tolerance`].

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::{request::Parts, HeaderName};

use crate::{
    error::VerifyError,
    event_id, json,
    schemes::TimestampedScheme,
    secret::{self, Secret},
    timestamp::{self, DEFAULT_TOLERANCE},
    verified::VerifiedWebhook,
    verifier::Verifier,
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
    secrets: Arc<[Secret]>,
    tolerance: Option<Duration>,
}

impl PaddleVerifier {
    /// Accepts deliveries signed with any of the destination's `secrets`.
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

impl Verifier for PaddleVerifier {
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
        let [id] = json::fields(body, ["/event_id"])?;
        let id = event_id::scalar_id(id, "/event_id")?;
        Ok(VerifiedWebhook::new(PROVIDER, id, body.clone())
            .with_signed_at(signed)
            .with_secret_index(index))
    }
}

/// The `Paddle-Signature` value for `body` at `timestamp`.
pub fn sign(secret: impl AsRef<[u8]>, timestamp: u64, body: &[u8]) -> String {
    SCHEME.sign(secret.as_ref(), timestamp, body)
}

/// The fixture the tests and benches sign Paddle deliveries with.
#[cfg(feature = "test-support")]
pub(crate) fn fixture() -> crate::testing::HmacFixture {
    use crate::testing::{Delivery, HmacFixture};

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
        |secret, signed, sent, now| {
            let signature = sign(secret, now, signed.body.as_bytes());
            Delivery::new(vec![(SIGNATURE_HEADER, signature)], sent.body.clone())
        },
    )
}
