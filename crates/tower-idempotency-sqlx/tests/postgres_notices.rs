//! Postgres `LISTEN/NOTIFY` for waiters across instances: two store objects with separate
//! pools over one table, as two application instances have. Each test uses its own table.
//! Skips (saying so on stderr) when Postgres is unreachable, unless CI=true.

mod common;

use std::{sync::Arc, time::Duration};

use common::*;
use sqlx::Row;
use tower_idempotency_core::{
    conformance, ClaimOutcome, FencingToken, Fingerprint, Ownership, Settlements, Store,
};
use tower_idempotency_sqlx::PostgresStore;

/// Two stores on one fresh table, with separate pools, and the table (dropped with it).
async fn two_stores() -> Option<(PgTable, Arc<PostgresStore>, Arc<PostgresStore>)> {
    let table = PgTable::new();
    let (Some(a), Some(b)) = (table.store().await, table.store().await) else {
        return None;
    };
    a.migrate().await.expect("migrate");
    Some((table, Arc::new(a), Arc::new(b)))
}

/// Runs a core check of two instances on two stores over one fresh table.
async fn across_two_stores<F: std::future::Future<Output = ()>>(
    check: impl FnOnce(Arc<dyn Store>, Arc<dyn Store>) -> F,
) {
    if let Some((_table, a, b)) = two_stores().await {
        check(a, b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_keys_are_notified_to_another_instance() {
    across_two_stores(conformance::settlements_are_notified_across_instances).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_another_instance_are_woken_by_notify() {
    across_two_stores(conformance::waiting_across_instances_is_notified_over_http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notified_waiter_that_disconnects_leaves_nothing_behind() {
    across_two_stores(conformance::notified_waiter_leaves_nothing_behind_over_http).await;
}

/// `store`'s notices, once their `LISTEN` connection is up.
async fn listening(store: &PostgresStore) -> Settlements {
    let notices = store.settlements().expect("postgres has notices");
    tokio::time::timeout(Duration::from_secs(10), notices.ready())
        .await
        .expect("LISTEN connection up");
    notices
}

/// The backend pids of the connections listening on `table`'s channel.
async fn listeners(store: &PostgresStore, table: &str) -> Vec<i32> {
    sqlx::query("SELECT pid FROM pg_stat_activity WHERE query = $1")
        .bind(format!(r#"LISTEN "{table}_settled""#))
        .fetch_all(store.pool())
        .await
        .expect("pg_stat_activity")
        .iter()
        .map(|row| row.get("pid"))
        .collect()
}

async fn claimed(store: &PostgresStore, key: &str) -> FencingToken {
    let token = FencingToken::random().expect("token");
    let claim = store
        .claim(key, &Fingerprint([7; 32]), token, Duration::from_secs(60))
        .await
        .expect("claim");
    assert_eq!(claim, ClaimOutcome::Claimed { token });
    token
}

/// One `LISTEN` connection per store object, however many keys are waited on; when it is
/// killed, waiters are woken (to claim again), a new one is opened, and notices flow again.
/// Dropping the store closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listen_connection_is_shared_and_reopened_after_a_failure() {
    let Some((table, a, b)) = two_stores().await else {
        return;
    };
    let notices = listening(&b).await;
    let keys: Vec<_> = (0..20).map(|_| random_key("listen")).collect();
    let mut waiting: Vec<_> = keys.iter().map(|k| notices.subscribe(k)).collect();
    let before = listeners(&a, &table.name).await;
    assert_eq!(
        before.len(),
        1,
        "one LISTEN connection for 20 waited-on keys"
    );

    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(before[0])
        .execute(a.pool())
        .await
        .expect("terminate");
    tokio::time::timeout(Duration::from_secs(10), waiting[0].settled())
        .await
        .expect("losing the connection wakes the waiters");
    tokio::time::timeout(Duration::from_secs(10), notices.ready())
        .await
        .expect("LISTEN connection back");
    let after = listeners(&a, &table.name).await;
    assert_eq!(after.len(), 1);
    assert_ne!(after, before, "a new connection");

    waiting[1].mark_seen();
    let token = claimed(&a, &keys[1]).await;
    assert!(watch(&b, &keys[1]).await);
    assert_eq!(
        a.release(&keys[1], token).await.expect("release"),
        Ownership::Current
    );
    tokio::time::timeout(Duration::from_secs(30), waiting[1].settled())
        .await
        .expect("notices flow on the new connection");

    waiting.clear();
    assert_eq!(notices.subscribed_keys(), 0);
    drop(notices);
    drop(b);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !listeners(&a, &table.name).await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the LISTEN connection outlived its store"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn done() -> tower_idempotency_core::CachedResponse {
    tower_idempotency_core::CachedResponse {
        status: http::StatusCode::CREATED,
        headers: http::HeaderMap::new(),
        body: "done".into(),
        body_omitted: false,
    }
}

const TTL: Duration = Duration::from_secs(60);

/// Marks `key` as waited on through `store`'s notices, as a waiter does before it waits.
async fn watch(store: &PostgresStore, key: &str) -> bool {
    store
        .settlements()
        .expect("postgres has notices")
        .watch(key)
        .await
        .expect("watch")
}

/// A `LISTEN` of its own on `table`'s channel, outside any store.
async fn listen(store: &PostgresStore, table: &str) -> sqlx::postgres::PgListener {
    let mut listener = sqlx::postgres::PgListener::connect_with(store.pool())
        .await
        .expect("listener");
    listener
        .listen(&format!("{table}_settled"))
        .await
        .expect("LISTEN");
    listener
}

/// Nobody waits on a key: its `complete`, `release`, `forget` (and their stale calls) send no
/// `NOTIFY`, a key marked before its lease ran out is unmarked by the next claim, and the calls
/// still tell current from stale holders. Notices arrive in commit order, so the first one on
/// the channel being a later, watched key's proves none came before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_nobody_waits_on_are_settled_without_notify() {
    let Some((table, a, b)) = two_stores().await else {
        return;
    };
    let mut listener = listen(&a, &table.name).await;

    let completed = random_key("unwatched");
    let token = claimed(&a, &completed).await;
    let stale = FencingToken(token.0 ^ 1);
    assert_eq!(
        a.complete(&completed, stale, &done(), TTL).await.unwrap(),
        Ownership::Stale
    );
    assert_eq!(
        a.complete(&completed, token, &done(), TTL).await.unwrap(),
        Ownership::Current
    );
    assert!(a.forget(&completed).await.unwrap());
    assert!(!a.forget(&completed).await.unwrap());
    let released = random_key("unwatched");
    let token = claimed(&a, &released).await;
    assert_eq!(a.release(&released, stale).await.unwrap(), Ownership::Stale);
    assert_eq!(
        a.release(&released, token).await.unwrap(),
        Ownership::Current
    );

    // Watched under a lease that ran out, then claimed anew: the new holder's release is
    // nobody's business.
    let expired = random_key("expired");
    a.claim(
        &expired,
        &Fingerprint([7; 32]),
        FencingToken::random().unwrap(),
        Duration::from_millis(50),
    )
    .await
    .expect("claim");
    assert!(watch(&b, &expired).await);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.get(&expired).await.expect("get").is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease never ran out"
        );
        tokio::task::yield_now().await;
    }
    assert!(
        !watch(&b, &expired).await,
        "an expired key is not in flight"
    );
    let token = claimed(&a, &expired).await;
    assert_eq!(
        a.release(&expired, token).await.unwrap(),
        Ownership::Current
    );

    let watched = random_key("watched");
    let token = claimed(&a, &watched).await;
    assert!(watch(&b, &watched).await);
    assert_eq!(
        a.release(&watched, token).await.unwrap(),
        Ownership::Current
    );
    let first = tokio::time::timeout(Duration::from_secs(30), listener.recv())
        .await
        .expect("a notice within 30 s")
        .expect("listener");
    assert_eq!(
        first.payload(),
        Settlements::key_digest(&watched),
        "the first notice is the watched key's"
    );
}

/// A table made before waiters marked keys (no `watched` column) gets it from `migrate`, which
/// keeps its rows; a key on it can then be watched and its settlement is notified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_the_watched_column_to_an_older_table() {
    let Some((table, a, b)) = two_stores().await else {
        return;
    };
    let kept = random_key("kept");
    let kept_token = claimed(&a, &kept).await;
    sqlx::query(sqlx::AssertSqlSafe(&*format!(
        r#"ALTER TABLE "{}" DROP COLUMN watched"#,
        table.name
    )))
    .execute(a.pool())
    .await
    .expect("drop the column");
    a.migrate().await.expect("migrate the older table");
    a.migrate().await.expect("migrate again");
    assert!(watch(&b, &kept).await, "the row survived, in flight");
    let notices = listening(&b).await;
    let mut waiter = notices.subscribe(&kept);
    assert_eq!(
        a.complete(&kept, kept_token, &done(), TTL).await.unwrap(),
        Ownership::Current
    );
    tokio::time::timeout(Duration::from_secs(30), waiter.settled())
        .await
        .expect("notified");
}

/// A waiter's mark and the holder's completion, in either order, leave the waiter finishing:
/// a mark that commits first (here held open while the completion queues behind its row lock)
/// is seen by the completion, which notifies; a completion that commits first (held open while
/// the mark queues) leaves the mark nothing in flight, so the waiter claims again and gets the
/// result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_and_a_completion_race_in_either_order_and_the_waiter_finishes() {
    let Some((table, a, b)) = two_stores().await else {
        return;
    };
    let notices = listening(&b).await;

    // The mark first: another waiter's mark, its transaction still open.
    let key = random_key("mark-first");
    let mut waiter = notices.subscribe(&key);
    let token = claimed(&a, &key).await;
    let mut marking = b.pool().begin().await.expect("begin");
    let marked = sqlx::query(sqlx::AssertSqlSafe(&*format!(
        r#"UPDATE "{}" SET watched = true WHERE key = $1 AND state = 0"#,
        table.name
    )))
    .bind(&key)
    .execute(&mut *marking)
    .await
    .expect("mark");
    assert_eq!(marked.rows_affected(), 1);
    let completing = tokio::spawn({
        let (a, key) = (a.clone(), key.clone());
        async move { a.complete(&key, token, &done(), TTL).await }
    });
    until_one_waits_on_a_lock(&a, &table.name).await;
    marking.commit().await.expect("commit the mark");
    assert_eq!(
        completing.await.unwrap().expect("complete"),
        Ownership::Current
    );
    tokio::time::timeout(Duration::from_secs(30), waiter.settled())
        .await
        .expect("the completion saw the mark and notified");

    // The completion first, in a transaction still open while the mark queues behind it.
    let key = random_key("complete-first");
    let token = claimed(&a, &key).await;
    let mut completing = a.pool().begin().await.expect("begin");
    assert_eq!(
        a.complete_in(&mut completing, &key, token, &done(), TTL)
            .await
            .expect("complete"),
        Ownership::Current
    );
    let marking = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move { watch(&b, &key).await }
    });
    until_one_waits_on_a_lock(&a, &table.name).await;
    completing.commit().await.expect("commit the completion");
    assert!(
        !marking.await.unwrap(),
        "the mark finds the key no longer in flight"
    );
    let again = b
        .claim(
            &key,
            &Fingerprint([7; 32]),
            FencingToken::random().unwrap(),
            TTL,
        )
        .await
        .expect("claim again");
    assert!(
        matches!(again, ClaimOutcome::Completed { .. }),
        "the waiter claims again and gets the result: {again:?}"
    );
}
