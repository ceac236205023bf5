//! [`Worker`]: runs a job table's due jobs in rounds. A round fails the jobs whose attempts
//! are spent, claims up to [`Settings::concurrency`] due jobs under one lease, runs them at
//! once (each under the attempt timeout, a panic caught), keeps their lease while they run when
//! asked to, and records each outcome fenced by the claim's token, retrying a failed record
//! until the lease ends.

use std::{
    convert::Infallible, fmt, future::Future, panic::AssertUnwindSafe, sync::Arc, time::Duration,
};

use futures_util::{future::join_all, FutureExt};
use tokio::{
    sync::{oneshot, Notify},
    task::JoinHandle,
    time::{Instant, MissedTickBehavior},
};
use tower_idempotency_sqlx::is_unavailable_error;

use crate::{
    text::bounded,
    time::{duration_ms, now_ms},
    Attempt, AttemptOutcome, Backoff, Claimed, Driver, Statements,
};

/// Attempts before a job is failed, unless a half says otherwise.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;

/// How long a claim lasts, unless a half says otherwise.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// How often an idle worker looks for due jobs, unless a half says otherwise.
pub const DEFAULT_POLL_EVERY: Duration = Duration::from_secs(1);

/// Attempts a job's history keeps after its first, by default ([`Settings::history`]).
pub const DEFAULT_HISTORY: u32 = 10;

/// How a worker runs: the same names on every half of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settings {
    /// Attempts before a job is failed (at least 1).
    pub max_attempts: u32,
    /// When a failed attempt is retried.
    pub backoff: Backoff,
    /// How long a claim lasts.
    pub lease: Duration,
    /// How long one attempt may take before it counts as failed.
    pub attempt_timeout: Duration,
    /// Jobs a round claims and runs at once (at least 1).
    pub concurrency: usize,
    /// How often an idle worker looks for due jobs.
    pub poll_every: Duration,
    /// Whether a round renews its jobs' lease while they run (every third of the lease), so
    /// that only a stopped or stalled worker loses one. Off, an attempt longer than the lease
    /// is claimed again by another worker.
    pub keep_leases: bool,
    /// Attempts a job's history keeps after its first: its newest `history` (0: no history is
    /// written). See [`history`](crate::history).
    pub history: u32,
}

impl Settings {
    /// The defaults: [`DEFAULT_MAX_ATTEMPTS`], [`Backoff::default`], [`DEFAULT_LEASE`], an
    /// attempt timeout of half the lease, `concurrency`, [`DEFAULT_POLL_EVERY`], leases kept,
    /// [`DEFAULT_HISTORY`] attempts of history.
    pub fn new(concurrency: usize) -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff: Backoff::default(),
            lease: DEFAULT_LEASE,
            attempt_timeout: DEFAULT_LEASE / 2,
            concurrency: concurrency.max(1),
            poll_every: DEFAULT_POLL_EVERY,
            keep_leases: true,
            history: DEFAULT_HISTORY,
        }
    }

    /// Records `attempt` of the job `key` in its history (when [`history`](Self::history) is
    /// not 0) on a connection of `pool`, once: the history is for operators, and a failed
    /// record is logged, not retried.
    pub async fn record<DB: Driver>(
        &self,
        pool: &sqlx::Pool<DB>,
        sql: &Statements,
        key: &crate::JobKey,
        attempt: &crate::Attempt,
    ) {
        if self.history == 0 {
            return;
        }
        let recorded = async {
            let _turn = crate::gate::turn(pool).await;
            let mut conn = pool.acquire().await?;
            DB::record_attempt(&mut conn, sql, key, attempt, self.history).await
        };
        if let Err(error) = recorded.await {
            tracing::warn!(%error, table = sql.table().name(), "recording an attempt's history failed");
        }
    }

    /// [`max_attempts`](Self::max_attempts) as the statements bind it.
    pub fn max(&self) -> i32 {
        i32::try_from(self.max_attempts.max(1)).unwrap_or(i32::MAX)
    }
}

/// What one attempt of a job answered. `status` is recorded in
/// [`Table::status`](crate::Table::status) and the attempt's history; `response`, the start of
/// the answer the attempt met (a delivery's response body), in its history only.
#[derive(Debug)]
pub enum Outcome {
    /// It succeeded.
    Done {
        /// The attempt's status code.
        status: Option<i32>,
        /// The start of the answer it met.
        response: Option<String>,
    },
    /// It failed; another attempt follows after the backoff while attempts remain.
    Retry {
        /// The attempt's status code.
        status: Option<i32>,
        /// The error kept as the job's last (name no secret).
        error: String,
        /// The start of the answer it met.
        response: Option<String>,
    },
    /// It failed for good: the job is failed at once.
    Permanent {
        /// The attempt's status code.
        status: Option<i32>,
        /// The error kept as the job's last (name no secret).
        error: String,
        /// The start of the answer it met.
        response: Option<String>,
    },
}

impl Outcome {
    /// A success without a status or an answer.
    pub fn done() -> Self {
        Self::Done {
            status: None,
            response: None,
        }
    }

    /// Its status, error and answer.
    fn parts(&self) -> (Option<i32>, Option<&str>, Option<&str>) {
        match self {
            Self::Done { status, response } => (*status, None, response.as_deref()),
            Self::Retry {
                status,
                error,
                response,
            }
            | Self::Permanent {
                status,
                error,
                response,
            } => (*status, Some(error), response.as_deref()),
        }
    }
}

/// The work of one job table: what a worker runs for each claimed job.
pub trait Job<DB: Driver>: Send + Sync + 'static {
    /// The claimed job's columns ([`Table::payload`](crate::Table::payload)).
    type Payload: for<'r> sqlx::FromRow<'r, DB::Row> + Send + Unpin + 'static;

    /// What an attempt is called in the errors the worker records (`delivery`).
    const NAME: &'static str = "job";

    /// Runs one attempt.
    fn run(&self, job: Claimed<Self::Payload>) -> impl Future<Output = Outcome> + Send;

    /// The scopes a job belongs to, for [`pauses`](crate::pauses): a claimed job of a paused
    /// scope is parked instead of run. None by default.
    fn scopes(&self, payload: &Self::Payload) -> Vec<String> {
        let _ = payload;
        Vec::new()
    }
}

/// What one [`Worker::run_once`] round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Round {
    /// Jobs claimed.
    pub claimed: usize,
    /// Done and recorded.
    pub done: usize,
    /// Failed attempts scheduled for a retry.
    pub retried: usize,
    /// Jobs failed (their last attempt, or a permanent failure), spent ones included.
    pub failed: usize,
    /// Attempts whose outcome could not be recorded: the claim was lost to another worker, or
    /// the database failed until the claim's lease ended; the job is attempted again after its
    /// lease.
    pub unrecorded: usize,
    /// Jobs of a paused scope, parked without an attempt ([`pauses`](crate::pauses)).
    pub parked: usize,
}

/// Runs the due jobs of one table in rounds; [`spawn`](Self::spawn) it, or call
/// [`run_once`](Self::run_once) from a scheduler of your own.
pub struct Worker<DB: Driver, J: Job<DB>> {
    pool: sqlx::Pool<DB>,
    sql: Arc<Statements>,
    job: Arc<J>,
    settings: Settings,
    wake: Arc<Notify>,
}

impl<DB: Driver, J: Job<DB>> Clone for Worker<DB, J> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            sql: self.sql.clone(),
            job: self.job.clone(),
            settings: self.settings,
            wake: self.wake.clone(),
        }
    }
}

impl<DB: Driver, J: Job<DB>> fmt::Debug for Worker<DB, J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("table", &self.sql.table().name())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// A round's outcome of one job, as recorded.
enum Recorded {
    Done,
    Retry,
    Failed,
    Unrecorded,
    Parked,
}

impl<DB: Driver, J: Job<DB>> Worker<DB, J> {
    /// A worker of the table `sql` on `pool`, running `job`; `wake` starts an idle spawned
    /// worker's next round at once.
    pub fn new(
        pool: sqlx::Pool<DB>,
        sql: Arc<Statements>,
        job: J,
        settings: Settings,
        wake: Arc<Notify>,
    ) -> Self {
        Self {
            pool,
            sql,
            job: Arc::new(job),
            settings,
            wake,
        }
    }

    /// The worker's settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// One round: fails the jobs whose attempts are spent, claims up to
    /// [`Settings::concurrency`] due jobs, runs them at once and records each outcome.
    pub async fn run_once(&self) -> sqlx::Result<Round> {
        let settings = &self.settings;
        let now = now_ms();
        let spent = DB::exhaust(&self.pool, &self.sql, now, settings.max()).await?;
        if !spent.is_empty() {
            tracing::warn!(
                table = self.sql.table().name(),
                spent = spent.len(),
                "jobs failed: their attempts were spent"
            );
        }
        let token = fastrand::i64(0..i64::MAX);
        let lease_until = now.saturating_add(duration_ms(settings.lease));
        let limit = i64::try_from(settings.concurrency.max(1)).unwrap_or(i64::MAX);
        let claimed: Vec<Claimed<J::Payload>> = DB::claim_due(
            &self.pool,
            &self.sql,
            now,
            token,
            lease_until,
            settings.max(),
            limit,
        )
        .await?;
        let mut round = Round {
            claimed: claimed.len(),
            failed: spent.len(),
            ..Round::default()
        };
        let paused = if claimed.is_empty() {
            Arc::default()
        } else {
            crate::pauses::paused(&self.pool, &self.sql).await
        };
        let attempts = join_all(
            claimed
                .into_iter()
                .map(|job| self.attempt_unless_paused(job, &paused, token, lease_until)),
        );
        let outcomes = if settings.keep_leases && round.claimed > 0 {
            let keeper = self.keep_lease(token);
            tokio::pin!(keeper);
            tokio::select! {
                outcomes = attempts => outcomes,
                () = &mut keeper => unreachable!("the lease keeper runs until the round ends"),
            }
        } else {
            attempts.await
        };
        for outcome in outcomes {
            match outcome {
                Recorded::Done => round.done += 1,
                Recorded::Retry => round.retried += 1,
                Recorded::Failed => round.failed += 1,
                Recorded::Unrecorded => round.unrecorded += 1,
                Recorded::Parked => round.parked += 1,
            }
        }
        Ok(round)
    }

    /// Renews the lease of the jobs claimed under `token` every third of the lease, forever
    /// (the round drops it when its jobs end). A failed renewal is retried at the next turn.
    async fn keep_lease(&self, token: i64) {
        let every = (self.settings.lease / 3).max(Duration::from_millis(1));
        loop {
            tokio::time::sleep(every).await;
            let until = now_ms().saturating_add(duration_ms(self.settings.lease));
            if let Err(error) = DB::renew(&self.pool, &self.sql, token, until).await {
                tracing::warn!(%error, table = self.sql.table().name(), "renewing a lease failed");
            }
        }
    }

    /// Parks a claimed job of a paused scope; runs the others ([`attempt`](Self::attempt)).
    async fn attempt_unless_paused(
        &self,
        job: Claimed<J::Payload>,
        paused: &std::collections::BTreeSet<String>,
        token: i64,
        lease_until: i64,
    ) -> Recorded {
        let scopes = if paused.is_empty() {
            Vec::new()
        } else {
            self.job.scopes(&job.payload)
        };
        if let Some(scope) = crate::pauses::paused_scope(paused, scopes.iter().map(String::as_str))
        {
            let (pool, sql, key) = (&self.pool, &*self.sql, &job.key);
            let parked = persist(left_of(lease_until), || {
                DB::park(pool, sql, key, token, scope)
            })
            .await;
            match parked {
                Ok(true) => return Recorded::Parked,
                // Resumed since the worker read the pauses: the claim holds, the job runs.
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(table = sql.table().name(), %error, "parking a paused job failed; attempted again after its lease");
                    return Recorded::Unrecorded;
                }
            }
        }
        self.attempt(job, token, lease_until).await
    }

    /// Runs one claimed job and records its outcome, retrying the record until `lease_until`.
    async fn attempt(&self, job: Claimed<J::Payload>, token: i64, lease_until: i64) -> Recorded {
        let settings = &self.settings;
        let attempt = job.attempt;
        let key = job.key.clone();
        let key = &key;
        let started = now_ms();
        // The round's keeper renews every job of the claim at once (`keep_leases`).
        let run = guarded(
            settings.attempt_timeout,
            self.job.run(job),
            std::future::pending(),
        )
        .await;
        let outcome = run.unwrap_or_else(|cut| Outcome::Retry {
            status: None,
            error: match cut {
                Cut::Panicked(_) => Cut::Panicked(None).error(J::NAME),
                cut => cut.error(J::NAME),
            },
            response: None,
        });
        let (pool, sql, now) = (&self.pool, &*self.sql, now_ms());
        let recorded = match &outcome {
            Outcome::Done { status, .. } => {
                let status = *status;
                persist(left_of(lease_until), || {
                    Box::pin(async move {
                        let _turn = crate::gate::turn(pool).await;
                        let mut conn = pool.acquire().await?;
                        DB::complete(&mut conn, sql, key, token, now, status).await
                    })
                })
                .await
            }
            Outcome::Retry { status, error, .. } | Outcome::Permanent { status, error, .. } => {
                let permanent = matches!(outcome, Outcome::Permanent { .. });
                let retry_at = now.saturating_add(duration_ms(settings.backoff.delay(attempt)));
                // A permanent failure is the last attempt: `attempts >= 0` holds for every row.
                let max = if permanent { 0 } else { settings.max() };
                let (text, status) = (bounded(error.clone()), *status);
                persist(left_of(lease_until), || {
                    DB::fail(pool, sql, key, token, now, max, retry_at, &text, status)
                })
                .await
            }
        };
        if let Ok(true) = recorded {
            let ended = match &outcome {
                Outcome::Done { .. } => AttemptOutcome::Done,
                Outcome::Retry { .. } if attempt < settings.max_attempts => AttemptOutcome::Retried,
                Outcome::Retry { .. } | Outcome::Permanent { .. } => AttemptOutcome::Failed,
            };
            let (status, error, response) = outcome.parts();
            let history = Attempt::ended(attempt, started, ended)
                .status(status)
                .error(error.map(str::to_owned))
                .response(response.map(str::to_owned));
            settings.record(pool, sql, key, &history).await;
        }
        let table = sql.table().name();
        match (recorded, outcome) {
            (Ok(true), Outcome::Done { .. }) => Recorded::Done,
            (Ok(true), Outcome::Retry { error, .. }) if attempt < settings.max_attempts => {
                tracing::debug!(table, attempt, %error, "an attempt failed; retrying");
                Recorded::Retry
            }
            (Ok(true), Outcome::Retry { error, .. } | Outcome::Permanent { error, .. }) => {
                tracing::warn!(table, attempt, %error, "a job failed its last attempt");
                Recorded::Failed
            }
            (Ok(false), _) => {
                tracing::warn!(table, "an attempt ended after its claim was taken over");
                Recorded::Unrecorded
            }
            (Err(error), _) => {
                tracing::warn!(table, %error, "recording an attempt failed until its lease ended; attempted again");
                Recorded::Unrecorded
            }
        }
    }

    /// Runs rounds on the current Tokio runtime until the returned handle is drained or
    /// dropped: one after another while they find a full batch, else after
    /// [`Settings::poll_every`] or a wake-up.
    pub fn spawn(self) -> WorkerHandle {
        let (stop, stopped) = oneshot::channel();
        WorkerHandle::new(stop, tokio::spawn(self.run(stopped)))
    }

    /// Runs rounds until `stop` says the deadline of a drain (or its handle is dropped);
    /// answers whether the round running then finished by the deadline.
    async fn run(self, mut stop: oneshot::Receiver<Duration>) -> bool {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let round = self.run_once();
            tokio::pin!(round);
            let result = tokio::select! {
                result = &mut round => result,
                deadline = &mut stop => {
                    let deadline = deadline.unwrap_or(Duration::ZERO);
                    return tokio::time::timeout(deadline, round).await.is_ok();
                }
            };
            let full = match result {
                Ok(round) => round.claimed >= self.settings.concurrency,
                Err(error) => {
                    tracing::warn!(%error, table = self.sql.table().name(), "a worker round failed; retrying at the next");
                    false
                }
            };
            if full {
                continue;
            }
            tokio::select! {
                _ = &mut stop => return true,
                () = &mut notified => {}
                () = tokio::time::sleep(self.settings.poll_every) => {}
            }
        }
    }
}

/// Runs `write` again while the database is unavailable (SQLite's write lock held past the busy
/// timeout, a lost connection: [`is_unavailable_error`]), 10 ms doubling to 1 s apart with
/// jitter, until `within` has passed; answers the last result. For a worker's bookkeeping
/// (claims, renewals, outcomes): a write fenced by a claim's token can only land while the
/// claim holds, so retrying it within the lease never records an outcome twice.
pub async fn persist<T, F, Fut>(within: Duration, mut write: F) -> sqlx::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = sqlx::Result<T>>,
{
    let backoff = Backoff::exponential(Duration::from_millis(10), Duration::from_secs(1));
    let until = Instant::now() + within;
    let mut tries = 0;
    loop {
        match write().await {
            Err(error) if is_unavailable_error(&error) && Instant::now() < until => {
                tries += 1;
                tracing::debug!(%error, tries, "a bookkeeping write failed; trying it again");
                let left = until.saturating_duration_since(Instant::now());
                tokio::time::sleep(backoff.delay(tries).min(left)).await;
            }
            result => return result,
        }
    }
}

/// What cut an attempt short: [`guarded`] answers it.
#[derive(Debug)]
pub enum Cut {
    /// The attempt ran past its timeout (which it carries) and was cancelled.
    TimedOut(Duration),
    /// The attempt panicked; the payload's text when it is text.
    Panicked(Option<String>),
}

impl Cut {
    /// The error an attempt cut short keeps as its job's last: `the {what} timed out after N
    /// ms`, `the {what} panicked[: message]`.
    pub fn error(&self, what: &str) -> String {
        match self {
            Self::TimedOut(after) => {
                format!("the {what} timed out after {} ms", after.as_millis())
            }
            Self::Panicked(Some(message)) => format!("the {what} panicked: {message}"),
            Self::Panicked(None) => format!("the {what} panicked"),
        }
    }
}

/// Runs one attempt of a job: `attempt` under `timeout`, a panic caught, while `keeper` (a
/// lease keeper: [`keep_lease`]) runs beside it until the attempt ends.
pub async fn guarded<T>(
    timeout: Duration,
    attempt: impl Future<Output = T>,
    keeper: impl Future<Output = Infallible>,
) -> Result<T, Cut> {
    let ran = AssertUnwindSafe(tokio::time::timeout(timeout, attempt)).catch_unwind();
    let ran = tokio::select! {
        ran = ran => ran,
        never = keeper => match never {},
    };
    match ran {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(_elapsed)) => Err(Cut::TimedOut(timeout)),
        Err(payload) => Err(Cut::Panicked(
            payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned()),
        )),
    }
}

/// Keeps a claim's lease: every third of `lease`, `renew(until)` extends it to a lease from
/// now (retried while the database is unavailable, [`persist`]). Never ends: once `renew`
/// answers that the claim is no longer held it stops renewing and waits, for the attempt's
/// fenced record to find the claim lost. Run it beside the attempt ([`guarded`]).
pub async fn keep_lease<F, Fut>(lease: Duration, mut renew: F) -> Infallible
where
    F: FnMut(i64) -> Fut,
    Fut: Future<Output = sqlx::Result<bool>>,
{
    let every = (lease / 3).max(Duration::from_millis(1));
    let mut tick = tokio::time::interval_at(Instant::now() + every, every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let until = now_ms().saturating_add(duration_ms(lease));
        match persist(every, || renew(until)).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!("an attempt lost its claim");
                return std::future::pending().await;
            }
            Err(error) => tracing::warn!(%error, "renewing a claim failed; retrying at the next"),
        }
    }
}

/// The time left until `lease_until` (unix ms).
fn left_of(lease_until: i64) -> Duration {
    let left = lease_until.saturating_sub(now_ms());
    Duration::from_millis(u64::try_from(left).unwrap_or(0))
}

/// A spawned worker: the outbox's relay, the inbox's worker. [`drain`](Self::drain) it on
/// shutdown; dropping it stops it at once (what was running is cut short: its jobs are
/// attempted again after their lease).
#[derive(Debug)]
pub struct WorkerHandle {
    stop: Option<oneshot::Sender<Duration>>,
    task: JoinHandle<bool>,
}

impl WorkerHandle {
    /// A handle over a spawned `task` that stops when `stop` sends it a deadline (or is
    /// dropped: a deadline of zero) and answers whether what it was running finished by then.
    pub fn new(stop: oneshot::Sender<Duration>, task: JoinHandle<bool>) -> Self {
        Self {
            stop: Some(stop),
            task,
        }
    }

    /// Stops taking work and waits up to `deadline` for what is running. Answers whether it all
    /// finished; what is still running at the deadline is cut short (its jobs are attempted
    /// again after their lease). Jobs not yet started stay pending for the next start.
    pub async fn drain(mut self, deadline: Duration) -> bool {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(deadline);
        }
        (&mut self.task).await.unwrap_or(false)
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(Duration::ZERO);
        }
    }
}
