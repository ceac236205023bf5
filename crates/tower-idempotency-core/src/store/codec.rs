//! A compact binary encoding of cached responses for store backends.
//!
//! Hand-written instead of a general-purpose serializer because it runs on every first request
//! and every replay: it is a length-prefixed copy of the bytes, and decoding slices the body out of
//! the stored buffer without copying it.
//!
//! Layout of an encoded header block: repeated `u16 name length, name, u32 value length, value`.
//! Layout of an encoded record: `u8 version (1), u16 status, u8 flags (bit 0: body omitted),
//! 32 bytes fingerprint, u32 header block length, header block, body`. All integers big-endian.

use bytes::{BufMut, Bytes};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::{CachedResponse, CompletedRecord, Fingerprint};

const RECORD_VERSION: u8 = 1;
const FLAG_BODY_OMITTED: u8 = 1;

/// A stored header block or record that cannot be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum CodecError {
    /// The input ended inside a field.
    #[error("record truncated")]
    Truncated,
    /// The record was written by an unknown version of the encoding.
    #[error("unknown record version {0}")]
    UnknownVersion(u8),
    /// A header name or value, or the status code, is not valid HTTP.
    #[error("invalid stored {0}")]
    Invalid(&'static str),
}

/// Encodes a header map into the compact header block layout.
pub fn encode_headers(headers: &HeaderMap) -> Vec<u8> {
    let size: usize = headers
        .iter()
        .map(|(name, value)| 6 + name.as_str().len() + value.len())
        .sum();
    let mut out = Vec::with_capacity(size);
    write_headers(&mut out, headers);
    out
}

fn write_headers(out: &mut Vec<u8>, headers: &HeaderMap) {
    for (name, value) in headers {
        // Header names are at most 64 KiB by construction in `http`; values are limited by the
        // server's header size limit, far below 4 GiB.
        out.put_u16(name.as_str().len() as u16);
        out.put_slice(name.as_str().as_bytes());
        out.put_u32(value.len() as u32);
        out.put_slice(value.as_bytes());
    }
}

/// Decodes a header block written by [`encode_headers`].
pub fn decode_headers(mut input: &[u8]) -> Result<HeaderMap, CodecError> {
    let mut headers = HeaderMap::new();
    while !input.is_empty() {
        let name_len = u16::from_be_bytes(take::<2>(&mut input)?) as usize;
        let name = take_slice(&mut input, name_len)?;
        let value_len = u32::from_be_bytes(take::<4>(&mut input)?) as usize;
        let value = take_slice(&mut input, value_len)?;
        let name = HeaderName::from_bytes(name).map_err(|_| CodecError::Invalid("header name"))?;
        let value =
            HeaderValue::from_bytes(value).map_err(|_| CodecError::Invalid("header value"))?;
        // A stored block comes from outside the process (a database, a foreign writer): more
        // names than a `HeaderMap` holds is corruption to report, not a panic.
        headers
            .try_append(name, value)
            .map_err(|_| CodecError::Invalid("too many headers"))?;
    }
    Ok(headers)
}

impl CompletedRecord {
    /// Encodes the record into one buffer, for key-value backends that store a single value.
    pub fn encode(&self) -> Vec<u8> {
        let headers = encode_headers(&self.response.headers);
        let mut out = Vec::with_capacity(40 + headers.len() + self.response.body.len());
        out.put_u8(RECORD_VERSION);
        out.put_u16(self.response.status.as_u16());
        out.put_u8(if self.response.body_omitted {
            FLAG_BODY_OMITTED
        } else {
            0
        });
        out.put_slice(self.fingerprint.as_bytes());
        out.put_u32(headers.len() as u32);
        out.put_slice(&headers);
        out.put_slice(&self.response.body);
        out
    }

    /// Decodes a record written by [`CompletedRecord::encode`]. The body shares `input`'s memory.
    pub fn decode(input: Bytes) -> Result<Self, CodecError> {
        let mut cursor: &[u8] = &input;
        let [version] = take::<1>(&mut cursor)?;
        if version != RECORD_VERSION {
            return Err(CodecError::UnknownVersion(version));
        }
        let status = StatusCode::from_u16(u16::from_be_bytes(take::<2>(&mut cursor)?))
            .map_err(|_| CodecError::Invalid("status"))?;
        let [flags] = take::<1>(&mut cursor)?;
        let fingerprint = Fingerprint(take::<32>(&mut cursor)?);
        let headers_len = u32::from_be_bytes(take::<4>(&mut cursor)?) as usize;
        let headers = decode_headers(take_slice(&mut cursor, headers_len)?)?;
        let body = input.slice(input.len() - cursor.len()..);
        Ok(Self {
            fingerprint,
            response: CachedResponse {
                status,
                headers,
                body,
                body_omitted: flags & FLAG_BODY_OMITTED != 0,
            },
        })
    }
}

fn take<const N: usize>(input: &mut &[u8]) -> Result<[u8; N], CodecError> {
    let bytes = take_slice(input, N)?;
    Ok(bytes.try_into().expect("take_slice returned N bytes"))
}

fn take_slice<'a>(input: &mut &'a [u8], len: usize) -> Result<&'a [u8], CodecError> {
    if input.len() < len {
        return Err(CodecError::Truncated);
    }
    let (head, rest) = input.split_at(len);
    *input = rest;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(body: &[u8]) -> CompletedRecord {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-multi", HeaderValue::from_static("a"));
        headers.append("x-multi", HeaderValue::from_static("b"));
        CompletedRecord {
            fingerprint: Fingerprint([7; 32]),
            response: CachedResponse {
                status: StatusCode::CREATED,
                headers,
                body: Bytes::copy_from_slice(body),
                body_omitted: false,
            },
        }
    }

    #[test]
    fn record_round_trips_binary_body_and_repeated_headers() {
        let body: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        let original = record(&body);
        let decoded = CompletedRecord::decode(Bytes::from(original.encode())).unwrap();
        assert_eq!(decoded, original);
        assert_eq!(
            decoded.response.headers.get_all("x-multi").iter().count(),
            2
        );
    }

    #[test]
    fn truncated_and_unknown_versions_are_errors_not_panics() {
        let encoded = record(b"hello").encode();
        for cut in 0..40 {
            assert!(CompletedRecord::decode(Bytes::copy_from_slice(&encoded[..cut])).is_err());
        }
        let mut wrong = encoded.clone();
        wrong[0] = 9;
        assert_eq!(
            CompletedRecord::decode(Bytes::from(wrong)),
            Err(CodecError::UnknownVersion(9))
        );
    }

    #[test]
    fn a_block_with_more_names_than_a_header_map_holds_is_invalid() {
        // Well-formed entries, each a distinct name: a store value no encoder of ours writes.
        let mut block = Vec::new();
        for i in 0..40_000 {
            let name = format!("x{i}");
            block.put_u16(name.len() as u16);
            block.put_slice(name.as_bytes());
            block.put_u32(0);
        }
        assert!(matches!(
            decode_headers(&block),
            Err(CodecError::Invalid("too many headers"))
        ));
    }
}
