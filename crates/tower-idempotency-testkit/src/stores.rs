//! Stores for tests that forward every call to another store with a twist: a guard that cleans
//! up, a claim counter, an outage, or any [`Hooks`] a test writes for itself. All but
//! [`Outage`] are the conformance suite's own.

pub use tower_idempotency_core::conformance::{
    Call, CountClaims, CountingStore, Guard, Guarded, Hooked, Hooks,
};
use tower_idempotency_core::{MemoryStore, StoreError};

/// Hooks of a store in trouble: every call fails or never answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outage {
    /// Its backend refuses connections: every call answers [`StoreError::Unavailable`].
    Down,
    /// Its backend never answers: every call hangs.
    Hung,
}

#[async_trait::async_trait]
impl Hooks for Outage {
    async fn before(&self, _call: Call, _key: &str) -> Result<(), StoreError> {
        match self {
            Outage::Down => Err(StoreError::Unavailable("connection refused".into())),
            Outage::Hung => std::future::pending().await,
        }
    }
}

impl Outage {
    /// A memory store in this outage.
    pub fn store(self) -> Hooked<Outage> {
        Hooked::wrap(MemoryStore::new(), self)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tower_idempotency_core::{ClaimOutcome, FencingToken, Fingerprint, RecordState, Store};

    use super::*;

    fn token() -> FencingToken {
        FencingToken::random().expect("random token")
    }

    #[tokio::test]
    async fn counting_store_counts_claims_only_and_forwards() {
        let store = CountingStore::new(MemoryStore::new());
        let fp = Fingerprint([1; 32]);
        let claimed = store.claim("k", &fp, token(), Duration::from_secs(5)).await;
        assert!(matches!(claimed, Ok(ClaimOutcome::Claimed { .. })));
        assert!(matches!(
            store.get("k").await,
            Ok(Some(RecordState::InFlight { .. }))
        ));
        assert_eq!(store.claims(), 1);
        assert_eq!(store.name(), MemoryStore::new().name());
    }

    #[tokio::test]
    async fn a_down_store_answers_unavailable_and_a_hung_one_never() {
        let down = Outage::Down.store();
        assert!(matches!(
            down.get("k").await,
            Err(StoreError::Unavailable(_))
        ));
        let hung = Outage::Hung.store();
        let waited = tokio::time::timeout(Duration::from_millis(50), hung.get("k")).await;
        assert!(waited.is_err(), "a hung store answered");
    }
}
