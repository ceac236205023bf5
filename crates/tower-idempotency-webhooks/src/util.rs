//! Shared parsing and crypto helpers: bounded header access, strict timestamps, HMAC with
//! constant-time comparison over every (secret, signature) pair.

// Each helper serves some providers; a build with only a subset of the provider features
// leaves the others unused.
#![allow(dead_code)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use http::{
    header::{GetAll, HeaderName, HeaderValue},
    HeaderMap,
};
use sha2::{Digest, Sha256};
use smallvec::SmallVec;
use subtle::ConstantTimeEq;

use crate::{error::VerifyError, secret::Secret};

/// Longest header value parsed, in bytes.
pub const MAX_HEADER_LEN: usize = 8 * 1024;
/// Most signatures accepted in one header (rotation rarely needs more than two).
pub const MAX_SIGNATURES: usize = 16;
/// Most asymmetric (Ed25519) signatures one header may carry. Each costs a hash of the whole
/// body per public key before anything is authenticated, where an HMAC costs one per secret
/// for all candidates; providers send one per active key (two during a rotation).
pub const MAX_ASYMMETRIC_SIGNATURES: usize = 4;
/// The default replay window, in both directions.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);
const MAX_ITEMS: usize = 2 * MAX_SIGNATURES + 4;
const MAX_EVENT_ID: usize = 255;
/// Longest MAC of the supported algorithms (HMAC-SHA512).
const MAX_MAC_LEN: usize = 64;

/// One signature from a header, decoded and held inline.
///
/// A delivery carries one signature, two during a secret roll; at 1 KiB bodies the heap
/// allocations of a `Vec<Vec<u8>>` per delivery were a measurable share of the verification.
#[derive(Clone, Copy)]
pub(crate) struct Candidate {
    bytes: [u8; MAX_MAC_LEN],
    /// 0 for a well-formed signature longer than any MAC: the empty slice matches nothing.
    len: usize,
}

impl Candidate {
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The signatures of one delivery: inline up to two, the common case.
pub(crate) type Candidates = SmallVec<[Candidate; 2]>;

/// The hash behind an HMAC scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HmacAlgorithm {
    /// HMAC-SHA1 (Twilio; legacy schemes only).
    Sha1,
    /// HMAC-SHA256.
    Sha256,
    /// HMAC-SHA512.
    Sha512,
}

/// How a signature is written in its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Encoding {
    /// Hexadecimal, either case.
    Hex,
    /// Standard base64 with padding.
    Base64,
}

impl Encoding {
    /// The signature bytes; `None` when `text` is not in this encoding or is empty (an empty
    /// signature is malformed input, whatever the provider, not a signature that fails to match).
    pub(crate) fn decode(self, text: &str) -> Option<Vec<u8>> {
        if text.is_empty() {
            return None;
        }
        match self {
            // `decode_to_slice` is a plain loop; `hex::decode` collects through an iterator of
            // `Result`s, which shows in the verify profile (`cargo bench --bench verify`).
            Self::Hex => {
                let mut out = vec![0; text.len() / 2];
                hex::decode_to_slice(text, &mut out).ok().map(|()| out)
            }
            Self::Base64 => base64::engine::general_purpose::STANDARD.decode(text).ok(),
        }
    }

    /// [`decode`](Self::decode) into an inline [`Candidate`]: `None` exactly when `decode` is.
    pub(crate) fn decode_candidate(self, text: &str) -> Option<Candidate> {
        if text.is_empty() {
            return None;
        }
        let mut candidate = Candidate {
            bytes: [0; MAX_MAC_LEN],
            len: 0,
        };
        let len = match self {
            Self::Hex if text.len() / 2 <= MAX_MAC_LEN => {
                let len = text.len() / 2;
                // const-hex decodes with a lookup table (SIMD where available), without
                // `hex`'s per-digit `match` and its mispredicted branches
                // (`scripts/verify-instructions.sh` counts them). It would strip a `0x` prefix,
                // but the output is sized from the whole text, so a prefixed signature fails
                // on its length.
                const_hex::decode_to_slice(text, &mut candidate.bytes[..len])
                    .ok()
                    .map(|()| len)
            }
            Self::Base64 => match base64::engine::general_purpose::STANDARD
                .decode_slice(text, &mut candidate.bytes)
            {
                Ok(len) => Some(len),
                Err(base64::DecodeSliceError::DecodeError(_)) => None,
                Err(base64::DecodeSliceError::OutputSliceTooSmall) => self.decode(text).map(|_| 0),
            },
            // Longer than any MAC: if it decodes, it is a signature that does not match (401),
            // not a malformed one (400).
            Self::Hex => self.decode(text).map(|_| 0),
        };
        candidate.len = len?;
        Some(candidate)
    }

    pub(crate) fn encode(self, bytes: &[u8]) -> String {
        match self {
            Self::Hex => hex::encode(bytes),
            Self::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
        }
    }
}

/// Computes an HMAC over the concatenation of `chunks`.
pub(crate) fn hmac(algorithm: HmacAlgorithm, key: &[u8], chunks: &[&[u8]]) -> Vec<u8> {
    fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], chunks: &[&[u8]]) -> Vec<u8> {
        let mut mac = <M as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
        for chunk in chunks {
            mac.update(chunk);
        }
        mac.finalize().into_bytes().to_vec()
    }
    match algorithm {
        HmacAlgorithm::Sha1 => run::<Hmac<sha1::Sha1>>(key, chunks),
        HmacAlgorithm::Sha256 => run::<Hmac<Sha256>>(key, chunks),
        HmacAlgorithm::Sha512 => run::<Hmac<sha2::Sha512>>(key, chunks),
    }
}

/// Tries every secret against every candidate signature; returns the index of the matching
/// secret. Each MAC is computed once per secret (from the secret's cached keyed state) and
/// compared in constant time.
pub(crate) fn match_hmac(
    algorithm: HmacAlgorithm,
    secrets: &[Secret],
    chunks: &[&[u8]],
    candidates: &[Candidate],
) -> Result<usize, VerifyError> {
    fn mac_matches<M: Mac>(mut mac: M, chunks: &[&[u8]], candidates: &[Candidate]) -> bool {
        for chunk in chunks {
            mac.update(chunk);
        }
        let expected = mac.finalize().into_bytes();
        let mut found = subtle::Choice::from(0);
        for candidate in candidates {
            // Lengths are public (fixed per algorithm); `ct_eq` returns false on a mismatch.
            found |= expected.as_slice().ct_eq(candidate.as_bytes());
        }
        bool::from(found)
    }
    if secrets.is_empty() {
        return Err(VerifyError::MissingConfiguration { what: "secret" });
    }
    for (index, secret) in secrets.iter().enumerate() {
        let matched = match algorithm {
            HmacAlgorithm::Sha1 => mac_matches(secret.hmac_sha1(), chunks, candidates),
            HmacAlgorithm::Sha256 => mac_matches(secret.hmac_sha256(), chunks, candidates),
            HmacAlgorithm::Sha512 => mac_matches(secret.hmac_sha512(), chunks, candidates),
        };
        if matched {
            return Ok(index);
        }
    }
    Err(VerifyError::SignatureMismatch)
}

/// Constant-time equality that also hides the length of the secret: both sides are hashed.
pub(crate) fn token_eq(a: &[u8], b: &[u8]) -> bool {
    let a = Sha256::digest(a);
    let b = Sha256::digest(b);
    bool::from(a.as_slice().ct_eq(b.as_slice()))
}

/// Decodes candidate signatures; undecodable ones are dropped, and if none is left the header
/// is malformed.
pub(crate) fn decode_all(
    name: &'static str,
    encoded: &[&str],
    encoding: Encoding,
) -> Result<Candidates, VerifyError> {
    let decoded: Candidates = encoded
        .iter()
        .filter_map(|text| encoding.decode_candidate(text))
        .collect();
    if decoded.is_empty() {
        return Err(VerifyError::MalformedHeader {
            name,
            reason: match encoding {
                _ if encoded.iter().all(|text| text.is_empty()) => "empty signature",
                Encoding::Hex => "signature is not hexadecimal",
                Encoding::Base64 => "signature is not base64",
            },
        });
    }
    Ok(decoded)
}

/// A header to look up: a name as text, parsed on every lookup, or a pre-parsed
/// `&'static HeaderName`, which the providers on the hot path use because parsing the name is a
/// visible share of the work besides the HMAC (`scripts/verify-instructions.sh` counts it).
pub(crate) trait HeaderKey: Copy {
    /// The name, for errors.
    fn label(self) -> &'static str;
    /// Every value of the header.
    fn get_all(self, headers: &HeaderMap) -> GetAll<'_, HeaderValue>;
}

impl HeaderKey for &'static str {
    fn label(self) -> &'static str {
        self
    }

    fn get_all(self, headers: &HeaderMap) -> GetAll<'_, HeaderValue> {
        headers.get_all(self)
    }
}

impl HeaderKey for &'static HeaderName {
    fn label(self) -> &'static str {
        self.as_str()
    }

    fn get_all(self, headers: &HeaderMap) -> GetAll<'_, HeaderValue> {
        headers.get_all(self)
    }
}

/// A header name configured at run time (the generic verifier's), parsed once when the
/// verifier is built, with its text for errors.
#[derive(Clone, Debug)]
pub(crate) struct ParsedName {
    name: HeaderName,
    label: &'static str,
}

impl ParsedName {
    pub(crate) fn new(label: &'static str) -> Result<Self, crate::ConfigError> {
        let name = HeaderName::from_bytes(label.as_bytes())
            .map_err(|_| crate::ConfigError::InvalidHeaderName { name: label })?;
        Ok(Self { name, label })
    }
}

impl HeaderKey for &ParsedName {
    fn label(self) -> &'static str {
        self.label
    }

    fn get_all(self, headers: &HeaderMap) -> GetAll<'_, HeaderValue> {
        headers.get_all(&self.name)
    }
}

/// The single value of a header, bounded and visible ASCII; `None` when absent.
pub(crate) fn header(
    headers: &HeaderMap,
    key: impl HeaderKey,
) -> Result<Option<&str>, VerifyError> {
    let name = key.label();
    let mut values = key.get_all(headers).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(VerifyError::DuplicateHeader { name });
    }
    if value.len() > MAX_HEADER_LEN {
        return Err(VerifyError::HeaderTooLarge {
            name,
            limit: MAX_HEADER_LEN,
        });
    }
    let text = value.to_str().map_err(|_| VerifyError::MalformedHeader {
        name,
        reason: "not visible ASCII",
    })?;
    // Visible ASCII (checked just above): ASCII trimming is enough, and cheaper.
    let text = text.trim_ascii();
    if text.is_empty() {
        return Err(VerifyError::MalformedHeader {
            name,
            reason: "empty",
        });
    }
    Ok(Some(text))
}

/// Like [`header`], but absence is an error.
pub(crate) fn required(headers: &HeaderMap, key: impl HeaderKey) -> Result<&str, VerifyError> {
    header(headers, key)?.ok_or(VerifyError::MissingHeader { name: key.label() })
}

/// Splits a `k=v<sep>k=v` header into bounded pairs.
///
/// These headers (Stripe's `t=..,v1=..`, Paddle's `ts=..;h1=..`) are not RFC 8941 structured
/// fields: Stripe's list members are bare `key=hex` tokens that an sfv parser would treat as
/// dictionary keys with token values only by accident, and Paddle uses `;`, which RFC 8941
/// reserves for parameters. Their whole grammar is "split on the separator, then on the first
/// `=`", which is what this does, strictly (no empty members, no member without `=`) and with a
/// bound on the member count.
pub(crate) fn kv_pairs<'a>(
    name: &'static str,
    value: &'a str,
    separator: char,
) -> Result<Vec<(&'a str, &'a str)>, VerifyError> {
    kv_members(name, value, separator).collect()
}

/// [`kv_pairs`] as an iterator, for the verifiers, which need no list of the members.
fn kv_members<'a>(
    name: &'static str,
    value: &'a str,
    separator: char,
) -> impl Iterator<Item = Result<(&'a str, &'a str), VerifyError>> + 'a {
    value
        .split(separator)
        .enumerate()
        .map(move |(index, member)| {
            if index == MAX_ITEMS {
                return Err(VerifyError::MalformedHeader {
                    name,
                    reason: "too many members",
                });
            }
            let (key, val) = member.split_once('=').ok_or(VerifyError::MalformedHeader {
                name,
                reason: "member without `=`",
            })?;
            let (key, val) = (key.trim(), val.trim());
            if key.is_empty() || val.is_empty() {
                return Err(VerifyError::MalformedHeader {
                    name,
                    reason: "empty member",
                });
            }
            Ok((key, val))
        })
}

/// Reads a `k=v<sep>k=v` signature header (Stripe's `t=..,v1=..`, Paddle's `ts=..;h1=..`) into
/// its one timestamp and its signatures, both still as text.
///
/// Members with other keys are other schemes: ignored, but a header with only those is
/// [`VerifyError::UnsupportedVersion`] rather than malformed, so a scheme upgrade on the
/// provider's side is reported as such.
pub(crate) fn timestamped_signatures<'a>(
    name: &'static str,
    value: &'a str,
    separator: char,
    timestamp_key: &str,
    signature_key: &str,
) -> Result<(&'a str, SmallVec<[&'a str; 2]>), VerifyError> {
    let mut timestamp = None;
    let mut signatures = SmallVec::new();
    let mut other_schemes = false;
    for member in kv_members(name, value, separator) {
        let (key, val) = member?;
        if key == timestamp_key {
            if timestamp.replace(val).is_some() {
                return Err(VerifyError::MalformedHeader {
                    name,
                    reason: "timestamp appears twice",
                });
            }
        } else if key == signature_key {
            signatures.push(val);
        } else {
            other_schemes = true;
        }
    }
    let timestamp = timestamp.ok_or(VerifyError::MalformedHeader {
        name,
        reason: "no timestamp",
    })?;
    if signatures.is_empty() {
        return Err(if other_schemes {
            VerifyError::UnsupportedVersion { name }
        } else {
            VerifyError::MalformedHeader {
                name,
                reason: "no signature",
            }
        });
    }
    if signatures.len() > MAX_SIGNATURES {
        return Err(VerifyError::MalformedHeader {
            name,
            reason: "too many signatures",
        });
    }
    Ok((timestamp, signatures))
}

/// A `t=<unix><sep>v1=<hex>..` scheme (Stripe, Paddle): HMAC-SHA256 over
/// `{timestamp}{joiner}{body}`, any of several signatures may match.
pub(crate) struct TimestampedScheme {
    /// The signature header.
    pub(crate) header: HeaderName,
    /// Between members.
    pub(crate) separator: char,
    /// The key of the timestamp member.
    pub(crate) timestamp_key: &'static str,
    /// The key of the signature members.
    pub(crate) signature_key: &'static str,
    /// Between the timestamp and the body in the signed bytes.
    pub(crate) joiner: &'static [u8],
}

impl TimestampedScheme {
    /// Verifies the header against `body`: returns the signed time and the matching secret.
    pub(crate) fn verify(
        &'static self,
        headers: &HeaderMap,
        body: &[u8],
        secrets: &[Secret],
        now: SystemTime,
        tolerance: Option<Duration>,
    ) -> Result<(u64, usize), VerifyError> {
        let value = required(headers, &self.header)?;
        let name = self.header.as_str();
        let (timestamp, signatures) = timestamped_signatures(
            name,
            value,
            self.separator,
            self.timestamp_key,
            self.signature_key,
        )?;
        let signed = parse_unix(name, timestamp)?;
        let candidates = decode_all(name, &signatures, Encoding::Hex)?;
        let index = match_hmac(
            HmacAlgorithm::Sha256,
            secrets,
            &[timestamp.as_bytes(), self.joiner, body],
            &candidates,
        )?;
        check_window(name, signed, now, tolerance)?;
        Ok((signed, index))
    }

    /// The header value the provider would send for `body` at `timestamp`.
    pub(crate) fn sign(&self, secret: &[u8], timestamp: u64, body: &[u8]) -> String {
        let ts = timestamp.to_string();
        let mac = hmac(
            HmacAlgorithm::Sha256,
            secret,
            &[ts.as_bytes(), self.joiner, body],
        );
        format!(
            "{}={ts}{}{}={}",
            self.timestamp_key,
            self.separator,
            self.signature_key,
            hex::encode(mac)
        )
    }
}

/// Parses a unix timestamp in seconds: 1 to 19 ASCII digits, nothing else.
pub(crate) fn parse_unix(name: &'static str, text: &str) -> Result<u64, VerifyError> {
    if text.is_empty() || text.len() > 19 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(VerifyError::InvalidTimestamp { name });
    }
    text.parse()
        .map_err(|_| VerifyError::InvalidTimestamp { name })
}

/// Checks `signed` (unix seconds) against `now`; `tolerance` of `None` disables the check.
pub(crate) fn check_window(
    name: &'static str,
    signed: u64,
    now: SystemTime,
    tolerance: Option<Duration>,
) -> Result<(), VerifyError> {
    let signed_at = UNIX_EPOCH
        .checked_add(Duration::from_secs(signed))
        .ok_or(VerifyError::InvalidTimestamp { name })?;
    let Some(tolerance) = tolerance else {
        return Ok(());
    };
    let (skew, past) = match now.duration_since(signed_at) {
        Ok(age) => (age, true),
        Err(ahead) => (ahead.duration(), false),
    };
    if skew > tolerance {
        let secs = i64::try_from(skew.as_secs()).unwrap_or(i64::MAX);
        return Err(VerifyError::TimestampOutsideTolerance {
            skew_secs: if past { -secs } else { secs },
            tolerance_secs: tolerance.as_secs(),
        });
    }
    Ok(())
}

/// `Some(d)`.
///
/// # Panics
/// On zero, which reads as "no tolerance" but would disable the check: the verifiers'
/// `disable_replay_window` says that.
pub(crate) fn tolerance(duration: Duration) -> Option<Duration> {
    assert!(
        !duration.is_zero(),
        "a zero replay window would disable the timestamp check; call disable_replay_window() \
         to turn it off"
    );
    Some(duration)
}

/// Parses the body as JSON, keeping the first of repeated object keys as [`json_fields`] does
/// (serde_json's own `Value` keeps the last), so the id a delivery is keyed by and the document
/// the handler reads never disagree.
pub(crate) fn parse_json(body: &[u8]) -> Result<serde_json::Value, VerifyError> {
    use serde::de::DeserializeSeed as _;
    let mut de = serde_json::Deserializer::from_slice(body);
    first_wins::Document
        .deserialize(&mut de)
        .and_then(|value| de.end().map(|()| value))
        .map_err(|_| VerifyError::BodyNotJson)
}

mod first_wins {
    use std::fmt;

    use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
    use serde_json::{Map, Number, Value};

    /// A JSON document as a [`Value`], the first of repeated object keys kept.
    pub(super) struct Document;

    impl<'de> DeserializeSeed<'de> for Document {
        type Value = Value;

        fn deserialize<D: de::Deserializer<'de>>(self, de: D) -> Result<Value, D::Error> {
            de.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Document {
        type Value = Value;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }

        fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
            Ok(Value::Number(v.into()))
        }

        fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
            Ok(Value::Number(v.into()))
        }

        fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
            Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
        }

        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_owned()))
        }

        fn visit_string<E>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }

        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element_seed(Document)? {
                items.push(item);
            }
            Ok(Value::Array(items))
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
            let mut object = Map::new();
            while let Some(key) = map.next_key::<String>()? {
                let value = map.next_value_seed(Document)?;
                merge(&mut object, key, value);
            }
            Ok(Value::Object(object))
        }
    }

    /// Adds `key: value` to `object` as the field reader sees repeated keys: the first value
    /// wins, except that two objects under one key are merged (the field reader finds a field
    /// in either), again first wins inside.
    fn merge(object: &mut Map<String, Value>, key: String, value: Value) {
        match (object.get_mut(&key), value) {
            (None, value) => {
                object.insert(key, value);
            }
            (Some(Value::Object(first)), Value::Object(later)) => {
                for (key, value) in later {
                    merge(first, key, value);
                }
            }
            (Some(_), _) => {}
        }
    }
}

/// A scalar read by [`json_fields`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Scalar {
    /// A string.
    Str(String),
    /// A non-negative integer.
    U64(u64),
    /// A negative integer.
    I64(i64),
    /// A number with a fraction or an exponent, as the bits of the `f64` serde_json read.
    Float(u64),
    /// Anything else (bool, null, object, array).
    Other,
}

impl Scalar {
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn as_u64(&self) -> Option<u64> {
        match self {
            Self::U64(n) => Some(*n),
            _ => None,
        }
    }

    /// A non-negative integer, also when written with a fraction or an exponent
    /// (`1700000000000.0`, `17e11`), as long as the value is whole and exact in an `f64`.
    pub(crate) fn as_whole(&self) -> Option<u64> {
        const EXACT: f64 = (1u64 << f64::MANTISSA_DIGITS) as f64;
        match self {
            Self::U64(n) => Some(*n),
            Self::Float(bits) => {
                let v = f64::from_bits(*bits);
                // `as` is exact here: a whole value in 0..2^53.
                ((0.0..EXACT).contains(&v) && v.fract() == 0.0).then_some(v as u64)
            }
            _ => None,
        }
    }
}

/// Reads the scalars at `pointers` (object keys only, e.g. `/event-data/id`) from the JSON
/// `body` in one pass, without building the document: on large bodies, building a
/// `serde_json::Value` costs many times the HMAC. Handlers that want the document parse it
/// lazily ([`VerifiedWebhook::json`](crate::VerifiedWebhook::json)).
///
/// Parsing stops as soon as every pointer was found, so only the body up to the last needed
/// field is validated (the body is authenticated; a later syntax error surfaces in `json()`),
/// and the first of repeated keys wins. A body that ends before all are found must be one
/// complete JSON document, else [`VerifyError::BodyNotJson`].
pub(crate) fn json_fields<const N: usize>(
    body: &[u8],
    pointers: [&str; N],
) -> Result<Fields<N>, VerifyError> {
    json_fields_until(body, pointers, |found| found.iter().all(Option::is_some))
}

/// [`json_fields`], stopping as soon as `done` holds for what was found so far (for fields
/// that are only needed depending on others).
///
/// Two scans, one answer: a hand-written scan of the common case (`json_fast`: plain keys and
/// values, several times cheaper at 1 KiB) answers when it is sure to agree with serde_json,
/// and serde_json's scan answers everything else.
///
/// Allocation-free apart from the scalars found (and, usually, serde_json's own syntax error
/// for the early stop): the pointers are split on the stack, and which of them are still
/// possible below an object is a bit set, because at 1 KiB the bookkeeping allocations cost as
/// much as the scan.
pub(crate) fn json_fields_until<const N: usize>(
    body: &[u8],
    pointers: [&str; N],
    done: impl Fn(&[Option<Scalar>]) -> bool,
) -> Result<Fields<N>, VerifyError> {
    let paths = json_paths(pointers);
    match json_fields_fast(body, &paths, &done) {
        Some(found) => Ok(found),
        None => json_fields_serde(body, &paths, &done),
    }
}

/// What [`json_fields`] reads: one value per pointer.
pub(crate) type Fields<const N: usize> = [Option<Scalar>; N];

fn json_paths<const N: usize>(pointers: [&str; N]) -> [json_seed::Path<'_>; N] {
    const {
        assert!(
            N >= 1 && N <= 32,
            "json_fields reads 1 to 32 pointers (a u32 bit set)"
        )
    };
    pointers.map(json_seed::Path::new)
}

/// The fast scan of [`json_fields_until`]: `None` where it is unsure.
fn json_fields_fast<const N: usize>(
    body: &[u8],
    paths: &[json_seed::Path<'_>; N],
    done: &dyn Fn(&[Option<Scalar>]) -> bool,
) -> Option<Fields<N>> {
    let mut out: Fields<N> = std::array::from_fn(|_| None);
    json_fast::scan(body, paths, &mut out, done)
        .ok()
        .map(|()| out)
}

/// The serde_json scan of [`json_fields_until`], which answers for every body.
fn json_fields_serde<const N: usize>(
    body: &[u8],
    paths: &[json_seed::Path<'_>; N],
    done: &dyn Fn(&[Option<Scalar>]) -> bool,
) -> Result<Fields<N>, VerifyError> {
    use serde::de::DeserializeSeed as _;
    let mut out: Fields<N> = std::array::from_fn(|_| None);
    let stopped = std::cell::Cell::new(false);
    let mut de = serde_json::Deserializer::from_slice(body);
    let result = json_seed::Seed {
        depth: 0,
        paths,
        candidates: u32::MAX >> (32 - N),
        out: &mut out,
        done,
        stopped: &stopped,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    match result {
        Ok(()) => Ok(out),
        Err(_) if stopped.get() => Ok(out),
        Err(_) => Err(VerifyError::BodyNotJson),
    }
}

/// Whether [`json_fields`] reads `pointer` as [`serde_json::Value::pointer`] does: object keys
/// only (no segment that could index an array, no `~` escape), at most four deep.
pub(crate) fn scannable_pointer(pointer: &str) -> bool {
    let Some(rest) = pointer.strip_prefix('/') else {
        return false;
    };
    let mut depth = 0;
    rest.split('/').all(|segment| {
        depth += 1;
        let index = !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit());
        depth <= json_seed::MAX_DEPTH && !index && !segment.contains('~')
    })
}

/// Both scans of [`json_fields_until`] on their own, for the differential tests: the fast one
/// (`None` where it is unsure) and the serde_json one.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn json_fields_both<const N: usize>(
    body: &[u8],
    pointers: [&'static str; N],
    done: &dyn Fn(&[Option<Scalar>]) -> bool,
) -> (Option<Fields<N>>, Result<Fields<N>, VerifyError>) {
    let paths = json_paths(pointers);
    (
        json_fields_fast(body, &paths, done),
        json_fields_serde(body, &paths, done),
    )
}

mod json_fast;

mod json_seed {
    use std::{borrow::Cow, cell::Cell, fmt};

    use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

    use super::Scalar;

    /// Deepest pointer the scan reads (the providers' go three levels down).
    pub(super) const MAX_DEPTH: usize = 4;

    /// A JSON pointer of object keys, split into its segments.
    pub(super) struct Path<'p> {
        pub(super) segments: [&'p str; MAX_DEPTH],
        pub(super) len: usize,
    }

    impl<'p> Path<'p> {
        pub(super) fn new(pointer: &'p str) -> Self {
            let mut path = Self {
                segments: [""; MAX_DEPTH],
                len: 0,
            };
            // Split by hand: `str::split`'s searcher is a noticeable share of a 1 KiB
            // verification that runs this for every delivery
            // (`scripts/verify-instructions.sh 1024 generic_json_pointer`).
            // As `pointer.split('/').skip(1)`: no segment before the first `/`.
            let Some(start) = pointer.bytes().position(|b| b == b'/') else {
                return path;
            };
            let mut rest = &pointer[start + 1..];
            loop {
                assert!(path.len < MAX_DEPTH, "JSON pointer {pointer} is too deep");
                let end = rest.bytes().position(|b| b == b'/');
                path.segments[path.len] = &rest[..end.unwrap_or(rest.len())];
                path.len += 1;
                match end {
                    Some(end) => rest = &rest[end + 1..],
                    None => return path,
                }
            }
        }
    }

    /// Bit `i` of `mask`, for each `i` set, lowest first.
    pub(super) fn bits(mut mask: u32) -> impl Iterator<Item = usize> {
        std::iter::from_fn(move || {
            let bit = mask.trailing_zeros() as usize;
            (mask != 0).then(|| {
                mask &= mask - 1;
                bit
            })
        })
    }

    pub(super) struct Seed<'s, 'p> {
        pub(super) depth: usize,
        pub(super) paths: &'s [Path<'p>],
        /// The paths whose first `depth` segments led here.
        pub(super) candidates: u32,
        pub(super) out: &'s mut [Option<Scalar>],
        pub(super) done: &'s dyn Fn(&[Option<Scalar>]) -> bool,
        pub(super) stopped: &'s Cell<bool>,
    }

    /// Records `value()` for every path among `candidates` that ends at `depth` and has no
    /// value yet (the first of repeated keys wins); `value` runs only if one does.
    pub(super) fn record(
        paths: &[Path<'_>],
        depth: usize,
        candidates: u32,
        out: &mut [Option<Scalar>],
        value: impl FnOnce() -> Scalar,
    ) {
        let ending = bits(candidates)
            .filter(|&i| paths[i].len == depth && out[i].is_none())
            .fold(0u32, |mask, i| mask | 1 << i);
        if ending == 0 {
            return;
        }
        // The value moves into the last path that ends here; any others get copies.
        let value = value();
        let last = 31 - ending.leading_zeros() as usize;
        for index in bits(ending & !(1 << last)) {
            out[index] = Some(value.clone());
        }
        out[last] = Some(value);
    }

    impl Seed<'_, '_> {
        fn set(&mut self, value: Scalar) {
            record(self.paths, self.depth, self.candidates, self.out, || value);
        }
    }

    impl<'de> DeserializeSeed<'de> for Seed<'_, '_> {
        type Value = ();

        fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
            deserializer.deserialize_any(self)
        }
    }

    struct Key<'de>(Cow<'de, str>);

    impl<'de> de::Deserialize<'de> for Key<'de> {
        fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct KeyVisitor;
            impl<'de> Visitor<'de> for KeyVisitor {
                type Value = Key<'de>;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("an object key")
                }
                fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                    Ok(Key(Cow::Borrowed(v)))
                }
                fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                    Ok(Key(Cow::Owned(v.to_owned())))
                }
            }
            deserializer.deserialize_str(KeyVisitor)
        }
    }

    impl<'de> Visitor<'de> for Seed<'_, '_> {
        type Value = ();

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_str<E>(mut self, v: &str) -> Result<(), E> {
            self.set(Scalar::Str(v.to_owned()));
            Ok(())
        }

        fn visit_u64<E>(mut self, v: u64) -> Result<(), E> {
            self.set(Scalar::U64(v));
            Ok(())
        }

        fn visit_i64<E>(mut self, v: i64) -> Result<(), E> {
            self.set(if v >= 0 {
                Scalar::U64(v.unsigned_abs())
            } else {
                Scalar::I64(v)
            });
            Ok(())
        }

        fn visit_f64<E>(mut self, v: f64) -> Result<(), E> {
            self.set(Scalar::Float(v.to_bits()));
            Ok(())
        }

        fn visit_bool<E>(mut self, _: bool) -> Result<(), E> {
            self.set(Scalar::Other);
            Ok(())
        }

        fn visit_unit<E>(mut self) -> Result<(), E> {
            self.set(Scalar::Other);
            Ok(())
        }

        fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
            self.set(Scalar::Other);
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(())
        }

        fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
            self.set(Scalar::Other);
            let depth = self.depth;
            while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
                let children = bits(self.candidates)
                    .filter(|&i| {
                        let path = &self.paths[i];
                        path.len > depth && path.segments[depth] == key.as_ref()
                    })
                    .fold(0u32, |mask, i| mask | 1 << i);
                if children == 0 {
                    map.next_value::<IgnoredAny>()?;
                } else {
                    map.next_value_seed(Seed {
                        depth: depth + 1,
                        paths: self.paths,
                        candidates: children,
                        out: self.out,
                        done: self.done,
                        stopped: self.stopped,
                    })?;
                    if self.stopped.get() || (self.done)(self.out) {
                        // Everything needed is read: abandon the parse. Returning early leaves
                        // the object unfinished, so serde_json usually fails the enclosing parse
                        // with its own syntax error (none when the field was the object's last
                        // member); the caller treats either as success. (A custom error would
                        // format a message and search it for a position on every delivery.)
                        self.stopped.set(true);
                        return Ok(());
                    }
                }
            }
            Ok(())
        }
    }
}

/// An event id from a [`json_fields`] result: a string or an integer, like [`json_id`].
pub(crate) fn scalar_id(
    value: Option<Scalar>,
    pointer: &'static str,
) -> Result<String, VerifyError> {
    let id = match value {
        Some(Scalar::Str(s)) => s,
        Some(Scalar::U64(n)) => n.to_string(),
        Some(Scalar::I64(n)) => n.to_string(),
        _ => return Err(VerifyError::MissingEventId { location: pointer }),
    };
    check_id(id, pointer)
}

/// Reads an event id (a string or an integer) at `pointer` in `json`.
pub(crate) fn json_id(
    json: &serde_json::Value,
    pointer: &'static str,
) -> Result<String, VerifyError> {
    let id = match json.pointer(pointer) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Number(n)) if n.is_u64() || n.is_i64() => n.to_string(),
        _ => return Err(VerifyError::MissingEventId { location: pointer }),
    };
    check_id(id, pointer)
}

/// An event id from a header.
pub(crate) fn header_id(headers: &HeaderMap, key: impl HeaderKey) -> Result<String, VerifyError> {
    let name = key.label();
    match header(headers, key)? {
        Some(id) => check_id(id.to_owned(), name),
        None => Err(VerifyError::MissingEventId { location: name }),
    }
}

/// Non-empty, at most 255 bytes, no control characters.
pub(crate) fn check_id(id: String, location: &'static str) -> Result<String, VerifyError> {
    if id.is_empty() {
        return Err(VerifyError::MissingEventId { location });
    }
    if id.len() > MAX_EVENT_ID || id.chars().any(char::is_control) {
        return Err(VerifyError::InvalidEventId { location });
    }
    Ok(id)
}

/// `sha256:<hex>` of the body: the key for providers without a stable event id, whose retries
/// resend identical bytes.
pub(crate) fn body_digest_id(body: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_strict() {
        assert_eq!(parse_unix("t", "1614265330"), Ok(1_614_265_330));
        for bad in [
            "",
            "-1",
            "+1",
            "1.5",
            "1e9",
            " 1",
            "99999999999999999999",
            "abc",
        ] {
            assert_eq!(
                parse_unix("t", bad),
                Err(VerifyError::InvalidTimestamp { name: "t" }),
                "{bad:?}"
            );
        }
        assert!(check_window("t", u64::MAX, SystemTime::now(), None).is_err());
    }

    #[test]
    fn window_is_symmetric_and_disableable() {
        let now = UNIX_EPOCH + Duration::from_secs(10_000);
        let tol = Some(Duration::from_secs(300));
        assert!(check_window("t", 10_000 - 300, now, tol).is_ok());
        assert!(check_window("t", 10_000 + 300, now, tol).is_ok());
        assert!(matches!(
            check_window("t", 10_000 - 301, now, tol),
            Err(VerifyError::TimestampOutsideTolerance {
                skew_secs: -301,
                ..
            })
        ));
        assert!(matches!(
            check_window("t", 10_000 + 301, now, tol),
            Err(VerifyError::TimestampOutsideTolerance { skew_secs: 301, .. })
        ));
        assert!(check_window("t", 1, now, None).is_ok());
    }

    #[test]
    fn kv_pairs_are_strict_and_bounded() {
        assert_eq!(
            kv_pairs("h", "t=1,v1=ab", ',').unwrap(),
            vec![("t", "1"), ("v1", "ab")]
        );
        assert!(kv_pairs("h", "t=1,,v1=ab", ',').is_err());
        assert!(kv_pairs("h", "t", ',').is_err());
        assert!(kv_pairs("h", "=1", ',').is_err());
        let many = vec!["v1=00"; MAX_ITEMS + 1].join(",");
        assert!(kv_pairs("h", &many, ',').is_err());
    }

    #[test]
    fn json_fields_agree_with_value_pointers() {
        let body = br#"{"id":"evt_1","n":-3,"big":18446744073709551615,"f":1.5,"deep":{"a":{"b":"x\"y"}},
            "arr":[{"id":"no"}],"dup":"first","dup":"last","esc\u0061ped":"k","deep":{"a":{"c":1}}}"#;
        // `/none` is never found, so the whole body is read.
        let [id, n, big, f, b, c, dup, escaped, missing, arr] = json_fields(
            body,
            [
                "/id",
                "/n",
                "/big",
                "/f",
                "/deep/a/b",
                "/deep/a/c",
                "/dup",
                "/escaped",
                "/none",
                "/arr",
            ],
        )
        .unwrap();
        let value: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(id, Some(Scalar::Str("evt_1".into())));
        assert_eq!(n, Some(Scalar::I64(-3)));
        assert_eq!(big, Some(Scalar::U64(u64::MAX)));
        assert_eq!(f, Some(Scalar::Float(1.5f64.to_bits())));
        // Fields of repeated objects are all seen; the first of repeated keys wins (a Value keeps
        // the last: the signed body is the provider's, which does not repeat keys).
        assert_eq!(value.pointer("/deep/a/b"), None);
        assert_eq!(b, Some(Scalar::Str("x\"y".into())));
        assert_eq!(c, Some(Scalar::U64(1)));
        assert_eq!(dup, Some(Scalar::Str("first".into())));
        assert_eq!(value["dup"], "last");
        // The document handed to handlers reads repeated keys as the field reader does.
        let document = parse_json(body).unwrap();
        assert_eq!(document["dup"], "first");
        assert_eq!(document.pointer("/deep/a/b"), Some(&"x\"y".into()));
        assert_eq!(document.pointer("/deep/a/c"), Some(&1.into()));
        assert_eq!(escaped, Some(Scalar::Str("k".into())));
        assert_eq!(missing, None);
        assert_eq!(arr, Some(Scalar::Other));
        for bad in [&b"{"[..], b"{} x", b"", b"{\"a\":}", b"nul"] {
            assert_eq!(json_fields(bad, ["/a"]), Err(VerifyError::BodyNotJson));
        }
        assert_eq!(json_fields(b" [1] ", ["/a"]).unwrap(), [None]);
        // Found everything: the rest is not parsed.
        let [a] = json_fields(br#"{"a":"x","b":[1,2"#, ["/a"]).unwrap();
        assert_eq!(a, Some(Scalar::Str("x".into())));
        let [a, b] = json_fields_until(br#"{"a":"x","b":{"c":1}} trailing"#, ["/a", "/b/c"], |f| {
            f[0].as_ref().and_then(Scalar::as_str) == Some("x")
        })
        .unwrap();
        assert_eq!((a.is_some(), b), (true, None));
        assert_eq!(
            json_fields(br#"{"b":1} x"#, ["/a"]),
            Err(VerifyError::BodyNotJson)
        );
        // Skipped values are walked without recursion: deep nesting cannot overflow the stack.
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(
            json_fields(deep.as_bytes(), ["/a"]).unwrap(),
            [Some(Scalar::Other)]
        );
    }

    #[test]
    fn inline_candidates_decode_as_the_allocating_decoder_does() {
        let mut texts: Vec<(Encoding, String)> = Vec::new();
        for len in [0usize, 1, 20, 32, 63, 64, 65, 100] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            for encoding in [Encoding::Hex, Encoding::Base64] {
                let text = encoding.encode(&bytes);
                texts.push((encoding, text.to_uppercase()));
                texts.push((encoding, format!("0x{text}")));
                texts.push((encoding, format!("{text}!")));
                texts.push((encoding, text[..text.len().saturating_sub(1)].to_owned()));
                texts.push((encoding, text));
            }
        }
        for (encoding, text) in &texts {
            let inline = encoding
                .decode_candidate(text)
                .map(|c| c.as_bytes().to_vec());
            // Longer than any MAC: accepted as well-formed, held as the empty slice, which
            // no MAC equals.
            let allocating =
                encoding
                    .decode(text)
                    .map(|v| if v.len() > MAX_MAC_LEN { Vec::new() } else { v });
            assert_eq!(inline, allocating, "{encoding:?} {text:?}");
        }
        let long = Encoding::Hex.decode_candidate(&"ab".repeat(65)).unwrap();
        assert!(long.as_bytes().is_empty());
        assert_eq!(
            Encoding::Base64
                .decode_candidate(&Encoding::Base64.encode(&[7; 64]))
                .unwrap()
                .as_bytes(),
            &[7; 64]
        );
    }

    #[test]
    fn token_eq_compares_values() {
        assert!(token_eq(b"abc", b"abc"));
        assert!(!token_eq(b"abc", b"abd"));
        assert!(!token_eq(b"abc", b"abcd"));
    }

    /// The fast JSON scan against serde_json's: where the fast one answers, serde_json accepts
    /// the body and reads the same values; on plain webhook-shaped documents it does answer.
    mod json_scans {
        use proptest::{collection::vec, prelude::*};

        use super::super::{json_fields_both, Fields, Scalar};

        const POINTERS: [&str; 4] = ["/id", "/data/id", "/type", "/n"];

        fn whitespace() -> impl Strategy<Value = &'static str> {
            prop_oneof![4 => Just(""), 1 => Just(" "), 1 => Just("\n\t ")]
        }

        fn key(plain: bool) -> BoxedStrategy<String> {
            let names = prop_oneof![Just("id"), Just("data"), Just("type"), Just("n"), Just("x")];
            if plain {
                names.prop_map(|k| format!("\"{k}\"")).boxed()
            } else {
                prop_oneof![
                    // Mostly plain: one odd part in a document otherwise in the fast subset
                    // tests the fast scan's answer, not only its deferral.
                    12 => names.prop_map(|k| format!("\"{k}\"")),
                    // `id` spelled with an escape, a non-ASCII key, any escaped text.
                    1 => Just(r#""\u0069d""#.to_owned()),
                    1 => Just("\"é\"".to_owned()),
                    1 => any::<String>().prop_map(|k| serde_json::to_string(&k).unwrap()),
                ]
                .boxed()
            }
        }

        fn scalar(plain: bool) -> BoxedStrategy<String> {
            let common = prop_oneof![
                "[a-z0-9 _.-]{0,12}".prop_map(|s| format!("\"{s}\"")),
                any::<u64>().prop_map(|n| n.to_string()),
                Just("0".to_owned()),
                Just("true".to_owned()),
                Just("false".to_owned()),
                Just("null".to_owned()),
            ];
            if plain {
                common.boxed()
            } else {
                prop_oneof![
                    12 => common,
                    1 => any::<String>().prop_map(|s| serde_json::to_string(&s).unwrap()),
                    1 => any::<i64>().prop_map(|n| n.to_string()),
                    1 => any::<f64>().prop_map(|n| serde_json::to_string(&n).unwrap()),
                    4 => prop_oneof![
                        Just("-0"), Just("1e5"), Just("1.5E+3"), Just("-12.25e-2"), Just("01"),
                        Just("-"), Just("18446744073709551616"), Just("1e400"),
                        Just("\"\\ud800\""), Just("\"a\\/b\\n\""), Just("\"caf\u{e9}\""),
                    ]
                    .prop_map(str::to_owned),
                ]
                .boxed()
            }
        }

        /// JSON text, with repeated keys and whitespace (which a `Value` would not keep).
        fn document(plain: bool) -> impl Strategy<Value = String> {
            let members = move |inner: BoxedStrategy<String>| {
                vec((key(plain), inner, whitespace()), 0..5).prop_map(|members| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(k, v, w)| format!("{w}{k}{w}:{w}{v}{w}"))
                        .collect();
                    format!("{{{}}}", members.join(","))
                })
            };
            let value = scalar(plain).prop_recursive(4, 48, 5, move |inner| {
                prop_oneof![
                    vec((inner.clone(), whitespace()), 0..4).prop_map(|items| {
                        let items: Vec<String> =
                            items.into_iter().map(|(v, w)| format!("{w}{v}")).collect();
                        format!("[{}]", items.join(","))
                    }),
                    members(inner),
                ]
            });
            (members(value.boxed()), whitespace()).prop_map(|(doc, w)| format!("{w}{doc}{w}"))
        }

        /// Replaces a byte with one of JSON's structural or troublesome bytes, or cuts the text.
        fn mutated(text: String, edit: Option<(usize, u8)>, cut: Option<usize>) -> Vec<u8> {
            let mut bytes = text.into_bytes();
            if let (Some((at, byte)), false) = (edit, bytes.is_empty()) {
                let len = bytes.len();
                bytes[at % len] = byte;
            }
            if let Some(at) = cut {
                bytes.truncate(at % (bytes.len() + 1));
            }
            bytes
        }

        fn troublesome() -> impl Strategy<Value = u8> {
            prop::sample::select(b"\"\\{}[],: -.e0123456789tfnu\x01\x1f\x7f\xc3\xa9\xff".to_vec())
        }

        fn both(body: &[u8], stop_early: bool) -> (Option<Fields<4>>, Option<Fields<4>>) {
            let done = |found: &[Option<Scalar>]| stop_early && found.iter().all(Option::is_some);
            let (fast, serde) = json_fields_both(body, POINTERS, &done);
            (fast, serde.ok())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            #[test]
            fn fast_answers_agree_with_serde_json(
                text in prop_oneof![document(false), document(true)],
                edit in proptest::option::of((any::<usize>(), troublesome())),
                cut in proptest::option::weighted(0.2, any::<usize>()),
                stop_early: bool,
            ) {
                let body = mutated(text, edit, cut);
                let (fast, serde) = both(&body, stop_early);
                if let Some(fast) = fast {
                    prop_assert_eq!(Some(fast), serde, "{:?}", String::from_utf8_lossy(&body));
                }
            }

            #[test]
            fn fast_answers_plain_documents(text in document(true), stop_early: bool) {
                let (fast, serde) = both(text.as_bytes(), stop_early);
                prop_assert!(fast.is_some(), "the fast scan deferred on {}", text);
                prop_assert_eq!(fast, serde, "{}", text);
            }
        }

        /// Every odd token in every position of a plain document: where the fast scan
        /// answers, it answers as serde_json does.
        #[test]
        fn odd_tokens_in_every_position_agree() {
            let tokens = [
                "-0",
                "-1",
                "01",
                "00",
                "1.",
                "1.5",
                ".5",
                "1e",
                "1e+",
                "1E-2",
                "-",
                "+1",
                "0x1",
                "18446744073709551615",
                "18446744073709551616",
                "1e400",
                "tru",
                "nul",
                "True",
                r#""\u0069d""#,
                r#""\ud800""#,
                r#""\x""#,
                r#""\u12g4""#,
                "\"\t\"",
                "\"a\u{1}\"",
                "\"\u{7f}\"",
                "\"caf\u{e9}\"",
                "\"id",
                "{",
                "}",
                "[",
                "]",
                "[1,]",
                "{\"a\":1,}",
                "{\"a\" 1}",
                "{1:2}",
                "[1 2]",
                "",
                " ",
            ];
            let templates = [
                r#"{"id":T}"#,
                r#"{"n":T,"id":"a"}"#,
                r#"{"x":T,"id":"a","n":1,"type":"t","data":{"id":2}}"#,
                r#"{"data":{"id":T}}"#,
                r#"{"data":{"x":T,"id":"b"}}"#,
                r#"{"data":[T],"n":1}"#,
                r#"{T:1,"id":"a"}"#,
                r#"{"x":[1,{"y":T}],"id":"a"}"#,
            ];
            let mut answered = 0;
            for template in templates {
                for token in tokens {
                    let body = template.replace('T', token);
                    for stop_early in [false, true] {
                        let (fast, serde) = both(body.as_bytes(), stop_early);
                        if let Some(fast) = fast {
                            answered += 1;
                            assert_eq!(Some(fast), serde, "{body}");
                        }
                    }
                }
            }
            // The tokens JSON allows in a skipped position (-0, 1.5, 1E-2, the big numbers,
            // the escapes) are answered there.
            assert!(
                answered >= 40,
                "the fast scan answered only {answered} times"
            );
        }

        #[test]
        fn fast_defers_where_serde_json_decides() {
            // Each is outside the fast scan's subset; serde_json's answer stands.
            for body in [
                &br#"{"\u0069d":"a"}"#[..],
                br#"{"id":"a\"b"}"#,
                br#"{"id":-1}"#,
                br#"{"id":1.0}"#,
                br#"{"id":18446744073709551616}"#,
                br#"{"x":"\q"}"#,
                b"{\"id\":\"\xff\"}",
                br#"["id"]"#,
                br#"{"id":"a"} x"#,
                br#"{"x":01}"#,
                br#"{"n":01}"#,
            ] {
                let (fast, _) = both(body, false);
                assert!(fast.is_none(), "{}", String::from_utf8_lossy(body));
            }
            // Invalid UTF-8 in a skipped string: serde_json's `IgnoredAny` does not check it
            // either, so both accept.
            let (fast, serde) = both(b"{\"x\":\"\xff\",\"id\":\"a\"}", true);
            assert_eq!(fast, serde);
            assert!(fast.is_some());
            let nested = format!("{{\"x\":{}{},\"id\":1}}", "[".repeat(70), "]".repeat(70));
            assert_eq!(both(nested.as_bytes(), false).0, None);
            let nested = format!("{{\"x\":{}{},\"id\":1}}", "[".repeat(60), "]".repeat(60));
            let (fast, serde) = both(nested.as_bytes(), false);
            assert_eq!((fast.is_some(), fast), (true, serde));
        }
    }
}
