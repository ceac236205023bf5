//! SQLite store: the conformance suite, the tests every SQL store passes, and the store's own
//! guarantees, on temp files.

mod common;

use std::time::Duration;

use common::*;
use tower_idempotency_core::{ClaimOutcome, Ownership, Store};
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

/// An in-memory database (`sqlite::memory:`, one connection) holds keys like a file: its first
/// claim is `Claimed`, and once completed a second claim replays the response. (sqlx names an
/// in-memory database `file:sqlx-in-memory-N`, which its `to_url_lossy` cannot render: the
/// store must not ask it.)
#[tokio::test]
async fn an_in_memory_database_holds_keys() {
    let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
    store.migrate().await.unwrap();
    let key = random_key("memory");
    let first = claim(&store, &key, 1, Duration::from_secs(60)).await;
    assert!(matches!(first, ClaimOutcome::Claimed { .. }), "{first:?}");
    let done = random_key("memory_done");
    completed(&store, &done, &response("done")).await;
    let replay = claim(&store, &done, 2, Duration::from_secs(60)).await;
    assert!(
        matches!(replay, ClaimOutcome::Completed { .. }),
        "{replay:?}"
    );
}

/// A closed pool answers nothing: not a new key, and not a replay of a key the store has seen
/// (which it would otherwise read inline, on a connection of its own).
#[tokio::test]
async fn closed_pool_is_unavailable() {
    let guarded = sqlite_store().await;
    let store = &guarded.store;
    let seen = random_key("seen");
    completed(&**store, &seen, &response("done")).await;
    let replay = claim(&**store, &seen, 1, Duration::from_secs(1)).await;
    assert!(
        matches!(replay, ClaimOutcome::Completed { .. }),
        "{replay:?}"
    );
    store.pool().close().await;
    assert_claim_unavailable(&**store, "closed").await;
    assert_key_unavailable(&**store, &seen).await;
}

/// A replay of a key the store has seen is read on the calling task, not on a lane or the
/// writer: with a claim on the writer waiting for another connection's write lock, the replay
/// is answered, in one statement, while that claim still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_read_inline_while_the_lanes_are_busy() {
    let file = SqliteFile::new();
    let store = file.store("idem").await.with_connection_lanes(1);
    store.migrate().await.expect("migrate");
    let guarded = Guarded::new(std::sync::Arc::new(store), file);
    let key = random_key("inline");
    let lease = Duration::from_secs(30);
    completed(&*guarded.store, &key, &response("done")).await;

    let held = WriterHeldUp::hold(guarded, lease).await;
    held.until_queued(0).await;
    let counted = held.store.statements_executed();
    let replay = claim(&*held.store, &key, 1, lease).await;
    let statements = held.store.statements_executed() - counted;
    assert!(
        !held.waiting.is_finished(),
        "the replay waited until the claim behind the lock was answered"
    );
    match replay {
        ClaimOutcome::Completed { record, .. } => assert_eq!(&record.response.body[..], b"done"),
        other => panic!("expected a replay, got {other:?}"),
    }
    assert_eq!(statements, 1);
    let (claimed, _guarded) = held.release().await;
    let claimed = claimed.expect("claim");
    assert!(
        matches!(claimed, ClaimOutcome::Claimed { .. }),
        "{claimed:?}"
    );
}

/// A record whose body is too large to read on the calling task is read on a reader lane, whole.
#[tokio::test]
async fn a_large_replay_is_read_whole() {
    let guarded = sqlite_store().await;
    let store = &guarded.store;
    let key = random_key("large");
    let body: bytes::Bytes = (0..200 * 1024).map(|i| (i % 251) as u8).collect();
    let mut large = response("");
    large.body = body.clone();
    completed(&**store, &key, &large).await;
    for _ in 0..2 {
        match claim(&**store, &key, 1, Duration::from_secs(30)).await {
            ClaimOutcome::Completed { record, .. } => assert!(record.response.body == body),
            other => panic!("expected a replay, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn schema_sql_names_the_table() {
    let sql = sqlite_schema_sql("orders_idem");
    assert!(sql.contains(r#"CREATE TABLE IF NOT EXISTS "orders_idem""#));
    assert!(sql.contains(r#""orders_idem_expires_at_idx""#));
}

/// SQLite sends no notices of settled keys: its waiters re-claim on their bounded poll, a read
/// on a reader lane (Postgres's notices: `tests/postgres_notices.rs`).
#[tokio::test]
async fn sqlite_sends_no_notices() {
    let file = SqliteFile::new();
    assert!(file.store("idem").await.settlements().is_none());
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
    // Long enough that the claim right after the wait runs inside it on a loaded machine.
    let lease = Duration::from_secs(2);
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
    // Time passing is the point: hold the write lock for longer than the renewed lease.
    tokio::time::sleep(lease * 3 / 2).await;
    other_writer.rollback().await.expect("rollback");
    assert_eq!(renewing.await.unwrap().expect("renew"), Ownership::Current);
    let next = claim(&*store, &key, 3, lease).await;
    assert!(
        matches!(next, ClaimOutcome::InFlight { .. }),
        "the renewed lease had already expired: {next:?}"
    );
}

/// A replay reads on a reader lane and never takes the write lock: with another connection
/// holding it (`BEGIN IMMEDIATE`), 32 concurrent replays over HTTP are all answered before the
/// lock is released. Were a replay a write, each would wait in SQLite's busy handler until
/// the busy timeout and fail with `503`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_run_beside_a_held_write_lock() {
    let guarded = sqlite_store().await;
    let store = guarded.store.clone();
    let server = serve(tower_idempotency_core::IdempotencyLayer::client_keys(
        store.clone(),
    ))
    .await;
    let client = reqwest::Client::new();
    let key = random_suffix();
    let (status, replayed, first) = post_order(&client, &server.url, &key).await;
    assert_eq!((status, replayed), (201, false));

    let writer = store
        .pool()
        .begin_with("BEGIN IMMEDIATE")
        .await
        .expect("begin");
    let replays: Vec<_> = (0..32)
        .map(|_| {
            let (client, url, key) = (client.clone(), server.url.clone(), key.clone());
            tokio::spawn(async move { post_order(&client, &url, &key).await })
        })
        .collect();
    for replay in replays {
        let (status, replayed, body) = replay.await.expect("task");
        assert_eq!((status, replayed), (201, true));
        assert_eq!(body, first);
    }
    writer.rollback().await.expect("rollback");
    assert_eq!(
        server.executions.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

/// A pool of 8 connections on `file` in WAL mode whose busy handler waits up to `busy_timeout`
/// for a lock.
async fn wal_pool(file: &SqliteFile, busy_timeout: Duration) -> sqlx::SqlitePool {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    use std::str::FromStr;
    let options = SqliteConnectOptions::from_str(&file.url())
        .expect("url")
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(busy_timeout);
    SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .expect("open")
}

/// Writes are serialised in the process on the store's writer, never by SQLite's busy handler:
/// on a pool whose busy timeout is zero (a write that meets another fails at once with
/// `SQLITE_BUSY`, answered `503`), 64 first requests over HTTP, 32 at a time, all run once,
/// and their 64 replays, all at once, are all replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_need_no_busy_handler() {
    let file = SqliteFile::new();
    let pool = wal_pool(&file, Duration::ZERO).await;
    let store = std::sync::Arc::new(SqliteStore::new(pool, "idem").expect("table"));
    store.migrate().await.expect("migrate");
    assert_eq!(store.connection_lanes(), 4, "one writer and three readers");
    let server = serve(tower_idempotency_core::IdempotencyLayer::client_keys(
        store.clone(),
    ))
    .await;
    let client = reqwest::Client::new();
    let keys: Vec<String> = (0..64)
        .map(|i| format!("{}-{i}", random_suffix()))
        .collect();
    let limit = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
    let send = |key: &String, limit: Option<std::sync::Arc<tokio::sync::Semaphore>>| {
        let (client, url, key) = (client.clone(), server.url.clone(), key.clone());
        tokio::spawn(async move {
            let _permit = match &limit {
                Some(limit) => Some(limit.acquire().await.expect("open")),
                None => None,
            };
            post_order(&client, &url, &key).await
        })
    };
    let first: Vec<_> = keys.iter().map(|k| send(k, Some(limit.clone()))).collect();
    for request in first {
        let (status, replayed, _) = request.await.expect("task");
        assert_eq!((status, replayed), (201, false));
    }
    let replays: Vec<_> = keys.iter().map(|k| send(k, None)).collect();
    for replay in replays {
        let (status, replayed, _) = replay.await.expect("task");
        assert_eq!((status, replayed), (201, true));
    }
    assert_eq!(
        server.executions.load(std::sync::atomic::Ordering::SeqCst),
        64
    );
}

type Claimed = tokio::task::JoinHandle<Result<ClaimOutcome, tower_idempotency_core::StoreError>>;
type Guard = Guarded<std::sync::Arc<SqliteStore>, SqliteFile>;

/// A store whose writer is held up: another connection holds the write lock
/// (`BEGIN IMMEDIATE`) and a first claim, of `waiting_key`, waits for it on the writer, so every
/// write after it queues.
struct WriterHeldUp {
    store: std::sync::Arc<SqliteStore>,
    lock: sqlx::Transaction<'static, sqlx::Sqlite>,
    waiting_key: String,
    waiting: Claimed,
    statements_before: u64,
    guarded: Guard,
}

impl WriterHeldUp {
    /// Holds up the writer of `guarded`'s store.
    async fn hold(guarded: Guard, lease: Duration) -> Self {
        let store = guarded.store.clone();
        // Starts the writer, so that each claim below is queued as soon as it counts its
        // statement.
        claim(&*store, &random_key("first"), 1, lease).await;
        let lock = store
            .pool()
            .begin_with("BEGIN IMMEDIATE")
            .await
            .expect("begin");
        let statements_before = store.statements_executed();
        let waiting_key = random_key("waiting");
        let waiting = spawn_claim(store.clone(), &waiting_key, lease);
        Self {
            store,
            lock,
            waiting_key,
            waiting,
            statements_before,
            guarded,
        }
    }

    /// Returns once `writes` more writes than the waiting claim have counted their statements.
    /// On a runtime of one thread a claim has then reached the writer's queue; on more, it
    /// reaches it moments later.
    async fn until_queued(&self, writes: usize) {
        while self.store.statements_executed() < self.statements_before + 1 + writes as u64 {
            tokio::task::yield_now().await;
        }
    }

    /// Releases the write lock and checks that the waiting claim answered as it was stored.
    /// Returns what the waiting claim answered, and the store's guard, which removes its file
    /// when dropped.
    async fn release(
        self,
    ) -> (
        Result<ClaimOutcome, tower_idempotency_core::StoreError>,
        Guard,
    ) {
        self.lock.rollback().await.expect("rollback");
        let waited = self.waiting.await.expect("task");
        let stored = self.store.get(&self.waiting_key).await.expect("get");
        assert_eq!(waited.is_ok(), stored.is_some(), "{waited:?}");
        (waited, self.guarded)
    }
}

/// Writes that queue up while the writer waits share one transaction (group commit), and a
/// write that fails there fails alone: six claims queue behind the held-up writer's first. Of
/// them, those of keys named `abort-*` and `rollback-*` meet a trigger that raises `ABORT`
/// (SQLite undoes that statement) or `ROLLBACK` (SQLite undoes the whole transaction). Returns
/// each queued key and whether it was stored, which it checks against what its claim answered.
async fn queued_claims_behind_the_write_lock(failing: &str) -> Vec<(String, bool)> {
    let guarded = sqlite_store().await;
    let store = guarded.store.clone();
    for action in ["ABORT", "ROLLBACK"] {
        let name = action.to_lowercase();
        sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
            r#"CREATE TRIGGER "{name}" BEFORE INSERT ON "{table}"
               WHEN NEW.key LIKE '{name}-%' BEGIN SELECT RAISE({action}, 'refused'); END"#,
            table = store.table()
        )))
        .execute(store.pool())
        .await
        .expect("trigger");
    }
    let lease = Duration::from_secs(30);
    let held = WriterHeldUp::hold(guarded, lease).await;
    let keys: Vec<String> = ["ok", failing, "ok", "ok", failing, "ok"]
        .iter()
        .map(|name| format!("{name}-{}", random_suffix()))
        .collect();
    let queued: Vec<_> = keys
        .iter()
        .map(|key| spawn_claim(store.clone(), key, lease))
        .collect();
    held.until_queued(keys.len()).await;
    // The writer thread takes what is queued when it gets to it: the waiting claim alone, or
    // with the first few of the six; those it took wait for the lock in one transaction, the
    // rest are in the queue when the lock is released and share the next one. Either way an
    // `ok-*` claim shares a transaction with a failing one.
    let (_, _guarded) = held.release().await;
    let mut outcomes = Vec::new();
    for (key, claim) in keys.into_iter().zip(queued) {
        let outcome = claim.await.expect("task");
        let stored = store.get(&key).await.expect("get").is_some();
        assert_eq!(
            outcome.is_ok(),
            stored,
            "{key}: answered {outcome:?}, stored {stored}"
        );
        outcomes.push((key, stored));
    }
    outcomes
}

#[tokio::test]
async fn a_write_that_fails_in_a_shared_transaction_fails_alone() {
    for (key, stored) in queued_claims_behind_the_write_lock("abort").await {
        assert_eq!(stored, key.starts_with("ok-"), "{key}");
    }
}

#[tokio::test]
async fn a_transaction_rolled_back_fails_every_write_in_it() {
    let outcomes = queued_claims_behind_the_write_lock("rollback").await;
    assert!(
        outcomes
            .iter()
            .all(|(key, stored)| !(key.starts_with("rollback-") && *stored)),
        "{outcomes:?}"
    );
    // Written one by one, every `ok-*` claim would be stored.
    assert!(
        outcomes
            .iter()
            .any(|(key, stored)| key.starts_with("ok-") && !stored),
        "no write shared a rolled-back transaction: {outcomes:?}"
    );
}

/// A claim whose caller gave up while it waited for the writer is not written.
#[tokio::test]
async fn a_write_whose_caller_gave_up_is_skipped() {
    let lease = Duration::from_secs(30);
    let held = WriterHeldUp::hold(sqlite_store().await, lease).await;
    let store = held.store.clone();
    let abandoned = random_key("abandoned");
    let gave_up = spawn_claim(store.clone(), &abandoned, lease);
    held.until_queued(1).await;
    gave_up.abort();
    assert!(gave_up.await.expect_err("aborted").is_cancelled());
    let (waited, _guarded) = held.release().await;
    waited.expect("claim");
    assert!(store.get(&abandoned).await.expect("get").is_none());
}

/// The writer's queue is bounded: with SQLite's write lock held by another connection and the
/// queue bounded at 8 writes, a claim waits on the writer and 7 more queue behind it; the other
/// requests sent meanwhile are answered at once, `503 store-unavailable` with `Retry-After`,
/// while the lock is still held. After the lock is released the queued requests run, and the
/// refused ones run on their retry; every key runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_write_queue_answers_503_with_retry_after() {
    const QUEUE: usize = 8;
    const SENT: usize = 20;
    let file = SqliteFile::new();
    // A busy timeout far longer than the test, so the write waiting for the lock waits until
    // the test releases it.
    let pool = wal_pool(&file, Duration::from_secs(600)).await;
    let store = SqliteStore::new(pool, "idem")
        .expect("table")
        .with_write_queue(QUEUE, tower_idempotency_sqlx::DEFAULT_WRITE_QUEUE_BYTES);
    store.migrate().await.expect("migrate");
    let store = std::sync::Arc::new(store);
    let guarded = Guarded::new(store.clone(), file);
    // The layer's store timeout must outlast the test's hold.
    let layer = tower_idempotency_core::IdempotencyLayer::client_keys(store.clone())
        .lease(Duration::from_secs(600))
        .store_timeout(Duration::from_secs(180));
    let server = serve(layer).await;
    let held = WriterHeldUp::hold(guarded, Duration::from_secs(600)).await;
    held.until_queued(0).await;

    let client = reqwest::Client::new();
    let keys: Vec<String> = (0..SENT)
        .map(|i| format!("queue-{i}-{}", random_suffix()))
        .collect();
    let (answered_tx, mut answered) = tokio::sync::mpsc::unbounded_channel();
    let requests: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let (client, url, key) = (client.clone(), server.url.clone(), key.clone());
            let answered = answered_tx.clone();
            tokio::spawn(async move {
                let response = client
                    .post(&url)
                    .header("idempotency-key", &key)
                    .body("{}")
                    .send()
                    .await
                    .expect("request");
                let status = response.status().as_u16();
                let retry_after = response.headers().get("retry-after").cloned();
                let _ = answered.send(i);
                (status, retry_after)
            })
        })
        .collect();
    // The waiting claim takes one place in the queue: SENT - (QUEUE - 1) requests are refused.
    let refused_count = SENT - (QUEUE - 1);
    let mut refused = Vec::new();
    for _ in 0..refused_count {
        let i = tokio::time::timeout(Duration::from_secs(30), answered.recv())
            .await
            .expect("the overflow is answered while the lock is held")
            .expect("open");
        refused.push(i);
    }
    assert!(
        !held.waiting.is_finished(),
        "the lock is still held while the overflow is answered"
    );
    let mut requests: Vec<_> = requests.into_iter().map(Some).collect();
    for &i in &refused {
        let (status, retry_after) = requests[i].take().expect("once").await.expect("task");
        assert_eq!(status, 503, "request {i}");
        assert!(retry_after.is_some(), "request {i} carries Retry-After");
    }
    assert_eq!(
        server.executions.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no handler ran while the lock was held"
    );
    assert!(
        answered.try_recv().is_err(),
        "only the overflow was answered while the lock was held"
    );

    let (waited, _guarded) = held.release().await;
    waited.expect("the waiting claim");
    for (i, request) in requests.into_iter().enumerate() {
        if let Some(request) = request {
            let (status, _) = request.await.expect("task");
            assert_eq!(status, 201, "queued request {i}");
        }
    }
    for &i in &refused {
        let (status, replayed, _) = post_order(&client, &server.url, &keys[i]).await;
        assert_eq!(
            (status, replayed),
            (201, false),
            "refused request {i}, retried"
        );
    }
    assert_eq!(
        server.executions.load(std::sync::atomic::Ordering::SeqCst),
        SENT
    );
}

/// Mixed modes on one database: another connection (a transactional handler's `BEGIN
/// IMMEDIATE`) holds the write lock for longer than a plain request's lease and than the pool's
/// busy timeout, while that request's completion waits for the lock. The completion survives the
/// wait: it keeps its place at the head of the writer's queue and lands once the lock is free,
/// before any later claim, so the retry is a replay and the handler ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_waiting_for_the_write_lock_outlives_the_lease() {
    use axum::{routing::post, Router};
    use std::sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    };
    let lease = Duration::from_millis(600);
    let file = SqliteFile::new();
    let pool = wal_pool(&file, Duration::from_millis(200)).await;
    let store = Arc::new(SqliteStore::new(pool, "idem").expect("table"));
    store.migrate().await.expect("migrate");
    let executions = Arc::new(AtomicUsize::new(0));
    let entered = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let handler = {
        let (executions, entered, gate) = (executions.clone(), entered.clone(), gate.clone());
        move || async move {
            let n = executions.fetch_add(1, Ordering::SeqCst) + 1;
            entered.notify_one();
            gate.acquire().await.expect("gate").forget();
            (axum::http::StatusCode::CREATED, format!("run {n}"))
        }
    };
    let app = Router::new().route("/orders", post(handler)).route_layer(
        tower_idempotency_core::IdempotencyLayer::client_keys(store.clone()).lease(lease),
    );
    let server = tower_idempotency_testkit::Server::start(app).await;
    let url = server.url("/orders");
    let client = reqwest::Client::new();
    let key = random_key("mixed");

    let first = {
        let (client, url, key) = (client.clone(), url.clone(), key.clone());
        tokio::spawn(async move { post_order(&client, &url, &key).await })
    };
    tokio::time::timeout(Duration::from_secs(30), entered.notified())
        .await
        .expect("the first request's handler runs");
    let lock = store
        .pool()
        .begin_with("BEGIN IMMEDIATE")
        .await
        .expect("begin");
    gate.add_permits(1);
    let (status, replayed, body) = tokio::time::timeout(Duration::from_secs(30), first)
        .await
        .expect("the first caller is answered")
        .expect("task");
    assert_eq!((status, replayed, body.as_str()), (201, false, "run 1"));
    // Time passing is the point: the lock is held for several leases and busy timeouts.
    tokio::time::sleep(lease * 3).await;
    lock.rollback().await.expect("rollback");

    gate.add_permits(1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let retry = loop {
        let answer = post_order(&client, &url, &key).await;
        // 409 while the completion is still on its way; never a second run.
        if answer.0 != 409 || tokio::time::Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(retry, (201, true, "run 1".to_owned()));
    assert_eq!(executions.load(Ordering::SeqCst), 1);
}
