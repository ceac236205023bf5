//! `LocalReplayCache`: the conformance suite over a wrapped memory store, plus what the cache adds
//! (replays without a store call, local expiry, the byte bound, never caching in-flight records).

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tower_idempotency_core::{
    conformance::fresh_key, CachedResponse, ClaimOutcome, Fingerprint, LocalReplayCache,
    MemoryStore, Ownership, Store,
};
use tower_idempotency_testkit::CountingStore;

mod suite {
    tower_idempotency_core::store_conformance_tests!(async {
        Some(tower_idempotency_core::LocalReplayCache::new(
            tower_idempotency_core::MemoryStore::new(),
        ))
    });
}

const LEASE: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(3600);
/// The TTL of the checks that let a record or a cached replay expire: long enough that the calls
/// made while it must still hold finish within it on a loaded 2-core machine.
const EXPIRING: Duration = Duration::from_secs(1);

/// Claims `key` with a fresh random fencing token.
async fn claim<S: Store + ?Sized>(
    store: &S,
    key: &str,
    fp: &Fingerprint,
    lease: Duration,
) -> ClaimOutcome {
    let token = tower_idempotency_core::FencingToken::random().unwrap();
    store.claim(key, fp, token, lease).await.unwrap()
}

/// Claims `key`, which must be new (or its lease over), and returns the token that owns it.
async fn claimed<S: Store + ?Sized>(
    store: &S,
    key: &str,
    fp: &Fingerprint,
    lease: Duration,
) -> tower_idempotency_core::FencingToken {
    match claim(store, key, fp, lease).await {
        ClaimOutcome::Claimed { token } => token,
        other => panic!("expected the key to be claimed, got {other:?}"),
    }
}

fn response(body: &[u8]) -> CachedResponse {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    CachedResponse {
        status: StatusCode::CREATED,
        headers,
        body: Bytes::copy_from_slice(body),
        body_omitted: false,
    }
}

/// Claims and completes `key` through `cache`, returning the stored response.
/// A fresh key named after `name`, claimed and completed with `body` through `cache`.
async fn complete_fresh(
    cache: &LocalReplayCache<CountingStore>,
    name: &str,
    body: &[u8],
) -> String {
    let key = fresh_key(name);
    let fp = Fingerprint([1; 32]);
    let token = claimed(cache, &key, &fp, LEASE).await;
    let done = cache.complete(&key, token, &response(body), TTL).await;
    assert_eq!(done.unwrap(), Ownership::Current);
    key
}

async fn replayed_body(cache: &LocalReplayCache<CountingStore>, key: &str) -> Bytes {
    match claim(cache, key, &Fingerprint([1; 32]), LEASE).await {
        ClaimOutcome::Completed { record, .. } => record.response.body,
        other => panic!("expected a replay, got {other:?}"),
    }
}

#[tokio::test]
async fn the_completing_instance_replays_without_the_store() {
    let cache = LocalReplayCache::new(CountingStore::new(MemoryStore::new()));
    let key = complete_fresh(&cache, "local-hit", b"{\"id\":1}").await;
    assert_eq!(cache.inner().claims(), 1);

    for _ in 0..10 {
        assert_eq!(replayed_body(&cache, &key).await, &b"{\"id\":1}"[..]);
    }
    assert_eq!(cache.inner().claims(), 1, "the completion filled the cache");
    assert_eq!(cache.hits(), 10);
}

#[tokio::test]
async fn another_instance_asks_the_store_once_then_replays_locally() {
    let shared = Arc::new(CountingStore::new(MemoryStore::new()));
    let writer = LocalReplayCache::new(shared.clone());
    let reader = LocalReplayCache::new(shared.clone());
    let key = fresh_key("local-other-instance");
    let fp = Fingerprint([1; 32]);
    let token = claimed(&writer, &key, &fp, LEASE).await;
    let done = writer.complete(&key, token, &response(b"x"), TTL).await;
    assert_eq!(done.unwrap(), Ownership::Current);

    for _ in 0..5 {
        match claim(&reader, &key, &fp, LEASE).await {
            ClaimOutcome::Completed { record, .. } => assert_eq!(record.response.body, &b"x"[..]),
            other => panic!("expected a replay, got {other:?}"),
        }
    }
    assert_eq!(shared.claims(), 2, "writer's claim + reader's first");
    assert_eq!(reader.hits(), 4);
}

#[tokio::test]
async fn released_and_stale_completions_are_not_cached() {
    let cache = LocalReplayCache::new(CountingStore::new(MemoryStore::new()));
    let fp = Fingerprint([4; 32]);
    let released = fresh_key("local-released");
    let token = claimed(&cache, &released, &fp, LEASE).await;
    cache.release(&released, token).await.unwrap();
    assert!(matches!(
        claim(&cache, &released, &fp, LEASE).await,
        ClaimOutcome::Claimed { .. }
    ));

    let stale = fresh_key("local-stale");
    let short = Duration::from_millis(50);
    let old = claimed(&cache, &stale, &fp, short).await;
    // Waiting out the lease is what is under test; there is no event to await.
    tokio::time::sleep(short * 3).await;
    let new = claimed(&cache, &stale, &fp, LEASE).await;
    let done = cache.complete(&stale, old, &response(b"stale"), TTL).await;
    assert_eq!(done.unwrap(), Ownership::Stale);
    assert!(
        matches!(
            claim(&cache, &stale, &fp, LEASE).await,
            ClaimOutcome::InFlight { .. }
        ),
        "a refused completion must not be replayed from the cache"
    );
    assert_eq!(cache.hits(), 0);
    let done = cache.complete(&stale, new, &response(b"new"), TTL).await;
    assert_eq!(done.unwrap(), Ownership::Current);
}

#[tokio::test]
async fn in_flight_records_are_never_cached() {
    let cache = LocalReplayCache::new(CountingStore::new(MemoryStore::new()));
    let key = fresh_key("local-in-flight");
    let fp = Fingerprint([2; 32]);
    assert!(matches!(
        claim(&cache, &key, &fp, LEASE).await,
        ClaimOutcome::Claimed { .. }
    ));
    for _ in 0..3 {
        assert!(matches!(
            claim(&cache, &key, &fp, LEASE).await,
            ClaimOutcome::InFlight { .. }
        ));
    }
    assert_eq!(cache.inner().claims(), 4);
    assert_eq!(cache.hits(), 0);
    assert!(cache.is_empty());
}

#[tokio::test]
async fn a_cached_record_is_served_only_for_the_local_ttl() {
    let ttl = EXPIRING;
    let cache = LocalReplayCache::new(CountingStore::new(MemoryStore::new())).ttl(ttl);
    let key = complete_fresh(&cache, "local-ttl", b"x").await; // cached now
    replayed_body(&cache, &key).await;
    assert_eq!(cache.hits(), 1);
    // Waiting out the local TTL is what is under test here; there is no event to await.
    tokio::time::sleep(ttl * 2).await;
    replayed_body(&cache, &key).await;
    assert_eq!(
        cache.hits(),
        1,
        "after the local TTL the store is asked again"
    );
    assert_eq!(cache.inner().claims(), 2);
}

#[tokio::test]
async fn the_byte_bound_holds_and_oversized_records_are_not_cached() {
    let max_bytes = 64 * 1024;
    let cache = LocalReplayCache::new(CountingStore::new(MemoryStore::new())).max_bytes(max_bytes);
    let body = vec![b'a'; 1024];
    for i in 0..200 {
        let key = complete_fresh(&cache, &format!("local-bound-{i}"), &body).await;
        replayed_body(&cache, &key).await;
    }
    // Each entry weighs more than its 1 KiB body, so at most max_bytes / 1 KiB of them fit.
    assert!(!cache.is_empty(), "small records are cached");
    assert!(
        cache.len() as u64 <= max_bytes / 1024,
        "{} entries exceed the bound",
        cache.len()
    );

    let big = complete_fresh(&cache, "local-big", &vec![b'b'; (max_bytes / 8) as usize]).await;
    let hits = cache.hits();
    replayed_body(&cache, &big).await;
    replayed_body(&cache, &big).await;
    assert_eq!(
        cache.hits(),
        hits,
        "a record above a sixteenth of the bound is not cached"
    );
}

#[tokio::test]
async fn a_local_replay_still_reports_the_original_fingerprint() {
    let cache = LocalReplayCache::new(CountingStore::new(MemoryStore::new()));
    let key = complete_fresh(&cache, "local-fingerprint", b"x").await;
    match claim(&cache, &key, &Fingerprint([9; 32]), LEASE).await {
        ClaimOutcome::Completed { record, .. } => {
            assert_eq!(record.fingerprint, Fingerprint([1; 32]))
        }
        other => panic!("expected the completed record, got {other:?}"),
    }
    assert_eq!(
        cache.hits(),
        1,
        "served locally; the layer answers 422 on the mismatch"
    );
}

/// Two instances, each with a cache of its own, over one memory store.
fn two_cached_instances() -> (Arc<dyn Store>, Arc<dyn Store>) {
    let shared = Arc::new(MemoryStore::new());
    let a: Arc<dyn Store> = Arc::new(LocalReplayCache::new(shared.clone()));
    let b: Arc<dyn Store> = Arc::new(LocalReplayCache::new(shared));
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cached_instances_over_http_run_each_key_once() {
    let (a, b) = two_cached_instances();
    tower_idempotency_core::conformance::two_instances_over_http(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cached_instances_wait_for_one_result() {
    let (a, b) = two_cached_instances();
    tower_idempotency_core::conformance::waiting_across_instances_over_http(a, b).await;
}

#[tokio::test]
async fn a_record_completed_here_is_not_served_past_its_own_ttl() {
    let cache = LocalReplayCache::new(CountingStore::new(MemoryStore::new()));
    let key = fresh_key("local-record-ttl");
    let fp = Fingerprint([5; 32]);
    let record_ttl = EXPIRING;
    let token = claimed(&cache, &key, &fp, LEASE).await;
    let done = cache
        .complete(&key, token, &response(b"x"), record_ttl)
        .await;
    assert_eq!(done.unwrap(), Ownership::Current);
    assert!(matches!(
        claim(&cache, &key, &fp, LEASE).await,
        ClaimOutcome::Completed { .. }
    ));
    // Waiting out the record's TTL is what is under test; there is no event to await.
    tokio::time::sleep(record_ttl * 2).await;
    assert!(
        matches!(
            claim(&cache, &key, &fp, LEASE).await,
            ClaimOutcome::Claimed { .. }
        ),
        "the record expired in the store, so the key is new again"
    );
}

#[tokio::test]
async fn a_forgotten_key_is_not_replayed_from_the_cache() {
    let cache = LocalReplayCache::new(CountingStore::new(MemoryStore::new()));
    let key = complete_fresh(&cache, "local-forget", b"{\"id\":1}").await;
    assert_eq!(replayed_body(&cache, &key).await, &b"{\"id\":1}"[..]);
    assert!(cache.forget(&key).await.unwrap());
    let fp = Fingerprint([1; 32]);
    let again = claim(&cache, &key, &fp, LEASE).await;
    assert!(
        matches!(again, ClaimOutcome::Claimed { .. }),
        "the cached copy must go with the record: {again:?}"
    );
    assert_eq!(cache.inner().claims(), 2, "the claim reached the store");
}

/// A record another instance completed with a short TTL is cached from a claim's answer, and
/// leaves the cache when it expires in the store, not when the cache's own (longer) TTL ends.
#[tokio::test]
async fn a_replay_cached_from_the_store_expires_with_the_record() {
    let shared = Arc::new(MemoryStore::new());
    let reader = LocalReplayCache::new(shared.clone()).ttl(Duration::from_secs(60));
    let key = fresh_key("record-ttl");
    let fp = Fingerprint([1; 32]);
    let token = tower_idempotency_core::FencingToken::random().unwrap();
    let record_ttl = EXPIRING;
    assert!(matches!(
        shared.claim(&key, &fp, token, LEASE).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let done = shared
        .complete(&key, token, &response(b"short"), record_ttl)
        .await;
    assert_eq!(done.unwrap(), Ownership::Current);
    match claim(&reader, &key, &fp, LEASE).await {
        ClaimOutcome::Completed { ttl_remaining, .. } => assert!(ttl_remaining <= record_ttl),
        other => panic!("expected the completed record, got {other:?}"),
    }
    assert_eq!(reader.len(), 1, "the replay is cached");
    // Let the record expire in the store: real time has to pass, there is no event to await.
    tokio::time::sleep(record_ttl * 2).await;
    let mine = tower_idempotency_core::FencingToken::random().unwrap();
    match reader.claim(&key, &fp, mine, LEASE).await.unwrap() {
        ClaimOutcome::Claimed { token } => assert_eq!(token, mine),
        other => panic!("the expired record must not be replayed from the cache, got {other:?}"),
    }
}
