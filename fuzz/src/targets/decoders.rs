//! The decoders and parsers the verifiers share, and the core's `Idempotency-Key` parser.

use base64::Engine as _;
use http::{HeaderMap, HeaderValue};
use tower_idempotency_core::parse_key;
use tower_idempotency_webhooks::{__fuzz, Encoding};

use crate::check;

/// The hex and base64 signature decoders, timestamps, event ids and the bounded header reader.
pub fn decoders(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    signature_decoders(&text);
    if let Ok(n) = __fuzz::parse_unix(&text) {
        assert!(text.bytes().all(|b| b.is_ascii_digit()) && text.len() <= 19);
        assert_eq!(text.parse::<u64>().ok(), Some(n));
    }
    if let Ok(id) = __fuzz::check_id(text.to_string()) {
        check::event_id(&id);
    }
    check::kv(&text, ',');
    check::kv(&text, ';');
    if let Ok(value) = HeaderValue::from_bytes(data) {
        header_reader(value);
    }
}

/// Decoding round-trips, and the verifiers' inline decoder agrees with the allocating one
/// (differential).
fn signature_decoders(text: &str) {
    if let Some(bytes) = __fuzz::decode(text, Encoding::Hex) {
        assert_eq!(hex::encode(bytes), text.to_ascii_lowercase());
    }
    if let Some(bytes) = __fuzz::decode(text, Encoding::Base64) {
        assert_eq!(
            base64::engine::general_purpose::STANDARD.encode(bytes),
            text
        );
    }
    for encoding in [Encoding::Hex, Encoding::Base64] {
        let expected =
            __fuzz::decode(text, encoding).map(|b| if b.len() > 64 { Vec::new() } else { b });
        assert_eq!(__fuzz::decode_candidate(text, encoding), expected);
    }
}

/// The bounded reader returns a trimmed, bounded value, and refuses a repeated header.
fn header_reader(value: HeaderValue) {
    let mut headers = HeaderMap::new();
    headers.insert("x-h", value.clone());
    if let Ok(Some(read)) = __fuzz::header(&headers, "x-h") {
        assert!(!read.is_empty() && read.len() <= __fuzz::MAX_HEADER_LEN);
        assert_eq!(read, read.trim());
    }
    headers.append("x-h", value);
    assert!(__fuzz::header(&headers, "x-h").is_err());
}

/// The core's `Idempotency-Key` parser.
pub fn idempotency_key(data: &[u8]) {
    let Ok(value) = HeaderValue::from_bytes(data) else {
        return;
    };
    match parse_key(&value) {
        Ok(key) => {
            assert!(!key.is_empty() && key.len() <= 255);
            assert!(key.bytes().all(|b| b.is_ascii_graphic()));
            if !data.starts_with(b"\"") {
                assert_eq!(key.as_bytes(), data);
            }
        }
        Err(error) => {
            let plain = !data.is_empty()
                && data.len() <= 255
                && data[0] != b'"'
                && data.iter().all(|b| b.is_ascii_graphic());
            assert!(!plain, "a plain visible-ASCII key was refused: {error}");
        }
    }
}
