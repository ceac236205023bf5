//! Stripe's `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>..]` scheme, which Paddle uses as
//! `Paddle-Signature: ts=<unix>;h1=<hex>`: HMAC-SHA256 over `{timestamp}{joiner}{body}`, any of
//! several signatures may match (one per active secret during a roll).

use std::time::SystemTime;

use http::{HeaderMap, HeaderName};
use smallvec::SmallVec;

use crate::{
    error::VerifyError,
    headers,
    providers::timed_secrets::TimedSecrets,
    signature::{self, Encoding, HmacAlgorithm, MAX_SIGNATURES},
    timestamp,
};

/// Most members of a `k=v` header: every signature plus a few other keys.
const MAX_ITEMS: usize = 2 * MAX_SIGNATURES + 4;

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
    /// Verifies the header against `body` with `keys`, replay window included: returns the
    /// signed time and the matching secret.
    pub(crate) fn verify(
        &'static self,
        headers: &HeaderMap,
        body: &[u8],
        keys: &TimedSecrets,
        now: SystemTime,
    ) -> Result<(u64, usize), VerifyError> {
        let value = headers::required(headers, &self.header)?;
        let name = self.header.as_str();
        let (timestamp, signatures) = timestamped_signatures(
            name,
            value,
            self.separator,
            self.timestamp_key,
            self.signature_key,
        )?;
        let signed = timestamp::parse_unix(name, timestamp)?;
        let candidates = signature::decode_all(name, &signatures, Encoding::Hex)?;
        let index = keys.matching(&[timestamp.as_bytes(), self.joiner, body], &candidates)?;
        keys.tolerance.check(name, signed, now)?;
        Ok((signed, index))
    }

    /// The header value the provider would send for `body` at `timestamp`.
    pub(crate) fn sign(&self, secret: &[u8], timestamp: u64, body: &[u8]) -> String {
        let ts = timestamp.to_string();
        let mac = signature::hmac(
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

    /// A fixture's delivery of `sent` carrying the signature over `signed` made with `secret` at
    /// `now` (see [`crate::testing::MakeDelivery`]).
    #[cfg(feature = "test-support")]
    pub(crate) fn delivery(
        &'static self,
        secret: &str,
        signed: &crate::testing::Event,
        sent: &crate::testing::Event,
        now: u64,
    ) -> crate::testing::Delivery {
        let signature = self.sign(secret.as_bytes(), now, signed.body.as_bytes());
        crate::testing::Delivery::new(vec![(self.header.as_str(), signature)], sent.body.clone())
    }
}

/// Splits a `k=v<sep>k=v` header into bounded pairs.
///
/// These headers (Stripe's `t=..,v1=..`, Paddle's `ts=..;h1=..`) are not RFC 8941 structured
/// fields: Stripe's list members are bare `key=hex` tokens that an sfv parser would treat as
/// dictionary keys with token values only by accident, and Paddle uses `;`, which RFC 8941
/// reserves for parameters. Their whole grammar is "split on the separator, then on the first
/// `=`", which is what this does, strictly (no empty members, no member without `=`) and with a
/// bound on the member count.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn kv_pairs<'a>(
    name: &'static str,
    value: &'a str,
    separator: char,
) -> Result<Vec<(&'a str, &'a str)>, VerifyError> {
    kv_members(name, value, separator).collect()
}

/// `kv_pairs` as an iterator, for the verifiers, which need no list of the members.
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
fn timestamped_signatures<'a>(
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
