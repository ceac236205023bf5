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

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use std::{str::FromStr, time::Instant};

    use sqlx::{
        sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions},
        Executor, SqlitePool,
    };

    use super::*;
    use crate::EventKey;

    /// A SQLite file of its own, whose waits for the write lock last up to 30 s.
    async fn open(name: &str, connections: u32) -> (SqlitePool, Arc<Sql>, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "tidem-acks-{name}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}/inbox.db", dir.display());
        let options = SqliteConnectOptions::from_str(&url)
            .unwrap()
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await
            .unwrap();
        let sql = Arc::new(<sqlx::Sqlite as crate::backend::sealed::InboxSql>::statements("inbox"));
        <sqlx::Sqlite as tower_idempotency_jobs::Driver>::run_script(&pool, &sql.schema)
            .await
            .unwrap();
        (pool, sql, dir)
    }

    fn event(id: &str) -> NewEvent {
        NewEvent {
            key: EventKey::new("stripe", id),
            headers: "[]".to_owned(),
            body: b"{}".to_vec(),
            authenticator: None,
            received_at: 1,
            order: None,
            authenticator_until: None,
        }
    }

    /// Waits until `ready` holds (a signal polled: the flush and the queue have no hook).
    async fn until(what: &str, ready: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready() {
            assert!(Instant::now() < deadline, "never: {what}");
            tokio::task::yield_now().await;
        }
    }

    async fn stored(pool: &SqlitePool, id: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM inbox WHERE event_id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap()
    }

    /// A delivery whose caller went away while it was queued (its provider timed out) is
    /// skipped: its row is not inserted, while the one queued beside it is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_caller_gone_before_its_batch_is_skipped() {
        let (pool, sql, dir) = open("gone", 4).await;
        let acks = Arc::new(Acks::new(AckSettings::default()));
        let mut held = pool.acquire().await.unwrap();
        held.execute("BEGIN IMMEDIATE").await.unwrap();
        let insert = |id: &str| {
            let (acks, pool, sql, event) = (acks.clone(), pool.clone(), sql.clone(), event(id));
            tokio::spawn(async move { acks.insert(&pool, &sql, event).await })
        };
        let first = insert("evt_first");
        until("the first insert was sent", || sql.executed() >= 1).await;
        let gone = insert("evt_gone");
        until("the delivery queued", || acks.waiting() == 1).await;
        gone.abort();
        assert!(gone.await.unwrap_err().is_cancelled());
        let kept = insert("evt_kept");
        until("the second delivery queued", || acks.waiting() == 2).await;
        held.execute("ROLLBACK").await.unwrap();
        assert!(first.await.unwrap().unwrap());
        assert!(kept.await.unwrap().unwrap());
        assert_eq!(stored(&pool, "evt_gone").await, 0);
        assert_eq!(stored(&pool, "evt_kept").await, 1);
        drop(held);
        pool.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    /// The flush's task stops (its runtime shuts down) while a delivery waits behind it: that
    /// delivery is answered at once with [`AckError::WriterStopped`] (a `503`), and the next
    /// delivery starts a flush again and is stored. The flush waits for the pool's one
    /// connection, which the test holds.
    #[test]
    fn a_writer_that_stops_answers_the_deliveries_behind_it() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let flushing = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (pool, sql, dir) = runtime.block_on(open("stopped", 1));
        let acks = Arc::new(Acks::new(AckSettings::default()));
        let held = runtime.block_on(pool.acquire()).unwrap();
        let insert = |id: &str| {
            let (acks, pool, sql, event) = (acks.clone(), pool.clone(), sql.clone(), event(id));
            async move { acks.insert(&pool, &sql, event).await }
        };
        // The flush starts on the runtime that is shut down below.
        let _first = flushing.spawn(insert("evt_first"));
        runtime.block_on(until("the first insert was sent", || sql.executed() >= 1));
        let behind = runtime.spawn(insert("evt_behind"));
        runtime.block_on(until("the delivery queued", || acks.waiting() == 1));
        flushing.shutdown_timeout(Duration::from_secs(10));
        let answered = runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), behind).await })
            .expect("the queued delivery is answered")
            .unwrap();
        assert!(
            matches!(answered, Err(AckError::WriterStopped)),
            "{answered:?}"
        );
        // A pool connection goes back to the pool on a task: dropped inside the runtime.
        runtime.block_on(async move { drop(held) });
        let next = runtime.block_on(insert("evt_next"));
        assert!(next.unwrap(), "the next delivery is stored");
        assert_eq!(runtime.block_on(stored(&pool, "evt_behind")), 0);
        runtime.block_on(pool.close());
        let _ = std::fs::remove_dir_all(dir);
    }
}
