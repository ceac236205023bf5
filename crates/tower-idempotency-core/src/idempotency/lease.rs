//! Keeping a claim's lease while its handler runs.

use std::{future::Future, pin::Pin, task::Poll};

use tokio::time::Instant;

use super::{config::Config, metrics};
use crate::store::{FencingToken, Ownership};

/// Runs `work` while renewing the lease every third of its length, up to the renewal ceiling;
/// returns its output and the moment the lease is known to hold until (`started`, when the claim
/// returned, plus the lease, or the last successful renewal's start plus the lease).
///
/// The renewals run beside `work` in the same task: `work` is polled while a renewal waits on
/// the store. `work` is pinned by the caller, in its own state: taken by value, it would be
/// stored twice in this future (as the argument and pinned), and moved into it on every request.
pub(super) async fn renewing_lease<F: Future>(
    config: &Config,
    key: &str,
    token: FencingToken,
    started: Instant,
    mut work: Pin<&mut F>,
) -> (F::Output, Instant) {
    // A handler that finishes on its first poll never needs a renewal; the renewals (a timer
    // registration) are set up only for one that waits on something.
    if let Poll::Ready(output) = futures_util::poll!(work.as_mut()) {
        return (output, started + config.lease);
    }
    let held_until = std::sync::Mutex::new(started + config.lease);
    let renewals = keep_renewing(config, key, token, &held_until);
    let output = tokio::select! {
        biased;
        output = work.as_mut() => output,
        never = renewals => match never {},
    };
    let lease_ends = *held_until.lock().unwrap_or_else(|p| p.into_inner());
    (output, lease_ends)
}

/// Renews the lease every third of its length until the renewal ceiling; never returns. Each
/// successful renewal moves `held_until`.
async fn keep_renewing(
    config: &Config,
    key: &str,
    token: FencingToken,
    held_until: &std::sync::Mutex<Instant>,
) -> std::convert::Infallible {
    // At least 33 ms: the builder keeps the lease at or above `MIN_LEASE`.
    let period = config.lease / 3;
    let stop_renewing = Instant::now() + config.max_lease_renewal;
    let mut next = Instant::now() + period;
    while next < stop_renewing {
        tokio::time::sleep_until(next).await;
        let sent = Instant::now();
        let renewal = metrics::timed(
            config,
            "renew",
            config.store.renew(key, token, config.lease),
        );
        match tokio::time::timeout(config.store_timeout(), renewal).await {
            Ok(Ok(Ownership::Current)) => {
                *held_until.lock().unwrap_or_else(|p| p.into_inner()) = sent + config.lease;
            }
            Ok(Ok(Ownership::Stale)) => {
                metrics::lease_renewal_lost(config);
                tracing::warn!("lease lost while the handler runs; a retry may run it again")
            }
            Ok(Err(error)) => tracing::warn!(%error, "lease renewal failed"),
            Err(_) => tracing::warn!("lease renewal timed out"),
        }
        next = sent + period;
    }
    tokio::time::sleep_until(stop_renewing).await;
    tracing::warn!(
        ceiling = ?config.max_lease_renewal,
        "the handler outlived the lease renewal ceiling; once its lease lapses, a retry may run it again"
    );
    std::future::pending().await
}
