//! The [`Verifier`] trait and [`WebhookKeys`], the [`KeySource`] that runs a verifier.

use std::{
    fmt,
    sync::Arc,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::{request::Parts, Method};
use sha2::{Digest, Sha256};
use tower_idempotency_core::{
    Fingerprint, FingerprintMode, IdempotencyLayer, KeySource, PrincipalSource, Problem,
    RouteScope, Store,
};

use crate::{
    clock::{Clock, SystemClock},
    error::VerifyError,
    util,
    verified::VerifiedWebhook,
};

/// TTL used by verifiers that do not set their own: one day.
pub const DEFAULT_WEBHOOK_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Checks one provider's signature over the exact raw body and names the delivery.
///
/// Verification is synchronous because the core's [`KeySource::derive`] is: it is pure CPU
/// work (an HMAC or a signature check over at most the layer's body cap).
pub trait Verifier: Send + Sync + 'static {
    /// The provider's name, used as the layer's namespace (`[A-Za-z0-9._-]`).
    fn provider(&self) -> &'static str;

    /// How long completed deliveries are remembered: longer than the provider's retry schedule.
    fn default_ttl(&self) -> Duration {
        DEFAULT_WEBHOOK_TTL
    }

    /// The replay window around the signed timestamp, for schemes that sign one and check it
    /// (default `None`). The webhook layer keeps records at least twice as long.
    fn replay_window(&self) -> Option<Duration> {
        None
    }

    /// Whether the provider sends deliveries with `method` (default: `POST` only). The webhook
    /// layer guards every method and answers the others `405` before verifying anything.
    fn accepts_method(&self, method: &Method) -> bool {
        method == Method::POST
    }

    /// Verifies `body` (the exact bytes received) against the request's headers and URI at
    /// `now`, and returns the delivery with its event id.
    fn verify(
        &self,
        parts: &Parts,
        body: &Bytes,
        now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError>;
}

impl<V: Verifier + ?Sized> Verifier for Arc<V> {
    fn provider(&self) -> &'static str {
        (**self).provider()
    }

    fn default_ttl(&self) -> Duration {
        (**self).default_ttl()
    }

    fn accepts_method(&self, method: &Method) -> bool {
        (**self).accepts_method(method)
    }

    fn replay_window(&self) -> Option<Duration> {
        (**self).replay_window()
    }

    fn verify(
        &self,
        parts: &Parts,
        body: &Bytes,
        now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError> {
        (**self).verify(parts, body, now)
    }
}

/// A [`KeySource`] that verifies each delivery with a [`Verifier`] before anything is parsed or
/// stored, inserts the [`VerifiedWebhook`] into the request extensions and keys the request by
/// the provider's event id.
pub struct WebhookKeys<V> {
    verifier: V,
    clock: Arc<dyn Clock>,
}

impl<V: fmt::Debug> fmt::Debug for WebhookKeys<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookKeys")
            .field("verifier", &self.verifier)
            .finish_non_exhaustive()
    }
}

impl<V: Verifier> WebhookKeys<V> {
    /// Verifies with `verifier` against the system clock.
    pub fn new(verifier: V) -> Self {
        Self {
            verifier,
            clock: Arc::new(SystemClock),
        }
    }

    /// Checks timestamps against `clock` instead (tests, or a monotonic-corrected clock).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The verifier.
    pub fn verifier(&self) -> &V {
        &self.verifier
    }

    /// An [`IdempotencyLayer`] keyed by this source, namespaced by the provider's name, with the
    /// provider's TTL and a fingerprint that is the same for every delivery of this provider.
    ///
    /// It guards every method ([`IdempotencyLayer::all_methods`]): the methods the provider
    /// sends ([`Verifier::accepts_method`]) are verified, the others answered `405`
    /// ([`VerifyError::MethodNotAllowed`]), so no request reaches the handler unverified.
    ///
    /// Keys are scoped by the provider's namespace and the route template only
    /// ([`RouteScope::MatchedPath`], no principal): an event id names one event however the
    /// path is spelled (`/hooks/acct_%31` and `/hooks/acct_1` reach the same handler with the
    /// same `Path` value) and whoever relays it, so every spelling runs it once.
    ///
    /// The fingerprint is constant on purpose: the signature already authenticates the body,
    /// and providers re-render a retried event (Stripe's `pending_webhooks`, a fresh Mailgun
    /// token), so a differing body under the same event id is still the same event and must be
    /// replayed, not answered `422`.
    pub fn into_layer(self, store: impl Store) -> IdempotencyLayer {
        let provider = self.verifier.provider();
        let ttl = self.verifier.default_ttl();
        let min_ttl = self
            .verifier
            .replay_window()
            .map_or(Duration::ZERO, |window| window.saturating_mul(2));
        let fingerprint = Fingerprint(Sha256::digest(provider.as_bytes()).into());
        IdempotencyLayer::new(self, store)
            .namespace(provider)
            .all_methods()
            .principal(PrincipalSource::Disabled)
            .route_scope(RouteScope::MatchedPath)
            .ttl(ttl)
            .min_ttl(min_ttl)
            .fingerprint(FingerprintMode::Custom(Arc::new(move |_, _| fingerprint)))
    }
}

impl<V: Verifier> KeySource for WebhookKeys<V> {
    fn derive(&self, parts: &mut Parts, body: &Bytes) -> Result<Option<String>, Problem> {
        if !self.verifier.accepts_method(&parts.method) {
            return Err(VerifyError::MethodNotAllowed.into());
        }
        let webhook = self.verifier.verify(parts, body, self.clock.now())?;
        // Custom verifiers may skip the checks the built-in ones make.
        let key = util::check_id(webhook.event_id().to_owned(), "event id")?;
        parts.extensions.insert(webhook);
        Ok(Some(key))
    }
}
