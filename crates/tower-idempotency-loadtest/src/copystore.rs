//! An experiment, not a product: the memory store with one change, a compact copy of the
//! cached body in `complete`. Measured beside the plain memory store, it shows what the fix
//! recommended in docs/benchmarks.md buys: a body handed over by hyper is a slice of hyper's
//! read buffer, and keeping that slice keeps the whole buffer (8 KiB and up) alive.

use std::time::Duration;

use bytes::Bytes;
use tower_idempotency_core::{
    store::{
        CachedResponse, ClaimOutcome, FencingToken, Fingerprint, Ownership, RecordState, StoreError,
    },
    MemoryStore, Store,
};

/// [`MemoryStore`] that stores an exact-size copy of each cached body.
#[derive(Debug)]
pub struct CopyingMemoryStore(pub MemoryStore);

#[async_trait::async_trait]
impl Store for CopyingMemoryStore {
    async fn claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        self.0.claim(key, fingerprint, lease).await
    }

    async fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Ownership, StoreError> {
        self.0.renew(key, token, lease).await
    }

    async fn complete(
        &self,
        key: &str,
        token: FencingToken,
        response: &CachedResponse,
        ttl: Duration,
    ) -> Result<Ownership, StoreError> {
        let compact = CachedResponse {
            status: response.status,
            headers: response.headers.clone(),
            body: Bytes::copy_from_slice(&response.body),
            body_omitted: response.body_omitted,
        };
        self.0.complete(key, token, &compact, ttl).await
    }

    async fn release(&self, key: &str, token: FencingToken) -> Result<Ownership, StoreError> {
        self.0.release(key, token).await
    }

    async fn get(&self, key: &str) -> Result<Option<RecordState>, StoreError> {
        self.0.get(key).await
    }
}
