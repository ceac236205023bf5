//! The `Idempotency-Key` header: its name, its syntax, and why a value is refused.

use http::{HeaderName, HeaderValue};

/// The IETF draft's request header.
pub static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// Why an `Idempotency-Key` header was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The value is empty (or an empty quoted string).
    #[error("the key is empty")]
    Empty,
    /// The value is longer than [`MAX_KEY_LEN`] bytes.
    #[error("the key is longer than 255 bytes")]
    TooLong,
    /// The value contains a byte outside visible ASCII.
    #[error("the key must be visible ASCII")]
    NotVisibleAscii,
    /// A quoted value is not a valid Structured Field string.
    #[error("the key is not a valid structured field string")]
    MalformedString,
    /// The header appears more than once.
    #[error("the header appears more than once")]
    Repeated,
}

/// Parses one `Idempotency-Key` header value.
///
/// Accepts the IETF draft's Structured Field string (`"8e03978e"`, parsed with `sfv`, parameters
/// ignored) and, because most clients send it that way, a bare token of visible ASCII.
pub fn parse_key(value: &HeaderValue) -> Result<String, KeyError> {
    let text = value.to_str().map_err(|_| KeyError::NotVisibleAscii)?;
    let key = if text.starts_with('"') {
        let item: sfv::Item = sfv::Parser::new(text)
            .parse_item()
            .map_err(|_| KeyError::MalformedString)?;
        match item.bare_item.as_string() {
            Some(string) => string.as_str().to_owned(),
            None => return Err(KeyError::MalformedString),
        }
    } else {
        text.to_owned()
    };
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong);
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(KeyError::NotVisibleAscii);
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8]) -> Result<String, KeyError> {
        parse_key(&HeaderValue::from_bytes(raw).unwrap())
    }

    #[test]
    fn accepts_bare_tokens_and_structured_strings() {
        assert_eq!(parse(b"8e03978e-40d5-43e8").unwrap(), "8e03978e-40d5-43e8");
        assert_eq!(parse(b"\"8e03978e-40d5\"").unwrap(), "8e03978e-40d5");
        assert_eq!(parse(b"\"abc\";p=1").unwrap(), "abc");
        assert_eq!(parse(&[b'k'; 255]).unwrap().len(), 255);
    }

    #[test]
    fn rejects_bad_keys_with_their_cause() {
        assert_eq!(parse(b""), Err(KeyError::Empty));
        assert_eq!(parse(b"\"\""), Err(KeyError::Empty));
        assert_eq!(parse(&[b'k'; 256]), Err(KeyError::TooLong));
        assert_eq!(parse(b"has space"), Err(KeyError::NotVisibleAscii));
        assert_eq!(
            parse("caf\u{e9}".as_bytes()),
            Err(KeyError::NotVisibleAscii)
        );
        assert_eq!(parse(b"\"unterminated"), Err(KeyError::MalformedString));
        assert_eq!(parse(b"\"a\" trailing"), Err(KeyError::MalformedString));
        assert_eq!(parse(b"\"has space\""), Err(KeyError::NotVisibleAscii));
        assert_eq!(parse(b"\"esc\\\"aped\"").unwrap(), "esc\"aped");
    }
}
