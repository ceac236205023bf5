//! Records over the store's limit complete without their body: the conformance check, called
//! with a store configured with a 1 KiB limit.

mod common;

use std::sync::Arc;

use common::Guarded;
use tower_idempotency_core::conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_over_the_limit_complete_without_body() {
    let Some(test) = common::standalone_store().await else {
        return;
    };
    let store = Guarded::new(test.store.with_max_record_bytes(1024), test.hooks.0);
    conformance::records_over_the_store_limit_complete_without_body(Arc::new(store), 1024).await;
}
