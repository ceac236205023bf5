//! Graceful shutdown: wait, under a deadline, for running handlers to finish and record results.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio_util::task::TaskTracker;

/// Drains the handlers an [`IdempotencyLayer`](crate::IdempotencyLayer) is running.
///
/// A caller's disconnect cannot cancel a handler halfway: it runs on the caller's task, and moves
/// to a task of its own if the caller goes away. On deploy, call [`drain`](Self::drain) after the
/// server stopped accepting connections: new guarded requests are answered `503` with
/// `Retry-After` (the sender retries elsewhere), and running handlers get until the deadline to
/// finish and store their results, so an interrupted request is not executed a second time by its
/// retry.
///
/// ```no_run
/// # async fn run(layer: tower_idempotency_core::IdempotencyLayer) {
/// let handle = layer.shutdown_handle();
/// // ... axum::serve(listener, app).with_graceful_shutdown(signal).await ...
/// let finished = handle.drain(std::time::Duration::from_secs(30)).await;
/// if !finished {
///     tracing::warn!(left = handle.in_flight(), "handlers still running at shutdown");
/// }
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct ShutdownHandle {
    tasks: TaskTracker,
    accepting: Arc<AtomicBool>,
}

impl ShutdownHandle {
    pub(crate) fn new(tasks: TaskTracker, accepting: Arc<AtomicBool>) -> Self {
        Self { tasks, accepting }
    }

    /// Stops guarding new requests and waits up to `deadline` for the guarded requests already
    /// accepted: those still reading their body or claiming their key, and running handlers.
    /// Returns whether all of them finished.
    pub async fn drain(&self, deadline: Duration) -> bool {
        self.accepting.store(false, Ordering::SeqCst);
        self.tasks.close();
        tokio::time::timeout(deadline, self.tasks.wait())
            .await
            .is_ok()
    }

    /// Number of guarded requests in progress: reading their body, claiming their key, or
    /// running their handler (for a waiting caller or one that left).
    pub fn in_flight(&self) -> usize {
        self.tasks.len()
    }
}
