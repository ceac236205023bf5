//! Claiming a key within the store timeout, and releasing a claim whose answer never arrived.

use std::{future::Future, pin::pin, sync::Arc, task::Poll, time::Duration};

use tracing::{Instrument, Span};

use super::{
    config::Config,
    metrics,
    wait::{Mark, Waiters, Waiting},
};
use crate::store::{ClaimOutcome, FencingToken, Fingerprint, Ownership};

/// Claims `key` with a fresh token within the store timeout. A claim that failed, timed out or
/// was abandoned (the caller went away while it ran) may still have landed: the store may finish
/// a statement, or execute a command whose reply never arrives. Such a claim is released with its
/// own token in the background (see [`ReleaseUnanswered`]), so its key is not blocked for a
/// lease while nothing runs. The error is for logs only.
pub(super) async fn claim(
    config: &Arc<Config>,
    key: &str,
    fingerprint: &Fingerprint,
) -> Result<ClaimOutcome, String> {
    let token = FencingToken::random().map_err(|e| format!("no fencing token: {e}"))?;
    let mut unanswered = ReleaseUnanswered {
        config: Some(config.clone()),
        key,
        token,
    };
    let claimed = within(
        config.store_timeout(),
        metrics::timed(
            config,
            "claim",
            config.store.claim(key, fingerprint, token, config.lease),
        ),
    )
    .await;
    match claimed {
        Some(Ok(outcome)) => {
            unanswered.config = None;
            Ok(outcome)
        }
        Some(Err(error)) => Err(error.to_string()),
        None => Err(format!("timed out after {:?}", config.store_timeout())),
    }
}

/// Releases a claim that got no answer, when dropped armed (`config` set): at once, and once more
/// after the store timeout if the first release found nothing (a statement still running on the
/// server may land after it). Each attempt is bounded by the store timeout; a claim that never
/// landed makes both no-ops (`Stale`). Tracked, so a drain waits for it.
struct ReleaseUnanswered<'a> {
    config: Option<Arc<Config>>,
    key: &'a str,
    token: FencingToken,
}

impl Drop for ReleaseUnanswered<'_> {
    fn drop(&mut self) {
        let Some(config) = self.config.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (key, token) = (self.key.to_owned(), self.token);
        let tasks = config.tasks.clone();
        let release = async move {
            for attempt in 0..2 {
                if attempt > 0 {
                    tokio::time::sleep(config.store_timeout()).await;
                }
                let release = metrics::timed(&config, "release", config.store.release(&key, token));
                match within(config.store_timeout(), release).await {
                    Some(Ok(Ownership::Current)) => {
                        tracing::info!("released a claim whose answer never arrived");
                        return;
                    }
                    Some(Ok(Ownership::Stale)) => {}
                    Some(Err(error)) => {
                        tracing::warn!(%error, "releasing an unanswered claim failed")
                    }
                    None => tracing::warn!("releasing an unanswered claim timed out"),
                }
            }
        };
        runtime.spawn(tasks.track_future(release.instrument(Span::current())));
    }
}

/// Like `tokio::time::timeout(limit, future)` (`None` when it elapses), but without arming the
/// timer when `future` is ready on its first poll (the memory store, a local-cache hit): arming
/// reads the clock and builds a timer entry, a few percent of an in-process replay in the
/// profile. The limit therefore runs from the end of the first poll, which for a store that
/// returns `Pending` promptly, as an async store must, is the same moment.
pub(super) async fn within<F: Future>(limit: Duration, future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    if let Poll::Ready(output) = futures_util::poll!(&mut future) {
        return Some(output);
    }
    tokio::time::timeout(limit, future).await.ok()
}

/// With `wait_for_result` (see `wait.rs`): waits while `claimed` finds the key in flight for this very request (same fingerprint),
/// claiming it again after each wait; answers the last claim, which is still in flight when
/// the wait ended or the bound on waiters was reached. `mark` was taken before the first claim.
pub(super) async fn until_settled(
    config: &Arc<Config>,
    waiters: &Arc<Waiters>,
    mark: Mark,
    key: &str,
    fingerprint: &Fingerprint,
    mut claimed: Result<ClaimOutcome, String>,
) -> Result<ClaimOutcome, String> {
    let mut waiting = Waiting::new(waiters, mark);
    while let Ok(ClaimOutcome::InFlight {
        fingerprint: holder,
        lease_remaining,
        ..
    }) = &claimed
    {
        if holder != fingerprint || !waiting.wait(key, *lease_remaining).await {
            break;
        }
        waiting.before_claim();
        claimed = claim(config, key, fingerprint).await;
    }
    claimed
}
