//! The service: a guarded request goes through named steps (admission, the body, the key, the
//! claim), then either runs its handler (`settle.rs`) or is answered from the claim
//! (`replay.rs`).

use std::{
    panic::AssertUnwindSafe,
    sync::{atomic::Ordering, Arc},
    task::{Context, Poll},
};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{request::Parts, Request, Response};
use http_body::Body;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tower_service::Service;
use tracing::{field, Instrument, Span};

use super::{
    answer::{reject, with_outcome, Answer, Early},
    authenticated::{self, Checked, Held},
    claim::{self, claim},
    config::Config,
    detach::DetachOnDrop,
    metrics, replay, request_body, settle, transactional, wait, ResponseBody, ResponseFuture,
};
use crate::{
    authenticator::Authenticator,
    outcome::Outcome,
    problem::Rejection,
    store::{BoxError, ClaimOutcome, FencingToken, Fingerprint},
};

/// The [`Service`] made by [`IdempotencyLayer`](super::IdempotencyLayer).
///
/// It takes requests with any body of [`Bytes`] (axum's `Body`, hyper's `Incoming`, tower-http's
/// `Limited<B>` after `RequestBodyLimitLayer`) and hands its inner service an
/// [`axum::body::Body`]: the buffered body of a guarded request, or the untouched body of one it
/// passes through.
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
    S: Service<Request<InnerBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body<Data = Bytes> + Send + 'static,
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
            let request = request.map(InnerBody::new);
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

/// The body the inner service receives.
type InnerBody = axum::body::Body;

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

async fn guard<S, ReqBody, ResBody>(
    config: Arc<Config>,
    inner: S,
    request: Request<ReqBody>,
    span: Span,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<InnerBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    // Counted by a drain from here on, not only once the handler starts: a request still
    // uploading its body or waiting on the store when the drain begins will run its handler.
    // Taken before `accepting` is read, so a drain either sees this request or refuses it.
    let tracked = config.tasks.token();
    let permit = match admit(&config) {
        Ok(permit) => permit,
        Err(busy) => return Ok(*busy),
    };
    let (mut parts, body) = match request_body::read_request(&config, request).await {
        Ok(read) => read,
        Err(refused) => return Ok(*refused),
    };
    let keyed = match identify(&config, &mut parts, &body, &span) {
        Ok(Some(keyed)) => keyed,
        Ok(None) => {
            let request = Request::from_parts(parts, InnerBody::from(body));
            return Box::pin(pass_through(inner, request, Outcome::PassedThrough)).await;
        }
        Err(refused) => return Ok(*refused),
    };
    let Keyed {
        store_key,
        fingerprint,
        authenticator,
    } = keyed;
    let (claim, held) = match claim_key(&config, &store_key, &fingerprint, authenticator).await {
        Ok((Ok(claim), held)) => (claim, held),
        Ok((Err(error), _)) => {
            let request = Request::from_parts(parts, InnerBody::from(body));
            return store_failed(&config, error, inner, request).await;
        }
        Err(refused) => return Ok(*refused),
    };
    match claim {
        ClaimOutcome::Claimed { token } => {
            let request = Request::from_parts(parts, InnerBody::from(body));
            let claimed = Claimed {
                key: store_key,
                token,
                held,
                permit,
                tracked,
            };
            run_claimed(config, inner, request, claimed, span).await
        }
        taken => Ok(replay::answer(&config, taken, &fingerprint)),
    }
}

/// The in-flight permit, or the `503` when the layer is draining or at its in-flight limit.
fn admit<B>(config: &Config) -> Result<Option<OwnedSemaphorePermit>, Early<B>> {
    let busy = || {
        let busy = Rejection::Overloaded {
            retry_after: config.retry_after,
        };
        Box::new(reject(busy, Outcome::Overloaded))
    };
    if !config.accepting.load(Ordering::SeqCst) {
        return Err(busy());
    }
    match &config.in_flight_limit {
        Some(limit) => match limit.clone().try_acquire_owned() {
            Ok(permit) => Ok(Some(permit)),
            Err(_) => Err(busy()),
        },
        None => Ok(None),
    }
}

/// A request's place in the store: its scoped key, fingerprint and authenticator check.
struct Keyed {
    store_key: String,
    fingerprint: Fingerprint,
    authenticator: Option<(Authenticator, Fingerprint)>,
}

/// Derives the key (`None`: the request carries none and passes through), scopes it and
/// fingerprints the request; the raw key is dropped here and only its hash reaches the span.
fn identify<B>(
    config: &Config,
    parts: &mut Parts,
    body: &Bytes,
    span: &Span,
) -> Result<Option<Keyed>, Early<B>> {
    let key = match config.key_source.derive(parts, body) {
        Ok(Some(key)) => key,
        Ok(None) => return Ok(None),
        Err(problem) => return Err(Box::new(reject(problem, Outcome::Rejected))),
    };
    if config.require_principal && !config.scope.has_principal(parts) {
        tracing::error!("no principal on a route that requires one (is the auth layer outside this one?); answering 500");
        return Err(Box::new(reject(
            Rejection::PrincipalMissing,
            Outcome::Rejected,
        )));
    }
    let store_key = config.scope.store_key(parts, &key);
    let authenticator = authenticated::of(parts, &key);
    drop(key);
    // The hash part of the scoped key; never the raw key.
    let hash_start = config.scope.namespace().len() + 1;
    span.record("key_hash", &store_key[hash_start..hash_start + 16]);
    let fingerprint = config
        .fingerprint
        .fingerprint(parts, body)
        .map_err(|error| Box::new(reject(Rejection::from(error), Outcome::Rejected)))?;
    Ok(Some(Keyed {
        store_key,
        fingerprint,
        authenticator,
    }))
}

/// Claims the key with the authenticator check and, with `wait_for_result`, waits while an
/// identical request holds it (see `wait.rs`). The inner error is the store's, for logs only.
async fn claim_key<B>(
    config: &Arc<Config>,
    store_key: &str,
    fingerprint: &Fingerprint,
    authenticator: Option<(Authenticator, Fingerprint)>,
) -> Result<(Result<ClaimOutcome, String>, Option<Held>), Early<B>> {
    let mark = config.wait.as_ref().map(|w| w.mark(config.store.as_ref()));
    let key_claim = claim(config, store_key, fingerprint);
    let checked =
        authenticated::claim(config, store_key, fingerprint, key_claim, authenticator).await;
    let (claim, held) = match checked {
        Checked::Claim { claim, held } => (claim, held),
        Checked::Replayed => {
            let replayed = reject(Rejection::ReplayedSignature, Outcome::ReplayedSignature);
            return Err(Box::new(replayed));
        }
    };
    let claim = match (&config.wait, mark) {
        // Only a key in flight is waited on; boxed, so that the wait's state does not set the
        // size of every request's.
        (Some(waiters), Some(mark)) if matches!(claim, Ok(ClaimOutcome::InFlight { .. })) => {
            Box::pin(claim::until_settled(
                config,
                waiters,
                mark,
                store_key,
                fingerprint,
                claim,
            ))
            .await
        }
        _ => claim,
    };
    Ok((claim, held))
}

/// The answer when the store failed to claim: the handler unguarded with fail-open, else `503`.
async fn store_failed<S, ReqBody, ResBody>(
    config: &Config,
    error: String,
    inner: S,
    request: Request<ReqBody>,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    if config.fail_open {
        tracing::warn!(%error, "idempotency store failed; running the handler UNGUARDED (fail-open is enabled)");
        return Box::pin(pass_through(inner, request, Outcome::FailedOpen)).await;
    }
    tracing::error!(%error, "idempotency store failed; answering 503");
    let unavailable = Rejection::StoreUnavailable {
        retry_after: config.retry_after,
    };
    Ok(reject(unavailable, Outcome::StoreUnavailable))
}

/// What a request that won its claim carries to its handler's run.
struct Claimed {
    key: String,
    token: FencingToken,
    /// The authenticator's record, settled after the key.
    held: Option<Held>,
    permit: Option<OwnedSemaphorePermit>,
    /// Counts the request for a drain until the tracked run stands for it.
    tracked: TaskTrackerToken,
}

/// Runs the handler of a claimed request and settles its key.
async fn run_claimed<S, ReqBody, ResBody>(
    config: Arc<Config>,
    inner: S,
    request: Request<ReqBody>,
    claimed: Claimed,
    span: Span,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body<Data = Bytes> + Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let Claimed {
        key,
        token,
        held,
        permit,
        tracked,
    } = claimed;
    // Wakes this key's waiters once the key is completed or released.
    let settled = wait::SettledSignal::new(config.wait.as_ref(), &key);
    let tasks = config.tasks.clone();
    // Runs here on the caller's task; if the caller goes away first, the rest is spawned
    // (see `DetachOnDrop`) so the result is recorded either way. Tracked so that a drain
    // waits for it in both cases. Polled here, it runs inside this request's span already;
    // `DetachOnDrop` instruments it with the span when it spawns it.
    // Boxed first, so the wrappers around it move a pointer, not the whole future. One async
    // block that calls the run, not a run built outside it and awaited inside: a future moved
    // into a block is stored twice in its state (captured, and awaited), and moved twice.
    let execute = Box::pin(async move {
        // Only an authenticated request settles a second record; the others clone nothing.
        let settle_after = held.map(|held| (held, config.clone(), key.clone()));
        let answer = if config.transactional {
            // The handler's writes commit with the completion: see `transactional.rs`. Boxed,
            // as the rarer and larger run, so that it does not set the size of the plain one.
            Box::pin(transactional::execute(
                config, inner, request, key, token, permit,
            ))
            .await
        } else {
            settle::execute(config, inner, request, key, token, permit).await
        };
        if let Some((held, config, key)) = settle_after {
            let stored = authenticated::settled_as(answer.as_ref().ok());
            authenticated::settle(&config, held, stored, &key).await;
        }
        drop(settled);
        answer
    });
    let run = tasks.track_future(AssertUnwindSafe(execute).catch_unwind());
    // The tracked handler now stands for this request (it outlives a caller who leaves).
    drop(tracked);
    match DetachOnDrop::new(run, span).await {
        Ok(answer) => answer,
        // A panic outside the handler itself (the handler's own is caught in `execute`):
        // the lease frees the key.
        Err(_panic) => Ok(reject(Rejection::HandlerFailed, Outcome::HandlerFailed)),
    }
}
