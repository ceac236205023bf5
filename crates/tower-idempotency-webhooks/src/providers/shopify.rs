//! [Shopify](https://shopify.dev/docs/apps/build/webhooks/subscribe/https#step-2-validate-the-origin-of-your-webhook-to-ensure-its-coming-from-shopify):
//! `X-Shopify-Hmac-Sha256: <base64>`, HMAC-SHA256 of the body keyed by the app's client secret;
//! keyed by `X-Shopify-Event-Id` (falling back to `X-Shopify-Webhook-Id`). The unprefixed
//! `shopify-*` header names are accepted too.
//!
//! Shopify retries a failed delivery 8 times over 4 hours, so the one-day [`DEFAULT_TTL`] covers
//! it. No timestamp is signed: the idempotency record is the replay protection. The signature
//! does not cover the event id, so the delivery carries its verified MAC as an
//! [`Authenticator`]: the layer refuses it under another event id (`401 replayed-signature`).

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::{request::Parts, HeaderMap, HeaderName};
use tower_idempotency_core::Authenticator;

use crate::{
    error::VerifyError,
    event_id, headers,
    secret::{self, Secret},
    signature::{self, Encoding, HmacAlgorithm},
    verified::VerifiedWebhook,
    verifier::{verifier_settings, Verifier, DEFAULT_WEBHOOK_TTL},
};

/// The provider name and store namespace.
pub const PROVIDER: &str = "shopify";
/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-shopify-hmac-sha256";
/// The event id header: the key.
pub const EVENT_ID_HEADER: &str = "x-shopify-event-id";
/// The webhook id header: the key when no event id is sent.
pub const WEBHOOK_ID_HEADER: &str = "x-shopify-webhook-id";
/// One day: longer than Shopify's 4 hours of retries.
pub const DEFAULT_TTL: Duration = DEFAULT_WEBHOOK_TTL;

/// Verifies Shopify deliveries.
#[derive(Clone, Debug)]
pub struct ShopifyVerifier {
    secrets: Arc<[Secret]>,
}

impl ShopifyVerifier {
    /// Accepts deliveries signed with any of the app's client `secrets`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes.
    pub fn new<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>) -> Self {
        Self {
            secrets: secret::collect(PROVIDER, secrets),
        }
    }
}

/// `x-shopify-<name>` and `shopify-<name>`, parsed once (a name given as text is parsed on
/// every lookup).
const fn names(prefixed: &'static str) -> [HeaderName; 2] {
    [
        HeaderName::from_static(prefixed),
        HeaderName::from_static(prefixed.split_at(2).1),
    ]
}

static SIGNATURE: [HeaderName; 2] = names(SIGNATURE_HEADER);
static EVENT_ID: [HeaderName; 2] = names(EVENT_ID_HEADER);
static WEBHOOK_ID: [HeaderName; 2] = names(WEBHOOK_ID_HEADER);

/// The value of `x-shopify-<name>` or, failing that, `shopify-<name>`, with the name found.
fn either<'a>(
    headers: &'a HeaderMap,
    [prefixed, bare]: &'static [HeaderName; 2],
) -> Result<Option<(&'static str, &'a str)>, VerifyError> {
    if let Some(value) = headers::header(headers, prefixed)? {
        return Ok(Some((prefixed.as_str(), value)));
    }
    Ok(headers::header(headers, bare)?.map(|value| (bare.as_str(), value)))
}

impl Verifier for ShopifyVerifier {
    fn verify(
        &self,
        parts: &Parts,
        body: &Bytes,
        _now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError> {
        let (name, value) =
            either(&parts.headers, &SIGNATURE)?.ok_or(VerifyError::MissingHeader {
                name: SIGNATURE_HEADER,
            })?;
        let candidates = signature::decode_all(name, &[value], Encoding::Base64)?;
        let index =
            signature::match_hmac(HmacAlgorithm::Sha256, &self.secrets, &[body], &candidates)?;
        let (location, id) = match either(&parts.headers, &EVENT_ID)? {
            Some(found) => found,
            None => either(&parts.headers, &WEBHOOK_ID)?.ok_or(VerifyError::MissingEventId {
                location: EVENT_ID_HEADER,
            })?,
        };
        let id = event_id::check_id(id.to_owned(), location)?;
        // The delivery id is not signed: remember the verified MAC.
        let authenticator = Authenticator::digest(PROVIDER, &[candidates[0].as_bytes()]);
        Ok(VerifiedWebhook::new(PROVIDER, id, body.clone())
            .with_secret_index(index)
            .with_authenticator(authenticator)
            .with_unsigned_event_id())
    }

    verifier_settings!(PROVIDER, DEFAULT_TTL);
}

/// The `X-Shopify-Hmac-Sha256` value for `body`.
pub fn sign(secret: impl AsRef<[u8]>, body: &[u8]) -> String {
    let mac = signature::hmac(HmacAlgorithm::Sha256, secret.as_ref(), &[body]);
    Encoding::Base64.encode(&mac)
}

/// The fixture the tests and benches sign Shopify deliveries with.
#[cfg(feature = "test-support")]
pub(crate) fn fixture() -> crate::testing::HmacFixture {
    use crate::testing::{Delivery, HmacFixture, Outcome, Recapture};

    HmacFixture::new(
        PROVIDER,
        "shpss_fixture",
        Some(SIGNATURE_HEADER),
        |secret| Arc::new(ShopifyVerifier::new([secret])),
        |id, _| format!(r#"{{"id":820982911946154508,"note":"{id}","total_price":"42.00"}}"#),
        |secret, signed, sent, _| {
            let headers = vec![
                (SIGNATURE_HEADER, sign(secret, signed.body.as_bytes())),
                (EVENT_ID_HEADER, sent.id.clone()),
                ("x-shopify-topic", "orders/create".into()),
            ];
            Delivery::new(headers, sent.body.clone())
        },
    )
    .recapture(Recapture::Header(
        EVENT_ID_HEADER,
        Outcome::Refused("replayed-signature"),
    ))
}
