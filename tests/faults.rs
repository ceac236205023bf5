//! Fault injection over real HTTP: the store behind a TCP proxy that drops, stalls and cuts
//! connections, a `redis-server` killed mid-load and restarted, and a stale lease holder that
//! outlives its lease. The layer must fail closed (`503 store-unavailable`, no handler run),
//! never run a key twice, and run every retried key exactly once once the store is back.

mod receiver_process;
mod support;

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};
use tower_idempotency_testkit::unix_now;

use axum::{routing::post, Router};
use bytes::Bytes;
use http::StatusCode;
use receiver_process::{send_each, Database, Receiver};
use support::*;
use tokio::sync::Notify;
use tower_idempotency::{IdempotencyLayer, PostgresStore, RedisStore, Store};
use tower_idempotency_sqlx::sqlx::postgres::PgPoolOptions;

/// Every request is bounded by this, so that a hang fails the test; it is not a speed bound
/// ([`FAST_503`] is), and requests held across a restart wait under it.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// The store timeout under test. It also bounds the healthy store's calls of the same layer, so
/// it leaves them room on a loaded 2-core machine.
const STORE_TIMEOUT: Duration = Duration::from_secs(1);
/// The proxied pools wait less than the store timeout for a connection, so a cut link surfaces
/// as the pool's error as well as the layer's timeout.
const PROXIED_ACQUIRE: Duration = Duration::from_millis(800);
/// The store timeout of the tests that do not test it.
const RELAXED_STORE_TIMEOUT: Duration = Duration::from_secs(5);
/// A 503 must arrive within this (store timeout plus scheduling slack).
const FAST_503: Duration = Duration::from_secs(4);
/// The lease of the stale-holder tests: the layer clamps the store timeout to a third of the
/// lease, so it gives each store call two seconds.
const STALE_LEASE: Duration = Duration::from_secs(6);
/// How long a loop that polls for a store's recovery or a lease's end keeps trying.
const EVENTUALLY: Duration = Duration::from_secs(30);

struct Reply {
    status: StatusCode,
    outcome: String,
    replayed: bool,
    body: Bytes,
    elapsed: Duration,
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(CLIENT_TIMEOUT)
        .build()
        .unwrap()
}

async fn send(client: &reqwest::Client, base: &str, key: &str) -> Reply {
    let start = Instant::now();
    let response = client
        .post(format!("{base}/op"))
        .header("idempotency-key", key)
        .body(format!("payload of {key}"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("request for {key} failed (client timeout?): {e:?}"));
    let status = response.status();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let outcome = header(OUTCOME_HEADER);
    let replayed = header("idempotent-replayed") == "true";
    let body = response.bytes().await.unwrap();
    Reply {
        status,
        outcome,
        replayed,
        body,
        elapsed: start.elapsed(),
    }
}

fn assert_unavailable(reply: &Reply, what: &str) {
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{what}");
    assert_eq!(problem_type(&reply.body), STORE_UNAVAILABLE, "{what}");
    assert!(
        reply.elapsed < FAST_503,
        "{what}: 503 took {:?}",
        reply.elapsed
    );
}

/// Retries like a client would until the answer is not `503`, and returns that answer.
async fn retry_until_served(client: &reqwest::Client, base: &str, key: &str) -> Reply {
    let deadline = Instant::now() + EVENTUALLY;
    loop {
        let reply = send(client, base, key).await;
        if reply.status != StatusCode::SERVICE_UNAVAILABLE {
            return reply;
        }
        assert_eq!(problem_type(&reply.body), STORE_UNAVAILABLE);
        assert!(Instant::now() < deadline, "{key}: store did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `store` behind the fault tests' layer (its own namespace, the short store timeout) in front
/// of a counting handler, served on loopback: the handler's executions and the base URL.
async fn serve_counted(store: impl Store) -> (Executions, String) {
    let executions = Executions::new();
    let layer = IdempotencyLayer::client_keys(store)
        .namespace("faults")
        .store_timeout(STORE_TIMEOUT);
    let base = serve(counted_app(layer, executions.clone())).await;
    (executions, base)
}

/// Drives one store behind a proxy through drop, cut and stall faults.
async fn unreachable_and_slow_store(store: impl Store, proxy: &Proxy, label: &str) {
    let (executions, base) = serve_counted(store).await;
    let client = client();
    let key = |n: usize| format!("{label}-{n}");

    let healthy = send(&client, &base, &key(0)).await;
    assert_eq!(healthy.status, StatusCode::OK, "{label}: healthy store");
    assert_eq!(executions.total(), 1);

    // Unreachable: existing connections cut, new ones refused.
    proxy.set(Mode::Drop);
    proxy.cut();
    for n in 1..=5 {
        let reply = send(&client, &base, &key(n)).await;
        assert_unavailable(&reply, &format!("{label}: unreachable, key {n}"));
    }
    assert_eq!(executions.total(), 1, "{label}: no handler ran unguarded");

    proxy.set(Mode::Pass);
    for n in 1..=5 {
        let reply = retry_until_served(&client, &base, &key(n)).await;
        assert_eq!(reply.status, StatusCode::OK, "{label}: retry of key {n}");
        assert_eq!(reply.outcome, "executed");
    }
    for n in 1..=5 {
        let reply = send(&client, &base, &key(n)).await;
        assert!(reply.replayed, "{label}: second retry of key {n} replays");
        assert_eq!(executions.of(&key(n)), 1, "{label}: key {n} ran once");
    }

    // Slow: connections accepted but no byte forwarded; the store timeout must answer.
    proxy.set(Mode::Stall);
    for n in 6..=8 {
        let reply = send(&client, &base, &key(n)).await;
        assert_unavailable(&reply, &format!("{label}: stalled, key {n}"));
    }
    assert_eq!(executions.total(), 6, "{label}: nothing ran while stalled");
    proxy.cut();
    proxy.set(Mode::Pass);
    for n in 6..=8 {
        let reply = retry_until_served(&client, &base, &key(n)).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(executions.of(&key(n)), 1, "{label}: key {n} ran once");
    }
    assert_eq!(executions.total(), 9);
    assert_eq!(executions.max_concurrent_same_key(), 1);
}

/// The store runs the claim but its reply is held past the store timeout (Postgres finishes the
/// statement, Redis has the command): the caller gets `503`, and the claim that landed is
/// released with its own token, so a retry a moment later runs the handler instead of getting
/// `409` for the whole lease.
async fn abandoned_claim_is_released(store: impl Store, proxy: &Proxy, label: &str) {
    let executions = Executions::new();
    let layer = IdempotencyLayer::client_keys(store)
        .namespace("faults-abandoned")
        .store_timeout(STORE_TIMEOUT)
        .lease(Duration::from_secs(60));
    let base = serve(counted_app(layer, executions.clone())).await;
    let client = client();
    let warm = send(&client, &base, &format!("{label}-warm")).await;
    assert_eq!(warm.status, StatusCode::OK, "{label}: healthy store");

    let key = format!("{label}-abandoned");
    proxy.set(Mode::HoldReplies);
    let reply = send(&client, &base, &key).await;
    assert_unavailable(&reply, &format!("{label}: the claim's reply is held"));
    proxy.set(Mode::Pass);
    assert_eq!(executions.of(&key), 0, "{label}: nothing ran");

    // Well inside the 60 s lease: the key must become claimable again.
    let deadline = Instant::now() + EVENTUALLY;
    let served = loop {
        let reply = send(&client, &base, &key).await;
        match reply.status {
            StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE => {
                assert!(
                    Instant::now() < deadline,
                    "{label}: the abandoned claim still blocks its key ({})",
                    reply.status
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => break reply,
        }
    };
    assert_eq!(served.status, StatusCode::OK, "{label}: the retry runs");
    assert_eq!(served.outcome, "executed");
    assert_eq!(executions.of(&key), 1, "{label}: ran once");
}

/// A test per backend that runs `$case(store, &proxy, label)` on a store reached through a fault
/// proxy, on a table or key prefix of its own; skipped when the backend is not reachable.
macro_rules! proxied_tests {
    (
        $case:ident,
        $what:literal,
        postgres: $postgres:ident($table:literal),
        redis: $redis:ident($prefix:literal) $(,)?
    ) => {
        proxied_tests!(@one $postgres, proxied_postgres, concat!("postgres ", $what), $table,
            $case, "pg");
        proxied_tests!(@one $redis, proxied_redis, concat!("redis ", $what), $prefix,
            $case, "redis");
    };
    (@one $test:ident, $proxied:ident, $what:expr, $place:literal, $case:ident, $label:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let Some((store, proxy, _guard)) = $proxied($what, $place).await else {
                return;
            };
            $case(store, &proxy, $label).await;
        }
    };
}

proxied_tests!(
    abandoned_claim_is_released,
    "abandoned claim",
    postgres: postgres_abandoned_claim_is_released("tidem_abandoned"),
    redis: redis_abandoned_claim_is_released("tidem-abandoned"),
);

async fn postgres_reachable(test: &str) -> bool {
    let ok = reachable(&host_port(&database_url()));
    if !ok {
        skip(test, "Postgres is not reachable at DATABASE_URL");
    }
    ok
}

async fn redis_reachable(test: &str) -> bool {
    let ok = reachable(&host_port(&redis_url()));
    if !ok {
        skip(test, "Redis is not reachable at REDIS_URL");
    }
    ok
}

/// A store on its own small pool; `acquire` bounds the wait for a connection.
async fn postgres_store_via(url: &str, table: &str, acquire: Duration) -> PostgresStore {
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(acquire)
        .connect(url)
        .await
        .expect("connect postgres");
    let store = PostgresStore::new(pool, table).expect("table name");
    store.migrate().await.expect("migrate");
    store
}

fn proxied_url(url: &str, proxy: &Proxy) -> String {
    url.replacen(&host_port(url), &proxy.addr.to_string(), 1)
}

/// A table of its own on the shared Postgres, dropped when the test ends.
fn pg_table(prefix: &str) -> PgTableGuard {
    PgTableGuard {
        table: format!("{prefix}_{}", random_suffix()),
    }
}

/// A key prefix of its own on the shared Redis, deleted when the test ends.
fn redis_prefix(prefix: &str) -> RedisPrefixGuard {
    RedisPrefixGuard {
        url: redis_url(),
        prefix: format!("{prefix}-{}", random_suffix()),
    }
}

/// A Postgres store on a table of its own, reached through a fault proxy; `None` (the test
/// skipped) when Postgres is not reachable.
async fn proxied_postgres(
    test: &str,
    prefix: &str,
) -> Option<(PostgresStore, Proxy, PgTableGuard)> {
    if !postgres_reachable(test).await {
        return None;
    }
    let url = database_url();
    let proxy = Proxy::start(host_port(&url)).await;
    let table = pg_table(prefix);
    let store = postgres_store_via(&proxied_url(&url, &proxy), &table.table, PROXIED_ACQUIRE).await;
    Some((store, proxy, table))
}

/// A Redis store under a key prefix of its own, reached through a fault proxy; `None` (the
/// test skipped) when Redis is not reachable.
async fn proxied_redis(test: &str, prefix: &str) -> Option<(RedisStore, Proxy, RedisPrefixGuard)> {
    if !redis_reachable(test).await {
        return None;
    }
    let url = redis_url();
    let proxy = Proxy::start(host_port(&url)).await;
    let keys = redis_prefix(prefix);
    let store = RedisStore::connect(&proxied_url(&url, &proxy), &keys.prefix)
        .await
        .expect("connect redis")
        .with_timeout(STORE_TIMEOUT);
    Some((store, proxy, keys))
}

proxied_tests!(
    unreachable_and_slow_store,
    "fault injection",
    postgres: postgres_unreachable_or_slow_fails_closed_then_recovers("tidem_faults"),
    redis: redis_unreachable_or_slow_fails_closed_then_recovers("tidem-faults"),
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_load_then_restarted_runs_each_key_once() {
    let Some(mut server) = RedisServer::start(&DURABLE) else {
        return;
    };
    let store = RedisStore::connect(&server.url(), "tidem-kill")
        .await
        .expect("connect")
        .with_timeout(STORE_TIMEOUT);
    let (executions, base) = serve_counted(store).await;
    let client = client();

    // Ten handlers claimed and running when the server dies.
    executions.hold.send_replace(true);
    let in_flight: Vec<_> = (0..10)
        .map(|n| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move { send(&client, &base, &format!("held-a{n}")).await })
        })
        .collect();
    executions.wait_started(10, EVENTUALLY).await;
    server.kill();

    // Arriving while it is down: refused before anything runs.
    for n in 0..5 {
        let reply = send(&client, &base, &format!("b{n}")).await;
        assert_unavailable(&reply, &format!("server down, key b{n}"));
    }
    assert_eq!(executions.total(), 10);

    // Back on the same port, with the append-only file it wrote before the kill.
    server.restart();
    let probe = retry_until_served(&client, &base, "probe").await;
    assert_eq!(probe.status, StatusCode::OK);

    executions.hold.send_replace(false);
    for task in in_flight {
        let reply = task.await.unwrap();
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "in-flight request got its result"
        );
        assert_eq!(reply.outcome, "executed", "and its result was recorded");
    }
    for n in 0..10 {
        let reply = send(&client, &base, &format!("held-a{n}")).await;
        assert!(reply.replayed, "held-a{n} replays after the restart");
    }
    for n in 0..5 {
        let reply = retry_until_served(&client, &base, &format!("b{n}")).await;
        assert_eq!(reply.outcome, "executed");
        assert!(send(&client, &base, &format!("b{n}")).await.replayed);
    }
    let counts = executions.snapshot();
    assert_eq!(counts.len(), 16);
    assert!(
        counts.values().all(|&n| n == 1),
        "a key ran twice: {counts:?}"
    );
    assert_eq!(executions.max_concurrent_same_key(), 1);
}

/// The first holder blocks past its (unrenewed) lease; the second claims and completes with
/// `B`; when the first finally finishes, its completion is fenced off and `B` stands.
async fn stale_holder_cannot_overwrite(store: impl Store, label: &str) {
    let calls = Arc::new(AtomicUsize::new(0));
    let release_first = Arc::new(Notify::new());
    let first_started = Arc::new(Notify::new());
    let handler = {
        let (calls, release_first, first_started) =
            (calls.clone(), release_first.clone(), first_started.clone());
        move || {
            let (calls, release_first, first_started) =
                (calls.clone(), release_first.clone(), first_started.clone());
            async move {
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    first_started.notify_one();
                    release_first.notified().await;
                    "A"
                } else {
                    "B"
                }
            }
        }
    };
    let lease = STALE_LEASE;
    // The store's speed is not under test here: a generous timeout keeps a busy machine (the
    // receiver tests beside this one start processes) from turning a slow claim into a 503. The
    // layer clamps it to a third of the lease.
    let layer = IdempotencyLayer::client_keys(store)
        .namespace("faults")
        .lease(lease)
        .max_lease_renewal(Duration::ZERO)
        .store_timeout(RELAXED_STORE_TIMEOUT);
    let app = Router::new()
        .route("/op", post(handler))
        .route_layer(layer)
        .layer(axum::middleware::map_response(outcome_header));
    let base = serve(app).await;
    let client = client();
    let key = format!("stale-{label}");

    let first = {
        let (client, base, key) = (client.clone(), base.clone(), key.clone());
        tokio::spawn(async move { send(&client, &base, &key).await })
    };
    first_started.notified().await;
    // Waiting out the lease is the thing under test.
    tokio::time::sleep(lease + Duration::from_millis(200)).await;

    let second = send(&client, &base, &key).await;
    assert_eq!(
        second.status,
        StatusCode::OK,
        "{label}: outcome {}, body {}",
        second.outcome,
        String::from_utf8_lossy(&second.body)
    );
    assert_eq!(&second.body[..], b"B", "{label}: the newer holder ran");
    assert_eq!(second.outcome, "executed");

    release_first.notify_one();
    let first = first.await.unwrap();
    assert_eq!(
        &first.body[..],
        b"A",
        "{label}: the stale holder answers its own caller"
    );
    assert_eq!(first.outcome, "executed_unrecorded", "{label}: fenced off");

    let third = send(&client, &base, &key).await;
    assert!(third.replayed, "{label}");
    assert_eq!(&third.body[..], b"B", "{label}: the newer result stands");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_holder_is_fenced_postgres() {
    if !postgres_reachable("stale holder (postgres)").await {
        return;
    }
    let guard = pg_table("tidem_faults");
    let store = postgres_store_via(&database_url(), &guard.table, RELAXED_STORE_TIMEOUT).await;
    stale_holder_cannot_overwrite(store, "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_holder_is_fenced_redis() {
    if !redis_reachable("stale holder (redis)").await {
        return;
    }
    let guard = redis_prefix("tidem-faults");
    let store = RedisStore::connect(&redis_url(), &guard.prefix)
        .await
        .expect("connect redis");
    stale_holder_cannot_overwrite(store, "redis").await;
}

/// What the receiver's handlers did, by key (`GET /effects`).
async fn effects(receiver: &Receiver, client: &reqwest::Client) -> HashMap<String, u64> {
    let body = client
        .get(format!("{}/effects", receiver.base))
        .send()
        .await
        .expect("GET /effects")
        .bytes()
        .await
        .unwrap();
    serde_json::from_slice(&body).expect("effects JSON")
}

/// The receiver verifying Stripe deliveries against `store`, its handler taking
/// `handler_delay_ms`, its leases `lease_ms`.
fn start_receiver(store: &str, handler_delay_ms: u64, lease_ms: u64) -> Receiver {
    Receiver::stripe(
        store,
        CRASH_SECRET,
        &[
            ("HANDLER_DELAY_MS", handler_delay_ms.to_string()),
            ("IDEMPOTENCY_LEASE_MS", lease_ms.to_string()),
            ("IDEMPOTENCY_TTL_SECS", "60".to_owned()),
        ],
    )
}

const CRASH_SECRET: &str = "whsec_crash_test_secret";

async fn deliver(
    client: &reqwest::Client,
    base: &str,
    event: &str,
) -> Result<Reply, reqwest::Error> {
    let body = format!(r#"{{"id":"{event}","object":"event","type":"invoice.paid"}}"#);
    let now = unix_now();
    let signature = tower_idempotency::webhooks::stripe::sign(CRASH_SECRET, now, body.as_bytes());
    let start = Instant::now();
    let response = client
        .post(format!("{base}/webhooks/stripe"))
        .header("stripe-signature", signature)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    let status = response.status();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let body = response.bytes().await?;
    Ok(Reply {
        status,
        outcome: String::new(),
        replayed,
        body,
        elapsed: start.elapsed(),
    })
}

/// Completed keys replay after a crash; keys whose handler was killed mid-run execute exactly
/// once more after the lease expires, in the new process; no key stays stuck.
async fn receiver_crash_mid_handler(store: &str, label: &str) {
    let client = client();
    // The receiver clamps its store timeout to a third of the lease: a second per store call.
    let lease_ms = 3000;
    let run = random_suffix();
    let completed: Vec<String> = (0..4).map(|n| format!("evt_{run}_done{n}")).collect();
    let interrupted: Vec<String> = (0..4).map(|n| format!("evt_{run}_cut{n}")).collect();

    let mut first = start_receiver(store, 300, lease_ms);
    for event in &completed {
        let reply = deliver(&client, &first.base, event).await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{label}: {event}");
    }
    // Now handlers that take far longer than the test.
    first.kill();
    let mut first = start_receiver(store, 60_000, lease_ms);
    let in_flight = send_each(
        &client,
        &first.base,
        &interrupted,
        |client, base, event| async move { deliver(&client, &base, &event).await },
    );
    let deadline = Instant::now() + EVENTUALLY;
    while effects(&first, &client).await.len() < interrupted.len() {
        assert!(Instant::now() < deadline, "{label}: handlers did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill();
    for task in in_flight {
        assert!(
            task.await.unwrap().is_err(),
            "{label}: the crash cut the request"
        );
    }

    let second = start_receiver(store, 0, lease_ms);
    for event in &completed {
        let reply = deliver(&client, &second.base, event).await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{label}: {event}");
        assert!(
            reply.replayed,
            "{label}: completed {event} replays after the crash"
        );
    }
    let deadline = Instant::now() + Duration::from_millis(lease_ms) + EVENTUALLY;
    for event in &interrupted {
        loop {
            let reply = deliver(&client, &second.base, event).await.unwrap();
            if reply.status == StatusCode::OK {
                assert!(!reply.replayed, "{label}: {event} ran in the new process");
                break;
            }
            // Until the dead holder's lease expires.
            assert_eq!(reply.status, StatusCode::CONFLICT, "{label}: {event}");
            assert!(Instant::now() < deadline, "{label}: {event} is stuck");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let again = deliver(&client, &second.base, event).await.unwrap();
        assert!(again.replayed, "{label}: {event} replays once recovered");
    }
    let effects = effects(&second, &client).await;
    for event in &interrupted {
        assert_eq!(
            effects.get(&format!("stripe:{event}")),
            Some(&1),
            "{label}: {event}"
        );
    }
    for event in &completed {
        assert_eq!(
            effects.get(&format!("stripe:{event}")),
            None,
            "{label}: {event}"
        );
    }
    assert_eq!(effects.len(), interrupted.len(), "{label}: {effects:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_killed_mid_handler_recovers_sqlite_and_redis() {
    let dir = TempDir::new();
    let sqlite = format!("sqlite://{}/crash.db", dir.0.display());
    receiver_crash_mid_handler(&sqlite, "sqlite").await;
    if redis_reachable("receiver crash test (redis)").await {
        // The receiver's Redis prefix is fixed; the keys are unique and expire after the TTL.
        receiver_crash_mid_handler(&redis_url(), "redis").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_killed_mid_handler_recovers_postgres() {
    if !postgres_reachable("receiver crash test (postgres)").await {
        return;
    }
    // The receiver always uses the default table: a database of its own keeps the shared one clean.
    let database = Database::create(format!("tidem_crash_{}", random_suffix())).await;
    receiver_crash_mid_handler(&database.url(), "postgres").await;
}

struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("tidem-crash-{}", random_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
