//! [Discord interactions](https://discord.com/developers/docs/interactions/overview#setting-up-an-endpoint-validating-security-request-headers):
//! `X-Signature-Ed25519: <hex>` over `{X-Signature-Timestamp}{body}`, checked with the
//! application's public key (hex); keyed by the interaction's `id`.
//!
//! Discord does not retry interactions (it expects an answer within 3 seconds), so the one-day
//! [`DEFAULT_TTL`] only guards against accidental duplicates. `PING` (type 1) is answered with
//! [`ping_response`].

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use axum_core::response::Response;
use bytes::Bytes;
use ed25519_dalek::{Signature, VerifyingKey};
use http::request::Parts;

use crate::{
    error::{ConfigError, VerifyError},
    event_id, headers, json,
    timestamp::{self, DEFAULT_TOLERANCE},
    verified::{ChallengeResponse, VerifiedWebhook},
    verifier::{Verifier, DEFAULT_WEBHOOK_TTL},
};

/// The provider name and store namespace.
pub const PROVIDER: &str = "discord";
/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-signature-ed25519";
/// The signed timestamp header.
pub const TIMESTAMP_HEADER: &str = "x-signature-timestamp";
/// One day.
pub const DEFAULT_TTL: Duration = DEFAULT_WEBHOOK_TTL;

/// Verifies Discord interactions.
#[derive(Clone, Debug)]
pub struct DiscordVerifier {
    keys: Arc<[VerifyingKey]>,
    tolerance: Option<Duration>,
}

impl DiscordVerifier {
    /// Accepts interactions signed by any of the application public `keys` (64 hex digits).
    pub fn new<S: AsRef<str>>(keys: impl IntoIterator<Item = S>) -> Result<Self, ConfigError> {
        let keys = keys
            .into_iter()
            .map(|key| {
                let bytes: [u8; 32] = hex::decode(key.as_ref().trim())
                    .ok()
                    .and_then(|b| b.try_into().ok())
                    .ok_or(ConfigError::InvalidPublicKey {
                        reason: "not 64 hex digits",
                    })?;
                VerifyingKey::from_bytes(&bytes).map_err(|_| ConfigError::InvalidPublicKey {
                    reason: "not an Ed25519 point",
                })
            })
            .collect::<Result<Arc<[_]>, _>>()?;
        Ok(Self {
            keys,
            tolerance: Some(DEFAULT_TOLERANCE),
        })
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

impl Verifier for DiscordVerifier {
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
        if self.keys.is_empty() {
            return Err(VerifyError::MissingConfiguration { what: "public key" });
        }
        let value = headers::required(&parts.headers, SIGNATURE_HEADER)?;
        let timestamp = headers::required(&parts.headers, TIMESTAMP_HEADER)?;
        let signature = hex::decode(value)
            .ok()
            .and_then(|b| Signature::from_slice(&b).ok())
            .ok_or(VerifyError::MalformedHeader {
                name: SIGNATURE_HEADER,
                reason: "not 128 hex digits",
            })?;
        let signed = timestamp::parse_unix(TIMESTAMP_HEADER, timestamp)?;
        let message = [timestamp.as_bytes(), body].concat();
        let index = self
            .keys
            .iter()
            .position(|key| key.verify_strict(&message, &signature).is_ok())
            .ok_or(VerifyError::SignatureMismatch)?;
        timestamp::check_window(TIMESTAMP_HEADER, signed, now, self.tolerance)?;
        let [id, kind] = json::fields(body, ["/id", "/type"])?;
        let id = event_id::scalar_id(id, "/id")?;
        let mut webhook = VerifiedWebhook::new(PROVIDER, id, body.clone())
            .with_signed_headers([TIMESTAMP_HEADER]);
        if kind.as_ref().and_then(json::Scalar::as_u64) == Some(1) {
            webhook =
                webhook.with_challenge(ChallengeResponse::json(&serde_json::json!({ "type": 1 })));
        }
        Ok(webhook.with_signed_at(signed).with_secret_index(index))
    }
}

/// The `PONG` answer (`{"type":1}`) to a `PING` interaction, or `None` for other interactions.
pub fn ping_response(webhook: &VerifiedWebhook) -> Option<Response> {
    (webhook.provider() == PROVIDER)
        .then(|| webhook.challenge())
        .flatten()
        .map(ChallengeResponse::to_response)
}

/// The fixture the tests and benches sign Discord interactions with.
#[cfg(feature = "test-support")]
pub(crate) mod fixture {
    use std::sync::Arc;

    use ed25519_dalek::{Signer as _, SigningKey};

    use crate::{
        testing::{key_seed, Delivery, Event, Fixture, Signer},
        Verifier,
    };

    pub(crate) struct DiscordFixture;

    impl Fixture for DiscordFixture {
        fn provider(&self) -> &'static str {
            super::PROVIDER
        }

        fn verifier(&self) -> Arc<dyn Verifier> {
            let key = SigningKey::from_bytes(&key_seed(Signer::Genuine));
            let public = hex::encode(key.verifying_key().as_bytes());
            Arc::new(super::DiscordVerifier::new([public]).expect("a valid key"))
        }

        // Type 2 (an application command), not the PING answered by `ping_response`.
        fn event(&self, id: &str, _now: u64) -> Event {
            Event {
                id: id.to_owned(),
                body: format!(r#"{{"id":"{id}","type":2,"data":{{"name":"fixture"}}}}"#),
            }
        }

        fn deliver(&self, signer: Signer, signed: &Event, sent: &Event, now: u64) -> Delivery {
            let key = SigningKey::from_bytes(&key_seed(signer));
            let signature = key.sign(format!("{now}{}", signed.body).as_bytes());
            let headers = vec![
                (super::SIGNATURE_HEADER, hex::encode(signature.to_bytes())),
                (super::TIMESTAMP_HEADER, now.to_string()),
            ];
            Delivery::new(headers, sent.body.clone())
        }

        fn signature_header(&self) -> Option<&'static str> {
            Some(super::SIGNATURE_HEADER)
        }

        // The verifier holds a public key only.
        fn secret_forms(&self) -> Vec<String> {
            Vec::new()
        }
    }
}
