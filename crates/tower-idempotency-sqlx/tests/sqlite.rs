//! SQLite store: the conformance suite, the tests every SQL store passes, and the store's own
//! guarantees, on temp files.

mod common;

use std::time::Duration;

use common::*;
use tower_idempotency_core::store::{ClaimOutcome, Ownership, Store, StoreError};
use tower_idempotency_sqlx::{sqlite_schema_sql, ConfigError, ConnectError, SqliteStore};

mod suite {
    tower_idempotency_core::store_conformance_tests!(async {
        Some(crate::common::sqlite_store().await)
    });
}

/// The same suite through a `LocalReplayCache`: the wrapper must not weaken any rule.
mod suite_with_local_cache {
    tower_idempotency_core::store_conformance_tests!(async {
        Some(tower_idempotency_core::LocalReplayCache::new(
            crate::common::sqlite_store().await,
        ))
    });
}

sql_store_tests!(crate::common::SqliteFile);

#[tokio::test]
async fn invalid_table_names_are_rejected() {
    let file = SqliteFile::new();
    for bad in ["x; DROP TABLE y", "1abc", "", "a\"b", "a-b"] {
        match SqliteStore::connect_with_table(&file.url(), bad).await {
            Err(ConnectError::Config(ConfigError::InvalidTableName(name))) => assert_eq!(name, bad),
            other => panic!("{bad:?} must be rejected, got {other:?}"),
        }
    }
    assert!(!file.path.exists(), "a rejected name opens nothing");
    let pool = file.store("idem").await.pool().clone();
    assert!(matches!(
        SqliteStore::new(pool, &"t".repeat(64)),
        Err(ConfigError::TableNameTooLong { len: 64, .. })
    ));
}

#[tokio::test]
async fn closed_pool_is_unavailable() {
    let guarded = sqlite_store().await;
    guarded.store.pool().close().await;
    let result = guarded
        .store
        .claim(
            &random_key("closed"),
            &fingerprint(1),
            tower_idempotency_core::FencingToken::random().unwrap(),
            Duration::from_secs(1),
        )
        .await;
    assert!(
        matches!(result, Err(StoreError::Unavailable(_))),
        "{result:?}"
    );
}

#[tokio::test]
async fn schema_sql_names_the_table() {
    let sql = sqlite_schema_sql("orders_idem");
    assert!(sql.contains(r#"CREATE TABLE IF NOT EXISTS "orders_idem""#));
    assert!(sql.contains(r#""orders_idem_expires_at_idx""#));
}

/// A store whose lanes hold connections can be dropped after its runtime is gone: a pooled
/// connection dropped outside a runtime panics in sqlx (it spawns its return to the pool), so
/// the lanes close theirs instead.
#[test]
fn a_store_can_be_dropped_after_its_runtime() {
    let file = SqliteFile::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let store = runtime.block_on(async {
        let store = file.store("idem").await;
        store.migrate().await.expect("migrate");
        let outcome = claim(&store, &random_key("outlive"), 1, Duration::from_secs(60)).await;
        assert!(
            matches!(outcome, ClaimOutcome::Claimed { .. }),
            "{outcome:?}"
        );
        store
    });
    assert!(store.connection_lanes() > 0);
    drop(runtime);
    drop(store);
}

/// Likewise for a renewal that waited for the write lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_waited_for_the_write_lock_restarts_the_whole_lease() {
    let guarded = sqlite_store().await;
    let store = guarded.store.clone();
    let key = random_key("renew-wait");
    let lease = Duration::from_millis(1000);
    let token = token_of(claim(&*store, &key, 1, Duration::from_millis(200)).await);
    let other_writer = store
        .pool()
        .begin_with("BEGIN IMMEDIATE")
        .await
        .expect("begin");
    let renewing = tokio::spawn({
        let (store, key) = (store.clone(), key.clone());
        async move { store.renew(&key, token, lease).await }
    });
    tokio::time::sleep(lease * 3 / 2).await;
    other_writer.rollback().await.expect("rollback");
    assert_eq!(renewing.await.unwrap().expect("renew"), Ownership::Current);
    let next = claim(&*store, &key, 3, lease).await;
    assert!(
        matches!(next, ClaimOutcome::InFlight { .. }),
        "the renewed lease had already expired: {next:?}"
    );
}
