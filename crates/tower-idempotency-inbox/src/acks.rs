//! Acknowledgements committed together: deliveries that arrive while an insert is in flight are
//! inserted by the next one, in one statement (Postgres: `INSERT .. SELECT FROM unnest(..) ..
//! RETURNING`) or one transaction (SQLite), and each is answered once its row is committed.
//!
//! A flush runs on a task of its own (so a sender that goes away does not strand the others): it
//! takes up to [`MAX_BATCH`] (or the configured bound) queued deliveries, inserts them, answers
//! each, and goes on while deliveries are queued. One flush runs at a time per inbox unless
//! [`Inbox::ack_commits_in_flight`](crate::Inbox::ack_commits_in_flight) allows more: then a
//! delivery that arrives while they are all in flight waits for the first to finish.
//!
//! What each delivery is answered:
//! - **Copies of one key in a batch** are one row: every copy gets the first copy's outcome once
//!   that row's insert has ended (inserted or already stored: `200`; failed: `503`). No copy is
//!   answered "duplicate" before the row it duplicates is committed.
//! - **A row the database refuses** (a constraint, a value it cannot store) fails the batch's
//!   statement: its rows are then inserted one by one, so only the refused row's deliveries fail.
//! - **A database that is unavailable** (a connection error, a lock or busy wait that timed out;
//!   [`is_unavailable_error`]) fails the whole batch at once, and every delivery queued behind it
//!   too: they would wait for the same database.
//! - **A caller whose request is gone** (its provider timed out) is skipped before its batch is
//!   inserted: the provider delivers it again.
//! - **The queue is bounded** ([`Inbox::max_waiting_acks`](crate::Inbox::max_waiting_acks)): a
//!   delivery that finds it full is answered `503` at once.
//! - **Every acknowledgement has a deadline** ([`Inbox::ack_deadline`](crate::Inbox::ack_deadline)):
//!   past it the delivery is answered `503`, and a batch statement still running is abandoned. A
//!   row that commits after its caller was answered is a duplicate of the provider's retry.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::oneshot;
use tower_idempotency_sqlx::is_unavailable_error;

use crate::backend::{InboxDatabase, NewEvent, Sql};

/// The most deliveries one batch inserts, unless configured otherwise
/// ([`Inbox::max_ack_batch`](crate::Inbox::max_ack_batch)).
pub const MAX_BATCH: usize = 256;

/// How long an acknowledgement may take before it is answered `503`, unless configured
/// otherwise ([`Inbox::ack_deadline`](crate::Inbox::ack_deadline)): below the 10 to 30 s after
/// which common providers give up on a delivery.
pub const DEFAULT_ACK_DEADLINE: Duration = Duration::from_secs(10);

/// How many deliveries may wait for their commit at once, unless configured otherwise
/// ([`Inbox::max_waiting_acks`](crate::Inbox::max_waiting_acks)).
pub const DEFAULT_MAX_WAITING_ACKS: usize = 1024;

/// Why an acknowledgement was not stored: each is answered `503` with `Retry-After`.
#[derive(Clone, Debug, thiserror::Error)]
pub(crate) enum AckError {
    /// The database refused this delivery's row.
    #[error("the database refused the event's row: {0}")]
    Refused(Arc<sqlx::Error>),
    /// The database could not serve the batch (its connection, a lock or busy timeout).
    #[error("the database is unavailable: {0}")]
    Unavailable(Arc<sqlx::Error>),
    /// The queue of deliveries waiting for a commit was full.
    #[error("{0} acknowledgements are already waiting for a commit")]
    QueueFull(usize),
    /// The deadline passed before the row was committed.
    #[error("the acknowledgement was not committed within {0:?}")]
    Deadline(Duration),
    /// The flush that held the delivery stopped (its runtime shut down, or it panicked).
    #[error("the acknowledgement writer stopped")]
    WriterStopped,
}

impl AckError {
    fn from_database(error: sqlx::Error) -> Self {
        if is_unavailable_error(&error) {
            Self::Unavailable(Arc::new(error))
        } else {
            Self::Refused(Arc::new(error))
        }
    }
}

/// The outcome of one delivery: `true` when its row was inserted, `false` for a duplicate of a
/// stored row.
type Outcome = Result<bool, AckError>;

/// The acknowledgement writer's bounds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AckSettings {
    /// Deliveries one commit takes at most.
    pub(crate) max_batch: usize,
    /// Flushes that may run at once.
    pub(crate) in_flight: usize,
    /// Deliveries that may wait for a commit at once.
    pub(crate) max_waiting: usize,
    /// How long one acknowledgement may take.
    pub(crate) deadline: Duration,
}

impl Default for AckSettings {
    fn default() -> Self {
        Self {
            max_batch: MAX_BATCH,
            in_flight: 1,
            max_waiting: DEFAULT_MAX_WAITING_ACKS,
            deadline: DEFAULT_ACK_DEADLINE,
        }
    }
}

/// A delivery waiting for its batch, and where its answer goes.
struct Waiting {
    event: NewEvent,
    answer: oneshot::Sender<Outcome>,
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
    settings: AckSettings,
}

impl Acks {
    pub(crate) fn new(settings: AckSettings) -> Self {
        Self {
            queue: Mutex::default(),
            settings: AckSettings {
                max_batch: settings.max_batch.max(1),
                in_flight: settings.in_flight.max(1),
                max_waiting: settings.max_waiting.max(1),
                deadline: settings.deadline.max(Duration::from_millis(1)),
            },
        }
    }

    pub(crate) fn settings(&self) -> AckSettings {
        self.settings
    }

    /// Deliveries waiting for a commit now (not counting those whose batch is in flight).
    pub(crate) fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Inserts `event` with the deliveries queued beside it; `true` when its row was inserted,
    /// `false` for a duplicate of a stored row.
    pub(crate) async fn insert<DB: InboxDatabase>(
        self: &Arc<Self>,
        pool: &sqlx::Pool<DB>,
        sql: &Arc<Sql>,
        event: NewEvent,
    ) -> Outcome {
        let deadline = self.settings.deadline;
        if self.settings.max_batch == 1 {
            // Each delivery its own commit, side by side on the pool: no queue to wait in.
            return match tokio::time::timeout(deadline, DB::insert(pool, sql, &event)).await {
                Ok(inserted) => inserted.map_err(AckError::from_database),
                Err(_) => Err(AckError::Deadline(deadline)),
            };
        }
        let (answer, answered) = oneshot::channel();
        let start = {
            let mut queue = self.lock();
            if queue.waiting.len() >= self.settings.max_waiting {
                return Err(AckError::QueueFull(queue.waiting.len()));
            }
            queue.waiting.push(Waiting { event, answer });
            let start = queue.flushing < self.settings.in_flight;
            queue.flushing += usize::from(start);
            start
        };
        if start {
            let (acks, pool, sql) = (self.clone(), pool.clone(), sql.clone());
            tokio::spawn(async move { acks.flush(&pool, &sql).await });
        }
        match tokio::time::timeout(deadline, answered).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(AckError::WriterStopped),
            Err(_) => Err(AckError::Deadline(deadline)),
        }
    }

    /// Inserts what is queued, batch after batch, until the queue is empty.
    async fn flush<DB: InboxDatabase>(&self, pool: &sqlx::Pool<DB>, sql: &Sql) {
        let mut flushing = Flushing {
            acks: self,
            finished: false,
        };
        loop {
            let batch = {
                let mut queue = self.lock();
                if queue.waiting.is_empty() {
                    queue.flushing -= 1;
                    flushing.finished = true;
                    return;
                }
                let take = queue.waiting.len().min(self.settings.max_batch);
                queue.waiting.drain(..take).collect::<Vec<_>>()
            };
            // A statement still running at the deadline is abandoned: its callers were answered
            // by their own deadline, which started earlier.
            let inserted =
                tokio::time::timeout(self.settings.deadline, insert_batch(pool, sql, batch));
            if let Ok(Err(outage)) = inserted.await {
                // Those queued meanwhile would wait for the same database: answered at once.
                let queued = std::mem::take(&mut self.lock().waiting);
                for waiting in queued {
                    let _ = waiting.answer.send(Err(outage.clone()));
                }
            }
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
        let mut queue = self.acks.lock();
        queue.flushing -= 1;
        if queue.flushing == 0 {
            for waiting in queue.waiting.drain(..) {
                let _ = waiting.answer.send(Err(AckError::WriterStopped));
            }
        }
    }
}

/// One row of a batch: the first copy's event, and the answers of every copy of its key.
struct Row {
    event: NewEvent,
    answers: Vec<oneshot::Sender<Outcome>>,
}

impl Row {
    /// Answers every copy: the first with `outcome`, the later ones with the same failure, or
    /// as duplicates of the row once it is stored.
    fn answer(self, outcome: Outcome) {
        let mut answers = self.answers.into_iter();
        if let Some(first) = answers.next() {
            let _ = first.send(outcome.clone());
        }
        for copy in answers {
            let _ = copy.send(outcome.clone().map(|_| false));
        }
    }
}

/// The deliveries of `batch` whose callers still wait, one [`Row`] per key in arrival order.
fn rows(batch: Vec<Waiting>) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::with_capacity(batch.len());
    let mut at: HashMap<crate::EventKey, usize> = HashMap::with_capacity(batch.len());
    for waiting in batch {
        if waiting.answer.is_closed() {
            continue;
        }
        match at.get(&waiting.event.key) {
            Some(&i) => rows[i].answers.push(waiting.answer),
            None => {
                at.insert(waiting.event.key.clone(), rows.len());
                rows.push(Row {
                    event: waiting.event,
                    answers: vec![waiting.answer],
                });
            }
        }
    }
    rows
}

/// Inserts `batch` and answers each delivery. Answers the outage error when the database was
/// unavailable (every delivery of the batch is answered with it).
async fn insert_batch<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
    batch: Vec<Waiting>,
) -> Result<(), AckError> {
    let rows = rows(batch);
    let inserted = match &rows[..] {
        [] => return Ok(()),
        [one] => DB::insert(pool, sql, &one.event).await.map(|inserted| {
            let mut keys = std::collections::HashSet::new();
            if inserted {
                keys.insert(one.event.key.clone());
            }
            keys
        }),
        _ => {
            let events: Vec<&NewEvent> = rows.iter().map(|row| &row.event).collect();
            DB::insert_many(pool, sql, &events).await
        }
    };
    match inserted.map_err(AckError::from_database) {
        Ok(inserted) => {
            for row in rows {
                let stored = inserted.contains(&row.event.key);
                row.answer(Ok(stored));
            }
            Ok(())
        }
        Err(refused @ AckError::Refused(_)) if rows.len() == 1 => {
            rows.into_iter()
                .for_each(|row| row.answer(Err(refused.clone())));
            Ok(())
        }
        Err(AckError::Refused(error)) => {
            tracing::debug!(%error, rows = rows.len(), "a batch of acknowledgements was refused; inserting them one by one");
            one_by_one(pool, sql, rows).await
        }
        Err(outage) => {
            for row in rows {
                row.answer(Err(outage.clone()));
            }
            Err(outage)
        }
    }
}

/// Inserts `rows` one by one, so a row the database refuses fails only its own deliveries;
/// stops at an outage, answering the rows not yet inserted with it.
async fn one_by_one<DB: InboxDatabase>(
    pool: &sqlx::Pool<DB>,
    sql: &Sql,
    rows: Vec<Row>,
) -> Result<(), AckError> {
    let mut rows = rows.into_iter();
    while let Some(row) = rows.next() {
        if row.answers.iter().all(|answer| answer.is_closed()) {
            continue;
        }
        match DB::insert(pool, sql, &row.event)
            .await
            .map_err(AckError::from_database)
        {
            Err(outage @ AckError::Unavailable(_)) => {
                row.answer(Err(outage.clone()));
                rows.for_each(|row| row.answer(Err(outage.clone())));
                return Err(outage);
            }
            outcome => row.answer(outcome),
        }
    }
    Ok(())
}
