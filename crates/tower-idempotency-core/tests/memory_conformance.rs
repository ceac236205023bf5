//! The memory store runs the public conformance suite unchanged.

tower_idempotency_core::store_conformance_tests!(async {
    Some(tower_idempotency_core::MemoryStore::new())
});
