//! [`Authenticator`]: replay protection for credentials that do not cover the idempotency key.

use std::fmt;

use sha2::{Digest, Sha256};

/// A digest of the credential that authenticated a request (a webhook signature, a provider's
/// one-time token), for key sources whose key that credential does not cover.
///
/// Some senders sign the body but take the idempotency key from a header the signature does not
/// cover (GitHub's `X-GitHub-Delivery`, Shopify's `X-Shopify-Event-Id`), or sign a token but not
/// the event it comes with (Mailgun). Whoever holds one genuine request could re-send it under a
/// fresh key and have the handler run again. A [`KeySource`](crate::KeySource) that knows this
/// inserts an `Authenticator` into the request extensions; the layer then remembers, in the same
/// store and for at least the layer's TTL, which key each authenticator was first seen under:
///
/// - first seen, or seen under the same key (a retry, a redelivery): the request goes on as
///   usual (run, `409` or replay);
/// - seen under a different key: `401` with the problem type `replayed-signature`, and the
///   handler does not run.
///
/// The record is a second store key, `{namespace}.auth:{hex}`, fingerprinted by a digest of the
/// key as derived (before scoping by path and principal: one delivery sent to two routes of one
/// namespace runs on each, as without an authenticator). Its claim runs concurrently with the
/// key's own claim: one extra store round trip per request, and a wait for the slower of the
/// two. It is in flight only while the key's handler runs: once the key is settled, the record
/// is completed for the layer's TTL (one more round trip), holding the key's status and headers
/// without the body, or a mark that the key was released. A store that evicts completed records
/// (the memory store when full) can evict it like any other, and never fills with records that
/// run nothing. When the key's own record is gone before its TTL (evicted) but the record holds
/// its result, a retry of the same delivery is answered with the stored status and
/// `Idempotent-Body-Omitted` instead of running the handler again. A request refused as a
/// replay releases its claim of the key (one more round trip, only then); a record the store
/// cannot read or write is answered like a failed claim (`503`, or the handler unguarded under
/// `fail_open`). After the TTL the record expires and the credential is accepted once more
/// under a new key.
///
/// ```
/// use tower_idempotency_core::Authenticator;
/// let signature = b"\x8f\x1e...";
/// let a = Authenticator::digest("github", &[signature]);
/// assert_eq!(a, Authenticator::digest("github", &[signature]));
/// assert_ne!(a, Authenticator::digest("shopify", &[signature]));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Authenticator(pub [u8; 32]);

impl Authenticator {
    /// SHA-256 over `domain` (e.g. the provider's name) and each of `parts`, every one
    /// length-prefixed, so no two different inputs share a digest.
    pub fn digest(domain: &str, parts: &[&[u8]]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"tower-idempotency authenticator\0");
        for part in std::iter::once(domain.as_bytes()).chain(parts.iter().copied()) {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        Self(hasher.finalize().into())
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for Authenticator {
    // A digest of a credential: nothing to gain from printing it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Authenticator(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_separates_domains_and_part_boundaries() {
        let ab = Authenticator::digest("p", &[b"ab"]);
        assert_eq!(ab, Authenticator::digest("p", &[b"ab"]));
        assert_ne!(ab, Authenticator::digest("p", &[b"a", b"b"]));
        assert_ne!(ab, Authenticator::digest("q", &[b"ab"]));
        assert_ne!(
            Authenticator::digest("pa", &[b"b"]),
            Authenticator::digest("p", &[b"ab"])
        );
        assert_eq!(format!("{ab:?}"), "Authenticator(..)");
    }
}
