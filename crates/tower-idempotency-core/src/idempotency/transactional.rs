//! The transactional mode ([`IdempotencyLayer::transactional`](super::IdempotencyLayer::transactional)):
//! the handler runs inside a transaction of the store, and its writes commit together with the
//! key's completion, fenced by the claim's token.
//!
//! The claim is committed before the transaction opens, so duplicates see the key in flight and
//! never wait on a lock the handler holds. What happens to the transaction:
//!
//! | the handler | the transaction | the key |
//! |---|---|---|
//! | answers a response the cache policy keeps | completion inside it, then `COMMIT` | completed, by the commit |
//! | … but the claim's token is no longer current | rolled back, `409 lease-lost` | the other holder's |
//! | … but the completion or `COMMIT` fails | rolled back, `503 commit-failed` | released |
//! | … but the connection dies during `COMMIT` | unknown, `503 commit-outcome-unknown` | released if the commit did not land |
//! | answers a response the policy releases | rolled back | released |
//! | fails, panics, or its body fails | rolled back | released |
//! | never finishes (crash, dropped task) | rolled back by the database | claimable after the lease |

use std::{panic::AssertUnwindSafe, sync::Arc};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{Request, Response};
use http_body::Body;
use tokio::{sync::OwnedSemaphorePermit, time::Instant};
use tower_service::Service;
use tracing::Span;

use super::{
    claim::within,
    layer::Config,
    lease::renewing_lease,
    metrics,
    service::{reject, with_outcome, Answer},
    settle::{produce, release, Produced},
};
use crate::{
    outcome::Outcome,
    problem::Rejection,
    store::{BoxError, CommitError, FencingToken, Ownership, StoreTransaction},
};

/// Why [`IdempotencyLayer::try_transactional`](super::IdempotencyLayer::try_transactional)
/// refused to switch the transactional mode on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransactionalError {
    /// The layer's store has no transactions (`Store::transactions` is `None`): only the SQL
    /// stores (`SqliteStore`, `PostgresStore`) can commit the handler's writes with the key.
    #[error("the store has no transactions; use SqliteStore or PostgresStore for the transactional mode")]
    Unsupported,
}

/// Runs a claimed request's handler inside a transaction of the store; see the module docs.
pub(super) async fn execute<S, ReqBody, ResBody>(
    config: Arc<Config>,
    inner: S,
    mut request: Request<ReqBody>,
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
    let unavailable = Rejection::StoreUnavailable {
        retry_after: config.retry_after,
    };
    // `try_transactional` only switches the mode on for a store that has transactions.
    let Some(transactions) = config.store.transactions() else {
        tracing::error!("the transactional mode is on but the store has no transactions");
        release(&config, &key, token).await;
        return Ok(reject(unavailable, Outcome::StoreUnavailable));
    };
    let transaction = match within(
        config.store_timeout(),
        metrics::timed(&config, "begin", transactions.begin(&key, token)),
    )
    .await
    {
        Some(Ok(transaction)) => transaction,
        failed => {
            let error = match failed {
                Some(Err(error)) => error.to_string(),
                _ => format!("timed out after {:?}", config.store_timeout()),
            };
            tracing::error!(%error, "opening the handler's transaction failed; key released, answering 503");
            release(&config, &key, token).await;
            return Ok(reject(unavailable, Outcome::StoreUnavailable));
        }
    };
    transaction.attach(request.extensions_mut());

    let work = AssertUnwindSafe(produce(&config, inner, request)).catch_unwind();
    let produced = if transaction.holds_key_exclusively() {
        // Nobody can claim the key while the transaction is open; a renewal would only wait for
        // the transaction's own lock.
        work.await
    } else {
        renewing_lease(&config, &key, token, Instant::now(), work)
            .await
            .0
    };

    let (response, cached) = match produced {
        Ok(Produced::Complete(response, cached)) => (response, cached),
        Ok(Produced::Release(response)) => {
            roll_back(&config, transaction).await;
            release(&config, &key, token).await;
            return Ok(with_outcome(response, Outcome::ExecutedReleased));
        }
        Ok(Produced::Error(error)) => {
            roll_back(&config, transaction).await;
            release(&config, &key, token).await;
            Span::current().record("outcome", Outcome::HandlerFailed.as_str());
            return Err(error);
        }
        Ok(Produced::BodyFailed) => {
            tracing::error!("the handler's response body failed; its writes were rolled back and the key released");
            roll_back(&config, transaction).await;
            release(&config, &key, token).await;
            return Ok(reject(Rejection::HandlerFailed, Outcome::HandlerFailed));
        }
        Err(_panic) => {
            tracing::error!(
                "the handler panicked; its writes were rolled back and the key released"
            );
            roll_back(&config, transaction).await;
            release(&config, &key, token).await;
            return Ok(reject(Rejection::HandlerFailed, Outcome::HandlerFailed));
        }
    };

    let retry_after = config.retry_after;
    let committed = within(
        config.store_timeout(),
        metrics::timed(
            &config,
            "commit",
            transaction.commit_with(&cached, config.ttl),
        ),
    )
    .await;
    match committed {
        Some(Ok(Ownership::Current)) => Ok(with_outcome(response, Outcome::Executed)),
        Some(Ok(Ownership::Stale)) => {
            tracing::warn!("lease lost before the commit; the handler's writes were rolled back");
            Ok(reject(
                Rejection::LeaseLost { retry_after },
                Outcome::RolledBack,
            ))
        }
        Some(Err(CommitError::NotCommitted(error))) => {
            tracing::error!(%error, "the handler's transaction was not committed; nothing was written, key released");
            release(&config, &key, token).await;
            Ok(reject(
                Rejection::CommitFailed { retry_after },
                Outcome::RolledBack,
            ))
        }
        unknown => {
            let error = match unknown {
                Some(Err(error)) => error.to_string(),
                _ => format!("timed out after {:?}", config.store_timeout()),
            };
            tracing::error!(%error, "the outcome of the handler's commit is unknown; the next claim of the key reads it from the store");
            // Safe either way: a release is fenced to the in-flight record of this token, which a
            // commit that landed has completed.
            release(&config, &key, token).await;
            Ok(reject(
                Rejection::CommitOutcomeUnknown { retry_after },
                Outcome::CommitUnknown,
            ))
        }
    }
}

async fn roll_back(config: &Config, transaction: Box<dyn StoreTransaction + '_>) {
    match within(
        config.store_timeout(),
        metrics::timed(config, "rollback", transaction.rollback()),
    )
    .await
    {
        Some(Ok(())) => {}
        // The transaction is gone with its connection either way: a database rolls back what a
        // lost connection left open.
        Some(Err(error)) => tracing::warn!(%error, "rolling back the handler's transaction failed"),
        None => tracing::warn!("rolling back the handler's transaction timed out"),
    }
}
