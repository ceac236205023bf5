//! The memory store when full: the oldest completed records make room, in-flight ones never do,
//! and the store is bounded by bytes as well as by count.

use std::{sync::Arc, time::Duration};

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tower::{Layer, ServiceExt};
use tower_idempotency_core::{
    CachedResponse, ClaimOutcome, FencingToken, Fingerprint, IdempotencyLayer, MemoryStore,
    Outcome, Ownership, Store, StoreError,
};

const SHARDS: usize = 16;
const LONG: Duration = Duration::from_secs(60);

fn keyed(key: &str) -> Request<Body> {
    Request::post("/orders")
        .header("idempotency-key", key)
        .body(Body::from("{}"))
        .unwrap()
}

fn response(body: usize) -> CachedResponse {
    CachedResponse {
        status: StatusCode::CREATED,
        headers: http::HeaderMap::new(),
        body: Bytes::from(vec![b'r'; body]),
        body_omitted: false,
    }
}

#[tokio::test]
async fn a_store_full_of_completed_records_still_runs_new_keys() {
    // One record per shard; ten times as many keys as places.
    let store = Arc::new(MemoryStore::new().with_max_entries(SHARDS));
    let layer = IdempotencyLayer::client_keys(store.clone());
    let service = layer.layer(tower::service_fn(|_request: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(
            Response::builder()
                .status(StatusCode::CREATED)
                .body(Body::from("created"))
                .unwrap(),
        )
    }));
    let keys = 10 * SHARDS;
    for i in 0..keys {
        let answer = service
            .clone()
            .oneshot(keyed(&format!("k-{i}")))
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::CREATED, "key {i} must run");
        assert_eq!(
            answer.extensions().get::<Outcome>(),
            Some(&Outcome::Executed)
        );
    }
    assert!(
        store.len() <= SHARDS,
        "the count bound holds: {}",
        store.len()
    );
    let evicted = store.evictions();
    assert!(
        evicted >= (keys - SHARDS) as u64,
        "every key past the bound evicted one completed record, counted: {evicted}"
    );
    // The newest record is never the one evicted: it still replays.
    let last = service
        .oneshot(keyed(&format!("k-{}", keys - 1)))
        .await
        .unwrap();
    assert_eq!(last.extensions().get::<Outcome>(), Some(&Outcome::Replayed));
}

#[tokio::test]
async fn a_shard_full_of_in_flight_records_refuses_and_evicts_nothing() {
    let store = MemoryStore::new().with_max_entries(SHARDS);
    let fp = Fingerprint([1; 32]);
    let mut held = Vec::new();
    let mut refused = None;
    for i in 0..100 * SHARDS {
        let key = format!("k:{i}");
        match store.claim(&key, &fp, tok(), LONG).await {
            Ok(ClaimOutcome::Claimed { token }) => held.push((key, token)),
            Err(StoreError::CapacityExceeded(_)) => {
                refused = Some(key);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let refused = refused.expect("a shard full of in-flight records refuses a new key");
    assert_eq!(store.evictions(), 0);
    for (key, _) in &held {
        assert!(
            matches!(
                store.claim(key, &fp, tok(), LONG).await,
                Ok(ClaimOutcome::InFlight { .. })
            ),
            "an in-flight record is never evicted"
        );
    }
    // Once the holders complete, the same key takes the place of the oldest completed record.
    for (key, token) in &held {
        let done = store.complete(key, *token, &response(8), LONG).await;
        assert_eq!(done.unwrap(), Ownership::Current);
    }
    let after = store.claim(&refused, &fp, tok(), LONG).await;
    assert!(
        matches!(after, Ok(ClaimOutcome::Claimed { .. })),
        "{after:?}"
    );
    assert_eq!(store.evictions(), 1);
}

#[tokio::test]
async fn the_byte_bound_evicts_the_oldest_completed_records() {
    let limit = SHARDS * 8 * 1024;
    let store = MemoryStore::new().with_max_bytes(limit);
    let fp = Fingerprint([2; 32]);
    // 200 records of 2 KiB: 400 KiB against a 128 KiB bound.
    for i in 0..200 {
        let key = format!("b:{i}");
        let Ok(ClaimOutcome::Claimed { token }) = store.claim(&key, &fp, tok(), LONG).await else {
            panic!("a fresh key is claimed while completed records can make room");
        };
        let done = store.complete(&key, token, &response(2048), LONG).await;
        assert_eq!(done.unwrap(), Ownership::Current, "key {i}");
    }
    assert!(store.bytes() <= limit, "{} bytes held", store.bytes());
    assert!(store.evictions() > 0);
    // The newest record is kept.
    assert!(matches!(
        store.claim("b:199", &fp, tok(), LONG).await,
        Ok(ClaimOutcome::Completed { record, .. }) if record.response.body.len() == 2048
    ));
}

#[tokio::test]
async fn a_record_larger_than_a_shard_may_hold_is_refused() {
    let store = MemoryStore::new().with_max_bytes(SHARDS * 1024);
    let fp = Fingerprint([3; 32]);
    let Ok(ClaimOutcome::Claimed { token }) = store.claim("big", &fp, tok(), LONG).await else {
        panic!("a fresh key is claimed");
    };
    match store.complete("big", token, &response(2048), LONG).await {
        Err(StoreError::RecordTooLarge { size, limit }) => {
            assert!(size > 2048);
            assert_eq!(limit, 1024);
        }
        other => panic!("expected RecordTooLarge, got {other:?}"),
    }
    // The claim is untouched: the holder may still complete without the body.
    let omitted = CachedResponse {
        body: Bytes::new(),
        body_omitted: true,
        ..response(0)
    };
    let done = store.complete("big", token, &omitted, LONG).await;
    assert_eq!(done.unwrap(), Ownership::Current);
}

fn tok() -> FencingToken {
    FencingToken::random().expect("a token")
}
