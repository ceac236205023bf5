//! [`Config`]: what one layer's builder settled, shared by every step of a request.

use std::{
    sync::{atomic::AtomicBool, Arc},
    time::Duration,
};

use http::{Method, StatusCode};
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use super::wait::Waiters;
use crate::{
    fingerprint::FingerprintMode, key::KeySource, policy::CachePolicy, scope::Scope, store::Store,
};

/// Which methods a layer guards.
#[derive(Clone, Debug)]
pub(crate) enum Methods {
    /// These; others pass straight through.
    Only(Vec<Method>),
    /// Every method.
    All,
}

impl Methods {
    pub(crate) fn guards(&self, method: &Method) -> bool {
        match self {
            Self::Only(methods) => methods.contains(method),
            Self::All => true,
        }
    }
}

/// A layer's settings, as its builder left them.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) key_source: Arc<dyn KeySource>,
    pub(crate) methods: Methods,
    pub(crate) max_body: usize,
    pub(crate) discard_bytes: usize,
    pub(crate) discard_time: Duration,
    pub(crate) scope: Scope,
    pub(crate) require_principal: bool,
    pub(crate) fingerprint: FingerprintMode,
    pub(crate) in_flight_status: StatusCode,
    pub(crate) retry_after: Duration,
    pub(crate) store_timeout: Duration,
    pub(crate) fail_open: bool,
    pub(crate) cache_policy: CachePolicy,
    pub(crate) max_cached_body: usize,
    pub(crate) lease: Duration,
    pub(crate) max_lease_renewal: Duration,
    pub(crate) ttl: Duration,
    pub(crate) min_ttl: Duration,
    pub(crate) in_flight_limit: Option<Arc<Semaphore>>,
    pub(crate) tasks: TaskTracker,
    pub(crate) accepting: Arc<AtomicBool>,
    /// The handler's writes commit with the completion (see `transactional.rs`).
    pub(crate) transactional: bool,
    /// Duplicates of an in-flight request wait for its result (see `wait.rs`).
    pub(crate) wait: Option<Arc<Waiters>>,
    /// The bound on waiters, kept for [`IdempotencyLayer::wait_for_result`](super::IdempotencyLayer::wait_for_result).
    pub(crate) max_waiters: usize,
}

impl Config {
    /// The bound on every store call: the configured store timeout, at most a third of the
    /// lease, so that a renewal gives up before the lease it renews can lapse.
    pub(crate) fn store_timeout(&self) -> Duration {
        self.store_timeout.min(self.lease / 3)
    }
}
