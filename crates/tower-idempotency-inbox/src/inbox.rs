//! [`Inbox`]: one inbox table on one database pool.

use std::{
    fmt,
    sync::{Arc, RwLock},
    time::Duration,
};

use tokio::sync::mpsc;
use tower_idempotency_sqlx::{validate_table_name, ConfigError};

use crate::{
    acks::{AckSettings, Acks},
    backend::{InboxDatabase, Sql},
    event::EventKey,
    ordering::Ordering,
};

/// The table name [`Inbox::new`] is usually given.
pub const DEFAULT_TABLE: &str = "webhook_inbox";

/// Why an inbox call failed. Messages never carry an event's body, headers or a secret.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// The table name was refused before any SQL ran.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The database failed or could not be reached.
    #[error("the inbox database failed")]
    Database(#[source] sqlx::Error),
    /// A listing's cursor is not one the inbox made.
    #[error("the cursor is not one the inbox made")]
    InvalidCursor,
    /// A pause's scope is empty or too long ([`Inbox::pause`]).
    #[error(transparent)]
    InvalidScope(#[from] tower_idempotency_jobs::pauses::ScopeError),
}

/// A failure of an admin route or the page: logged here, answered as a `503` without its
/// details.
impl From<InboxError> for tower_idempotency_jobs::Unavailable {
    fn from(error: InboxError) -> Self {
        tracing::warn!(%error, "inbox admin call failed");
        Self
    }
}

impl From<sqlx::Error> for InboxError {
    fn from(error: sqlx::Error) -> Self {
        Self::Database(error)
    }
}

/// A durable inbox: one table on a sqlx pool of Postgres or SQLite. Cheap to clone; clones
/// share the table and the running worker's queue.
///
/// On SQLite, open the pool in WAL mode with a busy timeout
/// (`SqliteConnectOptions::journal_mode(Wal).busy_timeout(..)`): acknowledgements and the
/// handlers' transactions wait for the database's single write lock instead of failing.
#[derive_where::derive_where(Clone)]
pub struct Inbox<DB: InboxDatabase> {
    pub(crate) pool: sqlx::Pool<DB>,
    pub(crate) sql: Arc<Sql>,
    table: Arc<str>,
    /// How events of one object are ordered, when they are.
    pub(crate) ordering: Option<Ordering>,
    /// The acknowledgements' writer, which commits deliveries that arrive together at once.
    pub(crate) acks: Arc<Acks>,
    /// The running worker's queue, fed at acknowledgement; `None` without a worker.
    queue: Arc<RwLock<Option<mpsc::Sender<EventKey>>>>,
}

impl<DB: InboxDatabase> fmt::Debug for Inbox<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        tower_idempotency_jobs::debug_handle(f, "Inbox", DB::NAME, &self.table)
    }
}

impl<DB: InboxDatabase> Inbox<DB> {
    /// An inbox in `table` (a plain SQL identifier, see
    /// [`validate_table_name`]) on `pool`. Nothing runs until [`migrate`](Self::migrate) or
    /// the first call.
    pub fn new(pool: sqlx::Pool<DB>, table: &str) -> Result<Self, InboxError> {
        validate_table_name(table)?;
        Ok(Self {
            pool,
            sql: Arc::new(<DB as crate::backend::sealed::InboxSql>::statements(table)),
            table: table.into(),
            ordering: None,
            acks: Arc::new(Acks::new(AckSettings::default())),
            queue: Arc::default(),
        })
    }

    /// Bounds how many deliveries one acknowledgement commit takes (default
    /// [`MAX_ACK_BATCH`](crate::MAX_ACK_BATCH); `1` commits each on its own, concurrently on the
    /// pool). Deliveries that arrive while a commit is in flight are inserted together by the
    /// next one, and each is answered once its row is committed.
    pub fn max_ack_batch(mut self, max: usize) -> Self {
        self.acks = Arc::new(Acks::new(AckSettings {
            max_batch: max,
            ..self.acks.settings()
        }));
        self
    }

    /// Bounds how many acknowledgement commits run at once (default 1: the deliveries that arrive
    /// meanwhile go into the next, larger batch, which costs the database the fewest commits).
    /// More suit a Postgres whose commits wait on a remote round trip or a slow disk rather than
    /// its CPU, and keep acknowledgements flowing past a commit that waits on a lock. A delivery
    /// that arrives while every one is in flight is inserted by the first to finish, with the
    /// others queued beside it. SQLite commits one at a time whatever this says.
    pub fn ack_commits_in_flight(mut self, commits: usize) -> Self {
        self.acks = Arc::new(Acks::new(AckSettings {
            in_flight: commits,
            ..self.acks.settings()
        }));
        self
    }

    /// How long an acknowledgement may take (default
    /// [`DEFAULT_ACK_DEADLINE`](crate::DEFAULT_ACK_DEADLINE), 10 s, at least 1 ms): a delivery
    /// whose row is not committed by then is answered `503` with `Retry-After`, so a locked or
    /// unreachable database never holds a provider past its own timeout. Keep it below the
    /// shortest delivery timeout of your providers. A row that commits after its caller was
    /// answered is stored once, and the provider's retry is its duplicate.
    pub fn ack_deadline(mut self, deadline: Duration) -> Self {
        self.acks = Arc::new(Acks::new(AckSettings {
            deadline,
            ..self.acks.settings()
        }));
        self
    }

    /// How many deliveries may wait for their commit at once (default
    /// [`DEFAULT_MAX_WAITING_ACKS`](crate::DEFAULT_MAX_WAITING_ACKS), at least 1): a delivery
    /// that finds them all waiting is answered `503` with `Retry-After` at once, so a slow
    /// database holds at most this many bodies in memory.
    pub fn max_waiting_acks(mut self, max: usize) -> Self {
        self.acks = Arc::new(Acks::new(AckSettings {
            max_waiting: max,
            ..self.acks.settings()
        }));
        self
    }

    /// How many deliveries wait for a commit now, behind the batches in flight (see
    /// [`max_waiting_acks`](Self::max_waiting_acks)).
    pub fn acks_waiting(&self) -> usize {
        self.acks.waiting()
    }

    /// Orders the events of one object (see [`Ordering`]): their positions are stored at
    /// acknowledgement, and the worker applies the policy. Set it on the inbox that
    /// acknowledges and on the one whose worker runs (the same value on every instance).
    pub fn ordering(mut self, ordering: Ordering) -> Self {
        self.ordering = Some(ordering);
        self
    }

    /// Creates the table and its indexes when missing; safe to call at every start, from
    /// several instances at once.
    pub async fn migrate(&self) -> Result<(), InboxError> {
        DB::run_script(&self.pool, &self.sql.schema).await?;
        Ok(())
    }

    /// The DDL [`migrate`](Self::migrate) runs, for teams that run their own migrations.
    pub fn schema_sql(&self) -> &str {
        &self.sql.schema
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The pool.
    pub fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    /// How many statements this inbox (and its clones, acknowledgements and workers) sent to
    /// the database, `migrate` aside: one per acknowledged delivery on SQLite, one per batch of
    /// deliveries acknowledged together on Postgres (see [`MAX_ACK_BATCH`](crate::MAX_ACK_BATCH)).
    pub fn statements_executed(&self) -> u64 {
        self.sql.executed()
    }

    /// Hands `key` to the running worker's queue. A full queue (or no worker) drops the hint:
    /// the event is in the table, and a sweeper finds it.
    pub(crate) fn notify(&self, key: EventKey) {
        let queue = self
            .queue
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(queue) = queue.as_ref() {
            if queue.try_send(key).is_err() {
                tracing::debug!("inbox queue full; the sweeper picks the event up");
            }
        }
    }

    /// Acknowledgements feed `sender` from now on (the most recently spawned worker).
    pub(crate) fn attach_queue(&self, sender: mpsc::Sender<EventKey>) {
        *self
            .queue
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(sender);
    }

    /// Stops feeding `sender`, unless a later worker's queue replaced it.
    pub(crate) fn detach_queue(&self, sender: &mpsc::Sender<EventKey>) {
        let mut queue = self
            .queue
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if queue
            .as_ref()
            .is_some_and(|current| current.same_channel(sender))
        {
            *queue = None;
        }
    }
}
