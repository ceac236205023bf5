//! Running a claimed request's handler and settling its key: completed with the response, or
//! released.

use std::{panic::AssertUnwindSafe, pin::pin, sync::Arc, time::Duration};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{Request, Response};
use http_body::Body;
use tokio::{sync::OwnedSemaphorePermit, time::Instant};
use tower_service::Service;
use tracing::Span;

use super::{
    answer::{reject, with_outcome, Answer},
    claim::within,
    config::Config,
    lease::renewing_lease,
    metrics,
    request_body::{read_body, Capped},
    ResponseBody,
};
use crate::{
    outcome::Outcome,
    policy::{cacheable_headers, CacheDirective},
    problem::Rejection,
    store::{BoxError, CachedResponse, FencingToken, Ownership, StoreError},
};

/// What the handler produced, before the key is settled.
pub(super) enum Produced<B, E> {
    /// Complete the key with `cached`, answer `response`.
    Complete(Response<ResponseBody<B>>, CachedResponse),
    /// Release the key, answer `response`.
    Release(Response<ResponseBody<B>>),
    /// The inner service failed; release and pass the error on.
    Error(E),
    /// The response body failed while being read; release and answer 500.
    BodyFailed,
}

/// Runs a claimed request's handler while renewing its lease, then completes or releases the
/// key by what it produced.
pub(super) async fn execute<S, ReqBody, ResBody>(
    config: Arc<Config>,
    inner: S,
    request: Request<ReqBody>,
    key: String,
    token: FencingToken,
    _permit: Option<OwnedSemaphorePermit>,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let started = Instant::now();
    // In a block of its own, so the handler's state and the completion's share their place in
    // this future's.
    let (produced, lease_ends) = {
        let work = pin!(AssertUnwindSafe(produce(&config, inner, request)).catch_unwind());
        renewing_lease(&config, &key, token, started, work).await
    };

    match produced {
        Ok(Produced::Complete(response, cached)) => {
            let outcome = record(&config, &key, token, cached, lease_ends).await;
            Ok(with_outcome(response, outcome))
        }
        Ok(Produced::Release(response)) => {
            release(&config, &key, token).await;
            Ok(with_outcome(response, Outcome::ExecutedReleased))
        }
        Ok(Produced::Error(error)) => {
            release(&config, &key, token).await;
            Span::current().record("outcome", Outcome::HandlerFailed.as_str());
            Err(error)
        }
        Ok(Produced::BodyFailed) => {
            tracing::error!("the handler's response body failed; key released");
            release(&config, &key, token).await;
            Ok(reject(Rejection::HandlerFailed, Outcome::HandlerFailed))
        }
        Err(_panic) => {
            tracing::error!("the handler panicked; key released");
            release(&config, &key, token).await;
            Ok(reject(Rejection::HandlerFailed, Outcome::HandlerFailed))
        }
    }
}

/// Runs the handler and reads its response as far as the cache policy needs: the response to
/// answer, and the copy to cache when the key is to be completed.
pub(super) async fn produce<S, ReqBody, ResBody>(
    config: &Config,
    mut inner: S,
    request: Request<ReqBody>,
) -> Produced<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let _in_flight = metrics::HandlerInFlight::start(config);
    let response = match inner.call(request).await {
        Ok(response) => response,
        Err(error) => return Produced::Error(error),
    };
    let (parts, body) = response.into_parts();
    let directive = parts.extensions.get::<CacheDirective>().copied();
    if !config.cache_policy.completes(parts.status, directive) {
        return Produced::Release(Response::from_parts(parts, ResponseBody::inner(body)));
    }
    let (body, answer_body, body_omitted) = match read_body(Box::pin(body), config.max_cached_body)
        .await
    {
        Capped::Whole(bytes, Some(trailers)) => {
            // A replay could not carry the trailers (gRPC's status travels in them), so
            // the response is answered whole and not cached.
            tracing::debug!("the response has trailers; not cached, key released");
            let body = ResponseBody::full_with_trailers(bytes, Some(trailers));
            return Produced::Release(Response::from_parts(parts, body));
        }
        Capped::Whole(bytes, None) => (bytes.clone(), ResponseBody::full(bytes), false),
        Capped::Over(prefix, rest) => (Bytes::new(), ResponseBody::prefixed(prefix, rest), true),
        Capped::Failed => return Produced::BodyFailed,
    };
    let cached = CachedResponse {
        status: parts.status,
        headers: cacheable_headers(&parts.headers),
        body,
        body_omitted,
    };
    Produced::Complete(Response::from_parts(parts, answer_body), cached)
}

/// First wait before retrying a failed completion; it doubles after every attempt.
const COMPLETE_RETRY_BACKOFF: Duration = Duration::from_millis(50);

/// Stores the handler's result for the key. A record the store refuses as too large is stored
/// without its body (replays carry [`BODY_OMITTED_HEADER`](crate::BODY_OMITTED_HEADER)); any other failure is retried with
/// a doubling backoff while the lease (held until `lease_ends`) lasts, after which the key stays
/// in flight until the lease expires.
async fn record(
    config: &Config,
    key: &str,
    token: FencingToken,
    mut cached: CachedResponse,
    lease_ends: Instant,
) -> Outcome {
    let timeout = config.store_timeout();
    let mut backoff = COMPLETE_RETRY_BACKOFF;
    loop {
        let completion = metrics::timed(
            config,
            "complete",
            config.store.complete(key, token, &cached, config.ttl),
        );
        let error = match within(timeout, completion).await {
            Some(Ok(Ownership::Current)) => return Outcome::Executed,
            Some(Ok(Ownership::Stale)) => {
                tracing::warn!("lease lost before completion; the result was not recorded");
                metrics::result_unrecorded(config);
                return Outcome::ExecutedUnrecorded;
            }
            Some(Err(StoreError::RecordTooLarge { size, limit })) if !cached.body_omitted => {
                tracing::warn!(
                    size,
                    limit,
                    "the response is larger than the store accepts; storing it without its body"
                );
                cached.body = Bytes::new();
                cached.body_omitted = true;
                continue;
            }
            Some(Err(error)) => error.to_string(),
            None => format!("timed out after {timeout:?}"),
        };
        if Instant::now() + backoff >= lease_ends {
            tracing::error!(%error, "recording the result failed; the key stays in flight until its lease expires");
            metrics::result_unrecorded(config);
            return Outcome::ExecutedUnrecorded;
        }
        tracing::warn!(%error, retry_in = ?backoff, "recording the result failed; retrying while the lease holds");
        tokio::time::sleep(backoff).await;
        backoff = backoff.saturating_mul(2);
    }
}

/// Releases the key within the store timeout; a failure leaves it in flight until its lease
/// expires, which is logged.
pub(super) async fn release(config: &Config, key: &str, token: FencingToken) {
    let release = metrics::timed(config, "release", config.store.release(key, token));
    match within(config.store_timeout(), release).await {
        Some(Ok(_)) => {}
        Some(Err(error)) => {
            tracing::error!(%error, "releasing the key failed; it stays in flight until its lease expires")
        }
        None => tracing::error!(
            "releasing the key timed out; it stays in flight until its lease expires"
        ),
    }
}
