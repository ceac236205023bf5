use super::*;

/// Completes `key` with `body` and returns the body the store replays.
async fn stored_body(store: &MemoryStore, key: &str, body: Bytes) -> Bytes {
    let fp = Fingerprint([3; 32]);
    let claim = || {
        store.claim(
            key,
            &fp,
            FencingToken::random().unwrap(),
            Duration::from_secs(60),
        )
    };
    let Ok(ClaimOutcome::Claimed { token }) = claim().await else {
        panic!("fresh key");
    };
    let response = CachedResponse {
        status: http::StatusCode::OK,
        headers: http::HeaderMap::new(),
        body,
        body_omitted: false,
    };
    let done = store
        .complete(key, token, &response, Duration::from_secs(60))
        .await;
    assert_eq!(done.unwrap(), Ownership::Current);
    match claim().await {
        Ok(ClaimOutcome::Completed { record, .. }) => record.response.body,
        other => panic!("expected the completed record, got {other:?}"),
    }
}

#[tokio::test]
async fn cached_bodies_are_copied_out_of_their_buffer() {
    let store = MemoryStore::new();
    // A body sliced out of a larger buffer, as hyper's read buffer hands it out.
    let buffer = Bytes::from(vec![b's'; 8 * 1024]);
    let small = buffer.slice(100..1124);
    let kept = stored_body(&store, "k:small", small.clone()).await;
    assert_eq!(kept, small);
    assert_ne!(
        kept.as_ptr(),
        small.as_ptr(),
        "copied: the 8 KiB buffer is not pinned"
    );
}

#[tokio::test]
async fn a_completion_with_a_short_ttl_frees_its_place_when_it_expires() {
    // One record per shard; the only record is completed with a TTL far shorter than the
    // lease it was claimed with, so the shard's expiry bound must follow the completion.
    let store = MemoryStore::new().with_max_entries(1);
    let fp = Fingerprint([1; 32]);
    let long = Duration::from_secs(60);
    let Ok(ClaimOutcome::Claimed { token }) = store
        .claim("a", &fp, FencingToken::random().unwrap(), long)
        .await
    else {
        panic!("fresh key");
    };
    // A key that lands in the shard of "a", found while "a" is in flight and cannot be
    // evicted (every other shard is empty again at once).
    let mut same_shard = None;
    for i in 0..10_000 {
        let key = format!("b:{i}");
        match store
            .claim(&key, &fp, FencingToken::random().unwrap(), long)
            .await
        {
            Ok(ClaimOutcome::Claimed { token }) => {
                store.release(&key, token).await.unwrap();
            }
            Err(StoreError::CapacityExceeded(_)) => {
                same_shard = Some(key);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let key = same_shard.expect("some key shares the shard of `a`");
    let response = CachedResponse {
        status: http::StatusCode::OK,
        headers: http::HeaderMap::new(),
        body: Bytes::from_static(b"done"),
        body_omitted: false,
    };
    let ttl = Duration::from_millis(50);
    let done = store.complete("a", token, &response, ttl).await;
    assert_eq!(done.unwrap(), Ownership::Current);
    // Waiting for the TTL to pass is the point of the test; there is no event to await.
    tokio::time::sleep(ttl * 2).await;
    let after = store
        .claim(&key, &fp, FencingToken::random().unwrap(), long)
        .await;
    assert!(
        matches!(after, Ok(ClaimOutcome::Claimed { .. })),
        "the expired completion must be purged to make room: {after:?}"
    );
    assert_eq!(store.evictions(), 0, "purged as expired, not evicted");
}

#[tokio::test]
async fn a_full_store_refuses_new_claims_until_records_expire() {
    let store = MemoryStore::new().with_max_entries(SHARDS);
    let fp = Fingerprint([1; 32]);
    let lease = Duration::from_millis(100);
    let mut refused = None;
    for i in 0..10 * SHARDS {
        match store
            .claim(
                &format!("k:{i}"),
                &fp,
                FencingToken::random().unwrap(),
                lease,
            )
            .await
        {
            Ok(ClaimOutcome::Claimed { .. }) => {}
            Err(StoreError::CapacityExceeded(limit)) => {
                refused = Some(i);
                assert_eq!(limit, SHARDS);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let refused = refused.expect("a bounded store must refuse once full");
    assert!(store.len() <= SHARDS);
    // Live records are never evicted to make room: that would let a duplicate run twice.
    let refused_key = format!("k:{refused}");
    let claim_refused = || store.claim(&refused_key, &fp, FencingToken::random().unwrap(), lease);
    let blocked = claim_refused().await;
    assert!(matches!(blocked, Err(StoreError::CapacityExceeded(_))));
    tokio::time::sleep(lease * 2).await;
    let after = claim_refused().await;
    assert!(
        matches!(after, Ok(ClaimOutcome::Claimed { .. })),
        "{after:?}"
    );
    store.purge_expired();
    assert!(store.len() <= 1);
}
