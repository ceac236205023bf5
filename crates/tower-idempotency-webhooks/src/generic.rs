//! A configurable HMAC verifier for providers without a dedicated module.
//!
//! ```
//! use std::time::Duration;
//! use tower_idempotency_webhooks::generic::{EventId, HmacVerifier, Part};
//! use tower_idempotency_webhooks::{Encoding, HmacAlgorithm};
//!
//! // `X-Acme-Signature: sha256=<hex of HMAC-SHA256("{ts}.{body}")>`, `X-Acme-Timestamp`,
//! // keyed by the body's `/event/id`.
//! let verifier = HmacVerifier::builder("acme")
//!     .secrets(["s3cret-key"])
//!     .signature_header("x-acme-signature")
//!     .prefix("sha256=")
//!     .encoding(Encoding::Hex)
//!     .algorithm(HmacAlgorithm::Sha256)
//!     .timestamp_header("x-acme-timestamp")
//!     .signed_parts([Part::Timestamp, Part::Literal("."), Part::Body])
//!     .event_id(EventId::JsonPointer("/event/id"))
//!     .ttl(Duration::from_secs(2 * 24 * 3600))
//!     .build()
//!     .unwrap();
//! # let _ = verifier;
//! ```

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::request::Parts;
use smallvec::SmallVec;

use crate::{
    error::{ConfigError, VerifyError},
    event_id,
    headers::{self, HeaderKey as _, ParsedName},
    json,
    secret::Secret,
    signature::{self, Encoding, HmacAlgorithm, MAX_SIGNATURES},
    timestamp::{self, replay_window_methods, ReplayWindow},
    verified::VerifiedWebhook,
    verifier::{Verifier, DEFAULT_WEBHOOK_TTL},
};

/// One piece of the signed string, concatenated in order.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Part {
    /// The raw timestamp header value (requires a timestamp header).
    Timestamp,
    /// The event id (requires [`EventId::Header`]).
    Id,
    /// The exact body.
    Body,
    /// A fixed string, e.g. `"."` or `"v0:"`.
    Literal(&'static str),
}

/// Where the event id comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventId {
    /// A header (e.g. `x-acme-delivery`).
    Header(&'static str),
    /// A JSON pointer into the body (e.g. `/id`): a string or an integer.
    ///
    /// A pointer made of object keys (no array index, no `~` escape, at most four deep) is read
    /// by scanning the body for that one field, as the built-in providers do: the first of
    /// repeated keys wins, and the body is validated only up to the field. Other pointers
    /// build the whole document.
    JsonPointer(&'static str),
    /// `sha256:<hex>` of the body, for senders without ids whose retries resend the same bytes.
    BodySha256,
}

/// A verifier for `header: [prefix]<hex|base64 HMAC of the signed parts>`, optionally with
/// several space- or comma-separated signatures.
#[derive(Clone, Debug)]
pub struct HmacVerifier {
    provider: &'static str,
    secrets: Arc<[Secret]>,
    // Header names are parsed once, here, not on every lookup.
    header: ParsedName,
    prefix: &'static str,
    encoding: Encoding,
    algorithm: HmacAlgorithm,
    parts: Vec<Part>,
    timestamp_header: Option<ParsedName>,
    event_id: EventId,
    /// The header of [`EventId::Header`].
    id_header: Option<ParsedName>,
    tolerance: ReplayWindow,
    ttl: Duration,
}

/// Builds an [`HmacVerifier`]; see the [module docs](self).
#[derive(Clone, Debug)]
pub struct HmacVerifierBuilder {
    provider: &'static str,
    secrets: Arc<[Secret]>,
    header: Option<&'static str>,
    prefix: &'static str,
    encoding: Encoding,
    algorithm: HmacAlgorithm,
    parts: Vec<Part>,
    timestamp_header: Option<&'static str>,
    event_id: Option<EventId>,
    tolerance: ReplayWindow,
    ttl: Duration,
}

impl HmacVerifier {
    /// Starts a builder; `provider` is the name and namespace (`[A-Za-z0-9._-]`).
    ///
    /// Defaults: hex, HMAC-SHA256, signed string = body, no prefix, no timestamp, tolerance
    /// 300 s (when a timestamp header is set), TTL one day.
    pub fn builder(provider: &'static str) -> HmacVerifierBuilder {
        HmacVerifierBuilder {
            provider,
            secrets: Arc::from([]),
            header: None,
            prefix: "",
            encoding: Encoding::Hex,
            algorithm: HmacAlgorithm::Sha256,
            parts: vec![Part::Body],
            timestamp_header: None,
            event_id: None,
            tolerance: ReplayWindow::default(),
            ttl: DEFAULT_WEBHOOK_TTL,
        }
    }
}

impl HmacVerifierBuilder {
    /// The secrets (current first).
    pub fn secrets<S: Into<Secret>>(mut self, secrets: impl IntoIterator<Item = S>) -> Self {
        self.secrets = secrets.into_iter().map(Into::into).collect();
        self
    }

    /// The signature header (required).
    pub fn signature_header(mut self, name: &'static str) -> Self {
        self.header = Some(name);
        self
    }

    /// A prefix every signature carries, e.g. `sha256=`.
    pub fn prefix(mut self, prefix: &'static str) -> Self {
        self.prefix = prefix;
        self
    }

    /// Hex or base64.
    pub fn encoding(mut self, encoding: Encoding) -> Self {
        self.encoding = encoding;
        self
    }

    /// SHA-1, SHA-256 or SHA-512.
    pub fn algorithm(mut self, algorithm: HmacAlgorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// The signed string, as a sequence of parts. [`build`](Self::build) refuses a list
    /// without [`Part::Body`], without [`Part::Id`] when the id comes from a header, or with two
    /// of `Timestamp`, `Id` and `Body` side by side without a non-empty literal between them.
    pub fn signed_parts(mut self, parts: impl IntoIterator<Item = Part>) -> Self {
        self.parts = parts.into_iter().collect();
        self
    }

    /// A header holding a unix timestamp in seconds, checked against the replay window. The
    /// signed parts must include [`Part::Timestamp`]: [`build`](Self::build) refuses a
    /// timestamp the signature does not cover, since anyone could rewrite it.
    pub fn timestamp_header(mut self, name: &'static str) -> Self {
        self.timestamp_header = Some(name);
        self
    }

    /// Where the event id comes from (required).
    pub fn event_id(mut self, source: EventId) -> Self {
        self.event_id = Some(source);
        self
    }

    replay_window_methods! {
        /// The replay window; zero panics (see `disable_replay_window`).
        self.tolerance
    }

    /// How long completed deliveries are remembered: set it longer than the sender retries.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Checks the configuration: the required settings are there, every secret is at least
    /// [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes (else [`ConfigError::WeakSecret`]), and
    /// every header name is a valid HTTP header name (any case), else
    /// [`ConfigError::InvalidHeaderName`].
    pub fn build(self) -> Result<HmacVerifier, ConfigError> {
        self.secrets.iter().try_for_each(Secret::check)?;
        let header = self.header.ok_or(ConfigError::Missing {
            what: "signature header",
        })?;
        let event_id = self
            .event_id
            .ok_or(ConfigError::Missing { what: "event id" })?;
        check_signed_parts(&self.parts, &event_id)?;
        if self.parts.contains(&Part::Timestamp) && self.timestamp_header.is_none() {
            return Err(ConfigError::Missing {
                what: "timestamp header (the signed parts use the timestamp)",
            });
        }
        if self.parts.contains(&Part::Id) && !matches!(event_id, EventId::Header(_)) {
            return Err(ConfigError::Missing {
                what: "event id header (the signed parts use the id)",
            });
        }
        let id_header = match event_id {
            EventId::Header(name) => Some(ParsedName::new(name)?),
            _ => None,
        };
        let timestamp_header = self.timestamp_header.map(ParsedName::new).transpose()?;
        // Anyone can rewrite a header the signature does not cover: an unsigned timestamp
        // would let a captured delivery through any replay window.
        if timestamp_header.is_some() && !self.parts.contains(&Part::Timestamp) {
            return Err(ConfigError::Missing {
                what: "the timestamp in the signed parts (an unsigned timestamp header proves nothing)",
            });
        }
        Ok(HmacVerifier {
            provider: self.provider,
            secrets: self.secrets,
            header: ParsedName::new(header)?,
            prefix: self.prefix,
            encoding: self.encoding,
            algorithm: self.algorithm,
            parts: self.parts,
            timestamp_header,
            event_id,
            id_header,
            tolerance: self.tolerance,
            ttl: self.ttl,
        })
    }
}

/// Refuses signed parts a forger could reuse a signature across.
fn check_signed_parts(parts: &[Part], event_id: &EventId) -> Result<(), ConfigError> {
    let refuse = |reason| Err(ConfigError::InvalidSignedParts { reason });
    if parts.is_empty() {
        return refuse("the list is empty, so the signature covers nothing");
    }
    if !parts.contains(&Part::Body) {
        return refuse("the body is not signed, so any body passes under a captured signature");
    }
    if matches!(event_id, EventId::Header(_)) && !parts.contains(&Part::Id) {
        return refuse(
            "the id header is not signed (add Part::Id), so a captured delivery could be \
             replayed under a new id",
        );
    }
    let variable = |part: &Part| !matches!(part, Part::Literal(text) if !text.is_empty());
    let mut previous_variable = false;
    for part in parts {
        if matches!(part, Part::Literal("")) {
            continue;
        }
        let is_variable = variable(part);
        if is_variable && previous_variable {
            return refuse(
                "two of timestamp, id and body are adjacent without a separator literal, so \
                 where one ends and the next begins is not signed",
            );
        }
        previous_variable = is_variable;
    }
    Ok(())
}

impl HmacVerifier {
    fn signed_chunks<'a>(
        &'a self,
        timestamp: Option<&'a str>,
        id: Option<&'a str>,
        body: &'a [u8],
    ) -> SmallVec<[&'a [u8]; 8]> {
        self.parts
            .iter()
            .map(|part| match part {
                Part::Timestamp => timestamp.unwrap_or_default().as_bytes(),
                Part::Id => id.unwrap_or_default().as_bytes(),
                Part::Body => body,
                Part::Literal(text) => text.as_bytes(),
            })
            .collect()
    }

    /// The signature header value this verifier accepts for the given inputs (for tests and
    /// for signing outgoing requests to your own receivers).
    pub fn sign(
        &self,
        secret: impl AsRef<[u8]>,
        timestamp: Option<u64>,
        id: Option<&str>,
        body: &[u8],
    ) -> String {
        let ts = timestamp.map(|t| t.to_string());
        let chunks = self.signed_chunks(ts.as_deref(), id, body);
        let mac = signature::hmac(self.algorithm, secret.as_ref(), &chunks);
        format!("{}{}", self.prefix, self.encoding.encode(&mac))
    }
}

/// The timestamp header of a delivery: its label, its raw value (signed as is) and the Unix
/// seconds it names.
struct SignedAt<'a> {
    header: &'static str,
    text: &'a str,
    seconds: u64,
}

impl HmacVerifier {
    /// The signatures in the header `value`, bounded in number before any is decoded.
    fn signatures<'a>(
        &self,
        value: &'a str,
        name: &'static str,
    ) -> Result<SmallVec<[&'a str; 2]>, VerifyError> {
        let mut signatures = SmallVec::new();
        // Members are separated by commas and/or ASCII whitespace. Splitting on `,` first (a
        // memchr search) and then on whitespace (byte tests) gives the same members as one
        // `char` predicate, which would decode each character of the signatures
        // (`scripts/verify-instructions.sh generic_hmac` counts the difference).
        for member in value.split(',').flat_map(str::split_ascii_whitespace) {
            if signatures.len() == MAX_SIGNATURES {
                return Err(VerifyError::MalformedHeader {
                    name,
                    reason: "too many signatures",
                });
            }
            match member.strip_prefix(self.prefix) {
                Some(signature) => signatures.push(signature),
                None if member.contains('=') && !self.prefix.is_empty() => {}
                None => {
                    return Err(VerifyError::MalformedHeader {
                        name,
                        reason: "signature without the expected prefix",
                    })
                }
            }
        }
        if signatures.is_empty() {
            return Err(VerifyError::UnsupportedVersion { name });
        }
        Ok(signatures)
    }

    /// The delivery's timestamp, when this verifier reads one.
    fn signed_timestamp<'a>(&self, parts: &'a Parts) -> Result<Option<SignedAt<'a>>, VerifyError> {
        let Some(header) = &self.timestamp_header else {
            return Ok(None);
        };
        let text = headers::required(&parts.headers, header)?;
        let header = header.label();
        let seconds = timestamp::parse_unix(header, text)?;
        Ok(Some(SignedAt {
            header,
            text,
            seconds,
        }))
    }

    /// The event id, and the body's document when reading the id built it.
    fn event_id(
        &self,
        body: &[u8],
        header_id: Option<String>,
    ) -> Result<(String, Option<serde_json::Value>), VerifyError> {
        match (&self.event_id, header_id) {
            (_, Some(id)) => Ok((id, None)),
            // Most pointers name object keys: scan for the one field instead of building the
            // document, which costs several HMACs (bench `verify`, `generic_json_pointer`);
            // `json()` then builds it only if asked.
            (EventId::JsonPointer(pointer), None) if json::scannable_pointer(pointer) => {
                let [value] = json::fields(body, [*pointer])?;
                Ok((event_id::scalar_id(value, pointer)?, None))
            }
            (EventId::JsonPointer(pointer), None) => {
                let value = json::parse(body)?;
                let id = event_id::json_id(&value, pointer)?;
                Ok((id, Some(value)))
            }
            _ => Ok((event_id::body_digest_id(body), None)),
        }
    }
}

impl Verifier for HmacVerifier {
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
        let value = headers::required(&parts.headers, &self.header)?;
        let name = (&self.header).label();
        let signatures = self.signatures(value, name)?;
        let timestamp = self.signed_timestamp(parts)?;
        let header_id = match &self.id_header {
            Some(header) => Some(event_id::header_id(&parts.headers, header)?),
            None => None,
        };
        let candidates = signature::decode_all(name, &signatures, self.encoding)?;
        let index = {
            let text = timestamp.as_ref().map(|t| t.text);
            let chunks = self.signed_chunks(text, header_id.as_deref(), body);
            signature::match_hmac(self.algorithm, &self.secrets, &chunks, &candidates)?
        };
        if let Some(SignedAt {
            header, seconds, ..
        }) = timestamp
        {
            self.tolerance.check(header, seconds, now)?;
        }
        let (id, json) = self.event_id(body, header_id)?;
        let mut webhook =
            VerifiedWebhook::new(self.provider, id, body.clone()).with_secret_index(index);
        // `build` refuses a header id the signed parts leave out, so both are signed.
        let signed = [&self.timestamp_header, &self.id_header];
        webhook = webhook.with_signed_headers(signed.into_iter().flatten().map(|h| h.label()));
        if let Some(SignedAt { seconds, .. }) = timestamp {
            webhook = webhook.with_signed_at(seconds);
        }
        if let Some(json) = json {
            webhook = webhook.with_json(json);
        }
        Ok(webhook)
    }
}
