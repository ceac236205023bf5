//! SQLite store: the conformance suite plus the store's own guarantees, on temp files.

mod common;

use std::{sync::Arc, time::Duration};

use common::*;
use tower_idempotency_core::{
    conformance, ClaimOutcome, IdempotencyLayer, Ownership, RecordState, Store, StoreError,
};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_one_file() {
    let file = SqliteFile::new();
    let (a, b) = (file.store("idem").await, file.store("idem").await);
    a.migrate().await.expect("migrate");
    b.migrate().await.expect("migrate twice is harmless");
    conformance::two_instances_over_http(Arc::new(a), Arc::new(b)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_wait_for_one_result() {
    let file = SqliteFile::new();
    let (a, b) = (file.store("idem").await, file.store("idem").await);
    a.migrate().await.expect("migrate");
    conformance::waiting_across_instances_over_http(Arc::new(a), Arc::new(b)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_completed() {
    let file = SqliteFile::new();
    let before = file.store("idem").await;
    before.migrate().await.expect("migrate");
    let before: Arc<dyn Store> = Arc::new(before);
    let after: Arc<dyn Store> = Arc::new(file.store("idem").await);
    conformance::restart_keeps_completed(before, after).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_request_takes_two_statements_and_a_replay_one() {
    let guarded = sqlite_store().await;
    let store = guarded.store.clone();
    let server = serve(IdempotencyLayer::client_keys(store.clone())).await;
    let client = reqwest::Client::new();
    let key = random_suffix();

    let before = store.statements_executed();
    let (status, replayed, first) = post_order(&client, &server.url, &key).await;
    assert_eq!((status, replayed), (201, false));
    assert_eq!(store.statements_executed() - before, 2, "claim + complete");

    let before = store.statements_executed();
    let (status, replayed, again) = post_order(&client, &server.url, &key).await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(again, first);
    assert_eq!(store.statements_executed() - before, 1, "one claim replays");
    assert_eq!(
        server.executions.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_holder_blocks_until_its_lease_expires() {
    let file = SqliteFile::new();
    let crashed = file.store("idem").await;
    crashed.migrate().await.expect("migrate");
    let key = random_key("crash");
    let lease = Duration::from_millis(300);
    token_of(
        crashed
            .claim(
                &key,
                &fingerprint(1),
                tower_idempotency_core::FencingToken::random().unwrap(),
                lease,
            )
            .await
            .expect("claim"),
    );
    // The holder goes away without completing or releasing.
    crashed.pool().close().await;
    drop(crashed);

    let restarted = file.store("idem").await;
    match restarted
        .claim(
            &key,
            &fingerprint(2),
            tower_idempotency_core::FencingToken::random().unwrap(),
            lease,
        )
        .await
        .expect("claim")
    {
        ClaimOutcome::InFlight {
            fingerprint: fp, ..
        } => assert_eq!(fp, fingerprint(1)),
        other => panic!("the lease must still hold, got {other:?}"),
    }
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    token_of(
        restarted
            .claim(
                &key,
                &fingerprint(2),
                tower_idempotency_core::FencingToken::random().unwrap(),
                lease,
            )
            .await
            .expect("claim"),
    );
    assert!(matches!(
        restarted
            .claim(
                &key,
                &fingerprint(2),
                tower_idempotency_core::FencingToken::random().unwrap(),
                lease
            )
            .await
            .expect("claim"),
        ClaimOutcome::InFlight { .. }
    ));
}

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
async fn oversize_record_is_rejected_and_the_key_can_be_released() {
    let file = SqliteFile::new();
    let store = file.store("idem").await.with_max_record_bytes(1024);
    store.migrate().await.expect("migrate");
    let key = random_key("big");
    let lease = Duration::from_secs(60);
    let token = token_of(
        store
            .claim(
                &key,
                &fingerprint(1),
                tower_idempotency_core::FencingToken::random().unwrap(),
                lease,
            )
            .await
            .expect("claim"),
    );
    let mut big = response("");
    big.body = bytes::Bytes::from(vec![7u8; 4096]);
    match store.complete(&key, token, &big, lease).await {
        Err(StoreError::RecordTooLarge { size, limit }) => {
            assert!(size > 4096, "{size}");
            assert_eq!(limit, 1024);
        }
        other => panic!("expected RecordTooLarge, got {other:?}"),
    }
    assert_eq!(
        store.release(&key, token).await.expect("release"),
        Ownership::Current
    );
    assert_eq!(store.get(&key).await.expect("get"), None);
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
async fn transaction_hooks_commit_and_roll_back_with_the_caller() {
    let guarded = sqlite_store().await;
    let store = &guarded.store;
    let lease = Duration::from_secs(60);

    let rolled_back = random_key("rollback");
    let mut tx = store.pool().begin().await.expect("begin");
    let token = token_of(
        store
            .claim_in(
                &mut tx,
                &rolled_back,
                &fingerprint(1),
                tower_idempotency_core::FencingToken::random().unwrap(),
                lease,
            )
            .await
            .expect("claim"),
    );
    let done = store
        .complete_in(&mut tx, &rolled_back, token, &response("x"), lease)
        .await;
    assert_eq!(done.expect("complete"), Ownership::Current);
    tx.rollback().await.expect("rollback");
    assert_eq!(store.get(&rolled_back).await.expect("get"), None);

    let committed = random_key("commit");
    let mut tx = store
        .pool()
        .begin_with("BEGIN IMMEDIATE")
        .await
        .expect("begin");
    let token = token_of(
        store
            .claim_in(
                &mut tx,
                &committed,
                &fingerprint(1),
                tower_idempotency_core::FencingToken::random().unwrap(),
                lease,
            )
            .await
            .expect("claim"),
    );
    let done = store
        .complete_in(&mut tx, &committed, token, &response("kept"), lease)
        .await;
    assert_eq!(done.expect("complete"), Ownership::Current);
    tx.commit().await.expect("commit");
    match store.get(&committed).await.expect("get") {
        Some(RecordState::Completed { record, .. }) => assert_eq!(record.response.body, "kept"),
        other => panic!("expected the committed record, got {other:?}"),
    }

    let released = random_key("release");
    let mut tx = store.pool().begin().await.expect("begin");
    let token = token_of(
        store
            .claim_in(
                &mut tx,
                &released,
                &fingerprint(1),
                tower_idempotency_core::FencingToken::random().unwrap(),
                lease,
            )
            .await
            .expect("claim"),
    );
    let done = store.release_in(&mut tx, &released, token).await;
    assert_eq!(done.expect("release"), Ownership::Current);
    tx.commit().await.expect("commit");
    assert_eq!(store.get(&released).await.expect("get"), None);
}

async fn count_rows(store: &SqliteStore) -> i64 {
    sqlx::query_scalar(&format!(r#"SELECT count(*) FROM "{}""#, store.table()))
        .fetch_one(store.pool())
        .await
        .expect("count")
}

#[tokio::test]
async fn purge_deletes_only_expired_records() {
    let guarded = sqlite_store().await;
    let store = &guarded.store;
    // Long enough that the set-up (nine statements) ends well inside it on a loaded machine.
    let short = Duration::from_millis(1500);
    for i in 0..5 {
        let key = random_key(&format!("purge{i}"));
        let token = token_of(
            store
                .claim(
                    &key,
                    &fingerprint(1),
                    tower_idempotency_core::FencingToken::random().unwrap(),
                    short,
                )
                .await
                .expect("claim"),
        );
        if i % 2 == 0 {
            store
                .complete(&key, token, &response("x"), short)
                .await
                .expect("complete");
        }
    }
    let live = random_key("live");
    token_of(
        store
            .claim(
                &live,
                &fingerprint(1),
                tower_idempotency_core::FencingToken::random().unwrap(),
                Duration::from_secs(60),
            )
            .await
            .expect("claim"),
    );
    assert_eq!(
        store.purge_expired().await.expect("purge"),
        0,
        "nothing expired yet"
    );
    tokio::time::sleep(short + Duration::from_millis(200)).await;
    assert_eq!(store.purge_expired().await.expect("purge"), 5);
    assert_eq!(count_rows(store).await, 1);
    assert!(store.get(&live).await.expect("get").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_purger_runs_and_stops_with_the_store() {
    let file = SqliteFile::new();
    let store = Arc::new(file.store("idem").await);
    store.migrate().await.expect("migrate");
    let key = random_key("purger");
    token_of(
        store
            .claim(
                &key,
                &fingerprint(1),
                tower_idempotency_core::FencingToken::random().unwrap(),
                Duration::from_millis(100),
            )
            .await
            .expect("claim"),
    );
    let purger = store.spawn_purger(Duration::from_millis(50));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while count_rows(&store).await != 0 {
        assert!(tokio::time::Instant::now() < deadline, "purger did not run");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    drop(store);
    tokio::time::timeout(Duration::from_secs(2), purger)
        .await
        .expect("the purger stops once the store is dropped")
        .expect("purger task");
}

#[tokio::test]
async fn schema_sql_names_the_table() {
    let sql = sqlite_schema_sql("orders_idem");
    assert!(sql.contains(r#"CREATE TABLE IF NOT EXISTS "orders_idem""#));
    assert!(sql.contains(r#""orders_idem_expires_at_idx""#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_mid_request() {
    let guarded = sqlite_store().await;
    common::client_disconnect_mid_request(Arc::new(guarded)).await;
}

#[tokio::test]
async fn missing_table_is_a_backend_error() {
    let file = SqliteFile::new();
    let store = file.store("never_migrated").await;
    let result = store
        .claim(
            &random_key("nomigrate"),
            &fingerprint(1),
            tower_idempotency_core::FencingToken::random().unwrap(),
            Duration::from_secs(1),
        )
        .await;
    assert!(matches!(result, Err(StoreError::Backend(_))), "{result:?}");
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
        let outcome = store
            .claim(
                &random_key("outlive"),
                &fingerprint(1),
                tower_idempotency_core::FencingToken::random().unwrap(),
                Duration::from_secs(60),
            )
            .await
            .expect("claim");
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

/// Closing the pool does not wait for the store to be dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_pool_empties_the_lanes() {
    let guarded = sqlite_store().await;
    let store = &guarded.store;
    closing_the_pool_does_not_wait_for_the_store(&**store, || store.pool().close()).await;
}

/// A claim that waited for SQLite's write lock longer than its lease must still get its whole
/// lease: the store dates the lease before the statement waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_waited_for_the_write_lock_gets_its_whole_lease() {
    let guarded = sqlite_store().await;
    let store = guarded.store.clone();
    let key = random_key("busy-wait");
    let mut tx = store
        .pool()
        .begin_with("BEGIN IMMEDIATE")
        .await
        .expect("begin");
    token_of(
        store
            .claim_in(
                &mut tx,
                &key,
                &fingerprint(1),
                tower_idempotency_core::FencingToken::random().unwrap(),
                Duration::from_secs(60),
            )
            .await
            .expect("claim_in"),
    );
    a_claim_behind_a_lock_gets_its_whole_lease(store, &key, async move {
        tx.rollback().await.expect("rollback")
    })
    .await;
}

/// Likewise for a renewal that waited for the write lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_waited_for_the_write_lock_restarts_the_whole_lease() {
    let guarded = sqlite_store().await;
    let store = guarded.store.clone();
    let key = random_key("renew-wait");
    let lease = Duration::from_millis(1000);
    let token = token_of(
        store
            .claim(
                &key,
                &fingerprint(1),
                tower_idempotency_core::FencingToken::random().unwrap(),
                Duration::from_millis(200),
            )
            .await
            .expect("claim"),
    );
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
    let next = store
        .claim(
            &key,
            &fingerprint(3),
            tower_idempotency_core::FencingToken::random().unwrap(),
            lease,
        )
        .await
        .expect("claim");
    assert!(
        matches!(next, ClaimOutcome::InFlight { .. }),
        "the renewed lease had already expired: {next:?}"
    );
}
