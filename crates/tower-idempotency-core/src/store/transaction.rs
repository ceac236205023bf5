//! The optional capability behind the layer's transactional mode
//! ([`IdempotencyLayer::transactional`](crate::IdempotencyLayer::transactional)): the handler's
//! database writes and the key's completion commit in one transaction.

use std::time::Duration;

use super::{CachedResponse, FencingToken, Ownership, StoreError};

/// A store whose records live in a database that can run the handler's writes and the key's
/// completion in one transaction.
///
/// A store that can offer it (the SQL stores of `tower-idempotency-sqlx`) returns itself from
/// [`Store::transactions`](super::Store::transactions). For each claimed request the layer then:
///
/// 1. calls [`TransactionalStore::begin`] after the claim committed, and hands the transaction to
///    the handler through the request's extensions ([`StoreTransaction::attach`]);
/// 2. runs the handler, which writes through that transaction;
/// 3. for a response the cache policy keeps, calls [`StoreTransaction::commit_with`]: the
///    completion, fenced by the claim's token, runs **inside** the transaction, then it commits.
///    A stale token rolls everything back;
/// 4. for anything else (a response the policy releases, an error, a panic) calls
///    [`StoreTransaction::rollback`] and releases the key.
///
/// Dropping a [`StoreTransaction`] unfinished (a crash, a cancelled task) must roll it back.
#[async_trait::async_trait]
pub trait TransactionalStore: Send + Sync {
    /// Opens a transaction for the holder of `key` with `token` (the claim is already
    /// committed). The transaction must not touch the idempotency record before
    /// [`StoreTransaction::commit_with`], so duplicates keep reading the claim without waiting
    /// on its row.
    async fn begin<'s>(
        &'s self,
        key: &str,
        token: FencingToken,
    ) -> Result<Box<dyn StoreTransaction + 's>, StoreError>;
}

/// One open transaction of a [`TransactionalStore`], owned by the layer for one request.
#[async_trait::async_trait]
pub trait StoreTransaction: Send {
    /// Inserts into the request's extensions the handle the handler's extractor takes (for the
    /// SQL stores, what `tower_idempotency_sqlx::IdempotentTx` reads).
    fn attach(&self, extensions: &mut http::Extensions);

    /// Whether the open transaction by itself keeps every other claimer of the key out, so the
    /// lease needs no renewal while it is open. True for SQLite, whose transaction holds the
    /// database's single write lock from its start (a claim is a write); false by default.
    fn holds_key_exclusively(&self) -> bool {
        false
    }

    /// Writes the completion (`response`, kept for `ttl`) inside the transaction, fenced by the
    /// claim's token, and commits. When the token is no longer current, rolls back and answers
    /// [`Ownership::Stale`]: none of the handler's writes land. A `response` larger than the
    /// store accepts is completed without its body (`body_omitted`, replays carry
    /// [`BODY_OMITTED_HEADER`](crate::BODY_OMITTED_HEADER)) inside the same transaction, as
    /// [`Store::complete`](super::Store::complete) callers do in the plain mode.
    async fn commit_with(
        self: Box<Self>,
        response: &CachedResponse,
        ttl: Duration,
    ) -> Result<Ownership, CommitError>;

    /// Rolls the transaction back. Dropping it unfinished must have the same effect.
    async fn rollback(self: Box<Self>) -> Result<(), StoreError>;
}

/// Why [`StoreTransaction::commit_with`] did not commit, or cannot say whether it did.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// Nothing was committed: the completion or the `COMMIT` failed with an answer from the
    /// database, or the transaction was still in use. The key stays claimed by this holder.
    #[error("the transaction was not committed")]
    NotCommitted(#[source] StoreError),
    /// The connection failed during `COMMIT`: the transaction may or may not have committed.
    /// The next claim of the key reads the truth from the table.
    #[error("the outcome of the commit is unknown")]
    OutcomeUnknown(#[source] StoreError),
}
