//! Pieces both backends share: decoding rows, mapping errors, purging in the background.

use std::{
    future::Future,
    sync::{Arc, Weak},
    time::Duration,
};

use bytes::Bytes;
use http::StatusCode;
use tower_idempotency_core::{
    decode_headers, encode_headers, CachedResponse, ClaimOutcome, CodecError, CompletedRecord,
    FencingToken, Fingerprint, Ownership, RecordState, StoreError, LONGEST_DURATION,
};

pub(crate) const STATE_IN_FLIGHT: i16 = 0;
pub(crate) const STATE_COMPLETED: i16 = 1;

/// Rows removed per purge statement, so a purge never holds locks on a large part of the table.
pub(crate) const PURGE_BATCH: i64 = 1000;

/// A row as both backends read it back.
pub(crate) struct RawRecord {
    pub token: i64,
    pub fingerprint: Vec<u8>,
    pub state: i16,
    pub remaining: Duration,
    pub status: Option<i16>,
    pub headers: Option<Vec<u8>>,
    pub body: Option<Vec<u8>>,
    pub body_omitted: bool,
}

impl RawRecord {
    pub fn into_state(self) -> Result<RecordState, StoreError> {
        let fingerprint = Fingerprint::from_slice(&self.fingerprint)
            .ok_or(StoreError::Corrupt(CodecError::Invalid("fingerprint")))?;
        match self.state {
            STATE_IN_FLIGHT => Ok(RecordState::InFlight {
                fingerprint,
                token: FencingToken(self.token as u64),
                lease_remaining: self.remaining,
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
                    ttl_remaining: self.remaining,
                })
            }
            _ => Err(StoreError::Corrupt(CodecError::Invalid("state"))),
        }
    }

    /// The claim statement returns the row after it ran; `claimed` says whether the row is ours
    /// (in flight with the caller's token).
    pub fn into_claim_outcome(self, claimed: bool) -> Result<ClaimOutcome, StoreError> {
        if claimed {
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

/// Runs one store statement on a lane of `$store.lanes` (see [`crate::lanes`]): `$call` is a
/// future that uses the connection `$conn` and yields `Result<_, StoreError>`. The lane keeps
/// its connection only when the statement succeeded.
macro_rules! on_lane {
    ($store:expr, |$conn:ident| $call:expr) => {{
        match $store.lanes.take().await {
            Ok(mut lane) => {
                let result = match lane.connection().await {
                    Ok($conn) => $call.await,
                    Err(error) => Err($store.map_error(error, None)),
                };
                lane.settle(result.is_ok());
                result
            }
            Err(error) => Err($store.map_error(error, None)),
        }
    }};
}
pub(crate) use on_lane;

/// Milliseconds as the databases store them, saturating instead of wrapping for absurd durations.
pub(crate) fn millis(duration: Duration) -> i64 {
    // Capped at a hundred years: Postgres's timestamps end in 294276 AD, so `now + i64::MAX ms`
    // would be "interval out of range" instead of "as long as possible".
    i64::try_from(duration.min(LONGEST_DURATION).as_millis()).unwrap_or(i64::MAX / 4)
}

/// Whether a claim or renewal that started at `started` took long enough (a quarter of the
/// lease) that the lease it wrote, dated from before any wait, needs restarting.
fn waited_too_long(started: std::time::Instant, lease: Duration) -> bool {
    started.elapsed() > lease / 4
}

/// Runs a claim statement; when it waited long (a row lock, SQLite's write lock) after dating
/// its lease, the lease may be short or already over, so a granted claim is renewed before it
/// is answered. If the lease is gone, someone else holds the key now: a second claim statement
/// says who, instead of granting a dead claim.
pub(crate) async fn claim_with_a_whole_lease<C, CF, R, RF>(
    claim_once: C,
    renew: R,
    lease: Duration,
) -> Result<ClaimOutcome, StoreError>
where
    C: Fn() -> CF,
    CF: Future<Output = Result<ClaimOutcome, StoreError>>,
    R: FnOnce(FencingToken) -> RF,
    RF: Future<Output = Result<Ownership, StoreError>>,
{
    let started = std::time::Instant::now();
    match claim_once().await? {
        ClaimOutcome::Claimed { token } if waited_too_long(started, lease) => {
            match renew(token).await? {
                Ownership::Current => Ok(ClaimOutcome::Claimed { token }),
                Ownership::Stale => claim_once().await,
            }
        }
        outcome => Ok(outcome),
    }
}

/// Runs a renewal statement, again (up to three in all) while they wait long: a renewal dates
/// its lease before it waits, and the next one usually does not wait.
pub(crate) async fn renew_for_a_whole_lease<R, RF>(
    renew_once: R,
    lease: Duration,
) -> Result<Ownership, StoreError>
where
    R: Fn() -> RF,
    RF: Future<Output = Result<Ownership, StoreError>>,
{
    let mut attempts = 0;
    loop {
        let started = std::time::Instant::now();
        let renewed = renew_once().await?;
        attempts += 1;
        if renewed == Ownership::Stale || !waited_too_long(started, lease) || attempts == 3 {
            return Ok(renewed);
        }
    }
}

/// Fencing tokens are stored as non-negative `i64`s (every value of `FencingToken::random`);
/// anything else can never be current.
pub(crate) fn token_param(token: FencingToken) -> Option<i64> {
    i64::try_from(token.0).ok()
}

/// A claim's token does not fit the `bigint` column (above `i64::MAX`; `FencingToken::random`
/// never draws one).
#[derive(Debug, thiserror::Error)]
#[error("fencing token out of the stored range (above i64::MAX)")]
pub(crate) struct TokenOutOfRange;

/// Size of the data a completed row holds, as checked against the store's record limit.
fn record_size(headers: &[u8], response: &CachedResponse) -> usize {
    64 + headers.len() + response.body.len()
}

/// What a completion writes, checked before any connection is taken: the token as stored, the
/// encoded headers and the record's size. `Ok(None)` when the token can never be current;
/// `RecordTooLarge` over `limit`.
pub(crate) fn prepare_completion(
    token: FencingToken,
    response: &CachedResponse,
    limit: usize,
) -> Result<Option<(i64, Vec<u8>, usize)>, StoreError> {
    let Some(token) = token_param(token) else {
        return Ok(None);
    };
    let headers = encode_headers(&response.headers);
    let size = record_size(&headers, response);
    if size > limit {
        return Err(StoreError::RecordTooLarge { size, limit });
    }
    Ok(Some((token, headers, size)))
}

/// Maps a database error to the store error the layer acts on. `size` is the size of the record
/// being written, when the failing statement wrote one.
pub(crate) fn map_error(error: sqlx::Error, size: Option<usize>, limit: usize) -> StoreError {
    match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreError::Unavailable(Box::new(error)),
        sqlx::Error::Database(db) => {
            let code = db.code();
            let code = code.as_deref().unwrap_or_default();
            if is_too_big(code) {
                return StoreError::RecordTooLarge {
                    size: size.unwrap_or(0),
                    limit,
                };
            }
            let sanitized = Box::new(DatabaseError {
                code: code.to_owned(),
                message: db.message().to_owned(),
            });
            if is_unavailable(code) {
                StoreError::Unavailable(sanitized)
            } else {
                StoreError::Backend(sanitized)
            }
        }
        _ => StoreError::Backend(Box::new(error)),
    }
}

/// A database error reduced to its code and primary message. The driver's error also carries
/// the server's detail fields, which can quote the failing row (keys, cached bodies); those must
/// not reach logs through `Debug`.
#[derive(Debug, thiserror::Error)]
#[error("database error {code}: {message}")]
struct DatabaseError {
    code: String,
    message: String,
}

/// SQLite's (extended) result code, when `code` is one. Postgres SQLSTATEs are always five
/// characters, some all digits (42501), so they must not be read as SQLite codes, which have at
/// most four digits.
fn sqlite_code(code: &str) -> Option<i32> {
    if code.len() < 5 {
        code.parse().ok()
    } else {
        None
    }
}

fn is_too_big(code: &str) -> bool {
    // Postgres 54000 program_limit_exceeded (e.g. a value over 1 GB); SQLite SQLITE_TOOBIG (18).
    code == "54000" || sqlite_code(code).is_some_and(|c| c & 0xff == 18)
}

fn is_unavailable(code: &str) -> bool {
    // Postgres class 08 (connection exception), 57P01..57P03 (shutdown, cannot connect now),
    // 53300 too many connections; SQLite SQLITE_BUSY (5) and SQLITE_LOCKED (6) after the busy
    // timeout, and SQLITE_CANTOPEN (14).
    code.starts_with("08")
        || matches!(code, "57P01" | "57P02" | "57P03" | "53300")
        || sqlite_code(code).is_some_and(|c| matches!(c & 0xff, 5 | 6 | 14))
}

/// Runs `purge` every `every` for as long as the store behind `store` is alive.
pub(crate) fn spawn_purger<S, F, Fut>(
    store: Weak<S>,
    every: Duration,
    purge: F,
) -> tokio::task::JoinHandle<()>
where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<u64, StoreError>> + Send,
{
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            // Holding only a weak reference between runs lets the store (and its pool) drop.
            let Some(store) = store.upgrade() else { return };
            match purge(store).await {
                Ok(0) => {}
                Ok(purged) => tracing::debug!(purged, "purged expired idempotency records"),
                Err(error) => tracing::warn!(%error, "purging expired idempotency records failed"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_codes_are_never_read_as_sqlite_codes() {
        // 42501 insufficient_privilege: 42501 & 0xff == 5 (SQLITE_BUSY) if read as a number.
        for code in ["42501", "22021", "22022", "22030", "22034"] {
            assert!(!is_unavailable(code), "{code}");
            assert!(!is_too_big(code), "{code}");
        }
        assert!(is_unavailable("5") && is_unavailable("517") && is_unavailable("08006"));
        assert!(is_too_big("18") && is_too_big("54000"));
    }

    #[test]
    fn durations_are_capped_at_a_hundred_years() {
        assert_eq!(millis(Duration::MAX), millis(LONGEST_DURATION));
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
    }
}
