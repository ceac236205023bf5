//! The core of [tower-idempotency]: a Tower layer that makes HTTP endpoints safe to call twice.
//!
//! - [`IdempotencyLayer`] guards requests by a key, claims it atomically in a [`Store`], runs the
//!   handler once, caches its response and replays it to every duplicate.
//! - [`Store`] is the contract every backend implements; [`MemoryStore`] is the in-process one.
//!   The SQLite, Postgres and Redis stores live in their own crates.
//! - [`KeySource`] derives the key: [`ClientKey`] reads the `Idempotency-Key` header; webhook
//!   providers verify a signature and return the event id.
//! - Every refusal is an RFC 9457 [`Problem`].
//!
//! [tower-idempotency]: https://docs.rs/tower-idempotency
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod authenticator;
pub mod fingerprint;
pub mod idempotency;
pub mod key;
pub mod outcome;
pub mod policy;
pub mod problem;
pub mod scope;
pub mod shutdown;
pub mod store;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use authenticator::Authenticator;
pub use fingerprint::{FingerprintError, FingerprintMode};
pub use idempotency::{IdempotencyLayer, IdempotencyService, TransactionalError};
pub use key::{ClientKey, KeyError, KeySource, IDEMPOTENCY_KEY};
pub use outcome::Outcome;
pub use policy::{CacheDirective, CachePolicy};
pub use problem::{Problem, Rejection};
pub use scope::{Principal, PrincipalSource, RouteScope};
pub use shutdown::ShutdownHandle;
pub use store::{
    CachedResponse, ClaimOutcome, CompletedRecord, FencingToken, Fingerprint, LocalReplayCache,
    MemoryStore, Ownership, RecordState, Store, StoreError, LONGEST_DURATION,
};
pub use store::{CommitError, StoreTransaction, TransactionalStore};

use http::HeaderName;

/// Set to `true` on every replayed response.
pub static REPLAYED_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Set to `true` on a replay whose original body exceeded the cache cap and was not stored: the
/// replay carries the original status and headers and an empty body.
pub static BODY_OMITTED_HEADER: HeaderName = HeaderName::from_static("idempotent-body-omitted");
