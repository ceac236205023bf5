//! Per-event deduplication inside a batched delivery (SendGrid sends many events per request).
//!
//! The layer deduplicates whole deliveries; when a sender may regroup events across retries,
//! claim each event id through the same [`Store`] before acting on it:
//!
//! ```
//! # tokio_test_block(async {
//! use std::time::Duration;
//! use tower_idempotency_core::MemoryStore;
//! use tower_idempotency_webhooks::batch::{claim_each, complete};
//!
//! let store = MemoryStore::new();
//! let claims = claim_each(&store, "sendgrid-events", ["ev1", "ev2"], Duration::from_secs(60)).await?;
//! for claim in &claims {
//!     if claim.is_new() {
//!         // ... process the event ...
//!         complete(&store, claim, Duration::from_secs(2 * 24 * 3600)).await?;
//!     }
//! }
//! # Ok::<(), tower_idempotency_core::StoreError>(())
//! # });
//! # fn tokio_test_block<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
//! # }
//! ```

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use sha2::{Digest, Sha256};
use tower_idempotency_core::{
    CachedResponse, ClaimOutcome, Fingerprint, Ownership, Store, StoreError,
};

/// One event id and what the store said about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventClaim {
    /// The event id.
    pub id: String,
    /// The scoped key in the store (`<namespace>:<64 hex>`).
    pub key: String,
    /// The store's answer.
    pub outcome: ClaimOutcome,
}

impl EventClaim {
    /// This caller claimed the event and must process it, then [`complete`] (or
    /// [`release`]) it.
    pub fn is_new(&self) -> bool {
        matches!(self.outcome, ClaimOutcome::Claimed { .. })
    }
}

/// The store key of an event id: `<namespace>:` + hex SHA-256 of `event:<id>`, the shape every
/// store accepts (distinct from the layer's request keys, which hash other input).
pub fn event_key(namespace: &str, id: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"event:")
        .chain_update(id.as_bytes())
        .finalize();
    format!("{namespace}:{}", hex::encode(digest))
}

fn fingerprint() -> Fingerprint {
    Fingerprint(Sha256::digest(b"tower-idempotency-webhooks:event").into())
}

/// Claims every id in order. An id repeated within `ids` is answered `InFlight` the second time.
pub async fn claim_each<I, S>(
    store: &(impl Store + ?Sized),
    namespace: &str,
    ids: I,
    lease: Duration,
) -> Result<Vec<EventClaim>, StoreError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut claims = Vec::new();
    for id in ids {
        let id = id.as_ref().to_owned();
        let key = event_key(namespace, &id);
        let outcome = store
            .claim(
                &key,
                &fingerprint(),
                tower_idempotency_core::FencingToken::random().unwrap(),
                lease,
            )
            .await?;
        claims.push(EventClaim { id, key, outcome });
    }
    Ok(claims)
}

/// Marks a claimed event done for `ttl` (an empty `200` record). `Stale` when the claim was
/// not (or is no longer) this caller's.
pub async fn complete(
    store: &(impl Store + ?Sized),
    claim: &EventClaim,
    ttl: Duration,
) -> Result<Ownership, StoreError> {
    let ClaimOutcome::Claimed { token } = claim.outcome else {
        return Ok(Ownership::Stale);
    };
    let response = CachedResponse {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
        body: Bytes::new(),
        body_omitted: false,
    };
    store.complete(&claim.key, token, &response, ttl).await
}

/// Gives a claimed event back (processing failed), so a retry processes it.
pub async fn release(
    store: &(impl Store + ?Sized),
    claim: &EventClaim,
) -> Result<Ownership, StoreError> {
    let ClaimOutcome::Claimed { token } = claim.outcome else {
        return Ok(Ownership::Stale);
    };
    store.release(&claim.key, token).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_idempotency_core::MemoryStore;

    #[tokio::test]
    async fn each_event_is_claimed_once_across_batches() {
        let store = MemoryStore::new();
        let lease = Duration::from_secs(30);
        let ttl = Duration::from_secs(60);
        let first = claim_each(&store, "sg", ["a", "b", "a"], lease)
            .await
            .unwrap();
        assert!(first[0].is_new() && first[1].is_new());
        assert!(matches!(first[2].outcome, ClaimOutcome::InFlight { .. }));
        assert_eq!(
            complete(&store, &first[0], ttl).await.unwrap(),
            Ownership::Current
        );
        assert_eq!(
            release(&store, &first[1]).await.unwrap(),
            Ownership::Current
        );
        assert_eq!(
            complete(&store, &first[2], ttl).await.unwrap(),
            Ownership::Stale
        );
        // A regrouped retry: "a" is done, "b" was released, "c" is new.
        let second = claim_each(&store, "sg", ["b", "a", "c"], lease)
            .await
            .unwrap();
        assert!(second[0].is_new());
        assert!(matches!(second[1].outcome, ClaimOutcome::Completed { .. }));
        assert!(second[2].is_new());
        assert_ne!(event_key("sg", "a"), event_key("other", "a"));
        assert_eq!(event_key("sg", "a").len(), 3 + 64);
    }
}
