//! Signed webhook receivers for [tower-idempotency](tower_idempotency_core): verify the
//! provider's signature over the exact raw bytes, then key the idempotency layer by the
//! provider's event id, so a retried or duplicated delivery runs the handler once and is
//! answered with the cached response.
//!
//! ```
//! use axum::{routing::post, Router};
//! use tower_idempotency_core::{IdempotencyLayer, MemoryStore};
//! use tower_idempotency_webhooks::{VerifiedWebhook, WebhookLayerExt};
//!
//! async fn stripe_events(webhook: VerifiedWebhook) -> &'static str {
//!     let event = webhook.json().expect("Stripe events are JSON");
//!     let _ = (webhook.event_id(), &event["type"]);
//!     "ok"
//! }
//!
//! let app: Router = Router::new()
//!     .route("/webhooks/stripe", post(stripe_events))
//!     .route_layer(IdempotencyLayer::stripe(["whsec_..."], MemoryStore::new()));
//! # let _ = app;
//! ```
//!
//! - [`Verifier`] is the trait every provider implements; [`WebhookKeys`] runs one as the
//!   core's [`KeySource`](tower_idempotency_core::KeySource).
//! - [`WebhookLayerExt`] adds `IdempotencyLayer::stripe(..)`, `::github(..)`, ... and
//!   `::webhook(verifier, store)` for [`generic::HmacVerifier`] or your own verifier.
//! - [`VerifiedWebhook`] is the verified delivery and an axum extractor; [`VerifiedJson`] is the
//!   same delivery with its body deserialized into the handler's own event type.
//! - Failures are [`VerifyError`]s, answered as RFC 9457 problems.
//!
//! Every verifier accepts several secrets (rotation), compares in constant time, bounds header
//! sizes (8 KiB) and signature counts (16), and checks signed timestamps against a 300 s
//! window in both directions (`disable_replay_window()` turns it off explicitly; a zero
//! tolerance panics).
//!
//! One rule for constructors: a constructor that parses what it is given (a public key, an
//! encoded `whsec_` secret, a URL: Standard Webhooks, Discord, SendGrid, Twilio, Square) returns
//! `Result<_, ConfigError>`; one that takes raw shared secrets (Stripe, GitHub, Slack, ...) cannot
//! fail on well-formed input and panics on an empty or too short secret, a configuration error
//! found at start-up, with a message that names the provider and never the secret.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod clock;
mod error;
mod event_id;
mod ext;
mod headers;
mod json;
mod schemes;
mod secret;
mod signature;
mod timestamp;
mod verified;
mod verified_json;
mod verifier;

pub mod batch;
pub mod generic;
#[cfg(feature = "test-support")]
pub mod testing;

mod providers;

// Each provider module, behind its feature (see `providers/mod.rs`); none without a provider
// feature.
#[allow(unused_imports)]
pub use providers::*;

pub use clock::{Clock, SystemClock};
pub use error::{ConfigError, VerifyError};
pub use event_id::MAX_EVENT_ID_LEN;
pub use ext::WebhookLayerExt;
pub use headers::MAX_HEADER_LEN;
pub use secret::{Secret, MIN_SECRET_LEN};
pub use signature::{Encoding, HmacAlgorithm, MAX_ASYMMETRIC_SIGNATURES, MAX_SIGNATURES};
pub use timestamp::DEFAULT_TOLERANCE;
pub use verified::{parse_json, ChallengeResponse, NotJson, VerifiedWebhook, WebhookLayerMissing};
pub use verified_json::{VerifiedJson, VerifiedJsonRejection};
pub use verifier::{verify_delivery, Verifier, WebhookKeys, DEFAULT_WEBHOOK_TTL};

/// Internal parsers, exposed for the fuzz targets in the repository's `fuzz/` directory only.
/// Not a stable API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod __fuzz {
    use crate::VerifyError;
    pub use crate::{headers::MAX_HEADER_LEN, signature::MAX_SIGNATURES};

    /// `k=v<sep>k=v` (Stripe `,`, Paddle `;`).
    #[cfg(any(feature = "stripe", feature = "paddle"))]
    pub fn kv_pairs(value: &str, separator: char) -> Result<Vec<(&str, &str)>, VerifyError> {
        crate::schemes::kv_pairs("fuzz", value, separator)
    }

    /// Strict unix seconds.
    pub fn parse_unix(text: &str) -> Result<u64, VerifyError> {
        crate::timestamp::parse_unix("fuzz", text)
    }

    /// The signature decoders.
    pub fn decode(text: &str, encoding: crate::Encoding) -> Option<Vec<u8>> {
        encoding.decode(text)
    }

    /// The inline decoder the verifiers use: `None` exactly when [`decode`] is, and the same
    /// bytes, except that a signature longer than any MAC (64 bytes) is held as empty.
    pub fn decode_candidate(text: &str, encoding: crate::Encoding) -> Option<Vec<u8>> {
        encoding
            .decode_candidate(text)
            .map(|candidate| candidate.as_bytes().to_vec())
    }

    /// The bounded single-header accessor every verifier uses.
    pub fn header<'a>(
        headers: &'a http::HeaderMap,
        name: &'static str,
    ) -> Result<Option<&'a str>, VerifyError> {
        crate::headers::header(headers, name)
    }

    /// Event-id validation.
    pub fn check_id(id: String) -> Result<String, VerifyError> {
        crate::event_id::check_id(id, "fuzz")
    }

    /// Twilio's sorted form parameters.
    #[cfg(feature = "twilio")]
    pub fn twilio_sorted_params(body: &[u8]) -> Vec<(String, String)> {
        crate::providers::twilio::sorted_params(body)
            .into_iter()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    }
}
