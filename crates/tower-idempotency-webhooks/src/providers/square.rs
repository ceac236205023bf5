//! [Square](https://developer.squareup.com/docs/webhooks/step3validate):
//! `x-square-hmacsha256-signature: <base64>`, HMAC-SHA256 keyed by the subscription's signature
//! key over `{notification URL}{body}`; keyed by the body's `event_id`.
//!
//! **Gotcha:** the URL is the notification URL exactly as registered with Square (scheme, host,
//! path and query), not what the application sees behind a proxy, so it is configured, not
//! read from the request. Square signs that URL, not the request's, so the request's path and
//! query are compared with it: the query must be the registered one byte for byte, and the
//! path the registered one or a tail of it that starts at a `/` (a proxy or `Router::nest`
//! strips the leading segments), else [`VerifyError::SignatureMismatch`]. A `?tenant=evil` or
//! another route under the same layer does not pass on the strength of the signature. Square retries failed deliveries for up to 24 hours, so
//! [`DEFAULT_TTL`] is two days. No timestamp is signed. The legacy SHA-1
//! `x-square-signature` alone is [`VerifyError::UnsupportedVersion`].

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::{request::Parts, HeaderName};

use crate::{
    error::{ConfigError, VerifyError},
    event_id, headers, json,
    secret::{self, Secret},
    signature::{self, Encoding, HmacAlgorithm},
    verified::VerifiedWebhook,
    verifier::{verifier_settings, Verifier},
};

/// The provider name and store namespace.
pub const PROVIDER: &str = "square";
/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-square-hmacsha256-signature";
/// The legacy SHA-1 signature header, not accepted.
pub const LEGACY_SIGNATURE_HEADER: &str = "x-square-signature";

// Parsed once: a name given as text is parsed on every lookup.
static SIGNATURE: HeaderName = HeaderName::from_static(SIGNATURE_HEADER);
/// Two days: longer than Square's 24 hours of retries.
pub const DEFAULT_TTL: Duration = Duration::from_secs(2 * 24 * 60 * 60);

/// Verifies Square deliveries.
#[derive(Clone, Debug)]
pub struct SquareVerifier {
    secrets: Arc<[Secret]>,
    url: Arc<str>,
    /// The registered URL's path, as written.
    path: Arc<str>,
    /// The registered URL's query, as written (empty without one).
    query: Arc<str>,
}

impl SquareVerifier {
    /// Accepts deliveries to `notification_url` (as registered) signed with any of the
    /// subscription's signature `keys`.
    ///
    /// Fails with [`ConfigError::WeakSecret`] if a key is empty or shorter than
    /// [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes.
    pub fn new<S: Into<Secret>>(
        notification_url: impl Into<String>,
        keys: impl IntoIterator<Item = S>,
    ) -> Result<Self, ConfigError> {
        let url = notification_url.into();
        let parsed: http::Uri = url.parse().map_err(|_| ConfigError::InvalidUrl {
            reason: "not a URI",
        })?;
        if !matches!(parsed.scheme_str(), Some("https" | "http")) || parsed.host().is_none() {
            return Err(ConfigError::InvalidUrl {
                reason: "not an absolute http(s) URL",
            });
        }
        Ok(Self {
            secrets: secret::try_collect(keys)?,
            path: parsed.path().into(),
            query: parsed.query().unwrap_or_default().into(),
            url: url.into(),
        })
    }

    /// Whether a request to `uri` is one Square sends to the registered URL: the same query,
    /// and the same path or a tail of it starting at a `/`.
    fn is_registered(&self, uri: &http::Uri) -> bool {
        let path = uri.path();
        uri.query().unwrap_or_default() == &*self.query
            && path.starts_with('/')
            && self.path.ends_with(path)
    }
}

impl Verifier for SquareVerifier {
    fn verify(
        &self,
        parts: &Parts,
        body: &Bytes,
        _now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError> {
        let value = match headers::header(&parts.headers, &SIGNATURE)? {
            Some(value) => value,
            None if parts.headers.contains_key(LEGACY_SIGNATURE_HEADER) => {
                return Err(VerifyError::UnsupportedVersion {
                    name: SIGNATURE_HEADER,
                })
            }
            None => {
                return Err(VerifyError::MissingHeader {
                    name: SIGNATURE_HEADER,
                })
            }
        };
        let candidates = signature::decode_all(SIGNATURE_HEADER, &[value], Encoding::Base64)?;
        // The signature covers the registered URL only: a request elsewhere is not what Square
        // signed, whatever the signature says.
        if !self.is_registered(&parts.uri) {
            return Err(VerifyError::SignatureMismatch);
        }
        let index = signature::match_hmac(
            HmacAlgorithm::Sha256,
            &self.secrets,
            &[self.url.as_bytes(), body],
            &candidates,
        )?;
        let [id] = json::fields(body, ["/event_id"])?;
        let id = event_id::scalar_id(id, "/event_id")?;
        Ok(VerifiedWebhook::new(PROVIDER, id, body.clone()).with_secret_index(index))
    }

    verifier_settings!(PROVIDER, DEFAULT_TTL);
}

/// The `x-square-hmacsha256-signature` value for `body` sent to `notification_url`.
pub fn sign(key: impl AsRef<[u8]>, notification_url: &str, body: &[u8]) -> String {
    Encoding::Base64.encode(&signature::hmac(
        HmacAlgorithm::Sha256,
        key.as_ref(),
        &[notification_url.as_bytes(), body],
    ))
}

/// The fixture the tests and benches sign Square deliveries with.
#[cfg(feature = "test-support")]
pub(crate) fn fixture() -> crate::testing::HmacFixture {
    use crate::testing::{Delivery, HmacFixture, PATH, PUBLIC_ORIGIN};

    fn fixture_url() -> String {
        format!("{PUBLIC_ORIGIN}{PATH}")
    }

    HmacFixture::new(
        PROVIDER,
        "sq-signature-key",
        Some(SIGNATURE_HEADER),
        |secret| Arc::new(SquareVerifier::new(fixture_url(), [secret]).expect("a valid URL")),
        |id, _| {
            format!(r#"{{"event_id":"{id}","type":"payment.updated","data":{{"id":"pay_1"}}}}"#)
        },
        |secret, signed, sent, _| {
            let signature = sign(secret, &fixture_url(), signed.body.as_bytes());
            Delivery::new(vec![(SIGNATURE_HEADER, signature)], sent.body.clone())
        },
    )
    .signs_path()
}
