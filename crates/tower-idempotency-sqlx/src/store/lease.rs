//! Lease rules: a claim or renewal dates its lease before it runs, so one that waited long (for a
//! row lock, for SQLite's write lock) would otherwise hand out a lease that is short or over.

use std::{future::Future, time::Duration};

use tower_idempotency_core::{ClaimOutcome, FencingToken, Ownership, StoreError};

/// Whether a claim or renewal that started at `started` took long enough (a quarter of the
/// lease) that the lease it wrote, dated from before any wait, needs restarting.
fn waited_too_long(started: std::time::Instant, lease: Duration) -> bool {
    started.elapsed() > lease / 4
}

/// Runs a claim statement; when it waited long after dating its lease, the lease may be short
/// or already over, so a granted claim is renewed before it is answered. If the lease is gone,
/// someone else holds the key now: a second claim statement says who, instead of granting a
/// dead claim.
pub(crate) async fn claim_with_a_whole_lease<C, CF, R, RF>(
    claim_once: C,
    renew: R,
    lease: Duration,
) -> Result<ClaimOutcome, StoreError>
where
    C: Fn() -> CF,
    CF: Future<Output = Result<ClaimOutcome, StoreError>>,
    R: FnOnce(FencingToken) -> RF,
    RF: Future<Output = Result<Ownership, StoreError>>,
{
    let started = std::time::Instant::now();
    match claim_once().await? {
        ClaimOutcome::Claimed { token } if waited_too_long(started, lease) => {
            match renew(token).await? {
                Ownership::Current => Ok(ClaimOutcome::Claimed { token }),
                Ownership::Stale => claim_once().await,
            }
        }
        outcome => Ok(outcome),
    }
}

/// Runs a renewal statement, again (up to three in all) while they wait long: a renewal dates
/// its lease before it waits, and the next one usually does not wait.
pub(crate) async fn renew_for_a_whole_lease<R, RF>(
    renew_once: R,
    lease: Duration,
) -> Result<Ownership, StoreError>
where
    R: Fn() -> RF,
    RF: Future<Output = Result<Ownership, StoreError>>,
{
    let mut attempts = 0;
    loop {
        let started = std::time::Instant::now();
        let renewed = renew_once().await?;
        attempts += 1;
        if renewed == Ownership::Stale || !waited_too_long(started, lease) || attempts == 3 {
            return Ok(renewed);
        }
    }
}
