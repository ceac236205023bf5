//! Secrets that never show up in logs.

use std::{fmt, sync::Arc};

/// A shared secret (signing secret, auth token, verification token).
///
/// Cheap to clone. `Debug` prints `[redacted]`, and the bytes are only reachable inside this
/// crate, so a secret cannot leak through a `{:?}` of a verifier or an error.
#[derive(Clone)]
pub struct Secret(Arc<[u8]>);

impl Secret {
    /// A secret from raw bytes.
    pub fn new(bytes: impl AsRef<[u8]>) -> Self {
        Self(Arc::from(bytes.as_ref()))
    }

    pub(crate) fn expose(&self) -> &[u8] {
        &self.0
    }
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
pub(crate) fn collect<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>) -> Arc<[Secret]> {
    secrets.into_iter().map(Into::into).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_redacted() {
        let secret = Secret::from("whsec_super_secret");
        assert_eq!(format!("{secret:?}"), "[redacted]");
        assert!(!format!("{:?}", vec![secret]).contains("super"));
    }
}
