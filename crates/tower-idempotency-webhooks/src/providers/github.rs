//! [GitHub](https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries):
//! `X-Hub-Signature-256: sha256=<hex>`, HMAC-SHA256 of the body; keyed by `X-GitHub-Delivery`.
//!
//! GitHub does not retry failed deliveries by itself; they can be redelivered (by hand or via
//! the API) for three days, and a redelivery carries the original `X-GitHub-Delivery`. So
//! [`DEFAULT_TTL`] is four days. GitHub signs no timestamp: there is no replay window, the
//! idempotency record is the replay protection. The signature does not cover
//! `X-GitHub-Delivery`, so the delivery carries its verified MAC as an
//! [`Authenticator`]: the layer refuses it under another delivery id (`401
//! replayed-signature`). A delivery with only the legacy SHA-1 `X-Hub-Signature` is
//! [`VerifyError::UnsupportedVersion`].

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::{request::Parts, HeaderName};
use tower_idempotency_core::Authenticator;

use crate::{
    error::VerifyError,
    event_id, headers,
    secret::{self, Secret},
    signature::{self, Encoding, HmacAlgorithm},
    verified::VerifiedWebhook,
    verifier::{verifier_settings, Verifier},
};

/// The provider name and store namespace.
pub const PROVIDER: &str = "github";
/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-hub-signature-256";
/// The legacy SHA-1 signature header, not accepted.
pub const LEGACY_SIGNATURE_HEADER: &str = "x-hub-signature";
/// The delivery id header: the key.
pub const DELIVERY_HEADER: &str = "x-github-delivery";
// Parsed once: a name given as text is parsed on every lookup.
static SIGNATURE: HeaderName = HeaderName::from_static(SIGNATURE_HEADER);
static DELIVERY: HeaderName = HeaderName::from_static(DELIVERY_HEADER);

/// Four days: longer than the three days in which deliveries can be redelivered.
pub const DEFAULT_TTL: Duration = Duration::from_secs(4 * 24 * 60 * 60);

/// Verifies GitHub deliveries.
#[derive(Clone, Debug)]
pub struct GitHubVerifier {
    secrets: Arc<[Secret]>,
}

impl GitHubVerifier {
    /// Accepts deliveries signed with any of `secrets`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes.
    pub fn new<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>) -> Self {
        Self {
            secrets: secret::collect(PROVIDER, secrets),
        }
    }
}

impl Verifier for GitHubVerifier {
    fn verify(
        &self,
        parts: &Parts,
        body: &Bytes,
        _now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError> {
        const NAME: &str = SIGNATURE_HEADER;
        let value = match headers::header(&parts.headers, &SIGNATURE)? {
            Some(value) => value,
            None if parts.headers.contains_key(LEGACY_SIGNATURE_HEADER) => {
                return Err(VerifyError::UnsupportedVersion { name: NAME })
            }
            None => return Err(VerifyError::MissingHeader { name: NAME }),
        };
        let signature = headers::prefixed(NAME, value, "sha256=")?;
        let candidates = signature::decode_all(NAME, &[signature], Encoding::Hex)?;
        let index =
            signature::match_hmac(HmacAlgorithm::Sha256, &self.secrets, &[body], &candidates)?;
        let id = event_id::header_id(&parts.headers, &DELIVERY)?;
        // The delivery id is not signed: remember the verified MAC.
        let authenticator = Authenticator::digest(PROVIDER, &[candidates[0].as_bytes()]);
        Ok(VerifiedWebhook::new(PROVIDER, id, body.clone())
            .with_secret_index(index)
            .with_authenticator(authenticator)
            .with_unsigned_event_id())
    }

    verifier_settings!(PROVIDER, DEFAULT_TTL);
}

/// The `X-Hub-Signature-256` value GitHub would send for `body`.
pub fn sign(secret: impl AsRef<[u8]>, body: &[u8]) -> String {
    let mac = signature::hmac(HmacAlgorithm::Sha256, secret.as_ref(), &[body]);
    format!("sha256={}", hex::encode(mac))
}

/// The fixture the tests and benches sign GitHub deliveries with.
#[cfg(feature = "test-support")]
pub(crate) fn fixture() -> crate::testing::HmacFixture {
    use crate::testing::{Delivery, HmacFixture, Outcome, Recapture};

    HmacFixture::new(
        PROVIDER,
        "gh-fixture-secret",
        Some(SIGNATURE_HEADER),
        |secret| Arc::new(GitHubVerifier::new([secret])),
        |id, _| format!(r#"{{"action":"opened","number":1,"ref":"{id}"}}"#),
        |secret, signed, sent, _| {
            let headers = vec![
                (SIGNATURE_HEADER, sign(secret, signed.body.as_bytes())),
                (DELIVERY_HEADER, sent.id.clone()),
                ("x-github-event", "pull_request".into()),
            ];
            Delivery::new(headers, sent.body.clone())
        },
    )
    .recapture(Recapture::Header(
        DELIVERY_HEADER,
        Outcome::Refused("replayed-signature"),
    ))
}
