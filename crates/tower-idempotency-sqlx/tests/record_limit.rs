//! Records over the store's limit complete without their body: the conformance check, called
//! with stores configured with a 1 KiB limit.
#![cfg(all(feature = "sqlite", feature = "postgres"))]

mod common;

use std::sync::Arc;

use common::*;
use tower_idempotency_core::conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_records_over_the_limit_complete_without_body() {
    let file = SqliteFile::new();
    let store = file.store("idem").await.with_max_record_bytes(1024);
    store.migrate().await.expect("migrate");
    conformance::records_over_the_store_limit_complete_without_body(Arc::new(store), 1024).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_records_over_the_limit_complete_without_body() {
    let table = PgTable::new();
    let Some(store) = table.store().await else {
        return;
    };
    let store = store.with_max_record_bytes(1024);
    store.migrate().await.expect("migrate");
    conformance::records_over_the_store_limit_complete_without_body(Arc::new(store), 1024).await;
}
