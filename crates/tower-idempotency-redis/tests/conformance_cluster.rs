//! The public store conformance suite, and cluster-specific checks, on a throw-away 3-master
//! Redis Cluster started by the tests themselves.

mod common;

use std::sync::Arc;

use tower_idempotency_core::{conformance, Store};

tower_idempotency_core::store_conformance_tests!(common::cluster_store());

/// A store on the shared cluster under `a`'s prefix with a connection of its own: another
/// application instance.
async fn another_instance(a: &common::TestStore) -> tower_idempotency_redis::RedisStore {
    let connection = common::cluster_connection(common::Cluster::shared().unwrap())
        .await
        .unwrap();
    tower_idempotency_redis::RedisStore::cluster(connection, a.store.prefix()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_two_instances_over_http() {
    let (Some(a), Some(b)) = (common::cluster_store().await, common::cluster_store().await) else {
        return;
    };
    // Same prefix, separate cluster connections: two application instances.
    let b = common::TestStore::new(another_instance(&a).await, b.hooks.0);
    let a: Arc<dyn Store> = Arc::new(a);
    conformance::two_instances_over_http(a, Arc::new(b)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_spread_over_all_masters_by_hash_tag() {
    let Some(store) = common::cluster_store().await else {
        return;
    };
    let cluster = common::Cluster::shared().unwrap();
    let fp = tower_idempotency_core::Fingerprint([1; 32]);
    let lease = std::time::Duration::from_secs(30);
    for i in 0..60 {
        let key = format!("spread:{:064x}", i);
        store
            .claim(
                &key,
                &fp,
                tower_idempotency_core::FencingToken::random().unwrap(),
                lease,
            )
            .await
            .unwrap();
        // The slot of the Redis key is the slot of the store key alone (the hash tag).
        let mut con = redis::Client::open(cluster.urls()[0].as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let slot_of = |k: &str, con: &mut redis::Connection| -> i64 {
            redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(k)
                .query(con)
                .unwrap()
        };
        assert_eq!(
            slot_of(&store.store.redis_key(&key), &mut con),
            slot_of(&key, &mut con)
        );
    }
    // Every master holds some of the 60 records: the store really uses the whole cluster.
    for url in cluster.urls() {
        let mut con = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", store.store.prefix()))
            .query(&mut con)
            .unwrap();
        assert!(!keys.is_empty(), "master {url} holds none of the records");
    }
    assert_eq!(store.guard().count_keys(), 60);
}

/// Losing a master (no replicas) fails the calls for its slots quickly with an error the layer
/// answers with 503, while keys on the other masters keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_master_fails_its_slots_quickly() {
    if common::Cluster::shared().is_none() {
        return; // Said why already.
    }
    let mut cluster = common::Cluster::start().expect("second cluster");
    let connection = common::cluster_connection(&cluster).await.unwrap();
    let store = tower_idempotency_redis::RedisStore::cluster(connection, "deadmaster")
        .unwrap()
        .with_timeout(std::time::Duration::from_secs(3));
    let fp = tower_idempotency_core::Fingerprint([2; 32]);
    let lease = std::time::Duration::from_secs(30);
    // Find which keys live on the master we are about to kill.
    let victim = cluster.nodes[0].port;
    let mut con = redis::Client::open(cluster.urls()[0].as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut on_victim = None;
    let mut elsewhere = None;
    for i in 0..200 {
        let key = format!("dead:{i:064x}");
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query(&mut con)
            .unwrap();
        let owners: Vec<String> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query::<Vec<redis::Value>>(&mut con)
            .unwrap()
            .into_iter()
            .filter_map(|range| {
                let redis::Value::Array(items) = range else {
                    return None;
                };
                let (redis::Value::Int(lo), redis::Value::Int(hi)) = (&items[0], &items[1]) else {
                    return None;
                };
                let redis::Value::Array(master) = &items[2] else {
                    return None;
                };
                let redis::Value::Int(port) = master[1] else {
                    return None;
                };
                ((*lo..=*hi).contains(&i64::from(slot))).then(|| port.to_string())
            })
            .collect();
        if owners == [victim.to_string()] {
            on_victim.get_or_insert(key);
        } else {
            elsewhere.get_or_insert(key);
        }
    }
    let (on_victim, elsewhere) = (on_victim.unwrap(), elsewhere.unwrap());
    assert!(matches!(
        store
            .claim(
                &on_victim,
                &fp,
                tower_idempotency_core::FencingToken::random().unwrap(),
                lease
            )
            .await
            .unwrap(),
        tower_idempotency_core::ClaimOutcome::Claimed { .. }
    ));
    cluster.nodes[0].kill();
    let started = std::time::Instant::now();
    let result = store
        .claim(
            &on_victim,
            &fp,
            tower_idempotency_core::FencingToken::random().unwrap(),
            lease,
        )
        .await;
    let elapsed = started.elapsed();
    assert!(
        matches!(
            result,
            Err(tower_idempotency_core::StoreError::Unavailable(_)
                | tower_idempotency_core::StoreError::Timeout(_))
        ),
        "{result:?}"
    );
    assert!(elapsed < std::time::Duration::from_secs(4), "{elapsed:?}");
    assert!(matches!(
        store
            .claim(
                &elsewhere,
                &fp,
                tower_idempotency_core::FencingToken::random().unwrap(),
                lease
            )
            .await,
        Ok(tower_idempotency_core::ClaimOutcome::Claimed { .. })
    ));
}

/// A large record is staged under a second key that must share the record's slot; store keys
/// that start with a brace once split them (an empty hash tag), failing with `CROSSSLOT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_records_complete_whatever_the_store_key_starts_with() {
    let Some(store) = common::cluster_store().await else {
        return;
    };
    let fp = tower_idempotency_core::Fingerprint([1; 32]);
    let ttl = std::time::Duration::from_secs(30);
    let response = tower_idempotency_core::CachedResponse {
        status: http::StatusCode::OK,
        headers: http::HeaderMap::new(),
        body: bytes::Bytes::from(vec![b'x'; 50_000]),
        body_omitted: false,
    };
    for key in ["}ns:1", "{ns:2", "n}s:3", "ns:4"] {
        let tower_idempotency_core::ClaimOutcome::Claimed { token } = store
            .claim(
                key,
                &fp,
                tower_idempotency_core::FencingToken::random().unwrap(),
                ttl,
            )
            .await
            .unwrap()
        else {
            panic!("{key}: a fresh key is claimed")
        };
        let completed = store.complete(key, token, &response, ttl).await;
        assert!(
            matches!(completed, Ok(tower_idempotency_core::Ownership::Current)),
            "{key}: {completed:?}"
        );
        assert!(matches!(
            store.claim(key, &fp, tower_idempotency_core::FencingToken::random().unwrap(), ttl).await.unwrap(),
            tower_idempotency_core::ClaimOutcome::Completed { record, .. } if record.response.body.len() == 50_000
        ));
    }
}

/// `connect_cluster` reads the eviction policy of every master, not of one node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_cluster_checks_every_master_for_eviction() {
    let Some(cluster) = common::Cluster::shared() else {
        return;
    };
    let urls = cluster.urls();
    let store =
        tower_idempotency_redis::RedisStore::connect_cluster(urls.iter().map(String::as_str), "ev")
            .await
            .expect("the test cluster does not evict");
    let policies = store.eviction_policies().await.expect("policies");
    assert_eq!(policies, vec!["noeviction".to_owned(); 3], "one per master");
}

/// Two cluster instances, each subscribed to notices through one node only (a different one):
/// a plain `PUBLISH` from whichever master holds the key reaches both.
async fn two_notified_cluster_instances() -> Option<(Arc<dyn Store>, Arc<dyn Store>)> {
    let (Some(a), Some(b)) = (common::cluster_store().await, common::cluster_store().await) else {
        return None;
    };
    let urls = common::Cluster::shared()?.urls();
    let node = |i: usize| redis::Client::open(urls[i].as_str()).expect("node url");
    let b = common::TestStore::new(
        another_instance(&a).await.with_notices([node(1)]),
        b.guard().clone(),
    );
    let guard = a.guard().clone();
    let a = common::TestStore::new(a.store.with_notices([node(0)]), guard);
    Some((Arc::new(a), Arc::new(b)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_settled_keys_are_notified_through_one_node() {
    let Some((a, b)) = two_notified_cluster_instances().await else {
        return;
    };
    conformance::settlements_are_notified_across_instances(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_waiters_on_another_instance_are_woken_by_pubsub() {
    let Some((a, b)) = two_notified_cluster_instances().await else {
        return;
    };
    conformance::waiting_across_instances_is_notified_over_http(a, b).await;
}
