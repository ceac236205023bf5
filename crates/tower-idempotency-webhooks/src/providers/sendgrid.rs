//! [SendGrid signed Event Webhook](https://www.twilio.com/docs/sendgrid/for-developers/tracking-events/getting-started-event-webhook-security-features):
//! `X-Twilio-Email-Event-Webhook-Signature: <base64 DER ECDSA P-256/SHA-256>` over
//! `{X-Twilio-Email-Event-Webhook-Timestamp}{body}`, checked with the verification key (base64
//! DER SubjectPublicKeyInfo).
//!
//! A delivery is a batch (a JSON array) of events, each with its own `sg_event_id`. The layer's
//! key is `sha256:<hex>` of the body (a retried batch is resent as is); use [`event_ids`] to get
//! the per-event ids for deduplication inside the handler. SendGrid retries failed batches for
//! up to 24 hours, so [`DEFAULT_TTL`] is two days.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::request::Parts;
use p256::{
    ecdsa::{signature::hazmat::PrehashVerifier as _, Signature, VerifyingKey},
    pkcs8::DecodePublicKey,
};
use sha2::{Digest as _, Sha256};

use crate::{
    error::{ConfigError, VerifyError},
    event_id, headers,
    signature::Encoding,
    timestamp::{self, DEFAULT_TOLERANCE},
    verified::VerifiedWebhook,
    verifier::Verifier,
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
    keys: Arc<[VerifyingKey]>,
    tolerance: Option<Duration>,
}

impl SendGridVerifier {
    /// Accepts batches signed for any of the verification `keys`: base64 DER, as shown in the
    /// SendGrid console, or the same key as a PEM `PUBLIC KEY` block (as
    /// `@sendgrid/eventwebhook` accepts it).
    pub fn new<S: AsRef<str>>(keys: impl IntoIterator<Item = S>) -> Result<Self, ConfigError> {
        let keys = keys
            .into_iter()
            .map(|key| {
                let der = Encoding::Base64
                    .decode(&pem_body(key.as_ref().trim())?)
                    .ok_or(ConfigError::InvalidPublicKey {
                        reason: "not base64",
                    })?;
                VerifyingKey::from_public_key_der(&der).map_err(|_| ConfigError::InvalidPublicKey {
                    reason: "not a P-256 SubjectPublicKeyInfo",
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
            return Err(VerifyError::MissingConfiguration {
                what: "verification key",
            });
        }
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
            .iter()
            .position(|key| key.verify_prehash(&digest, &signature).is_ok())
            .ok_or(VerifyError::SignatureMismatch)?;
        timestamp::check_window(TIMESTAMP_HEADER, signed, now, self.tolerance)?;
        Ok(
            VerifiedWebhook::new(PROVIDER, event_id::body_digest_id(body), body.clone())
                .with_signed_at(signed)
                .with_secret_index(index)
                .with_signed_headers([TIMESTAMP_HEADER]),
        )
    }
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
pub(crate) mod fixture {
    use std::sync::Arc;

    use base64::{engine::general_purpose::STANDARD, Engine as _};
    use p256::{
        ecdsa::{signature::Signer as _, Signature, SigningKey},
        pkcs8::EncodePublicKey as _,
    };

    use crate::{
        testing::{key_seed, Delivery, Event, Fixture, Signer},
        Verifier,
    };

    fn key(signer: Signer) -> SigningKey {
        SigningKey::from_slice(&key_seed(signer)).expect("a valid scalar")
    }

    pub(crate) struct SendGridFixture;

    impl Fixture for SendGridFixture {
        fn provider(&self) -> &'static str {
            super::PROVIDER
        }

        fn verifier(&self) -> Arc<dyn Verifier> {
            let der = key(Signer::Genuine)
                .verifying_key()
                .to_public_key_der()
                .expect("an encodable key");
            let public = STANDARD.encode(der.as_bytes());
            Arc::new(super::SendGridVerifier::new([public]).expect("a valid key"))
        }

        fn event(&self, id: &str, _now: u64) -> Event {
            Event {
                id: id.to_owned(),
                body: format!(
                    r#"[{{"email":"a@example.com","event":"delivered","sg_event_id":"{id}","timestamp":1700000000}}]"#
                ),
            }
        }

        fn deliver(&self, signer: Signer, signed: &Event, sent: &Event, now: u64) -> Delivery {
            let signature: Signature = key(signer).sign(format!("{now}{}", signed.body).as_bytes());
            let headers = vec![
                (super::SIGNATURE_HEADER, STANDARD.encode(signature.to_der())),
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

        fn key(&self, _event: &Event, delivery: &Delivery) -> String {
            crate::event_id::body_digest_id(delivery.body.as_bytes())
        }
    }
}
