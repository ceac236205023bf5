//! The store contract ([`Store`]), its records and errors, and the stores this crate ships.

mod codec;
mod local_cache;
mod memory;
mod settlements;
mod transaction;

pub use codec::{decode_headers, encode_headers, CodecError};
pub use local_cache::{LocalReplayCache, DEFAULT_LOCAL_CACHE_BYTES, DEFAULT_LOCAL_CACHE_TTL};
pub use memory::MemoryStore;
pub(crate) use settlements::{KeySignal, KeySignals};
pub use settlements::{Settlement, Settlements, Subscriber};
pub use transaction::{CommitError, StoreTransaction, TransactionalStore};

use std::{cell::RefCell, fmt, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use rand_chacha::{
    rand_core::{RngCore, SeedableRng},
    ChaCha12Rng,
};

/// A boxed error from a store backend.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A 32-byte hash (BLAKE3 in the built-in modes) over the parts of a request that must be
/// identical for a replay to be served.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The raw 32 bytes, as stores persist them.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Rebuilds a fingerprint from bytes read back from a store.
    ///
    /// Returns `None` unless `bytes` is exactly 32 bytes long.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        <[u8; 32]>::try_from(bytes).ok().map(Self)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({}..)", hex::encode(&self.0[..6]))
    }
}

/// Identifies one claim of a key. Only the holder of the current token may complete, renew or
/// release the record, so a stale worker can never overwrite a newer holder's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// A fresh token: 63 random bits, so it fits a non-negative `i64` (a SQL `bigint`). Two
    /// claims share a token with a chance of 2⁻⁶³.
    ///
    /// The bits come from a ChaCha12 generator per thread, seeded once from the operating
    /// system's CSPRNG: a system call on every claim costs more than a memory store's whole
    /// replay (bench `layer`, `request_1k/layer_replay`).
    ///
    /// Fails only when the operating system cannot provide the seed.
    pub fn random() -> std::io::Result<Self> {
        TOKEN_GENERATOR.with_borrow_mut(|slot| {
            let bits = match slot {
                Some(generator) => generator.next_u64(),
                None => {
                    let mut seed = [0u8; 32];
                    getrandom::fill(&mut seed).map_err(std::io::Error::from)?;
                    let mut generator = ChaCha12Rng::from_seed(seed);
                    let bits = generator.next_u64();
                    *slot = Some(generator);
                    bits
                }
            };
            Ok(Self(bits >> 1))
        })
    }
}

thread_local! {
    static TOKEN_GENERATOR: RefCell<Option<ChaCha12Rng>> = const { RefCell::new(None) };
}

/// A response as it is cached and replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedResponse {
    /// The handler's status code.
    pub status: StatusCode,
    /// The headers worth replaying (hop-by-hop headers, `Date` and `Set-Cookie` are never stored).
    pub headers: HeaderMap,
    /// The response body; empty when [`CachedResponse::body_omitted`] is set.
    pub body: Bytes,
    /// The body was larger than the cache cap and was not stored; replays carry the
    /// [`BODY_OMITTED_HEADER`](crate::BODY_OMITTED_HEADER) marker instead.
    pub body_omitted: bool,
}

/// A completed record: the fingerprint of the request that produced it and its response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletedRecord {
    /// Fingerprint of the request that ran the handler.
    pub fingerprint: Fingerprint,
    /// The cached response.
    pub response: CachedResponse,
}

/// What [`Store::claim`] found or did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The caller now holds the key and must run the handler, then complete or release.
    Claimed {
        /// The token to present to `complete`, `renew` and `release`.
        token: FencingToken,
    },
    /// Another request holds the key and has not finished.
    InFlight {
        /// Fingerprint of the request holding the key.
        fingerprint: Fingerprint,
        /// Time left on the holder's lease, used for `Retry-After`.
        lease_remaining: Duration,
    },
    /// The key completed earlier; replay this response.
    Completed {
        /// The completed record.
        record: CompletedRecord,
        /// Time left before the record expires in the store; a cache must not serve it longer.
        ttl_remaining: Duration,
    },
}

/// Whether a fenced call came from the current holder of the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// The token was current; the call took effect.
    Current,
    /// The token was not current (reclaimed after a lease expiry, released, or purged); nothing
    /// changed.
    Stale,
}

/// The state of a record as [`Store::get`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordState {
    /// Claimed and not yet finished.
    InFlight {
        /// Fingerprint of the holder's request.
        fingerprint: Fingerprint,
        /// The holder's token.
        token: FencingToken,
        /// Time left on the lease.
        lease_remaining: Duration,
    },
    /// Finished, with its cached response.
    Completed {
        /// The completed record.
        record: CompletedRecord,
        /// Time left before the record expires.
        ttl_remaining: Duration,
    },
}

/// Why a store call failed. The layer answers every one of these with `503` (fail closed).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backend could not be reached (connection refused, pool exhausted, cluster down).
    #[error("store unavailable")]
    Unavailable(#[source] BoxError),
    /// The backend did not answer within the configured store timeout.
    #[error("store call timed out after {0:?}")]
    Timeout(Duration),
    /// The backend answered with an error.
    #[error("store backend error")]
    Backend(#[source] BoxError),
    /// The record is larger than this backend accepts.
    #[error("record of {size} bytes exceeds the store limit of {limit} bytes")]
    RecordTooLarge {
        /// Size of the encoded record.
        size: usize,
        /// The largest record the store accepts.
        limit: usize,
    },
    /// A stored record could not be decoded.
    #[error("stored record is corrupt")]
    Corrupt(#[source] CodecError),
    /// A bounded store is full of live records.
    #[error("store is at capacity ({0} records)")]
    CapacityExceeded(usize),
}

/// A backend that records idempotency keys.
///
/// A [`Store`] holds one record per scoped key. A record is either **in flight** (claimed by one
/// request, protected by a lease and a fencing token) or **completed** (holding the cached response
/// until its TTL ends). The layer drives a store through four calls:
///
/// | call | when | must be atomic with respect to other calls on the same key |
/// |---|---|---|
/// | [`Store::claim`] | before the handler runs | yes: of many concurrent claimers exactly one gets [`ClaimOutcome::Claimed`] |
/// | [`Store::renew`] | while a slow handler runs | yes: only the current holder extends the lease |
/// | [`Store::complete`] | after a response the policy keeps | yes: only the current holder writes the response |
/// | [`Store::release`] | after a response the policy drops, an error or a panic | yes: only the current holder deletes the record |
///
/// Two more calls serve inspection and administration, never the layer's request path:
/// [`Store::get`] reads a record, and [`Store::forget`] deletes one whatever its state.
///
/// # The contract in detail
/// - **Claim.** If no record exists, or the record is in flight with an expired lease, or the
///   record is completed with an expired TTL, the store writes a new in-flight record with the
///   caller's fencing token and answers [`ClaimOutcome::Claimed`]. A live in-flight record that
///   already carries the caller's token is the caller's own claim (a resent claim whose first
///   attempt landed) and is answered `Claimed` too. Otherwise the store answers with the existing
///   record's state ([`ClaimOutcome::InFlight`] or [`ClaimOutcome::Completed`], with the time
///   the record has left) *from the same atomic step*, so the duplicate needs no second round
///   trip. The store never compares fingerprints itself: it reports the existing record's
///   fingerprint and the layer decides.
/// - **Fencing tokens** are chosen by the caller of `claim`, one per claim: the layer draws 63
///   random bits from a CSPRNG seeded by the operating system ([`FencingToken::random`]), so
///   tokens stay unique without any counter surviving in the store, and a caller that gave up
///   on a claim still knows the token to release it with. A store persists the token as it is (every value of
///   `FencingToken::random` fits a non-negative SQL `bigint`). `complete`, `renew` and `release`
///   succeed only when the record's current token equals the caller's; otherwise they change
///   nothing and answer [`Ownership::Stale`]. A holder whose lease expired but whose key nobody
///   reclaimed yet may still be accepted or may be answered `Stale`: both are allowed. A
///   `complete` that finds the live record already completed by the same token is a resend of
///   the completion that landed (its answer was lost to a timeout, a dropped connection or a
///   client's resend): the store answers `Current` and changes nothing, so the layer does not
///   count a recorded result as unrecorded (conformance: `a_resent_completion_is_current`).
/// - **Leases** bound how long a crashed holder blocks its key. Expired leases need no background
///   sweep to become claimable: `claim` treats them as absent.
/// - **TTL** bounds how long a completed record is replayed. After it the key behaves as new.
/// - **Errors** are reported, never hidden: a store that cannot answer returns a [`StoreError`]
///   and the layer fails closed.
///
/// Every store in this project runs the public conformance suite
/// (`tower_idempotency_core::conformance`, feature `conformance`) unchanged; so should yours.
///
/// `key` is the scoped key built by the layer: a namespace, a colon and 64 hex digits, at most 320
/// bytes, visible ASCII only, so it can be used as a primary key or a Redis key as it is.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Atomically claims `key` with the caller's `token`, or reports the existing record's state
    /// in the same step. A live in-flight record that already carries `token` is answered
    /// [`ClaimOutcome::Claimed`].
    async fn claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        token: FencingToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError>;

    /// Extends the lease of the current holder to `lease` from now.
    async fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Ownership, StoreError>;

    /// Stores the response for the current holder and keeps it for `ttl`.
    async fn complete(
        &self,
        key: &str,
        token: FencingToken,
        response: &CachedResponse,
        ttl: Duration,
    ) -> Result<Ownership, StoreError>;

    /// Deletes the current holder's in-flight record so the next request runs the handler.
    async fn release(&self, key: &str, token: FencingToken) -> Result<Ownership, StoreError>;

    /// Reads a record without changing it. Expired records read as `None`.
    async fn get(&self, key: &str) -> Result<Option<RecordState>, StoreError>;

    /// Deletes the record of `key` whatever its state, for operators (a support case, a poisoned
    /// record): the next request with this key runs the handler. Answers whether a live record
    /// was deleted (`false` when the key was absent or had expired).
    ///
    /// Forgetting an in-flight key does not stop its running handler, and its holder's later
    /// `complete`, `renew` or `release` answers [`Ownership::Stale`] (its token is gone), so the
    /// handler may run a second time for a retry sent meanwhile. Not used by the layer itself.
    async fn forget(&self, key: &str) -> Result<bool, StoreError>;

    /// The store's transactions, for the layer's transactional mode
    /// ([`IdempotencyLayer::transactional`](crate::IdempotencyLayer::transactional)): `None`
    /// (the default) for a store that cannot commit the handler's writes together with the
    /// completion.
    fn transactions(&self) -> Option<&dyn TransactionalStore> {
        None
    }

    /// A short lowercase name of the backend (`"memory"`, `"sqlite"`, `"postgres"`, `"redis"`),
    /// the `store` label of the layer's store call metrics; `"custom"` by default.
    fn name(&self) -> &'static str {
        "custom"
    }

    /// Notices that keys were settled by any instance, for requests waiting on an in-flight key
    /// ([`IdempotencyLayer::wait_for_result`](crate::IdempotencyLayer::wait_for_result)):
    /// `None` (the default) for a store that cannot push them, whose waiters claim the key
    /// again on a timer instead.
    ///
    /// A store offering them sends a notice naming the key after every `complete`, `release`
    /// and `forget` that changed a record (in the same statement or script, so a notice is
    /// never sent for a change that did not happen; a store for which notices are costly may
    /// send them only for keys a waiter marked, see [`Settlements::with_watch`]), keeps one
    /// subscription per store object that feeds the returned [`Settlements`] (a
    /// [`Subscriber`] runs it), and may start it lazily on the first call (so this is called
    /// on a Tokio runtime). Notices may be lost; waiters still claim again when the holder's
    /// lease or their wait ends.
    fn settlements(&self) -> Option<Settlements> {
        None
    }
}

/// A [`Store`] call, as a wrapper that forwards calls sees it (the `Hooks` of the conformance
/// suite's `Hooked` store).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// [`Store::claim`].
    Claim,
    /// [`Store::renew`].
    Renew,
    /// [`Store::complete`].
    Complete,
    /// [`Store::release`].
    Release,
    /// [`Store::get`].
    Get,
    /// [`Store::forget`].
    Forget,
}

/// Implements [`Store`] for a wrapper that forwards every call to the store `$inner` reaches
/// from `$this` (bound to `self`), the call's future passing through the async function
/// `$around(self, call, key, future)`; `transactions`, `name` and `settlements` are the wrapped
/// store's.
macro_rules! forward_store {
    (impl[$($generics:tt)*] $ty:ty, |$this:ident| $inner:expr, $around:expr) => {
        #[async_trait::async_trait]
        impl<$($generics)*> $crate::store::Store for $ty {
            async fn claim(
                &self,
                key: &str,
                fingerprint: &$crate::store::Fingerprint,
                token: $crate::store::FencingToken,
                lease: std::time::Duration,
            ) -> Result<$crate::store::ClaimOutcome, $crate::store::StoreError> {
                let $this = self;
                let call = $inner.claim(key, fingerprint, token, lease);
                $around(self, $crate::store::Call::Claim, key, call).await
            }

            async fn renew(
                &self,
                key: &str,
                token: $crate::store::FencingToken,
                lease: std::time::Duration,
            ) -> Result<$crate::store::Ownership, $crate::store::StoreError> {
                let $this = self;
                let call = $inner.renew(key, token, lease);
                $around(self, $crate::store::Call::Renew, key, call).await
            }

            async fn complete(
                &self,
                key: &str,
                token: $crate::store::FencingToken,
                response: &$crate::store::CachedResponse,
                ttl: std::time::Duration,
            ) -> Result<$crate::store::Ownership, $crate::store::StoreError> {
                let $this = self;
                let call = $inner.complete(key, token, response, ttl);
                $around(self, $crate::store::Call::Complete, key, call).await
            }

            async fn release(
                &self,
                key: &str,
                token: $crate::store::FencingToken,
            ) -> Result<$crate::store::Ownership, $crate::store::StoreError> {
                let $this = self;
                let call = $inner.release(key, token);
                $around(self, $crate::store::Call::Release, key, call).await
            }

            async fn get(
                &self,
                key: &str,
            ) -> Result<Option<$crate::store::RecordState>, $crate::store::StoreError> {
                let $this = self;
                let call = $inner.get(key);
                $around(self, $crate::store::Call::Get, key, call).await
            }

            async fn forget(&self, key: &str) -> Result<bool, $crate::store::StoreError> {
                let $this = self;
                let call = $inner.forget(key);
                $around(self, $crate::store::Call::Forget, key, call).await
            }

            fn transactions(&self) -> Option<&dyn $crate::store::TransactionalStore> {
                let $this = self;
                $inner.transactions()
            }

            fn name(&self) -> &'static str {
                let $this = self;
                $inner.name()
            }

            fn settlements(&self) -> Option<$crate::store::Settlements> {
                let $this = self;
                $inner.settlements()
            }
        }
    };
}
#[cfg(feature = "conformance")]
pub(crate) use forward_store;

/// The `$around` of a wrapper that adds nothing to the calls it forwards.
async fn as_is<W: ?Sized, F: std::future::Future>(_: &W, _: Call, _: &str, call: F) -> F::Output {
    call.await
}

forward_store!(impl[S: Store + ?Sized] Arc<S>, |this| (**this), as_is);

/// The longest lease, TTL or renewal ceiling anything here honours: a hundred years, which every
/// store can represent (Postgres timestamps, Redis `PX`, `Instant`) and which serves as "forever".
pub const LONGEST_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// `now + after`, saturating at [`LONGEST_DURATION`] instead of panicking on overflow, so a
/// caller's `Duration::MAX` means "as long as possible".
pub(crate) fn deadline_after(now: std::time::Instant, after: Duration) -> std::time::Instant {
    now + after.min(LONGEST_DURATION)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::FencingToken;

    /// Tokens fit a non-negative `bigint` and do not repeat, within a thread or across threads
    /// (each thread seeds its own generator).
    #[test]
    fn tokens_are_distinct_non_negative_bigints() {
        let draw = || {
            (0..10_000)
                .map(|_| FencingToken::random().expect("token").0)
                .collect::<Vec<_>>()
        };
        let here = draw();
        let there = std::thread::spawn(draw).join().unwrap();
        let all: HashSet<u64> = here.iter().chain(&there).copied().collect();
        assert_eq!(all.len(), 20_000, "a token repeated");
        assert!(all.iter().all(|&t| i64::try_from(t).is_ok()));
    }
}
