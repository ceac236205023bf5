//! Reading request headers: one bounded, visible-ASCII value per header, looked up by a name
//! parsed once, and the `k=v<sep>k=v` and `scheme=` grammars the providers' signature headers use.

use http::{
    header::{GetAll, HeaderName, HeaderValue},
    HeaderMap,
};

use crate::error::VerifyError;

/// Longest header value parsed, in bytes.
pub const MAX_HEADER_LEN: usize = 8 * 1024;

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

/// Strips a `scheme=` prefix (GitHub's `sha256=`, the `v0=` of Slack and Zoom); another `x=`
/// prefix is an unsupported version.
#[cfg(any(feature = "github", feature = "slack", feature = "zoom"))]
pub(crate) fn prefixed<'a>(
    name: &'static str,
    value: &'a str,
    prefix: &str,
) -> Result<&'a str, VerifyError> {
    match value.strip_prefix(prefix) {
        Some(rest) => Ok(rest),
        None if value.contains('=') => Err(VerifyError::UnsupportedVersion { name }),
        None => Err(VerifyError::MalformedHeader {
            name,
            reason: "missing scheme prefix",
        }),
    }
}
