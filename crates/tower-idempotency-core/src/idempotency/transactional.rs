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
//! | … larger than the store accepts | completion without the body inside it, then `COMMIT` | completed; replays carry `Idempotent-Body-Omitted` |
//! | … but the claim's token is no longer current | rolled back, `409 lease-lost` | the other holder's |
//! | … but the completion or `COMMIT` fails | rolled back, `503 commit-failed` | released |
//! | … but the connection dies during `COMMIT` | unknown, `503 commit-outcome-unknown` | released if the commit did not land |
//! | answers a response the policy releases | rolled back | released |
//! | fails, panics, or its body fails | rolled back | released |
//! | never finishes (crash, dropped task) | rolled back by the database | claimable after the lease |

use std::{panic::AssertUnwindSafe, pin::pin, sync::Arc};

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
    settle::{produce, release, Produced},
    ResponseBody,
};
use crate::{
    outcome::Outcome,
    problem::Rejection,
    store::{BoxError, CachedResponse, CommitError, FencingToken, Ownership, StoreTransaction},
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
    let transaction = match open(&config, &key, token).await {
        Some(transaction) => transaction,
        None => {
            release(&config, &key, token).await;
            let unavailable = Rejection::StoreUnavailable {
                retry_after: config.retry_after,
            };
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
        renewing_lease(&config, &key, token, Instant::now(), pin!(work))
            .await
            .0
    };
    let failed = match produced {
        Ok(Produced::Complete(response, cached)) => {
            return commit(&config, transaction, &key, token, response, &cached).await;
        }
        Ok(Produced::Release(response)) => Failed::Released(response),
        Ok(Produced::Error(error)) => Failed::Error(error),
        Ok(Produced::BodyFailed) => {
            tracing::error!("the handler's response body failed; its writes were rolled back and the key released");
            Failed::Rejected
        }
        Err(_panic) => {
            tracing::error!(
                "the handler panicked; its writes were rolled back and the key released"
            );
            Failed::Rejected
        }
    };
    roll_back(&config, transaction).await;
    release(&config, &key, token).await;
    match failed {
        Failed::Released(response) => Ok(with_outcome(response, Outcome::ExecutedReleased)),
        Failed::Error(error) => {
            Span::current().record("outcome", Outcome::HandlerFailed.as_str());
            Err(error)
        }
        Failed::Rejected => Ok(reject(Rejection::HandlerFailed, Outcome::HandlerFailed)),
    }
}

/// A handler's result that rolls its transaction back and releases the key.
enum Failed<R, E> {
    /// The cache policy releases the response: answer it.
    Released(R),
    /// The inner service failed: pass the error on.
    Error(E),
    /// The handler panicked or its response body failed: answer `500`.
    Rejected,
}

/// Opens the handler's transaction, fenced by the claim's token; `None` (logged) when the store
/// has none or it failed to open in time.
async fn open<'c>(
    config: &'c Config,
    key: &str,
    token: FencingToken,
) -> Option<Box<dyn StoreTransaction + 'c>> {
    // `try_transactional` only switches the mode on for a store that has transactions.
    let Some(transactions) = config.store.transactions() else {
        tracing::error!("the transactional mode is on but the store has no transactions");
        return None;
    };
    let begun = within(
        config.store_timeout(),
        metrics::timed(config, "begin", transactions.begin(key, token)),
    )
    .await;
    let error = match begun {
        Some(Ok(transaction)) => return Some(transaction),
        Some(Err(error)) => error.to_string(),
        None => format!("timed out after {:?}", config.store_timeout()),
    };
    tracing::error!(%error, "opening the handler's transaction failed; key released, answering 503");
    None
}

/// Commits the handler's writes with the key's completion and answers by what the commit did.
async fn commit<B, E>(
    config: &Config,
    transaction: Box<dyn StoreTransaction + '_>,
    key: &str,
    token: FencingToken,
    response: Response<ResponseBody<B>>,
    cached: &CachedResponse,
) -> Answer<B, E> {
    let retry_after = config.retry_after;
    let committed = within(
        config.store_timeout(),
        metrics::timed(
            config,
            "commit",
            transaction.commit_with(cached, config.ttl),
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
            release(config, key, token).await;
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
            release(config, key, token).await;
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
