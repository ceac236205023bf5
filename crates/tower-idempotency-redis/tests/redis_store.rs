//! Redis-specific behaviour: several instances, restarts, lease reclaim, round-trip counts,
//! a server dying mid-test, configuration and size limits.

mod common;

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{routing::post, Router};
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tower_idempotency_core::{
    conformance, CachedResponse, ClaimOutcome, Fingerprint, IdempotencyLayer, Ownership,
    RecordState, Store, StoreError,
};
use tower_idempotency_redis::{
    ConfigError, ConnectError, ConnectOptions, RedisStore, DEFAULT_MAX_RECORD_BYTES,
};

fn response(body: impl Into<Bytes>) -> CachedResponse {
    CachedResponse {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
        body: body.into(),
        body_omitted: false,
    }
}

fn key(case: &str) -> String {
    format!(
        "{case}:{:016x}{:016x}{:016x}{:016x}",
        common::random_u64(),
        common::random_u64(),
        common::random_u64(),
        common::random_u64()
    )
}

async fn claimed(
    store: &dyn Store,
    key: &str,
    lease: Duration,
) -> tower_idempotency_core::FencingToken {
    match store
        .claim(
            key,
            &Fingerprint([3; 32]),
            tower_idempotency_core::FencingToken::random().unwrap(),
            lease,
        )
        .await
        .unwrap()
    {
        ClaimOutcome::Claimed { token } => token,
        other => panic!("expected a claim, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_with_separate_connection_managers() {
    let Some(a) = common::standalone_store().await else {
        return;
    };
    let manager = common::manager(&common::redis_url()).await.unwrap();
    let b = RedisStore::new(manager, a.store.prefix()).unwrap();
    conformance::two_instances_over_http(Arc::new(a), Arc::new(b)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_wait_for_one_result() {
    let Some(a) = common::standalone_store().await else {
        return;
    };
    let manager = common::manager(&common::redis_url()).await.unwrap();
    let b = RedisStore::new(manager, a.store.prefix()).unwrap();
    conformance::waiting_across_instances_over_http(Arc::new(a), Arc::new(b)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_completed_keys() {
    let Some(before) = common::standalone_store().await else {
        return;
    };
    let cleanup = before.guard().clone();
    let after = RedisStore::connect(&common::redis_url(), before.store.prefix())
        .await
        .unwrap();
    conformance::restart_keeps_completed(Arc::new(before), Arc::new(after)).await;
    drop(cleanup);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_is_reclaimed_once_and_the_old_holder_is_fenced() {
    let Some(store) = common::standalone_store().await else {
        return;
    };
    let store = Arc::new(store);
    let key = Arc::new(key("reclaim"));
    let old = claimed(&*store, &key, Duration::from_millis(200)).await;
    // Real time has to pass for the lease to end; Redis has no signal for it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let claims: Vec<_> = (0..30)
        .map(|_| {
            let (store, key) = (store.clone(), key.clone());
            tokio::spawn(async move {
                store
                    .claim(
                        &key,
                        &Fingerprint([3; 32]),
                        tower_idempotency_core::FencingToken::random().unwrap(),
                        Duration::from_secs(30),
                    )
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut winners = Vec::new();
    for claim in claims {
        if let ClaimOutcome::Claimed { token } = claim.await.unwrap() {
            winners.push(token);
        }
    }
    assert_eq!(winners.len(), 1, "exactly one reclaim");
    let new = winners[0];
    assert_ne!(new, old, "tokens are never reused for a key");
    let ttl = Duration::from_secs(30);
    assert_eq!(
        store
            .complete(&key, old, &response("old"), ttl)
            .await
            .unwrap(),
        Ownership::Stale
    );
    assert_eq!(store.renew(&key, old, ttl).await.unwrap(), Ownership::Stale);
    assert_eq!(store.release(&key, old).await.unwrap(), Ownership::Stale);
    assert_eq!(
        store
            .complete(&key, new, &response("new"), ttl)
            .await
            .unwrap(),
        Ownership::Current
    );
    match store.get(&key).await.unwrap() {
        Some(RecordState::Completed { record, .. }) => assert_eq!(record.response.body, "new"),
        other => panic!("expected the new holder's record, got {other:?}"),
    }
}

/// Per-command call counts from `INFO commandstats`, without `INFO` itself.
fn command_stats(url: &str) -> BTreeMap<String, u64> {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut con)
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            (name != "info").then(|| (name.to_owned(), calls))
        })
        .collect()
}

fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(name, calls)| {
            let d = calls - before.get(name).copied().unwrap_or(0);
            (d > 0).then(|| (name.clone(), d))
        })
        .collect()
}

fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Counted by the server itself on a dedicated redis-server, over real HTTP through the layer:
/// a new key costs one `SET … NX GET` (claim) and one `EVALSHA` (complete); a large response
/// adds one pipelined `SET` of the staged value (same round trip); a replay is one
/// `SET … NX GET` (the record carries its deadline, so no `PTTL`).
/// Commands run inside scripts also show up in `commandstats`, so the exact inner commands are
/// asserted too (the completion's `PUBLISH` for waiters in other instances among them):
/// nothing else reached the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_key_costs_two_round_trips_and_replay_one() {
    let Some(server) = common::RedisServer::start(&[]) else {
        return;
    };
    let url = server.url();
    let store = RedisStore::connect(&url, "count").await.unwrap();
    let large = "L".repeat(64 * 1024);
    let app = Router::new()
        .route(
            "/small",
            post(|| async { (StatusCode::CREATED, "order 1") }),
        )
        .route(
            "/large",
            post(move || async move { (StatusCode::CREATED, large) }),
        )
        .route_layer(IdempotencyLayer::client_keys(store).namespace("count"));
    let serving = tower_idempotency_testkit::Server::start(app).await;
    let base = serving.url("");
    let client = reqwest::Client::new();
    let post = |path: &str, key: &str| {
        client
            .post(format!("{base}{path}"))
            .header("idempotency-key", key)
            .body("{}")
            .send()
    };

    let small_first = counts(&[
        ("set", 2),
        ("evalsha", 1),
        ("getrange", 1),
        ("append", 1),
        ("publish", 1),
    ]);
    let large_first = counts(&[
        ("set", 2),
        ("evalsha", 1),
        ("getrange", 1),
        ("exists", 1),
        ("rename", 1),
        ("setrange", 1),
        ("pexpire", 1),
        ("publish", 1),
    ]);
    for (path, key, first_expected, body_len) in [
        ("/small", "small-1", &small_first, 7),
        ("/small", "small-2", &small_first, 7),
        ("/large", "large-1", &large_first, 64 * 1024),
    ] {
        let before = command_stats(&url);
        let first = post(path, key).await.unwrap();
        assert_eq!(first.status(), StatusCode::CREATED);
        assert!(!first.headers().contains_key("idempotent-replayed"));
        let after_first = command_stats(&url);
        assert_eq!(
            &delta(&before, &after_first),
            first_expected,
            "{path}: a new key"
        );
        let replay = post(path, key).await.unwrap();
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.bytes().await.unwrap().len(), body_len);
        assert_eq!(
            delta(&after_first, &command_stats(&url)),
            counts(&[("set", 1)]),
            "{path}: a replay is one SET NX GET"
        );
    }
    drop(serving);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_server_fails_calls_quickly() {
    let Some(mut server) = common::RedisServer::start(&[]) else {
        return;
    };
    let manager = common::manager_timing_out(&server.url(), common::QUICK_TIMEOUT)
        .await
        .unwrap();
    let store = RedisStore::new(manager, "dying")
        .unwrap()
        .with_timeout(Duration::from_secs(3));
    let token = claimed(&store, "dying:a", Duration::from_secs(30)).await;
    server.kill();
    for attempt in 0..3 {
        let started = Instant::now();
        let result = store
            .complete("dying:a", token, &response("x"), Duration::from_secs(30))
            .await;
        let elapsed = started.elapsed();
        assert!(
            matches!(
                result,
                Err(StoreError::Unavailable(_) | StoreError::Timeout(_))
            ),
            "attempt {attempt}: {result:?}"
        );
        assert!(
            elapsed < Duration::from_secs(4),
            "attempt {attempt} took {elapsed:?}"
        );
        let claim = store
            .claim(
                "dying:b",
                &Fingerprint([1; 32]),
                tower_idempotency_core::FencingToken::random().unwrap(),
                Duration::from_secs(1),
            )
            .await;
        assert!(
            matches!(
                claim,
                Err(StoreError::Unavailable(_) | StoreError::Timeout(_))
            ),
            "attempt {attempt}: {claim:?}"
        );
    }
}

#[tokio::test]
async fn invalid_prefixes_are_rejected() {
    let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
    let lazy = redis::aio::ConnectionManager::new_lazy_with_config(
        client,
        redis::aio::ConnectionManagerConfig::new(),
    )
    .unwrap();
    assert_eq!(
        RedisStore::new(lazy.clone(), "").unwrap_err(),
        ConfigError::PrefixLength { len: 0 }
    );
    assert_eq!(
        RedisStore::new(lazy.clone(), &"p".repeat(65)).unwrap_err(),
        ConfigError::PrefixLength { len: 65 }
    );
    assert_eq!(
        RedisStore::new(lazy.clone(), "app{x}").unwrap_err(),
        ConfigError::PrefixCharacter { position: 3 }
    );
    let store = RedisStore::new(lazy, "app:v1_idem.x-y").unwrap();
    assert_eq!(store.redis_key("ns:ab12"), "app:v1_idem.x-y:{ns:ab12}");
    // The prefix is checked before any connection attempt.
    assert!(matches!(
        RedisStore::connect("redis://127.0.0.1:1", "no spaces").await,
        Err(ConnectError::Config(ConfigError::PrefixCharacter {
            position: 2
        }))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_records_are_refused_and_the_claim_stays_usable() {
    let Some(store) = common::standalone_store().await else {
        return;
    };
    assert_eq!(store.store.max_record_bytes(), DEFAULT_MAX_RECORD_BYTES);
    let ttl = Duration::from_secs(30);

    // The default limit: 16 MiB of body is more than 16 MiB of record.
    let key_a = key("big");
    let token = claimed(&store, &key_a, ttl).await;
    let huge = response(vec![7u8; DEFAULT_MAX_RECORD_BYTES]);
    match store.complete(&key_a, token, &huge, ttl).await {
        Err(StoreError::RecordTooLarge { size, limit }) => {
            assert_eq!(limit, DEFAULT_MAX_RECORD_BYTES);
            assert!(size > limit);
        }
        other => panic!("expected RecordTooLarge, got {other:?}"),
    }

    // A configured limit, and the record just under it still fits.
    let small = store.store.clone().with_max_record_bytes(1024);
    let key_b = key("small");
    let token = claimed(&small, &key_b, ttl).await;
    match small
        .complete(&key_b, token, &response(vec![1u8; 2048]), ttl)
        .await
    {
        Err(StoreError::RecordTooLarge { size, limit: 1024 }) => assert!(size > 2048),
        other => panic!("expected RecordTooLarge, got {other:?}"),
    }
    // Refused records leave the claim in flight, so the holder can still release it.
    assert!(matches!(
        small.get(&key_b).await.unwrap(),
        Some(RecordState::InFlight { token: t, .. }) if t == token
    ));
    assert_eq!(
        small.release(&key_b, token).await.unwrap(),
        Ownership::Current
    );
    let token = claimed(&small, &key_b, ttl).await;
    assert_eq!(
        small
            .complete(&key_b, token, &response(vec![1u8; 900]), ttl)
            .await
            .unwrap(),
        Ownership::Current
    );
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_expire_with_redis_key_expiry_and_nothing_else_is_written() {
    let Some(store) = common::standalone_store().await else {
        return;
    };
    let k = key("layout");
    let token = claimed(&store, &k, Duration::from_secs(30)).await;
    assert_eq!(store.guard().count_keys(), 1, "one Redis key per record");
    store
        .complete(&k, token, &response("done"), Duration::from_secs(1))
        .await
        .unwrap();
    let mut con = redis::Client::open(common::redis_url())
        .unwrap()
        .get_connection()
        .unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(store.store.redis_key(&k))
        .query(&mut con)
        .unwrap();
    assert!(
        (1..=1000).contains(&pttl),
        "completed record expires with its TTL: {pttl}"
    );
    // Real time has to pass for the TTL to end; Redis expires the key on its own clock.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(store.guard().count_keys(), 0, "nothing outlives the record");
    assert_eq!(store.get(&k).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_large_completion_leaves_no_staged_value_behind() {
    let Some(store) = common::standalone_store().await else {
        return;
    };
    let k = key("staged");
    let ttl = Duration::from_secs(30);
    let old = claimed(&store, &k, Duration::from_millis(200)).await;
    // Real time has to pass for the lease to end; Redis has no signal for it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let new = claimed(&store, &k, ttl).await;
    let large = |byte: u8| response(vec![byte; 100_000]);
    assert_eq!(
        store.complete(&k, old, &large(1), ttl).await.unwrap(),
        Ownership::Stale
    );
    assert_eq!(
        store.guard().count_keys(),
        1,
        "the stale staged value is gone"
    );
    assert!(matches!(
        store.get(&k).await.unwrap(),
        Some(RecordState::InFlight { token, .. }) if token == new
    ));
    assert_eq!(
        store.complete(&k, new, &large(2), ttl).await.unwrap(),
        Ownership::Current
    );
    assert_eq!(
        store.guard().count_keys(),
        1,
        "the staged value became the record"
    );
    match store
        .claim(
            &k,
            &Fingerprint([3; 32]),
            tower_idempotency_core::FencingToken::random().unwrap(),
            ttl,
        )
        .await
        .unwrap()
    {
        ClaimOutcome::Completed { record, .. } => {
            assert_eq!(record.fingerprint, Fingerprint([3; 32]));
            assert_eq!(record.response, large(2));
        }
        other => panic!("expected the large record, got {other:?}"),
    }
}

/// After `SCRIPT FLUSH` (as after a restart or failover) every script path loads its script
/// again by itself: inline and staged completion, renew and release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_script_flush() {
    let Some(server) = common::RedisServer::start(&[]) else {
        return;
    };
    let store = RedisStore::connect(&server.url(), "flush").await.unwrap();
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut flush = || {
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut admin).unwrap();
    };
    let ttl = Duration::from_secs(30);
    for (i, body) in [vec![1u8; 10], vec![2u8; 50_000]].into_iter().enumerate() {
        let k = format!("flush:{i}");
        let token = claimed(&store, &k, ttl).await;
        flush();
        assert_eq!(
            store.renew(&k, token, ttl).await.unwrap(),
            Ownership::Current
        );
        flush();
        assert_eq!(
            store
                .complete(&k, token, &response(body.clone()), ttl)
                .await
                .unwrap(),
            Ownership::Current
        );
        match store.get(&k).await.unwrap() {
            Some(RecordState::Completed { record, .. }) => assert_eq!(record.response.body, body),
            other => panic!("expected a completed record, got {other:?}"),
        }
    }
    let token = claimed(&store, "flush:release", ttl).await;
    flush();
    assert_eq!(
        store.release("flush:release", token).await.unwrap(),
        Ownership::Current
    );
    assert_eq!(store.get("flush:release").await.unwrap(), None);
}

/// A server that accepts connections but never answers (stopped with SIGSTOP) yields
/// `Timeout` from the connection's response timeout instead of a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_times_out() {
    let Some(server) = common::RedisServer::start(&[]) else {
        return;
    };
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let info: String = redis::cmd("INFO").arg("server").query(&mut admin).unwrap();
    let pid = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .unwrap()
        .trim()
        .to_owned();
    let manager = common::manager_timing_out(&server.url(), common::QUICK_TIMEOUT)
        .await
        .unwrap();
    let store = RedisStore::new(manager, "frozen").unwrap();
    claimed(&store, "frozen:a", Duration::from_secs(30)).await;
    let signal = |sig: &str| {
        std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
    };
    assert!(signal("-STOP").success());
    let started = Instant::now();
    let result = store
        .claim(
            "frozen:b",
            &Fingerprint([1; 32]),
            tower_idempotency_core::FencingToken::random().unwrap(),
            Duration::from_secs(1),
        )
        .await;
    let elapsed = started.elapsed();
    signal("-CONT");
    assert!(
        matches!(result, Err(StoreError::Timeout(waited)) if waited < Duration::from_secs(2)),
        "{result:?} after {elapsed:?}"
    );
    // The connection manager's response timeout is `QUICK_TIMEOUT`.
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    // Once the server answers again, so does the store.
    assert!(store.get("frozen:a").await.is_ok());
}

/// A server that may evict keys under memory pressure would lose records (a second execution):
/// `connect` refuses it, naming the policy, unless eviction is allowed explicitly. A
/// `noeviction` server is accepted as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_server_is_refused_unless_allowed() {
    let Some(evicting) =
        common::RedisServer::start(&["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"])
    else {
        return;
    };
    match RedisStore::connect(&evicting.url(), "evict").await {
        Err(ConnectError::EvictingPolicy { policy }) => assert_eq!(policy, "allkeys-lru"),
        other => panic!("an evicting server must be refused, got {other:?}"),
    }
    let allowed = RedisStore::connect_with(
        &evicting.url(),
        "evict",
        ConnectOptions::new().allow_eviction(true),
    )
    .await
    .expect("eviction allowed explicitly");
    assert_eq!(
        allowed.eviction_policies().await.expect("policy"),
        vec!["allkeys-lru".to_owned()]
    );
    let Some(safe) = common::RedisServer::start(&["--maxmemory-policy", "noeviction"]) else {
        return;
    };
    let store = RedisStore::connect(&safe.url(), "evict")
        .await
        .expect("noeviction is fine");
    assert_eq!(
        store.eviction_policies().await.expect("policy"),
        vec!["noeviction".to_owned()]
    );
}

/// redis-rs's cluster client resends a command after a connection error, so a completion whose
/// reply was lost can run twice. The second run finds the record completed by its own token and
/// answers `Current` (not "not recorded"), changing nothing; another token is still `Stale`.
/// Small (inline) and large (staged) completions alike, and the staged copy is not left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_completion_answers_current_and_changes_nothing() {
    let Some(store) = common::standalone_store().await else {
        return;
    };
    let cleanup = store.guard().clone();
    for (case, body) in [
        ("small", "first".repeat(10)),
        ("large", "L".repeat(64 * 1024)),
    ] {
        let k = key(case);
        let token = claimed(&store, &k, Duration::from_secs(60)).await;
        let first = store
            .complete(&k, token, &response(body.clone()), Duration::from_secs(60))
            .await;
        assert_eq!(first.unwrap(), Ownership::Current, "{case}");
        let resent = store
            .complete(&k, token, &response("second"), Duration::from_secs(60))
            .await;
        assert_eq!(
            resent.unwrap(),
            Ownership::Current,
            "{case}: the resend is ours"
        );
        let other = tower_idempotency_core::FencingToken::random().unwrap();
        let foreign = store
            .complete(&k, other, &response("other"), Duration::from_secs(60))
            .await;
        assert_eq!(foreign.unwrap(), Ownership::Stale, "{case}");
        match store.get(&k).await.unwrap() {
            Some(RecordState::Completed { record, .. }) => {
                assert_eq!(record.response.body, body.as_bytes(), "{case}: unchanged")
            }
            other => panic!("{case}: expected the first completion, got {other:?}"),
        }
    }
    assert_eq!(cleanup.count_keys(), 2, "two records, no staged copy left");
}
