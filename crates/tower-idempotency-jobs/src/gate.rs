//! SQLite's one write lock, handed out in this process in arrival order: one fair gate per
//! database file, taken by every writer of the engine and of both halves on that file.
//!
//! A SQLite connection that finds the write lock taken waits in the busy handler, which sleeps in
//! growing steps (up to 100 ms) and tries again: a writer queued behind a transaction that ends
//! 1 ms later can sleep for tens of milliseconds while later writers take the lock before it.
//! Under a steady drain an acknowledgement can lose that race again and again. Every writer in
//! this process therefore first takes a [`Turn`] at the file's [`WriteGate`], a first-come
//! first-served queue that hands the lock on as the last writer ends; the busy handler is left
//! for writers outside the gate (another process, statements a user runs on the pool).
//!
//! - **Short writes** (acknowledgements, claims, renewals, completions, failure records, sweeps,
//!   purges, operator changes) queue for the lock itself ([`WriteGate::turn`]).
//! - **A transaction that takes the lock at its start** (an inbox handler's under skip-stale
//!   ordering, or after a lock conflict) holds the gate for its whole length
//!   ([`WriteGate::hold`]): first behind the other held transactions, then behind the short
//!   writes queued before it. A short write therefore waits for at most the one transaction in
//!   progress, not for every one queued before it.
//! - **A transaction that takes the lock at its first statement** (an inbox handler's by
//!   default) starts once the writers queued before it have had their turn ([`pass`]) and then
//!   holds nothing: what a handler does before its first statement (call another service, wait)
//!   keeps no writer waiting, and a short write waits at most for the transactions already
//!   running (the worker's concurrency), in SQLite's busy handler.
//! - **Nested turns pass**: inside [`WriteGate::hold`], a turn at the same gate (the attempt's
//!   own lease renewal, an engine write the handler makes) does not wait for the gate its own
//!   task holds. What it writes on another connection then meets SQLite's lock as it would
//!   without the gate. A task the handler spawns is not the holder: a handler that waits for one
//!   that writes waits until its attempt times out.
//!
//! Postgres and MySQL have no gate ([`Driver::write_gate`](crate::Driver::write_gate) is `None`):
//! their writers proceed side by side.

use std::{
    collections::HashMap,
    future::Future,
    path::{Path, PathBuf},
    sync::{Arc, LazyLock, Mutex},
};

use tokio::sync::{Mutex as Queue, OwnedMutexGuard};

use crate::Driver;

/// The writer gate of one database file; see the [module](self).
#[derive(Debug, Default)]
pub struct WriteGate {
    /// Every writer's turn at the write lock, first come first served.
    lock: Arc<Queue<()>>,
    /// Held attempts' turn to queue for `lock`.
    attempts: Arc<Queue<()>>,
}

/// A writer's turn at a [`WriteGate`]: the gate is free again when this drops. A turn taken
/// where no gate applies (another database, or inside the holder's own
/// [`hold`](WriteGate::hold)) holds nothing.
#[derive(Debug)]
#[must_use = "the turn ends when it is dropped"]
pub struct Turn(Option<OwnedMutexGuard<()>>);

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
            return Turn(Some(self.lock.clone().lock_owned().await));
        };
        loop {
            let began = holding.0 .1.notified();
            if holding.holds(self.id()) {
                return Turn::none();
            }
            tokio::select! {
                guard = self.lock.clone().lock_owned() => return Turn(Some(guard)),
                () = began => {}
            }
        }
    }

    /// Runs `attempt` holding the gate from its start to its end: behind the other held
    /// attempts, then behind the short writes queued before it. Turns at this gate inside
    /// `attempt`, and in the rest of the enclosing [`scoped`] task while `attempt` holds the
    /// gate, pass at once.
    pub async fn hold<F: Future>(&self, attempt: F) -> F::Output {
        if self.held_here() {
            return attempt.await;
        }
        let queued = self.attempts.clone().lock_owned().await;
        let turn = self.lock.clone().lock_owned().await;
        let output = match HELD.try_with(Clone::clone) {
            Ok(holding) => {
                holding.push(self.id());
                let _release = Release(holding, self.id());
                attempt.await
            }
            Err(_) => {
                let holding = Holding::default();
                holding.push(self.id());
                HELD.scope(holding, attempt).await
            }
        };
        drop((turn, queued));
        output
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

/// Waits for the writers queued at `pool`'s database gate before the caller, and holds nothing:
/// a transaction that takes SQLite's lock only at its first statement starts behind them, and
/// what it does before that statement keeps no writer waiting. Nothing elsewhere.
pub async fn pass<DB: Driver>(pool: &sqlx::Pool<DB>) {
    drop(turn(pool).await);
}

/// Runs `attempt` holding `pool`'s database gate ([`WriteGate::hold`]) on SQLite; as it is
/// elsewhere.
pub async fn hold<DB: Driver, F: Future>(pool: &sqlx::Pool<DB>, attempt: F) -> F::Output {
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
                let waited = tokio::time::timeout(Duration::from_millis(50), outside).await;
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
        let task = {
            let gate = gate.clone();
            tokio::spawn(scoped(async move {
                let attempt = gate.hold(async {
                    let _ = ended.await;
                });
                let keeper = async {
                    // Queued behind `blocker`: the attempt does not hold the gate yet.
                    let first = tokio::time::timeout(Duration::from_millis(50), gate.turn()).await;
                    go.send(first.is_err()).unwrap();
                    // Queued again; the attempt, queued first, takes the gate once `blocker`
                    // is gone, and the keeper passes.
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
    async fn a_short_write_waits_for_one_held_attempt_not_for_every_one_queued() {
        let gate = Arc::new(WriteGate::default());
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let (started, is_started) = tokio::sync::oneshot::channel();
        let (ended, mut ends) = tokio::sync::mpsc::unbounded_channel();
        let held = {
            let (gate, ended) = (gate.clone(), ended.clone());
            tokio::spawn(async move {
                gate.hold(async {
                    let _ = started.send(());
                    let _ = released.await;
                })
                .await;
                ended.send("first attempt").unwrap();
            })
        };
        is_started.await.unwrap();
        let second = {
            let (gate, ended) = (gate.clone(), ended.clone());
            tokio::spawn(async move {
                gate.hold(async {}).await;
                ended.send("second attempt").unwrap();
            })
        };
        tokio::task::yield_now().await;
        let short = {
            let (gate, ended) = (gate.clone(), ended.clone());
            tokio::spawn(async move {
                let _turn = gate.turn().await;
                ended.send("short write").unwrap();
            })
        };
        tokio::task::yield_now().await;
        release.send(()).unwrap();
        let order = [ends.recv().await, ends.recv().await, ends.recv().await];
        assert_eq!(
            order,
            [
                Some("first attempt"),
                Some("short write"),
                Some("second attempt")
            ]
        );
        for task in [held, second, short] {
            task.await.unwrap();
        }
    }
}
