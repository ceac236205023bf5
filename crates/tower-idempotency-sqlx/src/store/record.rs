//! Rows as the store reads and writes them: the parameters of its statements, built from a
//! call's arguments (a completion checked against the store's limit first), and the rows it
//! reads, turned into the core's record types.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use tower_idempotency_core::{
    decode_headers, encode_headers, CachedResponse, ClaimOutcome, CodecError, CompletedRecord,
    FencingToken, Fingerprint, RecordState, StoreError, LONGEST_DURATION,
};

pub(crate) const STATE_IN_FLIGHT: i16 = 0;
pub(crate) const STATE_COMPLETED: i16 = 1;

/// A row as a backend decodes it, before it is checked.
#[derive(Debug)]
pub struct RawRecord {
    pub(crate) token: i64,
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) state: i16,
    /// Lease or TTL left; negative once past.
    pub(crate) remaining_ms: i64,
    pub(crate) status: Option<i16>,
    pub(crate) headers: Option<Vec<u8>>,
    pub(crate) body: Option<Vec<u8>>,
    pub(crate) body_omitted: bool,
}

impl RawRecord {
    pub(crate) fn into_state(self) -> Result<RecordState, StoreError> {
        let remaining = Duration::from_millis(self.remaining_ms.max(0) as u64);
        let fingerprint = Fingerprint::from_slice(&self.fingerprint)
            .ok_or(StoreError::Corrupt(CodecError::Invalid("fingerprint")))?;
        match self.state {
            STATE_IN_FLIGHT => Ok(RecordState::InFlight {
                fingerprint,
                token: FencingToken(self.token as u64),
                lease_remaining: remaining,
            }),
            STATE_COMPLETED => {
                let status = self
                    .status
                    .and_then(|s| u16::try_from(s).ok())
                    .and_then(|s| StatusCode::from_u16(s).ok())
                    .ok_or(StoreError::Corrupt(CodecError::Invalid("status")))?;
                let headers = decode_headers(self.headers.as_deref().unwrap_or_default())
                    .map_err(StoreError::Corrupt)?;
                Ok(RecordState::Completed {
                    record: CompletedRecord {
                        fingerprint,
                        response: CachedResponse {
                            status,
                            headers,
                            body: self.body.map(Bytes::from).unwrap_or_default(),
                            body_omitted: self.body_omitted,
                        },
                    },
                    ttl_remaining: remaining,
                })
            }
            _ => Err(StoreError::Corrupt(CodecError::Invalid("state"))),
        }
    }

    /// The claim statement returns the row after it ran: the caller's claim when it is in
    /// flight with the caller's token (a new claim, or one an earlier attempt of the same claim
    /// wrote), someone else's record otherwise.
    pub(crate) fn into_claim_outcome(self, token: i64) -> Result<ClaimOutcome, StoreError> {
        if self.token == token && self.state == STATE_IN_FLIGHT {
            return Ok(ClaimOutcome::Claimed {
                token: FencingToken(self.token as u64),
            });
        }
        Ok(match self.into_state()? {
            RecordState::InFlight {
                fingerprint,
                lease_remaining,
                ..
            } => ClaimOutcome::InFlight {
                fingerprint,
                lease_remaining,
            },
            RecordState::Completed {
                record,
                ttl_remaining,
            } => ClaimOutcome::Completed {
                record,
                ttl_remaining,
            },
        })
    }
}

/// The parameters of one statement, which a backend binds in the order its SQL text expects.
/// Durations are milliseconds; a backend whose rows are dated by the store's clock (SQLite)
/// adds them to its `now_ms`.
#[derive(Debug)]
pub enum Params<'q> {
    /// The claim statement and the plain insert.
    Claim(ClaimParams<'q>),
    /// The completion.
    Complete(CompleteParams<'q>),
    /// The renewal.
    Renew {
        key: &'q str,
        token: i64,
        lease_ms: i64,
    },
    /// The release.
    Release { key: &'q str, token: i64 },
    /// The read of a live row.
    Get { key: &'q str },
    /// The deletion of a row whatever its state.
    Forget { key: &'q str },
    /// The purge of expired rows.
    Purge,
}

/// The parameters of a claim or a plain insert.
#[derive(Debug)]
pub struct ClaimParams<'q> {
    pub key: &'q str,
    pub fingerprint: &'q [u8],
    pub token: i64,
    pub lease_ms: i64,
}

/// The parameters of a completion.
#[derive(Debug)]
pub struct CompleteParams<'q> {
    pub key: &'q str,
    pub token: i64,
    pub status: u16,
    pub headers: Vec<u8>,
    pub body: &'q [u8],
    pub body_omitted: bool,
    pub ttl_ms: i64,
}

impl<'q> Params<'q> {
    /// A claim of `key`, and its token as stored ([`claim_token`]).
    pub(crate) fn claim(
        key: &'q str,
        fingerprint: &'q Fingerprint,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(i64, Self), StoreError> {
        let token = claim_token(token)?;
        let params = Params::Claim(ClaimParams {
            key,
            fingerprint: &fingerprint.as_bytes()[..],
            token,
            lease_ms: millis(lease),
        });
        Ok((token, params))
    }

    /// A completion of `key` with `response`, and the record's size; `Ok(None)` when the token
    /// can never be current; `RecordTooLarge` over `limit`, before any connection is taken.
    pub(crate) fn complete(
        key: &'q str,
        token: FencingToken,
        response: &'q CachedResponse,
        ttl: Duration,
        limit: usize,
    ) -> Result<Option<(Self, usize)>, StoreError> {
        let Some(token) = token_param(token) else {
            return Ok(None);
        };
        let headers = encode_headers(&response.headers);
        let size = 64 + headers.len() + response.body.len();
        if size > limit {
            return Err(StoreError::RecordTooLarge { size, limit });
        }
        let params = Params::Complete(CompleteParams {
            key,
            token,
            status: response.status.as_u16(),
            headers,
            body: &response.body[..],
            body_omitted: response.body_omitted,
            ttl_ms: millis(ttl),
        });
        Ok(Some((params, size)))
    }

    /// A renewal of `key`'s lease; `None` when the token can never be current.
    pub(crate) fn renew(key: &'q str, token: FencingToken, lease: Duration) -> Option<Self> {
        Some(Params::Renew {
            key,
            token: token_param(token)?,
            lease_ms: millis(lease),
        })
    }

    /// A release of `key`; `None` when the token can never be current.
    pub(crate) fn release(key: &'q str, token: FencingToken) -> Option<Self> {
        Some(Params::Release {
            key,
            token: token_param(token)?,
        })
    }
}

/// Milliseconds as the databases store them, saturating instead of wrapping for absurd durations.
fn millis(duration: Duration) -> i64 {
    // Capped at a hundred years: Postgres's timestamps end in 294276 AD, so `now + i64::MAX ms`
    // would be "interval out of range" instead of "as long as possible".
    i64::try_from(duration.min(LONGEST_DURATION).as_millis()).unwrap_or(i64::MAX / 4)
}

/// Fencing tokens are stored as non-negative `i64`s (every value of `FencingToken::random`);
/// anything else can never be current.
fn token_param(token: FencingToken) -> Option<i64> {
    i64::try_from(token.0).ok()
}

/// A claim's token as stored, or [`TokenOutOfRange`]: a claim cannot be made with a token no row
/// could hold.
pub(crate) fn claim_token(token: FencingToken) -> Result<i64, StoreError> {
    token_param(token).ok_or(StoreError::Backend(Box::new(TokenOutOfRange)))
}

/// A claim's token does not fit the `bigint` column (above `i64::MAX`; `FencingToken::random`
/// never draws one).
#[derive(Debug, thiserror::Error)]
#[error("fencing token out of the stored range (above i64::MAX)")]
pub(crate) struct TokenOutOfRange;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_capped_at_a_hundred_years() {
        assert_eq!(millis(Duration::MAX), millis(LONGEST_DURATION));
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
    }
}
