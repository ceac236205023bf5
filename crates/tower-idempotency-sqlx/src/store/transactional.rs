//! The transactional mode for the SQL stores: [`IdempotentTx`], the extractor a handler writes
//! through, and the stores' [`TransactionalStore`]
//! implementation.
//!
//! With [`IdempotencyLayer::transactional`](tower_idempotency_core::IdempotencyLayer::transactional)
//! the layer opens a transaction on the store's pool after the claim committed, hands it to the
//! handler as [`IdempotentTx`], and after the handler answered runs the completion (fenced by the
//! claim's token) in that same transaction and commits: the handler's writes and the key's
//! completion land together or not at all.
//!
//! ```no_run
//! use axum::{http::StatusCode, routing::post, Router};
//! use tower_idempotency_core::IdempotencyLayer;
//! use tower_idempotency_sqlx::{sqlx::Postgres, IdempotentTx, PostgresStore};
//!
//! async fn pay(mut tx: IdempotentTx<Postgres>, amount: String) -> Result<StatusCode, StatusCode> {
//!     sqlx::query("INSERT INTO payments (amount) VALUES ($1::bigint)")
//!         .bind(amount)
//!         .execute(&mut *tx)
//!         .await
//!         .map_err(|_| StatusCode::BAD_REQUEST)?;
//!     Ok(StatusCode::CREATED)
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PostgresStore::connect("postgres://app@db/app").await?;
//! store.migrate().await?;
//! let app: Router = Router::new()
//!     .route("/payments", post(pay))
//!     .route_layer(IdempotencyLayer::client_keys(store).transactional());
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! The transaction is taken from the store's pool (not from its lanes), one connection per
//! running handler. On SQLite it starts with `BEGIN IMMEDIATE`: it holds the database's single
//! write lock from its first statement to its commit, so transactional handlers run one at a
//! time and other claims wait for the lock (up to the busy timeout).

use std::{
    fmt,
    ops::{Deref, DerefMut},
    sync::Arc,
    time::Duration,
};

use axum_core::{
    extract::FromRequestParts,
    response::{IntoResponse, Response},
};
use http::{request::Parts, StatusCode};
use sqlx::{Database, Transaction};
use tokio::sync::{Mutex, OwnedMutexGuard};
use tower_idempotency_core::{
    CachedResponse, CommitError, FencingToken, Ownership, Problem, StoreError, StoreTransaction,
    TransactionalStore,
};

use super::{Backend, SqlStore};

type Shared<DB> = Arc<Mutex<Option<Transaction<'static, DB>>>>;

/// The open transaction of one request, as the layer puts it into the request's extensions for
/// [`IdempotentTx`]. Only the layer commits or rolls it back.
pub struct TxHandle<DB: Database>(Shared<DB>);

impl<DB: Database> TxHandle<DB> {
    /// Wraps an open transaction, for a [`TransactionalStore`] of your own whose handlers take
    /// [`IdempotentTx`]: put the handle into the request's extensions in
    /// [`StoreTransaction::attach`] and [`take`](Self::take) it back to complete and commit.
    ///
    /// [`TransactionalStore`]: tower_idempotency_core::TransactionalStore
    pub fn new(transaction: Transaction<'static, DB>) -> Self {
        Self(Arc::new(Mutex::new(Some(transaction))))
    }

    /// Takes the transaction out: `None` while a handler's [`IdempotentTx`] holds it, or once it
    /// was taken.
    pub fn take(&self) -> Option<Transaction<'static, DB>> {
        self.0.try_lock().ok()?.take()
    }

    /// The transaction as an [`IdempotentTx`], for a handler that runs outside an HTTP request
    /// (the webhook inbox's worker): `None` while another `IdempotentTx` holds it, or once it was
    /// taken. [`take`](Self::take) answers `None` until the returned value is dropped.
    pub fn lock(&self) -> Option<IdempotentTx<DB>> {
        let guard = self.0.clone().try_lock_owned().ok()?;
        guard.is_some().then_some(IdempotentTx { guard })
    }
}

impl<DB: Database> Clone for TxHandle<DB> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<DB: Database> fmt::Debug for TxHandle<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxHandle")
            .field("database", &DB::NAME)
            .finish_non_exhaustive()
    }
}

/// The request's transaction in the transactional mode: an extractor that derefs to the
/// database connection (`&mut *tx` is an executor), so the handler's statements run inside the
/// transaction the layer commits together with the key's completion.
///
/// Do not `COMMIT` or `ROLLBACK` through it: the layer does, after the handler answered. Keep it
/// no longer than the handler runs (the layer waits for it before it can commit).
///
/// Extracting it on a route without a transactional layer, on a store of another database, or
/// twice in one request is refused with a `500` problem ([`TxRejection`]) before the handler's
/// body runs; the layer then releases the key.
pub struct IdempotentTx<DB: Database> {
    guard: OwnedMutexGuard<Option<Transaction<'static, DB>>>,
}

impl<DB: Database> fmt::Debug for IdempotentTx<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentTx")
            .field("database", &DB::NAME)
            .finish_non_exhaustive()
    }
}

// The transaction is present: extraction checks it, and only the layer takes it, after locking
// the mutex this guard holds.
const PRESENT: &str = "IdempotentTx holds the lock of a present transaction";

impl<DB: Database> Deref for IdempotentTx<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.guard.as_ref().expect(PRESENT)
    }
}

impl<DB: Database> DerefMut for IdempotentTx<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.guard.as_mut().expect(PRESENT)
    }
}

impl<DB: Database, S: Send + Sync> FromRequestParts<S> for IdempotentTx<DB> {
    type Rejection = TxRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, TxRejection> {
        let handle = parts
            .extensions
            .get::<TxHandle<DB>>()
            .ok_or(TxRejection::NotTransactional { database: DB::NAME })?;
        let guard = handle
            .0
            .clone()
            .try_lock_owned()
            .map_err(|_| TxRejection::AlreadyTaken)?;
        if guard.is_none() {
            return Err(TxRejection::Finished);
        }
        Ok(Self { guard })
    }
}

/// Why [`IdempotentTx`] could not be extracted: a misconfigured route, never a client's fault.
/// Answered as a `500` `application/problem+json` with the type
/// `urn:tower-idempotency:problem:transaction-unavailable`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxRejection {
    /// No transaction of this database in the request: the route's `IdempotencyLayer` is not
    /// `.transactional()`, its store is another database, or the request bypassed the layer
    /// (e.g. an optional key that was absent).
    #[error("misconfigured route: the handler takes IdempotentTx<{database}>, but no transactional IdempotencyLayer on a {database} store guards this request (add .transactional() to the layer)")]
    NotTransactional {
        /// The database the handler asked for (`sqlx::Database::NAME`).
        database: &'static str,
    },
    /// The request's transaction is already held by another `IdempotentTx` of this request.
    #[error("misconfigured handler: IdempotentTx is extracted twice in one request")]
    AlreadyTaken,
    /// The request's transaction was already committed or rolled back.
    #[error("misconfigured handler: the request's transaction is already finished")]
    Finished,
}

impl From<TxRejection> for Problem {
    fn from(rejection: TxRejection) -> Self {
        Problem {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            slug: "transaction-unavailable",
            title: "Transaction unavailable",
            detail: rejection.to_string().into(),
            retry_after: None,
        }
    }
}

impl IntoResponse for TxRejection {
    fn into_response(self) -> Response {
        Problem::from(self).into_response()
    }
}

/// Why a transaction could not be used; carried inside a [`StoreError`].
#[derive(Debug, thiserror::Error)]
enum TransactionState {
    #[error("the handler still holds its transaction (an IdempotentTx kept past the handler)")]
    InUse,
    #[error("the transaction was already finished")]
    Finished,
}

fn map_error(error: sqlx::Error) -> StoreError {
    super::error::map_error(error, None, crate::DEFAULT_MAX_RECORD_BYTES)
}

/// Whether a failed `COMMIT` lost its connection, so that the server may have committed.
fn connection_lost(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| code.starts_with("08") || code.starts_with("57P")),
        _ => false,
    }
}

#[async_trait::async_trait]
impl<DB: Backend> TransactionalStore for SqlStore<DB> {
    async fn begin<'s>(
        &'s self,
        key: &str,
        token: FencingToken,
    ) -> Result<Box<dyn StoreTransaction + 's>, StoreError> {
        let transaction = self.pool().begin_with(DB::BEGIN).await.map_err(map_error)?;
        Ok(Box::new(SqlTransaction {
            store: self,
            handle: TxHandle::new(transaction),
            key: key.to_owned(),
            token,
        }))
    }
}

struct SqlTransaction<'s, DB: Backend> {
    store: &'s SqlStore<DB>,
    handle: TxHandle<DB>,
    key: String,
    token: FencingToken,
}

impl<DB: Backend> SqlTransaction<'_, DB> {
    fn take(&self) -> Result<Transaction<'static, DB>, StoreError> {
        let mut guard = self
            .handle
            .0
            .try_lock()
            .map_err(|_| StoreError::Backend(Box::new(TransactionState::InUse)))?;
        guard
            .take()
            .ok_or_else(|| StoreError::Backend(Box::new(TransactionState::Finished)))
    }
}

#[async_trait::async_trait]
impl<DB: Backend> StoreTransaction for SqlTransaction<'_, DB> {
    fn attach(&self, extensions: &mut http::Extensions) {
        extensions.insert(self.handle.clone());
    }

    fn holds_key_exclusively(&self) -> bool {
        DB::EXCLUSIVE
    }

    async fn commit_with(
        self: Box<Self>,
        response: &CachedResponse,
        ttl: Duration,
    ) -> Result<Ownership, CommitError> {
        let mut transaction = self.take().map_err(CommitError::NotCommitted)?;
        // A failed completion drops the transaction, which rolls it back.
        let completed = self
            .store
            .complete_in(&mut transaction, &self.key, self.token, response, ttl)
            .await;
        let ownership = match completed {
            // Complete the key without the body inside the same transaction, as the plain mode
            // does. The store's own limit refuses before any statement runs, and a statement
            // SQLite refuses leaves its transaction usable; a record the Postgres server refuses
            // aborts the transaction, so the second completion fails and nothing commits.
            Err(StoreError::RecordTooLarge { size, limit }) if !response.body_omitted => {
                tracing::warn!(
                    size,
                    limit,
                    "the response is larger than the store accepts; completing the key without its body"
                );
                let without_body = CachedResponse {
                    status: response.status,
                    headers: response.headers.clone(),
                    body: bytes::Bytes::new(),
                    body_omitted: true,
                };
                self.store
                    .complete_in(&mut transaction, &self.key, self.token, &without_body, ttl)
                    .await
            }
            other => other,
        }
        .map_err(CommitError::NotCommitted)?;
        if ownership == Ownership::Stale {
            if let Err(error) = transaction.rollback().await {
                tracing::warn!(error = %map_error(error), "rolling back a stale holder's transaction failed; the database drops it with the connection");
            }
            return Ok(Ownership::Stale);
        }
        match transaction.commit().await {
            Ok(()) => Ok(Ownership::Current),
            Err(error) if connection_lost(&error) => {
                Err(CommitError::OutcomeUnknown(map_error(error)))
            }
            Err(error) => Err(CommitError::NotCommitted(map_error(error))),
        }
    }

    async fn rollback(self: Box<Self>) -> Result<(), StoreError> {
        match self.take() {
            Ok(transaction) => transaction.rollback().await.map_err(map_error),
            // Still held by the handler (or already finished): dropped with its last holder,
            // which rolls it back.
            Err(_) => Ok(()),
        }
    }
}
