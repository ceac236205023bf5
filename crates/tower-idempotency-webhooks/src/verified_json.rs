//! The [`VerifiedJson`] extractor: a verified delivery's body deserialized into the handler's
//! own event type, with the delivery (its provider and event id) beside it.

use std::borrow::Cow;

use axum_core::{
    extract::FromRequestParts,
    response::{IntoResponse, Response},
};
use http::{request::Parts, StatusCode};
use serde::de::DeserializeOwned;
use tower_idempotency_core::Problem;

use crate::{VerifiedWebhook, WebhookLayerMissing};

/// A verified delivery's body deserialized into `T` (async-stripe's `Event`, octocrab's webhook
/// payloads, a struct of the fields the handler reads), with the delivery beside it.
///
/// It reads the exact bytes the signature was verified over
/// ([`VerifiedWebhook::deserialize`]): a struct refuses an object key repeated in the body, so
/// a field cannot say one thing to the key reader and another to the handler. A body that does
/// not deserialize is answered with a problem ([`VerifiedJsonRejection`]) and the handler does
/// not run; the webhook layer treats that answer as any other of the route (by default only a
/// `2xx` completes the key, so the provider's retry is read again).
///
/// ```
/// use serde::Deserialize;
/// use tower_idempotency_webhooks::VerifiedJson;
///
/// #[derive(Deserialize)]
/// struct Paid {
///     #[serde(rename = "type")]
///     kind: String,
/// }
///
/// async fn stripe_event(paid: VerifiedJson<Paid>) -> String {
///     format!("{} {}", paid.event_id(), paid.event.kind)
/// }
/// # let _ = stripe_event;
/// ```
#[derive(Clone, Debug)]
pub struct VerifiedJson<T> {
    /// The body, deserialized.
    pub event: T,
    /// The delivery it came in: provider, event id, the verified bytes.
    pub webhook: VerifiedWebhook,
}

impl<T> VerifiedJson<T> {
    /// The provider's event id, which the delivery is keyed by.
    pub fn event_id(&self) -> &str {
        self.webhook.event_id()
    }

    /// The verifier's provider name (`stripe`, `github`, ...).
    pub fn provider(&self) -> &'static str {
        self.webhook.provider()
    }

    /// The deserialized body.
    pub fn into_inner(self) -> T {
        self.event
    }
}

/// Why [`VerifiedJson`] did not extract. The answers name where the body went wrong (a line
/// and column), never what it holds.
///
/// | variant | slug | status |
/// |---|---|---|
/// | [`LayerMissing`](Self::LayerMissing) | `webhook-layer-missing` | 500 |
/// | [`NotJson`](Self::NotJson) | `webhook-body-not-json` | 400 |
/// | [`UnexpectedShape`](Self::UnexpectedShape) | `webhook-body-unexpected` | 422 |
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifiedJsonRejection {
    /// The route has no webhook layer ([`WebhookLayerMissing`]).
    #[error(transparent)]
    LayerMissing(#[from] WebhookLayerMissing),
    /// The body is not JSON.
    #[error("webhook body is not valid JSON (line {line}, column {column})")]
    NotJson {
        /// The line serde_json stopped at, from 1.
        line: usize,
        /// The column serde_json stopped at, from 1.
        column: usize,
    },
    /// The body is JSON but not the handler's event type: a field missing, of another type, or
    /// repeated.
    #[error("webhook body does not match the handler's event type (line {line}, column {column})")]
    UnexpectedShape {
        /// The line serde_json stopped at, from 1.
        line: usize,
        /// The column serde_json stopped at, from 1.
        column: usize,
    },
}

impl VerifiedJsonRejection {
    /// The rejection of a body serde_json refused; its message, which can quote the body, is
    /// dropped.
    fn from_serde(error: &serde_json::Error) -> Self {
        let (line, column) = (error.line(), error.column());
        if error.is_data() {
            Self::UnexpectedShape { line, column }
        } else {
            Self::NotJson { line, column }
        }
    }
}

impl From<VerifiedJsonRejection> for Problem {
    fn from(rejection: VerifiedJsonRejection) -> Self {
        let (status, slug, title) = match &rejection {
            VerifiedJsonRejection::LayerMissing(missing) => return Problem::from(*missing),
            VerifiedJsonRejection::NotJson { .. } => (
                StatusCode::BAD_REQUEST,
                "webhook-body-not-json",
                "Webhook body is not JSON",
            ),
            VerifiedJsonRejection::UnexpectedShape { .. } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "webhook-body-unexpected",
                "Webhook body is not the expected event",
            ),
        };
        Problem {
            status,
            slug,
            title,
            detail: Cow::Owned(rejection.to_string()),
            retry_after: None,
        }
    }
}

impl IntoResponse for VerifiedJsonRejection {
    fn into_response(self) -> Response {
        Problem::from(self).into_response()
    }
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for VerifiedJson<T> {
    type Rejection = VerifiedJsonRejection;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let webhook = VerifiedWebhook::from_request_parts(parts, state).await?;
        let event = webhook
            .deserialize::<T>()
            .map_err(|e| VerifiedJsonRejection::from_serde(&e))?;
        Ok(Self { event, webhook })
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::header;

    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Paid {
        amount: u64,
    }

    async fn extract(body: &'static str) -> Result<VerifiedJson<Paid>, VerifiedJsonRejection> {
        let (mut parts, ()) = http::Request::new(()).into_parts();
        let webhook = VerifiedWebhook::new("stripe", "evt_1", Bytes::from_static(body.as_bytes()));
        parts.extensions.insert(webhook);
        VerifiedJson::<Paid>::from_request_parts(&mut parts, &()).await
    }

    #[tokio::test]
    async fn a_body_of_the_type_is_extracted_beside_its_key() {
        let paid = extract(r#"{"amount":5}"#).await.unwrap();
        assert_eq!(paid.event.amount, 5);
        assert_eq!((paid.provider(), paid.event_id()), ("stripe", "evt_1"));
    }

    #[tokio::test]
    async fn refusals_are_problems_without_the_body() {
        let not_json = extract("amount=secret-value").await.unwrap_err();
        assert!(matches!(not_json, VerifiedJsonRejection::NotJson { .. }));
        let shape = extract(r#"{"amount":"secret-value"}"#).await.unwrap_err();
        assert!(matches!(
            shape,
            VerifiedJsonRejection::UnexpectedShape { line: 1, .. }
        ));
        let repeated = extract(r#"{"amount":5,"amount":6}"#).await.unwrap_err();
        assert!(matches!(
            repeated,
            VerifiedJsonRejection::UnexpectedShape { .. }
        ));
        for (rejection, status) in [
            (not_json, StatusCode::BAD_REQUEST),
            (shape, StatusCode::UNPROCESSABLE_ENTITY),
        ] {
            assert!(!format!("{rejection} {rejection:?}").contains("secret-value"));
            let response = rejection.into_response();
            assert_eq!(response.status(), status);
            assert_eq!(
                response.headers()[header::CONTENT_TYPE],
                "application/problem+json"
            );
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            assert!(!String::from_utf8_lossy(&body).contains("secret-value"));
        }
    }

    #[tokio::test]
    async fn without_the_layer_it_is_a_500_problem() {
        let (mut parts, ()) = http::Request::new(()).into_parts();
        let rejection = VerifiedJson::<Paid>::from_request_parts(&mut parts, &())
            .await
            .unwrap_err();
        assert_eq!(
            rejection,
            VerifiedJsonRejection::LayerMissing(WebhookLayerMissing)
        );
        assert_eq!(
            rejection.into_response().status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
