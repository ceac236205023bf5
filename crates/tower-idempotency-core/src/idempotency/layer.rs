use std::{
    sync::{atomic::AtomicBool, Arc},
    time::Duration,
};

use http::{Method, StatusCode};
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;
use tower_layer::Layer;

use super::{IdempotencyService, TransactionalError};
use crate::{
    fingerprint::FingerprintMode,
    key::{ClientKey, KeySource},
    policy::CachePolicy,
    scope::{PrincipalSource, Scope},
    shutdown::ShutdownHandle,
    store::{Store, LONGEST_DURATION},
};

/// Default cap on buffered request bodies: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;
/// Default cap on cached response bodies: 1 MiB.
pub const DEFAULT_MAX_CACHED_BODY: usize = 1024 * 1024;
/// Default in-flight lease: 60 s.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// The shortest lease [`IdempotencyLayer::lease`] accepts: 100 ms. The lease is renewed every
/// third of it, and a renewal has to reach the store before the lease runs out.
pub const MIN_LEASE: Duration = Duration::from_millis(100);
/// Default TTL of completed records: 24 h.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Default store timeout: 5 s.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default ceiling on lease renewal for one slow handler: 10 min.
pub const DEFAULT_MAX_LEASE_RENEWAL: Duration = Duration::from_secs(10 * 60);

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) key_source: Arc<dyn KeySource>,
    pub(crate) methods: Vec<Method>,
    pub(crate) max_body: usize,
    pub(crate) scope: Scope,
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
    pub(crate) in_flight_limit: Option<Arc<Semaphore>>,
    pub(crate) tasks: TaskTracker,
    pub(crate) accepting: Arc<AtomicBool>,
    /// The handler's writes commit with the completion (see `transactional.rs`).
    pub(crate) transactional: bool,
}

/// A [`Layer`] that makes the wrapped service idempotent. See the [module docs](super).
///
/// Built with [`IdempotencyLayer::client_keys`] for client `Idempotency-Key` headers, or
/// [`IdempotencyLayer::new`] for any other [`KeySource`] (the webhook providers), then tuned
/// with the builder methods. Every layer made from one builder shares its in-flight bound and
/// its [`ShutdownHandle`].
#[derive(Clone)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.config;
        f.debug_struct("IdempotencyLayer")
            .field("methods", &c.methods)
            .field("namespace", &c.scope.namespace())
            .field("max_body", &c.max_body)
            .field("lease", &c.lease)
            .field("ttl", &c.ttl)
            .field("fail_open", &c.fail_open)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// Guards requests by the client's `Idempotency-Key` header, which is required.
    ///
    /// Call [`optional_key`](Self::optional_key) to pass requests without one through unguarded.
    pub fn client_keys(store: impl Store) -> Self {
        Self::new(ClientKey::required(), store)
    }

    /// Guards requests by the key that `source` derives (e.g. a verified webhook event id).
    pub fn new(source: impl KeySource, store: impl Store) -> Self {
        Self {
            config: Arc::new(Config {
                store: Arc::new(store),
                key_source: Arc::new(source),
                methods: vec![Method::POST, Method::PATCH],
                max_body: DEFAULT_MAX_BODY,
                scope: Scope::new("idempotency", PrincipalSource::Extension),
                fingerprint: FingerprintMode::Request,
                in_flight_status: StatusCode::CONFLICT,
                retry_after: Duration::from_secs(1),
                store_timeout: DEFAULT_STORE_TIMEOUT,
                fail_open: false,
                cache_policy: CachePolicy::successful(),
                max_cached_body: DEFAULT_MAX_CACHED_BODY,
                lease: DEFAULT_LEASE,
                max_lease_renewal: DEFAULT_MAX_LEASE_RENEWAL,
                ttl: DEFAULT_TTL,
                in_flight_limit: None,
                tasks: TaskTracker::new(),
                accepting: Arc::new(AtomicBool::new(true)),
                transactional: false,
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Config)) -> Self {
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// Replaces the key source, keeping every other setting.
    pub fn key_source(self, source: impl KeySource) -> Self {
        self.with(|c| c.key_source = Arc::new(source))
    }

    /// Lets requests without an `Idempotency-Key` pass through unguarded (client keys only).
    pub fn optional_key(self) -> Self {
        self.key_source(ClientKey::optional())
    }

    /// The methods to guard (default `POST` and `PATCH`); others pass straight through.
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.with(|c| c.methods = methods.into_iter().collect())
    }

    /// Cap on the buffered request body (default 1 MiB); larger bodies are answered `413`.
    pub fn max_body_bytes(self, limit: usize) -> Self {
        self.with(|c| c.max_body = limit)
    }

    /// The namespace that prefixes every stored key (default `idempotency`).
    ///
    /// # Panics
    /// If it is empty, over 255 bytes, or not made of `[A-Za-z0-9._-]`.
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        self.with(|c| c.scope = Scope::new(namespace, c.scope.principal_source().clone()))
    }

    /// Where the principal (tenant) that scopes keys comes from (default: the
    /// [`Principal`](crate::Principal) request extension, when present).
    pub fn principal(self, source: PrincipalSource) -> Self {
        self.with(|c| c.scope = Scope::new(c.scope.namespace().to_owned(), source))
    }

    /// What the fingerprint covers (default: method, path and query, and body).
    pub fn fingerprint(self, mode: FingerprintMode) -> Self {
        self.with(|c| c.fingerprint = mode)
    }

    /// Status for a duplicate that arrives while the first request still runs (default `409`;
    /// some senders expect `429`).
    pub fn in_flight_status(self, status: StatusCode) -> Self {
        self.with(|c| c.in_flight_status = status)
    }

    /// `Retry-After` sent with `409` and `503` answers (default 1 s).
    pub fn retry_after(self, after: Duration) -> Self {
        self.with(|c| c.retry_after = after)
    }

    /// Bound on every store call (default 5 s); past it the request is answered `503`.
    pub fn store_timeout(self, timeout: Duration) -> Self {
        self.with(|c| c.store_timeout = timeout)
    }

    /// **Dangerous.** When the store fails, run the handler without a claim instead of answering
    /// `503`. Duplicates can then run the handler twice. Every such request is logged at `warn`
    /// and carries [`Outcome::FailedOpen`](crate::Outcome::FailedOpen). Off by default.
    pub fn fail_open_on_store_error(self, fail_open: bool) -> Self {
        self.with(|c| c.fail_open = fail_open)
    }

    /// Which responses complete the key (default: 2xx complete, others release).
    pub fn cache_policy(self, policy: CachePolicy) -> Self {
        self.with(|c| c.cache_policy = policy)
    }

    /// Cap on a cached response body (default 1 MiB). A larger response still completes the key,
    /// and replays carry its status and headers, an empty body and
    /// [`BODY_OMITTED_HEADER`](crate::BODY_OMITTED_HEADER).
    pub fn max_cached_body_bytes(self, limit: usize) -> Self {
        self.with(|c| c.max_cached_body = limit)
    }

    /// How long a claim blocks duplicates before a crashed holder's key is claimable again
    /// (default 60 s). Renewed every third of the lease while the handler runs. Leases shorter
    /// than [`MIN_LEASE`] are raised to it (a renewal must fit inside the lease with room for
    /// a store round trip); longer than [`LONGEST_DURATION`] are lowered to it.
    pub fn lease(self, lease: Duration) -> Self {
        self.with(|c| c.lease = lease.clamp(MIN_LEASE, LONGEST_DURATION))
    }

    /// How long a slow handler's lease is renewed at most (default 10 min; at most
    /// [`LONGEST_DURATION`]).
    pub fn max_lease_renewal(self, ceiling: Duration) -> Self {
        self.with(|c| c.max_lease_renewal = ceiling.min(LONGEST_DURATION))
    }

    /// How long a completed response is replayed (default 24 h). `Duration::MAX` (or anything
    /// over [`LONGEST_DURATION`], a hundred years) means [`LONGEST_DURATION`].
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|c| c.ttl = ttl.min(LONGEST_DURATION))
    }

    /// Bounds the guarded handlers running at once; beyond it requests are answered `503` before
    /// anything is claimed.
    pub fn max_in_flight(self, limit: usize) -> Self {
        self.with(|c| c.in_flight_limit = Some(Arc::new(Semaphore::new(limit))))
    }

    /// Runs every claimed handler inside a database transaction of the store and commits the
    /// handler's writes together with the key's completion, fenced by the claim's token:
    /// effects exactly once. The handler writes through the transaction it extracts
    /// (`tower_idempotency_sqlx::IdempotentTx`). A response the cache policy releases, an error,
    /// a panic or a lost lease rolls the writes back. See `docs/guarantees.md`, "Transactional
    /// mode".
    ///
    /// # Panics
    /// If the store has no transactions ([`Store::transactions`] is `None`, e.g. the memory or
    /// Redis store), so the mode can never silently run without one. Use
    /// [`try_transactional`](Self::try_transactional) to get an error instead.
    pub fn transactional(self) -> Self {
        match self.try_transactional() {
            Ok(layer) => layer,
            Err(error) => panic!("IdempotencyLayer::transactional: {error}"),
        }
    }

    /// Like [`transactional`](Self::transactional), but answers
    /// [`TransactionalError::Unsupported`] instead of panicking when the store has no
    /// transactions.
    pub fn try_transactional(self) -> Result<Self, TransactionalError> {
        if self.config.store.transactions().is_none() {
            return Err(TransactionalError::Unsupported);
        }
        Ok(self.with(|c| c.transactional = true))
    }

    /// Whether [`transactional`](Self::transactional) is on.
    pub fn is_transactional(&self) -> bool {
        self.config.transactional
    }

    /// A handle to drain running handlers on shutdown. Shared by every service of this layer.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle::new(self.config.tasks.clone(), self.config.accepting.clone())
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, self.config.clone())
    }
}
