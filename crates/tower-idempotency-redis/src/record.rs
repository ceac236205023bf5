//! The record value codec and key layout: the in-flight value (`'I'`), the completed value
//! (`'E'`), and the Redis key of a store key. The [crate documentation](crate) has the byte layout.

use std::time::Duration;

use bytes::{BufMut, Bytes};
use tower_idempotency_core::{
    CodecError, CompletedRecord, FencingToken, Fingerprint, RecordState, StoreError,
};

/// Longest expiry written: 100 years, so `now + PX` never overflows on the server.
const MAX_EXPIRY_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

const KIND_IN_FLIGHT: u8 = b'I';
/// Completed, with the completing token (so a resent completion can tell it already applied)
/// and the expiry deadline (so a read needs no `PTTL`).
const KIND_COMPLETED_UNTIL: u8 = b'E';
const IN_FLIGHT_LEN: usize = 1 + 8 + 32 + 8;
pub(crate) const COMPLETED_UNTIL_HEADER_LEN: usize = 1 + 32 + 8 + 8;

/// `<prefix>:{<store_key>}`. Redis Cluster hashes the text between the first `{` and the next
/// `}`, and the whole name when that text is empty: a store key starting with `}` would put its
/// record and its staging key (the record key plus a suffix) in different slots. Such keys get
/// one more `{` in front, and so do keys starting with `{`, which keeps the mapping one-to-one
/// (the prefix cannot contain a brace).
pub(crate) fn record_key(prefix: &str, store_key: &str) -> String {
    let mut key = String::with_capacity(prefix.len() + store_key.len() + 4);
    key.push_str(prefix);
    key.push_str(":{");
    if store_key.starts_with(['{', '}']) {
        key.push('{');
    }
    key.push_str(store_key);
    key.push('}');
    key
}

/// The staging key of `token`'s large completion: the record key plus a suffix, so the same
/// hash tag and slot.
pub(crate) fn staging_key(record_key: &str, token: FencingToken) -> String {
    format!("{record_key}:staged:{:016x}", token.0)
}

pub(crate) fn corrupt(what: &'static str) -> StoreError {
    StoreError::Corrupt(CodecError::Invalid(what))
}

pub(crate) fn expiry_ms(duration: Duration) -> u64 {
    // PX 0 is rejected by Redis; a zero lease or TTL expires as soon as possible instead.
    (duration.as_millis().min(MAX_EXPIRY_MS as u128) as u64).max(1)
}

pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn token_bytes(token: FencingToken) -> [u8; 8] {
    token.0.to_be_bytes()
}

fn fingerprint_from(bytes: &[u8]) -> Result<Fingerprint, StoreError> {
    Fingerprint::from_slice(bytes).ok_or(StoreError::Corrupt(CodecError::Truncated))
}

/// The response of a completed (`'E'`) value at least [`COMPLETED_UNTIL_HEADER_LEN`] long.
fn decode_completed(value: Vec<u8>) -> Result<CompletedRecord, StoreError> {
    let fingerprint = fingerprint_from(&value[1..33])?;
    let mut record =
        CompletedRecord::decode(Bytes::from(value).slice(COMPLETED_UNTIL_HEADER_LEN..))
            .map_err(StoreError::Corrupt)?;
    record.fingerprint = fingerprint;
    Ok(record)
}

/// Decodes a record value read at wall-clock time `now_ms`.
pub(crate) fn decode_state(value: Vec<u8>, now_ms: u64) -> Result<RecordState, StoreError> {
    match value.first() {
        Some(&KIND_IN_FLIGHT) if value.len() == IN_FLIGHT_LEN => {
            let field = |range: std::ops::Range<usize>| -> [u8; 8] {
                value[range].try_into().expect("8 bytes")
            };
            let deadline = u64::from_be_bytes(field(41..49));
            Ok(RecordState::InFlight {
                token: FencingToken(u64::from_be_bytes(field(1..9))),
                fingerprint: fingerprint_from(&value[9..41])?,
                lease_remaining: Duration::from_millis(deadline.saturating_sub(now_ms)),
            })
        }
        Some(&KIND_COMPLETED_UNTIL) if value.len() >= COMPLETED_UNTIL_HEADER_LEN => {
            let deadline = u64::from_be_bytes(value[41..49].try_into().expect("8 bytes"));
            Ok(RecordState::Completed {
                record: decode_completed(value)?,
                ttl_remaining: Duration::from_millis(deadline.saturating_sub(now_ms)),
            })
        }
        _ => Err(corrupt("record kind")),
    }
}

pub(crate) fn in_flight_value(
    token: FencingToken,
    fingerprint: &Fingerprint,
    deadline_ms: u64,
) -> Vec<u8> {
    let mut value = Vec::with_capacity(IN_FLIGHT_LEN);
    value.put_u8(KIND_IN_FLIGHT);
    value.put_slice(&token_bytes(token));
    value.put_slice(fingerprint.as_bytes());
    value.put_u64(deadline_ms);
    value
}

/// A whole `'E'` value with a zero fingerprint, which the completing script overwrites with the
/// in-flight record's (the caller of `complete` does not pass it).
pub(crate) fn completed_value(token: FencingToken, deadline: [u8; 8], encoded: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(COMPLETED_UNTIL_HEADER_LEN + encoded.len());
    value.put_u8(KIND_COMPLETED_UNTIL);
    value.put_bytes(0, 32);
    value.put_slice(&token_bytes(token));
    value.put_slice(&deadline);
    value.extend_from_slice(encoded);
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_idempotency_core::CachedResponse;

    #[test]
    fn a_record_and_its_staging_key_share_a_slot_whatever_the_store_key() {
        use redis::cluster_routing::Slot;
        let keys = [
            "ns:0a1b", "}ns:1", "{ns:2", "n}s:3", "n{s:4", "{}", "}", "{", "}}{{", "a}",
        ];
        let mut seen = std::collections::HashSet::new();
        for store_key in keys {
            let record = record_key("app", store_key);
            let staging = staging_key(&record, FencingToken(7));
            assert_eq!(
                Slot::for_key(&record),
                Slot::for_key(&staging),
                "{store_key:?} -> {record:?}"
            );
            assert!(seen.insert(record), "two store keys share a Redis key");
        }
        // Keys without a leading brace keep the documented layout.
        assert_eq!(record_key("app", "ns:0a1b"), "app:{ns:0a1b}");
        assert_eq!(record_key("app", "}x"), "app:{{}x}");
        assert_eq!(record_key("app", "{}x"), "app:{{{}x}");
    }

    #[test]
    fn expiries_are_never_zero_and_never_overflow() {
        assert_eq!(expiry_ms(Duration::ZERO), 1);
        assert_eq!(expiry_ms(Duration::from_micros(500)), 1);
        assert_eq!(expiry_ms(Duration::from_millis(250)), 250);
        assert_eq!(expiry_ms(Duration::MAX), MAX_EXPIRY_MS);
    }

    #[test]
    fn corrupt_values_are_errors_not_panics() {
        for value in [
            vec![],
            vec![b'X'; 49],
            vec![b'I'; 41],
            vec![b'I'; 50],
            vec![b'C'; 60],
            vec![b'D'; 60],
            vec![b'E'; 48],
        ] {
            assert!(matches!(
                decode_state(value, 100),
                Err(StoreError::Corrupt(_))
            ));
        }
    }

    #[test]
    fn completed_values_carry_their_remaining_ttl() {
        let encoded = CompletedRecord {
            fingerprint: Fingerprint([0; 32]),
            response: CachedResponse {
                status: http::StatusCode::CREATED,
                headers: http::HeaderMap::new(),
                body: Bytes::from_static(b"order"),
                body_omitted: false,
            },
        }
        .encode();
        let mut value = vec![KIND_COMPLETED_UNTIL];
        value.extend_from_slice(&[5; 32]);
        value.extend_from_slice(&token_bytes(FencingToken(9)));
        value.extend_from_slice(&10_250u64.to_be_bytes());
        value.extend_from_slice(&encoded);
        match decode_state(value.clone(), 10_000).unwrap() {
            RecordState::Completed {
                record,
                ttl_remaining,
            } => {
                assert_eq!(record.fingerprint, Fingerprint([5; 32]));
                assert_eq!(record.response.body, "order");
                assert_eq!(ttl_remaining, Duration::from_millis(250));
            }
            other => panic!("expected a completed record, got {other:?}"),
        }
        assert!(matches!(
            decode_state(value, 20_000).unwrap(),
            RecordState::Completed { ttl_remaining, .. } if ttl_remaining.is_zero()
        ));
    }

    #[test]
    fn in_flight_values_decode_with_their_remaining_lease() {
        let value = in_flight_value(FencingToken(u64::MAX), &Fingerprint([9; 32]), 10_250);
        assert_eq!(value.len(), IN_FLIGHT_LEN);
        assert_eq!(
            decode_state(value.clone(), 10_000).unwrap(),
            RecordState::InFlight {
                fingerprint: Fingerprint([9; 32]),
                token: FencingToken(u64::MAX),
                lease_remaining: Duration::from_millis(250),
            }
        );
        // A reader whose clock is past the deadline sees no time left, never a negative one.
        assert!(matches!(
            decode_state(value, 20_000).unwrap(),
            RecordState::InFlight { lease_remaining, .. } if lease_remaining.is_zero()
        ));
    }
}
