//! Durations at their extremes: nothing panics, and a lease is always renewed in time.

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tokio::sync::Notify;
use tower::{Layer, ServiceExt};
use tower_idempotency_core::{
    CachedResponse, ClaimOutcome, Fingerprint, IdempotencyLayer, MemoryStore, Outcome, Ownership,
    Store, StoreError,
};

fn keyed(key: &str) -> Request<Body> {
    Request::post("/orders")
        .header("idempotency-key", key)
        .body(Body::from("{}"))
        .unwrap()
}

fn response() -> CachedResponse {
    CachedResponse {
        status: StatusCode::CREATED,
        headers: http::HeaderMap::new(),
        body: bytes::Bytes::from_static(b"created"),
        body_omitted: false,
    }
}

#[tokio::test]
async fn the_memory_store_takes_duration_max_as_forever() {
    let store = MemoryStore::new();
    let fingerprint = Fingerprint([7; 32]);
    let token = claim_fresh(&store, "k", &fingerprint, Duration::MAX).await;
    assert_eq!(
        store.renew("k", token, Duration::MAX).await.unwrap(),
        Ownership::Current
    );
    assert_eq!(
        store
            .complete("k", token, &response(), Duration::MAX)
            .await
            .unwrap(),
        Ownership::Current
    );
    assert!(matches!(
        store.claim("k", &fingerprint, tower_idempotency_core::FencingToken::random().unwrap(), Duration::MAX).await.unwrap(),
        ClaimOutcome::Completed { record, .. } if record.response.body == "created"
    ));
}

#[tokio::test]
async fn a_layer_ttl_of_duration_max_keeps_the_response() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = IdempotencyLayer::client_keys(MemoryStore::new())
        .ttl(Duration::MAX)
        .max_lease_renewal(Duration::MAX)
        .lease(Duration::MAX)
        .layer(tower::service_fn({
            let runs = runs.clone();
            move |_request: Request<Body>| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Infallible>(Response::new(Body::from("created"))) }
            }
        }));
    let first = service.clone().oneshot(keyed("forever")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(outcome(&first), Some(Outcome::Executed));
    let again = service.oneshot(keyed("forever")).await.unwrap();
    assert_eq!(outcome(&again), Some(Outcome::Replayed));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_lease_too_short_to_renew_is_raised_to_the_minimum() {
    let runs = Arc::new(AtomicUsize::new(0));
    let (started, proceed) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let service = IdempotencyLayer::client_keys(MemoryStore::new())
        .lease(Duration::from_millis(6))
        .layer(tower::service_fn({
            let (runs, started, proceed) = (runs.clone(), started.clone(), proceed.clone());
            move |_request: Request<Body>| {
                let first = runs.fetch_add(1, Ordering::SeqCst) == 0;
                let (started, proceed) = (started.clone(), proceed.clone());
                async move {
                    // Only the first run waits, so a second run fails the test instead of
                    // hanging it.
                    if first {
                        started.notify_one();
                        proceed.notified().await;
                    }
                    Ok::<_, Infallible>(Response::new(Body::from("created")))
                }
            }
        }));
    let first = tokio::spawn(service.clone().oneshot(keyed("slow")));
    started.notified().await;
    // Long past the 6 ms asked for, and past the minimum lease: only renewals keep the claim.
    tokio::time::sleep(tower_idempotency_core::MIN_LEASE * 3).await;
    let duplicate = service.oneshot(keyed("slow")).await.unwrap();
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    proceed.notify_one();
    let first = first.await.unwrap().unwrap();
    assert_eq!(outcome(&first), Some(Outcome::Executed));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_full_memory_store_purges_a_lease_a_renewal_shortened() {
    let store = MemoryStore::new().with_max_entries(1);
    let fingerprint = Fingerprint([1; 32]);
    let token = claim_fresh(&store, "a", &fingerprint, Duration::from_secs(60)).await;
    store
        .renew("a", token, Duration::from_millis(10))
        .await
        .unwrap();
    // Time passing is the point here: the shortened lease has to run out.
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(store.get("a").await.unwrap().is_none(), "`a` has expired");
    // Every shard holds at most one record; one of these keys shares `a`'s shard.
    for i in 0..1_000 {
        let key = format!("b:{i}");
        match store
            .claim(
                &key,
                &fingerprint,
                tower_idempotency_core::FencingToken::random().unwrap(),
                Duration::from_secs(60),
            )
            .await
        {
            Ok(ClaimOutcome::Claimed { token }) => {
                store.release(&key, token).await.unwrap();
            }
            Err(StoreError::CapacityExceeded(_)) => {
                panic!("{key} refused: its shard's only record had expired")
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// The outcome the layer recorded on `response`.
fn outcome<B>(response: &Response<B>) -> Option<Outcome> {
    response.extensions().get::<Outcome>().copied()
}

/// Claims `key`, which must be free, with a new token: the token.
async fn claim_fresh(
    store: &MemoryStore,
    key: &str,
    fingerprint: &Fingerprint,
    lease: Duration,
) -> tower_idempotency_core::FencingToken {
    let token = tower_idempotency_core::FencingToken::random().unwrap();
    let ClaimOutcome::Claimed { token } =
        store.claim(key, fingerprint, token, lease).await.unwrap()
    else {
        panic!("a fresh key is claimed")
    };
    token
}
