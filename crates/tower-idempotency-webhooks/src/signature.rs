//! Signatures: how they are written (hex, base64), decoded into inline candidates, and compared
//! in constant time against the MAC of every configured secret.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use smallvec::SmallVec;
use subtle::ConstantTimeEq;

use crate::{error::VerifyError, secret::Secret};

/// Most signatures accepted in one header (rotation rarely needs more than two).
pub const MAX_SIGNATURES: usize = 16;
/// Most asymmetric (Ed25519) signatures one header may carry. Each costs a hash of the whole
/// body per public key before anything is authenticated, where an HMAC costs one per secret
/// for all candidates; providers send one per active key (two during a rotation).
pub const MAX_ASYMMETRIC_SIGNATURES: usize = 4;
/// Longest MAC of the supported algorithms (HMAC-SHA512).
const MAX_MAC_LEN: usize = 64;

/// One signature from a header, decoded and held inline.
///
/// A delivery carries one signature, two during a secret roll: held inline, they cost no heap
/// allocation per delivery.
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

/// The Ed25519 public key whose 32 bytes `decoded` holds (`None`: the text did not decode);
/// `encoding` says what a configured key must be when it is not 32 bytes.
#[cfg(any(feature = "discord", feature = "standard-webhooks"))]
pub(crate) fn ed25519_key(
    decoded: Option<Vec<u8>>,
    encoding: &'static str,
) -> Result<ed25519_dalek::VerifyingKey, crate::error::ConfigError> {
    use crate::error::ConfigError;

    let bytes: [u8; 32] = decoded
        .and_then(|b| b.try_into().ok())
        .ok_or(ConfigError::InvalidPublicKey { reason: encoding })?;
    ed25519_dalek::VerifyingKey::from_bytes(&bytes).map_err(|_| ConfigError::InvalidPublicKey {
        reason: "not an Ed25519 point",
    })
}

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
#[cfg(any(test, feature = "gitlab"))]
pub(crate) fn token_eq(a: &[u8], b: &[u8]) -> bool {
    use sha2::Digest as _;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
