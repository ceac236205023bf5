//! The SQLite store's writer: one connection, on a thread of its own, that runs every write of
//! the store, and runs the writes that queued up while it was busy in one transaction (group
//! commit).
//!
//! It runs them between `BEGIN IMMEDIATE` and `COMMIT` (a write that waits alone runs as an
//! autocommit) and answers each caller after the commit, so a caller hears of its write only
//! once it is as durable as the pool's `synchronous` setting makes an autocommit. Why the store
//! writes this way: docs/stores.md, "SQLite"; what it saves: `scripts/statement-ceilings.py
//! sqlite` in SQLite itself, and the load harness's `sqlite` new keys against
//! `sqlite-floor-write` over HTTP.
//!
//! Failures stay each caller's own: a statement that fails fails its caller, and SQLite undoes
//! that statement alone, so the transaction goes on with the others. Where SQLite rolled the
//! whole transaction back (a full disk, an I/O error), or `COMMIT` failed, none of the batch's
//! writes happened, and every caller of the batch gets the error. A caller that gave up (its
//! future dropped) before its write ran is skipped, unless the write is a completion: that one
//! is fenced by its token and always run.
//!
//! Where SQLite's write lock is held elsewhere for longer than the busy timeout (a
//! transactional handler's `BEGIN IMMEDIATE` on the same database, another process), a batch
//! that holds a completion does not fail: it keeps its place at the head of the queue and tries
//! again until the lock is free (for at most the completion's TTL). No claim queued behind it
//! can run first, so a plain request whose completion waited longer than its lease is not taken
//! over and run again by its retry. The connection copies the pool's busy
//! timeout and `synchronous` setting; it is opened on the first write and closed when the
//! store is dropped. Only a pool on a plain read-write file gets a writer; any other (in
//! memory, read-only, behind a VFS) writes on the store's writer lane.
//!
//! The queue is bounded ([`SqlStore::with_write_queue`](crate::SqlStore::with_write_queue)): a
//! write is admitted while fewer than the bound's writes, holding fewer than its bytes, are
//! accepted and unanswered (queued or in the running batch); past it the write is refused at
//! once with `StoreError::Unavailable` ([`WriterBusy`]), so that memory does not grow with the
//! arrival rate while SQLite's write lock is held elsewhere.

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc, Arc, Mutex,
    },
    time::{Duration, Instant},
};

use rusqlite::{Connection, OpenFlags, OptionalExtension};
use sqlx::SqlitePool;
use tokio::sync::oneshot;
use tower_idempotency_core::StoreError;

use super::statements::{self, decode_rusqlite, Value};
use crate::store::{
    backend::{Done, Pick, Returns, Statements, Write},
    error,
    record::Params,
};

/// The most writes one transaction takes: a batch holds SQLite's write lock, and other
/// processes on the file wait for it, for as long as its statements run.
const MOST_PER_TRANSACTION: usize = 64;

/// A store's writer thread, started on its first write.
pub(crate) struct SqliteWriter {
    pool: SqlitePool,
    path: PathBuf,
    table: String,
    /// The thread's queue; `None` until the first write, and again after the thread ended.
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    /// The bounds of the writes accepted and not yet answered.
    admission: Arc<Admission>,
}

/// Why a write was refused before it was queued: the writer is that far behind (SQLite's write
/// lock is held elsewhere, or writes arrive faster than they commit).
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriterBusy {
    /// As many writes as the queue takes are waiting.
    #[error("the SQLite writer's queue is full ({limit} writes waiting)")]
    Jobs {
        /// The most writes the queue takes.
        limit: usize,
    },
    /// The waiting writes hold as many bytes as the queue takes.
    #[error("the SQLite writer's queue is full ({limit} bytes waiting)")]
    Bytes {
        /// The most bytes the queue takes.
        limit: usize,
    },
}

/// Counts the writes (and their bytes) accepted and not yet answered, within bounds.
#[derive(Debug)]
struct Admission {
    max_jobs: usize,
    max_bytes: usize,
    jobs: AtomicUsize,
    bytes: AtomicUsize,
}

impl Admission {
    fn new(max_jobs: usize, max_bytes: usize) -> Self {
        Self {
            max_jobs,
            max_bytes,
            jobs: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
        }
    }

    /// A place in the queue for a write of `bytes`, held until the returned value is dropped.
    /// A write larger than the byte bound is admitted into an empty queue, so that it can run.
    fn admit(self: &Arc<Self>, bytes: usize) -> Result<Admitted, WriterBusy> {
        let jobs = self.jobs.fetch_add(1, Ordering::AcqRel);
        if jobs >= self.max_jobs {
            self.jobs.fetch_sub(1, Ordering::AcqRel);
            return Err(WriterBusy::Jobs {
                limit: self.max_jobs,
            });
        }
        let before = self.bytes.fetch_add(bytes, Ordering::AcqRel);
        if before > 0 && before.saturating_add(bytes) > self.max_bytes {
            self.bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.jobs.fetch_sub(1, Ordering::AcqRel);
            return Err(WriterBusy::Bytes {
                limit: self.max_bytes,
            });
        }
        Ok(Admitted {
            admission: self.clone(),
            bytes,
        })
    }
}

/// A write's place in the queue, given back when the write is dropped (answered or skipped).
#[derive(Debug)]
struct Admitted {
    admission: Arc<Admission>,
    bytes: usize,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.admission.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        self.admission.jobs.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for SqliteWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteWriter")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// One caller's write, owned so that it can cross to the thread.
struct Job {
    pick: Pick,
    values: Vec<Value<'static>>,
    now_ms: i64,
    returns: Returns,
    /// For the error of a write that was too large: its record's size and the store's limit.
    size: Option<usize>,
    limit: usize,
    reply: oneshot::Sender<Result<Done, StoreError>>,
    /// Its place in the queue, given back when the job is dropped.
    _admitted: Option<Admitted>,
    /// For a completion: how long it keeps waiting for SQLite's write lock (its record's TTL).
    /// A completion is also run when its caller gave up: it is fenced by its token, and
    /// landing it is what keeps the key from being run again.
    patience: Option<Duration>,
}

impl SqliteWriter {
    /// A writer for `table` in the file `pool` opens, or `None` where the pool's database is not
    /// a plain file opened for writing. Starts nothing yet.
    pub(crate) fn for_pool(pool: &SqlitePool, table: &str) -> Option<Self> {
        let options = pool.connect_options();
        let parameters = super::url_parameters(&options)?;
        let writable_file = parameters.iter().all(|(name, value)| match name.as_str() {
            "mode" => value == "rw" || value == "rwc",
            "vfs" | "immutable" => false,
            _ => true,
        });
        writable_file.then(|| Self {
            pool: pool.clone(),
            path: options.get_filename().to_path_buf(),
            table: table.to_owned(),
            queue: Mutex::new(None),
            admission: Arc::new(Admission::new(
                crate::DEFAULT_WRITE_QUEUE_JOBS,
                crate::DEFAULT_WRITE_QUEUE_BYTES,
            )),
        })
    }

    /// Sets the bounds of the queue.
    pub(crate) fn bound(&mut self, jobs: usize, bytes: usize) {
        self.admission = Arc::new(Admission::new(jobs, bytes));
    }

    /// Runs `write`, dated `now_ms`, once the writes queued before it ran.
    pub(crate) async fn run(&self, now_ms: i64, write: Write<'_>) -> Result<Done, StoreError> {
        let queue = self.queue().await?;
        let (reply, answer) = oneshot::channel();
        let mut job = Job::new(now_ms, write, reply);
        let admitted = self
            .admission
            .admit(job.bytes())
            .map_err(|busy| StoreError::Unavailable(Box::new(busy)))?;
        job._admitted = Some(admitted);
        if let Err(mpsc::SendError(_)) = queue.send(job) {
            // The thread has ended; the next write starts another.
            *self.lock() = None;
            return Err(unavailable(sqlx::Error::WorkerCrashed));
        }
        answer
            .await
            .map_err(|_| unavailable(sqlx::Error::WorkerCrashed))?
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<mpsc::Sender<Job>>> {
        // The slot holds a sender or nothing, valid at every step, so a poisoned lock is usable.
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The thread's queue, starting the thread if none runs.
    async fn queue(&self) -> Result<mpsc::Sender<Job>, StoreError> {
        if let Some(queue) = self.lock().as_ref() {
            return Ok(queue.clone());
        }
        let connection = self.open().await?;
        let statements = statements::statements(&self.table);
        let (queue, jobs) = mpsc::channel();
        std::thread::Builder::new()
            .name("tower-idempotency-sqlite-writer".into())
            .spawn(move || serve(&connection, &statements, &jobs))
            .map_err(|e| StoreError::Unavailable(Box::new(e)))?;
        // Two first writes may both start a thread: the one stored first serves, and the other
        // ends as its queue is dropped here.
        Ok(self.lock().get_or_insert(queue).clone())
    }

    /// The writer's connection, with the pool's busy timeout and `synchronous` setting, which
    /// are per connection (the journal mode is the file's).
    async fn open(&self) -> Result<Connection, StoreError> {
        let (synchronous, busy_timeout_ms) = {
            let mut pooled = self.pool.acquire().await.map_err(unavailable)?;
            let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(&mut *pooled)
                .await
                .map_err(unavailable)?;
            let busy_timeout_ms: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
                .fetch_one(&mut *pooled)
                .await
                .map_err(unavailable)?;
            (synchronous, busy_timeout_ms)
        };
        let open = || -> rusqlite::Result<Connection> {
            // Not SQLITE_OPEN_CREATE: the pool has created the file.
            let connection = Connection::open_with_flags(
                &self.path,
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?;
            connection.busy_timeout(Duration::from_millis(busy_timeout_ms.max(0) as u64))?;
            connection.pragma_update(None, "synchronous", synchronous)?;
            Ok(connection)
        };
        open().map_err(|e| map_rusqlite(&e, None, 0))
    }
}

impl rusqlite::ToSql for Value<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(match self {
            Value::Int(value) => ToSqlOutput::from(*value),
            Value::Text(value) => ToSqlOutput::Borrowed(ValueRef::Text(value.as_bytes())),
            Value::Blob(value) => ToSqlOutput::Borrowed(ValueRef::Blob(value)),
        })
    }
}

fn unavailable(error: sqlx::Error) -> StoreError {
    StoreError::Unavailable(Box::new(error))
}

impl Job {
    fn new(
        now_ms: i64,
        write: Write<'_>,
        reply: oneshot::Sender<Result<Done, StoreError>>,
    ) -> Self {
        let Write {
            pick,
            params,
            returns,
            size,
            limit,
        } = write;
        let patience = match &params {
            Params::Complete(complete) => {
                Some(Duration::from_millis(complete.ttl_ms.max(0) as u64))
            }
            _ => None,
        };
        Self {
            patience,
            pick,
            values: statements::owned_values(now_ms, params),
            now_ms,
            returns,
            size,
            limit,
            reply,
            _admitted: None,
        }
    }

    /// What the job holds in memory: its values' bytes and the job itself.
    fn bytes(&self) -> usize {
        let values: usize = self
            .values
            .iter()
            .map(|value| match value {
                Value::Int(_) => 0,
                Value::Text(text) => text.len(),
                Value::Blob(blob) => blob.len(),
            })
            .sum();
        values + std::mem::size_of::<Self>() + self.values.len() * std::mem::size_of::<Value>()
    }

    fn run(&self, connection: &Connection, statements: &Statements) -> rusqlite::Result<Done> {
        if self.reply.is_closed() && self.patience.is_none() {
            // The caller gave up: nobody reads this answer, and the write is not made.
            return Ok(Done::Changed(0));
        }
        let mut statement = connection.prepare_cached(statements.text(self.pick).as_str())?;
        let values = rusqlite::params_from_iter(&self.values);
        match self.returns {
            Returns::Changes => statement
                .execute(values)
                .map(|rows| Done::Changed(rows as u64)),
            Returns::Row => statement
                .query_row(values, |row| decode_rusqlite(row, self.now_ms))
                .optional()
                .map(Done::Row),
        }
    }

    fn error(&self, error: &rusqlite::Error) -> StoreError {
        map_rusqlite(error, self.size, self.limit)
    }
}

/// [`error::map_code`] for the errors of rusqlite.
fn map_rusqlite(error: &rusqlite::Error, size: Option<usize>, limit: usize) -> StoreError {
    match error {
        rusqlite::Error::SqliteFailure(failure, message) => {
            let message = message.as_deref().unwrap_or("SQLite error");
            error::map_code(&failure.extended_code.to_string(), message, size, limit)
        }
        // Errors of binding or reading values, without a code (a `Backend` error); their text
        // names columns and types, no values.
        other => error::map_code("", &other.to_string(), size, limit),
    }
}

/// The thread: takes the writes that wait, runs them, answers them, until the store is dropped
/// (its queue closes) or the connection is left inside a transaction it could not end.
fn serve(connection: &Connection, statements: &Statements, jobs: &mpsc::Receiver<Job>) {
    let mut batch = Vec::with_capacity(MOST_PER_TRANSACTION);
    while let Ok(first) = jobs.recv() {
        batch.push(first);
        while batch.len() < MOST_PER_TRANSACTION {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let started = Instant::now();
        let patience = batch.iter().filter_map(|job| job.patience).max();
        let results = loop {
            let (results, locked) = run_batch(connection, statements, &batch);
            // SQLite's write lock is held elsewhere (a transactional handler's `BEGIN
            // IMMEDIATE`, another process) for longer than the busy timeout: a batch with a
            // completion keeps its place and tries again, so that no later claim can take the
            // key over before the result lands.
            match patience {
                Some(patience) if locked && started.elapsed() < patience => {
                    std::thread::sleep(LOCK_RETRY);
                }
                _ => break results,
            }
        };
        for (mut job, result) in batch.drain(..).zip(results) {
            // Its place in the queue is free before its caller hears back.
            drop(job._admitted.take());
            let _ = job.reply.send(result);
        }
        if !connection.is_autocommit() {
            tracing::warn!("the SQLite writer could not end a transaction; reopening it");
            return;
        }
    }
}

/// The pause between two attempts of a batch that waits for the write lock, on top of the busy
/// timeout each attempt waits in SQLite.
const LOCK_RETRY: Duration = Duration::from_millis(10);

/// Whether SQLite answered that another connection holds the lock (after the busy timeout).
fn locked(error: &rusqlite::Error) -> bool {
    matches!(
        error,
        rusqlite::Error::SqliteFailure(failure, _)
            if matches!(
                failure.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            )
    )
}

/// Runs `batch`: alone as an autocommit, or together in one transaction. Also answers whether
/// nothing ran because the write lock was held elsewhere.
fn run_batch(
    connection: &Connection,
    statements: &Statements,
    batch: &[Job],
) -> (Vec<Result<Done, StoreError>>, bool) {
    if let [job] = batch {
        return match job.run(connection, statements) {
            Ok(done) => (vec![Ok(done)], false),
            Err(error) => (vec![Err(job.error(&error))], locked(&error)),
        };
    }
    let fail_all = |error: &rusqlite::Error| {
        let results = batch.iter().map(|job| Err(job.error(error))).collect();
        (results, false)
    };
    if let Err(error) = connection.execute_batch("BEGIN IMMEDIATE") {
        let results = batch.iter().map(|job| Err(job.error(&error))).collect();
        return (results, locked(&error));
    }
    let mut results = Vec::with_capacity(batch.len());
    for job in batch {
        let result = job.run(connection, statements);
        if let Err(error) = &result {
            if connection.is_autocommit() {
                // SQLite rolled the transaction back: the batch's earlier writes are gone too.
                return fail_all(error);
            }
        }
        results.push(result);
    }
    if let Err(error) = connection.execute_batch("COMMIT") {
        let _ = connection.execute_batch("ROLLBACK");
        return fail_all(&error);
    }
    let results = results
        .into_iter()
        .zip(batch)
        .map(|(result, job)| result.map_err(|e| job.error(&e)))
        .collect();
    (results, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_bounds_jobs_and_bytes_and_frees_on_drop() {
        let admission = Arc::new(Admission::new(2, 100));
        let first = admission.admit(60).expect("room");
        assert!(matches!(
            admission.admit(50),
            Err(WriterBusy::Bytes { limit: 100 })
        ));
        let second = admission.admit(40).expect("room");
        assert!(matches!(
            admission.admit(0),
            Err(WriterBusy::Jobs { limit: 2 })
        ));
        drop(first);
        let third = admission.admit(60).expect("room again");
        drop((second, third));
        assert_eq!(admission.jobs.load(Ordering::Acquire), 0);
        assert_eq!(admission.bytes.load(Ordering::Acquire), 0);
        // A write larger than the byte bound runs when nothing else waits.
        let large = admission.admit(1000).expect("an empty queue admits it");
        assert!(matches!(
            admission.admit(1),
            Err(WriterBusy::Bytes { limit: 100 })
        ));
        drop(large);
    }
}
