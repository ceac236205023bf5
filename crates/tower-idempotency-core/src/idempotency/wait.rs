//! Waiting for an in-flight duplicate's result (see
//! [`IdempotencyLayer::wait_for_result`](super::IdempotencyLayer::wait_for_result)).
//!
//! A duplicate that finds its key in flight registers under the scoped key and waits for a
//! signal, then claims the key again (one store call): a completed key is replayed, a released
//! one is claimed by exactly one waiter (the store's claim is atomic), which runs the handler.
//! Signals come from two places, each one channel per key shared by all its waiters here:
//! - the executing request of this process, once it has completed or released the key;
//! - the store's notices ([`Store::settlements`]), for a holder in any process.
//!
//! A waiter first marks the key as waited on ([`Settlements::watch`]: Postgres notifies only
//! such keys); a key no longer in flight by then is claimed again at once.
//! While the store's subscription is up, a waiter claims again only on a signal, and as a
//! safety net for a lost notice when the holder's lease or the wait ends. A store without
//! notices (or whose subscription is down) cannot tell about a holder elsewhere, so there each
//! waiter also re-claims on a timer: 50 ms, doubling, never later than the holder's remaining
//! lease or the end of the wait.

use std::{sync::Arc, time::Duration};

use crate::store::{KeySignal, KeySignals, Settlement, Settlements, Store};
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Instant,
};

/// The first interval between a waiter's re-claims when no notices reach it; it doubles after
/// each.
const FIRST_POLL: Duration = Duration::from_millis(50);

/// The signals sent before a request's first claim, here and by the store's notices: a waiter
/// registers only after that claim, so one sent in between reached nobody, and a difference
/// from these counts sends the waiter to claim again at once.
pub(super) struct Mark {
    local: u64,
    store: Option<(Settlements, u64)>,
}

/// The waiters of one layer: the bound on their number, and one channel per waited-on key.
pub(crate) struct Waiters {
    max_wait: Duration,
    limit: usize,
    permits: Arc<Semaphore>,
    signals: Arc<KeySignals>,
}

impl Waiters {
    pub(crate) fn new(max_wait: Duration, limit: usize) -> Self {
        Self {
            max_wait,
            limit,
            permits: Arc::new(Semaphore::new(limit)),
            signals: Arc::default(),
        }
    }

    pub(crate) fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// How many requests wait now.
    pub(crate) fn waiting(&self) -> usize {
        self.limit - self.permits.available_permits()
    }

    /// Wakes the waiters of `key`, if any: its executing request has completed or released it.
    pub(crate) fn settled(&self, key: &str) {
        self.signals.signal(key);
    }

    /// Taken before a request's first claim; see [`Mark`].
    pub(super) fn mark(&self, store: &dyn Store) -> Mark {
        Mark {
            local: self.signals.sent(),
            store: store.settlements().map(|s| {
                let sent = s.sent();
                (s, sent)
            }),
        }
    }

    /// Registers a waiter of `key`; `None` when the layer's bound on waiters is reached.
    fn register(self: &Arc<Self>, key: &str, store: Option<&Settlements>) -> Option<Registration> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        Some(Registration {
            local: self.signals.subscribe(key),
            store: store.map(|s| s.subscribe(key)),
            _permit: permit,
        })
    }

    #[cfg(test)]
    fn keys_len(&self) -> usize {
        self.signals.len()
    }
}

/// One waiter's place: its subscriptions to the key's signals and its share of the bound.
/// Dropped (the request is answered, or its caller went away), it unsubscribes; the last
/// subscriber of a key removes the key's channel.
struct Registration {
    local: KeySignal,
    store: Option<Settlement>,
    _permit: OwnedSemaphorePermit,
}

impl Registration {
    /// Resolves at the next signal from this process or from the store.
    async fn signalled(&mut self) {
        let store = async {
            match self.store.as_mut() {
                Some(settlement) => settlement.signalled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = self.local.signalled() => {}
            () = store => {}
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

/// Marks `key` as waited on in the store ([`Settlements::watch`]), so its settlement will be
/// notified: `Some(true)` then, `Some(false)` when the store could not mark it (the waiter
/// polls this round), `None` when the key is no longer in flight or the wait ended meanwhile
/// (the waiter claims again at once). A notice arriving meanwhile is kept for the wait.
async fn watched(notices: &Settlements, key: &str, deadline: Instant) -> Option<bool> {
    tokio::select! {
        watched = notices.watch(key) => match watched {
            Ok(true) => Some(true),
            Ok(false) => None,
            Err(error) => {
                tracing::debug!(%error, "marking a waited-on key failed; its waiters poll");
                Some(false)
            }
        },
        // A mark queued behind a holder's open transaction ends with the wait.
        () = tokio::time::sleep_until(deadline) => None,
    }
}

/// One duplicate's wait: until `max_wait` after it began.
pub(super) struct Waiting {
    waiters: Arc<Waiters>,
    mark: Mark,
    deadline: Instant,
    next_poll: Duration,
    registration: Option<Registration>,
}

impl Waiting {
    pub(super) fn new(waiters: &Arc<Waiters>, mark: Mark) -> Self {
        Self {
            waiters: waiters.clone(),
            mark,
            deadline: Instant::now() + waiters.max_wait,
            next_poll: FIRST_POLL,
            registration: None,
        }
    }

    /// Waits until a signal for the key arrives, the wait ends, or its timer fires: the
    /// holder's remaining lease while the store's notices reach this waiter (its subscription is
    /// up and the key marked), otherwise the
    /// poll interval (never past that lease). `true` then, and the caller claims the key again
    /// (call [`before_claim`](Self::before_claim) first). `false` at once when the duplicate is
    /// to be answered as in flight: the wait is over, or the bound on waiters is reached.
    pub(super) async fn wait(&mut self, key: &str, lease_remaining: Duration) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        let notices = self.mark.store.as_ref().map(|(s, _)| s.clone());
        if self.registration.is_none() {
            let Some(registration) = self.waiters.register(key, notices.as_ref()) else {
                return false;
            };
            self.registration = Some(registration);
            if self.missed_a_signal() {
                return true;
            }
        }
        let heard = match notices.as_ref().filter(|n| n.is_connected()) {
            Some(notices) => match watched(notices, key, self.deadline).await {
                Some(heard) => heard,
                None => return true,
            },
            None => false,
        };
        let Some(registration) = self.registration.as_mut() else {
            return false;
        };
        let lease_end = lease_remaining.max(Duration::from_millis(1));
        let timer = if heard {
            lease_end
        } else {
            let poll = self.next_poll.min(lease_end);
            self.next_poll = self.next_poll.saturating_mul(2);
            poll
        };
        tokio::select! {
            () = registration.signalled() => {}
            () = tokio::time::sleep_until((now + timer).min(self.deadline)) => {}
        }
        true
    }

    /// Whether a signal may have been sent between the first claim and the registration.
    fn missed_a_signal(&self) -> bool {
        let Mark { local, store } = &self.mark;
        self.waiters.signals.sent() != *local
            || store.as_ref().is_some_and(|(s, sent)| s.sent() != *sent)
    }

    /// Marks the key's signals so far as seen, so that one sent while the next claim runs
    /// still ends the next wait.
    pub(super) fn before_claim(&mut self) {
        if let Some(registration) = &mut self.registration {
            registration.local.mark_seen();
            if let Some(settlement) = &mut registration.store {
                settlement.mark_seen();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    const MINUTE: Duration = Duration::from_secs(60);

    /// Waiters that wait up to a minute, at most `bound` of them at once.
    fn waiters(bound: usize) -> Arc<Waiters> {
        Arc::new(Waiters::new(MINUTE, bound))
    }

    /// Store notices that are up.
    fn connected() -> Settlements {
        let notices = Settlements::new();
        notices.connected(true);
        notices
    }

    /// The mark of a first claim made with `notices` up and no local signal sent yet.
    fn mark_with(notices: &Settlements) -> Mark {
        Mark {
            local: 0,
            store: Some((notices.clone(), notices.sent())),
        }
    }

    #[tokio::test]
    async fn a_dropped_waiter_leaves_no_channel_behind() {
        let waiters = waiters(2);
        let mut one = Waiting::new(&waiters, waiters.mark(&MemoryStore::new()));
        let mut two = Waiting::new(&waiters, waiters.mark(&MemoryStore::new()));
        {
            let first = one.wait("k", MINUTE);
            let second = two.wait("k", MINUTE);
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
        let waiters = waiters(1);
        let mut one = Waiting::new(&waiters, waiters.mark(&MemoryStore::new()));
        let mut first = Box::pin(one.wait("a", MINUTE));
        assert!(futures_util::poll!(&mut first).is_pending());
        let mut two = Waiting::new(&waiters, waiters.mark(&MemoryStore::new()));
        assert!(!two.wait("b", MINUTE).await);
        assert_eq!(waiters.keys_len(), 1);
    }

    #[tokio::test]
    async fn a_store_notice_wakes_its_waiters_and_leaves_no_subscription_behind() {
        let waiters = waiters(4);
        let notices = connected();
        let mark = || mark_with(&notices);
        let mut one = Waiting::new(&waiters, mark());
        let mut first = Box::pin(one.wait("k", MINUTE));
        assert!(
            futures_util::poll!(&mut first).is_pending(),
            "with notices up, the 50 ms poll is not armed: nothing ends this wait but a signal"
        );
        assert_eq!(notices.subscribed_keys(), 1);
        notices.settled("other");
        assert!(futures_util::poll!(&mut first).is_pending());
        notices.settled("k");
        assert!(futures_util::poll!(&mut first).is_ready());
        drop(first);
        drop(one);
        assert_eq!(notices.subscribed_keys(), 0);
        assert_eq!(waiters.keys_len(), 0);
    }

    #[tokio::test]
    async fn a_notice_before_the_registration_means_claim_again_at_once() {
        let waiters = waiters(4);
        let notices = connected();
        let mut one = Waiting::new(&waiters, mark_with(&notices));
        // Sent after the claim's mark, before the waiter subscribed: nobody heard it.
        notices.settled("k");
        let mut first = Box::pin(one.wait("k", MINUTE));
        assert!(matches!(
            futures_util::poll!(&mut first),
            std::task::Poll::Ready(true)
        ));
    }

    #[tokio::test]
    async fn a_waiter_marks_its_key_and_claims_again_when_it_is_no_longer_in_flight() {
        let waiters = waiters(4);
        let in_flight = Arc::new(std::sync::Mutex::new(vec![("k", true), ("gone", false)]));
        let marked = Arc::new(std::sync::Mutex::new(Vec::new()));
        let base = Settlements::new();
        let notices = base.with_watch({
            let (in_flight, marked) = (in_flight.clone(), marked.clone());
            move |key: &str| {
                marked.lock().unwrap().push(key.to_owned());
                let live = in_flight
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|&(k, l)| k == key && l);
                Box::pin(async move { Ok(live) })
            }
        });
        notices.connected(true);
        let mark = || mark_with(&notices);
        let mut one = Waiting::new(&waiters, mark());
        let mut first = Box::pin(one.wait("k", MINUTE));
        assert!(
            futures_util::poll!(&mut first).is_pending(),
            "marked while in flight: it waits for the notice"
        );
        base.settled("k");
        assert!(
            futures_util::poll!(&mut first).is_ready(),
            "the store's notices, fed through any clone, reach it"
        );
        let mut two = Waiting::new(&waiters, mark());
        assert!(
            two.wait("gone", MINUTE).await,
            "settled before the mark: claim again at once"
        );
        assert_eq!(*marked.lock().unwrap(), ["k", "gone"]);
        assert!(
            base.watch("gone").await.expect("no step"),
            "the base has none"
        );
    }

    #[tokio::test]
    async fn a_settled_key_wakes_its_waiters() {
        let waiters = waiters(4);
        let mut one = Waiting::new(&waiters, waiters.mark(&MemoryStore::new()));
        one.next_poll = MINUTE;
        let mut first = Box::pin(one.wait("k", MINUTE));
        assert!(futures_util::poll!(&mut first).is_pending());
        drop(SettledSignal::new(Some(&waiters), "k"));
        assert!(
            futures_util::poll!(&mut first).is_ready(),
            "the signal ends the wait, not the 60 s poll interval"
        );
    }
}
