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

mod hooked;
mod once;
mod over_http;
mod records;
mod server;
mod waiting;

mod notices;

pub use crate::store::Call;
pub use hooked::{CountClaims, CountingStore, Guard, Guarded, Hooked, Hooks};
pub use notices::{
    notified_waiter_leaves_nothing_behind_over_http, settlements_are_notified_across_instances,
    waiting_across_instances_is_notified_over_http,
};
pub use once::{
    run_once_answers_duplicates_mismatches_and_failures,
    run_once_has_one_run_under_concurrent_callers, run_once_lease_loss_lets_another_caller_run,
    run_once_result_ends_with_its_ttl,
};
pub use over_http::{
    http_rounds_run_handler_once, records_over_the_store_limit_complete_without_body,
    slow_handler_keeps_its_key_over_http, two_instances_over_http,
};
pub use records::{
    a_resent_completion_is_current, binary_and_large_bodies_round_trip,
    caller_token_is_used_and_a_repeated_claim_is_claimed, claim_complete_replay,
    concurrent_claimers_have_one_winner, extreme_durations_mean_forever, fingerprint_is_reported,
    forget_deletes_one_record, forget_fences_the_holder, lease_expiry_allows_reclaim,
    release_frees_the_key, remaining_ttl_is_reported_and_decreases, renew_extends_the_lease,
    restart_keeps_completed, stale_token_is_fenced, ttl_expiry_forgets_completed,
};
pub use server::LoopbackServer;
pub use waiting::{
    waiting_across_instances_over_http, waiting_duplicates_get_the_result_over_http,
    waiting_duplicates_run_once_after_a_release_over_http,
    waiting_ends_at_max_wait_or_disconnect_over_http,
};

use std::{
    hash::{BuildHasher, RandomState},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};

use crate::store::{
    CachedResponse, ClaimOutcome, CompletedRecord, FencingToken, Fingerprint, Ownership, Store,
};

/// The lease of the checks that let one expire. Long enough that the store calls a check makes
/// while the lease must still hold finish within it on a loaded 2-core machine; the checks that
/// wait for it to end sleep past it (real time has to pass, there is no signal to await).
const SHORT_LEASE: Duration = Duration::from_secs(1);
/// How long a waiting duplicate may wait for a result in the checks where the wait is not what
/// they test: generous, so that a loaded machine never turns a wait into a `409`.
const MAX_WAIT: Duration = Duration::from_secs(30);
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

/// Completes `key` as the holder of the token `holder`, asserting that the store takes it.
async fn complete_as(store: &dyn Store, key: &str, holder: u64, cached: &CachedResponse) {
    let done = store.complete(key, token(holder), cached, LONG).await;
    assert_eq!(done.expect("complete"), Ownership::Current);
}

/// Claims `key` as another caller does: with a fresh token.
async fn claim_as_another(store: &dyn Store, key: &str, fp: &Fingerprint) -> ClaimOutcome {
    store
        .claim(key, fp, fresh_token(), LONG)
        .await
        .expect("claim")
}

/// Claims `key` with a fresh token and answers the completed record found there; anything else
/// panics with `expected` and what was found.
async fn replayed(
    store: &dyn Store,
    key: &str,
    fp: &Fingerprint,
    expected: &str,
) -> CompletedRecord {
    match claim_as_another(store, key, fp).await {
        ClaimOutcome::Completed { record, .. } => record,
        other => panic!("{expected}, got {other:?}"),
    }
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
        $crate::__conformance_test!($make, a_resent_completion_is_current);
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
        $crate::__conformance_test!($make, run_once_has_one_run_under_concurrent_callers);
        $crate::__conformance_test!($make, run_once_answers_duplicates_mismatches_and_failures);
        $crate::__conformance_test!($make, run_once_lease_loss_lets_another_caller_run);
        $crate::__conformance_test!($make, run_once_result_ends_with_its_ttl);
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
