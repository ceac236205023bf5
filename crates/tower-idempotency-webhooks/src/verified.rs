//! The verified delivery handed to handlers, and its axum extractor.

use std::{
    fmt,
    sync::{Arc, OnceLock},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum_core::{
    extract::FromRequestParts,
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use http::{header, request::Parts, HeaderValue, StatusCode};
use tower_idempotency_core::{Authenticator, Problem};

/// A delivery whose signature was checked over its exact bytes.
///
/// The layer inserts it into the request extensions; handlers take it with the axum extractor
/// (`async fn handler(webhook: VerifiedWebhook)`). Cheap to clone.
#[derive(Clone)]
pub struct VerifiedWebhook {
    inner: Arc<Inner>,
}

struct Inner {
    provider: &'static str,
    event_id: String,
    signed_at: Option<SystemTime>,
    body: Bytes,
    secret_index: Option<usize>,
    json: OnceLock<Option<serde_json::Value>>,
    challenge: Option<ChallengeResponse>,
    authenticator: Option<Authenticator>,
    signed_headers: Vec<&'static str>,
    event_id_signed: bool,
}

/// The answer a provider expects to an endpoint-validation request (Slack `url_verification`,
/// Zoom `endpoint.url_validation`, Discord `PING`), computed by the verifier because it may
/// need the secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChallengeResponse {
    /// The `Content-Type` of the answer.
    pub content_type: &'static str,
    /// The body of the answer.
    pub body: Bytes,
}

impl ChallengeResponse {
    /// A `200` JSON response.
    pub fn json(value: &serde_json::Value) -> Self {
        Self {
            content_type: "application/json",
            body: Bytes::from(value.to_string()),
        }
    }

    /// Renders the `200` response.
    pub fn to_response(&self) -> Response {
        let mut response = Response::new(axum_core::body::Body::from(self.body.clone()));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(self.content_type),
        );
        response
    }
}

/// The body is not JSON; returned by [`VerifiedWebhook::json`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("webhook body is not valid JSON")]
pub struct NotJson;

/// Parses a delivery's body as JSON as the verifiers read it: of an object key repeated in the
/// body, the first is kept (serde_json's own `Value` keeps the last; two objects under one key
/// are merged, again first wins), so the document agrees with the id the delivery was keyed
/// by. [`VerifiedWebhook::json`] and the inbox's `InboxEvent::json` read bodies with it.
pub fn parse_json(body: &[u8]) -> Result<serde_json::Value, serde_json::Error> {
    crate::json::document(body)
}

impl VerifiedWebhook {
    /// A verified delivery. Custom [`Verifier`](crate::Verifier)s build one after checking the
    /// signature.
    pub fn new(provider: &'static str, event_id: impl Into<String>, body: Bytes) -> Self {
        Self {
            inner: Arc::new(Inner {
                provider,
                event_id: event_id.into(),
                signed_at: None,
                body,
                secret_index: None,
                json: OnceLock::new(),
                challenge: None,
                authenticator: None,
                signed_headers: Vec::new(),
                event_id_signed: true,
            }),
        }
    }

    fn inner_mut(&mut self) -> &mut Inner {
        Arc::get_mut(&mut self.inner).expect("only called while building")
    }

    /// Records the signed timestamp (unix seconds).
    pub fn with_signed_at(mut self, secs: u64) -> Self {
        self.inner_mut().signed_at = UNIX_EPOCH.checked_add(Duration::from_secs(secs));
        self
    }

    /// Records which configured secret (0 = the first) matched.
    pub fn with_secret_index(mut self, index: usize) -> Self {
        self.inner_mut().secret_index = Some(index);
        self
    }

    /// Hands over the JSON the verifier already parsed, so [`json`](Self::json) does not parse
    /// twice. It must be the parse of the body.
    pub fn with_json(mut self, value: serde_json::Value) -> Self {
        let _ = self.inner_mut().json.set(Some(value));
        self
    }

    /// Records the request headers (lowercase names) the signature covers besides the body,
    /// e.g. a timestamp header, for [`is_signed_header`](Self::is_signed_header).
    pub fn with_signed_headers(mut self, names: impl IntoIterator<Item = &'static str>) -> Self {
        self.inner_mut().signed_headers.extend(names);
        self
    }

    /// Records that the event id comes from a header no signature covers (GitHub's
    /// `X-GitHub-Delivery`, Shopify's `X-Shopify-Event-Id`): whoever relays a captured
    /// delivery can change it. Custom verifiers with such an id call this too.
    pub fn with_unsigned_event_id(mut self) -> Self {
        self.inner_mut().event_id_signed = false;
        self
    }

    /// Attaches the answer to an endpoint-validation request.
    pub fn with_challenge(mut self, challenge: ChallengeResponse) -> Self {
        self.inner_mut().challenge = Some(challenge);
        self
    }

    /// Marks the delivery's key as not covered by its signature, and names what authenticated
    /// it (a digest of the verified signature, Mailgun's token). [`WebhookKeys`](crate::WebhookKeys)
    /// passes it to the layer, which refuses it when it comes back under another key (`401
    /// replayed-signature`; see [`Authenticator`]). Choose bytes that a genuine retry of the same
    /// delivery repeats and that nobody can change without the secret: the decoded MAC, not the
    /// header text (hex case and base64 padding can vary), nor anything else the sender did not
    /// sign.
    pub fn with_authenticator(mut self, authenticator: Authenticator) -> Self {
        self.inner_mut().authenticator = Some(authenticator);
        self
    }

    /// What authenticated the delivery, for schemes whose signature does not cover the key.
    pub fn authenticator(&self) -> Option<Authenticator> {
        self.inner.authenticator
    }

    /// The provider's name (also the layer's namespace), e.g. `"stripe"`.
    pub fn provider(&self) -> &'static str {
        self.inner.provider
    }

    /// The provider's event (or delivery) id: the idempotency key.
    pub fn event_id(&self) -> &str {
        &self.inner.event_id
    }

    /// When the sender signed the delivery, for schemes that sign a timestamp.
    pub fn signed_at(&self) -> Option<SystemTime> {
        self.inner.signed_at
    }

    /// Which configured secret matched (0 = the first), for schemes with secrets. A match on a
    /// later secret means the sender still uses an old one: finish the rotation.
    pub fn secret_index(&self) -> Option<usize> {
        self.inner.secret_index
    }

    /// Whether the signature covers request header `name` (any case). The body is always
    /// covered (except by GitLab's bare token); most headers are not, including ones handlers
    /// like to dispatch on (`X-GitHub-Event`, `X-Shopify-Topic`, `X-Shopify-Shop-Domain`,
    /// `X-Gitlab-Event`): whoever relays a captured delivery can rewrite those, so take the
    /// event type from the signed body where the provider puts it there.
    pub fn is_signed_header(&self, name: &str) -> bool {
        self.inner
            .signed_headers
            .iter()
            .any(|signed| signed.eq_ignore_ascii_case(name))
    }

    /// The header names recorded with [`with_signed_headers`](Self::with_signed_headers).
    pub fn signed_headers(&self) -> &[&'static str] {
        &self.inner.signed_headers
    }

    /// Whether the signature covers the event id (the idempotency key). `false` for ids read
    /// from an unsigned header ([`with_unsigned_event_id`](Self::with_unsigned_event_id)).
    pub fn is_event_id_signed(&self) -> bool {
        self.inner.event_id_signed
    }

    /// The exact bytes that were verified.
    pub fn body(&self) -> &Bytes {
        &self.inner.body
    }

    /// The body parsed as JSON, parsed at most once.
    ///
    /// Of an object key repeated in the body, the first is kept, as the verifiers' key reader
    /// does, so `json()["id"]` is the id the delivery was keyed by. (serde_json's own `Value`,
    /// e.g. axum's `Json<Value>`, keeps the last: read the delivery from here, or deserialize
    /// into a struct, which refuses repeated fields.)
    pub fn json(&self) -> Result<&serde_json::Value, NotJson> {
        self.inner
            .json
            .get_or_init(|| crate::json::parse(&self.inner.body).ok())
            .as_ref()
            .ok_or(NotJson)
    }

    /// The body deserialized into the caller's own event type: async-stripe's `Event`,
    /// octocrab's webhook payloads, or a struct of the fields the handler reads.
    ///
    /// It reads the exact bytes that were verified; a struct refuses an object key repeated in
    /// the body, so a field cannot say one thing to the key reader and another to the handler.
    pub fn deserialize<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.inner.body)
    }

    /// The answer to an endpoint-validation request, if this delivery is one.
    pub fn challenge(&self) -> Option<&ChallengeResponse> {
        self.inner.challenge.as_ref()
    }
}

impl fmt::Debug for VerifiedWebhook {
    // The body can hold personal data; keep it out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifiedWebhook")
            .field("provider", &self.inner.provider)
            .field("event_id", &self.inner.event_id)
            .field("signed_at", &self.inner.signed_at)
            .field("body_len", &self.inner.body.len())
            .finish_non_exhaustive()
    }
}

/// The [`VerifiedWebhook`] extractor ran on a route without the webhook layer.
///
/// Answered `500` with a `webhook-layer-missing` problem: a wiring bug, never the sender's fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("VerifiedWebhook extractor used on a route without a webhook IdempotencyLayer")]
pub struct WebhookLayerMissing;

impl From<WebhookLayerMissing> for Problem {
    fn from(error: WebhookLayerMissing) -> Self {
        Problem {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            slug: "webhook-layer-missing",
            title: "Webhook layer not installed",
            detail: format!(
                "{error}; add e.g. `IdempotencyLayer::stripe(secrets, store)` (trait \
                 `tower_idempotency_webhooks::WebhookLayerExt`) as a route layer"
            )
            .into(),
            retry_after: None,
        }
    }
}

impl IntoResponse for WebhookLayerMissing {
    fn into_response(self) -> Response {
        Problem::from(self).into_response()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for VerifiedWebhook {
    type Rejection = WebhookLayerMissing;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<VerifiedWebhook>()
            .cloned()
            .ok_or(WebhookLayerMissing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_parsed_lazily_once_and_reports_non_json() {
        let webhook = VerifiedWebhook::new("t", "evt_1", Bytes::from_static(b"{\"a\":1}"));
        let first = webhook.json().unwrap() as *const _;
        assert_eq!(webhook.json().unwrap()["a"], 1);
        assert_eq!(first, webhook.json().unwrap() as *const _);
        let not = VerifiedWebhook::new("t", "evt_1", Bytes::from_static(b"a=1"));
        assert_eq!(not.json(), Err(NotJson));
    }

    /// The first of repeated keys wins, as the verifiers' key reader reads the id.
    #[test]
    fn json_keeps_the_first_of_repeated_keys() {
        let body = Bytes::from_static(br#"{"id":"a","id":"b"}"#);
        let webhook = VerifiedWebhook::new("t", "a", body.clone());
        assert_eq!(webhook.json().unwrap()["id"], "a");
        assert_eq!(crate::parse_json(&body).unwrap()["id"], "a");
    }

    #[tokio::test]
    async fn extractor_without_layer_is_a_500_problem() {
        let (mut parts, ()) = http::Request::new(()).into_parts();
        let rejection = VerifiedWebhook::from_request_parts(&mut parts, &())
            .await
            .unwrap_err();
        let response = rejection.into_response();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        let webhook = VerifiedWebhook::new("t", "evt_1", Bytes::new()).with_signed_at(5);
        parts.extensions.insert(webhook);
        let got = VerifiedWebhook::from_request_parts(&mut parts, &())
            .await
            .unwrap();
        assert_eq!(got.event_id(), "evt_1");
        assert_eq!(got.signed_at(), Some(UNIX_EPOCH + Duration::from_secs(5)));
    }
}
