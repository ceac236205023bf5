//! The transactional mode over real HTTP against real Postgres, SQLite and (feature `mysql`)
//! MariaDB/MySQL: the public suite (`tower_idempotency_sqlx::conformance`) for each store, then each store's own cases (stale
//! holders, lease renewal, a commit whose outcome is unknown, statement counts).

mod common;

use std::{sync::Arc, time::Duration};

use common::*;
use http::StatusCode;
use tower_idempotency_core::{ClaimOutcome, IdempotencyLayer, Store, StoreError};
use tower_idempotency_sqlx::conformance::{self, EffectsDb, EffectsServer, Fixture};

async fn pg_fixture() -> Option<(
    Fixture<sqlx::Postgres>,
    Arc<tower_idempotency_sqlx::PostgresStore>,
)> {
    let guarded = pg_store().await?;
    let store = guarded.store.clone();
    let fixture = Fixture {
        pool: store.pool().clone(),
        store: Arc::new(guarded),
    };
    Some((fixture, store))
}

async fn sqlite_fixture() -> (
    Fixture<sqlx::Sqlite>,
    Arc<tower_idempotency_sqlx::SqliteStore>,
) {
    let guarded = sqlite_store().await;
    let store = guarded.store.clone();
    let fixture = Fixture {
        pool: store.pool().clone(),
        store: Arc::new(guarded),
    };
    (fixture, store)
}

#[cfg(feature = "mysql")]
async fn mysql_fixture() -> Option<(
    Fixture<sqlx::MySql>,
    Arc<tower_idempotency_sqlx::MySqlStore>,
)> {
    let guarded = mysql_store().await?;
    let store = guarded.store.clone();
    let fixture = Fixture {
        pool: store.pool().clone(),
        store: Arc::new(guarded),
    };
    Some((fixture, store))
}

/// The suite on MySQL/MariaDB, except `failed_commit_writes_nothing`: MySQL has no deferred
/// constraints, so nothing makes its `COMMIT` fail on demand.
#[cfg(feature = "mysql")]
mod mysql_suite {
    macro_rules! mysql_cases {
        ($($case:ident),*) => {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    if let Some((fixture, _)) = super::mysql_fixture().await {
                        tower_idempotency_sqlx::conformance::$case(&fixture).await;
                    }
                }
            )*
        };
    }

    mysql_cases!(
        concurrent_rounds_write_one_row_per_key,
        released_answers_write_nothing,
        directive_commits_a_non_2xx,
        misconfiguration_is_refused,
        caller_disconnect_still_commits_once,
        duplicate_in_flight_gets_409
    );

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn oversized_result_commits_without_its_body() {
        let table = crate::common::MySqlTable::new();
        let Some(store) = table.store().await else {
            return;
        };
        let store = store.with_max_record_bytes(super::RECORD_LIMIT);
        store.migrate().await.expect("migrate");
        let fixture = tower_idempotency_sqlx::conformance::Fixture {
            pool: store.pool().clone(),
            store: std::sync::Arc::new(store),
        };
        tower_idempotency_sqlx::conformance::oversized_result_commits_without_its_body(&fixture)
            .await;
    }
}

macro_rules! suite {
    ($($case:ident),*) => {
        mod postgres_suite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    if let Some((fixture, _)) = super::pg_fixture().await {
                        tower_idempotency_sqlx::conformance::$case(&fixture).await;
                    }
                }
            )*
        }
        mod sqlite_suite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (fixture, _) = super::sqlite_fixture().await;
                    tower_idempotency_sqlx::conformance::$case(&fixture).await;
                }
            )*
        }
    };
}

suite!(
    concurrent_rounds_write_one_row_per_key,
    released_answers_write_nothing,
    directive_commits_a_non_2xx,
    failed_commit_writes_nothing,
    misconfiguration_is_refused,
    caller_disconnect_still_commits_once
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_duplicate_in_flight_gets_409_without_waiting() {
    if let Some((fixture, _)) = pg_fixture().await {
        conformance::duplicate_in_flight_gets_409(&fixture).await;
    }
}

/// The lease of the tests that let one expire or renew it. The layer bounds each store call by a
/// third of the lease, so it is long enough for a store call on a loaded 2-core machine.
const SHORT_LEASE: Duration = Duration::from_secs(3);

fn short_lease(store: Arc<dyn Store>, renew: bool) -> IdempotencyLayer {
    let layer = IdempotencyLayer::client_keys(store)
        .lease(SHORT_LEASE)
        .transactional();
    if renew {
        layer
    } else {
        layer.max_lease_renewal(Duration::ZERO)
    }
}

/// A `hold` request for `key` on a task of its own: its status and body, once the gate opens.
fn spawn_hold<DB: EffectsDb>(
    server: &EffectsServer<DB>,
    key: &str,
) -> tokio::task::JoinHandle<(reqwest::StatusCode, String)> {
    let (url, key) = (format!("{}/effects", server.base), key.to_owned());
    tokio::spawn(async move {
        let response = reqwest::Client::new()
            .post(url)
            .header("idempotency-key", &key)
            .header(conformance::EFFECT_HEADER, "hold")
            .body("{}")
            .send()
            .await
            .expect("request");
        (response.status(), response.text().await.expect("body"))
    })
}

fn problem_type(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body).expect("problem json")["type"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A stale holder (renewal off, lease expired, a second holder completed): its completion is
/// fenced inside its transaction, the transaction rolls back, and only the second holder's row
/// exists; the stale caller gets `409 lease-lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stale_holder_writes_are_rolled_back() {
    if let Some((fixture, _)) = pg_fixture().await {
        stale_holder_writes_are_rolled_back(&fixture).await;
    }
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_stale_holder_writes_are_rolled_back() {
    if let Some((fixture, _)) = mysql_fixture().await {
        stale_holder_writes_are_rolled_back(&fixture).await;
    }
}

async fn stale_holder_writes_are_rolled_back<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let server = EffectsServer::start(fixture, short_lease(fixture.store.clone(), false)).await;
    let key = conformance::fresh_key("stale");
    let stale = spawn_hold(&server, &key);
    server.entered().await;
    // Let the first holder's lease expire (renewal is off): real time has to pass.
    tokio::time::sleep(SHORT_LEASE * 3 / 2).await;
    let (status, replayed, second) = server.post("/effects", &key, "ok").await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{second}");
    assert_eq!(second, "{\"amount\":2}");
    server.open_gate();
    let (status, body) = stale.await.expect("task");
    assert_eq!(status.as_u16(), 409, "{body}");
    assert_eq!(
        problem_type(&body),
        "urn:tower-idempotency:problem:lease-lost"
    );
    assert_eq!(
        server.rows(&key).await,
        1,
        "the stale holder's row was rolled back"
    );
    let (status, replayed, replay) = server.post("/effects", &key, "ok").await;
    assert_eq!(
        (status, replayed, replay),
        (StatusCode::CREATED, true, second)
    );
    server.finish().await;
}

/// On SQLite the stale-holder case cannot arise while the holder's transaction is open: it holds
/// the write lock, so a claim of the expired key waits for it and fails after the busy timeout;
/// the holder then commits its result, which later requests replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_an_open_transaction_keeps_an_expired_key() {
    let (fixture, store) = sqlite_fixture().await;
    let server = EffectsServer::start(&fixture, short_lease(fixture.store.clone(), false)).await;
    let key = conformance::fresh_key("sqlite-stale");
    let first = spawn_hold(&server, &key);
    server.entered().await;
    // Let the holder's lease expire (renewal is off): real time has to pass.
    tokio::time::sleep(SHORT_LEASE * 3 / 2).await;
    // Any claim needs the write lock the open transaction holds.
    let claim = store
        .claim(
            "any:key",
            &fingerprint(9),
            tower_idempotency_core::FencingToken::random().unwrap(),
            Duration::from_secs(60),
        )
        .await;
    assert!(
        matches!(claim, Err(StoreError::Unavailable(_))),
        "a claim while the transaction is open: {claim:?}"
    );
    server.open_gate();
    let (status, body) = first.await.expect("task");
    assert_eq!(status.as_u16(), 201, "{body}");
    let (status, replayed, replay) = server.post("/effects", &key, "ok").await;
    assert_eq!(
        (status, replayed, replay),
        (StatusCode::CREATED, true, body)
    );
    assert_eq!(server.rows(&key).await, 1);
    server.finish().await;
}

/// The lease is renewed (on the store's own connections) while the handler holds its
/// transaction: past two lease lengths a duplicate is still answered `409`, and one row lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lease_is_renewed_while_the_transaction_is_open() {
    if let Some((fixture, _)) = pg_fixture().await {
        lease_is_renewed_while_the_transaction_is_open(&fixture).await;
    }
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_lease_is_renewed_while_the_transaction_is_open() {
    if let Some((fixture, _)) = mysql_fixture().await {
        lease_is_renewed_while_the_transaction_is_open(&fixture).await;
    }
}

async fn lease_is_renewed_while_the_transaction_is_open<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let server = EffectsServer::start(fixture, short_lease(fixture.store.clone(), true)).await;
    let key = conformance::fresh_key("renewed");
    let first = spawn_hold(&server, &key);
    server.entered().await;
    // Over two whole leases: without renewal the key would be claimable now.
    tokio::time::sleep(SHORT_LEASE * 7 / 3).await;
    let (status, _, body) = server.post("/effects", &key, "ok").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    server.open_gate();
    assert_eq!(first.await.expect("task").0.as_u16(), 201);
    assert_eq!(server.rows(&key).await, 1);
    assert_eq!(server.executions(), 1);
    server.finish().await;
}

/// The connection dies during `COMMIT` (a deferred constraint trigger terminates its own
/// backend): the caller gets `503 commit-outcome-unknown`, nothing was written, and the next
/// request finds the truth in the table (the key is claimable) and writes exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_commit_with_an_unknown_outcome() {
    let Some((fixture, _)) = pg_fixture().await else {
        return;
    };
    let server = EffectsServer::start(&fixture, conformance::layer(fixture.store.clone())).await;
    let table = server.table().to_owned();
    let ddl = format!(
        r#"CREATE FUNCTION "{table}_die"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER "{table}_die" AFTER INSERT ON "{table}"
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.amount = 1)
    EXECUTE FUNCTION "{table}_die"();"#
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(&*ddl))
        .execute(&fixture.pool)
        .await
        .expect("trigger");
    let key = conformance::fresh_key("unknown");
    let (status, _, body) = server.post("/effects", &key, "ok").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(
        problem_type(&body),
        "urn:tower-idempotency:problem:commit-outcome-unknown"
    );
    assert_eq!(server.rows(&key).await, 0);
    let (status, replayed, body) = server.post("/effects", &key, "ok").await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{body}");
    assert_eq!(server.rows(&key).await, 1);
    let drop_function = format!(r#"DROP FUNCTION "{table}_die"() CASCADE"#);
    sqlx::raw_sql(sqlx::AssertSqlSafe(&*drop_function))
        .execute(&fixture.pool)
        .await
        .expect("drop trigger");
    server.finish().await;
}

/// A first request in the mode runs two store statements, as in the plain mode (claim, and the
/// completion inside the handler's transaction); a replay one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_mode_adds_no_store_statement() {
    let Some((fixture, store)) = pg_fixture().await else {
        return;
    };
    let server = EffectsServer::start(&fixture, conformance::layer(fixture.store.clone())).await;
    let key = conformance::fresh_key("count");
    let before = store.statements_executed();
    let (status, _, _) = server.post("/effects", &key, "ok").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(store.statements_executed() - before, 2);
    let before = store.statements_executed();
    let (_, replayed, _) = server.post("/effects", &key, "ok").await;
    assert!(replayed);
    assert_eq!(store.statements_executed() - before, 1);
    match store
        .claim(
            &key,
            &fingerprint(1),
            tower_idempotency_core::FencingToken::random().unwrap(),
            Duration::from_secs(1),
        )
        .await
    {
        Ok(ClaimOutcome::Claimed { .. }) => {}
        other => panic!("the raw key is not the scoped key: {other:?}"),
    }
    server.finish().await;
}

/// Stores that refuse records over 64 KiB, for the oversized-result case.
const RECORD_LIMIT: usize = 64 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_oversized_result_commits_without_its_body() {
    let file = SqliteFile::new();
    let store = file.store("idem").await.with_max_record_bytes(RECORD_LIMIT);
    store.migrate().await.expect("migrate");
    let fixture = Fixture {
        pool: store.pool().clone(),
        store: Arc::new(store),
    };
    conformance::oversized_result_commits_without_its_body(&fixture).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_oversized_result_commits_without_its_body() {
    let table = PgTable::new();
    let Some(store) = table.store().await else {
        return;
    };
    let store = store.with_max_record_bytes(RECORD_LIMIT);
    store.migrate().await.expect("migrate");
    let fixture = Fixture {
        pool: store.pool().clone(),
        store: Arc::new(store),
    };
    conformance::oversized_result_commits_without_its_body(&fixture).await;
}

/// On SQLite too, a duplicate of a key whose transactional handler holds the write lock is
/// answered `409` at once: the claim of a key the store has seen is a read beside the writer,
/// which never waits for the lock (docs/guarantees.md, "Transactional mode").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_duplicate_in_flight_gets_409_without_waiting() {
    let (fixture, _) = sqlite_fixture().await;
    conformance::duplicate_in_flight_gets_409(&fixture).await;
}
