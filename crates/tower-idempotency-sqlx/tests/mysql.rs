//! MySQL and MariaDB store: the conformance suite, the tests every SQL store passes, and the
//! store's own guarantees, each test in its own table. Skips (saying so on stderr) when the
//! server is unreachable, unless CI=true.

mod common;

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use axum::{extract::State, routing::post, Router};
use common::*;
use tower_idempotency_core::{
    ClaimOutcome, FencingToken, IdempotencyLayer, Ownership, Store, StoreError,
};
use tower_idempotency_sqlx::{mysql_schema_sql, ConfigError, MySqlStore};

mod suite {
    tower_idempotency_core::store_conformance_tests!(crate::common::mysql_store());
}

/// The same suite through a `LocalReplayCache`: the wrapper must not weaken any rule.
mod suite_with_local_cache {
    tower_idempotency_core::store_conformance_tests!(async {
        crate::common::mysql_store()
            .await
            .map(tower_idempotency_core::LocalReplayCache::new)
    });
}

sql_store_tests!(crate::common::MySqlTable);

/// The claim (an upsert and a locking read in one transaction) is the only arbiter across pools
/// and on a key whose previous record expired: 100 claimers over two pools, repeated, always
/// exactly one winner, and every loser sees the winner's fingerprint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_claimers_over_two_pools_one_winner() {
    let table = MySqlTable::new();
    let (Some(a), Some(b)) = (table.store().await, table.store().await) else {
        return;
    };
    a.migrate().await.expect("migrate");
    let stores = [Arc::new(a), Arc::new(b)];
    let short = Duration::from_millis(200);
    for round in 0..4 {
        let key = Arc::new(random_key("race"));
        if round % 2 == 1 {
            // An expired in-flight record: the race is over its reclaim, not an insert.
            token_of(claim(&*stores[0], &key, 9, short).await);
            // Real time has to pass for the lease to end; there is no signal to await.
            tokio::time::sleep(short + Duration::from_millis(50)).await;
        }
        let barrier = Arc::new(tokio::sync::Barrier::new(100));
        let tasks: Vec<_> = (0..100u8)
            .map(|i| {
                let (store, key, barrier) = (
                    stores[usize::from(i % 2)].clone(),
                    key.clone(),
                    barrier.clone(),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    (i, claim(&*store, &key, i, Duration::from_secs(60)).await)
                })
            })
            .collect();
        let mut winner = None;
        let mut losers = Vec::new();
        for task in tasks {
            match task.await.expect("task") {
                (i, ClaimOutcome::Claimed { .. }) => {
                    assert!(winner.replace(i).is_none(), "two winners in round {round}")
                }
                (_, ClaimOutcome::InFlight { fingerprint, .. }) => losers.push(fingerprint),
                (_, other) => panic!("unexpected {other:?}"),
            }
        }
        let winner = winner.expect("one winner");
        assert_eq!(losers.len(), 99);
        assert!(losers.iter().all(|fp| *fp == fingerprint(winner)));
    }
}

/// Two instances of an application behind the layer, each with its own pool on one MariaDB
/// table, take 40 keys, each sent 10 times at once spread over both instances: each key's
/// handler runs exactly once, every answer is its body or a `409`, and a retry of every key
/// replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_app_instances_run_each_key_once_over_http() {
    let table = MySqlTable::new();
    let (Some(a), Some(b)) = (table.store().await, table.store().await) else {
        return;
    };
    a.migrate().await.expect("migrate");
    let runs: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let total = Arc::new(AtomicUsize::new(0));
    let mut servers = Vec::new();
    for store in [a, b] {
        let app = Router::new()
            .route("/orders", post(count_run))
            .route_layer(IdempotencyLayer::client_keys(Arc::new(store)).namespace("two-apps"))
            .with_state((runs.clone(), total.clone()));
        servers.push(tower_idempotency_testkit::Server::start(app).await);
    }
    let urls: Vec<String> = servers.iter().map(|s| s.url("/orders")).collect();
    let client = reqwest::Client::new();
    let keys: Vec<String> = (0..40).map(|_| random_suffix()).collect();
    let mut sends = Vec::new();
    for key in &keys {
        for i in 0..10 {
            let (client, url, key) = (client.clone(), urls[i % 2].clone(), key.clone());
            sends.push(tokio::spawn(async move {
                let answer = post_order(&client, &url, &key).await;
                (key, answer)
            }));
        }
    }
    let mut bodies: HashMap<String, String> = HashMap::new();
    for send in sends {
        let (key, (status, _, body)) = send.await.expect("task");
        match status {
            201 => {
                let first = bodies.entry(key).or_insert_with(|| body.clone());
                assert_eq!(*first, body, "every caller gets the first body");
            }
            409 => {}
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    for key in &keys {
        let (status, replayed, body) = post_order(&client, &urls[1], key).await;
        assert_eq!((status, replayed), (201, true), "{key}");
        if let Some(first) = bodies.get(key) {
            assert_eq!(&body, first);
        }
    }
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), keys.len(), "every key ran");
    assert!(runs.values().all(|&n| n == 1), "a key ran twice: {runs:?}");
    assert_eq!(total.load(Ordering::SeqCst), keys.len());
}

type Runs = (Arc<Mutex<HashMap<String, usize>>>, Arc<AtomicUsize>);

async fn count_run(
    State((runs, total)): State<Runs>,
    headers: http::HeaderMap,
) -> (http::StatusCode, String) {
    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
    *runs.lock().unwrap().entry(key.clone()).or_default() += 1;
    let n = total.fetch_add(1, Ordering::SeqCst);
    (http::StatusCode::CREATED, format!("order {n} for {key}"))
}

#[tokio::test]
async fn invalid_table_names_are_rejected() {
    // No database needed: a lazy pool never connects.
    let pool = sqlx::MySqlPool::connect_lazy(&mysql_url()).expect("url");
    for bad in ["x; DROP TABLE y", "1abc", "", "a`b", "db.t", "t\u{0}"] {
        assert_eq!(
            MySqlStore::new(pool.clone(), bad).err(),
            Some(ConfigError::InvalidTableName(bad.to_owned())),
            "{bad:?}"
        );
    }
    assert!(matches!(
        MySqlStore::new(pool, &"t".repeat(49)),
        Err(ConfigError::TableNameTooLong { len: 49, limit: 48 })
    ));
}

#[tokio::test]
async fn unreachable_database_is_unavailable() {
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy("mysql://root@127.0.0.1:1/test")
        .expect("url");
    let store = MySqlStore::new(pool, "idem").expect("name");
    assert_claim_unavailable(&store, "down").await;
}

/// A claim inside an open transaction holds the row: a concurrent duplicate waits for the
/// commit and then replays the committed result instead of running the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_waits_for_the_claiming_transaction() {
    let Some(guarded) = mysql_store().await else {
        return;
    };
    let store = guarded.store.clone();
    let key = random_key("tx-wait");
    let lease = Duration::from_secs(60);
    let mut tx = store.pool().begin().await.expect("begin");
    let token = token_of(
        store
            .claim_in(
                &mut tx,
                &key,
                &fingerprint(1),
                FencingToken::random().unwrap(),
                lease,
            )
            .await
            .expect("claim_in"),
    );
    let waiting = spawn_claim(store.clone(), &key, lease);
    until_one_waits_on_a_lock(&store).await;
    assert!(!waiting.is_finished(), "the duplicate waits for the row");
    let done = store
        .complete_in(&mut tx, &key, token, &response("paid"), lease)
        .await
        .expect("complete_in");
    assert_eq!(done, Ownership::Current);
    tx.commit().await.expect("commit");
    match waiting.await.unwrap().expect("claim") {
        ClaimOutcome::Completed { record, .. } => assert_eq!(&record.response.body[..], b"paid"),
        other => panic!("expected the committed result, got {other:?}"),
    }
}

/// A claim that waits for a row lock longer than the lock wait timeout of `connect`
/// (`innodb_lock_wait_timeout`, here lowered for the session) is `Unavailable` (a `503`), and
/// the key still belongs to the transaction that holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_wait_timeout_is_unavailable() {
    let Some(guarded) = mysql_store().await else {
        return;
    };
    let store = guarded.store.clone();
    let key = random_key("lock-timeout");
    let lease = Duration::from_secs(60);
    let mut tx = store.pool().begin().await.expect("begin");
    token_of(
        store
            .claim_in(
                &mut tx,
                &key,
                &fingerprint(1),
                FencingToken::random().unwrap(),
                lease,
            )
            .await
            .expect("claim_in"),
    );
    // A second connection whose lock waits end after a second.
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::Executor::execute(conn, "SET SESSION innodb_lock_wait_timeout = 1")
                    .await
                    .map(drop)
            })
        })
        .connect(&mysql_url())
        .await
        .expect("pool");
    let impatient = MySqlStore::new(pool, store.table()).expect("table");
    let result = impatient
        .claim(
            &key,
            &fingerprint(2),
            FencingToken::random().unwrap(),
            lease,
        )
        .await;
    assert!(
        matches!(result, Err(StoreError::Unavailable(_))),
        "{result:?}"
    );
    tx.rollback().await.expect("rollback");
}

/// A key longer than the table's `VARBINARY(1024)` primary key is refused before any statement
/// runs (a server not in strict mode would cut it short and make two keys one).
#[tokio::test]
async fn keys_longer_than_the_column_are_refused() {
    let Some(guarded) = mysql_store().await else {
        return;
    };
    let store = &guarded.store;
    let long = "k".repeat(1025);
    let before = store.statements_executed();
    let result = store
        .claim(
            &long,
            &fingerprint(1),
            FencingToken::random().unwrap(),
            Duration::from_secs(5),
        )
        .await;
    assert!(matches!(result, Err(StoreError::Backend(_))), "{result:?}");
    assert_eq!(store.statements_executed(), before);
    let fits = "k".repeat(1024);
    let outcome = claim(&**store, &fits, 1, Duration::from_secs(5)).await;
    assert!(
        matches!(outcome, ClaimOutcome::Claimed { .. }),
        "{outcome:?}"
    );
}

/// The schema is one statement that creates the table and its index.
#[test]
fn schema_names_the_table_and_its_index() {
    let sql = mysql_schema_sql("t1");
    assert!(sql.contains("CREATE TABLE IF NOT EXISTS `t1`"));
    assert!(sql.contains("INDEX `t1_expires_at_idx` (expires_at)"));
    assert!(!sql.contains(';'), "one statement");
}

/// Polls, through `store`'s pool, until a statement waits for a row lock.
async fn until_one_waits_on_a_lock(store: &MySqlStore) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'",
        )
        .fetch_one(store.pool())
        .await
        .expect("innodb_trx");
        if n > 0 {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "nothing blocked");
        tokio::task::yield_now().await;
    }
}

/// A record within the store's limit but over the server's `max_allowed_packet` is
/// `RecordTooLarge`, which the layer answers by completing the key without its body, and the key
/// can then be completed that way on the same store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_over_the_servers_packet_limit_is_too_large() {
    let table = MySqlTable::new();
    let Some(store) = table.store().await else {
        return;
    };
    let packet: u64 = sqlx::query_scalar("SELECT @@max_allowed_packet")
        .fetch_one(store.pool())
        .await
        .expect("max_allowed_packet");
    let size = usize::try_from(packet).expect("packet size") + 1024;
    let store = store.with_max_record_bytes(size * 2);
    store.migrate().await.expect("migrate");
    let key = random_key("packet");
    let token = token_of(claim(&store, &key, 1, Duration::from_secs(30)).await);
    let mut large = response("x");
    large.body = bytes::Bytes::from(vec![b'x'; size]);
    let result = store
        .complete(&key, token, &large, Duration::from_secs(60))
        .await;
    assert!(
        matches!(result, Err(StoreError::RecordTooLarge { .. })),
        "{result:?}"
    );
    let mut without = response("");
    without.body_omitted = true;
    let done = store
        .complete(&key, token, &without, Duration::from_secs(60))
        .await
        .expect("complete without body");
    assert_eq!(done, Ownership::Current);
}
