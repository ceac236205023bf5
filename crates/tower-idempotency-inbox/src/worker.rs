//! The worker pool: a bounded queue fed at acknowledgement, a sweeper for whatever the queue
//! missed, one task per attempt, and the drain.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    fmt,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures_util::future::join_all;
use tokio::{
    sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore},
    task::JoinSet,
};
use tower_idempotency_jobs::{
    gate, guarded, keep_lease, persist, Cut, Dispatcher, Settings, Source, WorkerHandle,
    DEFAULT_POLL_EVERY,
};
use tower_idempotency_sqlx::TxHandle;
use tracing::Instrument;

use crate::{
    backend::{self, ClaimedRow},
    event::{duration_ms, from_unix_ms, now_ms, EventKey, InboxEvent},
    handler::{error_text, panic_text, Permanent},
    ops,
    ordering::OrderingPolicy,
    retention::Retention,
    Inbox, InboxDatabase, InboxHandler,
};
use tower_idempotency_jobs::{pauses, Attempt, AttemptOutcome};

/// Attempts before an event is marked failed, unless configured otherwise.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
/// How long a claim lasts without renewal, unless configured otherwise: the worker renews the
/// claim of every running attempt every third of it, so this is how long a crashed instance's
/// events wait before another attempt.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// How long an attempt may run before it is cancelled (rolled back and counted as a failed
/// attempt), unless configured otherwise.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_QUEUE_CAPACITY: usize = 1024;
/// Events the worker holds claimed per handler ([`WorkerBuilder::concurrency`]). While every
/// handler runs, a backlog's next events are claimed in batches (the engine's [`Dispatcher`]
/// gathers a quarter of its permits per claim) and wait for a free handler with their claims
/// renewed, so that a handler that ends starts the next event at once rather than after a claim
/// of its own.
const CLAIMED_PER_HANDLER: usize = 2;

/// Due events one sweep takes from the table.
const SWEEP_BATCH: usize = 256;

/// Configures and starts an [`InboxWorker`]; from [`Inbox::worker`].
pub struct WorkerBuilder<DB: InboxDatabase> {
    inbox: Inbox<DB>,
    handler: Arc<dyn InboxHandler<DB>>,
    /// The job engine's settings, the relay's names: `poll_every` is the sweep's interval.
    settings: Settings,
    queue_capacity: usize,
    retention: Retention,
}

impl<DB: InboxDatabase> fmt::Debug for WorkerBuilder<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("inbox", &self.inbox)
            .field("settings", &self.settings)
            .field("queue_capacity", &self.queue_capacity)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

impl<DB: InboxDatabase> Inbox<DB> {
    /// A worker that processes this inbox's events with `handler`; configure it, then
    /// [`spawn`](WorkerBuilder::spawn) it.
    pub fn worker(&self, handler: impl InboxHandler<DB>) -> WorkerBuilder<DB> {
        let mut settings = Settings::new(<DB as InboxDatabase>::DEFAULT_CONCURRENCY);
        settings.max_attempts = DEFAULT_MAX_ATTEMPTS;
        settings.lease = DEFAULT_LEASE;
        settings.attempt_timeout = DEFAULT_ATTEMPT_TIMEOUT;
        settings.poll_every = DEFAULT_POLL_EVERY;
        settings.keep_leases = true;
        WorkerBuilder {
            inbox: self.clone(),
            handler: Arc::new(handler),
            settings,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            retention: Retention::default(),
        }
    }
}

impl<DB: InboxDatabase> WorkerBuilder<DB> {
    tower_idempotency_jobs::settings_setters! {
        /// Attempts before an event is failed (default [`DEFAULT_MAX_ATTEMPTS`], at least 1).
        max_attempts;
        /// When a failed attempt is retried (default: 1 s doubling up to 1 h, with jitter). The
        /// sweeper starts the retry, so it comes up to one sweep interval after the delay.
        backoff;
        /// How long a claim lasts without renewal (default [`DEFAULT_LEASE`]). The worker renews
        /// the claim of every running attempt every third of the lease, so a handler slower than
        /// the lease still runs once; after a crash the event waits for its lease to end before
        /// another attempt. Keep the pool larger than the concurrency: each renewal borrows a
        /// connection for one statement.
        lease;
        /// How long one attempt may run (default [`DEFAULT_ATTEMPT_TIMEOUT`]): a handler still
        /// running then is cancelled, its transaction rolled back, and the attempt counted as
        /// failed (retried after the backoff, or failed after the last), freeing its permit.
        attempt_timeout;
        /// How often the sweeper looks for due events the queue does not hold (default
        /// [`DEFAULT_POLL_EVERY`], 1 s; the relay's name for its poll). A due sweep runs before the
        /// next event is handed out however busy the queue is, and the swept events are taken in
        /// turn with the queued ones.
        poll_every;
        /// Handlers running at once (default [`InboxDatabase::DEFAULT_CONCURRENCY`]: 16 on Postgres,
        /// 4 on SQLite; at least 1). Each holds one pool connection. The worker holds up to twice
        /// this many events claimed: the keys at hand are claimed in one statement, a backlog's
        /// in batches while the handlers run, and an event claimed ahead waits for a free
        /// handler with its claim renewed. Give the pool
        /// about twice this many connections, so acknowledgements, claims and lease renewals find
        /// one while every handler runs (docs/inbox.md, "Throughput").
        concurrency;
        /// Attempts an event's history keeps after its first (default
        /// [`DEFAULT_HISTORY`](tower_idempotency_jobs::DEFAULT_HISTORY); 0: none is written):
        /// each attempt's start, duration, outcome and error ([`Inbox::attempts`]).
        history;
    }

    /// Events the in-process queue holds (default 1024, at least 1). A delivery acknowledged
    /// while it is full waits in the table for the sweeper.
    pub fn queue_capacity(mut self, n: usize) -> Self {
        self.queue_capacity = n.max(1);
        self
    }

    /// The former name of [`poll_every`](Self::poll_every).
    #[deprecated(note = "renamed poll_every, the relay's name for the setting")]
    pub fn sweep_every(self, every: Duration) -> Self {
        self.poll_every(every)
    }

    /// The worker's settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// How long processed events are kept (default [`DEFAULT_RETENTION`](crate::DEFAULT_RETENTION),
    /// a week): the worker deletes them once they were processed longer ago than this, in
    /// batches of [`purge_batch`](Self::purge_batch) every [`purge_every`](Self::purge_every).
    /// An event whose delivery carried an authenticator (GitHub, Shopify, Linear, Mailgun) is
    /// kept until its provider's retry horizon has passed too, so a captured delivery re-sent
    /// under a new id is still refused. Below the providers' retry schedule, a provider's late
    /// retry of a purged event is stored and processed again. `Duration::MAX` keeps them all.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention.after = retention;
        self
    }

    /// Events one purge statement deletes at most (default
    /// [`DEFAULT_PURGE_BATCH`](crate::DEFAULT_PURGE_BATCH), at least 1). A purge runs batch
    /// after batch until one is not full; between two, acknowledgements and claims take their
    /// turn (on SQLite, the write lock).
    pub fn purge_batch(mut self, n: u32) -> Self {
        self.retention.batch = n.max(1);
        self
    }

    /// How often the worker purges (default [`DEFAULT_PURGE_EVERY`](crate::DEFAULT_PURGE_EVERY),
    /// a minute; between 1 ms and a year), once at its start and then at this interval.
    pub fn purge_every(mut self, every: Duration) -> Self {
        const YEAR: Duration = Duration::from_secs(365 * 24 * 60 * 60);
        self.retention.every = every.clamp(Duration::from_millis(1), YEAR);
        self
    }

    /// Starts the worker on the current Tokio runtime. From now on the inbox's
    /// acknowledgements feed its queue.
    pub fn spawn(self) -> InboxWorker {
        let (sender, receiver) = mpsc::channel(self.queue_capacity);
        self.inbox.attach_queue(sender.clone());
        let (stop, stopped) = oneshot::channel();
        let shared = Arc::new(Shared {
            inbox: self.inbox,
            handler: self.handler,
            handlers: Arc::new(Semaphore::new(self.settings.concurrency.max(1))),
            stopping: watch::channel(false).0,
            settings: self.settings,
            running: Arc::default(),
        });
        let purging = tokio::spawn(self.retention.run(shared.inbox.clone()));
        let feed = Feed {
            shared,
            sender,
            lagging: HashSet::new(),
            kept: None,
        };
        let settings = &self.settings;
        let claimed = CLAIMED_PER_HANDLER * settings.concurrency.max(1);
        let dispatcher = Dispatcher::new(feed, receiver, claimed, settings.poll_every);
        let task = tokio::spawn(async move {
            let finished = dispatcher.run(stopped).await;
            purging.abort();
            finished
        });
        WorkerHandle::new(stop, task)
    }
}

/// A running worker: the job engine's [`WorkerHandle`], the relay's handle too.
/// [`drain`](WorkerHandle::drain) it on shutdown; dropping it stops it at once, aborting
/// running handlers (their transactions roll back and their events are attempted again after
/// their lease).
pub type InboxWorker = WorkerHandle;

/// What every attempt needs.
struct Shared<DB: InboxDatabase> {
    inbox: Inbox<DB>,
    handler: Arc<dyn InboxHandler<DB>>,
    settings: Settings,
    /// The events this worker is attempting. A running attempt renews its claim, but on SQLite
    /// a renewal (a write) waits while any handler's transaction holds the write lock, so a
    /// claim may lapse while its attempt waits for that lock or runs; the sweeper then finds the
    /// event due again. This set keeps the worker from claiming an event it is already running.
    running: Arc<Mutex<HashSet<EventKey>>>,
    /// One permit per handler ([`Settings::concurrency`]): an event claimed ahead waits for
    /// one ([`CLAIMED_PER_HANDLER`]).
    handlers: Arc<Semaphore>,
    /// Set when the worker stops taking events: an event claimed ahead that has not started
    /// gives its claim back.
    stopping: watch::Sender<bool>,
}

impl<DB: InboxDatabase> Shared<DB> {
    /// Waits for a free handler for the claimed event `key`, renewing its claim meanwhile.
    /// `None` once the worker stops taking events first: the claim is then given back (its
    /// attempt returned, the event due at once) for the next worker.
    async fn handler_free(&self, key: &EventKey, token: i64) -> Option<OwnedSemaphorePermit> {
        let mut stopping = self.stopping.subscribe();
        if !*stopping.borrow_and_update() {
            if let Ok(free) = self.handlers.clone().try_acquire_owned() {
                return Some(free);
            }
            tokio::select! {
                free = self.handlers.clone().acquire_owned() => {
                    return Some(free.expect("never closed"));
                }
                never = self.keep_lease(key, token) => match never {},
                _ = stopping.wait_for(|stopping| *stopping) => {}
            }
        }
        let (pool, sql) = (&self.inbox.pool, &self.inbox.sql);
        let give_back = || backend::give_back(pool, sql, key, token);
        if let Err(error) = persist(self.settings.lease / 3, give_back).await {
            tracing::warn!(%error, "giving back an inbox event claimed ahead failed; it is due again when its lease ends");
        }
        None
    }

    fn max_attempts(&self) -> i32 {
        self.settings.max()
    }

    /// Marks `key` running in this worker until the guard drops; `None` when it already is.
    fn start(&self, key: &EventKey) -> Option<Running> {
        let mut running = self.running.lock().expect("never poisoned");
        running.insert(key.clone()).then(|| Running {
            running: self.running.clone(),
            key: key.clone(),
        })
    }
}

/// An event marked running in its worker ([`Shared::start`]); unmarked on drop.
struct Running {
    running: Arc<Mutex<HashSet<EventKey>>>,
    key: EventKey,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(mut running) = self.running.lock() {
            running.remove(&self.key);
        }
    }
}

/// The inbox's jobs for the engine's [`Dispatcher`]: the sweep (with the gauges and ordering),
/// and the claim and the attempts of a batch.
struct Feed<DB: InboxDatabase> {
    shared: Arc<Shared<DB>>,
    /// The queue's sender, to detach it from the inbox at the drain.
    sender: mpsc::Sender<EventKey>,
    /// The providers whose lag gauge is set ([`crate::metrics::refresh`]).
    lagging: HashSet<String>,
    /// When a sweep last refreshed the gauges and failed the spent events ([`Feed::keeping`]).
    kept: Option<Instant>,
}

impl<DB: InboxDatabase> Feed<DB> {
    /// Whether this sweep refreshes the gauges and fails the spent events: the first one, then
    /// one per poll interval. Each reads every open event, and a backlog is swept back to back,
    /// one sweep per [`SWEEP_BATCH`] events; a spent event is never claimed, so it only waits
    /// up to one interval longer to be failed.
    fn keeping(&mut self) -> bool {
        let due = self
            .kept
            .is_none_or(|kept| kept.elapsed() >= self.shared.settings.poll_every);
        if due {
            self.kept = Some(Instant::now());
        }
        due
    }
}

impl<DB: InboxDatabase> Source for Feed<DB> {
    type Key = EventKey;

    fn start(
        &self,
        batch: Vec<(EventKey, OwnedSemaphorePermit)>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        claim_and_run(self.shared.clone(), batch)
    }

    fn stopped(&mut self) {
        self.shared.inbox.detach_queue(&self.sender);
        self.shared.stopping.send_replace(true);
    }

    /// Fails the due events whose attempts are spent and refreshes the gauges (at most once
    /// per poll interval, [`Feed::keeping`]), then replaces `swept` with up to [`SWEEP_BATCH`]
    /// due events (one both queued and swept is claimed once, the second claim finds it
    /// taken). Answers whether the batch was full. The first sweep of a poll interval takes
    /// retries and recovered events first (fresh ones are usually queued already), which reads
    /// every due event; the sweeps between (a backlog's, back to back) take them by due time,
    /// reading only as many from the due index.
    async fn sweep(&mut self, swept: &mut VecDeque<EventKey>) -> bool {
        let keeping = self.keeping();
        let inbox = &self.shared.inbox;
        let max = self.shared.max_attempts();
        if keeping {
            crate::metrics::refresh(inbox, &mut self.lagging).await;
            match backend::exhaust(&inbox.pool, &inbox.sql, now_ms(), max).await {
                Ok(providers) => {
                    for provider in providers {
                        tracing::warn!(%provider, "an inbox event failed: its attempts were spent");
                        crate::metrics::attempt(&provider, "failed");
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "failing spent inbox events failed; retrying at the next sweep")
                }
            }
        }
        let limit = i64::try_from(SWEEP_BATCH).unwrap_or(i64::MAX);
        // The time after the exhaustion's write: an event whose retry fell due meanwhile is in
        // this sweep, not behind the events it finds.
        let now = now_ms();
        let due = if inbox.ordering.as_ref().map(|o| o.policy()) == Some(OrderingPolicy::Sequential)
        {
            DB::due_in_order(&inbox.pool, &inbox.sql, now, limit, max).await
        } else {
            backend::due(&inbox.pool, &inbox.sql, (now, limit, max), keeping).await
        };
        match due {
            Ok(keys) => {
                let full = keys.len() >= SWEEP_BATCH;
                *swept = keys.into();
                full
            }
            Err(error) => {
                tracing::warn!(%error, "inbox sweep failed; retrying at the next");
                false
            }
        }
    }
}

/// How an attempt ended.
enum Ended {
    Processed,
    /// Older than the newest processed event of its ordering key; marked skipped.
    Skipped,
    /// The lease was lost to another attempt before the commit; nothing was written.
    Stale,
}

/// Why an attempt failed.
struct Failure {
    text: String,
    /// The handler said not to retry.
    permanent: bool,
}

impl From<String> for Failure {
    fn from(text: String) -> Self {
        Self {
            text,
            permanent: false,
        }
    }
}

/// How one try of an attempt's transaction failed.
enum Tried {
    Failed(Failure),
    /// A lazily started transaction met a lock conflict: worth one more try at once, with the
    /// write lock taken at the start.
    Conflict(Failure),
}

impl Tried {
    fn failure(self) -> Failure {
        match self {
            Self::Failed(failure) | Self::Conflict(failure) => failure,
        }
    }
}

impl From<String> for Tried {
    fn from(text: String) -> Self {
        Self::Failed(Failure::from(text))
    }
}

impl From<Failure> for Tried {
    fn from(failure: Failure) -> Self {
        Self::Failed(failure)
    }
}

/// Whether `error` is SQLite's refusal to take the write lock (`SQLITE_BUSY`, `SQLITE_LOCKED`
/// and their extended codes, such as `SQLITE_BUSY_SNAPSHOT`): a read's snapshot that cannot
/// become a write after another connection wrote. Postgres codes have five characters and are
/// never read as SQLite's.
fn lock_conflict(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    db.code()
        .filter(|code| code.len() < 5)
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| matches!(code & 0xff, 5 | 6))
}

/// [`lock_conflict`] for a handler's error or any of its sources.
fn lock_conflict_in(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error
            .downcast_ref::<sqlx::Error>()
            .is_some_and(lock_conflict)
        {
            return true;
        }
        next = error.source();
    }
    false
}

/// Claims the keys of `batch` that are due, free and not running in this worker, in one
/// statement (one per key under [`OrderingPolicy::Sequential`]), and starts one attempt per
/// claimed event at once, each holding its permit; the other keys' permits are freed.
async fn claim_and_run<DB: InboxDatabase>(
    shared: Arc<Shared<DB>>,
    batch: Vec<(EventKey, OwnedSemaphorePermit)>,
) {
    let mut held: HashMap<EventKey, (Running, OwnedSemaphorePermit)> = batch
        .into_iter()
        .filter_map(|(key, permit)| Some((key.clone(), (shared.start(&key)?, permit))))
        .collect();
    if held.is_empty() {
        return;
    }
    let claimed = shared.claim(held.keys().cloned().collect()).await;
    let mut attempts = JoinSet::new();
    for (key, token, row) in claimed {
        if let Some((running, permit)) = held.remove(&key) {
            attempts.spawn(attempt(shared.clone(), key, token, row, (running, permit)));
        }
    }
    drop(held);
    while attempts.join_next().await.is_some() {}
}

/// Runs one attempt of the claimed event `key` once a handler is free, holding `_held` (its
/// running mark and claim permit) until it ends.
async fn attempt<DB: InboxDatabase>(
    shared: Arc<Shared<DB>>,
    key: EventKey,
    token: i64,
    row: ClaimedRow,
    _held: (Running, OwnedSemaphorePermit),
) {
    let inbox = &shared.inbox;
    let attempt = u32::try_from(row.attempts).unwrap_or(1);
    let span = tracing::info_span!(
        "inbox_attempt",
        provider = %key.provider,
        event_id = %key.event_id,
        event_type = %ops::event_type(&row.body).as_deref().unwrap_or(""),
        attempt,
    );
    let Some(_handler) = shared.handler_free(&key, token).await else {
        return;
    };
    if shared
        .parked(&key, token, ops::event_type(&row.body).as_deref())
        .instrument(span.clone())
        .await
    {
        return;
    }
    let started = Instant::now();
    let started_ms = now_ms();
    let event = InboxEvent {
        key: key.clone(),
        headers: serde_json::from_str(&row.headers).unwrap_or_default(),
        body: row.body.into(),
        received_at: from_unix_ms(row.received_at),
        attempt,
    };
    let ended = async {
        let (outcome, history) = match shared.run(event, token, started_ms).await {
            // Recorded inside the handler's transaction.
            Ok(Ended::Processed) => (Some("processed"), None),
            Ok(Ended::Skipped) => (Some("skipped"), Some((AttemptOutcome::Skipped, None))),
            Ok(Ended::Stale) => (Some("lease_lost"), None),
            Err(failure) => {
                let outcome = shared.failed(&key, token, attempt, &failure).await;
                let ended = match outcome {
                    Some("retry") => Some(AttemptOutcome::Retried),
                    Some("failed") => Some(AttemptOutcome::Failed),
                    _ => None,
                };
                (outcome, ended.map(|ended| (ended, Some(failure.text))))
            }
        };
        if let Some((ended, error)) = history {
            let recorded = Attempt::ended(attempt, started_ms, ended).error(error);
            let (pool, sql) = (&inbox.pool, &inbox.sql);
            shared
                .settings
                .record(pool, &sql.jobs, &backend::job_key(&key), &recorded)
                .await;
        }
        if inbox.ordering.is_some() {
            shared.hand_on(&key).await;
        }
        outcome
    };
    if let Some(outcome) = ended.instrument(span.clone()).await {
        let elapsed = started.elapsed();
        crate::metrics::attempt(&key.provider, outcome);
        crate::metrics::attempt_duration(&key.provider, outcome, elapsed);
        span.in_scope(|| {
            tracing::debug!(
                outcome,
                elapsed_ms = elapsed.as_millis(),
                "inbox attempt ended"
            )
        });
    }
}

impl<DB: InboxDatabase> Shared<DB> {
    /// Claims those of `keys` that are due and free for one lease; answers each claimed
    /// event's key, token and row. A claim that fails is logged and claims nothing: the events
    /// stay pending for the sweeper.
    async fn claim(&self, keys: Vec<EventKey>) -> Vec<(EventKey, i64, ClaimedRow)> {
        let (inbox, now, max) = (&self.inbox, now_ms(), self.max_attempts());
        let lease_until = now.saturating_add(duration_ms(self.settings.lease));
        let failed = |error: sqlx::Error| tracing::warn!(%error, "claiming inbox events failed; the sweeper retries them");
        if inbox.ordering.as_ref().map(|o| o.policy()) == Some(OrderingPolicy::Sequential) {
            let claims = keys.into_iter().map(|key| async move {
                let token = fastrand::i64(0..i64::MAX);
                let (pool, sql) = (&inbox.pool, &inbox.sql);
                let claim = || DB::claim_in_order(pool, sql, &key, now, token, lease_until, max);
                match persist(self.settings.lease / 3, claim).await {
                    Ok(row) => row.map(|row| (key, token, row)),
                    Err(error) => {
                        failed(error);
                        None
                    }
                }
            });
            return join_all(claims).await.into_iter().flatten().collect();
        }
        let token = fastrand::i64(0..i64::MAX);
        let claim = || {
            let times = (now, token, lease_until, max);
            backend::claim_many(&inbox.pool, &inbox.sql, &keys, times)
        };
        match persist(self.settings.lease / 3, claim).await {
            Ok(rows) => rows
                .into_iter()
                .map(|(key, row)| (key, token, row))
                .collect(),
            Err(error) => {
                failed(error);
                Vec::new()
            }
        }
    }

    /// Parks the claimed event `key` when its provider, or its provider's `event_type`, is
    /// paused ([`Inbox::pause`]); answers whether the attempt is not to run.
    async fn parked(&self, key: &EventKey, token: i64, event_type: Option<&str>) -> bool {
        let (pool, sql) = (&self.inbox.pool, &self.inbox.sql.jobs);
        let paused = pauses::paused(pool, sql).await;
        let typed = event_type.map(|kind| crate::admin::pause_scope(&key.provider, Some(kind)));
        let scopes = [Some(key.provider.as_str()), typed.as_deref()];
        let Some(scope) = pauses::paused_scope(&paused, scopes.into_iter().flatten()) else {
            return false;
        };
        let job = backend::job_key(key);
        match persist(self.settings.lease / 3, || {
            DB::park(pool, sql, &job, token, scope)
        })
        .await
        {
            Ok(parked) => {
                if parked {
                    tracing::debug!(scope, "a paused inbox event was parked");
                }
                parked
            }
            Err(error) => {
                // Not run while paused: claimed again after its lease.
                tracing::warn!(%error, "parking a paused inbox event failed");
                true
            }
        }
    }

    /// Extends the claim of `token` every third of the lease, for as long as it is polled.
    /// Stops renewing (and stays pending) once the claim is no longer held: the attempt's
    /// fenced commit then finds it lost.
    async fn keep_lease(&self, key: &EventKey, token: i64) -> std::convert::Infallible {
        let (pool, sql) = (&self.inbox.pool, &self.inbox.sql);
        keep_lease(self.settings.lease, |until| {
            backend::renew(pool, sql, key, token, until)
        })
        .await
    }

    /// Runs the attempt, bounded by the attempt timeout and renewing the claim from its start to
    /// its end: the transaction's start (on SQLite a wait for the writer gate, [`gate`]), the
    /// ordering check (a wait for the object's lock), the handler, the completion and the
    /// commit. A lock wait therefore cannot outlast the claim while this instance still runs the
    /// event. On error, panic or timeout the transaction is rolled back (explicitly, or by its
    /// drop), so SQLite's write lock is free for the failure record.
    async fn run(&self, event: InboxEvent, token: i64, started: i64) -> Result<Ended, Failure> {
        let key = event.key.clone();
        let timeout = self.settings.attempt_timeout;
        let keeper = self.keep_lease(&key, token);
        // Scoped: while the attempt holds SQLite's writer gate, its own lease renewals pass it.
        // On the heap, so that the futures around it move a pointer, not the transaction.
        let attempt = Box::pin(self.transact(event, token, started));
        match gate::scoped(guarded(timeout, attempt, keeper)).await {
            Ok(ended) => ended,
            Err(Cut::Panicked(message)) => Err(Failure::from(panic_text(message))),
            Err(cut) => Err(Failure::from(cut.error("attempt"))),
        }
    }

    /// Whether the event is checked for staleness before its handler runs: under
    /// [`OrderingPolicy::SkipStale`], when it has an ordering key.
    fn skips_stale(&self, event: &InboxEvent) -> bool {
        self.inbox.ordering.as_ref().is_some_and(|ordering| {
            ordering.policy() == OrderingPolicy::SkipStale
                && ordering.position(&event.body).is_some()
        })
    }

    /// The attempt's transaction, holding the database's writer gate ([`gate::hold`]: on SQLite
    /// from its start, for up to [`gate::GRACE`]). A handler's transaction starts lazily
    /// ([`InboxDatabase::BEGIN_LAZY`]: on SQLite no lock is taken before its first statement).
    /// When that meets a lock conflict (SQLite refuses to turn a handler's read into a write
    /// after another connection wrote), the handler runs again at once in a transaction that
    /// takes the write lock at its start ([`InboxDatabase::BEGIN`]), within the same claim and
    /// attempt. An event checked for staleness holds its key's lock from the check to the
    /// commit, so its transaction starts with the lock (on SQLite the write lock); an event
    /// without an ordering key starts lazily under every policy.
    async fn transact(
        &self,
        event: InboxEvent,
        token: i64,
        started: i64,
    ) -> Result<Ended, Failure> {
        let pool = &self.inbox.pool;
        if !self.skips_stale(&event) && DB::BEGIN_LAZY != DB::BEGIN {
            let lazy = self.in_transaction(DB::BEGIN_LAZY, event.clone(), token, started);
            match gate::hold(pool, lazy).await {
                Err(Tried::Conflict(failure)) => {
                    tracing::debug!(error = %failure.text, "a lazily started transaction met a lock conflict; running the handler again with the write lock");
                }
                ended => return ended.map_err(Tried::failure),
            }
        }
        let locked = self.in_transaction(DB::BEGIN, event, token, started);
        gate::hold(pool, locked).await.map_err(Tried::failure)
    }

    /// Runs the handler in a transaction started by `begin` and, when it succeeds, marks the
    /// event processed in that transaction (fenced by `token`) and commits.
    async fn in_transaction(
        &self,
        begin: &'static str,
        event: InboxEvent,
        token: i64,
        started: i64,
    ) -> Result<Ended, Tried> {
        let (key, attempt) = (event.key.clone(), event.attempt);
        let mut transaction = self
            .inbox
            .pool
            .begin_with(begin)
            .await
            .map_err(|e| Tried::Failed(Failure::from(error_text(&e))))?;
        if begin == DB::BEGIN && self.skips_stale(&event) {
            match self.skip_if_stale(&mut transaction, &key, token).await? {
                Some(Ended::Skipped) => {
                    transaction.commit().await.map_err(|e| error_text(&e))?;
                    return Ok(Ended::Skipped);
                }
                // Dropped: rolled back.
                Some(ended) => return Ok(ended),
                None => {}
            }
        }
        let handle = TxHandle::new(transaction);
        let tx = handle.lock().expect("a new transaction is free");
        let ran = self.handler.handle(event, tx).await;
        let Some(mut transaction) = handle.take() else {
            // Still held (the handler kept it in a task): it rolls back when that drops it.
            return Err(Tried::Failed(match ran {
                Err(error) => Failure {
                    permanent: error.is::<Permanent>(),
                    text: error_text(&*error),
                },
                Ok(()) => {
                    Failure::from("the handler kept its transaction past its return".to_owned())
                }
            }));
        };
        if let Err(error) = ran {
            if let Err(error) = transaction.rollback().await {
                tracing::warn!(%error, "rolling back a failed attempt failed; the connection drops it");
            }
            let failure = Failure {
                permanent: error.is::<Permanent>(),
                text: error_text(&*error),
            };
            return Err(if begin != DB::BEGIN && lock_conflict_in(&*error) {
                Tried::Conflict(failure)
            } else {
                Tried::Failed(failure)
            });
        }
        let (sql, now) = (&self.inbox.sql, now_ms());
        let keep = self.settings.history;
        let done = Attempt::ended(attempt, started, AttemptOutcome::Done);
        let completed = if keep > 0 {
            backend::complete_recorded::<DB>(
                &mut *transaction,
                sql,
                &key,
                (now, token),
                &done,
                keep,
            )
            .await
        } else {
            backend::complete::<DB>(&mut *transaction, sql, &key, now, token).await
        };
        let current = match completed {
            Ok(current) => current,
            Err(error) => {
                let _ = transaction.rollback().await;
                let failure = Failure::from(error_text(&error));
                return Err(if begin != DB::BEGIN && lock_conflict(&error) {
                    Tried::Conflict(failure)
                } else {
                    Tried::Failed(failure)
                });
            }
        };
        if !current {
            let _ = transaction.rollback().await;
            return Ok(Ended::Stale);
        }
        // A commit whose outcome is unknown is recorded as a failure below: when it did
        // commit, the failure record (fenced by the token the commit cleared) changes nothing.
        transaction.commit().await.map_err(|e| error_text(&e))?;
        Ok(Ended::Processed)
    }

    /// Under [`OrderingPolicy::SkipStale`]: locks the event's ordering key for `transaction`
    /// and, when a processed event of that key is newer, marks this one skipped (`Some`: the
    /// caller commits); `None` to run the handler in the same transaction, still holding the
    /// lock.
    async fn skip_if_stale(
        &self,
        transaction: &mut sqlx::Transaction<'static, DB>,
        key: &EventKey,
        token: i64,
    ) -> Result<Option<Ended>, Failure> {
        let sql = &self.inbox.sql;
        let newer = DB::newer_processed(&mut **transaction, sql, key)
            .await
            .map_err(|e| error_text(&e))?;
        let Some(newer) = newer else {
            return Ok(None);
        };
        let reason = format!("skipped: older than the processed event {newer}");
        let current = DB::skip(&mut **transaction, sql, key, now_ms(), token, &reason)
            .await
            .map_err(|e| error_text(&e))?;
        if !current {
            return Ok(Some(Ended::Stale));
        }
        Ok(Some(Ended::Skipped))
    }

    /// Hands the next pending event of `key`'s ordering key to the worker, so an event held back
    /// by this one does not wait for the sweeper.
    async fn hand_on(&self, key: &EventKey) {
        match DB::next_in_order(&self.inbox.pool, &self.inbox.sql, key).await {
            Ok(Some(next)) => self.inbox.notify(EventKey::new(key.provider.clone(), next)),
            Ok(None) => {}
            Err(error) => {
                tracing::debug!(%error, "finding the next event in order failed; the sweeper finds it")
            }
        }
    }

    /// Records a failed attempt: pending again after the backoff, or failed after the last (or
    /// at once when the handler said not to retry). Answers the outcome, `None` when the record
    /// could not be written.
    async fn failed(
        &self,
        key: &EventKey,
        token: i64,
        attempt: u32,
        failure: &Failure,
    ) -> Option<&'static str> {
        let now = now_ms();
        let retry_at = now.saturating_add(duration_ms(self.settings.backoff.delay(attempt)));
        // A permanent failure is the last attempt: `attempts >= 0` holds for every event.
        let max = if failure.permanent {
            0
        } else {
            self.max_attempts()
        };
        let (pool, sql) = (&self.inbox.pool, &self.inbox.sql);
        let last = failure.permanent || attempt >= self.settings.max_attempts;
        let error = &failure.text;
        let fail = || backend::fail(pool, sql, key, (now, token, max, retry_at), error);
        match persist(self.settings.lease, fail).await {
            Ok(true) if last => {
                tracing::warn!(provider = %key.provider, attempt, "inbox event failed its last attempt");
                Some("failed")
            }
            Ok(true) => Some("retry"),
            Ok(false) => Some("lease_lost"),
            Err(db) => {
                tracing::warn!(error = %db, "recording a failed attempt failed; retried after the lease");
                None
            }
        }
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    async fn handler(
        _: InboxEvent,
        _: tower_idempotency_sqlx::IdempotentTx<sqlx::Sqlite>,
    ) -> Result<(), crate::HandlerError> {
        Ok(())
    }

    fn event(key: &EventKey) -> InboxEvent {
        InboxEvent {
            key: key.clone(),
            headers: Vec::new(),
            body: bytes::Bytes::new(),
            received_at: std::time::SystemTime::UNIX_EPOCH,
            attempt: 1,
        }
    }

    /// Each future around a transaction's (the writer gate's hold and its scope, the timeout,
    /// the span, the task) holding a copy of it made an attempt's future twenty times one
    /// transaction's, copied at each wrapping and allocated by `mmap` for each attempt.
    #[tokio::test]
    async fn an_attempts_future_holds_no_copy_of_its_transaction() {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .connect_lazy("sqlite::memory:")
            .expect("a lazy pool");
        let inbox = Inbox::new(pool, "attempt_size").expect("a valid table");
        let shared = Arc::new(Shared {
            inbox: inbox.clone(),
            handler: Arc::new(handler),
            settings: inbox.worker(handler).settings,
            running: Arc::default(),
            handlers: Arc::new(Semaphore::new(1)),
            stopping: watch::channel(false).0,
        });
        let key = EventKey::new("stripe", "evt_1");
        let begin = <sqlx::Sqlite as tower_idempotency_jobs::Driver>::BEGIN_WRITE;
        let one = std::mem::size_of_val(&shared.in_transaction(begin, event(&key), 1, 0));
        let transact = std::mem::size_of_val(&shared.transact(event(&key), 1, 0));
        assert!(
            transact < 2 * one,
            "the lazy and the locked transaction ({transact} bytes) hold one ({one} bytes) each on the heap"
        );
        let permit = Arc::new(tokio::sync::Semaphore::new(1))
            .try_acquire_owned()
            .expect("a free permit");
        let running = shared.start(&key).expect("not running yet");
        let row = ClaimedRow {
            headers: "[]".to_owned(),
            body: b"{}".to_vec(),
            received_at: 0,
            attempts: 1,
        };
        let attempt =
            std::mem::size_of_val(&attempt(shared.clone(), key, 1, row, (running, permit)));
        assert!(
            attempt < 2 * one,
            "an attempt ({attempt} bytes) holds its transaction ({one} bytes) on the heap"
        );
    }

    /// A backlog is swept back to back, one sweep per [`SWEEP_BATCH`] events, and reading every
    /// open event to fail the spent ones at each sweep cost the drain a scan per batch: spent
    /// events are failed by the first sweep, then once per poll interval.
    #[tokio::test]
    async fn a_backlogs_sweeps_fail_spent_events_once_per_poll_interval() {
        let dir = std::env::temp_dir().join(format!("tidem-keeping-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let url = format!("sqlite://{}/inbox.db?mode=rwc", dir.display());
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .connect(&url)
            .await
            .expect("a scratch database");
        let inbox = Inbox::new(pool.clone(), "keeping").expect("a valid table");
        inbox.migrate().await.expect("migrated");
        let builder = inbox.worker(handler).poll_every(Duration::from_secs(3600));
        let spent = |id: &str| {
            format!(
                "INSERT INTO keeping (provider, event_id, headers, body, received_at, \
                 available_at, attempts) VALUES ('stripe', '{id}', '[]', X'7B7D', 0, 0, {DEFAULT_MAX_ATTEMPTS})"
            )
        };
        let insert = |id: &str| sqlx::raw_sql(sqlx::AssertSqlSafe(spent(id))).execute(&pool);
        let state = |id: &'static str| {
            sqlx::query_scalar::<_, i64>("SELECT state FROM keeping WHERE event_id = $1")
                .bind(id)
                .fetch_one(&pool)
        };
        let (sender, _receiver) = mpsc::channel(1);
        let mut feed = Feed {
            shared: Arc::new(Shared {
                inbox: inbox.clone(),
                handler: Arc::new(handler),
                settings: builder.settings,
                running: Arc::default(),
                handlers: Arc::new(Semaphore::new(1)),
                stopping: watch::channel(false).0,
            }),
            sender,
            lagging: HashSet::new(),
            kept: None,
        };
        let mut swept = VecDeque::new();
        insert("evt_1").await.expect("inserted");
        feed.sweep(&mut swept).await;
        assert_eq!(
            state("evt_1").await.expect("read"),
            2,
            "the first sweep fails a spent event"
        );
        insert("evt_2").await.expect("inserted");
        feed.sweep(&mut swept).await;
        assert_eq!(
            state("evt_2").await.expect("read"),
            0,
            "the next sweep inside the interval does not"
        );
        assert!(swept.is_empty(), "a spent event is never swept for a claim");
        feed.kept = Instant::now().checked_sub(Duration::from_secs(3600));
        feed.sweep(&mut swept).await;
        assert_eq!(
            state("evt_2").await.expect("read"),
            2,
            "a sweep an interval later fails it"
        );
        pool.close().await;
        std::fs::remove_dir_all(&dir).expect("removed");
    }
}
