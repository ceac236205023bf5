//! The core of [tower-idempotency]: a Tower layer that makes HTTP endpoints safe to call twice.
//!
//! - [`IdempotencyLayer`] guards requests by a key, claims it atomically in a [`Store`], runs the
//!   handler once, caches its response and replays it to every duplicate.
//! - [`Store`] is the contract every backend implements; [`MemoryStore`] is the in-process one.
//!   The SQLite, Postgres and Redis stores live in their own crates.
//! - [`KeySource`] derives the key: [`ClientKey`] reads the `Idempotency-Key` header; webhook
//!   providers verify a signature and return the event id.
//! - Every refusal is an RFC 9457 [`Problem`].
//! - [`RunOnce`] runs any async work once per key without HTTP (a queue consumer's loop), with
//!   the layer's claim, lease, wait and TTL semantics on any store.
//!
//! # What the layer does with a request
//!
//! For each guarded request (by default `POST` and `PATCH`) the service:
//!
//! 1. buffers the body under a cap (`413` past it, checked against `Content-Length` first);
//! 2. derives the key through its [`KeySource`] (`400` for a missing or invalid
//!    `Idempotency-Key`, a provider's own problem for a bad signature);
//! 3. scopes it by namespace, method, path and principal (or by namespace and route template,
//!    see [`RouteScope`]), and fingerprints the request;
//! 4. claims it in the [`Store`]: a claim runs the handler (to completion even if the caller
//!    disconnects), an in-flight duplicate gets `409` (or, with
//!    [`wait_for_result`](IdempotencyLayer::wait_for_result), waits for the first one's result),
//!    a completed key is replayed with `Idempotent-Replayed: true`, a reused key with another
//!    fingerprint gets `422`, a failing store gets `503`;
//! 5. completes or releases the key according to the [`CachePolicy`].
//!
//! # Example
//!
//! ```
//! use axum::{routing::post, Json, Router};
//! use tower_idempotency_core::{IdempotencyLayer, MemoryStore};
//!
//! async fn create_order(Json(order): Json<serde_json::Value>) -> Json<serde_json::Value> {
//!     Json(serde_json::json!({ "order_id": "ord_1", "order": order }))
//! }
//!
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order))
//!     .route_layer(IdempotencyLayer::client_keys(MemoryStore::new()).namespace("orders"));
//! # let _ = app;
//! ```
//!
//! [tower-idempotency]: https://docs.rs/tower-idempotency
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod authenticator;
mod fingerprint;
mod idempotency;
mod key;
mod key_header;
mod once;
mod outcome;
mod policy;
mod problem;
mod scope;
mod shutdown;
mod store;

#[cfg(feature = "conformance")]
pub mod conformance;

#[doc(inline)]
pub use authenticator::Authenticator;
#[doc(inline)]
pub use fingerprint::{FingerprintError, FingerprintMode, JsonPointers};
#[cfg(feature = "metrics")]
#[doc(inline)]
pub use idempotency::describe_metrics;
#[doc(inline)]
pub use idempotency::{
    IdempotencyLayer, IdempotencyService, ResponseBody, ResponseFuture, TransactionalError,
    DEFAULT_DISCARD_BYTES, DEFAULT_DISCARD_TIME, DEFAULT_LEASE, DEFAULT_MAX_BODY,
    DEFAULT_MAX_CACHED_BODY, DEFAULT_MAX_LEASE_RENEWAL, DEFAULT_MAX_WAITERS, DEFAULT_STORE_TIMEOUT,
    DEFAULT_TTL, HANDLERS_IN_FLIGHT, LEASE_RENEWALS_LOST_TOTAL, MIN_LEASE, REQUESTS_TOTAL,
    RESULTS_UNRECORDED_TOTAL, STORE_CALL_DURATION_SECONDS,
};
#[doc(inline)]
pub use key::{ClientKey, KeySource};
#[doc(inline)]
pub use key_header::{parse_key, KeyError, IDEMPOTENCY_KEY, MAX_KEY_LEN};
#[doc(inline)]
pub use once::{OnceError, Ran, RunOnce};
#[doc(inline)]
pub use outcome::Outcome;
#[doc(inline)]
pub use policy::{cacheable_headers, CacheDirective, CachePolicy, UNCACHED_HEADERS};
#[doc(inline)]
pub use problem::{Problem, Rejection, PROBLEM_JSON, PROBLEM_TYPE_PREFIX};
#[doc(inline)]
pub use scope::{
    is_valid_namespace, store_key_from_parts, Principal, PrincipalSource, RouteScope, Scope,
    MAX_NAMESPACE_LEN,
};
#[doc(inline)]
pub use shutdown::ShutdownHandle;
#[doc(inline)]
pub use store::{
    decode_headers, encode_headers, BoxError, CachedResponse, ClaimOutcome, CodecError,
    CommitError, CompletedRecord, FencingToken, Fingerprint, LocalReplayCache, MemoryStore,
    Ownership, RecordState, Settlement, Settlements, Store, StoreError, StoreTransaction,
    Subscriber, TransactionalStore, DEFAULT_LOCAL_CACHE_BYTES, DEFAULT_LOCAL_CACHE_TTL,
    LONGEST_DURATION,
};

use http::HeaderName;

/// Set to `true` on every replayed response.
pub static REPLAYED_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Set to `true` on a replay whose original body exceeded the cache cap and was not stored: the
/// replay carries the original status and headers and an empty body.
pub static BODY_OMITTED_HEADER: HeaderName = HeaderName::from_static("idempotent-body-omitted");
