//! SQLite's one write lock, handed out in this process in arrival order.
//!
//! A SQLite connection that finds the write lock taken waits in the busy handler, which sleeps
//! in growing steps (up to 100 ms) and retries: an acknowledgement queued behind a handler's
//! transaction that ends 1 ms later can sleep for tens of milliseconds. The inbox's writers in
//! one process take this gate first instead, a fair queue that wakes the next writer as the last
//! one ends; the busy handler is left for writers outside it (another process, a lease renewal,
//! which runs while its own event's transaction holds the gate). On Postgres there is no gate:
//! its writers proceed side by side.
//!
//! Short writes (acknowledgement commits, claims, failure records, purges) queue for the gate
//! itself. An event's transaction, which holds the lock for as long as its handler runs, first
//! queues behind the other event transactions: a short write then waits for at most the one
//! transaction in progress, not for every handler queued before it.

use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard};

/// How long a writer waits for each queue before it goes on without it, to the database's own
/// busy handler: a handler that holds its transaction longer must not turn the gate into a
/// wait without bound.
const PATIENCE: Duration = Duration::from_secs(1);

/// The gate of one inbox's writers; `None` on a database whose writers need none.
#[derive(Debug, Default)]
pub(crate) struct OneWriter(Option<Gate>);

#[derive(Debug, Default)]
struct Gate {
    /// Every writer's turn at the write lock.
    lock: Mutex<()>,
    /// Event transactions' turn to queue for `lock`.
    transactions: Mutex<()>,
}

/// A writer's turn, held while the guards live.
pub(crate) type Turn<'a> = (Option<MutexGuard<'a, ()>>, Option<MutexGuard<'a, ()>>);

impl OneWriter {
    /// A gate when `one_writer` (the database takes one write lock at a time).
    pub(crate) fn new(one_writer: bool) -> Self {
        Self(one_writer.then(Gate::default))
    }

    /// Waits for a short write's turn. Without a gate, or when the turn did not come within
    /// [`PATIENCE`], the turn holds nothing.
    pub(crate) async fn turn(&self) -> Turn<'_> {
        let Some(gate) = &self.0 else {
            return (None, None);
        };
        (None, patient(&gate.lock).await)
    }

    /// Waits for an event transaction's turn: behind the other event transactions, then
    /// behind the short writes queued before it.
    pub(crate) async fn transaction_turn(&self) -> Turn<'_> {
        let Some(gate) = &self.0 else {
            return (None, None);
        };
        let queued = patient(&gate.transactions).await;
        (queued, patient(&gate.lock).await)
    }
}

async fn patient(mutex: &Mutex<()>) -> Option<MutexGuard<'_, ()>> {
    tokio::time::timeout(PATIENCE, mutex.lock()).await.ok()
}
