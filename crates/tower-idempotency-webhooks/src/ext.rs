//! Constructors on [`IdempotencyLayer`] for each provider.

use tower_idempotency_core::{IdempotencyLayer, Store};

use crate::verifier::{Verifier, WebhookKeys};
#[allow(unused_imports)]
use crate::{error::ConfigError, secret::Secret};

/// Adds `IdempotencyLayer::stripe(secrets, store)` and friends.
///
/// Each constructor verifies the provider's signature, keys by its event id, namespaces the
/// store by the provider's name and keeps completed deliveries longer than the provider retries
/// (see each verifier's `DEFAULT_TTL`). Tune the result with the layer's builder methods.
///
/// Every secret must be at least [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes: anyone can
/// sign with an empty one (an unset environment variable read with `unwrap_or_default()`). The
/// infallible constructors panic on a shorter one, as `Router::route` does on an invalid path,
/// with a message naming the provider and the rule, never the secret; the fallible ones return
/// [`ConfigError::WeakSecret`]. Check untrusted configuration first with [`Secret::try_new`].
///
/// ```
/// use tower_idempotency_core::{IdempotencyLayer, MemoryStore};
/// use tower_idempotency_webhooks::WebhookLayerExt;
///
/// let layer = IdempotencyLayer::stripe(["whsec_current", "whsec_previous"], MemoryStore::new());
/// # let _ = layer;
/// ```
pub trait WebhookLayerExt: Sized {
    /// Any [`Verifier`] (e.g. an [`HmacVerifier`](crate::generic::HmacVerifier)) against the
    /// system clock. For another clock, use [`WebhookKeys::clock`] and
    /// [`WebhookKeys::into_layer`].
    fn webhook<V: Verifier>(verifier: V, store: impl Store) -> Self;

    /// Stripe (`Stripe-Signature`), keyed by the event `id`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes
    /// (check first with [`Secret::try_new`]).
    #[cfg(feature = "stripe")]
    fn stripe<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>, store: impl Store) -> Self;

    /// GitHub (`X-Hub-Signature-256`), keyed by `X-GitHub-Delivery`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes
    /// (check first with [`Secret::try_new`]).
    #[cfg(feature = "github")]
    fn github<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>, store: impl Store) -> Self;

    /// Slack Events API (`X-Slack-Signature`), keyed by `event_id`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes
    /// (check first with [`Secret::try_new`]).
    #[cfg(feature = "slack")]
    fn slack<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>, store: impl Store) -> Self;

    /// Standard Webhooks / Svix (`webhook-signature`), keyed by `webhook-id`. Secrets are
    /// `whsec_`-prefixed base64.
    #[cfg(feature = "standard-webhooks")]
    fn standard_webhooks<S: AsRef<str>>(
        secrets: impl IntoIterator<Item = S>,
        store: impl Store,
    ) -> Result<Self, ConfigError>;

    /// Standard Webhooks signed asymmetrically (`v1a`, Ed25519) only, keyed by `webhook-id`.
    /// Keys are `whpk_`-prefixed base64. For both kinds at once, use
    /// [`StandardWebhooksVerifier::public_keys`](crate::standard::StandardWebhooksVerifier::public_keys)
    /// and [`webhook`](Self::webhook).
    #[cfg(feature = "standard-webhooks")]
    fn standard_webhooks_public_keys<S: AsRef<str>>(
        keys: impl IntoIterator<Item = S>,
        store: impl Store,
    ) -> Result<Self, ConfigError>;

    /// Shopify (`X-Shopify-Hmac-Sha256`), keyed by `X-Shopify-Event-Id`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes
    /// (check first with [`Secret::try_new`]).
    #[cfg(feature = "shopify")]
    fn shopify<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>, store: impl Store) -> Self;

    /// Paddle Billing (`Paddle-Signature`), keyed by `event_id`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes
    /// (check first with [`Secret::try_new`]).
    #[cfg(feature = "paddle")]
    fn paddle<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>, store: impl Store) -> Self;

    /// Linear (`Linear-Signature`), keyed by `Linear-Delivery`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes
    /// (check first with [`Secret::try_new`]).
    #[cfg(feature = "linear")]
    fn linear<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>, store: impl Store) -> Self;

    /// GitLab (`X-Gitlab-Token`), keyed by `Idempotency-Key`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes
    /// (check first with [`Secret::try_new`]).
    #[cfg(feature = "gitlab")]
    fn gitlab<S: Into<Secret>>(tokens: impl IntoIterator<Item = S>, store: impl Store) -> Self;

    /// Zoom (`x-zm-signature`), keyed by a digest of the body.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes
    /// (check first with [`Secret::try_new`]).
    #[cfg(feature = "zoom")]
    fn zoom<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>, store: impl Store) -> Self;

    /// Discord interactions (`X-Signature-Ed25519`), keyed by the interaction `id`; `keys` are
    /// the application's public keys in hex.
    #[cfg(feature = "discord")]
    fn discord<S: AsRef<str>>(
        keys: impl IntoIterator<Item = S>,
        store: impl Store,
    ) -> Result<Self, ConfigError>;

    /// SendGrid Event Webhook (ECDSA P-256), keyed by a digest of the batch; `keys` are the
    /// base64 DER verification keys.
    #[cfg(feature = "sendgrid")]
    fn sendgrid<S: AsRef<str>>(
        keys: impl IntoIterator<Item = S>,
        store: impl Store,
    ) -> Result<Self, ConfigError>;

    /// Mailgun (signature in the body), keyed by `event-data.id`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes
    /// (check first with [`Secret::try_new`]).
    #[cfg(feature = "mailgun")]
    fn mailgun<S: Into<Secret>>(keys: impl IntoIterator<Item = S>, store: impl Store) -> Self;

    /// Square (`x-square-hmacsha256-signature`), keyed by `event_id`; `notification_url` is
    /// the URL exactly as registered with Square.
    ///
    /// Fails with [`ConfigError::WeakSecret`] if a secret is empty or shorter than
    /// [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes.
    #[cfg(feature = "square")]
    fn square<S: Into<Secret>>(
        notification_url: impl Into<String>,
        keys: impl IntoIterator<Item = S>,
        store: impl Store,
    ) -> Result<Self, ConfigError>;

    /// Twilio (`X-Twilio-Signature`), keyed by a digest of the signed URL and parameters;
    /// `public_url` is the base URL Twilio calls (the request's path and query are appended).
    ///
    /// Fails with [`ConfigError::WeakSecret`] if a secret is empty or shorter than
    /// [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes.
    #[cfg(feature = "twilio")]
    fn twilio<S: Into<Secret>>(
        public_url: &str,
        auth_tokens: impl IntoIterator<Item = S>,
        store: impl Store,
    ) -> Result<Self, ConfigError>;
}

impl WebhookLayerExt for IdempotencyLayer {
    fn webhook<V: Verifier>(verifier: V, store: impl Store) -> Self {
        WebhookKeys::new(verifier).into_layer(store)
    }

    #[cfg(feature = "stripe")]
    fn stripe<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>, store: impl Store) -> Self {
        Self::webhook(crate::stripe::StripeVerifier::new(secrets), store)
    }

    #[cfg(feature = "github")]
    fn github<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>, store: impl Store) -> Self {
        Self::webhook(crate::github::GitHubVerifier::new(secrets), store)
    }

    #[cfg(feature = "slack")]
    fn slack<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>, store: impl Store) -> Self {
        Self::webhook(crate::slack::SlackVerifier::new(secrets), store)
    }

    #[cfg(feature = "standard-webhooks")]
    fn standard_webhooks<S: AsRef<str>>(
        secrets: impl IntoIterator<Item = S>,
        store: impl Store,
    ) -> Result<Self, ConfigError> {
        Ok(Self::webhook(
            crate::standard::StandardWebhooksVerifier::new(secrets)?,
            store,
        ))
    }

    #[cfg(feature = "standard-webhooks")]
    fn standard_webhooks_public_keys<S: AsRef<str>>(
        keys: impl IntoIterator<Item = S>,
        store: impl Store,
    ) -> Result<Self, ConfigError> {
        Ok(Self::webhook(
            crate::standard::StandardWebhooksVerifier::from_public_keys(keys)?,
            store,
        ))
    }

    #[cfg(feature = "shopify")]
    fn shopify<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>, store: impl Store) -> Self {
        Self::webhook(crate::shopify::ShopifyVerifier::new(secrets), store)
    }

    #[cfg(feature = "paddle")]
    fn paddle<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>, store: impl Store) -> Self {
        Self::webhook(crate::paddle::PaddleVerifier::new(secrets), store)
    }

    #[cfg(feature = "linear")]
    fn linear<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>, store: impl Store) -> Self {
        Self::webhook(crate::linear::LinearVerifier::new(secrets), store)
    }

    #[cfg(feature = "gitlab")]
    fn gitlab<S: Into<Secret>>(tokens: impl IntoIterator<Item = S>, store: impl Store) -> Self {
        Self::webhook(crate::gitlab::GitLabVerifier::new(tokens), store)
    }

    #[cfg(feature = "zoom")]
    fn zoom<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>, store: impl Store) -> Self {
        Self::webhook(crate::zoom::ZoomVerifier::new(secrets), store)
    }

    #[cfg(feature = "discord")]
    fn discord<S: AsRef<str>>(
        keys: impl IntoIterator<Item = S>,
        store: impl Store,
    ) -> Result<Self, ConfigError> {
        Ok(Self::webhook(
            crate::discord::DiscordVerifier::new(keys)?,
            store,
        ))
    }

    #[cfg(feature = "sendgrid")]
    fn sendgrid<S: AsRef<str>>(
        keys: impl IntoIterator<Item = S>,
        store: impl Store,
    ) -> Result<Self, ConfigError> {
        Ok(Self::webhook(
            crate::sendgrid::SendGridVerifier::new(keys)?,
            store,
        ))
    }

    #[cfg(feature = "mailgun")]
    fn mailgun<S: Into<Secret>>(keys: impl IntoIterator<Item = S>, store: impl Store) -> Self {
        Self::webhook(crate::mailgun::MailgunVerifier::new(keys), store)
    }

    #[cfg(feature = "square")]
    fn square<S: Into<Secret>>(
        notification_url: impl Into<String>,
        keys: impl IntoIterator<Item = S>,
        store: impl Store,
    ) -> Result<Self, ConfigError> {
        Ok(Self::webhook(
            crate::square::SquareVerifier::new(notification_url, keys)?,
            store,
        ))
    }

    #[cfg(feature = "twilio")]
    fn twilio<S: Into<Secret>>(
        public_url: &str,
        auth_tokens: impl IntoIterator<Item = S>,
        store: impl Store,
    ) -> Result<Self, ConfigError> {
        Ok(Self::webhook(
            crate::twilio::TwilioVerifier::new(public_url, auth_tokens)?,
            store,
        ))
    }
}
