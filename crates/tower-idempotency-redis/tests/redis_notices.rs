//! Redis pub/sub for waiters across instances: two store objects with separate connections
//! over one server (or cluster), as two application instances have, each test with its own
//! key prefix (and so its own channel).

mod common;

use std::{sync::Arc, time::Duration};

use tower_idempotency_core::{conformance, FencingToken, Fingerprint, Ownership, Store};
use tower_idempotency_redis::RedisStore;

fn client(url: &str) -> redis::Client {
    redis::Client::open(url).expect("redis url")
}

/// Two stores on the shared server with one prefix and separate connections, both with notices.
async fn two_instances() -> Option<(Arc<dyn Store>, Arc<dyn Store>)> {
    let a = common::standalone_store().await?;
    let url = common::redis_url();
    let manager = common::manager(&url).await.expect("second connection");
    let b = RedisStore::new(manager, a.store.prefix())
        .expect("prefix")
        .with_notices([client(&url)]);
    let guard = a.guard().clone();
    let a = common::TestStore::new(a.store.with_notices([client(&url)]), guard);
    Some((Arc::new(a), Arc::new(b)))
}

/// Runs a core check of two instances on [`two_instances`], or skips.
async fn across_two_instances<F: std::future::Future<Output = ()>>(
    check: impl FnOnce(Arc<dyn Store>, Arc<dyn Store>) -> F,
) {
    if let Some((a, b)) = two_instances().await {
        check(a, b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_keys_are_notified_to_another_instance() {
    across_two_instances(conformance::settlements_are_notified_across_instances).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_another_instance_are_woken_by_pubsub() {
    across_two_instances(conformance::waiting_across_instances_is_notified_over_http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notified_waiter_that_disconnects_leaves_nothing_behind() {
    across_two_instances(conformance::notified_waiter_leaves_nothing_behind_over_http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_clients_has_no_notices() {
    let Some(store) = common::standalone_store().await else {
        return;
    };
    assert!(store.settlements().is_none(), "its waiters poll");
}

/// Subscribers of `channel` on the server at `url`.
async fn subscribers(url: &str, channel: &str) -> i64 {
    let mut connection = client(url)
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let (_, count): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut connection)
        .await
        .expect("PUBSUB NUMSUB");
    count
}

/// One `SUBSCRIBE` connection per store object, opened on first use, however many keys are
/// waited on; when the server restarts, waiters are woken (to claim again), the store
/// subscribes again, and notices flow again. Dropping the store closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscription_is_shared_and_renewed_after_a_restart() {
    let Some(mut server) = common::RedisServer::start(&[]) else {
        return;
    };
    let url = server.url();
    let prefix = common::random_prefix();
    let channel = format!("{prefix}:settled");
    let a = RedisStore::connect(&url, &prefix).await.expect("connect a");
    let b = RedisStore::connect(&url, &prefix).await.expect("connect b");
    assert_eq!(subscribers(&url, &channel).await, 0, "opened on first use");

    let notices = b.settlements().expect("connect sets up notices");
    tokio::time::timeout(Duration::from_secs(10), notices.ready())
        .await
        .expect("subscribed");
    let keys: Vec<String> = (0..20).map(|i| format!("restart:{i:064x}")).collect();
    let mut waiting: Vec<_> = keys.iter().map(|k| notices.subscribe(k)).collect();
    assert_eq!(
        subscribers(&url, &channel).await,
        1,
        "one connection for 20 keys"
    );

    server.kill();
    tokio::time::timeout(Duration::from_secs(10), waiting[0].settled())
        .await
        .expect("losing the subscription wakes the waiters");
    server.restart();
    tokio::time::timeout(Duration::from_secs(30), notices.ready())
        .await
        .expect("subscribed again");
    assert_eq!(subscribers(&url, &channel).await, 1);

    waiting[1].mark_seen();
    let token = FencingToken::random().expect("token");
    let lease = Duration::from_secs(60);
    let fingerprint = Fingerprint([5; 32]);
    // The first command after the restart may meet the old connection; the manager reconnects.
    let mut claim = a.claim(&keys[1], &fingerprint, token, lease).await;
    for _ in 0..3 {
        if claim.is_ok() {
            break;
        }
        claim = a.claim(&keys[1], &fingerprint, token, lease).await;
    }
    assert!(claim.is_ok(), "{claim:?}");
    assert_eq!(
        a.release(&keys[1], token).await.unwrap(),
        Ownership::Current
    );
    tokio::time::timeout(Duration::from_secs(30), waiting[1].settled())
        .await
        .expect("notices flow on the new subscription");

    waiting.clear();
    assert_eq!(notices.subscribed_keys(), 0);
    drop((notices, b));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while subscribers(&url, &channel).await != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the subscription outlived its store"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(server);
}
