//! [SendGrid signed Event Webhook](https://www.twilio.com/docs/sendgrid/for-developers/tracking-events/getting-started-event-webhook-security-features):
//! `X-Twilio-Email-Event-Webhook-Signature: <base64 DER ECDSA P-256/SHA-256>` over
//! `{X-Twilio-Email-Event-Webhook-Timestamp}{body}`, checked with the verification key (base64
//! DER SubjectPublicKeyInfo).
//!
//! A delivery is a batch (a JSON array) of events, each with its own `sg_event_id`. The layer's
//! key is `sha256:<hex>` of the body (a retried batch is resent as is); use [`event_ids`] to get
//! the per-event ids for deduplication inside the handler. SendGrid retries failed batches for
//! up to 24 hours, so [`DEFAULT_TTL`] is two days.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::request::Parts;
use p256::{
    ecdsa::{signature::hazmat::PrehashVerifier as _, Signature, VerifyingKey},
    pkcs8::DecodePublicKey,
};
use sha2::{Digest as _, Sha256};

use super::public_keys::PublicKeys;
use crate::{
    error::{ConfigError, VerifyError},
    event_id, headers,
    signature::Encoding,
    timestamp::{self, replay_window_methods},
    verified::VerifiedWebhook,
    verifier::{verifier_settings, Verifier},
};

/// The provider name and store namespace.
pub const PROVIDER: &str = "sendgrid";
/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-twilio-email-event-webhook-signature";
/// The signed timestamp header.
pub const TIMESTAMP_HEADER: &str = "x-twilio-email-event-webhook-timestamp";
/// Two days: longer than SendGrid's 24 hours of retries.
pub const DEFAULT_TTL: Duration = Duration::from_secs(2 * 24 * 60 * 60);

/// Verifies SendGrid Event Webhook batches.
#[derive(Clone, Debug)]
pub struct SendGridVerifier {
    keys: PublicKeys<VerifyingKey>,
}

impl SendGridVerifier {
    /// Accepts batches signed for any of the verification `keys`: base64 DER, as shown in the
    /// SendGrid console, or the same key as a PEM `PUBLIC KEY` block (as
    /// `@sendgrid/eventwebhook` accepts it).
    pub fn new<S: AsRef<str>>(keys: impl IntoIterator<Item = S>) -> Result<Self, ConfigError> {
        let keys = PublicKeys::parse(keys, |key| {
            let der =
                Encoding::Base64
                    .decode(&pem_body(key)?)
                    .ok_or(ConfigError::InvalidPublicKey {
                        reason: "not base64",
                    })?;
            VerifyingKey::from_public_key_der(&der).map_err(|_| ConfigError::InvalidPublicKey {
                reason: "not a P-256 SubjectPublicKeyInfo",
            })
        })?;
        Ok(Self { keys })
    }

    replay_window_methods! {
        /// The replay window (default 300 s); zero panics (see `disable_replay_window`).
        self.keys.tolerance
    }
}

/// The base64 of a key: the text itself, or the body of a PEM `PUBLIC KEY` block with its line
/// breaks removed (one long line, as the SDK builds it, or 64-character lines).
fn pem_body(key: &str) -> Result<std::borrow::Cow<'_, str>, ConfigError> {
    const BEGIN: &str = "-----BEGIN PUBLIC KEY-----";
    const END: &str = "-----END PUBLIC KEY-----";
    if !key.starts_with("-----") {
        return Ok(key.into());
    }
    let body = key
        .strip_prefix(BEGIN)
        .and_then(|rest| rest.strip_suffix(END))
        .ok_or(ConfigError::InvalidPublicKey {
            reason: "not a PEM `PUBLIC KEY` block",
        })?;
    Ok(body.split_ascii_whitespace().collect::<String>().into())
}

impl Verifier for SendGridVerifier {
    fn verify(
        &self,
        parts: &Parts,
        body: &Bytes,
        now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError> {
        self.keys.require("verification key")?;
        let value = headers::required(&parts.headers, SIGNATURE_HEADER)?;
        let timestamp = headers::required(&parts.headers, TIMESTAMP_HEADER)?;
        let signature = Encoding::Base64
            .decode(value)
            .and_then(|der| Signature::from_der(&der).ok())
            .ok_or(VerifyError::MalformedHeader {
                name: SIGNATURE_HEADER,
                reason: "not a base64 DER ECDSA signature",
            })?;
        let signed = timestamp::parse_unix(TIMESTAMP_HEADER, timestamp)?;
        // ECDSA-SHA256 signs the digest of the message: hash `{timestamp}{body}` once, without
        // copying the body, and check that digest against every key.
        let digest = Sha256::new()
            .chain_update(timestamp.as_bytes())
            .chain_update(body)
            .finalize();
        let index = self
            .keys
            .matching(|key| key.verify_prehash(&digest, &signature).is_ok())?;
        self.keys.tolerance.check(TIMESTAMP_HEADER, signed, now)?;
        Ok(
            VerifiedWebhook::new(PROVIDER, event_id::body_digest_id(body), body.clone())
                .with_signed_at(signed)
                .with_secret_index(index)
                .with_signed_headers([TIMESTAMP_HEADER]),
        )
    }

    verifier_settings!(PROVIDER, DEFAULT_TTL, replay_window: self.keys.tolerance);
}

/// The `sg_event_id` of every event in a verified batch, in order.
pub fn event_ids(webhook: &VerifiedWebhook) -> Result<Vec<String>, VerifyError> {
    let events = webhook
        .json()
        .map_err(|_| VerifyError::BodyNotJson)?
        .as_array()
        .ok_or(VerifyError::MalformedBody {
            reason: "not an array of events",
        })?;
    events
        .iter()
        .map(|event| event_id::json_id(event, "/sg_event_id"))
        .collect()
}

/// The fixture the tests and benches sign SendGrid event batches with.
#[cfg(feature = "test-support")]
pub(crate) fn fixture() -> super::public_keys::KeyPairFixture {
    use std::sync::Arc;

    use base64::{engine::general_purpose::STANDARD, Engine as _};
    use p256::{
        ecdsa::{signature::Signer as _, Signature, SigningKey},
        pkcs8::EncodePublicKey as _,
    };

    use super::public_keys::KeyPairFixture;
    use crate::testing::{key_seed, Signer};

    fn key(signer: Signer) -> SigningKey {
        SigningKey::from_slice(&key_seed(signer)).expect("a valid scalar")
    }

    KeyPairFixture::new(
        PROVIDER,
        [SIGNATURE_HEADER, TIMESTAMP_HEADER],
        || {
            let der = key(Signer::Genuine)
                .verifying_key()
                .to_public_key_der()
                .expect("an encodable key");
            let public = STANDARD.encode(der.as_bytes());
            Arc::new(SendGridVerifier::new([public]).expect("a valid key"))
        },
        |id, _| {
            format!(
                r#"[{{"email":"a@example.com","event":"delivered","sg_event_id":"{id}","timestamp":1700000000}}]"#
            )
        },
        |signer, message| {
            let signature: Signature = key(signer).sign(message);
            STANDARD.encode(signature.to_der())
        },
    )
    .key(|_, delivery| event_id::body_digest_id(delivery.body.as_bytes()))
}
