//! Acknowledgements committed together: deliveries that arrive while an insert is in flight are
//! inserted by the next one, in one statement (Postgres: `INSERT .. SELECT FROM unnest(..) ..
//! RETURNING`) or one transaction (SQLite), and each is answered once its row is committed.
//!
//! A flush runs on a task of its own (so a sender that goes away does not strand the others): it
//! takes up to [`MAX_BATCH`] (or the configured bound) queued deliveries, inserts them, answers
//! each (inserted, or a duplicate: its key or its authenticator was already stored), and goes on
//! while deliveries are queued. One flush runs at a time per inbox unless
//! [`Inbox::ack_commits_in_flight`](crate::Inbox::ack_commits_in_flight) allows more: then a
//! delivery that arrives while they are all in flight waits for the first to finish. When a
//! batch fails, its deliveries are inserted one by one, so a delivery that would have succeeded
//! alone is not failed by another's row.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

use tokio::sync::oneshot;

use crate::backend::{InboxDatabase, NewEvent, Sql};

/// The most deliveries one batch inserts, unless configured otherwise
/// ([`Inbox::max_ack_batch`](crate::Inbox::max_ack_batch)).
pub const MAX_BATCH: usize = 256;

/// A delivery waiting for its batch, and where its answer goes.
struct Waiting {
    event: NewEvent,
    answer: oneshot::Sender<sqlx::Result<bool>>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiting>,
    /// Flushes running.
    flushing: usize,
}

/// The inbox's acknowledgement writer; shared by an inbox's clones.
pub(crate) struct Acks {
    queue: Mutex<Queue>,
    max_batch: usize,
    /// Flushes that may run at once.
    in_flight: usize,
}

impl Acks {
    pub(crate) fn new(max_batch: usize, in_flight: usize) -> Self {
        Self {
            queue: Mutex::default(),
            max_batch: max_batch.max(1),
            in_flight: in_flight.max(1),
        }
    }

    /// The same bounds with `max_batch` deliveries a commit.
    pub(crate) fn with_max_batch(&self, max_batch: usize) -> Self {
        Self::new(max_batch, self.in_flight)
    }

    /// The same bounds with `in_flight` commits at once.
    pub(crate) fn with_in_flight(&self, in_flight: usize) -> Self {
        Self::new(self.max_batch, in_flight)
    }

    /// Inserts `event` with the deliveries queued beside it; `true` when its row was inserted,
    /// `false` for a duplicate.
    pub(crate) async fn insert<DB: InboxDatabase>(
        self: &Arc<Self>,
        pool: &sqlx::Pool<DB>,
        sql: &Arc<Sql>,
        event: NewEvent,
    ) -> sqlx::Result<bool> {
        if self.max_batch == 1 {
            // Each delivery its own commit, side by side on the pool: no queue to wait in.
            return DB::insert(pool, sql, &event).await;
        }
        let (answer, answered) = oneshot::channel();
        let start = {
            let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            queue.waiting.push(Waiting { event, answer });
            let start = queue.flushing < self.in_flight;
            queue.flushing += usize::from(start);
            start
        };
        if start {
            let (acks, pool, sql) = (self.clone(), pool.clone(), sql.clone());
            tokio::spawn(async move { acks.flush(&pool, &sql).await });
        }
        answered
            .await
            .unwrap_or_else(|_| Err(sqlx::Error::WorkerCrashed))
    }

    /// Inserts what is queued, batch after batch, until the queue is empty.
    async fn flush<DB: InboxDatabase>(&self, pool: &sqlx::Pool<DB>, sql: &Sql) {
        let mut flushing = Flushing {
            acks: self,
            finished: false,
        };
        loop {
            let batch = {
                let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                if queue.waiting.is_empty() {
                    queue.flushing -= 1;
                    flushing.finished = true;
                    return;
                }
                let take = queue.waiting.len().min(self.max_batch);
                queue.waiting.drain(..take).collect::<Vec<_>>()
            };
            insert_batch(pool, sql, batch).await;
        }
    }
}

/// Ends a flush that stopped early (its task was dropped with its runtime, or panicked): when
/// it was the last one running, the deliveries still queued are answered with an error (`503`:
/// the provider retries); the next delivery starts a flush again. A flush that ran to its end
/// counted itself out when it found the queue empty, under the same lock.
struct Flushing<'a> {
    acks: &'a Acks,
    finished: bool,
}

impl Drop for Flushing<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut queue = self.acks.queue.lock().unwrap_or_else(|p| p.into_inner());
        queue.flushing -= 1;
        if queue.flushing == 0 {
            for waiting in queue.waiting.drain(..) {
                let _ = waiting.answer.send(Err(sqlx::Error::WorkerCrashed));
            }
        }
    }
}

/// Inserts `batch` (a key's later copies in it are duplicates of its first) and answers each.
async fn insert_batch<DB: InboxDatabase>(pool: &sqlx::Pool<DB>, sql: &Sql, batch: Vec<Waiting>) {
    let mut seen = HashSet::new();
    let (first, copies): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .partition(|w| seen.insert(w.event.key.clone()));
    for copy in copies {
        let _ = copy.answer.send(Ok(false));
    }
    if let [one] = &first[..] {
        let inserted = DB::insert(pool, sql, &one.event).await;
        let one = first.into_iter().next().expect("one");
        let _ = one.answer.send(inserted);
        return;
    }
    let events: Vec<&NewEvent> = first.iter().map(|w| &w.event).collect();
    match DB::insert_many(pool, sql, &events).await {
        Ok(inserted) => {
            for waiting in first {
                let stored = inserted.contains(&waiting.event.key);
                let _ = waiting.answer.send(Ok(stored));
            }
        }
        Err(error) => {
            tracing::debug!(%error, rows = first.len(), "a batch of acknowledgements failed; inserting them one by one");
            for waiting in first {
                let inserted = DB::insert(pool, sql, &waiting.event).await;
                let _ = waiting.answer.send(inserted);
            }
        }
    }
}
