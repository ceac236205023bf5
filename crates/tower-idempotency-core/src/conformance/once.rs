//! [`RunOnce`] on the store under test: work runs once per key whoever calls, duplicates get the
//! stored result, a lost lease lets another caller take over, and results end with their TTL.

use std::{
    collections::HashSet,
    future::Future,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use futures_util::future::BoxFuture;
use tokio::{
    sync::{watch, Notify},
    time::Instant,
};

use super::{
    fresh_key,
    hooked::{Hooked, Hooks},
};
use crate::{store::Call, OnceError, Outcome, Ran, RunOnce, Store};

/// How long a check waits for something the store must do eventually (a lease or TTL ending).
const EVENTUALLY: Duration = Duration::from_secs(30);

/// A key of its own for one check (any string: [`RunOnce`] hashes it into the scoped key).
fn once_key(case: &str) -> String {
    format!("message {} of {case}", fresh_key("once"))
}

/// Work that counts its runs, answers `value` and, while `gate` is set, waits for it first.
fn counted(runs: &Arc<AtomicUsize>, gate: Option<Arc<Notify>>, value: &str) -> Work {
    let (runs, value) = (runs.clone(), value.to_owned());
    Box::new(move || {
        Box::pin(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            if let Some(gate) = gate {
                gate.notified().await;
            }
            Ok(value)
        })
    })
}

/// Work for a [`RunOnce`] call, from [`counted`].
type Work = Box<dyn FnOnce() -> BoxFuture<'static, Result<String, std::io::Error>> + Send>;

/// Spawns `call` with the work of a first caller, [`counted`] in the answered `runs` and held
/// until the answered gate is notified, and returns once that work has started.
async fn started_first<F>(
    value: &str,
    call: impl FnOnce(Work) -> F,
) -> (
    tokio::task::JoinHandle<F::Output>,
    Arc<AtomicUsize>,
    Arc<Notify>,
)
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let first = tokio::spawn(call(counted(&runs, Some(gate.clone()), value)));
    let deadline = Instant::now() + EVENTUALLY;
    while runs.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the first caller never ran");
        tokio::task::yield_now().await;
    }
    (first, runs, gate)
}

/// Calls `run` until it answers something other than [`OnceError::InFlight`] (the holder's lease
/// has to end first), up to [`EVENTUALLY`].
async fn once_not_in_flight(
    once: &RunOnce,
    key: &str,
    runs: &Arc<AtomicUsize>,
    value: &str,
) -> Ran<String> {
    let deadline = Instant::now() + EVENTUALLY;
    loop {
        match once.run(key, counted(runs, None, value)).await {
            Err(OnceError::InFlight { .. }) if Instant::now() < deadline => {
                // A lease ending has no signal to await; this polls the key.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other.expect("the key is free once the lease ended"),
        }
    }
}

tokio::task_local! {
    /// The caller of [`run_once_has_one_run_under_concurrent_callers`] whose task calls the store.
    static CALLER: usize;
}

/// Hooks noting the callers whose claims the store has answered.
#[derive(Default)]
struct ClaimsAnswered {
    callers: Mutex<HashSet<usize>>,
    changed: Notify,
}

impl ClaimsAnswered {
    fn callers(&self) -> usize {
        self.callers.lock().expect("never poisoned").len()
    }
}

impl Hooks for ClaimsAnswered {
    fn after(&self, call: Call, _key: &str) {
        if call == Call::Claim {
            if let Ok(caller) = CALLER.try_with(|caller| *caller) {
                self.callers.lock().expect("never poisoned").insert(caller);
                self.changed.notify_waiters();
            }
        }
    }
}

/// Twenty-five concurrent callers of one key, waiting for the result. The work of the caller
/// that claims the key is held until the store has answered a claim of every caller, so each
/// other caller met the key in flight (against a store whose claim is not atomic, it ran the
/// work too). Then: the work ran once, one caller got [`Outcome::Executed`] and the rest its
/// stored value, [`Outcome::Replayed`]. Each caller is bounded by a timeout, so one left waiting
/// fails the check instead of hanging it.
pub async fn run_once_has_one_run_under_concurrent_callers(store: Arc<dyn Store>) {
    const CALLERS: usize = 25;
    let hooked = Arc::new(Hooked::wrap(store, ClaimsAnswered::default()));
    let once = RunOnce::new(hooked.clone()).wait_for_result(EVENTUALLY);
    let key = once_key("concurrent");
    let runs = Arc::new(AtomicUsize::new(0));
    let (open, gate) = watch::channel(false);
    let callers: Vec<_> = (0..CALLERS)
        .map(|i| {
            let (once, key, runs, mut gate) =
                (once.clone(), key.clone(), runs.clone(), gate.clone());
            let work = move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let _ = gate.wait_for(|open| *open).await;
                Ok::<_, std::io::Error>(format!("result of caller {i}"))
            };
            let call = async move { tokio::time::timeout(EVENTUALLY, once.run(&key, work)).await };
            tokio::spawn(CALLER.scope(i, call))
        })
        .collect();
    let deadline = Instant::now() + EVENTUALLY;
    loop {
        let changed = hooked.hooks.changed.notified();
        if hooked.hooks.callers() == CALLERS {
            break;
        }
        let answered = hooked.hooks.callers();
        tokio::time::timeout_at(deadline, changed)
            .await
            .unwrap_or_else(|_| {
                panic!("the store answered the claims of {answered} callers of {CALLERS}")
            });
    }
    open.send_replace(true);
    let mut results = Vec::new();
    for caller in callers {
        let ran = caller
            .await
            .expect("caller task")
            .expect("a caller still waited at the timeout");
        results.push(ran.expect("a value"));
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the work ran more than once"
    );
    let executed: Vec<_> = results.iter().filter(|r| !r.is_replay()).collect();
    assert_eq!(executed.len(), 1, "{results:?}");
    assert_eq!(executed[0].outcome, Outcome::Executed);
    assert!(
        results.iter().all(|r| r.value == executed[0].value),
        "every caller gets the first result: {results:?}"
    );
}

/// A duplicate that does not wait is told the key is in flight; once the first caller finished,
/// duplicates get its value; other input under the key is refused; work that fails releases the
/// key for the next call.
pub async fn run_once_answers_duplicates_mismatches_and_failures(store: Arc<dyn Store>) {
    let once = RunOnce::new(store);
    let key = once_key("duplicates");
    let (first, runs, gate) = started_first("first", |work| {
        let (once, key) = (once.clone(), key.clone());
        async move { once.run_with_input(&key, &["order", "7"], work).await }
    })
    .await;
    let busy = once
        .run_with_input(&key, &["order", "7"], counted(&runs, None, "second"))
        .await;
    assert!(
        matches!(
            busy,
            Err(OnceError::InFlight {
                retry_after: Some(_)
            })
        ),
        "{busy:?}"
    );
    gate.notify_one();
    let first = first.await.expect("task").expect("first value");
    assert_eq!(
        (first.value.as_str(), first.outcome),
        ("first", Outcome::Executed)
    );
    let again = once
        .run_with_input(&key, &["order", "7"], counted(&runs, None, "third"))
        .await
        .expect("the stored value");
    assert_eq!(
        (again.value.as_str(), again.outcome),
        ("first", Outcome::Replayed)
    );
    let other = once
        .run_with_input(&key, &["order", "8"], counted(&runs, None, "fourth"))
        .await;
    assert!(matches!(other, Err(OnceError::InputMismatch)), "{other:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let failing = once_key("failing");
    let failed = once
        .run(&failing, || async {
            Err::<String, _>(std::io::Error::other("downstream refused"))
        })
        .await;
    assert!(
        matches!(&failed, Err(OnceError::Failed(e)) if e.to_string() == "downstream refused"),
        "{failed:?}"
    );
    let retried = once
        .run(&failing, counted(&runs, None, "after the failure"))
        .await
        .expect("the failure released the key");
    assert_eq!(retried.outcome, Outcome::Executed);
}

/// A caller whose lease lapses (its renewals stop, as when its process dies) loses the key: the
/// next caller runs the work and its result is the one stored; the first caller's late result
/// is not recorded, and it gets the stored result instead.
pub async fn run_once_lease_loss_lets_another_caller_run(store: Arc<dyn Store>) {
    let lease = Duration::from_secs(2);
    let stalled = RunOnce::new(store.clone())
        .lease(lease)
        .max_lease_renewal(Duration::ZERO);
    let once = RunOnce::new(store).lease(lease);
    let key = once_key("lease-loss");
    let (first, runs, gate) = started_first("stalled", |work| {
        let (stalled, key) = (stalled.clone(), key.clone());
        async move { stalled.run(&key, work).await }
    })
    .await;
    let taken_over = once_not_in_flight(&once, &key, &runs, "took over").await;
    assert_eq!(
        (taken_over.value.as_str(), taken_over.outcome),
        ("took over", Outcome::Executed)
    );
    gate.notify_one();
    let first = first
        .await
        .expect("task")
        .expect("the stalled work's value");
    assert_eq!(
        (first.value.as_str(), first.outcome),
        ("stalled", Outcome::ExecutedUnrecorded),
        "the caller that lost its lease ran, but must not record its result"
    );
    let replay = once
        .run(&key, counted(&runs, None, "third"))
        .await
        .expect("stored");
    assert_eq!(
        (replay.value.as_str(), replay.outcome),
        ("took over", Outcome::Replayed)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A result is returned to duplicates for its TTL, and after it the key runs the work again.
pub async fn run_once_result_ends_with_its_ttl(store: Arc<dyn Store>) {
    let once = RunOnce::new(store).ttl(Duration::from_secs(1));
    let key = once_key("ttl");
    let runs = Arc::new(AtomicUsize::new(0));
    let first = once
        .run(&key, counted(&runs, None, "first"))
        .await
        .expect("first");
    assert_eq!(first.outcome, Outcome::Executed);
    let deadline = Instant::now() + EVENTUALLY;
    loop {
        let ran = once
            .run(&key, counted(&runs, None, "after the ttl"))
            .await
            .expect("a value");
        if ran.outcome == Outcome::Executed {
            assert_eq!(ran.value, "after the ttl");
            break;
        }
        assert_eq!(
            ran.value, "first",
            "a replay within the TTL is the first value"
        );
        assert!(Instant::now() < deadline, "the result outlived its TTL");
        // A TTL ending has no signal to await; this polls the key.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
