//! Run a function once per key without HTTP: a queue consumer (Kafka, SQS, NATS) hands each
//! message's key to [`RunOnce::run`], the first delivery runs the work, and every duplicate gets
//! the first result back.
//!
//! [`RunOnce`] drives an [`IdempotencyLayer`] over an in-process request, so a key has exactly
//! the layer's semantics on every [`Store`]: one atomic claim, a lease renewed while the work
//! runs, a duplicate that finds the key in flight answered at once or made to wait
//! ([`RunOnce::wait_for_result`]), the result kept for the TTL, a reused key with other input
//! refused, work that fails releasing the key for the next delivery, and work that outlives its
//! caller finishing on a task of its own.
//!
//! ```
//! use tower_idempotency_core::{MemoryStore, RunOnce};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let once = RunOnce::new(MemoryStore::new()).namespace("payments");
//! for message in ["pay:7", "pay:7"] {
//!     let ran = once
//!         .run(message, move || async move {
//!             Ok::<_, std::io::Error>(format!("charged {message}"))
//!         })
//!         .await?;
//!     println!("{} (replayed: {})", ran.value, ran.is_replay());
//! }
//! # Ok(())
//! # }
//! ```

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{header::RETRY_AFTER, request::Parts, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde::{de::DeserializeOwned, Serialize};
use tower_layer::Layer;
use tower_service::Service;

use crate::{problem::Problem, IdempotencyLayer, KeySource, Outcome, Store};

/// Runs work once per key over a [`Store`], returning the stored result to duplicates.
///
/// Cheap to clone: clones share the layer's configuration, store and shutdown handle.
#[derive(Clone, Debug)]
pub struct RunOnce {
    layer: IdempotencyLayer,
}

/// A result of [`RunOnce::run`]: the work's value and whether this call ran it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ran<T> {
    /// The value the work returned, or the stored value of the run that completed the key.
    pub value: T,
    /// [`Outcome::Executed`]: this call ran the work and stored its result;
    /// [`Outcome::Replayed`]: an earlier call did, this is its stored result;
    /// [`Outcome::ExecutedUnrecorded`]: this call ran the work, but storing the result failed,
    /// so the key stays in flight until its lease ends and a later delivery runs it again.
    pub outcome: Outcome,
}

impl<T> Ran<T> {
    /// Whether the value is an earlier run's stored result.
    pub fn is_replay(&self) -> bool {
        self.outcome == Outcome::Replayed
    }
}

/// Why [`RunOnce::run`] returned no value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OnceError<E> {
    /// The work ran and returned this error; the key was released, so the next delivery runs
    /// it again.
    #[error("the work failed")]
    Failed(#[source] E),
    /// The work panicked; the key was released.
    #[error("the work panicked")]
    Panicked,
    /// Another caller holds the key and has not finished (or did not within the wait).
    #[error("another caller is running this key")]
    InFlight {
        /// How long until the holder's lease ends, as the layer would say in `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// The key completed earlier for different input.
    #[error("the key was used before with different input")]
    InputMismatch,
    /// The store failed or timed out; the work did not run.
    #[error("the store is unavailable")]
    StoreUnavailable,
    /// The in-flight bound was reached, or the [`RunOnce`] is draining; the work did not run.
    #[error("overloaded or shutting down")]
    Overloaded,
    /// The input could not be serialized, or is larger than
    /// [`max_input_bytes`](RunOnce::max_input_bytes); the work did not run.
    #[error("the input could not be fingerprinted")]
    Input(#[source] Option<serde_json::Error>),
    /// The stored result could not be read back as `T` (another type was stored under the key,
    /// or the result was larger than [`max_result_bytes`](RunOnce::max_result_bytes) and was
    /// kept without its body).
    #[error("the stored result could not be read back")]
    Result(#[source] Option<serde_json::Error>),
}

/// The key of one call, handed from [`RunOnce::run`] to the layer through the request's
/// extensions.
#[derive(Clone)]
struct CallKey(Arc<str>);

/// Reads [`CallKey`]: any string, however long (the layer hashes it into the scoped key).
struct ExtensionKey;

impl KeySource for ExtensionKey {
    fn derive(&self, parts: &mut Parts, _body: &Bytes) -> Result<Option<String>, Problem> {
        Ok(parts
            .extensions
            .get::<CallKey>()
            .map(|key| key.0.to_string()))
    }
}

/// A value moved out of the inner service's response through its extensions (which must be
/// `Clone`): the layer hands the fresh response back, and [`RunOnce::run`] takes the value.
struct Slot<T>(Arc<Mutex<Option<T>>>);

impl<T> Clone for Slot<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> Slot<T> {
    fn new(value: T) -> Self {
        Self(Arc::new(Mutex::new(Some(value))))
    }

    fn take(&self) -> Option<T> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The work's answer as the inner service gives it to the layer: `200` with the serialized
/// value (the layer stores it), or `500` (the layer releases the key) with the error.
type WorkResponse = Response<Full<Bytes>>;

/// The inner service of one call: runs the work on the first `call` (the layer calls it at most
/// once, only after it claimed the key).
struct Work<F>(Arc<Mutex<Option<F>>>);

impl<F> Clone for Work<F> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<F, Fut, T, E> Service<Request<axum::body::Body>> for Work<F>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: Serialize + Send + 'static,
    E: Send + 'static,
{
    type Response = WorkResponse;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<WorkResponse, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Request<axum::body::Body>) -> Self::Future {
        let work = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        Box::pin(async move {
            let work = work.expect("the layer runs the work at most once per call");
            Ok(match work().await {
                Ok(value) => match serde_json::to_vec(&value) {
                    Ok(json) => {
                        let mut response = Response::new(Full::new(Bytes::from(json)));
                        response.extensions_mut().insert(Slot::new(value));
                        response
                    }
                    Err(error) => failed(ResultError(error)),
                },
                Err(error) => failed(WorkError(error)),
            })
        })
    }
}

/// The work's error, carried back in a `500`'s extensions.
struct WorkError<E>(E);

/// The work's value could not be serialized: carried back in a `500`'s extensions.
struct ResultError(serde_json::Error);

/// A `500` carrying `error`: the layer's default cache policy releases the key.
fn failed(error: impl Send + 'static) -> WorkResponse {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response.extensions_mut().insert(Slot::new(error));
    response
}

impl RunOnce {
    /// Runs work once per key over `store`, in namespace `once`, with the layer's defaults (lease
    /// [`DEFAULT_LEASE`](crate::DEFAULT_LEASE) renewed while the work runs, results kept for
    /// [`DEFAULT_TTL`](crate::DEFAULT_TTL), duplicates in flight answered at once).
    pub fn new(store: impl Store) -> Self {
        Self {
            layer: IdempotencyLayer::new(ExtensionKey, store).namespace("once"),
        }
    }

    fn with(self, change: impl FnOnce(IdempotencyLayer) -> IdempotencyLayer) -> Self {
        Self {
            layer: change(self.layer),
        }
    }

    /// Keys of different namespaces never share a record (one per kind of work).
    ///
    /// # Panics
    ///
    /// As [`IdempotencyLayer::namespace`], on a namespace that is not 1 to 64 ASCII
    /// alphanumerics, `-`, `_` or `.`.
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        self.with(|layer| layer.namespace(namespace))
    }

    /// How long a caller holds a key before another may take it over if the caller stops
    /// renewing it (a crash); renewed every third of it while the work runs
    /// ([`IdempotencyLayer::lease`]).
    pub fn lease(self, lease: Duration) -> Self {
        self.with(|layer| layer.lease(lease))
    }

    /// How long the lease is renewed at most ([`IdempotencyLayer::max_lease_renewal`]).
    pub fn max_lease_renewal(self, ceiling: Duration) -> Self {
        self.with(|layer| layer.max_lease_renewal(ceiling))
    }

    /// How long a result is kept and returned to duplicates ([`IdempotencyLayer::ttl`]).
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|layer| layer.ttl(ttl))
    }

    /// How long one store call may take ([`IdempotencyLayer::store_timeout`]).
    pub fn store_timeout(self, timeout: Duration) -> Self {
        self.with(|layer| layer.store_timeout(timeout))
    }

    /// A duplicate that finds the key in flight waits up to `max_wait` for the first caller's
    /// result instead of getting [`OnceError::InFlight`] at once
    /// ([`IdempotencyLayer::wait_for_result`]).
    pub fn wait_for_result(self, max_wait: Duration) -> Self {
        self.with(|layer| layer.wait_for_result(max_wait))
    }

    /// The largest serialized input [`run_with_input`](Self::run_with_input) accepts
    /// ([`IdempotencyLayer::max_body_bytes`]; 1 MiB by default).
    pub fn max_input_bytes(self, limit: usize) -> Self {
        self.with(|layer| layer.max_body_bytes(limit))
    }

    /// The largest serialized result that is stored for duplicates
    /// ([`IdempotencyLayer::max_cached_body_bytes`]; 1 MiB by default). A larger one completes
    /// the key without its value, and duplicates get [`OnceError::Result`].
    pub fn max_result_bytes(self, limit: usize) -> Self {
        self.with(|layer| layer.max_cached_body_bytes(limit))
    }

    /// A handle to drain running work on shutdown ([`IdempotencyLayer::shutdown_handle`]).
    pub fn shutdown_handle(&self) -> crate::ShutdownHandle {
        self.layer.shutdown_handle()
    }

    /// Runs `work` once for `key`: the first call runs it and stores its serialized value,
    /// every later call with the same key (in this process or any other on the same store)
    /// gets the stored value back until the TTL ends. An error from `work` releases the key.
    pub async fn run<T, E, F, Fut>(&self, key: &str, work: F) -> Result<Ran<T>, OnceError<E>>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: Send + 'static,
    {
        self.call(key, Bytes::new(), work).await
    }

    /// As [`run`](Self::run), and fingerprints `input` (its JSON serialization): a later call
    /// with the same key and different input gets [`OnceError::InputMismatch`] instead of the
    /// stored result.
    pub async fn run_with_input<I, T, E, F, Fut>(
        &self,
        key: &str,
        input: &I,
        work: F,
    ) -> Result<Ran<T>, OnceError<E>>
    where
        I: Serialize + ?Sized,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: Send + 'static,
    {
        let input = serde_json::to_vec(input).map_err(|e| OnceError::Input(Some(e)))?;
        self.call(key, Bytes::from(input), work).await
    }

    async fn call<T, E, F, Fut>(
        &self,
        key: &str,
        input: Bytes,
        work: F,
    ) -> Result<Ran<T>, OnceError<E>>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: Send + 'static,
    {
        let mut service = self.layer.layer(Work(Arc::new(Mutex::new(Some(work)))));
        let mut request = Request::post("/")
            .body(Full::new(input))
            .expect("a valid request");
        request.extensions_mut().insert(CallKey(key.into()));
        let response = match service.call(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let outcome = response.extensions().get::<Outcome>().copied();
        let taken =
            |response: &Response<_>| response.extensions().get::<Slot<T>>().and_then(Slot::take);
        match outcome {
            Some(outcome @ (Outcome::Executed | Outcome::ExecutedUnrecorded)) => {
                match taken(&response) {
                    Some(value) => Ok(Ran { value, outcome }),
                    None => Err(OnceError::Result(None)),
                }
            }
            Some(Outcome::Replayed) => {
                let body = response
                    .into_body()
                    .collect()
                    .await
                    .map_err(|_| OnceError::Result(None))?
                    .to_bytes();
                let value =
                    serde_json::from_slice(&body).map_err(|e| OnceError::Result(Some(e)))?;
                Ok(Ran {
                    value,
                    outcome: Outcome::Replayed,
                })
            }
            Some(Outcome::ExecutedReleased) => {
                let extensions = response.extensions();
                if let Some(error) = extensions.get::<Slot<WorkError<E>>>().and_then(Slot::take) {
                    Err(OnceError::Failed(error.0))
                } else if let Some(error) =
                    extensions.get::<Slot<ResultError>>().and_then(Slot::take)
                {
                    Err(OnceError::Result(Some(error.0)))
                } else {
                    Err(OnceError::Panicked)
                }
            }
            Some(Outcome::InFlight) => Err(OnceError::InFlight {
                retry_after: response
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .map(Duration::from_secs),
            }),
            Some(Outcome::Mismatch) => Err(OnceError::InputMismatch),
            Some(Outcome::Rejected) => Err(OnceError::Input(None)),
            Some(Outcome::Overloaded) => Err(OnceError::Overloaded),
            Some(Outcome::HandlerFailed) => Err(OnceError::Panicked),
            _ => Err(OnceError::StoreUnavailable),
        }
    }
}
