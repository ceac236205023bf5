//! Stores for tests that forward every call to another store with a twist: a guard that cleans
//! up, a claim counter, an outage, or any [`Hooks`] a test writes for itself.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use tower_idempotency_core::{
    CachedResponse, ClaimOutcome, FencingToken, Fingerprint, MemoryStore, Ownership, RecordState,
    Settlements, Store, StoreError, TransactionalStore,
};

/// The [`Store`] call a [`Hooks`] sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// [`Store::claim`].
    Claim,
    /// [`Store::renew`].
    Renew,
    /// [`Store::complete`].
    Complete,
    /// [`Store::release`].
    Release,
    /// [`Store::get`].
    Get,
    /// [`Store::forget`].
    Forget,
}

/// The twist of a [`Hooked`] store: what happens around each call it forwards.
#[async_trait::async_trait]
pub trait Hooks: Send + Sync + 'static {
    /// Runs before `call` for `key` reaches the wrapped store; an `Err` answers the call
    /// instead, and a future that never ends hangs it.
    async fn before(&self, _call: Call, _key: &str) -> Result<(), StoreError> {
        Ok(())
    }

    /// Runs after the wrapped store answered `call` for `key`.
    fn after(&self, _call: Call, _key: &str) {}
}

/// A store that forwards every call to `store`, running `hooks` around it. Its
/// [`Store::transactions`] and [`Store::name`] are the wrapped store's.
#[derive(Clone, Debug, Default)]
pub struct Hooked<H, S = MemoryStore> {
    /// The twist.
    pub hooks: H,
    /// The wrapped store.
    pub store: S,
}

impl<H: Hooks, S: Store> Hooked<H, S> {
    /// Wraps `store` with `hooks`.
    pub fn wrap(store: S, hooks: H) -> Self {
        Self { hooks, store }
    }

    async fn forward<T>(
        &self,
        call: Call,
        key: &str,
        to: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.hooks.before(call, key).await?;
        let answer = to.await;
        self.hooks.after(call, key);
        answer
    }
}

#[async_trait::async_trait]
impl<H: Hooks, S: Store> Store for Hooked<H, S> {
    async fn claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        token: FencingToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let to = self.store.claim(key, fingerprint, token, lease);
        self.forward(Call::Claim, key, to).await
    }

    async fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Ownership, StoreError> {
        let to = self.store.renew(key, token, lease);
        self.forward(Call::Renew, key, to).await
    }

    async fn complete(
        &self,
        key: &str,
        token: FencingToken,
        response: &CachedResponse,
        ttl: Duration,
    ) -> Result<Ownership, StoreError> {
        let to = self.store.complete(key, token, response, ttl);
        self.forward(Call::Complete, key, to).await
    }

    async fn release(&self, key: &str, token: FencingToken) -> Result<Ownership, StoreError> {
        let to = self.store.release(key, token);
        self.forward(Call::Release, key, to).await
    }

    async fn get(&self, key: &str) -> Result<Option<RecordState>, StoreError> {
        self.forward(Call::Get, key, self.store.get(key)).await
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        self.forward(Call::Forget, key, self.store.forget(key))
            .await
    }

    fn transactions(&self) -> Option<&dyn TransactionalStore> {
        self.store.transactions()
    }

    fn name(&self) -> &'static str {
        self.store.name()
    }

    fn settlements(&self) -> Option<Settlements> {
        self.store.settlements()
    }
}

/// Hooks that only hold a guard whose `Drop` removes the table, file or keys a store used.
#[derive(Clone, Debug)]
pub struct Guard<G>(pub G);

impl<G: Send + Sync + 'static> Hooks for Guard<G> {}

/// A store together with a guard that lives as long as it: tests hand the pair to the
/// conformance suite, and the guard cleans up when the last clone is dropped.
pub type Guarded<S, G> = Hooked<Guard<G>, S>;

impl<S: Store, G: Send + Sync + 'static> Hooked<Guard<G>, S> {
    /// `store`, cleaned up by `guard`.
    pub fn new(store: S, guard: G) -> Self {
        Self::wrap(store, Guard(guard))
    }

    /// The guard.
    pub fn guard(&self) -> &G {
        &self.hooks.0
    }
}

/// Hooks counting the claims that reach the store.
#[derive(Debug, Default)]
pub struct CountClaims(AtomicUsize);

#[async_trait::async_trait]
impl Hooks for CountClaims {
    async fn before(&self, call: Call, _key: &str) -> Result<(), StoreError> {
        if call == Call::Claim {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// A store counting the claims that reach it, for tests that prove a request did (or did not)
/// touch the store: a rejected request must not claim, a locally cached replay must not.
pub type CountingStore<S = MemoryStore> = Hooked<CountClaims, S>;

impl<S: Store> Hooked<CountClaims, S> {
    /// Counts the claims reaching `store`.
    pub fn new(store: S) -> Self {
        Self::wrap(store, CountClaims::default())
    }

    /// Claims that reached the wrapped store so far.
    pub fn claims(&self) -> usize {
        self.hooks.0.load(Ordering::SeqCst)
    }
}

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
