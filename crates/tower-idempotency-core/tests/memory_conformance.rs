//! The memory store runs the public conformance suite unchanged.

tower_idempotency_core::store_conformance_tests!(async {
    Some(tower_idempotency_core::MemoryStore::new())
});

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_over_the_store_limit_complete_without_body() {
    // 16 shards of 1 KiB: records over 1 KiB are refused.
    let store = tower_idempotency_core::MemoryStore::new().with_max_bytes(16 * 1024);
    tower_idempotency_core::conformance::records_over_the_store_limit_complete_without_body(
        std::sync::Arc::new(store),
        1024,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_wait_for_one_result() {
    let shared: std::sync::Arc<dyn tower_idempotency_core::Store> =
        std::sync::Arc::new(tower_idempotency_core::MemoryStore::new());
    tower_idempotency_core::conformance::waiting_across_instances_over_http(shared.clone(), shared)
        .await;
}
