//! Stores for checks and tests that forward every call to another store with a twist: a guard
//! that cleans up, a claim counter, or any [`Hooks`] a test writes for itself.

use std::{
    future::Future,
    sync::atomic::{AtomicUsize, Ordering},
};

use crate::store::{forward_store, Call, MemoryStore, Store, StoreError};

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
/// [`Store::transactions`], [`Store::name`] and [`Store::settlements`] are the wrapped store's.
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
        to: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.hooks.before(call, key).await?;
        let answer = to.await;
        self.hooks.after(call, key);
        answer
    }
}

forward_store!(impl[H: Hooks, S: Store] Hooked<H, S>, |this| this.store, Self::forward);

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

/// A store counting the claims that reach it, for checks that prove a request did (or did not)
/// touch the store: a rejected request must not claim, a locally cached replay must not, a
/// notified waiter claims once per notice.
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
