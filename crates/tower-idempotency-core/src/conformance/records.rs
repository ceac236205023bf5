//! Checks that call the store directly: claiming, completing, fencing, leases, TTLs, releasing
//! and forgetting records.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http::StatusCode;

use super::{
    claim_as_another, claim_token, complete_as, fingerprint, fresh_key, fresh_token, replayed,
    response, token, LONG, SHORT_LEASE,
};
use crate::store::{
    ClaimOutcome, CompletedRecord, FencingToken, Fingerprint, Ownership, RecordState, Store,
};

/// Claim, complete, then a second claim replays the response with its headers (repeated ones
/// too), and `get` reads the same record.
pub async fn claim_complete_replay(store: Arc<dyn Store>) {
    let key = fresh_key("replay");
    let fp = fingerprint(1);
    assert_eq!(store.get(&key).await.expect("get"), None, "unknown key");
    let t = claim_token(&*store, &key, &fp, LONG).await;
    let cached = response(r#"{"order_id":"ord_1"}"#);
    complete_as(&*store, &key, t, &cached).await;
    let expected = CompletedRecord {
        fingerprint: fp,
        response: cached,
    };
    let record = replayed(&*store, &key, &fp, "expected the completed record").await;
    assert_eq!(record, expected);
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
    match claim_as_another(&*store, &key, &fp).await {
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
    let first = match claim_as_another(&*store, &key, &fp).await {
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

/// `n` claims of `key` on tasks of their own, released together by a barrier: their outcomes.
async fn concurrent_claims(
    store: &Arc<dyn Store>,
    key: &str,
    fp: Fingerprint,
    n: usize,
) -> Vec<ClaimOutcome> {
    let key = Arc::new(key.to_owned());
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
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
    let mut outcomes = Vec::with_capacity(n);
    for task in tasks {
        outcomes.push(task.await.expect("task"));
    }
    outcomes
}

/// 100 concurrent claimers of one key: exactly one wins, every other one sees it in flight with
/// the winner's fingerprint.
pub async fn concurrent_claimers_have_one_winner(store: Arc<dyn Store>) {
    let key = fresh_key("race");
    let fp = fingerprint(2);
    let mut winners = 0;
    for outcome in concurrent_claims(&store, &key, fp, 100).await {
        match outcome {
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
    // Real time has to pass for the lease to end; a store has no signal for it.
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
    complete_as(&*store, &key, second, &fresh).await;
    let record = replayed(&*store, &key, &fp, "expected the new holder's result").await;
    assert_eq!(record.response.body, fresh.body);
    // A completed record cannot be completed again: its holder's resend is answered `Current`
    // (see `a_resent_completion_is_current`) and the record is unchanged.
    let after = store.complete(&key, token(second), &stale, LONG).await;
    assert_eq!(after.expect("complete twice"), Ownership::Current);
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

/// A completion resent by its holder after the first one landed (its answer was lost to a
/// timeout or a dropped connection) is answered `Current`, so the layer does not count a
/// recorded result as unrecorded; the record keeps the first completion's response, and any
/// other token is still `Stale`.
pub async fn a_resent_completion_is_current(store: Arc<dyn Store>) {
    let key = fresh_key("resent");
    let fp = fingerprint(4);
    let holder = claim_token(&*store, &key, &fp, LONG).await;
    let first = response("first");
    complete_as(&*store, &key, holder, &first).await;
    let resent = store.complete(&key, token(holder), &first, LONG).await;
    assert_eq!(
        resent.expect("resent complete"),
        Ownership::Current,
        "the record is completed by this token"
    );
    let changed = store
        .complete(&key, token(holder), &response("changed"), LONG)
        .await;
    assert_eq!(changed.expect("resent complete"), Ownership::Current);
    let other = store
        .complete(&key, token(holder.wrapping_add(1)), &first, LONG)
        .await;
    assert_eq!(other.expect("other token"), Ownership::Stale);
    let record = replayed(&*store, &key, &fp, "expected the first completion").await;
    assert_eq!(
        record.response.body, first.body,
        "a completed record never changes"
    );
}

/// A live lease blocks other claimers; once it expires the key is claimable exactly once.
pub async fn lease_expiry_allows_reclaim(store: Arc<dyn Store>) {
    let key = fresh_key("lease");
    let fp = fingerprint(4);
    claim_token(&*store, &key, &fp, SHORT_LEASE).await;
    match claim_as_another(&*store, &key, &fp).await {
        ClaimOutcome::InFlight {
            lease_remaining, ..
        } => assert!(lease_remaining <= SHORT_LEASE, "{lease_remaining:?}"),
        other => panic!("a live lease must block, got {other:?}"),
    }
    // Real time has to pass for the lease to end; a store has no signal for it.
    tokio::time::sleep(SHORT_LEASE * 2).await;
    assert_eq!(store.get(&key).await.expect("get"), None, "expired lease");
    let winners = concurrent_claims(&store, &key, fp, 20)
        .await
        .into_iter()
        .filter(|outcome| matches!(outcome, ClaimOutcome::Claimed { .. }))
        .count();
    assert_eq!(winners, 1, "an expired key is reclaimed exactly once");
}

/// A completed record is replayed until its TTL ends, then the key behaves as new.
pub async fn ttl_expiry_forgets_completed(store: Arc<dyn Store>) {
    let key = fresh_key("ttl");
    let fp = fingerprint(5);
    let t = claim_token(&*store, &key, &fp, LONG).await;
    // Long enough that the record is still there when checked right after completing.
    let ttl = SHORT_LEASE;
    let done = store.complete(&key, token(t), &response("x"), ttl).await;
    assert_eq!(done.expect("complete"), Ownership::Current);
    assert!(matches!(
        store.get(&key).await.expect("get"),
        Some(RecordState::Completed { .. })
    ));
    // Real time has to pass for the TTL to end; a store has no signal for it.
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
    match claim_as_another(&*store, &key, &other).await {
        ClaimOutcome::InFlight { fingerprint, .. } => assert_eq!(fingerprint, original),
        other => panic!("expected in flight, got {other:?}"),
    }
    complete_as(&*store, &key, t, &response("x")).await;
    let record = replayed(&*store, &key, &other, "expected completed").await;
    assert_eq!(record.fingerprint, original);
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
        complete_as(&*store, &key, t, &cached).await;
        let record = replayed(&*store, &key, &fp, "expected completed").await;
        assert_eq!(record.response, cached);
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
    // Past the original lease's end: real time has to pass, there is no signal to await.
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
/// [`LONGEST_DURATION`](crate::LONGEST_DURATION) or beyond, never errors or panics).
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
        complete_as(&*store, k, t, &response("kept")).await;
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

/// A completed key survives dropping the store (and its pool) and creating a new one.
pub async fn restart_keeps_completed(before: Arc<dyn Store>, after: Arc<dyn Store>) {
    let key = fresh_key("restart");
    let fp = fingerprint(11);
    let t = claim_token(&*before, &key, &fp, LONG).await;
    let cached = response("survives");
    complete_as(&*before, &key, t, &cached).await;
    drop(before);
    let record = replayed(&*after, &key, &fp, "a completed key must survive a restart").await;
    assert_eq!(record.response, cached);
}
