//! The public store conformance suite: every store in this project runs it unchanged, and so
//! should yours.
//!
//! Each check is a public async function taking the store under test. The
//! [`store_conformance_tests!`](crate::store_conformance_tests) macro turns all of them into
//! `#[tokio::test]`s (your crate needs `tokio` with the `macros` and `rt-multi-thread` features as
//! a dev-dependency):
//!
//! ```no_run
//! // tests/conformance.rs of a store crate
//! tower_idempotency_core::store_conformance_tests!(async {
//!     // `None` skips (e.g. the database is unreachable outside CI).
//!     Some(tower_idempotency_core::MemoryStore::new())
//! });
//! ```
//!
//! Every check uses fresh random keys, so the checks may share one table or key prefix and run
//! in parallel. Checks that wait for leases or TTLs use leases of a few hundred milliseconds.
//! Some checks need two stores and are called directly: [`two_instances_over_http`],
//! [`waiting_across_instances_over_http`] and [`restart_keeps_completed`], and for a store that
//! pushes notices of settled keys ([`Store::settlements`]) also
//! [`settlements_are_notified_across_instances`],
//! [`waiting_across_instances_is_notified_over_http`] and
//! [`notified_waiter_leaves_nothing_behind_over_http`]; so is
//! [`records_over_the_store_limit_complete_without_body`], which needs a store configured with a
//! small record limit.

use std::{
    hash::{BuildHasher, RandomState},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

mod notices;

pub use notices::{
    notified_waiter_leaves_nothing_behind_over_http, settlements_are_notified_across_instances,
    waiting_across_instances_is_notified_over_http,
};

use axum::{extract::State, routing::post, Router};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};

use crate::{
    store::{
        CachedResponse, ClaimOutcome, CompletedRecord, FencingToken, Fingerprint, Ownership,
        RecordState, Store, StoreError,
    },
    IdempotencyLayer, MemoryStore,
};

/// A store together with a guard that lives as long as it: tests hand the pair to the suite, and
/// the guard's `Drop` removes the table, file or keys the store used. Every call goes to `store`.
#[derive(Clone, Debug)]
pub struct Guarded<S, G> {
    /// The store under test.
    pub store: S,
    /// Dropped with the store (cleanup).
    pub guard: G,
}

#[async_trait::async_trait]
impl<S: Store, G: Send + Sync + 'static> Store for Guarded<S, G> {
    async fn claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        token: FencingToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        self.store.claim(key, fingerprint, token, lease).await
    }

    async fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Ownership, StoreError> {
        self.store.renew(key, token, lease).await
    }

    async fn complete(
        &self,
        key: &str,
        token: FencingToken,
        response: &CachedResponse,
        ttl: Duration,
    ) -> Result<Ownership, StoreError> {
        self.store.complete(key, token, response, ttl).await
    }

    async fn release(&self, key: &str, token: FencingToken) -> Result<Ownership, StoreError> {
        self.store.release(key, token).await
    }

    async fn get(&self, key: &str) -> Result<Option<RecordState>, StoreError> {
        self.store.get(key).await
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        self.store.forget(key).await
    }

    fn transactions(&self) -> Option<&dyn crate::store::TransactionalStore> {
        self.store.transactions()
    }

    fn name(&self) -> &'static str {
        self.store.name()
    }

    fn settlements(&self) -> Option<crate::store::Settlements> {
        self.store.settlements()
    }
}

/// Wraps a store and counts the claims that reach it, for tests that prove a request did (or did
/// not) touch the store: a rejected request must not claim, a locally cached replay must not.
#[derive(Debug, Default)]
pub struct CountingStore<S = MemoryStore> {
    inner: S,
    claims: AtomicUsize,
}

impl<S> CountingStore<S> {
    /// Counts the claims reaching `inner`.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            claims: AtomicUsize::new(0),
        }
    }

    /// Claims that reached the wrapped store so far.
    pub fn claims(&self) -> usize {
        self.claims.load(Ordering::SeqCst)
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

#[async_trait::async_trait]
impl<S: Store> Store for CountingStore<S> {
    async fn claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        token: FencingToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.claim(key, fingerprint, token, lease).await
    }

    async fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Ownership, StoreError> {
        self.inner.renew(key, token, lease).await
    }

    async fn complete(
        &self,
        key: &str,
        token: FencingToken,
        response: &CachedResponse,
        ttl: Duration,
    ) -> Result<Ownership, StoreError> {
        self.inner.complete(key, token, response, ttl).await
    }

    async fn release(&self, key: &str, token: FencingToken) -> Result<Ownership, StoreError> {
        self.inner.release(key, token).await
    }

    async fn get(&self, key: &str) -> Result<Option<RecordState>, StoreError> {
        self.inner.get(key).await
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        self.inner.forget(key).await
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn settlements(&self) -> Option<crate::store::Settlements> {
        self.inner.settlements()
    }
}

const SHORT_LEASE: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(60);

/// A random 64-bit value; `RandomState` is seeded from the OS per instance.
fn random_u64() -> u64 {
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// A fresh key in the layer's format (`namespace:64 hex digits`).
pub fn fresh_key(case: &str) -> String {
    format!(
        "conformance-{case}:{:016x}{:016x}{:016x}{:016x}",
        random_u64(),
        random_u64(),
        random_u64(),
        random_u64()
    )
}

fn fingerprint(byte: u8) -> Fingerprint {
    let mut bytes = [byte; 32];
    bytes[..8].copy_from_slice(&random_u64().to_be_bytes());
    Fingerprint(bytes)
}

fn response(body: impl Into<Bytes>) -> CachedResponse {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("location", HeaderValue::from_static("/orders/ord_1"));
    headers.append("x-multi", HeaderValue::from_static("one"));
    headers.append("x-multi", HeaderValue::from_static("two"));
    CachedResponse {
        status: StatusCode::CREATED,
        headers,
        body: body.into(),
        body_omitted: false,
    }
}

/// A fresh fencing token, as the layer draws one per claim.
pub fn fresh_token() -> FencingToken {
    FencingToken::random().expect("the OS provides random bytes")
}

async fn claim_token(store: &dyn Store, key: &str, fp: &Fingerprint, lease: Duration) -> u64 {
    let mine = fresh_token();
    match store.claim(key, fp, mine, lease).await.expect("claim") {
        ClaimOutcome::Claimed { token } => {
            assert_eq!(token, mine, "the store must use the caller's token");
            token.0
        }
        other => panic!("expected a fresh claim of {key}, got {other:?}"),
    }
}

fn token(value: u64) -> crate::FencingToken {
    crate::FencingToken(value)
}

/// Claim, complete, then a second claim replays the response with its headers (repeated ones
/// too), and `get` reads the same record.
pub async fn claim_complete_replay(store: Arc<dyn Store>) {
    let key = fresh_key("replay");
    let fp = fingerprint(1);
    assert_eq!(store.get(&key).await.expect("get"), None, "unknown key");
    let t = claim_token(&*store, &key, &fp, LONG).await;
    let cached = response(r#"{"order_id":"ord_1"}"#);
    let done = store.complete(&key, token(t), &cached, LONG).await;
    assert_eq!(done.expect("complete"), Ownership::Current);
    let expected = CompletedRecord {
        fingerprint: fp,
        response: cached,
    };
    match store
        .claim(&key, &fp, fresh_token(), LONG)
        .await
        .expect("claim")
    {
        ClaimOutcome::Completed { record, .. } => assert_eq!(record, expected),
        other => panic!("expected the completed record, got {other:?}"),
    }
    match store.get(&key).await.expect("get") {
        Some(RecordState::Completed { record, .. }) => assert_eq!(record, expected),
        other => panic!("expected the completed record, got {other:?}"),
    }
}

/// The store writes the token the caller chose, and a claim repeated with that token while the
/// record is in flight (a client resending a claim whose first attempt landed) is `Claimed`, not
/// its own duplicate; another token still sees it in flight, and once completed the same token
/// gets the completed record.
pub async fn caller_token_is_used_and_a_repeated_claim_is_claimed(store: Arc<dyn Store>) {
    let key = fresh_key("own-token");
    let fp = fingerprint(12);
    let mine = fresh_token();
    for attempt in ["first", "repeated"] {
        match store.claim(&key, &fp, mine, LONG).await.expect("claim") {
            ClaimOutcome::Claimed { token } => assert_eq!(token, mine, "{attempt} claim"),
            other => panic!("the {attempt} claim with my token must be mine, got {other:?}"),
        }
    }
    match store.get(&key).await.expect("get") {
        Some(RecordState::InFlight { token, .. }) => assert_eq!(token, mine),
        other => panic!("expected my in-flight record, got {other:?}"),
    }
    match store
        .claim(&key, &fp, fresh_token(), LONG)
        .await
        .expect("claim")
    {
        ClaimOutcome::InFlight { fingerprint, .. } => assert_eq!(fingerprint, fp),
        other => panic!("another token must see the key in flight, got {other:?}"),
    }
    let done = store.complete(&key, mine, &response("mine"), LONG).await;
    assert_eq!(done.expect("complete"), Ownership::Current);
    match store.claim(&key, &fp, mine, LONG).await.expect("claim") {
        ClaimOutcome::Completed { record, .. } => assert_eq!(&record.response.body[..], b"mine"),
        other => panic!("a completed key is replayed, whatever the token, got {other:?}"),
    }
}

/// A completed record reports the time it has left, from `claim` and from `get`: at most the TTL
/// it was completed with, and less on a later read.
pub async fn remaining_ttl_is_reported_and_decreases(store: Arc<dyn Store>) {
    let key = fresh_key("ttl-left");
    let fp = fingerprint(13);
    let t = claim_token(&*store, &key, &fp, LONG).await;
    let ttl = Duration::from_secs(30);
    let done = store.complete(&key, token(t), &response("x"), ttl).await;
    assert_eq!(done.expect("complete"), Ownership::Current);
    let first = match store
        .claim(&key, &fp, fresh_token(), LONG)
        .await
        .expect("claim")
    {
        ClaimOutcome::Completed { ttl_remaining, .. } => ttl_remaining,
        other => panic!("expected completed, got {other:?}"),
    };
    assert!(first <= ttl, "{first:?} left of a {ttl:?} TTL");
    assert!(
        first > ttl / 2,
        "{first:?} left of a {ttl:?} TTL right after completing"
    );
    // A lease-length wait, so that even a store counting whole milliseconds shows the difference.
    tokio::time::sleep(SHORT_LEASE).await;
    let later = match store.get(&key).await.expect("get") {
        Some(RecordState::Completed { ttl_remaining, .. }) => ttl_remaining,
        other => panic!("expected completed, got {other:?}"),
    };
    assert!(later < first, "{later:?} left after {first:?}");
    assert!(
        later <= ttl - SHORT_LEASE,
        "{later:?} left of a {ttl:?} TTL"
    );
}

/// 100 concurrent claimers of one key: exactly one wins, every other one sees it in flight with
/// the winner's fingerprint.
pub async fn concurrent_claimers_have_one_winner(store: Arc<dyn Store>) {
    let key = Arc::new(fresh_key("race"));
    let fp = fingerprint(2);
    let barrier = Arc::new(tokio::sync::Barrier::new(100));
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let (store, key, barrier) = (store.clone(), key.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store
                    .claim(&key, &fp, fresh_token(), LONG)
                    .await
                    .expect("claim")
            })
        })
        .collect();
    let mut winners = 0;
    for task in tasks {
        match task.await.expect("task") {
            ClaimOutcome::Claimed { .. } => winners += 1,
            ClaimOutcome::InFlight { fingerprint, .. } => assert_eq!(fingerprint, fp),
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(
        winners, 1,
        "exactly one of 100 concurrent claimers must win"
    );
}

/// After a lease expires and another request reclaims the key, the first holder's token is
/// stale: its complete, renew and release change nothing, and the new holder's result stands.
pub async fn stale_token_is_fenced(store: Arc<dyn Store>) {
    let key = fresh_key("fence");
    let fp = fingerprint(3);
    let first = claim_token(&*store, &key, &fp, SHORT_LEASE).await;
    tokio::time::sleep(SHORT_LEASE * 2).await;
    let second = claim_token(&*store, &key, &fp, LONG).await;
    assert_ne!(first, second, "a reclaim must get a new fencing token");
    let stale = response("stale");
    let results = [
        store.complete(&key, token(first), &stale, LONG).await,
        store.renew(&key, token(first), LONG).await,
        store.release(&key, token(first)).await,
    ];
    for result in results {
        assert_eq!(result.expect("fenced call"), Ownership::Stale);
    }
    let fresh = response("fresh");
    let done = store.complete(&key, token(second), &fresh, LONG).await;
    assert_eq!(done.expect("complete"), Ownership::Current);
    match store
        .claim(&key, &fp, fresh_token(), LONG)
        .await
        .expect("claim")
    {
        ClaimOutcome::Completed { record, .. } => assert_eq!(record.response.body, fresh.body),
        other => panic!("expected the new holder's result, got {other:?}"),
    }
    // A completed record cannot be completed again: a store answers `Stale`, or `Current` when
    // it treats the call as a resend of the completion that already applied (see the contract);
    // either way the record is unchanged.
    let after = store.complete(&key, token(second), &stale, LONG).await;
    after.expect("complete twice");
    let again = store.complete(&key, token(first), &stale, LONG).await;
    assert_eq!(again.expect("stale complete"), Ownership::Stale);
    match store.get(&key).await.expect("get") {
        Some(RecordState::Completed { record, .. }) => {
            assert_eq!(
                record.response.body, fresh.body,
                "a completed record never changes"
            )
        }
        other => panic!("expected the new holder's result, got {other:?}"),
    }
}

/// A live lease blocks other claimers; once it expires the key is claimable exactly once.
pub async fn lease_expiry_allows_reclaim(store: Arc<dyn Store>) {
    let key = Arc::new(fresh_key("lease"));
    let fp = fingerprint(4);
    claim_token(&*store, &key, &fp, SHORT_LEASE).await;
    match store
        .claim(&key, &fp, fresh_token(), LONG)
        .await
        .expect("claim")
    {
        ClaimOutcome::InFlight {
            lease_remaining, ..
        } => assert!(lease_remaining <= SHORT_LEASE, "{lease_remaining:?}"),
        other => panic!("a live lease must block, got {other:?}"),
    }
    tokio::time::sleep(SHORT_LEASE * 2).await;
    assert_eq!(store.get(&key).await.expect("get"), None, "expired lease");
    let claims: Vec<_> = (0..20)
        .map(|_| {
            let (store, key) = (store.clone(), key.clone());
            tokio::spawn(async move {
                store
                    .claim(&key, &fp, fresh_token(), LONG)
                    .await
                    .expect("claim")
            })
        })
        .collect();
    let mut winners = 0;
    for claim in claims {
        if matches!(claim.await.expect("task"), ClaimOutcome::Claimed { .. }) {
            winners += 1;
        }
    }
    assert_eq!(winners, 1, "an expired key is reclaimed exactly once");
}

/// A completed record is replayed until its TTL ends, then the key behaves as new.
pub async fn ttl_expiry_forgets_completed(store: Arc<dyn Store>) {
    let key = fresh_key("ttl");
    let fp = fingerprint(5);
    let t = claim_token(&*store, &key, &fp, LONG).await;
    let ttl = Duration::from_millis(400);
    let done = store.complete(&key, token(t), &response("x"), ttl).await;
    assert_eq!(done.expect("complete"), Ownership::Current);
    assert!(matches!(
        store.get(&key).await.expect("get"),
        Some(RecordState::Completed { .. })
    ));
    tokio::time::sleep(ttl * 2).await;
    assert_eq!(store.get(&key).await.expect("get"), None);
    claim_token(&*store, &key, &fp, LONG).await;
}

/// The store reports the existing record's fingerprint (in flight and completed) instead of
/// comparing it, so the layer can answer `422` for a reused key.
pub async fn fingerprint_is_reported(store: Arc<dyn Store>) {
    let key = fresh_key("fingerprint");
    let (original, other) = (fingerprint(6), fingerprint(7));
    let t = claim_token(&*store, &key, &original, LONG).await;
    match store
        .claim(&key, &other, fresh_token(), LONG)
        .await
        .expect("claim")
    {
        ClaimOutcome::InFlight { fingerprint, .. } => assert_eq!(fingerprint, original),
        other => panic!("expected in flight, got {other:?}"),
    }
    let done = store.complete(&key, token(t), &response("x"), LONG).await;
    assert_eq!(done.expect("complete"), Ownership::Current);
    match store
        .claim(&key, &other, fresh_token(), LONG)
        .await
        .expect("claim")
    {
        ClaimOutcome::Completed { record, .. } => assert_eq!(record.fingerprint, original),
        other => panic!("expected completed, got {other:?}"),
    }
}

/// Bodies with every byte value, a 1 MiB body, an empty body and the omitted-body marker
/// round-trip unchanged.
pub async fn binary_and_large_bodies_round_trip(store: Arc<dyn Store>) {
    let binary: Vec<u8> = (0..=255u8).collect();
    let large: Vec<u8> = (0..1024 * 1024).map(|i| (i * 31 % 251) as u8).collect();
    let mut omitted = response(Bytes::new());
    omitted.body_omitted = true;
    omitted.status = StatusCode::OK;
    for cached in [
        response(binary),
        response(large),
        response(Bytes::new()),
        omitted,
    ] {
        let key = fresh_key("bodies");
        let fp = fingerprint(8);
        let t = claim_token(&*store, &key, &fp, LONG).await;
        let done = store.complete(&key, token(t), &cached, LONG).await;
        assert_eq!(done.expect("complete"), Ownership::Current);
        match store
            .claim(&key, &fp, fresh_token(), LONG)
            .await
            .expect("claim")
        {
            ClaimOutcome::Completed { record, .. } => assert_eq!(record.response, cached),
            other => panic!("expected completed, got {other:?}"),
        }
    }
}

/// A released key is claimable at once, with a new token.
pub async fn release_frees_the_key(store: Arc<dyn Store>) {
    let key = fresh_key("release");
    let fp = fingerprint(9);
    let first = claim_token(&*store, &key, &fp, LONG).await;
    let released = store.release(&key, token(first)).await;
    assert_eq!(released.expect("release"), Ownership::Current);
    assert_eq!(store.get(&key).await.expect("get"), None);
    let second = claim_token(&*store, &key, &fp, LONG).await;
    assert_ne!(first, second);
    let twice = store.release(&key, token(first)).await;
    assert_eq!(twice.expect("release"), Ownership::Stale);
}

/// Renewing extends a lease past its original end.
pub async fn renew_extends_the_lease(store: Arc<dyn Store>) {
    let key = fresh_key("renew");
    let fp = fingerprint(10);
    let t = claim_token(&*store, &key, &fp, SHORT_LEASE).await;
    let renewed = store.renew(&key, token(t), LONG).await;
    assert_eq!(renewed.expect("renew"), Ownership::Current);
    tokio::time::sleep(SHORT_LEASE * 2).await;
    match store.get(&key).await.expect("get") {
        Some(RecordState::InFlight {
            token: current,
            fingerprint,
            ..
        }) => {
            assert_eq!(current.0, t);
            assert_eq!(fingerprint, fp);
        }
        other => panic!("a renewed lease must still hold, got {other:?}"),
    }
}

/// `Duration::MAX` as a lease or TTL means "as long as the store can": claim, renew and
/// complete succeed and the record is kept (a store saturates at
/// [`LONGEST_DURATION`](crate::store::LONGEST_DURATION) or beyond, never errors or panics).
pub async fn extreme_durations_mean_forever(store: Arc<dyn Store>) {
    let key = fresh_key("forever");
    let fp = fingerprint(11);
    let t = claim_token(&*store, &key, &fp, Duration::MAX).await;
    let renewed = store.renew(&key, token(t), Duration::MAX).await;
    assert_eq!(
        renewed.expect("renew with Duration::MAX"),
        Ownership::Current
    );
    let completed = store
        .complete(&key, token(t), &response(&b"forever"[..]), Duration::MAX)
        .await;
    assert_eq!(
        completed.expect("complete with Duration::MAX"),
        Ownership::Current
    );
    match store
        .claim(&key, &fp, fresh_token(), Duration::MAX)
        .await
        .expect("claim")
    {
        ClaimOutcome::Completed { record, .. } => assert_eq!(&record.response.body[..], b"forever"),
        other => panic!("the record must be kept, got {other:?}"),
    }
}

/// `forget` deletes a completed record (the key then runs again), answers `false` for an absent
/// key, and leaves other keys alone.
pub async fn forget_deletes_one_record(store: Arc<dyn Store>) {
    let (key, other) = (fresh_key("forget"), fresh_key("forget-other"));
    let fp = fingerprint(12);
    for k in [&key, &other] {
        let t = claim_token(&*store, k, &fp, LONG).await;
        let done = store.complete(k, token(t), &response("kept"), LONG).await;
        assert_eq!(done.expect("complete"), Ownership::Current);
    }
    assert!(
        store.forget(&key).await.expect("forget"),
        "a live record was deleted"
    );
    assert_eq!(store.get(&key).await.expect("get"), None);
    assert!(
        !store.forget(&key).await.expect("forget again"),
        "nothing left to delete"
    );
    assert!(
        !store
            .forget(&fresh_key("forget-absent"))
            .await
            .expect("forget absent"),
        "an absent key deletes nothing"
    );
    assert!(
        matches!(
            store
                .claim(&key, &fp, FencingToken::random().expect("token"), LONG)
                .await
                .expect("claim"),
            ClaimOutcome::Claimed { .. }
        ),
        "a forgotten key runs again"
    );
    match store.get(&other).await.expect("get other") {
        Some(RecordState::Completed { record, .. }) => {
            assert_eq!(&record.response.body[..], b"kept")
        }
        state => panic!("another key must be untouched, got {state:?}"),
    }
}

/// `forget` deletes an in-flight record too; its holder is then fenced (`Stale`), so it cannot
/// overwrite the record of whoever claims the key next.
pub async fn forget_fences_the_holder(store: Arc<dyn Store>) {
    let key = fresh_key("forget-in-flight");
    let fp = fingerprint(13);
    let holder = claim_token(&*store, &key, &fp, LONG).await;
    assert!(matches!(
        store.get(&key).await.expect("get"),
        Some(RecordState::InFlight { .. })
    ));
    assert!(store.forget(&key).await.expect("forget"));
    assert_eq!(store.get(&key).await.expect("get"), None);
    let renewed = store.renew(&key, token(holder), LONG).await;
    assert_eq!(renewed.expect("renew"), Ownership::Stale);
    let next = claim_token(&*store, &key, &fp, LONG).await;
    assert_ne!(next, holder, "the next claim gets a new token");
    let late = store
        .complete(&key, token(holder), &response("late"), LONG)
        .await;
    assert_eq!(late.expect("complete"), Ownership::Stale);
    match store.get(&key).await.expect("get") {
        Some(RecordState::InFlight { token: current, .. }) => assert_eq!(current, token(next)),
        state => panic!("the new holder's claim must stand, got {state:?}"),
    }
}

/// A test server: `POST /orders` behind the layer, counting handler executions.
struct Server {
    url: String,
    executions: Arc<AtomicUsize>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.shutdown.take() {
            let _ = stop.send(());
        }
    }
}

async fn order(
    State(executions): State<Arc<AtomicUsize>>,
    body: Bytes,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let n = executions.fetch_add(1, Ordering::SeqCst);
    // Simulated work, so that concurrent duplicates overlap with the running handler.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let body = String::from_utf8_lossy(&body).into_owned();
    let id = format!("{:016x}{n}", random_u64());
    let json = serde_json::json!({ "order_id": id, "echo": body }).to_string();
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        json,
    )
}

async fn serve(store: Arc<dyn Store>, executions: Arc<AtomicUsize>) -> Server {
    let app = Router::new()
        .route("/orders", post(order))
        .route_layer(IdempotencyLayer::client_keys(store).namespace("conformance-http"))
        .with_state(executions.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let url = format!("http://{}/orders", listener.local_addr().expect("addr"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = rx.await;
            })
            .await
            .expect("serve");
    });
    Server {
        url,
        executions,
        shutdown: Some(tx),
    }
}

async fn round(client: &reqwest::Client, urls: &[String], executions: &AtomicUsize) {
    const CONCURRENT: usize = 25;
    let key = fresh_key("http");
    let before = executions.load(Ordering::SeqCst);
    let barrier = Arc::new(tokio::sync::Barrier::new(CONCURRENT));
    let requests: Vec<_> = (0..CONCURRENT)
        .map(|i| {
            let (client, barrier, key) = (client.clone(), barrier.clone(), key.clone());
            let url = urls[i % urls.len()].clone();
            tokio::spawn(async move {
                barrier.wait().await;
                let response = client
                    .post(url)
                    .header("idempotency-key", key)
                    .body(r#"{"sku":"book","qty":1}"#)
                    .send()
                    .await
                    .expect("request");
                let status = response.status();
                let replayed = response.headers().contains_key("idempotent-replayed");
                (status, replayed, response.bytes().await.expect("body"))
            })
        })
        .collect();
    let mut first: Option<Bytes> = None;
    let mut executed = 0;
    for request in requests {
        let (status, replayed, body) = request.await.expect("task");
        match status.as_u16() {
            201 => {
                executed += usize::from(!replayed);
                match &first {
                    Some(first) => assert_eq!(&body, first, "every caller gets the first body"),
                    None => first = Some(body),
                }
            }
            409 => {}
            other => panic!("unexpected status {other}: {body:?}"),
        }
    }
    assert_eq!(
        executions.load(Ordering::SeqCst) - before,
        1,
        "the handler runs exactly once per round"
    );
    assert_eq!(
        executed, 1,
        "exactly one caller is served by the handler itself"
    );
    // A later retry is a byte-identical replay.
    let retry = client
        .post(&urls[0])
        .header("idempotency-key", &key)
        .body(r#"{"sku":"book","qty":1}"#)
        .send()
        .await
        .expect("retry");
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let body = retry.bytes().await.expect("body");
    if let Some(first) = first {
        assert_eq!(body, first);
    }
    assert_eq!(executions.load(Ordering::SeqCst) - before, 1);
}

/// Over real HTTP: 10 rounds of 25 concurrent identical POSTs run the handler exactly once per
/// round; every caller gets the first response (or `409` while it runs); a retry replays it.
pub async fn http_rounds_run_handler_once(store: Arc<dyn Store>) {
    let server = serve(store, Arc::new(AtomicUsize::new(0))).await;
    let client = reqwest::Client::new();
    for _ in 0..10 {
        round(
            &client,
            std::slice::from_ref(&server.url),
            &server.executions,
        )
        .await;
    }
}

/// Two application instances (two layers, two stores with separate pools or clients over one
/// backend) still run the handler exactly once per key.
pub async fn two_instances_over_http(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let executions = Arc::new(AtomicUsize::new(0));
    let (one, two) = (
        serve(a, executions.clone()).await,
        serve(b, executions.clone()).await,
    );
    let client = reqwest::Client::new();
    let urls = [one.url.clone(), two.url.clone()];
    for _ in 0..5 {
        round(&client, &urls, &executions).await;
    }
}

/// A completed key survives dropping the store (and its pool) and creating a new one.
pub async fn restart_keeps_completed(before: Arc<dyn Store>, after: Arc<dyn Store>) {
    let key = fresh_key("restart");
    let fp = fingerprint(11);
    let t = claim_token(&*before, &key, &fp, LONG).await;
    let cached = response("survives");
    let done = before.complete(&key, token(t), &cached, LONG).await;
    assert_eq!(done.expect("complete"), Ownership::Current);
    drop(before);
    match after
        .claim(&key, &fp, fresh_token(), LONG)
        .await
        .expect("claim")
    {
        ClaimOutcome::Completed { record, .. } => assert_eq!(record.response, cached),
        other => panic!("a completed key must survive a restart, got {other:?}"),
    }
}

/// A test server: `POST /orders` behind a layer with a 300 ms lease, answering `size` bytes;
/// with `gate`, the first execution signals `started` and waits for `gate` before answering.
async fn serve_gated(
    store: Arc<dyn Store>,
    size: usize,
    started: Arc<tokio::sync::Notify>,
    gate: Option<Arc<tokio::sync::Notify>>,
) -> Server {
    let executions = Arc::new(AtomicUsize::new(0));
    let handler = {
        let executions = executions.clone();
        move || {
            let (executions, started, gate) = (executions.clone(), started.clone(), gate.clone());
            async move {
                let n = executions.fetch_add(1, Ordering::SeqCst);
                if let (0, Some(gate)) = (n, gate) {
                    started.notify_one();
                    gate.notified().await;
                }
                (StatusCode::CREATED, vec![b'x'; size])
            }
        }
    };
    let layer = IdempotencyLayer::client_keys(store)
        .namespace("conformance-http")
        .lease(SHORT_LEASE);
    let app = Router::new()
        .route("/orders", post(handler))
        .route_layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let url = format!("http://{}/orders", listener.local_addr().expect("addr"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = rx.await;
            })
            .await
            .expect("serve");
    });
    Server {
        url,
        executions,
        shutdown: Some(tx),
    }
}

/// Over real HTTP: a handler running for several lease lengths keeps its key. The layer renews
/// the 300 ms lease beside the handler; 10 concurrent duplicates sent after two lease lengths
/// all get `409`, the handler runs once, and a retry replays its response.
pub async fn slow_handler_keeps_its_key_over_http(store: Arc<dyn Store>) {
    let started = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Notify::new());
    let server = serve_gated(store, 16, started.clone(), Some(gate.clone())).await;
    let client = reqwest::Client::new();
    let key = fresh_key("slow");
    let first = tokio::spawn({
        let (client, url, key) = (client.clone(), server.url.clone(), key.clone());
        async move {
            client
                .post(url)
                .header("idempotency-key", key)
                .body("{}")
                .send()
                .await
                .expect("first request")
                .status()
        }
    });
    started.notified().await;
    // Without renewals the lease would lapse in this time.
    tokio::time::sleep(SHORT_LEASE * 2).await;
    let duplicates: Vec<_> = (0..10)
        .map(|_| {
            let (client, url, key) = (client.clone(), server.url.clone(), key.clone());
            tokio::spawn(async move {
                client
                    .post(url)
                    .header("idempotency-key", key)
                    .body("{}")
                    .send()
                    .await
                    .expect("duplicate")
                    .status()
            })
        })
        .collect();
    for duplicate in duplicates {
        assert_eq!(
            duplicate.await.expect("task"),
            StatusCode::CONFLICT,
            "the renewed lease still holds the key"
        );
    }
    gate.notify_one();
    assert_eq!(first.await.expect("task"), StatusCode::CREATED);
    let retry = client
        .post(&server.url)
        .header("idempotency-key", &key)
        .body("{}")
        .send()
        .await
        .expect("retry");
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(server.executions.load(Ordering::SeqCst), 1);
}

/// Over real HTTP, for a store that refuses records over `limit` bytes (configure it so): a
/// response of twice `limit` is answered whole, completes the key without its body, and is
/// replayed (status, headers, `Idempotent-Body-Omitted: true`, empty body) after the lease,
/// never run a second time.
pub async fn records_over_the_store_limit_complete_without_body(
    store: Arc<dyn Store>,
    limit: usize,
) {
    let server = serve_gated(store, 2 * limit, Arc::default(), None).await;
    let client = reqwest::Client::new();
    let key = fresh_key("too-large");
    let send = || {
        client
            .post(&server.url)
            .header("idempotency-key", &key)
            .body("{}")
            .send()
    };
    let first = send().await.expect("first request");
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(first.bytes().await.expect("body").len(), 2 * limit);
    tokio::time::sleep(SHORT_LEASE * 2).await;
    let retry = send().await.expect("retry");
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.headers()["idempotent-body-omitted"], "true");
    assert!(retry.bytes().await.expect("body").is_empty());
    assert_eq!(server.executions.load(Ordering::SeqCst), 1);
}

/// What the handler of [`serve_waiting`] does on its first execution (later ones sleep
/// [`WAITED_WORK`] and answer `201`).
#[derive(Clone)]
enum First {
    /// Sleeps [`WAITED_WORK`] and answers `201`.
    Succeeds,
    /// Sleeps [`WAITED_WORK`] and answers `500`: the key is released.
    Fails,
    /// Signals `started`, waits for `gate`, answers `201`.
    Gated(Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>),
}

/// The simulated work of the handler behind [`serve_waiting`].
const WAITED_WORK: Duration = Duration::from_millis(500);

/// A test server: `POST /orders` behind a layer with `wait_for_result(max_wait)`, answering a
/// JSON body unique to each execution. Returns the layer too, to read its waiters.
async fn serve_waiting(
    store: Arc<dyn Store>,
    executions: Arc<AtomicUsize>,
    max_wait: Duration,
    first: First,
) -> (Server, IdempotencyLayer) {
    let handler = {
        let executions = executions.clone();
        move || {
            let (executions, first) = (executions.clone(), first.clone());
            async move {
                let n = executions.fetch_add(1, Ordering::SeqCst);
                let status = match (n, first) {
                    (0, First::Gated(started, gate)) => {
                        started.notify_one();
                        gate.notified().await;
                        StatusCode::CREATED
                    }
                    (0, First::Fails) => {
                        tokio::time::sleep(WAITED_WORK).await;
                        StatusCode::INTERNAL_SERVER_ERROR
                    }
                    _ => {
                        tokio::time::sleep(WAITED_WORK).await;
                        StatusCode::CREATED
                    }
                };
                let id = format!("{:016x}{n}", random_u64());
                (status, serde_json::json!({ "order_id": id }).to_string())
            }
        }
    };
    let layer = IdempotencyLayer::client_keys(store)
        .namespace("conformance-http")
        .wait_for_result(max_wait);
    let app = Router::new()
        .route("/orders", post(handler))
        .route_layer(layer.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let url = format!("http://{}/orders", listener.local_addr().expect("addr"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = rx.await;
            })
            .await
            .expect("serve");
    });
    let server = Server {
        url,
        executions,
        shutdown: Some(tx),
    };
    (server, layer)
}

/// Sends 25 identical POSTs at once, spread over `urls`; answers each one's status, whether it
/// was a replay, and its body.
async fn concurrent_posts(
    client: &reqwest::Client,
    urls: &[String],
    key: &str,
) -> Vec<(StatusCode, bool, Bytes)> {
    const CONCURRENT: usize = 25;
    let barrier = Arc::new(tokio::sync::Barrier::new(CONCURRENT));
    let requests: Vec<_> = (0..CONCURRENT)
        .map(|i| {
            let (client, barrier, key) = (client.clone(), barrier.clone(), key.to_owned());
            let url = urls[i % urls.len()].clone();
            tokio::spawn(async move {
                barrier.wait().await;
                let response = client
                    .post(url)
                    .header("idempotency-key", key)
                    .body(r#"{"sku":"book","qty":1}"#)
                    .send()
                    .await
                    .expect("request");
                let status = response.status();
                let replayed = response.headers().contains_key("idempotent-replayed");
                (status, replayed, response.bytes().await.expect("body"))
            })
        })
        .collect();
    let mut answers = Vec::new();
    for request in requests {
        answers.push(request.await.expect("task"));
    }
    answers
}

/// Asserts that every answer is a `201` with one body, exactly one of them not a replay.
fn one_result_for_all(answers: &[(StatusCode, bool, Bytes)]) {
    let first = &answers[0].2;
    for (status, _, body) in answers {
        assert_eq!(
            *status,
            StatusCode::CREATED,
            "no 409 while waiting: {body:?}"
        );
        assert_eq!(body, first, "every caller gets the one result");
    }
    let executed = answers.iter().filter(|(_, replayed, _)| !replayed).count();
    assert_eq!(
        executed, 1,
        "exactly one caller is served by the handler itself"
    );
}

/// Over real HTTP, with `wait_for_result`: 25 concurrent identical POSTs to a handler taking
/// 500 ms run it once, and all 25 get its `201` and body: no `409`. Nobody waits afterwards.
pub async fn waiting_duplicates_get_the_result_over_http(store: Arc<dyn Store>) {
    let executions = Arc::new(AtomicUsize::new(0));
    let (server, layer) =
        serve_waiting(store, executions, Duration::from_secs(10), First::Succeeds).await;
    let client = reqwest::Client::new();
    let answers = concurrent_posts(
        &client,
        std::slice::from_ref(&server.url),
        &fresh_key("wait"),
    )
    .await;
    one_result_for_all(&answers);
    assert_eq!(server.executions.load(Ordering::SeqCst), 1);
    assert_eq!(layer.waiting(), 0);
}

/// Over real HTTP, with `wait_for_result`: the first execution answers `500` (the key is
/// released); exactly one waiter claims the key and runs the handler, the other 23 get its
/// `201` and body.
pub async fn waiting_duplicates_run_once_after_a_release_over_http(store: Arc<dyn Store>) {
    let executions = Arc::new(AtomicUsize::new(0));
    let (server, layer) =
        serve_waiting(store, executions, Duration::from_secs(10), First::Fails).await;
    let client = reqwest::Client::new();
    let answers = concurrent_posts(
        &client,
        std::slice::from_ref(&server.url),
        &fresh_key("wait-release"),
    )
    .await;
    let (failed, succeeded): (Vec<_>, Vec<_>) = answers
        .into_iter()
        .partition(|(status, _, _)| *status == StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.len(), 1, "only the first execution fails");
    one_result_for_all(&succeeded);
    assert_eq!(
        server.executions.load(Ordering::SeqCst),
        2,
        "the failed run, then exactly one waiter's"
    );
    assert_eq!(layer.waiting(), 0);
}

/// Waits until `condition` holds (polled every 5 ms, at most 10 s: then panics).
async fn until(what: &str, condition: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Over real HTTP, with `wait_for_result`: a duplicate waiting past `max_wait` gets the `409`
/// with a `Retry-After`; a waiting duplicate whose caller disconnects stops waiting and leaves
/// nothing behind; the first request then completes and is replayed, run once.
pub async fn waiting_ends_at_max_wait_or_disconnect_over_http(store: Arc<dyn Store>) {
    let started = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Notify::new());
    let executions = Arc::new(AtomicUsize::new(0));
    let first = First::Gated(started.clone(), gate.clone());
    let (server, layer) = serve_waiting(store, executions, Duration::from_millis(300), first).await;
    let client = reqwest::Client::new();
    let key = fresh_key("wait-bounds");
    let post = |client: &reqwest::Client| {
        client
            .post(&server.url)
            .header("idempotency-key", &key)
            .body("{}")
            .send()
    };
    let holder = tokio::spawn(post(&client));
    started.notified().await;

    let late = post(&client).await.expect("duplicate");
    assert_eq!(late.status(), StatusCode::CONFLICT, "past max_wait: 409");
    assert!(late.headers().contains_key("retry-after"));
    assert_eq!(layer.waiting(), 0);

    // A caller that goes away while its request waits: its own client, dropped with the task.
    let leaving = tokio::spawn(post(&reqwest::Client::new()));
    until("the duplicate waits", || layer.waiting() == 1).await;
    leaving.abort();
    let _ = leaving.await;
    until("the abandoned wait is gone", || layer.waiting() == 0).await;

    gate.notify_one();
    let first = holder.await.expect("task").expect("first request");
    assert_eq!(first.status(), StatusCode::CREATED);
    let retry = post(&client).await.expect("retry");
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(server.executions.load(Ordering::SeqCst), 1);
    assert_eq!(layer.waiting(), 0);
}

/// Two application instances (see [`two_instances_over_http`]) with `wait_for_result`: 25
/// concurrent identical POSTs spread over both run the handler once and all get its `201`.
/// The waiters on the instance not running it learn the result from the store's notices
/// ([`Store::settlements`]) or, for a store without them, by claiming again on their timer;
/// [`waiting_across_instances_is_notified_over_http`] tells the two apart.
pub async fn waiting_across_instances_over_http(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let executions = Arc::new(AtomicUsize::new(0));
    let wait = Duration::from_secs(10);
    let (one, _) = serve_waiting(a, executions.clone(), wait, First::Succeeds).await;
    let (two, _) = serve_waiting(b, executions.clone(), wait, First::Succeeds).await;
    let client = reqwest::Client::new();
    let urls = [one.url.clone(), two.url.clone()];
    let answers = concurrent_posts(&client, &urls, &fresh_key("wait-two")).await;
    one_result_for_all(&answers);
    assert_eq!(executions.load(Ordering::SeqCst), 1);
}

/// Generates one `#[tokio::test]` per conformance check.
///
/// The argument is an expression evaluating to a future of `Option<impl Store>`; it is evaluated
/// once per test, and `None` skips the test (say why on stderr; fail instead under CI).
#[macro_export]
macro_rules! store_conformance_tests {
    ($make:expr) => {
        $crate::__conformance_test!($make, claim_complete_replay);
        $crate::__conformance_test!($make, concurrent_claimers_have_one_winner);
        $crate::__conformance_test!($make, stale_token_is_fenced);
        $crate::__conformance_test!($make, lease_expiry_allows_reclaim);
        $crate::__conformance_test!($make, ttl_expiry_forgets_completed);
        $crate::__conformance_test!($make, fingerprint_is_reported);
        $crate::__conformance_test!($make, binary_and_large_bodies_round_trip);
        $crate::__conformance_test!($make, release_frees_the_key);
        $crate::__conformance_test!($make, renew_extends_the_lease);
        $crate::__conformance_test!($make, extreme_durations_mean_forever);
        $crate::__conformance_test!($make, caller_token_is_used_and_a_repeated_claim_is_claimed);
        $crate::__conformance_test!($make, remaining_ttl_is_reported_and_decreases);
        $crate::__conformance_test!($make, http_rounds_run_handler_once);
        $crate::__conformance_test!($make, slow_handler_keeps_its_key_over_http);
        $crate::__conformance_test!($make, forget_deletes_one_record);
        $crate::__conformance_test!($make, forget_fences_the_holder);
        $crate::__conformance_test!($make, waiting_duplicates_get_the_result_over_http);
        $crate::__conformance_test!($make, waiting_duplicates_run_once_after_a_release_over_http);
        $crate::__conformance_test!($make, waiting_ends_at_max_wait_or_disconnect_over_http);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_test {
    ($make:expr, $case:ident) => {
        #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            if let Some(store) = $make.await {
                let store: ::std::sync::Arc<dyn $crate::Store> = ::std::sync::Arc::new(store);
                $crate::conformance::$case(store).await;
            }
        }
    };
}
