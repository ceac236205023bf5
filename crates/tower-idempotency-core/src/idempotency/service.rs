use std::{
    future::Future,
    panic::AssertUnwindSafe,
    pin::pin,
    sync::{atomic::Ordering, Arc},
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use futures_util::{future::Either, FutureExt};
use http::{header, HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use tokio::{sync::OwnedSemaphorePermit, time::Instant};
use tower_service::Service;
use tracing::{field, Instrument, Span};

use super::{
    authenticated::{self, Checked},
    detach::DetachOnDrop,
    layer::Config,
    metrics, transactional, wait, ResponseBody, ResponseFuture,
};
use crate::{
    outcome::Outcome,
    policy::{cacheable_headers, CacheDirective},
    problem::{Problem, Rejection},
    store::{
        BoxError, CachedResponse, ClaimOutcome, FencingToken, Fingerprint, Ownership, StoreError,
    },
    BODY_OMITTED_HEADER, REPLAYED_HEADER,
};

/// The [`Service`] made by [`IdempotencyLayer`](super::IdempotencyLayer).
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(inner: S, config: Arc<Config>) -> Self {
        Self { inner, config }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // Use the instance that was polled ready; leave a fresh clone behind for the next call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        if !config.methods.guards(request.method()) {
            let answer = pass_through(inner, request, Outcome::PassedThrough);
            return Box::pin(metrics::counted(config, answer));
        }
        let span = tracing::info_span!(
            "idempotency",
            namespace = config.scope.namespace(),
            key_hash = field::Empty,
            outcome = field::Empty,
        );
        let answer = guard(config.clone(), inner, request, span.clone()).instrument(span);
        Box::pin(metrics::counted(config, answer))
    }
}

pub(super) type Answer<B, E> = Result<Response<ResponseBody<B>>, E>;

async fn pass_through<S, ReqBody, ResBody>(
    mut inner: S,
    request: Request<ReqBody>,
    outcome: Outcome,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    let response = inner.call(request).await?;
    Ok(with_outcome(response.map(ResponseBody::inner), outcome))
}

pub(super) fn with_outcome<B>(mut response: Response<B>, outcome: Outcome) -> Response<B> {
    Span::current().record("outcome", outcome.as_str());
    tracing::debug!(outcome = outcome.as_str(), "idempotency outcome");
    response.extensions_mut().insert(outcome);
    response
}

pub(super) fn reject<B>(
    problem: impl Into<Problem>,
    outcome: Outcome,
) -> Response<ResponseBody<B>> {
    with_outcome(problem.into().into_response(), outcome)
}

async fn guard<S, ReqBody, ResBody>(
    config: Arc<Config>,
    inner: S,
    request: Request<ReqBody>,
    span: Span,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let busy = Rejection::Overloaded {
        retry_after: config.retry_after,
    };
    // Counted by a drain from here on, not only once the handler starts: a request still
    // uploading its body or waiting on the store when the drain begins will run its handler.
    // Taken before `accepting` is read, so a drain either sees this request or refuses it.
    let tracked = config.tasks.token();
    if !config.accepting.load(Ordering::SeqCst) {
        return Ok(reject(busy, Outcome::Overloaded));
    }
    let permit = match &config.in_flight_limit {
        Some(limit) => match limit.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => return Ok(reject(busy, Outcome::Overloaded)),
        },
        None => None,
    };

    let too_large = Rejection::PayloadTooLarge {
        limit: config.max_body,
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > config.max_body as u64) {
        // A client waiting for `100 Continue` has not sent the body; it never gets the go-ahead.
        // Any other is answered at once, and the body it is sending is discarded beside that.
        if !expects_continue(request.headers()) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let body = Box::pin(request.into_body());
                let config = config.clone();
                runtime.spawn(async move { discard(body, &config).await });
            }
        }
        return Ok(reject(too_large, Outcome::Rejected));
    }
    let (mut parts, body) = request.into_parts();
    let body = match read_body(pin!(body), config.max_body).await {
        // Request trailers are not part of the fingerprint or the request the handler gets.
        Capped::Whole(bytes, _trailers) => bytes,
        Capped::Over(_, rest) => {
            discard(rest, &config).await;
            return Ok(reject(too_large, Outcome::Rejected));
        }
        Capped::Failed => return Ok(reject(Rejection::BodyUnreadable, Outcome::Rejected)),
    };

    let key = match config.key_source.derive(&mut parts, &body) {
        Ok(Some(key)) => key,
        Ok(None) => {
            let request = Request::from_parts(parts, ReqBody::from(body));
            return Box::pin(pass_through(inner, request, Outcome::PassedThrough)).await;
        }
        Err(problem) => return Ok(reject(problem, Outcome::Rejected)),
    };
    if config.require_principal && !config.scope.has_principal(&parts) {
        tracing::error!("no principal on a route that requires one (is the auth layer outside this one?); answering 500");
        return Ok(reject(Rejection::PrincipalMissing, Outcome::Rejected));
    }
    let store_key = config.scope.store_key(&parts, &key);
    let authenticator = authenticated::of(&parts, &key);
    drop(key);
    // The hash part of the scoped key; never the raw key.
    let hash_start = config.scope.namespace().len() + 1;
    span.record("key_hash", &store_key[hash_start..hash_start + 16]);
    let fingerprint = match config.fingerprint.fingerprint(&parts, &body) {
        Ok(fingerprint) => fingerprint,
        Err(error) => return Ok(reject(Rejection::from(error), Outcome::Rejected)),
    };

    let mark = config.wait.as_ref().map(|w| w.mark(config.store.as_ref()));
    let key_claim = claim(&config, &store_key, &fingerprint);
    let claim = match authenticated::claim(&config, &store_key, key_claim, authenticator).await {
        Checked::Claim(claim) => claim,
        Checked::Replayed => {
            return Ok(reject(
                Rejection::ReplayedSignature,
                Outcome::ReplayedSignature,
            ))
        }
    };
    // With `wait_for_result`, an in-flight duplicate waits for the result (see `wait.rs`).
    let claim = match (&config.wait, mark) {
        (Some(waiters), Some(mark)) => {
            wait::settle(&config, waiters, mark, &store_key, &fingerprint, claim).await
        }
        _ => claim,
    };
    let claim = match claim {
        Ok(claim) => claim,
        Err(error) => {
            if config.fail_open {
                tracing::warn!(%error, "idempotency store failed; running the handler UNGUARDED (fail-open is enabled)");
                let request = Request::from_parts(parts, ReqBody::from(body));
                return Box::pin(pass_through(inner, request, Outcome::FailedOpen)).await;
            }
            tracing::error!(%error, "idempotency store failed; answering 503");
            let unavailable = Rejection::StoreUnavailable {
                retry_after: config.retry_after,
            };
            return Ok(reject(unavailable, Outcome::StoreUnavailable));
        }
    };

    match claim {
        ClaimOutcome::Completed { record, .. } if record.fingerprint == fingerprint => {
            match replay(record.response) {
                Some(response) => Ok(with_outcome(response, Outcome::Replayed)),
                None => {
                    // Only a record built outside the layer (a corrupt or foreign store value)
                    // can be this full; answer as for any unreadable record.
                    tracing::error!(
                        "the stored response has too many headers to replay; answering 503"
                    );
                    let unavailable = Rejection::StoreUnavailable {
                        retry_after: config.retry_after,
                    };
                    Ok(reject(unavailable, Outcome::StoreUnavailable))
                }
            }
        }
        ClaimOutcome::Completed { .. } => Ok(reject(Rejection::KeyReused, Outcome::Mismatch)),
        ClaimOutcome::InFlight {
            fingerprint: holder,
            ..
        } if holder != fingerprint => Ok(reject(Rejection::KeyReused, Outcome::Mismatch)),
        ClaimOutcome::InFlight {
            lease_remaining, ..
        } => {
            // Never later than the holder's lease ends (the key is free or renewed by then),
            // never later than the configured hint; the header rounds up to at least 1 s.
            let in_flight = Rejection::InFlight {
                status: config.in_flight_status,
                retry_after: config.retry_after.min(lease_remaining),
            };
            Ok(reject(in_flight, Outcome::InFlight))
        }
        ClaimOutcome::Claimed { token } => {
            let request = Request::from_parts(parts, ReqBody::from(body));
            // Wakes this key's waiters once the key is completed or released.
            let settled = wait::SettledSignal::new(config.wait.as_ref(), &store_key);
            // Runs here on the caller's task; if the caller goes away first, the rest is spawned
            // (see `DetachOnDrop`) so the result is recorded either way. Tracked so that a drain
            // waits for it in both cases; instrumented so the span follows a detached handler.
            // Boxed first, so the wrappers around it move a pointer, not the whole future.
            let execute = if config.transactional {
                // The handler's writes commit with the completion: see `transactional.rs`.
                Either::Left(transactional::execute(
                    config.clone(),
                    inner,
                    request,
                    store_key,
                    token,
                    permit,
                ))
            } else {
                Either::Right(execute(
                    config.clone(),
                    inner,
                    request,
                    store_key,
                    token,
                    permit,
                ))
            };
            let execute = Box::pin(async move {
                let answer = execute.await;
                drop(settled);
                answer
            });
            let run = config
                .tasks
                .track_future(AssertUnwindSafe(execute).catch_unwind().instrument(span));
            // The tracked handler now stands for this request (it outlives a caller who leaves).
            drop(tracked);
            match DetachOnDrop::new(run).await {
                Ok(answer) => answer,
                // A panic outside the handler itself (the handler's own is caught in `execute`):
                // the lease frees the key.
                Err(_panic) => Ok(reject(Rejection::HandlerFailed, Outcome::HandlerFailed)),
            }
        }
    }
}

/// Claims `key` with a fresh token within the store timeout. A claim that failed, timed out or
/// was abandoned (the caller went away while it ran) may still have landed: the store may finish
/// a statement, or execute a command whose reply never arrives. Such a claim is released with its
/// own token in the background (see [`ReleaseUnanswered`]), so its key is not blocked for a
/// lease while nothing runs. The error is for logs only.
pub(super) async fn claim(
    config: &Arc<Config>,
    key: &str,
    fingerprint: &Fingerprint,
) -> Result<ClaimOutcome, String> {
    let token = FencingToken::random().map_err(|e| format!("no fencing token: {e}"))?;
    let mut unanswered = ReleaseUnanswered {
        config: Some(config.clone()),
        key,
        token,
    };
    let claimed = within(
        config.store_timeout(),
        metrics::timed(
            config,
            "claim",
            config.store.claim(key, fingerprint, token, config.lease),
        ),
    )
    .await;
    match claimed {
        Some(Ok(outcome)) => {
            unanswered.config = None;
            Ok(outcome)
        }
        Some(Err(error)) => Err(error.to_string()),
        None => Err(format!("timed out after {:?}", config.store_timeout())),
    }
}

/// Releases a claim that got no answer, when dropped armed (`config` set): at once, and once more
/// after the store timeout if the first release found nothing (a statement still running on the
/// server may land after it). Each attempt is bounded by the store timeout; a claim that never
/// landed makes both no-ops (`Stale`). Tracked, so a drain waits for it.
struct ReleaseUnanswered<'a> {
    config: Option<Arc<Config>>,
    key: &'a str,
    token: FencingToken,
}

impl Drop for ReleaseUnanswered<'_> {
    fn drop(&mut self) {
        let Some(config) = self.config.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (key, token) = (self.key.to_owned(), self.token);
        let tasks = config.tasks.clone();
        let release = async move {
            for attempt in 0..2 {
                if attempt > 0 {
                    tokio::time::sleep(config.store_timeout()).await;
                }
                let release = metrics::timed(&config, "release", config.store.release(&key, token));
                match within(config.store_timeout(), release).await {
                    Some(Ok(Ownership::Current)) => {
                        tracing::info!("released a claim whose answer never arrived");
                        return;
                    }
                    Some(Ok(Ownership::Stale)) => {}
                    Some(Err(error)) => {
                        tracing::warn!(%error, "releasing an unanswered claim failed")
                    }
                    None => tracing::warn!("releasing an unanswered claim timed out"),
                }
            }
        };
        runtime.spawn(tasks.track_future(release.instrument(Span::current())));
    }
}

/// The stored response with the replay markers; `None` when its header map is too full to take
/// them (`HeaderMap::insert` would panic).
fn replay<B>(cached: CachedResponse) -> Option<Response<ResponseBody<B>>> {
    let mut response = Response::new(ResponseBody::full(cached.body));
    *response.status_mut() = cached.status;
    *response.headers_mut() = cached.headers;
    let headers = response.headers_mut();
    headers
        .try_insert(REPLAYED_HEADER.clone(), HeaderValue::from_static("true"))
        .ok()?;
    if cached.body_omitted {
        headers
            .try_insert(
                BODY_OMITTED_HEADER.clone(),
                HeaderValue::from_static("true"),
            )
            .ok()?;
    }
    Some(response)
}

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

async fn execute<S, ReqBody, ResBody>(
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
    let work = produce(&config, inner, request);
    let started = Instant::now();
    let (produced, lease_ends) = renewing_lease(
        &config,
        &key,
        token,
        started,
        AssertUnwindSafe(work).catch_unwind(),
    )
    .await;

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
/// without its body (replays carry [`BODY_OMITTED_HEADER`]); any other failure is retried with
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

/// Like `tokio::time::timeout(limit, future)` (`None` when it elapses), but without arming the
/// timer when `future` is ready on its first poll (the memory store, a local-cache hit): arming
/// reads the clock and builds a timer entry, a few percent of an in-process replay in the
/// profile. The limit therefore runs from the end of the first poll, which for a store that
/// returns `Pending` promptly, as an async store must, is the same moment.
pub(super) async fn within<F: Future>(limit: Duration, future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    if let Poll::Ready(output) = futures_util::poll!(&mut future) {
        return Some(output);
    }
    tokio::time::timeout(limit, future).await.ok()
}

/// Runs `work` while renewing the lease every third of its length, up to the renewal ceiling;
/// returns its output and the moment the lease is known to hold until (`started`, when the claim
/// returned, plus the lease, or the last successful renewal's start plus the lease).
///
/// The renewals run beside `work` in the same task: `work` is polled while a renewal waits on
/// the store.
pub(super) async fn renewing_lease<F: Future>(
    config: &Config,
    key: &str,
    token: FencingToken,
    started: Instant,
    work: F,
) -> (F::Output, Instant) {
    let mut work = pin!(work);
    // A handler that finishes on its first poll never needs a renewal; the renewals (a timer
    // registration) are set up only for one that waits on something.
    if let Poll::Ready(output) = futures_util::poll!(&mut work) {
        return (output, started + config.lease);
    }
    let held_until = std::sync::Mutex::new(started + config.lease);
    let renewals = keep_renewing(config, key, token, &held_until);
    let output = tokio::select! {
        biased;
        output = &mut work => output,
        never = renewals => match never {},
    };
    let lease_ends = *held_until.lock().unwrap_or_else(|p| p.into_inner());
    (output, lease_ends)
}

/// Renews the lease every third of its length until the renewal ceiling; never returns. Each
/// successful renewal moves `held_until`.
async fn keep_renewing(
    config: &Config,
    key: &str,
    token: FencingToken,
    held_until: &std::sync::Mutex<Instant>,
) -> std::convert::Infallible {
    // At least 33 ms: the builder keeps the lease at or above `MIN_LEASE`.
    let period = config.lease / 3;
    let stop_renewing = Instant::now() + config.max_lease_renewal;
    let mut next = Instant::now() + period;
    while next < stop_renewing {
        tokio::time::sleep_until(next).await;
        let sent = Instant::now();
        let renewal = metrics::timed(
            config,
            "renew",
            config.store.renew(key, token, config.lease),
        );
        match tokio::time::timeout(config.store_timeout(), renewal).await {
            Ok(Ok(Ownership::Current)) => {
                *held_until.lock().unwrap_or_else(|p| p.into_inner()) = sent + config.lease;
            }
            Ok(Ok(Ownership::Stale)) => {
                metrics::lease_renewal_lost(config);
                tracing::warn!("lease lost while the handler runs; a retry may run it again")
            }
            Ok(Err(error)) => tracing::warn!(%error, "lease renewal failed"),
            Err(_) => tracing::warn!("lease renewal timed out"),
        }
        next = sent + period;
    }
    tokio::time::sleep_until(stop_renewing).await;
    tracing::warn!(
        ceiling = ?config.max_lease_renewal,
        "the handler outlived the lease renewal ceiling; once its lease lapses, a retry may run it again"
    );
    std::future::pending().await
}

fn expects_continue(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// Reads and drops the rest of a request body over the cap, up to the configured bytes and
/// time, so that a client which uploads everything before reading receives the `413` rather
/// than a connection reset (see `IdempotencyLayer::discard_oversized_body`).
async fn discard<B>(mut body: B, config: &Config)
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut left = config.discard_bytes;
    let drain = async {
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                match left.checked_sub(data.len()) {
                    Some(rest) => left = rest,
                    None => return,
                }
            }
        }
    };
    let _ = tokio::time::timeout(config.discard_time, drain).await;
}

pub(super) enum Capped<B> {
    /// The whole body, and its trailers if it had any.
    Whole(Bytes, Option<http::HeaderMap>),
    Over(Bytes, B),
    Failed,
}

/// Reads a body until it ends (then `Whole`, with its trailers) or exceeds `cap` (then `Over`
/// with what was read and the rest of the body). A single-frame body (the common case) is kept as it is, without a copy and without
/// the frame queue that `http_body_util`'s `collect` allocates per request.
pub(super) async fn read_body<B>(mut body: B, cap: usize) -> Capped<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut first: Option<Bytes> = None;
    let mut rest = BytesMut::new();
    let mut len = 0usize;
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Capped::Failed;
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let Ok(map) = frame.into_trailers() {
                    trailers = Some(map);
                }
                continue;
            }
        };
        len += data.len();
        match first.take() {
            None if rest.is_empty() => first = Some(data),
            previous => {
                if let Some(previous) = previous {
                    rest.extend_from_slice(&previous);
                }
                rest.extend_from_slice(&data);
            }
        }
        if len > cap {
            let prefix = first.take().unwrap_or_else(|| rest.split().freeze());
            return Capped::Over(prefix, body);
        }
    }
    Capped::Whole(first.unwrap_or_else(|| rest.freeze()), trailers)
}
