//! The transactional consumer: the work's writes and the key's completion in one database
//! transaction (features `sqlite`, `postgres`).
//!
//! It drives an [`IdempotencyLayer`] in its transactional mode over an in-process request, as
//! the core's `RunOnce` drives one in its plain mode: the layer claims the key, opens the
//! transaction, the work writes through the [`IdempotentTx`] it is handed, and the layer commits
//! the writes with the key's completion (fenced by the claim's token), or rolls them back.

use std::{
    convert::Infallible,
    future::Future,
    marker::PhantomData,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{header::RETRY_AFTER, request::Parts, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde::{de::DeserializeOwned, Serialize};
use tower_idempotency_core::{
    IdempotencyLayer, KeySource, OnceError, Outcome, Problem, Ran, TransactionalError,
};
use tower_idempotency_sqlx::{Backend, IdempotentTx, SqlStore, TxHandle};
use tower_layer::Layer;
use tower_service::Service;

use crate::{fingerprint, no_key, BrokerDelivery, Failure, Handled, KeyFrom, Rules};

/// Runs each delivery's work once per message id in the transactional mode of a SQL store: the
/// work writes through an [`IdempotentTx`], and its writes commit together with the key's
/// completion before the delivery is acknowledged. A consumer killed before the commit leaves
/// nothing behind (the broker delivers the message again and the work runs then); one killed
/// after it leaves the effect and its record (the redelivery is acknowledged without running
/// the work). The settling rules are [`OnceConsumer`](crate::OnceConsumer)'s.
pub struct TxConsumer<DB: Backend> {
    layer: IdempotencyLayer,
    rules: Rules,
    database: PhantomData<fn() -> DB>,
}

impl<DB: Backend> Clone for TxConsumer<DB> {
    fn clone(&self) -> Self {
        Self {
            layer: self.layer.clone(),
            rules: self.rules,
            database: PhantomData,
        }
    }
}

impl<DB: Backend> std::fmt::Debug for TxConsumer<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxConsumer")
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

impl<DB: Backend> TxConsumer<DB> {
    /// A consumer on `store`'s table and pool, keys in namespace `namespace` (1 to 64 ASCII
    /// alphanumerics, `-`, `_` or `.`; one per kind of work).
    ///
    /// # Errors
    ///
    /// [`TransactionalError`] when the store has no transactions.
    ///
    /// # Panics
    ///
    /// On a namespace that is not valid, as [`IdempotencyLayer::namespace`].
    pub fn new(store: SqlStore<DB>, namespace: &str) -> Result<Self, TransactionalError> {
        let layer = IdempotencyLayer::new(ExtensionKey, store)
            .namespace(namespace)
            .try_transactional()?;
        Ok(Self {
            layer,
            rules: Rules::default(),
            database: PhantomData,
        })
    }

    /// Changes the layer's settings ([`IdempotencyLayer::lease`], [`ttl`](IdempotencyLayer::ttl),
    /// [`wait_for_result`](IdempotencyLayer::wait_for_result), ...).
    pub fn configure(mut self, change: impl FnOnce(IdempotencyLayer) -> IdempotencyLayer) -> Self {
        self.layer = change(self.layer);
        self
    }

    /// What keys a delivery (default [`KeyFrom::MessageId`]).
    pub fn key_from(mut self, key_from: KeyFrom) -> Self {
        self.rules.key_from = key_from;
        self
    }

    /// How long a delivery handed back waits before it is delivered again
    /// ([`OnceConsumer::retry_delay`](crate::OnceConsumer::retry_delay)).
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.rules.retry_delay = Some(delay);
        self
    }

    /// Runs `work` on the delivery's payload inside the transaction, once per key, then settles
    /// the delivery. An error from `work` rolls its writes back.
    pub async fn handle<D, T, E, F, Fut>(&self, delivery: &D, work: F) -> Handled<T, E>
    where
        D: BrokerDelivery,
        F: FnOnce(Bytes, IdempotentTx<DB>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, Failure<E>>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: Send + 'static,
    {
        let Some(key) = self.rules.key(delivery) else {
            return no_key(delivery).await;
        };
        let payload = delivery.payload();
        let input = serde_json::to_vec(&fingerprint(&payload)).expect("a string serializes");
        let result = self.call(&key, Bytes::from(input), payload, work).await;
        self.rules.settle(delivery, key, result).await
    }

    async fn call<T, E, F, Fut>(
        &self,
        key: &str,
        input: Bytes,
        payload: Bytes,
        work: F,
    ) -> Result<Ran<T>, OnceError<Failure<E>>>
    where
        F: FnOnce(Bytes, IdempotentTx<DB>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, Failure<E>>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: Send + 'static,
    {
        let work = TxWork::<DB, F> {
            work: Arc::new(Mutex::new(Some((work, payload)))),
            database: PhantomData,
        };
        let mut service = self.layer.layer(work);
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
                match extensions
                    .get::<Slot<WorkError<Failure<E>>>>()
                    .and_then(Slot::take)
                {
                    Some(WorkError(error)) => Err(OnceError::Failed(error)),
                    None => match extensions.get::<Slot<ResultError>>().and_then(Slot::take) {
                        Some(ResultError(error)) => Err(OnceError::Result(Some(error))),
                        None => Err(OnceError::Panicked),
                    },
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
            // The store failed, or the transaction was rolled back (a lost lease, a failed
            // commit): nothing is recorded, the delivery is retried.
            _ => Err(OnceError::StoreUnavailable),
        }
    }
}

/// The key of one call, handed to the layer through the request's extensions.
#[derive(Clone)]
struct CallKey(Arc<str>);

/// Reads [`CallKey`].
struct ExtensionKey;

impl KeySource for ExtensionKey {
    fn derive(&self, parts: &mut Parts, _body: &Bytes) -> Result<Option<String>, Problem> {
        Ok(parts
            .extensions
            .get::<CallKey>()
            .map(|key| key.0.to_string()))
    }
}

/// A value moved out of the inner service's response through its extensions.
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

/// The work's error, carried back in a `500`'s extensions.
struct WorkError<E>(E);

/// The work's value could not be serialized.
struct ResultError(serde_json::Error);

/// A `500` carrying `error`: the layer releases the key and rolls the transaction back.
fn failed(error: impl Send + 'static) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response.extensions_mut().insert(Slot::new(error));
    response
}

/// The inner service of one call: runs the work with the layer's transaction.
struct TxWork<DB, F> {
    work: Arc<Mutex<Option<(F, Bytes)>>>,
    database: PhantomData<fn() -> DB>,
}

impl<DB, F> Clone for TxWork<DB, F> {
    fn clone(&self) -> Self {
        Self {
            work: self.work.clone(),
            database: PhantomData,
        }
    }
}

impl<DB, F, Fut, T, E> Service<Request<axum::body::Body>> for TxWork<DB, F>
where
    DB: Backend,
    F: FnOnce(Bytes, IdempotentTx<DB>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, Failure<E>>> + Send + 'static,
    T: Serialize + Send + 'static,
    E: Send + 'static,
{
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<axum::body::Body>) -> Self::Future {
        let work = self.work.lock().unwrap_or_else(|p| p.into_inner()).take();
        let tx = request
            .extensions()
            .get::<TxHandle<DB>>()
            .and_then(TxHandle::lock);
        Box::pin(async move {
            let (work, payload) = work.expect("the layer runs the work at most once per call");
            let Some(tx) = tx else {
                // The layer opens a transaction of the store's database for every claimed call.
                return Ok(failed(()));
            };
            Ok(match work(payload, tx).await {
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
