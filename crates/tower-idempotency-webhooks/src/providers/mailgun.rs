//! [Mailgun](https://documentation.mailgun.com/docs/mailgun/user-manual/tracking-messages/#securing-webhooks):
//! the JSON body carries `signature: {timestamp, token, signature}` where `signature` is the hex
//! HMAC-SHA256 of `{timestamp}{token}` keyed by the HTTP webhook signing key; keyed by
//! `event-data.id`.
//!
//! **Gotcha:** the signature covers the timestamp and token, not the event data. The delivery
//! carries the token as an [`Authenticator`], so the layer refuses a token seen before under
//! another `event-data.id` (`401 replayed-signature`), as Mailgun advises; the replay window
//! bounds the rest. Mailgun retries
//! for 8 hours (10 min, 10 min, 15 min, 30 min, 1 h, 2 h, 4 h), so the one-day [`DEFAULT_TTL`]
//! covers it.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::request::Parts;
use tower_idempotency_core::Authenticator;

use super::timed_secrets::TimedSecrets;
use crate::{
    error::VerifyError,
    event_id, json,
    secret::Secret,
    signature::{self, Encoding, HmacAlgorithm},
    timestamp::{self, replay_window_methods},
    verified::VerifiedWebhook,
    verifier::{verifier_settings, Verifier, DEFAULT_WEBHOOK_TTL},
};

/// The provider name and store namespace.
pub const PROVIDER: &str = "mailgun";
/// One day: longer than Mailgun's 8 hours of retries.
pub const DEFAULT_TTL: Duration = DEFAULT_WEBHOOK_TTL;

/// Verifies Mailgun webhooks.
#[derive(Clone, Debug)]
pub struct MailgunVerifier {
    keys: TimedSecrets,
}

impl MailgunVerifier {
    /// Accepts events signed with any of the webhook signing `keys`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes.
    pub fn new<S: Into<Secret>>(keys: impl IntoIterator<Item = S>) -> Self {
        Self {
            keys: TimedSecrets::new(PROVIDER, keys),
        }
    }

    replay_window_methods! {
        /// The replay window (default 300 s); zero panics (see `disable_replay_window`).
        self.keys.tolerance
    }
}

const FIELD: &str = "signature.timestamp";

impl Verifier for MailgunVerifier {
    fn verify(
        &self,
        _parts: &Parts,
        body: &Bytes,
        now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError> {
        let [timestamp, token, signature, id] = json::fields(
            body,
            [
                "/signature/timestamp",
                "/signature/token",
                "/signature/signature",
                "/event-data/id",
            ],
        )?;
        fn field(value: &Option<json::Scalar>) -> Result<&str, VerifyError> {
            value
                .as_ref()
                .and_then(json::Scalar::as_str)
                .filter(|v| !v.is_empty() && v.len() <= 1024)
                .ok_or(VerifyError::MalformedBody {
                    reason: "no signature.timestamp, signature.token and signature.signature",
                })
        }
        let (timestamp, token, signature) =
            (field(&timestamp)?, field(&token)?, field(&signature)?);
        let signed = timestamp::parse_unix(FIELD, timestamp)?;
        let candidate =
            Encoding::Hex
                .decode_candidate(signature)
                .ok_or(VerifyError::MalformedBody {
                    reason: "signature.signature is not hexadecimal",
                })?;
        let index = self
            .keys
            .matching(&[timestamp.as_bytes(), token.as_bytes()], &[candidate])?;
        self.keys.tolerance.check(FIELD, signed, now)?;
        let id = event_id::scalar_id(id, "/event-data/id")?;
        // The event data is not signed; Mailgun's advice is to refuse a token seen before.
        let authenticator = Authenticator::digest(PROVIDER, &[token.as_bytes()]);
        Ok(VerifiedWebhook::new(PROVIDER, id, body.clone())
            .with_signed_at(signed)
            .with_secret_index(index)
            .with_authenticator(authenticator))
    }

    verifier_settings!(PROVIDER, DEFAULT_TTL, replay_window: self.keys.tolerance);
}

/// The `signature` object Mailgun would send for `timestamp` and `token`.
pub fn sign(key: impl AsRef<[u8]>, timestamp: u64, token: &str) -> serde_json::Value {
    let ts = timestamp.to_string();
    let mac = signature::hmac(
        HmacAlgorithm::Sha256,
        key.as_ref(),
        &[ts.as_bytes(), token.as_bytes()],
    );
    serde_json::json!({ "timestamp": ts, "token": token, "signature": hex::encode(mac) })
}

/// The fixture the tests and benches sign Mailgun deliveries with.
#[cfg(feature = "test-support")]
pub(crate) fn fixture() -> crate::testing::HmacFixture {
    use std::sync::Arc;

    use crate::testing::{Delivery, Event, HmacFixture, Outcome, Recapture};

    use sha2::{Digest as _, Sha256};

    /// A token per event, as Mailgun sends a fresh one with every delivery.
    fn token(event: &Event) -> String {
        hex::encode(&Sha256::digest(&event.body)[..25])
    }

    /// `delivery` with the event data of `other` next to its signature block.
    fn swap_event_data(delivery: &Delivery, other: &Event) -> Delivery {
        let mut body: serde_json::Value =
            serde_json::from_str(&delivery.body).expect("a fixture body");
        let other: serde_json::Value = serde_json::from_str(&other.body).expect("a fixture body");
        body["event-data"] = other["event-data"].clone();
        Delivery::new(delivery.headers.clone(), body.to_string())
    }

    HmacFixture::new(
        PROVIDER,
        "mailgun-signing-key",
        None,
        |key| Arc::new(MailgunVerifier::new([key])),
        |id, _| format!(r#"{{"event-data":{{"id":"{id}","event":"delivered"}}}}"#),
        // Mailgun signs `{timestamp}{token}`, not the event data: a tampered delivery carries
        // the signature of one token next to another token.
        |key, signed, sent, now| {
            let mut signature = sign(key, now, &token(signed));
            signature["token"] = token(sent).into();
            // The signature block first, as Mailgun sends it.
            let rest = sent.body.strip_prefix('{').expect("a JSON object");
            Delivery::new(Vec::new(), format!(r#"{{"signature":{signature},{rest}"#))
        },
    )
    // The same signature block next to another event's data.
    .recapture(Recapture::Custom(
        swap_event_data,
        Outcome::Refused("replayed-signature"),
    ))
}
