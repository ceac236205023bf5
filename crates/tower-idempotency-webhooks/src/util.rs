//! Shared parsing and crypto helpers: bounded header access, strict timestamps, HMAC with
//! constant-time comparison over every (secret, signature) pair.

// Each helper serves some providers; a build with only a subset of the provider features
// leaves the others unused.
#![allow(dead_code)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::{error::VerifyError, secret::Secret};

/// Longest header value parsed, in bytes.
pub const MAX_HEADER_LEN: usize = 8 * 1024;
/// Most signatures accepted in one header (rotation rarely needs more than two).
pub const MAX_SIGNATURES: usize = 16;
/// The default replay window, in both directions.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);
const MAX_ITEMS: usize = 2 * MAX_SIGNATURES + 4;
const MAX_EVENT_ID: usize = 255;

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
    pub(crate) fn decode(self, text: &str) -> Option<Vec<u8>> {
        match self {
            Self::Hex => hex::decode(text).ok(),
            Self::Base64 => base64::engine::general_purpose::STANDARD.decode(text).ok(),
        }
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
/// secret. Each MAC is computed once per secret and compared in constant time.
pub(crate) fn match_hmac(
    algorithm: HmacAlgorithm,
    secrets: &[Secret],
    chunks: &[&[u8]],
    candidates: &[Vec<u8>],
) -> Result<usize, VerifyError> {
    if secrets.is_empty() {
        return Err(VerifyError::MissingConfiguration { what: "secret" });
    }
    for (index, secret) in secrets.iter().enumerate() {
        let expected = hmac(algorithm, secret.expose(), chunks);
        let mut found = subtle::Choice::from(0);
        for candidate in candidates {
            // Lengths are public (fixed per algorithm); `ct_eq` returns false on a mismatch.
            found |= expected.as_slice().ct_eq(candidate.as_slice());
        }
        if bool::from(found) {
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
) -> Result<Vec<Vec<u8>>, VerifyError> {
    let decoded: Vec<Vec<u8>> = encoded
        .iter()
        .filter_map(|text| encoding.decode(text))
        .collect();
    if decoded.is_empty() {
        return Err(VerifyError::MalformedHeader {
            name,
            reason: match encoding {
                Encoding::Hex => "signature is not hexadecimal",
                Encoding::Base64 => "signature is not base64",
            },
        });
    }
    Ok(decoded)
}

/// The single value of a header, bounded and visible ASCII; `None` when absent.
pub(crate) fn header<'a>(
    headers: &'a HeaderMap,
    name: &'static str,
) -> Result<Option<&'a str>, VerifyError> {
    let mut values = headers.get_all(name).iter();
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
    let text = text.trim();
    if text.is_empty() {
        return Err(VerifyError::MalformedHeader {
            name,
            reason: "empty",
        });
    }
    Ok(Some(text))
}

/// Like [`header`], but absence is an error.
pub(crate) fn required<'a>(
    headers: &'a HeaderMap,
    name: &'static str,
) -> Result<&'a str, VerifyError> {
    header(headers, name)?.ok_or(VerifyError::MissingHeader { name })
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
    let mut pairs = Vec::new();
    for member in value.split(separator) {
        if pairs.len() == MAX_ITEMS {
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
        pairs.push((key, val));
    }
    Ok(pairs)
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

/// `Some(d)`, or `None` (disabled) for zero.
pub(crate) fn tolerance(duration: Duration) -> Option<Duration> {
    (!duration.is_zero()).then_some(duration)
}

/// Parses the body as JSON.
pub(crate) fn parse_json(body: &Bytes) -> Result<serde_json::Value, VerifyError> {
    serde_json::from_slice(body).map_err(|_| VerifyError::BodyNotJson)
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
pub(crate) fn header_id(headers: &HeaderMap, name: &'static str) -> Result<String, VerifyError> {
    match header(headers, name)? {
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
        assert!(check_window("t", 1, now, tolerance(Duration::ZERO)).is_ok());
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
    fn token_eq_compares_values() {
        assert!(token_eq(b"abc", b"abc"));
        assert!(!token_eq(b"abc", b"abd"));
        assert!(!token_eq(b"abc", b"abcd"));
    }
}
