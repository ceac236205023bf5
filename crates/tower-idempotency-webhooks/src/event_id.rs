//! Event ids: where a delivery's id comes from (a header, a JSON field, the body's digest) and
//! what makes one acceptable as an idempotency key.

use http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::{
    error::VerifyError,
    headers::{header, HeaderKey},
    json::Scalar,
};

/// The longest event id accepted, in bytes: the webhook layer keys by it and the inbox stores it.
pub const MAX_EVENT_ID_LEN: usize = 255;

/// An event id from a [`fields`](crate::json::fields) result: a string or an integer, like [`json_id`].
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
    check_id_str(&id, location)?;
    Ok(id)
}

/// [`check_id`] of a borrowed id.
pub(crate) fn check_id_str(id: &str, location: &'static str) -> Result<(), VerifyError> {
    if id.is_empty() {
        return Err(VerifyError::MissingEventId { location });
    }
    if id.len() > MAX_EVENT_ID_LEN || id.chars().any(char::is_control) {
        return Err(VerifyError::InvalidEventId { location });
    }
    Ok(())
}

/// `sha256:<hex>` of the body: the key for providers without a stable event id, whose retries
/// resend identical bytes.
pub(crate) fn body_digest_id(body: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(body)))
}
