//! SQLite's one write lock, handed out in this process in turn: one fair gate per database file,
//! taken by every writer of the engine and of both halves on that file.
//!
//! A SQLite connection that finds the write lock taken waits in the busy handler, which sleeps in
//! growing steps (up to 100 ms) and tries again: a writer queued behind a transaction that ends
//! 1 ms later can sleep for tens of milliseconds while later writers take the lock before it.
//! Under a steady drain the worker's transactions and the acknowledgements starve one another
//! in turn. Every writer in this process therefore first takes a [`Turn`] at the file's
//! [`WriteGate`], which hands the lock on as the last writer ends; the busy handler is left for
//! writers outside the gate (another process, statements a user runs on the pool).
//!
//! - **Short writes** (acknowledgements, claims, renewals, completions, failure records, sweeps,
//!   purges, operator changes) queue first come first served ([`WriteGate::turn`]).
//! - **Transactions** (an inbox handler's) queue first come first served in a second line
//!   ([`WriteGate::hold`]). Short writes go first, but a waiting transaction gets the lock after
//!   at most [`SHORT_WRITES_PER_TRANSACTION`] of them: acknowledgements are not held up behind
//!   every queued handler, and the worker keeps draining while they arrive.
//! - **A transaction holds the gate from its start for up to [`GRACE`]**: a handler that writes
//!   at once ends within it. One that runs longer (a handler that waits on another service,
//!   before or after its first statement) lets the gate go after [`GRACE`] and finishes outside
//!   it: it keeps no writer queued behind it for longer than that, and a writer that then meets
//!   its lock waits in SQLite's busy handler.
//! - **Nested turns pass**: inside [`WriteGate::hold`], a turn at the same gate (the attempt's
//!   own lease renewal, an engine write the handler makes) does not wait for the gate its own
//!   task holds. What it writes on another connection then meets SQLite's lock as it would
//!   without the gate. A task the handler spawns is not the holder: a handler that waits for one
//!   that writes waits until its attempt times out.
//!
//! Postgres and MySQL have no gate ([`Driver::write_gate`] is `None`):
//! their writers proceed side by side.

use std::{
    collections::HashMap,
    future::Future,
    path::{Path, PathBuf},
    sync::{Arc, LazyLock, Mutex},
    time::Duration,
};

use std::collections::VecDeque;

use tokio::sync::oneshot;

use crate::Driver;

/// Short writes granted in a row while a transaction waits, before the transaction's turn.
pub const SHORT_WRITES_PER_TRANSACTION: u32 = 4;

/// The write lock's two queues, short writes and transactions, each first come first served.
///
/// Hand-written: a turn must be granted by class (short writes before waiting transactions, up
/// to [`SHORT_WRITES_PER_TRANSACTION`] in a row), which a FIFO mutex such as tokio's cannot do.
#[derive(Debug, Default)]
struct Lock(Mutex<Queues>);

#[derive(Debug, Default)]
struct Queues {
    held: bool,
    short: VecDeque<oneshot::Sender<()>>,
    transactions: VecDeque<oneshot::Sender<()>>,
    /// Short writes granted since a transaction last was.
    shorts_in_a_row: u32,
}

/// Which queue a writer waits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Short,
    Transaction,
}

/// The lock, held until this drops.
#[derive(Debug)]
struct Grant(Arc<Lock>);

impl Drop for Grant {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// A writer waiting for its grant; a grant that reaches it after it was dropped is passed on.
struct Waiting {
    lock: Arc<Lock>,
    grant: oneshot::Receiver<()>,
    granted: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.granted {
            return;
        }
        self.grant.close();
        if self.grant.try_recv().is_ok() {
            self.lock.release();
        }
    }
}

impl Lock {
    fn queues(&self) -> std::sync::MutexGuard<'_, Queues> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn acquire(self: &Arc<Self>, class: Class) -> Grant {
        let receiver = {
            let mut queues = self.queues();
            if !queues.held {
                queues.held = true;
                return Grant(self.clone());
            }
            let (sender, receiver) = oneshot::channel();
            match class {
                Class::Short => queues.short.push_back(sender),
                Class::Transaction => queues.transactions.push_back(sender),
            }
            receiver
        };
        let mut waiting = Waiting {
            lock: self.clone(),
            grant: receiver,
            granted: false,
        };
        // The sender is only dropped unsent by `release`, which never does so.
        let granted = (&mut waiting.grant).await.is_ok();
        debug_assert!(granted);
        // Granted: the grant is this writer's now, not the waiter's to pass on.
        waiting.granted = true;
        Grant(self.clone())
    }

    /// Hands the lock to the next writer still waiting: a short write, unless a transaction has
    /// waited through [`SHORT_WRITES_PER_TRANSACTION`] of them; free when nobody waits.
    fn release(&self) {
        let mut queues = self.queues();
        loop {
            let transaction_due = !queues.transactions.is_empty()
                && (queues.short.is_empty()
                    || queues.shorts_in_a_row >= SHORT_WRITES_PER_TRANSACTION);
            let next = if transaction_due {
                queues.shorts_in_a_row = 0;
                queues.transactions.pop_front()
            } else {
                let next = queues.short.pop_front();
                if next.is_some() && !queues.transactions.is_empty() {
                    queues.shorts_in_a_row += 1;
                }
                next
            };
            let Some(next) = next else {
                queues.held = false;
                return;
            };
            if next.send(()).is_ok() {
                return;
            }
        }
    }
}

/// The writer gate of one database file; see the [module](self).
#[derive(Debug, Default)]
pub struct WriteGate {
    /// Every writer's turn at the write lock.
    lock: Arc<Lock>,
}

/// How long a transaction holds its gate ([`WriteGate::hold`]) before it lets the gate go and
/// finishes outside it.
pub const GRACE: Duration = Duration::from_millis(10);

/// A writer's turn at a [`WriteGate`]: the gate is free again when this drops. A turn taken
/// where no gate applies (another database, or inside the holder's own
/// [`hold`](WriteGate::hold)) holds nothing.
#[derive(Debug)]
#[must_use = "the turn ends when it is dropped"]
pub struct Turn(Option<Grant>);

impl Turn {
    /// A turn that holds nothing.
    pub fn none() -> Self {
        Self(None)
    }

    /// Whether this turn holds its gate (`false`: no gate applied).
    pub fn holds(&self) -> bool {
        self.0.is_some()
    }
}

tokio::task_local! {
    /// The gates the running task holds for a [`WriteGate::hold`].
    static HELD: Holding;
}

/// The ids of the gates a task holds, shared by every future of the task inside one
/// [`scoped`] (the attempt and its lease keeper), and the signal that a hold began.
#[derive(Clone, Debug, Default)]
struct Holding(Arc<(Mutex<Vec<usize>>, tokio::sync::Notify)>);

impl Holding {
    fn ids(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.0
             .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn holds(&self, id: usize) -> bool {
        self.ids().contains(&id)
    }

    fn push(&self, id: usize) {
        self.ids().push(id);
        self.0 .1.notify_waiters();
    }
}

/// Removes a gate's id from its [`Holding`] when the hold ends, or is dropped mid-way.
struct Release(Holding, usize);

impl Drop for Release {
    fn drop(&mut self) {
        let mut ids = self.0.ids();
        if let Some(at) = ids.iter().rposition(|id| *id == self.1) {
            ids.remove(at);
        }
    }
}

/// Runs `task` so that every future polled inside it sees the gates a [`WriteGate::hold`]
/// inside it holds: a lease keeper beside a held attempt then passes the gate while (and only
/// while) the attempt holds it.
pub async fn scoped<F: Future>(task: F) -> F::Output {
    HELD.scope(Holding::default(), task).await
}

/// The gates of the database files used, by absolute path, kept for the life of the process:
/// a gate whose writers all ended must still be the one the next writer finds.
static GATES: LazyLock<Mutex<HashMap<PathBuf, Arc<WriteGate>>>> = LazyLock::new(Default::default);

impl WriteGate {
    /// The gate of the database file `path` (made absolute against the working directory,
    /// symbolic links not followed), the same for every caller in this process.
    pub fn for_file(path: &Path) -> Arc<Self> {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        let mut gates = GATES
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        gates.entry(path).or_default().clone()
    }

    fn id(&self) -> usize {
        Arc::as_ptr(&self.lock) as usize
    }

    fn held_here(&self) -> bool {
        HELD.try_with(|held| held.holds(self.id())).unwrap_or(false)
    }

    /// Waits for a short write's turn, behind every writer queued before it. Passes at once
    /// inside this gate's own [`hold`](Self::hold), and stops waiting when a hold in the same
    /// [`scoped`] task takes the gate.
    pub async fn turn(&self) -> Turn {
        let Ok(holding) = HELD.try_with(Clone::clone) else {
            return Turn(Some(self.lock.acquire(Class::Short).await));
        };
        loop {
            let began = holding.0 .1.notified();
            if holding.holds(self.id()) {
                return Turn::none();
            }
            tokio::select! {
                grant = self.lock.acquire(Class::Short) => return Turn(Some(grant)),
                () = began => {}
            }
        }
    }

    /// Runs `attempt` holding the gate from its start, behind the writers queued before it, for
    /// up to [`GRACE`]; past that the gate is free again and `attempt` goes on without it. Turns
    /// at this gate inside `attempt`, and in the rest of the enclosing [`scoped`] task, pass at
    /// once while `attempt` holds the gate.
    pub async fn hold<F: Future>(&self, attempt: F) -> F::Output {
        if self.held_here() {
            return attempt.await;
        }
        let turn = self.lock.acquire(Class::Transaction).await;
        let (holding, scope) = match HELD.try_with(Clone::clone) {
            Ok(holding) => (holding, None),
            Err(_) => {
                let holding = Holding::default();
                (holding.clone(), Some(holding))
            }
        };
        holding.push(self.id());
        let release = Release(holding, self.id());
        let attempt = async move {
            match scope {
                Some(holding) => HELD.scope(holding, attempt).await,
                None => attempt.await,
            }
        };
        tokio::pin!(attempt);
        tokio::select! {
            output = &mut attempt => return output,
            () = tokio::time::sleep(GRACE) => {}
        }
        drop((release, turn));
        attempt.await
    }
}

/// A short write's turn on `pool`'s database: its file's [`WriteGate::turn`] on SQLite, nothing
/// elsewhere.
pub async fn turn<DB: Driver>(pool: &sqlx::Pool<DB>) -> Turn {
    match DB::write_gate(pool) {
        Some(gate) => gate.turn().await,
        None => Turn::none(),
    }
}

/// Runs `attempt` holding `pool`'s database gate ([`WriteGate::hold`]) on SQLite; as it is
/// elsewhere.
pub async fn hold<DB: Driver, F: Future>(pool: &sqlx::Pool<DB>, attempt: F) -> F::Output {
    // On the heap: a transaction's future is large, and each future around it (this one, the
    // hold's, its task-local scope) would otherwise hold and move a copy of it.
    let attempt = Box::pin(attempt);
    match DB::write_gate(pool) {
        Some(gate) => gate.hold(attempt).await,
        None => attempt.await,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn one_file_has_one_gate_and_two_files_two() {
        let dir = std::env::temp_dir();
        let a = WriteGate::for_file(&dir.join("tidem-gate-a.db"));
        let again = WriteGate::for_file(&dir.join(".").join("tidem-gate-a.db"));
        let b = WriteGate::for_file(&dir.join("tidem-gate-b.db"));
        assert!(Arc::ptr_eq(&a, &again), "one file, one gate");
        assert!(!Arc::ptr_eq(&a, &b), "two files, two gates");
        let id = a.id();
        drop((a, again));
        let a = WriteGate::for_file(&dir.join("tidem-gate-a.db"));
        assert_eq!(a.id(), id, "a file's gate outlives its callers");
        let again = WriteGate::for_file(&dir.join("tidem-gate-a.db"));
        let _first = a.turn().await;
        let second = tokio::time::timeout(Duration::from_millis(50), again.turn()).await;
        assert!(
            second.is_err(),
            "a second turn at one file waits for the first"
        );
        let other = b.turn().await;
        assert!(other.holds(), "another file's gate is free");
    }

    #[tokio::test]
    async fn writers_take_the_gate_in_arrival_order() {
        let gate = Arc::new(WriteGate::default());
        let first = gate.turn().await;
        let (sent, mut order) = tokio::sync::mpsc::unbounded_channel();
        let mut waiting = Vec::new();
        for i in 0..5 {
            let (gate, sent) = (gate.clone(), sent.clone());
            waiting.push(tokio::spawn(async move {
                let _turn = gate.turn().await;
                sent.send(i).unwrap();
            }));
            // The test's runtime has one thread: the task runs to its wait before the next.
            tokio::task::yield_now().await;
        }
        drop(first);
        for expected in 0..5 {
            assert_eq!(order.recv().await, Some(expected));
        }
        for task in waiting {
            task.await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_turn_inside_the_holders_attempt_passes_and_others_wait() {
        let gate = Arc::new(WriteGate::default());
        let (inside, outside) = gate
            .hold(async {
                let inside = gate.turn().await.holds();
                let nested = gate.hold(async { gate.turn().await.holds() }).await;
                let other = gate.clone();
                let outside = tokio::spawn(async move { other.turn().await });
                // Well inside the hold's grace.
                let waited = tokio::time::timeout(GRACE / 10, outside).await;
                (inside || nested, waited.is_err())
            })
            .await;
        assert!(!inside, "the holder's own turns pass");
        assert!(outside, "another task's turn waits for the holder");
        assert!(gate.turn().await.holds(), "the gate is free after the hold");
    }

    #[tokio::test]
    async fn a_keeper_beside_the_attempt_passes_only_while_the_attempt_holds_the_gate() {
        let gate = Arc::new(WriteGate::default());
        let blocker = gate.turn().await;
        let (go, mut went) = tokio::sync::mpsc::unbounded_channel();
        let (attempt_ends, ended) = tokio::sync::oneshot::channel::<()>();
        let holds = Arc::new(tokio::sync::Notify::new());
        let task = {
            let (gate, holds) = (gate.clone(), holds.clone());
            tokio::spawn(scoped(async move {
                let attempt = gate.hold(async {
                    holds.notify_one();
                    let _ = ended.await;
                });
                let keeper = async {
                    // Queued behind `blocker`: the attempt does not hold the gate yet.
                    let first = tokio::time::timeout(GRACE / 10, gate.turn()).await;
                    go.send(first.is_err()).unwrap();
                    // Once the attempt holds the gate, the keeper passes.
                    holds.notified().await;
                    go.send(!gate.turn().await.holds()).unwrap();
                    std::future::pending::<()>().await
                };
                tokio::select! {
                    () = attempt => {},
                    () = keeper => {},
                }
            }))
        };
        assert_eq!(
            went.recv().await,
            Some(true),
            "the keeper waited while the gate was taken"
        );
        drop(blocker);
        assert_eq!(
            went.recv().await,
            Some(true),
            "the keeper passed during the hold"
        );
        attempt_ends.send(()).unwrap();
        task.await.unwrap();
        assert!(gate.turn().await.holds(), "the gate is free after the hold");
    }

    #[tokio::test]
    async fn short_writes_go_first_but_a_waiting_transaction_gets_every_fifth_turn() {
        let gate = Arc::new(WriteGate::default());
        let first = gate.turn().await;
        let (sent, mut order) = tokio::sync::mpsc::unbounded_channel();
        let mut waiting = Vec::new();
        for name in ["tx", "a", "b", "c", "d", "e"] {
            let (gate, sent) = (gate.clone(), sent.clone());
            waiting.push(tokio::spawn(async move {
                if name == "tx" {
                    gate.hold(async { sent.send(name).unwrap() }).await;
                } else {
                    let _turn = gate.turn().await;
                    sent.send(name).unwrap();
                }
            }));
            // The test's runtime has one thread: the task runs to its wait before the next.
            tokio::task::yield_now().await;
        }
        drop(first);
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(order.recv().await.unwrap());
        }
        assert_eq!(seen, ["a", "b", "c", "d", "tx", "e"]);
        for task in waiting {
            task.await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_grant_to_a_writer_that_stopped_waiting_passes_on() {
        let gate = Arc::new(WriteGate::default());
        let first = gate.turn().await;
        let gone = tokio::spawn({
            let gate = gate.clone();
            async move { gate.turn().await }
        });
        tokio::task::yield_now().await;
        let next = tokio::spawn({
            let gate = gate.clone();
            async move { gate.turn().await.holds() }
        });
        tokio::task::yield_now().await;
        gone.abort();
        drop(first);
        assert!(next.await.unwrap(), "the next writer got the lock");
    }

    #[tokio::test]
    async fn a_transaction_longer_than_the_grace_lets_the_gate_go() {
        let gate = Arc::new(WriteGate::default());
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let (started, is_started) = tokio::sync::oneshot::channel();
        let long = {
            let gate = gate.clone();
            tokio::spawn(async move {
                gate.hold(async {
                    let _ = started.send(());
                    let _ = released.await;
                })
                .await;
            })
        };
        is_started.await.unwrap();
        let turn = gate.turn().await;
        assert!(turn.holds());
        assert!(
            !long.is_finished(),
            "the short write got its turn while the long one runs"
        );
        drop(turn);
        release.send(()).unwrap();
        long.await.unwrap();
        let quick = gate.hold(async { gate.turn().await.holds() }).await;
        assert!(!quick, "inside its grace a transaction's own turns pass");
    }
}
