//! [Standard Webhooks](https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md)
//! (and [Svix](https://docs.svix.com/receiving/verifying-payloads/how-manual), which sends the
//! same scheme under `svix-*` headers): `webhook-signature: v1,<base64> [v1,<base64> ..]`, HMAC-SHA256
//! keyed by the base64 part of a `whsec_` secret over `{webhook-id}.{webhook-timestamp}.{body}`;
//! `v1a,<base64>` is the Ed25519 variant (public keys `whpk_` + base64). Keyed by `webhook-id`.
//!
//! Svix retries on a schedule of 5 s, 5 min, 30 min, 2 h, 5 h, 10 h and 10 h (about 27.5 h in
//! all), so [`DEFAULT_TTL`] is three days.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use base64::Engine as _;
use bytes::Bytes;
use ed25519_dalek::{Signature, VerifyingKey};
use http::{request::Parts, HeaderMap, HeaderName};
use smallvec::SmallVec;

use crate::{
    error::{ConfigError, VerifyError},
    event_id, headers,
    secret::Secret,
    signature::{self, Encoding, HmacAlgorithm, MAX_ASYMMETRIC_SIGNATURES, MAX_SIGNATURES},
    timestamp::{self, replay_window_methods, ReplayWindow},
    verified::VerifiedWebhook,
    verifier::Verifier,
};

/// The default provider name and store namespace.
pub const PROVIDER: &str = "standard-webhooks";
/// Three days: longer than Svix's ~27.5 h retry schedule.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3 * 24 * 60 * 60);
/// Prefix of symmetric secrets.
pub const SECRET_PREFIX: &str = "whsec_";
/// Prefix of Ed25519 public keys.
pub const PUBLIC_KEY_PREFIX: &str = "whpk_";

/// Pre-parsed names: parsing a name on each lookup was a measurable share of a 1 KiB
/// verification, and this scheme reads three or four headers.
struct Family {
    id: HeaderName,
    timestamp: HeaderName,
    signature: HeaderName,
}

static WEBHOOK: Family = Family {
    id: HeaderName::from_static("webhook-id"),
    timestamp: HeaderName::from_static("webhook-timestamp"),
    signature: HeaderName::from_static("webhook-signature"),
};
static SVIX: Family = Family {
    id: HeaderName::from_static("svix-id"),
    timestamp: HeaderName::from_static("svix-timestamp"),
    signature: HeaderName::from_static("svix-signature"),
};

/// Verifies Standard Webhooks / Svix deliveries.
#[derive(Clone, Debug)]
pub struct StandardWebhooksVerifier {
    provider: &'static str,
    secrets: Arc<[Secret]>,
    public_keys: Arc<[VerifyingKey]>,
    tolerance: ReplayWindow,
    ttl: Duration,
}

/// Decodes a `whsec_<base64>` secret (the prefix is optional) into its key bytes.
pub fn decode_secret(secret: &str) -> Result<Vec<u8>, ConfigError> {
    let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
    let key = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| ConfigError::InvalidSecret {
            reason: "not `whsec_` followed by base64",
        })?;
    if key.is_empty() {
        return Err(ConfigError::InvalidSecret {
            reason: "empty key",
        });
    }
    Ok(key)
}

impl StandardWebhooksVerifier {
    /// Accepts `v1` signatures made with any of `secrets` (`whsec_...`).
    pub fn new<S: AsRef<str>>(secrets: impl IntoIterator<Item = S>) -> Result<Self, ConfigError> {
        let secrets = secrets
            .into_iter()
            .map(|s| decode_secret(s.as_ref()).map(Secret::from))
            .collect::<Result<Arc<[Secret]>, _>>()?;
        Ok(Self {
            provider: PROVIDER,
            secrets,
            public_keys: Arc::from([]),
            tolerance: ReplayWindow::default(),
            ttl: DEFAULT_TTL,
        })
    }

    /// Accepts only `v1a` (Ed25519) signatures by any of `keys` (`whpk_<base64>`, prefix
    /// optional): for senders that sign asymmetrically and share no secret. An empty list is
    /// [`ConfigError::InvalidPublicKey`], as such a verifier could accept nothing.
    pub fn from_public_keys<S: AsRef<str>>(
        keys: impl IntoIterator<Item = S>,
    ) -> Result<Self, ConfigError> {
        let verifier = Self::new::<&str>([])?.public_keys(keys)?;
        if verifier.public_keys.is_empty() {
            return Err(ConfigError::InvalidPublicKey {
                reason: "no public key given",
            });
        }
        Ok(verifier)
    }

    /// Also accepts `v1a` (Ed25519) signatures by any of `keys` (`whpk_<base64>`, prefix
    /// optional).
    pub fn public_keys<S: AsRef<str>>(
        mut self,
        keys: impl IntoIterator<Item = S>,
    ) -> Result<Self, ConfigError> {
        let keys = keys
            .into_iter()
            .map(|key| {
                let key = key.as_ref();
                let encoded = key.strip_prefix(PUBLIC_KEY_PREFIX).unwrap_or(key);
                signature::ed25519_key(
                    base64::engine::general_purpose::STANDARD
                        .decode(encoded)
                        .ok(),
                    "not `whpk_` followed by 32 bytes of base64",
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.public_keys = keys.into();
        Ok(self)
    }

    /// The provider name and namespace (default `standard-webhooks`), e.g. `"svix"` or the name
    /// of the service that sends Standard Webhooks.
    pub fn provider_name(mut self, name: &'static str) -> Self {
        self.provider = name;
        self
    }

    /// The TTL of completed deliveries (default three days), for senders with other schedules.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    replay_window_methods! {
        /// The replay window (default 300 s, the specification's); zero panics (see
        /// `disable_replay_window`).
        self.tolerance
    }
}

/// The header family and the signature header's value: `webhook-*`, or `svix-*` when there is no
/// `webhook-signature` (Svix's own names). A delivery with neither is missing
/// `webhook-signature`. One lookup in the common case, not a presence check and then a read.
fn family(headers: &HeaderMap) -> Result<(&'static Family, &str), VerifyError> {
    for family in [&WEBHOOK, &SVIX] {
        if let Some(value) = headers::header(headers, &family.signature)? {
            return Ok((family, value));
        }
    }
    Err(VerifyError::MissingHeader {
        name: WEBHOOK.signature.as_str(),
    })
}

/// The signatures of a `webhook-signature` value, by version.
struct Members<'a> {
    /// `v1` (HMAC-SHA256) signatures.
    symmetric: SmallVec<[&'a str; 2]>,
    /// `v1a` (Ed25519) signatures.
    asymmetric: SmallVec<[&'a str; 2]>,
}

impl<'a> Members<'a> {
    /// Splits `value` into its members, bounding their number before anything is decoded.
    fn parse(value: &'a str, name: &'static str) -> Result<Self, VerifyError> {
        let mut members = Self {
            symmetric: SmallVec::new(),
            asymmetric: SmallVec::new(),
        };
        let mut versioned = false;
        for (count, member) in value.split_ascii_whitespace().enumerate() {
            if count == MAX_SIGNATURES {
                return Err(VerifyError::MalformedHeader {
                    name,
                    reason: "too many signatures",
                });
            }
            // As the official libraries do: a member without `version,` is skipped, and parts
            // after the signature (`v1,<sig>,extra`) are ignored.
            let mut fields = member.split(',');
            let (Some(version), Some(signature)) = (fields.next(), fields.next()) else {
                continue;
            };
            versioned = true;
            match version {
                "v1" => members.symmetric.push(signature),
                "v1a" => members.asymmetric.push(signature),
                _ => {}
            }
        }
        if !versioned {
            return Err(VerifyError::MalformedHeader {
                name,
                reason: "signature without `version,` prefix",
            });
        }
        if members.asymmetric.len() > MAX_ASYMMETRIC_SIGNATURES {
            return Err(VerifyError::MalformedHeader {
                name,
                reason: "too many v1a signatures",
            });
        }
        Ok(members)
    }

    /// Drops the signatures `verifier` has no secret or key for.
    fn usable_by(mut self, verifier: &StandardWebhooksVerifier) -> Self {
        if verifier.secrets.is_empty() {
            self.symmetric.clear();
        }
        if verifier.public_keys.is_empty() {
            self.asymmetric.clear();
        }
        self
    }

    fn is_empty(&self) -> bool {
        self.symmetric.is_empty() && self.asymmetric.is_empty()
    }
}

/// The outcome of checking one kind of signature.
#[derive(Default)]
struct Match {
    /// Whether any signature of that kind decoded.
    decoded: bool,
    /// The index of the secret or key that signed.
    index: Option<usize>,
}

impl StandardWebhooksVerifier {
    /// Checks the `v1` signatures against every secret, in constant time.
    fn match_v1(&self, signatures: &[&str], chunks: &[&[u8]]) -> Match {
        let candidates: signature::Candidates = signatures
            .iter()
            .filter_map(|s| Encoding::Base64.decode_candidate(s))
            .collect();
        if candidates.is_empty() {
            return Match::default();
        }
        let index =
            signature::match_hmac(HmacAlgorithm::Sha256, &self.secrets, chunks, &candidates).ok();
        Match {
            decoded: true,
            index,
        }
    }

    /// Checks the `v1a` signatures against every public key.
    fn match_v1a(&self, signatures: &[&str], chunks: &[&[u8]]) -> Match {
        let signatures: Vec<Signature> = signatures
            .iter()
            .filter_map(|s| Encoding::Base64.decode(s))
            .filter_map(|b| Signature::from_slice(&b).ok())
            .collect();
        let message = chunks.concat();
        let index = self.public_keys.iter().position(|key| {
            signatures
                .iter()
                .any(|sig| key.verify_strict(&message, sig).is_ok())
        });
        Match {
            decoded: !signatures.is_empty(),
            index,
        }
    }

    /// The index of the secret or key that signed the usable `members`: `v1` first, `v1a` only
    /// when no `v1` signature matched. Malformed only when none of them decoded.
    fn match_signatures(
        &self,
        members: &Members<'_>,
        chunks: &[&[u8]],
        name: &'static str,
    ) -> Result<usize, VerifyError> {
        let mut decoded = false;
        if !members.symmetric.is_empty() {
            let v1 = self.match_v1(&members.symmetric, chunks);
            decoded |= v1.decoded;
            if let Some(index) = v1.index {
                return Ok(index);
            }
        }
        if !members.asymmetric.is_empty() {
            let v1a = self.match_v1a(&members.asymmetric, chunks);
            decoded |= v1a.decoded;
            if let Some(index) = v1a.index {
                return Ok(index);
            }
        }
        Err(if decoded {
            VerifyError::SignatureMismatch
        } else {
            VerifyError::MalformedHeader {
                name,
                reason: "signature is not base64",
            }
        })
    }
}

impl Verifier for StandardWebhooksVerifier {
    fn provider(&self) -> &'static str {
        self.provider
    }

    fn default_ttl(&self) -> Duration {
        self.ttl
    }

    fn replay_window(&self) -> Option<Duration> {
        self.tolerance.get()
    }

    fn verify(
        &self,
        parts: &Parts,
        body: &Bytes,
        now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError> {
        if self.secrets.is_empty() && self.public_keys.is_empty() {
            return Err(VerifyError::MissingConfiguration {
                what: "secret or public key",
            });
        }
        let (names, value) = family(&parts.headers)?;
        let id = headers::required(&parts.headers, &names.id)?;
        let timestamp = headers::required(&parts.headers, &names.timestamp)?;
        let name = names.signature.as_str();
        let members = Members::parse(value, name)?.usable_by(self);
        if members.is_empty() {
            return Err(VerifyError::UnsupportedVersion { name });
        }
        let signed = timestamp::parse_unix(names.timestamp.as_str(), timestamp)?;
        let id = event_id::check_id(id.to_owned(), names.id.as_str())?;
        let chunks: [&[u8]; 5] = [id.as_bytes(), b".", timestamp.as_bytes(), b".", body];
        let index = self.match_signatures(&members, &chunks, name)?;
        self.tolerance
            .check(names.timestamp.as_str(), signed, now)?;
        Ok(VerifiedWebhook::new(self.provider, id, body.clone())
            .with_signed_at(signed)
            .with_secret_index(index))
    }
}

/// The `webhook-signature` member (`v1,<base64>`) for a delivery, `key` being the decoded
/// secret (see [`decode_secret`]).
pub fn sign(key: &[u8], id: &str, timestamp: u64, body: &[u8]) -> String {
    let ts = timestamp.to_string();
    let mac = signature::hmac(
        HmacAlgorithm::Sha256,
        key,
        &[id.as_bytes(), b".", ts.as_bytes(), b".", body],
    );
    format!("v1,{}", Encoding::Base64.encode(&mac))
}

/// The fixture the tests and benches sign Standard Webhooks (`v1`, HMAC) deliveries with.
#[cfg(feature = "test-support")]
pub(crate) mod fixture {
    use std::sync::Arc;

    use crate::{
        testing::{Delivery, Event, Fixture, Outcome, Recapture, Signer},
        Verifier,
    };

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ATTACKER: &str = "whsec_YXR0YWNrZXIga2V5IGZvciB0ZXN0cyEh";

    pub(crate) struct StandardFixture;

    impl Fixture for StandardFixture {
        fn provider(&self) -> &'static str {
            super::PROVIDER
        }

        fn verifier(&self) -> Arc<dyn Verifier> {
            Arc::new(super::StandardWebhooksVerifier::new([SECRET]).expect("a valid secret"))
        }

        fn event(&self, id: &str, _now: u64) -> Event {
            Event {
                id: id.to_owned(),
                body: format!(r#"{{"type":"user.created","data":{{"id":"{id}"}}}}"#),
            }
        }

        fn deliver(&self, signer: Signer, signed: &Event, sent: &Event, now: u64) -> Delivery {
            let secret = match signer {
                Signer::Genuine => SECRET,
                Signer::Attacker => ATTACKER,
            };
            let key = super::decode_secret(secret).expect("a valid secret");
            let signature = super::sign(&key, &signed.id, now, signed.body.as_bytes());
            let headers = vec![
                ("webhook-id", sent.id.clone()),
                ("webhook-timestamp", now.to_string()),
                ("webhook-signature", signature),
            ];
            Delivery::new(headers, sent.body.clone())
        }

        fn signature_header(&self) -> Option<&'static str> {
            Some("webhook-signature")
        }

        fn secret_forms(&self) -> Vec<String> {
            let encoded = SECRET.trim_start_matches(super::SECRET_PREFIX);
            vec![SECRET.to_owned(), encoded.to_owned()]
        }

        // The id is signed: another id is a signature that does not match.
        fn recapture(&self) -> Recapture {
            Recapture::Header("webhook-id", Outcome::Refused("webhook-signature-mismatch"))
        }
    }
}
