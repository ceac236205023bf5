//! Secrets that never show up in logs.

use std::{
    fmt,
    sync::{Arc, OnceLock},
};

use hmac::{digest::KeyInit, Hmac, Mac};

use crate::error::ConfigError;

/// The shortest shared secret (signing secret, auth token, verification token) a verifier
/// accepts: 4 bytes. The rule catches the empty secret of an unset environment variable
/// (`env::var(..).unwrap_or_default()`), which would let anyone sign, and one- to three-byte
/// placeholders. It is not an entropy check: every provider generates far longer secrets
/// (Stripe `whsec_` + 32, Slack and Twilio 32 hex digits, Square and Zoom 22 characters), but
/// the providers' own published test vectors sign with short ones (Shopify's `hush`, Twilio's
/// `12345`), and those must keep verifying.
pub const MIN_SECRET_LEN: usize = 4;

/// A shared secret (signing secret, auth token, verification token).
///
/// Cheap to clone. `Debug` prints `[redacted]`, and the bytes are only reachable inside this
/// crate, so a secret cannot leak through a `{:?}` of a verifier or an error.
#[derive(Clone)]
pub struct Secret(Arc<Inner>);

struct Inner {
    bytes: Box<[u8]>,
    // The HMAC state after absorbing the padded key, computed on first use and cloned for each
    // delivery: it saves two of the ~20 SHA-256 blocks a 1 KiB delivery costs (and for keys over
    // one block, hashing the key). It is key material like `bytes`, and as private.
    sha1: OnceLock<Hmac<sha1::Sha1>>,
    sha256: OnceLock<Hmac<sha2::Sha256>>,
    sha512: OnceLock<Hmac<sha2::Sha512>>,
}

impl Secret {
    /// A secret from raw bytes.
    pub fn new(bytes: impl AsRef<[u8]>) -> Self {
        Self(Arc::new(Inner {
            bytes: bytes.as_ref().into(),
            sha1: OnceLock::new(),
            sha256: OnceLock::new(),
            sha512: OnceLock::new(),
        }))
    }

    /// A secret from raw bytes, refused with [`ConfigError::WeakSecret`] when it is empty or
    /// shorter than [`MIN_SECRET_LEN`] bytes, the check every verifier makes when it is built.
    ///
    /// ```
    /// use tower_idempotency_webhooks::{ConfigError, Secret};
    /// let secret = std::env::var("STRIPE_WEBHOOK_SECRET").unwrap_or_default();
    /// match Secret::try_new(&secret) {
    ///     Ok(_) => { /* IdempotencyLayer::stripe([secret], store) */ }
    ///     Err(ConfigError::WeakSecret { min_len }) => assert_eq!(min_len, 4),
    ///     Err(other) => panic!("{other}"),
    /// }
    /// ```
    pub fn try_new(bytes: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        let secret = Self::new(bytes);
        secret.check()?;
        Ok(secret)
    }

    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.0.bytes.len() < MIN_SECRET_LEN {
            return Err(ConfigError::WeakSecret {
                min_len: MIN_SECRET_LEN,
            });
        }
        Ok(())
    }

    // Only the token providers (GitLab, Zoom) compare the secret itself.
    #[allow(dead_code)]
    pub(crate) fn expose(&self) -> &[u8] {
        &self.0.bytes
    }

    /// A fresh HMAC-SHA1 keyed with this secret.
    pub(crate) fn hmac_sha1(&self) -> Hmac<sha1::Sha1> {
        keyed(&self.0.sha1, &self.0.bytes)
    }

    /// A fresh HMAC-SHA256 keyed with this secret.
    pub(crate) fn hmac_sha256(&self) -> Hmac<sha2::Sha256> {
        keyed(&self.0.sha256, &self.0.bytes)
    }

    /// A fresh HMAC-SHA512 keyed with this secret.
    pub(crate) fn hmac_sha512(&self) -> Hmac<sha2::Sha512> {
        keyed(&self.0.sha512, &self.0.bytes)
    }
}

fn keyed<M: Mac + KeyInit + Clone>(cell: &OnceLock<M>, key: &[u8]) -> M {
    cell.get_or_init(|| <M as Mac>::new_from_slice(key).expect("HMAC takes keys of any length"))
        .clone()
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self::new(value)
    }
}

impl From<&String> for Secret {
    fn from(value: &String) -> Self {
        Self::new(value)
    }
}

impl From<Vec<u8>> for Secret {
    fn from(value: Vec<u8>) -> Self {
        Self::new(value)
    }
}

impl From<&[u8]> for Secret {
    fn from(value: &[u8]) -> Self {
        Self::new(value)
    }
}

/// Collects secrets for a verifier: the first is the current one, the others are accepted too
/// while a rotation is in progress.
///
/// # Panics
/// If a secret is empty or shorter than [`MIN_SECRET_LEN`] bytes; the message names the
/// provider and the rule, never the secret.
// Used by the provider modules, which features select.
#[allow(dead_code)]
pub(crate) fn collect<S: Into<Secret>>(
    provider: &str,
    secrets: impl IntoIterator<Item = S>,
) -> Arc<[Secret]> {
    try_collect(secrets).unwrap_or_else(|error| panic!("{provider} webhook verifier: {error}"))
}

/// [`collect`], refusing a weak secret with [`ConfigError::WeakSecret`] instead.
#[allow(dead_code)]
pub(crate) fn try_collect<S: Into<Secret>>(
    secrets: impl IntoIterator<Item = S>,
) -> Result<Arc<[Secret]>, ConfigError> {
    let secrets: Arc<[Secret]> = secrets.into_iter().map(Into::into).collect();
    secrets.iter().try_for_each(Secret::check)?;
    Ok(secrets)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MAC of `message` from `cached` equals one keyed from scratch with `key`.
    fn same_as_fresh<M: Mac + KeyInit>(mut cached: M, key: &[u8], message: &[u8]) {
        cached.update(message);
        let mut fresh = <M as Mac>::new_from_slice(key).unwrap();
        fresh.update(message);
        assert_eq!(
            cached.finalize().into_bytes(),
            fresh.finalize().into_bytes()
        );
    }

    #[test]
    fn a_cached_key_state_gives_the_same_mac_as_a_fresh_one() {
        let secret = Secret::from("whsec_key");
        // Twice: the second use clones the state the first one computed.
        same_as_fresh(secret.hmac_sha256(), b"whsec_key", b"body");
        same_as_fresh(secret.hmac_sha256(), b"whsec_key", b"body");
        // A key longer than the block is hashed first; the cached state must include that.
        let long = Secret::new([7u8; 200]);
        same_as_fresh(long.hmac_sha512(), &[7u8; 200], b"x");
        same_as_fresh(long.hmac_sha1(), &[7u8; 200], b"x");
    }

    #[test]
    fn debug_is_redacted() {
        let secret = Secret::from("whsec_super_secret");
        assert_eq!(format!("{secret:?}"), "[redacted]");
        assert!(!format!("{:?}", vec![secret]).contains("super"));
    }
}
