//! Waiting for an in-flight duplicate's result (see
//! [`IdempotencyLayer::wait_for_result`](super::IdempotencyLayer::wait_for_result)).
//!
//! A duplicate that finds its key in flight registers under the scoped key: every waiter of one
//! key shares one [`watch`] channel, which the executing request of this process signals once it
//! has completed or released the key. The waiter then claims the key again (one store call):
//! a completed key is replayed, a released one is claimed by exactly one waiter (the store's
//! claim is atomic), which runs the handler. A holder in another process never signals here, so
//! each waiter also re-claims on a timer: 50 ms, doubling, never later than the holder's
//! remaining lease or the end of the wait.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use super::{layer::Config, service};
use crate::store::{ClaimOutcome, Fingerprint};
use tokio::{
    sync::{watch, OwnedSemaphorePermit, Semaphore},
    time::Instant,
};

/// Waits while `claimed` finds the key in flight for this very request (same fingerprint),
/// claiming it again after each wait; answers the last claim, which is still in flight when
/// the wait ended or the bound on waiters was reached.
pub(super) async fn settle(
    config: &Arc<Config>,
    waiters: &Arc<Waiters>,
    key: &str,
    fingerprint: &Fingerprint,
    mut claimed: Result<ClaimOutcome, String>,
) -> Result<ClaimOutcome, String> {
    let mut waiting = Waiting::new(waiters);
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
        claimed = service::claim(config, key, fingerprint).await;
    }
    claimed
}

/// The first interval between a waiter's re-claims; it doubles after each.
const FIRST_POLL: Duration = Duration::from_millis(50);

/// The waiters of one layer: the bound on their number, and one channel per waited-on key.
pub(crate) struct Waiters {
    max_wait: Duration,
    limit: usize,
    permits: Arc<Semaphore>,
    keys: Mutex<HashMap<String, watch::Sender<()>>>,
}

impl Waiters {
    pub(crate) fn new(max_wait: Duration, limit: usize) -> Self {
        Self {
            max_wait,
            limit,
            permits: Arc::new(Semaphore::new(limit)),
            keys: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// How many requests wait now.
    pub(crate) fn waiting(&self) -> usize {
        self.limit - self.permits.available_permits()
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<()>>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the waiters of `key`, if any: its executing request has completed or released it.
    pub(crate) fn settled(&self, key: &str) {
        if let Some(sender) = self.keys().get(key) {
            sender.send_modify(|()| ());
        }
    }

    /// Registers a waiter of `key`; `None` when the layer's bound on waiters is reached.
    fn register(self: &Arc<Self>, key: &str) -> Option<Registration> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        let receiver = self
            .keys()
            .entry(key.to_owned())
            .or_insert_with(|| watch::channel(()).0)
            .subscribe();
        Some(Registration {
            waiters: self.clone(),
            key: key.to_owned(),
            receiver: Some(receiver),
            _permit: permit,
        })
    }

    #[cfg(test)]
    fn keys_len(&self) -> usize {
        self.keys().len()
    }
}

/// One waiter's place: its receiver on the key's channel and its share of the bound. Dropped
/// (the request is answered, or its caller went away), it removes the key's channel when it
/// was the key's last waiter.
struct Registration {
    waiters: Arc<Waiters>,
    key: String,
    receiver: Option<watch::Receiver<()>>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut keys = self.waiters.keys();
        // Dropped under the lock: a waiter registering now sees either this receiver or none.
        drop(self.receiver.take());
        if keys
            .get(&self.key)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            keys.remove(&self.key);
        }
    }
}

/// Notifies the waiters of a key when dropped: held by the executing request until it has
/// completed or released the key (or unwound).
pub(crate) struct SettledSignal {
    waiters: Arc<Waiters>,
    key: String,
}

impl SettledSignal {
    pub(crate) fn new(waiters: Option<&Arc<Waiters>>, key: &str) -> Option<Self> {
        waiters.map(|waiters| Self {
            waiters: waiters.clone(),
            key: key.to_owned(),
        })
    }
}

impl Drop for SettledSignal {
    fn drop(&mut self) {
        self.waiters.settled(&self.key);
    }
}

/// One duplicate's wait: until `max_wait` after it began.
struct Waiting {
    waiters: Arc<Waiters>,
    deadline: Instant,
    next_poll: Duration,
    registration: Option<Registration>,
}

impl Waiting {
    fn new(waiters: &Arc<Waiters>) -> Self {
        Self {
            waiters: waiters.clone(),
            deadline: Instant::now() + waiters.max_wait,
            next_poll: FIRST_POLL,
            registration: None,
        }
    }

    /// Waits until the key's holder here settles it, the poll interval passes (never past the
    /// holder's remaining lease) or the wait ends; `true` then, and the caller claims the key
    /// again (call [`before_claim`](Self::before_claim) first). `false` at once when the
    /// duplicate is to be answered as in flight: the wait is over, or the bound on waiters is
    /// reached.
    async fn wait(&mut self, key: &str, lease_remaining: Duration) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        if self.registration.is_none() {
            match self.waiters.register(key) {
                Some(registration) => self.registration = Some(registration),
                None => return false,
            }
        }
        let Some(receiver) = self.registration.as_mut().and_then(|r| r.receiver.as_mut()) else {
            return false;
        };
        let poll = self
            .next_poll
            .min(lease_remaining.max(Duration::from_millis(1)));
        let until = (now + poll).min(self.deadline);
        self.next_poll = self.next_poll.saturating_mul(2);
        tokio::select! {
            _ = receiver.changed() => {}
            () = tokio::time::sleep_until(until) => {}
        }
        true
    }

    /// Marks the key's signals so far as seen, so that one sent while the next claim runs
    /// still ends the next wait.
    fn before_claim(&mut self) {
        if let Some(receiver) = self.registration.as_mut().and_then(|r| r.receiver.as_mut()) {
            receiver.borrow_and_update();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dropped_waiter_leaves_no_channel_behind() {
        let waiters = Arc::new(Waiters::new(Duration::from_secs(60), 2));
        let mut one = Waiting::new(&waiters);
        let mut two = Waiting::new(&waiters);
        {
            let first = one.wait("k", Duration::from_secs(60));
            let second = two.wait("k", Duration::from_secs(60));
            let mut both = Box::pin(async { tokio::join!(first, second) });
            assert!(futures_util::poll!(&mut both).is_pending());
            assert_eq!(waiters.waiting(), 2);
            assert_eq!(waiters.keys_len(), 1, "one channel per key");
        }
        drop(one);
        assert_eq!(
            waiters.keys_len(),
            1,
            "the second waiter still holds the channel"
        );
        drop(two);
        assert_eq!(waiters.keys_len(), 0);
        assert_eq!(waiters.waiting(), 0);
    }

    #[tokio::test]
    async fn the_bound_on_waiters_ends_the_wait() {
        let waiters = Arc::new(Waiters::new(Duration::from_secs(60), 1));
        let mut one = Waiting::new(&waiters);
        let mut first = Box::pin(one.wait("a", Duration::from_secs(60)));
        assert!(futures_util::poll!(&mut first).is_pending());
        let mut two = Waiting::new(&waiters);
        assert!(!two.wait("b", Duration::from_secs(60)).await);
        assert_eq!(waiters.keys_len(), 1);
    }

    #[tokio::test]
    async fn a_settled_key_wakes_its_waiters() {
        let waiters = Arc::new(Waiters::new(Duration::from_secs(60), 4));
        let mut one = Waiting::new(&waiters);
        one.next_poll = Duration::from_secs(60);
        let mut first = Box::pin(one.wait("k", Duration::from_secs(60)));
        assert!(futures_util::poll!(&mut first).is_pending());
        drop(SettledSignal::new(Some(&waiters), "k"));
        assert!(
            futures_util::poll!(&mut first).is_ready(),
            "the signal ends the wait, not the 60 s poll interval"
        );
    }
}
