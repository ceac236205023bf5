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
    event_id,
    verified::VerifiedWebhook,
};

/// TTL used by verifiers that do not set their own: one day.
pub const DEFAULT_WEBHOOK_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Writes the `Verifier` methods that only report a provider's settings: its name, its default
/// TTL and, for a provider that signs a timestamp, the replay window at `self.<field>`. The
/// signatures name `Duration` as the caller has it in scope, so the API reads as hand-written.
/// (Unused in a build whose features select no provider that needs it.)
#[allow(unused_macros)]
macro_rules! verifier_settings {
    ($provider:expr, $ttl:expr) => {
        fn provider(&self) -> &'static str {
            $provider
        }

        fn default_ttl(&self) -> Duration {
            $ttl
        }
    };
    ($provider:expr, $ttl:expr, replay_window: self.$($field:ident).+) => {
        $crate::verifier::verifier_settings!($provider, $ttl);

        fn replay_window(&self) -> Option<Duration> {
            self.$($field).+.get()
        }
    };
}
#[allow(unused_imports)]
pub(crate) use verifier_settings;

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
    refuse_replayed_signatures: bool,
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
            refuse_replayed_signatures: true,
        }
    }

    /// Whether a signature seen under one key is refused under another (default `true`).
    ///
    /// Applies to schemes whose signature does not cover the key (GitHub, Shopify, Linear,
    /// Mailgun; see [`VerifiedWebhook::with_authenticator`]): the layer records each delivery's
    /// verified signature (Mailgun: its token) for the TTL, and answers `401
    /// replayed-signature` when it comes back under another delivery id. Turn it off only when
    /// the sender legitimately sends byte-identical deliveries under different ids with one
    /// secret; the records cost one extra store round trip per delivery (run concurrently with
    /// the key's claim) and one extra record per delivery for the TTL.
    pub fn refuse_replayed_signatures(mut self, refuse: bool) -> Self {
        self.refuse_replayed_signatures = refuse;
        self
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

/// The checks every delivery passes, whoever receives it (the webhook layer's key source and the
/// inbox's acknowledgement): a method the provider sends ([`Verifier::accepts_method`], else
/// [`VerifyError::MethodNotAllowed`]), the verifier's own check of the exact bytes at `now`, and
/// the event-id rule custom verifiers may skip: non-empty, at most
/// [`MAX_EVENT_ID_LEN`](crate::MAX_EVENT_ID_LEN) bytes, no control characters.
pub fn verify_delivery<V: Verifier + ?Sized>(
    verifier: &V,
    parts: &Parts,
    body: &Bytes,
    now: SystemTime,
) -> Result<VerifiedWebhook, VerifyError> {
    if !verifier.accepts_method(&parts.method) {
        return Err(VerifyError::MethodNotAllowed);
    }
    let webhook = verifier.verify(parts, body, now)?;
    event_id::check_id_str(webhook.event_id(), "event id")?;
    Ok(webhook)
}

impl<V: Verifier> KeySource for WebhookKeys<V> {
    fn derive(&self, parts: &mut Parts, body: &Bytes) -> Result<Option<String>, Problem> {
        let webhook = verify_delivery(&self.verifier, parts, body, self.clock.now())?;
        let key = webhook.event_id().to_owned();
        if let Some(authenticator) = webhook.authenticator() {
            if self.refuse_replayed_signatures {
                parts.extensions.insert(authenticator);
            }
        }
        parts.extensions.insert(webhook);
        Ok(Some(key))
    }
}

#[cfg(all(test, feature = "github"))]
mod tests {
    use tower_idempotency_core::Authenticator;

    use super::*;
    use crate::github;

    const SECRET: &str = "gh-unit-webhook-secret-3f9b0c27d1e4";

    fn derive(keys: &WebhookKeys<github::GitHubVerifier>, signature: &str) -> Parts {
        let body = Bytes::from_static(br#"{"zen":"Keep it logically awesome."}"#);
        let (mut parts, ()) = http::Request::post("/hook")
            .header(github::SIGNATURE_HEADER, signature)
            .header(github::DELIVERY_HEADER, "d-1")
            .body(())
            .unwrap()
            .into_parts();
        let key = keys.derive(&mut parts, &body).unwrap();
        assert_eq!(key.as_deref(), Some("d-1"));
        parts
    }

    #[test]
    fn the_authenticator_is_the_decoded_signature_unless_turned_off() {
        let signature = github::sign(SECRET, br#"{"zen":"Keep it logically awesome."}"#);
        let keys = WebhookKeys::new(github::GitHubVerifier::new([SECRET]));
        let parts = derive(&keys, &signature);
        let authenticator = parts.extensions.get::<Authenticator>().copied();
        assert!(authenticator.is_some());
        let webhook = parts.extensions.get::<VerifiedWebhook>().unwrap();
        assert_eq!(webhook.authenticator(), authenticator);
        // The same MAC written in upper-case hex is the same authenticator.
        let upper = format!("sha256={}", signature["sha256=".len()..].to_uppercase());
        let parts = derive(&keys, &upper);
        assert_eq!(
            parts.extensions.get::<Authenticator>().copied(),
            authenticator
        );

        let off = WebhookKeys::new(github::GitHubVerifier::new([SECRET]))
            .refuse_replayed_signatures(false);
        let parts = derive(&off, &signature);
        assert_eq!(parts.extensions.get::<Authenticator>(), None);
        // The delivery still says what authenticated it.
        let webhook = parts.extensions.get::<VerifiedWebhook>().unwrap();
        assert_eq!(webhook.authenticator(), authenticator);
    }
}
