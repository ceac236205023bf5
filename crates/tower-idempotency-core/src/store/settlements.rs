//! Notices that keys were settled, fanned out from one subscription of a store to the requests
//! waiting on those keys (see [`Store::settlements`](super::Store::settlements)).
//!
//! A request waiting for an in-flight key
//! ([`IdempotencyLayer::wait_for_result`](crate::IdempotencyLayer::wait_for_result)) learns that
//! the key's holder in *this* process settled it from the layer itself. A holder in another
//! process can only be seen through the store: a store that can push notices (Postgres
//! `LISTEN/NOTIFY`, Redis pub/sub) keeps one subscription and hands every notice to its
//! [`Settlements`], which wakes the waiters of that key; a [`Subscriber`] keeps that
//! subscription open. Waiters then claim the key again; a notice carries no state, so a lost or
//! spurious one costs a claim, never correctness.
//!
//! A store for which a notice is costly (Postgres serialises the commits of notifying
//! transactions) can send them only for keys somebody waits on: it gives its `Settlements` a
//! [`watch`](Settlements::with_watch) step that marks a key as waited on, and each waiter runs
//! it ([`Settlements::watch`]) before it waits.

use std::{
    collections::HashMap,
    fmt,
    future::Future,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::Duration,
};

use futures_util::future::BoxFuture;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use super::StoreError;

/// One `watch` channel per key that somebody waits on, shared by all of that key's waiters, and
/// a count of the signals sent so far (any key).
#[derive(Default)]
pub(crate) struct KeySignals {
    keys: Mutex<HashMap<String, watch::Sender<()>>>,
    sent: AtomicU64,
}

impl KeySignals {
    fn keys(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<()>>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Subscribes to `key`'s signals until the returned guard is dropped.
    pub(crate) fn subscribe(self: &Arc<Self>, key: &str) -> KeySignal {
        let receiver = self
            .keys()
            .entry(key.to_owned())
            .or_insert_with(|| watch::channel(()).0)
            .subscribe();
        KeySignal {
            signals: self.clone(),
            key: key.to_owned(),
            receiver: Some(receiver),
        }
    }

    /// Wakes the subscribers of `key`, if any.
    pub(crate) fn signal(&self, key: &str) {
        self.sent.fetch_add(1, Ordering::SeqCst);
        if let Some(sender) = self.keys().get(key) {
            sender.send_modify(|()| ());
        }
    }

    /// Wakes every subscriber.
    fn signal_all(&self) {
        self.sent.fetch_add(1, Ordering::SeqCst);
        for sender in self.keys().values() {
            sender.send_modify(|()| ());
        }
    }

    /// Signals sent so far, to any key: a subscriber compares two readings to learn whether it
    /// may have missed one sent before it subscribed.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// Keys with at least one subscriber.
    pub(crate) fn len(&self) -> usize {
        self.keys().len()
    }
}

/// One subscriber of a key's signals. Dropped, it removes the key's channel when it was the
/// key's last subscriber.
pub(crate) struct KeySignal {
    signals: Arc<KeySignals>,
    key: String,
    receiver: Option<watch::Receiver<()>>,
}

impl KeySignal {
    /// Resolves at the key's next signal (or at once, for one sent since [`Self::mark_seen`]).
    pub(crate) async fn signalled(&mut self) {
        match self.receiver.as_mut() {
            // The sender lives in the map while this receiver does, so this never fails.
            Some(receiver) => {
                let _ = receiver.changed().await;
            }
            None => std::future::pending().await,
        }
    }

    /// Marks the signals so far as seen, so that one sent after this call ends the next
    /// [`signalled`](Self::signalled).
    pub(crate) fn mark_seen(&mut self) {
        if let Some(receiver) = self.receiver.as_mut() {
            receiver.borrow_and_update();
        }
    }
}

impl Drop for KeySignal {
    fn drop(&mut self) {
        let mut keys = self.signals.keys();
        // Dropped under the lock: a subscriber arriving now sees either this receiver or none.
        drop(self.receiver.take());
        if keys
            .get(&self.key)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            keys.remove(&self.key);
        }
    }
}

/// The notices of one store that keys were settled (completed, released or forgotten),
/// fanned out in this process to the requests waiting on them. Cheap to clone: clones share
/// the subscribers.
///
/// A store offering notices ([`Store::settlements`](super::Store::settlements)) owns one of
/// these and feeds it from its single subscription: [`settled`](Self::settled) for every notice,
/// [`connected`](Self::connected) whenever the subscription comes up or goes down. Waiters
/// [`subscribe`](Self::subscribe) to a key. While the subscription is down, notices may be
/// lost, so waiters fall back to re-claiming the key on a timer; every change of the
/// subscription's state wakes every waiter once, to claim again.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use tower_idempotency_core::Settlements;
///
/// let settlements = Settlements::new();
/// let mut waiter = settlements.subscribe("orders:3f2a");
/// settlements.connected(true); // the store's subscription is up
/// waiter.settled().await; // a change of state wakes every waiter once
/// settlements.settled("orders:3f2a"); // a notice from the store
/// waiter.settled().await;
/// drop(waiter);
/// assert_eq!(settlements.subscribed_keys(), 0);
/// # }
/// ```
#[derive(Clone)]
pub struct Settlements {
    inner: Arc<Inner>,
}

struct Inner {
    signals: Arc<KeySignals>,
    up: Arc<watch::Sender<bool>>,
    tag: fn(&str) -> String,
    watch: Option<Watch>,
}

/// A store's step marking a key as waited on; see [`Settlements::with_watch`].
type Watch = Arc<dyn Fn(&str) -> BoxFuture<'static, Result<bool, StoreError>> + Send + Sync>;

impl fmt::Debug for Settlements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settlements")
            .field("connected", &self.is_connected())
            .field("subscribed_keys", &self.subscribed_keys())
            .field("watched", &self.inner.watch.is_some())
            .finish()
    }
}

impl Default for Settlements {
    fn default() -> Self {
        Self::new()
    }
}

impl Settlements {
    /// Notices that name the key itself, as the store was given it.
    pub fn new() -> Self {
        Self::tagged(str::to_owned)
    }

    /// Notices that name a key by [`key_digest`](Self::key_digest): for a transport that bounds
    /// a notice's size (a Postgres `NOTIFY` payload is under 8000 bytes) or should not repeat
    /// keys.
    pub fn hashed() -> Self {
        Self::tagged(Self::key_digest)
    }

    fn tagged(tag: fn(&str) -> String) -> Self {
        Self {
            inner: Arc::new(Inner {
                signals: Arc::default(),
                up: Arc::new(watch::channel(false).0),
                tag,
                watch: None,
            }),
        }
    }

    /// These notices, for a store that sends a key's notice only once the key is marked as
    /// waited on: `watch` marks it, and every waiter calls it (through
    /// [`Settlements::watch`]) after subscribing and before waiting. It resolves to `true`
    /// when the key is still in flight and now marked, so its settlement will be notified, and
    /// to `false` when the key is no longer in flight (the waiter claims it again at once).
    ///
    /// The mark and the settlement must be ordered by the store (Postgres: both lock the row):
    /// either the mark comes first and the settlement sees it, or the settlement does and the
    /// mark finds nothing in flight. A new claim of the key may clear the mark; its waiters mark
    /// it again before waiting on the new holder.
    ///
    /// The returned value shares its notices and subscribers with `self`; only it (and its
    /// clones) runs `watch`.
    pub fn with_watch<F>(&self, watch: F) -> Self
    where
        F: Fn(&str) -> BoxFuture<'static, Result<bool, StoreError>> + Send + Sync + 'static,
    {
        Self {
            inner: Arc::new(Inner {
                signals: self.inner.signals.clone(),
                up: self.inner.up.clone(),
                tag: self.inner.tag,
                watch: Some(Arc::new(watch)),
            }),
        }
    }

    /// Marks `key` as waited on, for a store that notifies only such keys (see
    /// [`with_watch`](Self::with_watch)); `Ok(true)` at once for any other store. `Ok(false)`:
    /// the key is no longer in flight, so no notice will come for it; claim it again. Call it
    /// after [`subscribe`](Self::subscribe), so a notice sent once it is marked is not missed.
    pub async fn watch(&self, key: &str) -> Result<bool, StoreError> {
        match &self.inner.watch {
            Some(watch) => watch(key).await,
            None => Ok(true),
        }
    }

    /// The name of `key` in the notices of a [`hashed`](Self::hashed) store: the lowercase hex
    /// SHA-256 of its bytes (64 digits), as Postgres computes it with
    /// `encode(sha256(convert_to(key, 'UTF8')), 'hex')`.
    pub fn key_digest(key: &str) -> String {
        hex::encode(Sha256::digest(key.as_bytes()))
    }

    /// Waits for notices about `key` until the returned [`Settlement`] is dropped. Waiters of
    /// one key share one channel; the last one to leave removes it.
    pub fn subscribe(&self, key: &str) -> Settlement {
        Settlement {
            signal: self.inner.signals.subscribe(&(self.inner.tag)(key)),
        }
    }

    /// Called by the store for each notice: wakes the waiters of the key the notice names
    /// (the key itself, or its [`key_digest`](Self::key_digest) for a [`hashed`](Self::hashed)
    /// store). A notice nobody waits for costs one map lookup.
    pub fn settled(&self, name: &str) {
        self.inner.signals.signal(name);
    }

    /// Called by the store when its subscription comes up (`true`) or goes down (`false`).
    /// Every waiter is woken to claim its key again: notices sent while it was down are lost.
    pub fn connected(&self, up: bool) {
        // Ordered so that no waiter trusts notices while they may be lost: going down, the
        // state changes before the wake-up; coming up, after it (so a waiter that saw the
        // subscription up was not woken for it).
        if up {
            self.inner.signals.signal_all();
            self.inner.up.send_replace(true);
        } else {
            self.inner.up.send_replace(false);
            self.inner.signals.signal_all();
        }
    }

    /// Whether the store's subscription is up, so a waiter can rely on notices (and claims
    /// again only when its wait or the holder's lease ends).
    pub fn is_connected(&self) -> bool {
        *self.inner.up.borrow()
    }

    /// Resolves once the store's subscription is up (at once if it is).
    pub async fn ready(&self) {
        let mut up = self.inner.up.subscribe();
        // The sender lives in `self`, so this never fails.
        let _ = up.wait_for(|up| *up).await;
    }

    /// How many keys have waiters now.
    pub fn subscribed_keys(&self) -> usize {
        self.inner.signals.len()
    }

    /// Notices and changes of state seen so far, for any key.
    pub(crate) fn sent(&self) -> u64 {
        self.inner.signals.sent()
    }
}

/// The first pause before a [`Subscriber`] opens its subscription again; it doubles up to
/// [`LONGEST_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(100);
const LONGEST_RETRY: Duration = Duration::from_secs(5);

/// The task that keeps a store's one subscription to its notices open: started by the first
/// [`settlements`](Self::settlements) call made on a Tokio runtime (and by the next call after
/// that runtime shut down, which ends the task and reports the subscription down), opened again
/// after every failure (after 100 ms, doubling up to 5 s; reset once a subscription came up),
/// ended when the `Subscriber` (so the store owning it) is dropped.
pub struct Subscriber {
    settlements: Settlements,
    /// The subscribing task; started again by the next call once it has ended (its runtime
    /// shut down).
    task: Mutex<Option<AbortOnDropHandle<()>>>,
}

impl fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscriber")
            .field("settlements", &self.settlements)
            .field("running", &self.running())
            .finish()
    }
}

impl Subscriber {
    /// A subscriber feeding `settlements`; nothing runs until [`settlements`](Self::settlements).
    pub fn new(settlements: Settlements) -> Self {
        Self {
            settlements,
            task: Mutex::new(None),
        }
    }

    fn task(&self) -> MutexGuard<'_, Option<AbortOnDropHandle<()>>> {
        // The slot holds a handle or nothing, valid at every step, so a poisoned lock is usable.
        self.task
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether the subscribing task runs.
    fn running(&self) -> bool {
        self.task().as_ref().is_some_and(|task| !task.is_finished())
    }

    /// The notices, after starting the subscribing task if it is not running and a Tokio
    /// runtime is at hand (without one, waiters poll and a later call starts it). The task runs
    /// on the runtime of the call that started it; when that runtime shuts down, the task ends
    /// and reports the subscription down, and the next call starts it again on its own runtime
    /// (a test runtime, a restarted `#[tokio::main]`, a library used from several runtimes).
    ///
    /// `sessions` is called whenever the task starts, and returns what opens one subscription: a
    /// function given the [`Settlements`] that subscribes, calls
    /// [`connected(true)`](Settlements::connected) once it is, hands every notice to
    /// [`settled`](Settlements::settled), and returns when the subscription ends (`Err` is
    /// logged at `warn`). Between sessions the task reports the subscription down.
    pub fn settlements<S, F, E>(&self, sessions: impl FnOnce() -> S) -> Settlements
    where
        S: FnMut(Settlements) -> F + Send + 'static,
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + 'static,
    {
        let mut task = self.task();
        let running = task.as_ref().is_some_and(|task| !task.is_finished());
        if !running {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let subscribing = keep_subscribed(self.settlements.clone(), sessions());
                *task = Some(AbortOnDropHandle::new(runtime.spawn(subscribing)));
            }
        }
        self.settlements.clone()
    }
}

/// Runs one session after another, pausing between them, until aborted.
async fn keep_subscribed<S, F, E>(settlements: Settlements, mut session: S)
where
    S: FnMut(Settlements) -> F,
    F: Future<Output = Result<(), E>>,
    E: fmt::Display,
{
    // However the task ends (aborted with its `Subscriber`, dropped with its runtime), the
    // subscription is reported down, so waiters poll instead of trusting notices.
    let _down = ReportDown(settlements.clone());
    let mut retry = FIRST_RETRY;
    loop {
        if let Err(error) = session(settlements.clone()).await {
            tracing::warn!(%error, "a store's subscription to settled keys failed; its waiters poll until it is back");
        }
        if settlements.is_connected() {
            settlements.connected(false);
            retry = FIRST_RETRY;
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(LONGEST_RETRY);
    }
}

/// Reports the subscription down when dropped.
struct ReportDown(Settlements);

impl Drop for ReportDown {
    fn drop(&mut self) {
        if self.0.is_connected() {
            self.0.connected(false);
        }
    }
}

/// One waiter's subscription to a key's notices, from [`Settlements::subscribe`]. Dropping it
/// unsubscribes.
pub struct Settlement {
    signal: KeySignal,
}

impl fmt::Debug for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settlement").finish_non_exhaustive()
    }
}

impl Settlement {
    /// Resolves at the next notice about the key or change of the subscription's state since
    /// the last call (or since subscribing).
    pub async fn settled(&mut self) {
        self.signal.signalled().await;
        self.signal.mark_seen();
    }

    /// Marks the notices so far as seen: the next [`settled`](Self::settled) waits for a newer
    /// one.
    pub fn mark_seen(&mut self) {
        self.signal.mark_seen();
    }

    /// Resolves at the next notice not yet [marked seen](Self::mark_seen), leaving it unmarked.
    pub(crate) async fn signalled(&mut self) {
        self.signal.signalled().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_notice_wakes_only_the_waiters_of_its_key() {
        let settlements = Settlements::new();
        let mut a1 = settlements.subscribe("a");
        let mut a2 = settlements.subscribe("a");
        let mut b = settlements.subscribe("b");
        assert_eq!(settlements.subscribed_keys(), 2);
        settlements.settled("a");
        assert!(futures_util::poll!(Box::pin(a1.settled())).is_ready());
        assert!(futures_util::poll!(Box::pin(a2.settled())).is_ready());
        assert!(futures_util::poll!(Box::pin(b.settled())).is_pending());
        drop((a1, a2));
        assert_eq!(settlements.subscribed_keys(), 1);
        drop(b);
        assert_eq!(settlements.subscribed_keys(), 0);
    }

    #[tokio::test]
    async fn hashed_notices_name_the_digest() {
        let settlements = Settlements::hashed();
        let mut waiter = settlements.subscribe("ns:key");
        settlements.settled("ns:key");
        assert!(futures_util::poll!(Box::pin(waiter.settled())).is_pending());
        settlements.settled(&Settlements::key_digest("ns:key"));
        assert!(futures_util::poll!(Box::pin(waiter.settled())).is_ready());
        // SHA-256("abc"), FIPS 180-2.
        assert_eq!(
            Settlements::key_digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[tokio::test]
    async fn a_subscriber_opens_again_after_a_failure_and_stops_when_dropped() {
        let subscriber = Subscriber::new(Settlements::new());
        let (ended_tx, ended) = tokio::sync::oneshot::channel::<()>();
        let mut ended_tx = Some(ended_tx);
        let sessions = Arc::new(AtomicU64::new(0));
        let counted = sessions.clone();
        let notices = subscriber.settlements(move || {
            move |notices: Settlements| {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                // Held by the second session until the task ends.
                let guard = ended_tx.take();
                async move {
                    if n == 0 {
                        return Err("refused");
                    }
                    notices.connected(true);
                    let _guard = guard;
                    std::future::pending::<()>().await;
                    Ok(())
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(10), notices.ready())
            .await
            .expect("the second session comes up");
        assert_eq!(sessions.load(Ordering::SeqCst), 2);
        // A second call does not start a second task.
        let again = subscriber.settlements(|| |_: Settlements| async { Err::<(), _>("unused") });
        assert!(again.is_connected());
        drop(subscriber);
        tokio::time::timeout(Duration::from_secs(10), ended)
            .await
            .expect("dropping the subscriber ends its session")
            .expect_err("the session's guard is dropped, not sent");
    }

    /// The subscribing task runs on the runtime of the first call; when that runtime ends, the
    /// subscription is reported down, and the next call (on another runtime) starts it again.
    #[test]
    fn a_subscriber_outlives_the_runtime_it_started_on() {
        let subscriber = Subscriber::new(Settlements::new());
        let sessions = Arc::new(AtomicU64::new(0));
        let subscribe = |subscriber: &Subscriber| {
            let counted = sessions.clone();
            subscriber.settlements(move || {
                move |notices: Settlements| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    async move {
                        notices.connected(true);
                        std::future::pending::<()>().await;
                        Ok::<(), &str>(())
                    }
                }
            })
        };
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
        };
        let first = runtime();
        let notices = first.block_on(async {
            let notices = subscribe(&subscriber);
            tokio::time::timeout(Duration::from_secs(10), notices.ready())
                .await
                .expect("the first session comes up");
            notices
        });
        drop(first);
        assert!(
            !notices.is_connected(),
            "the subscription ended with its runtime and is reported down"
        );
        let second = runtime();
        second.block_on(async {
            let notices = subscribe(&subscriber);
            tokio::time::timeout(Duration::from_secs(10), notices.ready())
                .await
                .expect("a session comes up on the second runtime");
        });
        assert_eq!(sessions.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_change_of_connection_wakes_everyone() {
        let settlements = Settlements::new();
        let mut waiter = settlements.subscribe("k");
        assert!(!settlements.is_connected());
        let mut ready = Box::pin(settlements.ready());
        assert!(futures_util::poll!(&mut ready).is_pending());
        settlements.connected(true);
        assert!(futures_util::poll!(&mut ready).is_ready());
        assert!(futures_util::poll!(Box::pin(waiter.settled())).is_ready());
        settlements.connected(false);
        assert!(!settlements.is_connected());
        assert!(futures_util::poll!(Box::pin(waiter.settled())).is_ready());
    }
}
