use std::{
    sync::{atomic::AtomicBool, Arc},
    time::Duration,
};

use http::{Method, StatusCode};
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;
use tower_layer::Layer;

use super::{
    config::{Config, Methods},
    wait::Waiters,
    IdempotencyService, TransactionalError,
};
use crate::{
    fingerprint::FingerprintMode,
    key::{ClientKey, KeySource},
    policy::CachePolicy,
    scope::{PrincipalSource, RouteScope, Scope},
    shutdown::ShutdownHandle,
    store::{Store, LONGEST_DURATION},
};

/// Default cap on buffered request bodies: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;
/// Default bound on the bytes of an over-the-cap request body read and discarded before the
/// `413` is answered: 4 MiB. See [`IdempotencyLayer::discard_oversized_body`].
pub const DEFAULT_DISCARD_BYTES: usize = 4 * 1024 * 1024;
/// Default bound on the time spent discarding an over-the-cap request body: 5 s.
pub const DEFAULT_DISCARD_TIME: Duration = Duration::from_secs(5);
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

/// Default bound on the requests of one layer waiting for an in-flight result at once: 1024.
/// See [`IdempotencyLayer::max_waiters`].
pub const DEFAULT_MAX_WAITERS: usize = 1024;

/// A [`Layer`] that makes the wrapped service idempotent. The [crate documentation](crate) tells
/// what it does with a request.
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
            .field("require_principal", &c.require_principal)
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
                methods: Methods::Only(vec![Method::POST, Method::PATCH]),
                max_body: DEFAULT_MAX_BODY,
                discard_bytes: DEFAULT_DISCARD_BYTES,
                discard_time: DEFAULT_DISCARD_TIME,
                scope: Scope::new("idempotency", PrincipalSource::Extension),
                require_principal: false,
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
                min_ttl: Duration::ZERO,
                in_flight_limit: None,
                tasks: TaskTracker::new(),
                accepting: Arc::new(AtomicBool::new(true)),
                transactional: false,
                wait: None,
                max_waiters: DEFAULT_MAX_WAITERS,
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
        self.with(|c| c.methods = Methods::Only(methods.into_iter().collect()))
    }

    /// Guards every method: nothing passes through unguarded, and the key source decides
    /// what to refuse (the webhook layers answer the methods their provider never sends
    /// with `405`).
    pub fn all_methods(self) -> Self {
        self.with(|c| c.methods = Methods::All)
    }

    /// Cap on the buffered request body (default 1 MiB); larger bodies are answered `413`.
    pub fn max_body_bytes(self, limit: usize) -> Self {
        self.with(|c| c.max_body = limit)
    }

    /// How much of a request body over the cap is read and discarded around the `413`
    /// (default [`DEFAULT_DISCARD_BYTES`], 4 MiB, within [`DEFAULT_DISCARD_TIME`], 5 s).
    ///
    /// Many clients (Python's httpx and requests among them) upload the whole body before they
    /// read the answer; a server that answers and closes with the upload unread resets the
    /// connection, and such a client reports a connection error instead of the `413`. Reading
    /// the rest, up to these bounds, lets it read the `413` (a web server's lingering close).
    /// A body declared over the cap by `Content-Length` is answered at once and discarded
    /// beside the answer; one found over the cap while reading is discarded before the answer.
    /// A body declared over the cap with `Expect: 100-continue` is answered at once and never
    /// read: its client has not sent it. Past either bound the connection is closed.
    /// `(0, Duration::ZERO)` discards nothing.
    pub fn discard_oversized_body(self, max_bytes: usize, max_time: Duration) -> Self {
        self.with(|c| {
            c.discard_bytes = max_bytes;
            c.discard_time = max_time;
        })
    }

    /// The namespace that prefixes every stored key (default `idempotency`).
    ///
    /// # Panics
    /// If it is empty, over 255 bytes, or not made of `[A-Za-z0-9._-]`.
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        self.with(|c| {
            c.scope = Scope::new(namespace, c.scope.principal_source().clone())
                .route(c.scope.route_scope())
        })
    }

    /// Where the principal (tenant) that scopes keys comes from (default: the
    /// [`Principal`](crate::Principal) request extension, when present).
    pub fn principal(self, source: PrincipalSource) -> Self {
        self.with(|c| {
            c.scope =
                Scope::new(c.scope.namespace().to_owned(), source).route(c.scope.route_scope())
        })
    }

    /// Which part of the route scopes keys (default [`RouteScope::MethodAndPath`]; the webhook
    /// layers use [`RouteScope::MatchedPath`]).
    pub fn route_scope(self, route: RouteScope) -> Self {
        self.with(|c| c.scope = c.scope.clone().route(route))
    }

    /// Refuses a guarded request that has no principal, instead of scoping its key without one
    /// (which makes keys global per endpoint: one tenant could be replayed another's response).
    ///
    /// A missing principal is a deployment mistake (the auth layer runs after this one, or not
    /// on this route), not the client's: it is answered `500` with the problem type
    /// `principal-missing` and logged at `error`, and the handler does not run. Recommended on
    /// every multi-tenant route. Requests that pass through unguarded (other methods, an
    /// optional key that is absent) are not checked.
    pub fn require_principal(self) -> Self {
        self.with(|c| c.require_principal = true)
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

    /// `Retry-After` sent with `409` and `503` answers (default 1 s). On a `409` it is shortened
    /// to the holder's remaining lease when that ends sooner (at least 1 s): by then the key is
    /// completed, renewed or free to claim.
    pub fn retry_after(self, after: Duration) -> Self {
        self.with(|c| c.retry_after = after)
    }

    /// Bound on every store call (default 5 s); past it the request is answered `503`.
    ///
    /// Clamped to a third of the [`lease`](Self::lease) (the renewal period), whichever order
    /// the two are set in: a renewal that waited longer could let the lease lapse while it
    /// waits. The clamp is logged at `warn` when the layer wraps a service.
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
    /// [`LONGEST_DURATION`]). A handler still running past it is logged once at `warn`: once its
    /// lease then lapses, a retry may run the handler a second time.
    pub fn max_lease_renewal(self, ceiling: Duration) -> Self {
        self.with(|c| c.max_lease_renewal = ceiling.min(LONGEST_DURATION))
    }

    /// How long a completed response is replayed (default 24 h). `Duration::MAX` (or anything
    /// over [`LONGEST_DURATION`], a hundred years) means [`LONGEST_DURATION`].
    ///
    /// A TTL below the layer's [`min_ttl`](Self::min_ttl) is raised to it.
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|c| c.ttl = ttl.min(LONGEST_DURATION).max(c.min_ttl))
    }

    /// The shortest TTL this layer accepts (default none): the TTL is raised to it now and
    /// whenever [`ttl`](Self::ttl) sets a shorter one. The webhook layers set it to twice the
    /// verifier's replay window, so a captured delivery replayed inside the window still finds
    /// its record.
    pub fn min_ttl(self, floor: Duration) -> Self {
        self.with(|c| {
            c.min_ttl = floor.min(LONGEST_DURATION);
            c.ttl = c.ttl.max(c.min_ttl);
        })
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
    /// a panic or a lost lease rolls the writes back. See [docs/guarantees.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/guarantees.md), "Transactional
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

    /// Lets a duplicate of an in-flight request wait for the first one's result, up to
    /// `max_wait`, instead of being answered `409` at once (off by default).
    ///
    /// The waiter is answered with the replay once the first request completes the key. If the
    /// first request's response is not cached (an error, a panic, a status the
    /// [`cache_policy`](Self::cache_policy) releases), the key is released and exactly one waiter
    /// claims it and runs the handler; the others wait for that one. Past `max_wait`, or when
    /// [`max_waiters`](Self::max_waiters) requests already wait, the duplicate gets the `409`
    /// (with its `Retry-After`) as without waiting. `Duration::ZERO` turns waiting off.
    ///
    /// Waiters of one key in this process share one notification, sent when the request
    /// running here completes or releases the key; each then claims the key once more. A holder
    /// in another instance is heard through the store's notices ([`Store::settlements`]:
    /// Postgres `LISTEN/NOTIFY`, Redis pub/sub), one subscription per store object: a waiter
    /// then claims again only when notified, and as a safety net when the holder's lease or
    /// the wait ends. With a store that has no notices (SQLite, memory, a custom store), or
    /// while its subscription is down, every waiter also claims again after 50 ms, then after
    /// doubling intervals (100 ms, 200 ms, ...), never later than the holder's remaining lease:
    /// about `log2(wait / 50 ms)` store calls per waiter. See [docs/configuration.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/configuration.md).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency_core::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::client_keys(MemoryStore::new())
    ///     .wait_for_result(Duration::from_secs(5))
    ///     .max_waiters(256);
    /// assert_eq!(layer.waiting(), 0);
    /// ```
    pub fn wait_for_result(self, max_wait: Duration) -> Self {
        self.with(|c| {
            c.wait = (!max_wait.is_zero())
                .then(|| Arc::new(Waiters::new(max_wait.min(LONGEST_DURATION), c.max_waiters)));
        })
    }

    /// Bounds the requests waiting for an in-flight result at once (default
    /// [`DEFAULT_MAX_WAITERS`]); beyond it a duplicate is answered `409` at once. Only
    /// meaningful with [`wait_for_result`](Self::wait_for_result), in either order.
    pub fn max_waiters(self, limit: usize) -> Self {
        self.with(|c| {
            c.max_waiters = limit;
            if let Some(wait) = &c.wait {
                c.wait = Some(Arc::new(Waiters::new(wait.max_wait(), limit)));
            }
        })
    }

    /// How many requests wait for an in-flight result now (see
    /// [`wait_for_result`](Self::wait_for_result)); `0` when waiting is off.
    pub fn waiting(&self) -> usize {
        self.config.wait.as_ref().map_or(0, |wait| wait.waiting())
    }

    /// A handle to drain running handlers on shutdown. Shared by every service of this layer.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle::new(self.config.tasks.clone(), self.config.accepting.clone())
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        let c = &self.config;
        if c.store_timeout() < c.store_timeout {
            tracing::warn!(
                configured = ?c.store_timeout,
                used = ?c.store_timeout(),
                "the store timeout is longer than a third of the lease; using a third of the lease"
            );
        }
        IdempotencyService::new(inner, self.config.clone())
    }
}
