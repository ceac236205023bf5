//! The tests every SQL store passes, written once over a [`Place`] (a fresh SQLite file or
//! Postgres table) and run per backend by [`sql_store_tests!`](crate::sql_store_tests).

use std::{future::Future, sync::Arc, time::Duration};

use tower_idempotency_core::{
    conformance, ClaimOutcome, FencingToken, IdempotencyLayer, Ownership, RecordState, Store,
    StoreError,
};
use tower_idempotency_sqlx::{Backend, SqlStore};

use super::*;

/// Where a test's store lives, removed when dropped.
pub trait Place: Sized + Send + Sync + 'static {
    /// The database.
    type DB: Backend;
    /// The statement a transaction that writes starts with.
    const BEGIN_WRITE: &'static str;
    /// Part of the error a claim on a table that was never created reports.
    const MISSING_TABLE: &'static str;
    /// A fresh place, or `None` when its database is unreachable (the test is skipped).
    fn create() -> impl Future<Output = Option<Self>> + Send;
    /// A store on a pool of its own in this place, not migrated.
    fn open(&self) -> impl Future<Output = SqlStore<Self::DB>> + Send;
    /// The rows in the store's table, counted by the database.
    fn count_rows(store: &SqlStore<Self::DB>) -> impl Future<Output = i64> + Send;
    /// Makes `tx`, begun with [`Place::BEGIN_WRITE`], block every other write to `table` until
    /// it ends (on SQLite beginning it already does).
    fn block_writes(
        tx: &mut sqlx::Transaction<'static, Self::DB>,
        table: &str,
    ) -> impl Future<Output = ()> + Send;
}

/// A migrated store in a fresh place, which it owns; `None` when the database is unreachable.
pub async fn migrated<P: Place>() -> Option<Guarded<Arc<SqlStore<P::DB>>, P>> {
    let place = P::create().await?;
    let store = place.open().await;
    store.migrate().await.expect("migrate");
    Some(Guarded::new(Arc::new(store), place))
}

fn new_token() -> FencingToken {
    FencingToken::random().expect("random token")
}

/// Runs the shared tests against the [`Place`] `$place`, each in a module of its own.
#[macro_export]
macro_rules! sql_store_tests {
    ($place:ty) => {
        $crate::sql_store_tests!($place;
            two_instances_share_one_table,
            two_instances_wait_for_one_result,
            restart_keeps_completed,
            a_store_reads_first_only_the_keys_it_has_seen,
            crashed_holder_blocks_until_its_lease_expires,
            oversize_record_is_rejected_and_the_key_can_be_released,
            transaction_hooks_commit_and_roll_back_with_the_caller,
            purge_deletes_only_expired_records,
            background_purger_runs_and_stops_with_the_store,
            client_disconnect_mid_request,
            missing_table_is_a_backend_error,
            closing_the_pool_empties_the_lanes,
            a_claim_that_waited_for_a_lock_gets_its_whole_lease,
            records_over_the_limit_complete_without_body
        );
    };
    ($place:ty; $($case:ident),*) => {
        mod shared {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    $crate::common::shared::$case::<$place>().await
                }
            )*
        }
    };
}

pub async fn two_instances_share_one_table<P: Place>() {
    let Some(place) = P::create().await else {
        return;
    };
    let (a, b) = (place.open().await, place.open().await);
    a.migrate().await.expect("migrate");
    b.migrate().await.expect("migrate twice is harmless");
    conformance::two_instances_over_http(Arc::new(a), Arc::new(b)).await;
}

pub async fn two_instances_wait_for_one_result<P: Place>() {
    let Some(place) = P::create().await else {
        return;
    };
    let (a, b) = (place.open().await, place.open().await);
    a.migrate().await.expect("migrate");
    conformance::waiting_across_instances_over_http(Arc::new(a), Arc::new(b)).await;
}

pub async fn restart_keeps_completed<P: Place>() {
    let Some(place) = P::create().await else {
        return;
    };
    let before = place.open().await;
    before.migrate().await.expect("migrate");
    let after = place.open().await;
    conformance::restart_keeps_completed(Arc::new(before), Arc::new(after)).await;
}

/// A store reads a key first only once it has seen the key: a new key is two statements (the
/// claim, the completion); a key another store object completed is replayed by the claim
/// statement (one statement); from then on its replays are a plain read, which needs no write:
/// while another transaction blocks every write to the table, the next replay is answered.
pub async fn a_store_reads_first_only_the_keys_it_has_seen<P: Place>() {
    let Some(place) = P::create().await else {
        return;
    };
    let first = Arc::new(place.open().await);
    first.migrate().await.expect("migrate");
    let other = Arc::new(place.open().await);
    let first_server = serve(IdempotencyLayer::client_keys(first.clone())).await;
    let other_server = serve(IdempotencyLayer::client_keys(other.clone())).await;
    let client = reqwest::Client::new();
    let key = random_suffix();

    let before = first.statements_executed();
    let (status, replayed, body) = post_order(&client, &first_server.url, &key).await;
    assert_eq!((status, replayed), (201, false));
    assert_eq!(first.statements_executed() - before, 2, "claim + complete");

    let before = other.statements_executed();
    let (status, replayed, again) = post_order(&client, &other_server.url, &key).await;
    assert_eq!(
        (status, replayed, again.as_str()),
        (201, true, body.as_str())
    );
    assert_eq!(
        other.statements_executed() - before,
        2,
        "the insert finds the row, the claim statement replays it"
    );

    let mut lock = other
        .pool()
        .begin_with(P::BEGIN_WRITE)
        .await
        .expect("begin");
    P::block_writes(&mut lock, other.table()).await;
    let before = other.statements_executed();
    let replay = post_order(&client, &other_server.url, &key);
    let (status, replayed, again) = tokio::time::timeout(Duration::from_secs(5), replay)
        .await
        .expect("a replay of a seen key must not wait for the write lock");
    assert_eq!(
        (status, replayed, again.as_str()),
        (201, true, body.as_str())
    );
    assert_eq!(other.statements_executed() - before, 1, "the read replays");
    lock.rollback().await.expect("rollback");
    let executions = first_server
        .executions
        .load(std::sync::atomic::Ordering::SeqCst)
        + other_server
            .executions
            .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(executions, 1);
}

pub async fn crashed_holder_blocks_until_its_lease_expires<P: Place>() {
    let Some(place) = P::create().await else {
        return;
    };
    let crashed = place.open().await;
    crashed.migrate().await.expect("migrate");
    let key = random_key("crash");
    // Long enough that reopening the store and claiming again end inside it on a loaded machine.
    let lease = Duration::from_secs(3);
    token_of(claim(&crashed, &key, 1, lease).await);
    // The holder's connections go away without completing or releasing.
    crashed.pool().close().await;
    drop(crashed);

    let restarted = place.open().await;
    match claim(&restarted, &key, 2, lease).await {
        ClaimOutcome::InFlight {
            fingerprint: fp,
            lease_remaining,
        } => {
            assert_eq!(fp, fingerprint(1));
            assert!(lease_remaining <= lease, "{lease_remaining:?}");
        }
        other => panic!("the lease must still hold, got {other:?}"),
    }
    // Time passing is the point: the crashed holder's lease runs out.
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    token_of(claim(&restarted, &key, 2, lease).await);
    assert!(matches!(
        claim(&restarted, &key, 2, lease).await,
        ClaimOutcome::InFlight { .. }
    ));
}

pub async fn oversize_record_is_rejected_and_the_key_can_be_released<P: Place>() {
    let Some(place) = P::create().await else {
        return;
    };
    let store = place.open().await.with_max_record_bytes(1024);
    store.migrate().await.expect("migrate");
    let key = random_key("big");
    let lease = Duration::from_secs(60);
    let token = token_of(claim(&store, &key, 1, lease).await);
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

/// `claim_in`, `complete_in` and `release_in` on the caller's transaction land with its commit
/// and vanish with its rollback.
pub async fn transaction_hooks_commit_and_roll_back_with_the_caller<P: Place>() {
    let Some(guarded) = migrated::<P>().await else {
        return;
    };
    let store = &guarded.store;
    let lease = Duration::from_secs(60);

    let rolled_back = random_key("rollback");
    let mut tx = store.pool().begin().await.expect("begin");
    let token = token_of(
        store
            .claim_in(&mut tx, &rolled_back, &fingerprint(1), new_token(), lease)
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
        .begin_with(P::BEGIN_WRITE)
        .await
        .expect("begin");
    let token = token_of(
        store
            .claim_in(&mut tx, &committed, &fingerprint(1), new_token(), lease)
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
            .claim_in(&mut tx, &released, &fingerprint(1), new_token(), lease)
            .await
            .expect("claim"),
    );
    let done = store.release_in(&mut tx, &released, token).await;
    assert_eq!(done.expect("release"), Ownership::Current);
    tx.commit().await.expect("commit");
    assert_eq!(store.get(&released).await.expect("get"), None);
}

pub async fn purge_deletes_only_expired_records<P: Place>() {
    let Some(guarded) = migrated::<P>().await else {
        return;
    };
    let store = &guarded.store;
    // Long enough that the set-up (nine statements) ends well inside it on a loaded machine.
    let short = Duration::from_millis(1500);
    for i in 0..5 {
        let key = random_key(&format!("purge{i}"));
        let token = token_of(claim(store, &key, 1, short).await);
        if i % 2 == 0 {
            store
                .complete(&key, token, &response("x"), short)
                .await
                .expect("complete");
        }
    }
    let live = random_key("live");
    let long = Duration::from_secs(60);
    token_of(claim(store, &live, 1, long).await);
    assert_eq!(
        store.purge_expired().await.expect("purge"),
        0,
        "nothing expired yet"
    );
    // Time passing is the point: the short records expire.
    tokio::time::sleep(short + Duration::from_millis(200)).await;
    assert_eq!(store.purge_expired().await.expect("purge"), 5);
    assert_eq!(P::count_rows(store).await, 1);
    assert!(store.get(&live).await.expect("get").is_some());
}

pub async fn background_purger_runs_and_stops_with_the_store<P: Place>() {
    let Some(place) = P::create().await else {
        return;
    };
    let store = Arc::new(place.open().await);
    store.migrate().await.expect("migrate");
    let key = random_key("purger");
    token_of(claim(&*store, &key, 1, Duration::from_millis(100)).await);
    let purger = store.spawn_purger(Duration::from_millis(50));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while P::count_rows(&store).await != 0 {
        assert!(tokio::time::Instant::now() < deadline, "purger did not run");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    drop(store);
    tokio::time::timeout(Duration::from_secs(10), purger)
        .await
        .expect("the purger stops once the store is dropped")
        .expect("purger task");
}

pub async fn client_disconnect_mid_request<P: Place>() {
    let Some(guarded) = migrated::<P>().await else {
        return;
    };
    super::client_disconnect_mid_request(Arc::new(guarded)).await;
}

pub async fn missing_table_is_a_backend_error<P: Place>() {
    let Some(place) = P::create().await else {
        return;
    };
    let store = place.open().await;
    let result = store
        .claim(
            &random_key("nomigrate"),
            &fingerprint(1),
            new_token(),
            Duration::from_secs(1),
        )
        .await;
    match result {
        Err(error @ StoreError::Backend(_)) => {
            let source = std::error::Error::source(&error)
                .expect("source")
                .to_string();
            assert!(source.contains(P::MISSING_TABLE), "{source}");
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
}

/// Closing the pool does not wait for the store to be dropped.
pub async fn closing_the_pool_empties_the_lanes<P: Place>() {
    let Some(guarded) = migrated::<P>().await else {
        return;
    };
    let store = &guarded.store;
    closing_the_pool_does_not_wait_for_the_store(&**store, || store.pool().close()).await;
}

/// Records over the store's limit complete without their body: the conformance check, with a
/// store configured with a 1 KiB limit.
pub async fn records_over_the_limit_complete_without_body<P: Place>() {
    let Some(place) = P::create().await else {
        return;
    };
    let store = place.open().await.with_max_record_bytes(1024);
    store.migrate().await.expect("migrate");
    conformance::records_over_the_store_limit_complete_without_body(Arc::new(store), 1024).await;
}

/// A claim that waited longer than its lease for a lock (Postgres: another transaction's row
/// lock; SQLite: the write lock) must still get its whole lease.
pub async fn a_claim_that_waited_for_a_lock_gets_its_whole_lease<P: Place>() {
    let Some(guarded) = migrated::<P>().await else {
        return;
    };
    let store = guarded.store.clone();
    let key = random_key("lock-wait");
    let mut tx = store
        .pool()
        .begin_with(P::BEGIN_WRITE)
        .await
        .expect("begin");
    let lease = Duration::from_secs(60);
    let fp = fingerprint(1);
    let claimed = store.claim_in(&mut tx, &key, &fp, new_token(), lease);
    token_of(claimed.await.expect("claim_in"));
    a_claim_behind_a_lock_gets_its_whole_lease(store, &key, async move {
        tx.rollback().await.expect("rollback")
    })
    .await;
}
