//! Postgres `LISTEN/NOTIFY` for waiters across instances: two store objects with separate
//! pools over one table, as two application instances have. Each test uses its own table.
//! Skips (saying so on stderr) when Postgres is unreachable, unless CI=true.

mod common;

use std::{sync::Arc, time::Duration};

use common::*;
use sqlx::Row;
use tower_idempotency_core::{
    conformance,
    store::{ClaimOutcome, FencingToken, Fingerprint, Ownership, Store},
};
use tower_idempotency_sqlx::PostgresStore;

/// Two stores on one fresh table, with separate pools.
async fn two_stores(table: &PgTable) -> Option<(Arc<PostgresStore>, Arc<PostgresStore>)> {
    let (Some(a), Some(b)) = (table.store().await, table.store().await) else {
        return None;
    };
    a.migrate().await.expect("migrate");
    Some((Arc::new(a), Arc::new(b)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_keys_are_notified_to_another_instance() {
    let table = PgTable::new();
    let Some((a, b)) = two_stores(&table).await else {
        return;
    };
    conformance::settlements_are_notified_across_instances(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_another_instance_are_woken_by_notify() {
    let table = PgTable::new();
    let Some((a, b)) = two_stores(&table).await else {
        return;
    };
    conformance::waiting_across_instances_is_notified_over_http(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notified_waiter_that_disconnects_leaves_nothing_behind() {
    let table = PgTable::new();
    let Some((a, b)) = two_stores(&table).await else {
        return;
    };
    conformance::notified_waiter_leaves_nothing_behind_over_http(a, b).await;
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
    let table = PgTable::new();
    let Some((a, b)) = two_stores(&table).await else {
        return;
    };
    let notices = b.settlements().expect("postgres has notices");
    tokio::time::timeout(Duration::from_secs(10), notices.ready())
        .await
        .expect("LISTEN connection up");
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
    assert_eq!(
        a.release(&keys[1], token).await.expect("release"),
        Ownership::Current
    );
    tokio::time::timeout(Duration::from_secs(5), waiting[1].settled())
        .await
        .expect("notices flow on the new connection");

    waiting.clear();
    assert_eq!(notices.subscribed_keys(), 0);
    drop(notices);
    drop(b);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !listeners(&a, &table.name).await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the LISTEN connection outlived its store"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `with_notices(false)`: no notices offered (its waiters poll), none sent, and the calls
/// still tell current from stale holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_notices_sends_none_and_still_fences() {
    let table = PgTable::new();
    let Some((quiet, b)) = two_stores(&table).await else {
        return;
    };
    let quiet = Arc::into_inner(quiet)
        .expect("one owner")
        .with_notices(false);
    assert!(quiet.settlements().is_none());
    let notices = b.settlements().expect("on by default");
    tokio::time::timeout(Duration::from_secs(10), notices.ready())
        .await
        .expect("LISTEN connection up");

    let silent = random_key("silent");
    let mut silent_settlement = notices.subscribe(&silent);
    let token = claimed(&quiet, &silent).await;
    let response = tower_idempotency_core::CachedResponse {
        status: http::StatusCode::CREATED,
        headers: http::HeaderMap::new(),
        body: "done".into(),
        body_omitted: false,
    };
    let ttl = Duration::from_secs(60);
    let stale = FencingToken(token.0 ^ 1);
    assert_eq!(
        quiet
            .complete(&silent, stale, &response, ttl)
            .await
            .unwrap(),
        Ownership::Stale
    );
    assert_eq!(
        quiet
            .complete(&silent, token, &response, ttl)
            .await
            .unwrap(),
        Ownership::Current
    );
    assert!(quiet.forget(&silent).await.unwrap());
    assert!(!quiet.forget(&silent).await.unwrap());
    let other = random_key("loud");
    let token = claimed(&quiet, &other).await;
    assert_eq!(
        quiet.release(&other, stale).await.unwrap(),
        Ownership::Stale
    );
    assert_eq!(
        quiet.release(&other, token).await.unwrap(),
        Ownership::Current
    );

    // Notices arrive in commit order: one from `b` after all that proves none came before.
    let loud = random_key("loud");
    let mut loud_settlement = notices.subscribe(&loud);
    let token = claimed(&b, &loud).await;
    assert_eq!(b.release(&loud, token).await.unwrap(), Ownership::Current);
    tokio::time::timeout(Duration::from_secs(5), loud_settlement.settled())
        .await
        .expect("b's notice");
    // A zero timeout polls the wait once: pending means no notice has come.
    assert!(
        tokio::time::timeout(Duration::ZERO, silent_settlement.settled())
            .await
            .is_err(),
        "the store without notices sent one"
    );
}
