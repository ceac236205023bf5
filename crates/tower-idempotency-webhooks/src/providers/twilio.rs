//! [Twilio](https://www.twilio.com/docs/usage/webhooks/webhooks-security):
//! `X-Twilio-Signature: <base64>`, HMAC-SHA1 keyed by the account's auth token over the full URL
//! Twilio requested, followed, for `application/x-www-form-urlencoded` POSTs, by every POST
//! parameter sorted by name (then value) with name and value concatenated. JSON bodies are not
//! signed directly: the URL carries a `bodySHA256` query parameter (hex SHA-256 of the body),
//! which is checked against the body, and the signature covers the URL only.
//!
//! # The URL
//!
//! Twilio signs the URL it requested, which the application behind a proxy or load balancer
//! does not see. So the verifier is configured with the **public base URL** (scheme, host,
//! optional port, optional path prefix a proxy strips) and reconstructs the signed URL as that
//! base followed by the request's path and query exactly as received (raw, not re-encoded).
//! Inside `Router::nest`, axum strips the nest prefix from the path: put it in the base URL.
//!
//! Twilio's own validators (twilio-python's `RequestValidator.validate`, twilio-node's
//! `validateRequest`) accept the URL both with and without an explicit port, because the
//! signature is sometimes computed with `:443` / `:80` and sometimes without; so does this
//! verifier: the port-less form first, then the form with the configured or the default port.
//!
//! # The key
//!
//! `sha256:<hex>` of exactly what the signature covers: the URL in its port-less form, then
//! each form parameter's name and value in sorted order (for a `GET` or a `bodySHA256` URL, the
//! URL alone, whose query carries the parameters or the body's hash). Twilio's signed string
//! has no separators, so `MessageStatus=delivered&SmsSid=SM1` and
//! `MessageStatus=deliveredSmsSidSM1` verify under one signature; keyed by the signed string,
//! both are one event and run the handler once. A retry resends the same request, so it has
//! the same key; each status callback of one resource (`queued`, `sent`, `delivered`) differs
//! in its parameters, so each is its own event.
//!
//! The `I-Twilio-Idempotency-Token` header is not part of the key: no signature covers it, so
//! whoever relays a captured delivery could change it to run the event again.
//!
//! A form body has at most [`MAX_FORM_PARAMS`] parameters (Twilio sends a few dozen), so an
//! unauthenticated body cannot make the verifier decode and sort hundreds of thousands of them
//! before the MAC fails. A `GET` webhook has no body.
//!
//! Twilio signs no timestamp: there is no replay window, the idempotency record is the replay
//! protection. Requests signed under a Webhooks Rule (`X-Twilio-Webhooks-Signature-Settings`
//! present: a shared key, possibly HMAC-SHA256) are [`VerifyError::UnsupportedVersion`].

use std::{
    borrow::Cow,
    sync::Arc,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::request::Parts;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::{
    error::{ConfigError, VerifyError},
    headers,
    secret::{self, Secret},
    signature::{self, Encoding, HmacAlgorithm},
    verified::VerifiedWebhook,
    verifier::{verifier_settings, Verifier, DEFAULT_WEBHOOK_TTL},
};

/// The provider name and store namespace.
pub const PROVIDER: &str = "twilio";
/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-twilio-signature";
/// Twilio's per-event idempotency token, which no signature covers: not part of the key.
pub const IDEMPOTENCY_TOKEN_HEADER: &str = "i-twilio-idempotency-token";
/// Present when a Webhooks Rule signs with a shared key instead of the auth token.
pub const SIGNATURE_SETTINGS_HEADER: &str = "x-twilio-webhooks-signature-settings";
/// The query parameter carrying the hex SHA-256 of a JSON body.
pub const BODY_SHA256_PARAM: &str = "bodySHA256";
/// One day: Twilio retries a failed webhook only within its connection-override budget
/// (at most 5 retries within 15 s).
pub const DEFAULT_TTL: Duration = DEFAULT_WEBHOOK_TTL;
/// The most form parameters a delivery may have; more is [`VerifyError::MalformedBody`].
pub const MAX_FORM_PARAMS: usize = 1024;
const FORM: &str = "application/x-www-form-urlencoded";

/// Verifies Twilio webhooks (Messaging, Voice, Studio, ... status callbacks and requests).
#[derive(Clone, Debug)]
pub struct TwilioVerifier {
    secrets: Arc<[Secret]>,
    /// `scheme://host` (no port).
    origin: Arc<str>,
    /// `scheme://host:port` (the configured port, else the scheme's default).
    origin_with_port: Arc<str>,
    /// The base URL's path without its trailing `/` (often empty).
    prefix: Arc<str>,
}

impl TwilioVerifier {
    /// Accepts requests to `public_url` (the base URL Twilio calls: `https://example.com`, or
    /// with a path prefix a proxy strips) signed with any of the account's `auth_tokens`.
    ///
    /// Fails with [`ConfigError::InvalidUrl`] unless `public_url` is an absolute `http(s)` URL
    /// with a host and without credentials, query or fragment.
    ///
    /// Fails with [`ConfigError::WeakSecret`] if a key is empty or shorter than
    /// [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes.
    pub fn new<S: Into<Secret>>(
        public_url: &str,
        auth_tokens: impl IntoIterator<Item = S>,
    ) -> Result<Self, ConfigError> {
        let url = url::Url::parse(public_url).map_err(|_| ConfigError::InvalidUrl {
            reason: "not an absolute URL",
        })?;
        if !matches!(url.scheme(), "https" | "http") {
            return Err(ConfigError::InvalidUrl {
                reason: "not an http(s) URL",
            });
        }
        let host = url
            .host_str()
            .ok_or(ConfigError::InvalidUrl { reason: "no host" })?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(ConfigError::InvalidUrl {
                reason: "credentials in the base URL",
            });
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(ConfigError::InvalidUrl {
                reason: "the base URL must not have a query or fragment",
            });
        }
        let port = url
            .port_or_known_default()
            .ok_or(ConfigError::InvalidUrl { reason: "no port" })?;
        let scheme = url.scheme();
        Ok(Self {
            secrets: secret::try_collect(auth_tokens)?,
            origin: format!("{scheme}://{host}").into(),
            origin_with_port: format!("{scheme}://{host}:{port}").into(),
            prefix: url.path().trim_end_matches('/').into(),
        })
    }

    /// The URL Twilio signed for a request with `path_and_query` (as received), in its
    /// port-less form.
    pub fn signed_url(&self, path_and_query: &str) -> String {
        format!("{}{}{}", self.origin, self.prefix, path_and_query)
    }
}

/// The parameters whose names and values are signed after the URL.
enum Signed<'a> {
    /// URL only (`GET`, or an empty POST).
    Nothing,
    /// A form body, decoded and sorted.
    Form(Vec<(Cow<'a, str>, Cow<'a, str>)>),
    /// URL only; the body must hash to this.
    BodyHash(Vec<u8>),
}

impl<'a> Signed<'a> {
    /// What the signature covers after the URL, refusing bodies no Twilio webhook sends.
    fn classify(parts: &'a Parts, body: &'a [u8]) -> Result<Self, VerifyError> {
        let query = parts.uri.query().unwrap_or_default();
        if let Some(hash) = query_param(query, BODY_SHA256_PARAM) {
            // A malformed hash cannot match the body; the signature check decides first.
            return Ok(Self::BodyHash(
                hex::decode(hash.as_bytes()).unwrap_or_default(),
            ));
        }
        if parts.method == http::Method::GET {
            if !body.is_empty() {
                return Err(VerifyError::MalformedBody {
                    reason: "a GET webhook has no body",
                });
            }
            return Ok(Self::Nothing);
        }
        if is_form(parts) {
            // Counted before anything is decoded: the separators bound the parameters.
            if body.iter().filter(|&&b| b == b'&').count() >= MAX_FORM_PARAMS {
                return Err(VerifyError::MalformedBody {
                    reason: "more form parameters than a Twilio webhook has",
                });
            }
            return Ok(Self::Form(sorted_params(body)));
        }
        if body.is_empty() {
            return Ok(Self::Nothing);
        }
        Err(VerifyError::MalformedBody {
            reason: "neither form-encoded nor covered by a bodySHA256 query parameter",
        })
    }
}

impl TwilioVerifier {
    /// The index of the token that signed `chunks`, whose first chunk (the origin) this sets.
    /// The port-less form is what Twilio usually signs: it is tried first, and the
    /// explicit-port form only when it fails. Which form matched is not secret.
    fn match_origins<'a>(
        &'a self,
        chunks: &mut [&'a [u8]],
        candidates: &signature::Candidates,
    ) -> Result<usize, VerifyError> {
        let mut matched = Err(VerifyError::SignatureMismatch);
        for origin in [&self.origin, &self.origin_with_port] {
            chunks[0] = origin.as_bytes();
            matched = signature::match_hmac(HmacAlgorithm::Sha1, &self.secrets, chunks, candidates);
            if matched.is_ok() {
                break;
            }
        }
        matched
    }

    /// The key: the signed string in its port-less form (`rest` being what follows the
    /// origin), whichever form matched.
    fn key(&self, rest: &[&[u8]]) -> String {
        let mut signed_string = Sha256::new();
        signed_string.update(self.origin.as_bytes());
        for chunk in rest {
            signed_string.update(chunk);
        }
        format!("sha256:{}", hex::encode(signed_string.finalize()))
    }
}

fn is_form(parts: &Parts) -> bool {
    parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case(FORM))
}

/// The first value of `name` in a query string, undecoded names compared after decoding.
fn query_param<'a>(query: &'a str, name: &str) -> Option<Cow<'a, str>> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == name)
        .map(|(_, value)| value)
}

/// Sorted by name, then value (byte order = Unix-style case-sensitive order), as Twilio's
/// libraries do for repeated names.
pub(crate) fn sorted_params(body: &[u8]) -> Vec<(Cow<'_, str>, Cow<'_, str>)> {
    let mut params: Vec<_> = form_urlencoded::parse(body).collect();
    params.sort_unstable();
    params
}

impl Verifier for TwilioVerifier {
    /// `GET` and `POST`: a Twilio webhook is configured with either.
    fn accepts_method(&self, method: &http::Method) -> bool {
        method == http::Method::POST || method == http::Method::GET
    }

    fn verify(
        &self,
        parts: &Parts,
        body: &Bytes,
        _now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError> {
        if self.secrets.is_empty() {
            return Err(VerifyError::MissingConfiguration { what: "auth token" });
        }
        if parts.headers.contains_key(SIGNATURE_SETTINGS_HEADER) {
            return Err(VerifyError::UnsupportedVersion {
                name: SIGNATURE_HEADER,
            });
        }
        let value = headers::required(&parts.headers, SIGNATURE_HEADER)?;
        let candidates = signature::decode_all(SIGNATURE_HEADER, &[value], Encoding::Base64)?;
        let signed = Signed::classify(parts, body)?;
        let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let mut chunks: Vec<&[u8]> = vec![b"", self.prefix.as_bytes(), path_and_query.as_bytes()];
        if let Signed::Form(params) = &signed {
            chunks.reserve(params.len() * 2);
            for (name, value) in params {
                chunks.push(name.as_bytes());
                chunks.push(value.as_bytes());
            }
        }
        let index = self.match_origins(&mut chunks, &candidates)?;
        if let Signed::BodyHash(expected) = &signed {
            let actual = Sha256::digest(body);
            if !bool::from(actual.as_slice().ct_eq(expected.as_slice())) {
                return Err(VerifyError::SignatureMismatch);
            }
        }
        let id = self.key(&chunks[1..]);
        Ok(VerifiedWebhook::new(PROVIDER, id, body.clone()).with_secret_index(index))
    }

    verifier_settings!(PROVIDER, DEFAULT_TTL);
}

/// The `X-Twilio-Signature` value for a request to `url` (the full URL, as Twilio requests it)
/// with form `params` (unsorted; pass none for a `GET` or a `bodySHA256` URL).
///
/// ```
/// use tower_idempotency_webhooks::twilio;
/// // twilio-python's published test vector (tests/unit/test_request_validator.py).
/// let signature = twilio::sign(
///     "12345",
///     "https://mycompany.com/myapp.php?foo=1&bar=2",
///     &[("CallSid", "CA1234567890ABCDE"), ("Caller", "+14158675309"), ("Digits", "1234"),
///       ("From", "+14158675309"), ("To", "+18005551212")],
/// );
/// assert_eq!(signature, "RSOYDt4T1cUTdK1PDd93/VVr8B8=");
/// ```
pub fn sign(auth_token: impl AsRef<[u8]>, url: &str, params: &[(&str, &str)]) -> String {
    let mut sorted = params.to_vec();
    sorted.sort_unstable();
    let mut chunks: Vec<&[u8]> = vec![url.as_bytes()];
    for (name, value) in &sorted {
        chunks.push(name.as_bytes());
        chunks.push(value.as_bytes());
    }
    Encoding::Base64.encode(&signature::hmac(
        HmacAlgorithm::Sha1,
        auth_token.as_ref(),
        &chunks,
    ))
}

/// `url` with the `bodySHA256` query parameter Twilio adds for a JSON `body`; sign the result
/// with [`sign`] and no parameters.
pub fn url_with_body_sha256(url: &str, body: &[u8]) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!(
        "{url}{separator}{BODY_SHA256_PARAM}={}",
        hex::encode(Sha256::digest(body))
    )
}

/// The fixture the tests and benches sign Twilio (form) deliveries with.
#[cfg(feature = "test-support")]
pub(crate) fn fixture() -> crate::testing::HmacFixture {
    use crate::testing::{Delivery, HmacFixture, PATH, PUBLIC_ORIGIN};

    use http::Method;

    /// The decoded parameters of a form, in order.
    fn params(body: &str) -> Vec<(String, String)> {
        form_urlencoded::parse(body.as_bytes())
            .into_owned()
            .collect()
    }

    HmacFixture::new(
        PROVIDER,
        "twilio-fixture-token",
        Some(SIGNATURE_HEADER),
        |token| Arc::new(TwilioVerifier::new(PUBLIC_ORIGIN, [token]).expect("a valid URL")),
        |id, _| format!("MessageSid={id}&MessageStatus=delivered&To=15551230000"),
        |token, signed, sent, _| {
            let params = params(&signed.body);
            let pairs: Vec<(&str, &str)> = params
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            let signature = sign(token, &format!("{PUBLIC_ORIGIN}{PATH}"), &pairs);
            let headers = vec![
                (SIGNATURE_HEADER, signature),
                ("content-type", "application/x-www-form-urlencoded".into()),
            ];
            Delivery::new(headers, sent.body.clone())
        },
    )
    // A digest of what Twilio signed: the URL, then the parameters sorted.
    .key(|_, delivery| {
        let mut params = params(&delivery.body);
        params.sort_unstable();
        let signed: String = params.iter().map(|(n, v)| format!("{n}{v}")).collect();
        let url = format!("{PUBLIC_ORIGIN}{PATH}{signed}");
        format!("sha256:{}", hex::encode(Sha256::digest(url)))
    })
    .signs_path()
    .other_methods(&[Method::GET])
}
