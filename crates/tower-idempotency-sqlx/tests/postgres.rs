//! Postgres store: the conformance suite, the tests every SQL store passes, and the store's own
//! guarantees, each test in its own table. Skips (saying so on stderr) when Postgres is unreachable, unless CI=true.

mod common;

use std::{sync::Arc, time::Duration};

use common::*;
use tower_idempotency_core::{ClaimOutcome, IdempotencyLayer, Ownership, Store, StoreError};
use tower_idempotency_sqlx::{postgres_schema_sql, ConfigError, PostgresStore};

mod suite {
    tower_idempotency_core::store_conformance_tests!(crate::common::pg_store());
}

/// The same suite through a `LocalReplayCache`: the wrapper must not weaken any rule.
mod suite_with_local_cache {
    tower_idempotency_core::store_conformance_tests!(async {
        crate::common::pg_store()
            .await
            .map(tower_idempotency_core::LocalReplayCache::new)
    });
}

sql_store_tests!(crate::common::PgTable);

/// The claim statement is the only arbiter even across pools and on a key whose previous record
/// expired: 100 claimers over two pools, repeated, always exactly one winner, and every loser
/// sees the winner's fingerprint from the same statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_claimers_over_two_pools_one_winner() {
    let table = PgTable::new();
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

#[tokio::test]
async fn invalid_table_names_are_rejected() {
    // No database needed: a lazy pool never connects.
    let pool = sqlx::PgPool::connect_lazy(&pg_url()).expect("url");
    for bad in ["x; DROP TABLE y", "1abc", "", "a\"b", "public.t", "t\u{0}"] {
        assert_eq!(
            PostgresStore::new(pool.clone(), bad).err(),
            Some(ConfigError::InvalidTableName(bad.to_owned())),
            "{bad:?}"
        );
    }
    assert!(matches!(
        PostgresStore::new(pool, &"t".repeat(49)),
        Err(ConfigError::TableNameTooLong { len: 49, limit: 48 })
    ));
}

#[tokio::test]
async fn unreachable_database_is_unavailable() {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy("postgres://postgres@127.0.0.1:1/test")
        .expect("url");
    let store = PostgresStore::new(pool, "idem").expect("name");
    assert_claim_unavailable(&store, "down").await;
}

/// A claim inside an open transaction holds the row: a concurrent duplicate waits for the
/// commit and then replays the committed result instead of running the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_waits_for_the_claiming_transaction() {
    let Some(guarded) = pg_store().await else {
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
                tower_idempotency_core::FencingToken::random().unwrap(),
                lease,
            )
            .await
            .expect("claim"),
    );
    let mut duplicate = tokio::spawn({
        let (store, key) = (store.clone(), key.clone());
        async move { claim(&*store, &key, 1, lease).await }
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut duplicate)
            .await
            .is_err(),
        "the duplicate must wait for the claiming transaction"
    );
    let done = store
        .complete_in(&mut tx, &key, token, &response("committed"), lease)
        .await;
    assert_eq!(done.expect("complete"), Ownership::Current);
    tx.commit().await.expect("commit");
    match duplicate.await.expect("task") {
        ClaimOutcome::Completed { record, .. } => assert_eq!(record.response.body, "committed"),
        other => panic!("expected the committed record, got {other:?}"),
    }
}

/// Replays and in-flight duplicates read the row and write nothing: the row version (`xmin`)
/// stays the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_and_duplicates_do_not_write() {
    let Some(guarded) = pg_store().await else {
        return;
    };
    let store = &guarded.store;
    let key = random_key("readonly");
    let lease = Duration::from_secs(60);
    let version = |key: String| async move {
        let sql = format!(
            r#"SELECT xmin::text FROM "{}" WHERE key = $1"#,
            store.table()
        );
        sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(&*sql))
            .bind(key)
            .fetch_one(store.pool())
            .await
            .expect("xmin")
    };
    let token = token_of(claim(store, &key, 1, lease).await);
    let in_flight = version(key.clone()).await;
    for _ in 0..3 {
        let outcome = claim(store, &key, 2, lease).await;
        assert!(
            matches!(outcome, ClaimOutcome::InFlight { .. }),
            "{outcome:?}"
        );
    }
    assert_eq!(version(key.clone()).await, in_flight);
    let done = store.complete(&key, token, &response("x"), lease).await;
    assert_eq!(done.expect("complete"), Ownership::Current);
    let completed = version(key.clone()).await;
    assert_ne!(completed, in_flight);
    for _ in 0..3 {
        let outcome = claim(store, &key, 1, lease).await;
        assert!(
            matches!(outcome, ClaimOutcome::Completed { .. }),
            "{outcome:?}"
        );
    }
    assert_eq!(version(key).await, completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations() {
    let table = PgTable::new();
    let Some(store) = table.store().await else {
        return;
    };
    let store = Arc::new(store);
    let migrations: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.migrate().await })
        })
        .collect();
    for migration in migrations {
        migration.await.expect("task").expect("concurrent migrate");
    }
    let key = random_key("migrated");
    let token = token_of(claim(&*store, &key, 1, Duration::from_secs(60)).await);
    assert_eq!(
        store.release(&key, token).await.expect("release"),
        Ownership::Current
    );
}

/// A lossy failover rolls back a claim together with anything the database drew for it (a
/// sequence's value included). The next claim must still get a token the lost holder does not
/// have, or the lost holder, still running, would complete the new holder's row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_stay_unique_after_a_lossy_failover() {
    let table = PgTable::new();
    let Some(store) = table.store().await else {
        return;
    };
    store.migrate().await.expect("migrate");
    let lease = Duration::from_secs(60);
    let key = random_key("failover");
    let sequence = format!(r#""{}_token_seq""#, store.table());
    let has_sequence = |pool: sqlx::PgPool| {
        let sequence = sequence.clone();
        async move {
            sqlx::query_scalar::<_, bool>("SELECT to_regclass($1) IS NOT NULL")
                .bind(sequence)
                .fetch_one(&pool)
                .await
                .expect("to_regclass")
        }
    };
    // Where a sequence exists, remember its position before the claim, to rewind it.
    let position: Option<(i64, bool)> = if has_sequence(store.pool().clone()).await {
        Some(
            sqlx::query_as(sqlx::AssertSqlSafe(&*format!(
                "SELECT last_value, is_called FROM {sequence}"
            )))
            .fetch_one(store.pool())
            .await
            .expect("last_value"),
        )
    } else {
        None
    };
    let lost = token_of(claim(&store, &key, 1, lease).await);
    // The failover: the promoted replica never saw the claim, nor the sequence advance.
    sqlx::query(sqlx::AssertSqlSafe(&*format!(
        r#"DELETE FROM "{}" WHERE key = $1"#,
        store.table()
    )))
    .bind(&key)
    .execute(store.pool())
    .await
    .expect("lose the claim");
    if let Some((value, called)) = position {
        sqlx::query(sqlx::AssertSqlSafe(&*format!(
            "SELECT setval('{sequence}', $1, $2)"
        )))
        .bind(value)
        .bind(called)
        .execute(store.pool())
        .await
        .expect("rewind the sequence");
    }
    let current = token_of(claim(&store, &key, 1, lease).await);
    assert_ne!(
        lost, current,
        "the new holder must not share the lost holder's token"
    );
    let stale = store.complete(&key, lost, &response("stale"), lease).await;
    assert_eq!(stale.expect("complete"), Ownership::Stale);
    let done = store
        .complete(&key, current, &response("fresh"), lease)
        .await;
    assert_eq!(done.expect("complete"), Ownership::Current);
}

#[test]
fn schema_sql_names_the_table() {
    let sql = postgres_schema_sql("orders_idem");
    assert!(sql.contains(r#"CREATE TABLE IF NOT EXISTS "orders_idem""#));
    assert!(!sql.contains("SEQUENCE"), "tokens need no sequence");
}

/// A store on a pool of its own through the round-trip counting proxy, with `lanes` lanes.
async fn counted_store(
    table: &PgTable,
    proxy: &PgRoundTrips,
    lanes: usize,
) -> Option<Arc<PostgresStore>> {
    pg_pool().await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&proxy.url)
        .await
        .expect("connect through the proxy");
    let store = PostgresStore::new(pool, &table.name)
        .expect("valid table name")
        .with_connection_lanes(lanes);
    store.migrate().await.expect("migrate");
    Some(Arc::new(store))
}

/// Counted on the wire, not by the store: a first request is two round trips and a replay
/// one. Through the pool (no lanes) sqlx pings on hand-out and on return, which the same proxy
/// sees, so the count is not the statement count in disguise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_one_round_trip_on_the_wire() {
    let table = PgTable::new();
    let proxy = PgRoundTrips::start().await;
    let Some(store) = counted_store(&table, &proxy, 1).await else {
        return;
    };
    let server = serve(IdempotencyLayer::client_keys(store.clone())).await;
    let client = reqwest::Client::new();
    // The lane's first statement takes its connection from the pool (and the pool pings it),
    // and each statement is prepared once per connection (one more round trip, the first time):
    // a first request and two replays prepare the claim, the completion and the read.
    let warm = random_suffix();
    for _ in 0..3 {
        let (status, _, _) = post_order(&client, &server.url, &warm).await;
        assert_eq!(status, 201);
    }

    let key = random_suffix();
    let before = proxy.round_trips();
    let (status, replayed, _) = post_order(&client, &server.url, &key).await;
    assert_eq!((status, replayed), (201, false));
    assert_eq!(proxy.round_trips() - before, 2, "claim + complete");
    let before = proxy.round_trips();
    let (status, replayed, _) = post_order(&client, &server.url, &key).await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(proxy.round_trips() - before, 1, "one statement replays");

    let pooled = counted_store(&table, &proxy, 0).await.expect("second pool");
    let _ = pooled.get(&key).await.expect("get");
    let before = proxy.round_trips();
    let _ = pooled.get(&key).await.expect("get");
    // The return ping runs on a task of sqlx's after the call; wait for it to be counted.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while proxy.round_trips() - before < 3 && tokio::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
    // At least: ping, statement, ping (plus one to prepare the statement on a connection that
    // has not run it yet).
    assert!(
        proxy.round_trips() - before >= 3,
        "through the pool: {} round trips",
        proxy.round_trips() - before
    );
}

/// A claim of `key` through `store` that Postgres blocks: `owner` holds an uncommitted claim
/// of the same key in the returned transaction (keep it open). Returns once Postgres reports
/// the claim waiting on that lock.
async fn blocked_claim(
    owner: &PostgresStore,
    store: Arc<PostgresStore>,
    key: &str,
) -> (
    sqlx::Transaction<'static, sqlx::Postgres>,
    tokio::task::JoinHandle<Result<ClaimOutcome, StoreError>>,
) {
    let mut blocker = owner.pool().begin().await.expect("begin");
    let held = owner
        .claim_in(
            &mut blocker,
            key,
            &fingerprint(1),
            tower_idempotency_core::FencingToken::random().unwrap(),
            Duration::from_secs(60),
        )
        .await
        .expect("claim in the blocking transaction");
    assert!(matches!(held, ClaimOutcome::Claimed { .. }), "{held:?}");
    let table = store.table().to_owned();
    let blocked = spawn_claim(store, key, Duration::from_secs(60));
    until_one_waits_on_a_lock(owner, &table).await;
    (blocker, blocked)
}

/// A claim cancelled while Postgres blocks it (another transaction holds an uncommitted row of
/// the same key) must not hold up the lane: its connection goes back to the pool, and the next
/// call on the only lane runs on another connection at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_statement_gives_its_connection_back() {
    let Some(guarded) = pg_store().await else {
        return;
    };
    let store = Arc::new(
        PostgresStore::new(guarded.store.pool().clone(), guarded.store.table())
            .expect("valid table name")
            .with_connection_lanes(1),
    );
    let (blocker, blocked) =
        blocked_claim(&guarded.store, store.clone(), &random_key("blocked")).await;
    blocked.abort();
    assert!(blocked.await.expect_err("aborted").is_cancelled());

    let other = random_key("free");
    let free = tokio::time::timeout(
        Duration::from_secs(10),
        store.claim(
            &other,
            &fingerprint(3),
            tower_idempotency_core::FencingToken::random().unwrap(),
            Duration::from_secs(60),
        ),
    )
    .await
    .expect("the lane must not wait for the cancelled statement")
    .expect("claim");
    assert!(matches!(free, ClaimOutcome::Claimed { .. }), "{free:?}");
    blocker.rollback().await.expect("rollback");
}

/// A lane whose connection died (the backend was terminated) fails at most its one statement,
/// as `Unavailable`, and the next call runs on a fresh connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lane_connection_is_replaced() {
    let Some(guarded) = pg_store().await else {
        return;
    };
    let name = format!("lane-{}", random_suffix());
    let options = pg_url()
        .parse::<sqlx::postgres::PgConnectOptions>()
        .expect("url")
        .application_name(&name);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .expect("pool");
    let store = PostgresStore::new(pool, guarded.store.table())
        .expect("valid table name")
        .with_connection_lanes(1);
    let key = random_key("dead");
    assert!(store.get(&key).await.expect("get").is_none());

    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&name)
    .fetch_all(guarded.store.pool())
    .await
    .expect("terminate");
    assert!(
        !killed.is_empty() && killed.iter().all(|k| *k),
        "{killed:?}"
    );

    match store.get(&key).await {
        Ok(None) => {}
        Err(StoreError::Unavailable(_)) => {
            let again = store.get(&key).await;
            assert!(matches!(again, Ok(None)), "{again:?}");
        }
        other => panic!("expected Ok(None) or Unavailable, got {other:?}"),
    }
}

/// Waiting for a lane is bounded like a pool acquire: with the only lane stuck behind another
/// transaction's row lock, the next call fails `Unavailable` after the pool's acquire timeout
/// instead of waiting for the lock. Lanes are capped at all but one of the pool's connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_a_lane_times_out_like_the_pool() {
    let Some(guarded) = pg_store().await else {
        return;
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_millis(300))
        .connect(&pg_url())
        .await
        .expect("pool");
    let store = Arc::new(
        PostgresStore::new(pool, guarded.store.table())
            .expect("valid table name")
            .with_connection_lanes(5),
    );
    assert_eq!(store.connection_lanes(), 1, "capped at max_connections - 1");

    let (blocker, stuck) = blocked_claim(&guarded.store, store.clone(), &random_key("stuck")).await;
    let next = tokio::time::timeout(Duration::from_secs(10), store.get(&random_key("queued")))
        .await
        .expect("waiting for a lane must give up after the acquire timeout");
    assert!(matches!(next, Err(StoreError::Unavailable(_))), "{next:?}");
    blocker.rollback().await.expect("rollback");
    let claimed = stuck
        .await
        .expect("join")
        .expect("claim after the rollback");
    assert!(
        matches!(claimed, ClaimOutcome::Claimed { .. }),
        "{claimed:?}"
    );
}

/// `migrate()` at every start must not queue behind a business transaction that holds a claim
/// (`claim_in`): a `CREATE INDEX` would, and every store call would queue behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_on_a_live_table_does_not_wait_for_open_transactions() {
    let Some(guarded) = pg_store().await else {
        return;
    };
    let store = guarded.store.clone();
    let mut tx = store.pool().begin().await.expect("begin");
    token_of(
        store
            .claim_in(
                &mut tx,
                &random_key("txn"),
                &fingerprint(1),
                tower_idempotency_core::FencingToken::random().unwrap(),
                Duration::from_secs(60),
            )
            .await
            .expect("claim_in"),
    );
    let migrated = tokio::time::timeout(Duration::from_secs(5), store.migrate()).await;
    tx.rollback().await.expect("rollback");
    assert!(
        matches!(migrated, Ok(Ok(()))),
        "migrate waited for an open claim_in transaction: {migrated:?}"
    );
}

/// `migrate()` looks for the purge index beside its own table: a same-named table and index in
/// another schema on the search path must not make it skip its own index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_the_index_beside_its_own_table() {
    let Some(admin) = pg_pool().await else {
        return;
    };
    let suffix = random_suffix();
    let (old, new) = (format!("mig_old_{suffix}"), format!("mig_new_{suffix}"));
    for schema in [&old, &new] {
        sqlx::query(sqlx::AssertSqlSafe(&*format!(
            r#"CREATE SCHEMA "{schema}""#
        )))
        .execute(&admin)
        .await
        .expect("create schema");
    }
    let pool_on = |search_path: String| async move {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .after_connect(move |conn, _| {
                let search_path = search_path.clone();
                Box::pin(async move {
                    sqlx::query(sqlx::AssertSqlSafe(&*format!(
                        "SET search_path TO {search_path}"
                    )))
                    .execute(conn)
                    .await
                    .map(|_| ())
                })
            })
            .connect(&pg_url())
            .await
            .expect("pool")
    };
    let old_pool = pool_on(format!(r#""{old}""#)).await;
    let new_pool = pool_on(format!(r#""{new}", "{old}""#)).await;
    let outcome = async {
        PostgresStore::new(old_pool.clone(), "idem")
            .expect("table name")
            .with_connection_lanes(0)
            .migrate()
            .await?;
        PostgresStore::new(new_pool.clone(), "idem")
            .expect("table name")
            .with_connection_lanes(0)
            .migrate()
            .await?;
        sqlx::query_scalar::<_, String>(
            "SELECT schemaname::text FROM pg_indexes WHERE indexname = 'idem_expires_at_idx' \
             AND schemaname IN ($1, $2) ORDER BY 1",
        )
        .bind(&new)
        .bind(&old)
        .fetch_all(&admin)
        .await
    }
    .await;
    old_pool.close().await;
    new_pool.close().await;
    for schema in [&old, &new] {
        sqlx::query(sqlx::AssertSqlSafe(&*format!(
            r#"DROP SCHEMA "{schema}" CASCADE"#
        )))
        .execute(&admin)
        .await
        .expect("drop schema");
    }
    let mut expected = vec![new.clone(), old.clone()];
    expected.sort();
    assert_eq!(outcome.expect("migrate and look"), expected);
}

/// `ping_when_idle` tests a connection before lending it only when it sat idle past its window:
/// with a window of zero the pool finds that the database dropped its connection and lends a new
/// one; within the window the connection is lent untested (the round trip sqlx's default pays at
/// every borrow), so the caller's own statement meets the dropped connection.
#[tokio::test]
async fn ping_when_idle_tests_only_a_connection_idle_past_its_window() {
    let Some(admin) = pg_pool().await else {
        return;
    };
    for (window, tested) in [(Duration::ZERO, true), (Duration::from_secs(3600), false)] {
        let options = sqlx::postgres::PgPoolOptions::new().max_connections(1);
        let pool = tower_idempotency_sqlx::ping_when_idle(options, window)
            .connect(&pg_url())
            .await
            .expect("a pool");
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .expect("its connection's backend");
        // The connection goes back to the pool in a task of its own, once sqlx has tested it
        // there: ended before that test, it would be replaced before the next borrow.
        while pool.num_idle() < 1 {
            tokio::task::yield_now().await;
        }
        // Waits up to 10 s for the backend to exit.
        let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 10000)")
            .bind(pid)
            .fetch_one(&admin)
            .await
            .expect("terminate the pool's connection");
        assert!(ended, "the backend {pid} exited");
        let answered = sqlx::query_scalar::<_, i32>("SELECT 1")
            .fetch_one(&pool)
            .await;
        assert_eq!(
            answered.is_ok(),
            tested,
            "window {window:?}: {answered:?} (tested before lending: {tested})"
        );
        pool.close().await;
    }
}
