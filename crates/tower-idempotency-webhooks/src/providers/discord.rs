//! [Discord interactions](https://discord.com/developers/docs/interactions/overview#setting-up-an-endpoint-validating-security-request-headers):
//! `X-Signature-Ed25519: <hex>` over `{X-Signature-Timestamp}{body}`, checked with the
//! application's public key (hex); keyed by the interaction's `id`.
//!
//! Discord does not retry interactions (it expects an answer within 3 seconds), so the one-day
//! [`DEFAULT_TTL`] only guards against accidental duplicates. `PING` (type 1) is answered with
//! [`ping_response`].

use std::time::{Duration, SystemTime};

use axum_core::response::Response;
use bytes::Bytes;
use ed25519_dalek::{Signature, VerifyingKey};
use http::request::Parts;

use super::public_keys::PublicKeys;
use crate::{
    error::{ConfigError, VerifyError},
    event_id, headers, json, signature,
    timestamp::{self, replay_window_methods},
    verified::{ChallengeResponse, VerifiedWebhook},
    verifier::{verifier_settings, Verifier, DEFAULT_WEBHOOK_TTL},
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
    keys: PublicKeys<VerifyingKey>,
}

impl DiscordVerifier {
    /// Accepts interactions signed by any of the application public `keys` (64 hex digits).
    pub fn new<S: AsRef<str>>(keys: impl IntoIterator<Item = S>) -> Result<Self, ConfigError> {
        let keys = PublicKeys::parse(keys, |key| {
            signature::ed25519_key(hex::decode(key).ok(), "not 64 hex digits")
        })?;
        Ok(Self { keys })
    }

    replay_window_methods! {
        /// The replay window (default 300 s); zero panics (see `disable_replay_window`).
        self.keys.tolerance
    }
}

impl Verifier for DiscordVerifier {
    fn verify(
        &self,
        parts: &Parts,
        body: &Bytes,
        now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError> {
        self.keys.require("public key")?;
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
            .matching(|key| key.verify_strict(&message, &signature).is_ok())?;
        self.keys.tolerance.check(TIMESTAMP_HEADER, signed, now)?;
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

    verifier_settings!(PROVIDER, DEFAULT_TTL, replay_window: self.keys.tolerance);
}

/// The `PONG` answer (`{"type":1}`) to a `PING` interaction, or `None` for other interactions.
pub fn ping_response(webhook: &VerifiedWebhook) -> Option<Response> {
    super::challenge_response(webhook, PROVIDER)
}

/// The fixture the tests and benches sign Discord interactions with.
#[cfg(feature = "test-support")]
pub(crate) fn fixture() -> super::public_keys::KeyPairFixture {
    use std::sync::Arc;

    use ed25519_dalek::{Signer as _, SigningKey};

    use super::public_keys::KeyPairFixture;
    use crate::testing::{key_seed, Signer};

    fn key(signer: Signer) -> SigningKey {
        SigningKey::from_bytes(&key_seed(signer))
    }

    KeyPairFixture::new(
        PROVIDER,
        [SIGNATURE_HEADER, TIMESTAMP_HEADER],
        || {
            let public = hex::encode(key(Signer::Genuine).verifying_key().as_bytes());
            Arc::new(DiscordVerifier::new([public]).expect("a valid key"))
        },
        // Type 2 (an application command), not the PING answered by `ping_response`.
        |id, _| format!(r#"{{"id":"{id}","type":2,"data":{{"name":"fixture"}}}}"#),
        |signer, message| hex::encode(key(signer).sign(message).to_bytes()),
    )
}
