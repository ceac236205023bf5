//! The idempotency middleware: [`IdempotencyLayer`] and [`IdempotencyService`] (what they do
//! with a request is told in the crate documentation).

mod answer;
mod authenticated;
mod body;
mod claim;
mod config;
mod detach;
mod future;
mod layer;
mod lease;
mod metrics;
mod replay;
mod request_body;
mod service;
mod settle;
mod transactional;
mod wait;

pub use body::ResponseBody;
pub use future::ResponseFuture;
pub use layer::{
    IdempotencyLayer, DEFAULT_DISCARD_BYTES, DEFAULT_DISCARD_TIME, DEFAULT_LEASE, DEFAULT_MAX_BODY,
    DEFAULT_MAX_CACHED_BODY, DEFAULT_MAX_LEASE_RENEWAL, DEFAULT_MAX_WAITERS, DEFAULT_STORE_TIMEOUT,
    DEFAULT_TTL, MIN_LEASE,
};
#[cfg(feature = "metrics")]
pub use metrics::describe_metrics;
pub use metrics::{
    HANDLERS_IN_FLIGHT, LEASE_RENEWALS_LOST_TOTAL, REQUESTS_TOTAL, RESULTS_UNRECORDED_TOTAL,
    STORE_CALL_DURATION_SECONDS,
};
pub use service::IdempotencyService;
pub use transactional::TransactionalError;
