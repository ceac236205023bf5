//! [`Ack`]: the route's service that verifies a delivery and stores it in one statement.

use std::{
    convert::Infallible,
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    body::Body,
    response::{IntoResponse, Response},
    Json,
};
use http::{HeaderName, Request};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower_idempotency_core::{Problem, Rejection, DEFAULT_MAX_BODY};
use tower_idempotency_webhooks::{verify_delivery, Clock, SystemClock, Verifier, VerifyError};

use crate::{
    backend::NewEvent,
    event::{duration_ms, unix_ms, EventKey},
    Inbox, InboxDatabase,
};

/// Sent as `Retry-After` when the database is unavailable.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// The acknowledging service of one provider's route: mount it with
/// `axum::routing::post_service(inbox.ack(verifier))`.
///
/// For each request it answers, in order:
/// - `405` for a method the provider does not send, `413` for a body over the cap
///   ([`max_body_bytes`](Self::max_body_bytes), 1 MiB by default), the verifier's `400`/`401`
///   problem for a delivery that does not verify: nothing is stored;
/// - the provider's challenge answer for an endpoint-validation request (Slack, Zoom, Discord):
///   nothing is stored;
/// - `503` with `Retry-After` when the insert fails: the provider delivers again later;
/// - `200 {"received": "<event id>"}` once the row is committed, for a first delivery and a
///   duplicate alike. A first delivery is also handed to the running worker's queue.
pub struct Ack<V, DB: InboxDatabase> {
    inner: Arc<Inner<V, DB>>,
}

struct Inner<V, DB: InboxDatabase> {
    inbox: Inbox<DB>,
    verifier: V,
    clock: Arc<dyn Clock>,
    max_body: usize,
    keep_headers: Vec<HeaderName>,
    /// How long a processed row carrying an authenticator is kept: the verifier's retry
    /// horizon (its TTL, at least twice its replay window), as the webhook layer keeps its
    /// authenticator records.
    horizon: Duration,
}

impl<V, DB: InboxDatabase> Clone for Ack<V, DB> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<V: fmt::Debug, DB: InboxDatabase> fmt::Debug for Ack<V, DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ack")
            .field("inbox", &self.inner.inbox)
            .field("verifier", &self.inner.verifier)
            .field("max_body", &self.inner.max_body)
            .field("keep_headers", &self.inner.keep_headers)
            .finish_non_exhaustive()
    }
}

impl<DB: InboxDatabase> Inbox<DB> {
    /// The acknowledging service for deliveries that `verifier` checks.
    pub fn ack<V: Verifier>(&self, verifier: V) -> Ack<V, DB> {
        let twice_window = verifier
            .replay_window()
            .map_or(Duration::ZERO, |window| window.saturating_mul(2));
        let horizon = verifier.default_ttl().max(twice_window);
        Ack {
            inner: Arc::new(Inner {
                inbox: self.clone(),
                verifier,
                clock: Arc::new(SystemClock),
                max_body: DEFAULT_MAX_BODY,
                keep_headers: vec![http::header::CONTENT_TYPE],
                horizon,
            }),
        }
    }
}

impl<V: Verifier, DB: InboxDatabase> Ack<V, DB> {
    fn inner_mut(&mut self) -> &mut Inner<V, DB> {
        Arc::get_mut(&mut self.inner).expect("configured before it is cloned")
    }

    /// Refuses bodies over `limit` bytes with `413` before verifying them.
    ///
    /// # Panics
    /// When called on a clone of a service that was already cloned.
    pub fn max_body_bytes(mut self, limit: usize) -> Self {
        self.inner_mut().max_body = limit;
        self
    }

    /// Also stores the request header `name` with each event, for the handler
    /// ([`InboxEvent::header`](crate::InboxEvent::header)); `content-type` is kept by default.
    /// Keep what the handler needs (GitHub's `x-github-event`), not the signature headers.
    ///
    /// # Panics
    /// When called on a clone of a service that was already cloned.
    pub fn keep_header(mut self, name: HeaderName) -> Self {
        self.inner_mut().keep_headers.push(name);
        self
    }

    /// Checks signed timestamps against `clock` instead of the system clock (tests).
    ///
    /// # Panics
    /// When called on a clone of a service that was already cloned.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.inner_mut().clock = Arc::new(clock);
        self
    }
}

impl<V: Verifier, DB: InboxDatabase> Inner<V, DB> {
    async fn acknowledge(&self, request: Request<Body>) -> Response {
        let (parts, body) = request.into_parts();
        // The method first, so a wrong one is refused before its body is read.
        if !self.verifier.accepts_method(&parts.method) {
            return Problem::from(VerifyError::MethodNotAllowed).into_response();
        }
        let body = match Limited::new(body, self.max_body).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => {
                let limit = self.max_body;
                return Problem::from(Rejection::PayloadTooLarge { limit }).into_response();
            }
            Err(_) => return Problem::from(Rejection::BodyUnreadable).into_response(),
        };
        let webhook = match verify_delivery(&self.verifier, &parts, &body, self.clock.now()) {
            Ok(webhook) => webhook,
            Err(error) => return Problem::from(error).into_response(),
        };
        if let Some(challenge) = webhook.challenge() {
            return challenge.to_response();
        }
        let event_id = webhook.event_id();
        let received_at = unix_ms(self.clock.now());
        let authenticator = webhook.authenticator().map(|a| a.as_bytes().to_vec());
        let authenticator_until = authenticator
            .as_ref()
            .map(|_| received_at.saturating_add(duration_ms(self.horizon)));
        let event = NewEvent {
            key: EventKey::new(webhook.provider(), event_id),
            headers: self.kept_headers(&parts.headers),
            body: body.to_vec(),
            authenticator,
            received_at,
            authenticator_until,
            order: self.inbox.ordering.as_ref().and_then(|o| o.position(&body)),
        };
        let key = event.key.clone();
        let inserted = self
            .inbox
            .acks
            .insert(&self.inbox.pool, &self.inbox.sql, event);
        match inserted.await {
            Ok(inserted) => {
                crate::metrics::acknowledged(&key.provider, inserted);
                let answer = Json(serde_json::json!({ "received": key.event_id }));
                if inserted {
                    self.inbox.notify(key);
                }
                answer.into_response()
            }
            Err(error) => {
                tracing::warn!(provider = %key.provider, error = %error, "inbox insert failed");
                Problem::from(Rejection::StoreUnavailable {
                    retry_after: RETRY_AFTER,
                })
                .into_response()
            }
        }
    }

    /// The kept headers as a JSON array of `[name, value]` pairs (values that are not text are
    /// skipped).
    fn kept_headers(&self, headers: &http::HeaderMap) -> String {
        let kept: Vec<(&str, &str)> = self
            .keep_headers
            .iter()
            .flat_map(|name| {
                headers
                    .get_all(name)
                    .iter()
                    .filter_map(move |value| Some((name.as_str(), value.to_str().ok()?)))
            })
            .collect();
        serde_json::to_string(&kept).expect("pairs of strings serialize")
    }
}

impl<V: Verifier, DB: InboxDatabase> tower_service::Service<Request<Body>> for Ack<V, DB> {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move { Ok(inner.acknowledge(request).await) })
    }
}
