//! The public store conformance suite on the standalone Redis at `REDIS_URL`.

mod common;

tower_idempotency_core::store_conformance_tests!(common::standalone_store());

/// The same suite through a `LocalReplayCache`: the wrapper must not weaken any rule.
mod with_local_cache {
    tower_idempotency_core::store_conformance_tests!(async {
        crate::common::standalone_store()
            .await
            .map(tower_idempotency_core::LocalReplayCache::new)
    });
}
