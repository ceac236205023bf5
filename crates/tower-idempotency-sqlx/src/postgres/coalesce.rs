//! Claims of new keys and completions, coalesced: a call that finds one of the store's write
//! lanes free runs as its own statement, as without coalescing; while every lane is busy, the
//! ones that arrive queue up, and the next lane to free carries every queued one of a kind in one
//! statement over arrays (`unnest`), so under load a new key costs a share of two commits
//! instead of two.
//!
//! Each caller gets the answer its own statement would have given. The batched statements are
//! the single ones over a set: the claim inserts with `ON CONFLICT DO NOTHING` and answers
//! "claimed" for the keys it returned; the completion updates the rows whose key and fencing
//! token match, on the same conditions as the single statement, and answers "current" for the
//! keys it returned. A key has one call queued or in flight at a time: a second call for the same
//! key runs as its own statement, as without coalescing.
//!
//! A batch statement gives up on any row lock it would wait for longer than
//! [`LOCK_TIMEOUT`] (another instance's or a `claim_in` transaction's uncommitted row of the
//! same key): a batch must not hold its batch-mates, and the queue behind it, for as long as
//! someone else's transaction runs. A batch that fails, for that or any other reason (a row
//! the database refuses, a lost connection), hands every call back to its caller, which runs
//! it as its own statement on the store's lanes, exactly as without coalescing: it fails only
//! the callers that fail alone, and waits only where a single statement waits. A caller that
//! gives up before its batch is sent is left out of it; one that gives up while its batch is in
//! flight leaves its write to that batch (as a cancelled single statement may have committed).
//!
//! Batches run on tasks of their own, so a cancelled caller never cancels its batch-mates'
//! statement, and on the store's write lanes, beside its single statements: a task takes a lane
//! first and only then the calls queued by that moment, so a call waits only for a lane, as its
//! own statement would, and calls that queued while every lane was busy go out together. One task
//! per queue waits for a lane at a time, from when the first call queues, so the queue keeps its
//! place among the single statements waiting for lanes; batches run at once on as many lanes as
//! are free. A store without lanes queues every call, and each batch takes a connection from
//! the pool.

use std::{
    collections::HashSet,
    fmt,
    future::Future,
    sync::{Arc, Mutex, MutexGuard},
};

use sqlx::{postgres::PgRow, Postgres, Row, SqlStr};
use tokio::sync::oneshot;

use super::notices::notify_each;
use crate::store::{
    backend::{Done, Pick, Statement, Write, Wrote},
    lanes::{Lanes, Taken},
    record::Params,
};

/// The most calls one statement carries; the rest wait for the next one.
const MAX_BATCH: usize = 512;

/// How long a batch statement waits for a row lock before it gives up and hands its calls back.
const LOCK_TIMEOUT: &str = "100ms";

/// A store's queues of claims and completions, and the lanes their statements run on.
pub(crate) struct Coalescer {
    inner: Arc<Inner>,
}

impl fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coalescer")
            .field("lanes", &self.inner.lanes)
            .finish_non_exhaustive()
    }
}

struct Inner {
    lanes: Arc<Lanes<Postgres>>,
    claims: Queue<Claim>,
    completions: Queue<Completion>,
}

impl Coalescer {
    /// Queues for `table`'s statements, run on the store's write `lanes` (without lanes, a
    /// connection from the pool per batch). Opens no connection.
    pub(crate) fn new(table: &str, lanes: Arc<Lanes<Postgres>>) -> Self {
        Self {
            inner: Arc::new(Inner {
                lanes,
                claims: Queue::new(&claims_sql(table)),
                completions: Queue::new(&completions_sql(table)),
            }),
        }
    }

    /// How many calls wait for a lane to go out on.
    pub(crate) fn queued(&self) -> usize {
        self.inner.claims.lock().waiting.len() + self.inner.completions.lock().waiting.len()
    }

    /// Queues `write` when it is a claim of a new key or a completion that finds every lane
    /// busy (or calls of its kind already queued) and no call for its key queued or in flight;
    /// otherwise hands it back, to run as its own statement.
    pub(crate) fn write<'a>(
        &self,
        write: Write<'a>,
    ) -> Result<impl Future<Output = Wrote<'a>> + Send + 'a, Write<'a>> {
        let queued = match (write.pick, &write.params) {
            (Pick::Insert, Params::Claim(claim)) => submit(&self.inner, claim.key, || Claim {
                key: claim.key.to_owned(),
                fingerprint: claim.fingerprint.to_vec(),
                token: claim.token,
                lease_ms: claim.lease_ms,
            }),
            (Pick::Complete, Params::Complete(complete)) => {
                submit(&self.inner, complete.key, || Completion {
                    key: complete.key.to_owned(),
                    token: complete.token,
                    status: complete.status as i16,
                    headers: complete.headers.clone(),
                    body: complete.body.to_vec(),
                    body_omitted: complete.body_omitted,
                    ttl_ms: complete.ttl_ms,
                })
            }
            _ => None,
        };
        let Some(answer) = queued else {
            return Err(write);
        };
        Ok(async move {
            // A queue whose task ended without answering hands the call back too.
            match answer.await {
                Ok(Some(rows)) => Ok(Ok(Done::Changed(rows))),
                Ok(None) | Err(_) => Err(write),
            }
        })
    }
}

/// Queues the job `make` builds, for `key`, and starts a task to wait for a lane for its queue
/// if none waits: the receiver gets the answer. `None`: the call runs as its own statement,
/// because a lane is free and nothing of its kind waits, or because a call for `key` is queued
/// or in flight (so that calls for one key never wait for each other's batches).
fn submit<J: Job>(
    inner: &Arc<Inner>,
    key: &str,
    make: impl FnOnce() -> J,
) -> Option<oneshot::Receiver<Answer>> {
    let queue = J::queue(inner);
    let (answer, answered) = oneshot::channel();
    let start = {
        let mut state = queue.lock();
        let lane_free = inner.lanes.free() > 0 && state.waiting.is_empty();
        if lane_free || state.keys.contains(key) {
            return None;
        }
        state.keys.insert(key.to_owned());
        state.waiting.push(Waiting {
            job: make(),
            answer,
        });
        !std::mem::replace(&mut state.waiter, true)
    };
    if start {
        tokio::spawn(drain::<J>(inner.clone()));
    }
    Some(answered)
}

/// A queue's waiter: waits for a lane, takes the calls queued by then as its batch, runs it, and
/// waits again if calls are left (past [`MAX_BATCH`], or queued meanwhile) with no task waiting
/// for them; a call queued while no task waits starts one.
async fn drain<J: Job>(inner: Arc<Inner>) {
    let queue = J::queue(&inner);
    let mut running = Running {
        queue,
        keys: Vec::new(),
        waiter: true,
    };
    loop {
        let lane = inner.lanes.take().await;
        let batch = {
            let mut state = queue.lock();
            let batch = take_batch(&mut state);
            state.waiter = false;
            running.waiter = false;
            running.keys = batch.iter().map(|call| call.job.key().to_owned()).collect();
            batch
        };
        if batch.is_empty() {
            if let Ok(lane) = lane {
                lane.unused();
            }
            return;
        }
        let changed = match lane {
            Ok(lane) => run(queue, lane, &batch).await,
            Err(_) => None,
        };
        queue.lock().release(&mut running.keys);
        for call in batch {
            let answer = changed
                .as_ref()
                .map(|changed| u64::from(changed.contains(call.job.key())));
            let _ = call.answer.send(answer);
        }
        let mut state = queue.lock();
        if !state.prune() || state.waiter {
            return;
        }
        state.waiter = true;
        running.waiter = true;
    }
}

/// Ends a task's part in its queue however the task ends: a task that panicked or whose runtime
/// went away releases its batch's keys, and a waiter drops the calls queued (their callers get
/// an error and run their own statements), so the next call starts a new waiter.
struct Running<'a, J: Job> {
    queue: &'a Queue<J>,
    /// The keys of the batch in flight.
    keys: Vec<String>,
    /// Whether the task is its queue's waiter.
    waiter: bool,
}

impl<J: Job> Drop for Running<'_, J> {
    fn drop(&mut self) {
        let mut state = self.queue.lock();
        state.release(&mut self.keys);
        if self.waiter {
            state.waiter = false;
            let mut dropped: Vec<String> = state
                .waiting
                .drain(..)
                .map(|call| call.job.key().to_owned())
                .collect();
            state.release(&mut dropped);
        }
    }
}

/// The next batch: the calls whose callers still wait, in order, at most [`MAX_BATCH`]; the
/// others stay queued, and the keys of callers that gave up are released. Sorted by key, so two
/// batches lock shared keys in the same order.
fn take_batch<J: Job>(state: &mut State<J>) -> Vec<Waiting<J>> {
    let mut batch = Vec::new();
    let mut rest = Vec::new();
    let mut gone = Vec::new();
    for call in state.waiting.drain(..) {
        if call.answer.is_closed() {
            gone.push(call.job.key().to_owned());
        } else if batch.len() < MAX_BATCH {
            batch.push(call);
        } else {
            rest.push(call);
        }
    }
    state.waiting = rest;
    state.release(&mut gone);
    batch.sort_by(|a, b| a.job.key().cmp(b.job.key()));
    batch
}

/// Runs one batch on `lane`: the keys it changed, or `None` when the statement failed (each
/// call then runs alone).
async fn run<J: Job>(
    queue: &Queue<J>,
    mut lane: Taken<'_, Postgres>,
    batch: &[Waiting<J>],
) -> Option<HashSet<String>> {
    let jobs: Vec<&J> = batch.iter().map(|call| &call.job).collect();
    let statement = J::bind_batch(&queue.batch, &jobs);
    let rows = match lane.connection().await {
        Ok(conn) => statement.fetch_all(&mut *conn).await,
        Err(error) => Err(error),
    };
    lane.settle(rows.is_ok());
    changed_keys(&rows.ok()?).ok()
}

/// The keys a batch statement changed: the first column of its rows.
fn changed_keys(rows: &[PgRow]) -> Result<HashSet<String>, sqlx::Error> {
    rows.iter().map(|row| row.try_get::<String, _>(0)).collect()
}

/// One kind of call's queue, and its statements.
struct Queue<J> {
    /// The batch statement.
    batch: SqlStr,
    state: Mutex<State<J>>,
}

struct State<J> {
    waiting: Vec<Waiting<J>>,
    /// Whether a task waits for a lane for this queue.
    waiter: bool,
    /// The keys of the calls queued or in a batch in flight: one call per key at a time, so a
    /// batch never holds two calls for one key.
    keys: HashSet<String>,
}

impl<J: Job> State<J> {
    /// Drops the calls whose callers gave up, releasing their keys: whether any call waits.
    fn prune(&mut self) -> bool {
        let mut gone = Vec::new();
        self.waiting.retain(|call| {
            let waits = !call.answer.is_closed();
            if !waits {
                gone.push(call.job.key().to_owned());
            }
            waits
        });
        self.release(&mut gone);
        !self.waiting.is_empty()
    }

    /// Lets calls for `keys` be queued again.
    fn release(&mut self, keys: &mut Vec<String>) {
        for key in keys.drain(..) {
            self.keys.remove(&key);
        }
    }
}

/// How many rows a call changed; `None`: its batch failed, run it alone.
type Answer = Option<u64>;

struct Waiting<J> {
    job: J,
    answer: oneshot::Sender<Answer>,
}

impl<J> Queue<J> {
    fn new(batch: &str) -> Self {
        Self {
            batch: crate::table_sql(compact(batch)),
            state: Mutex::new(State {
                waiting: Vec::new(),
                waiter: false,
                keys: HashSet::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<J>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `sql` with each run of whitespace as one space (see `statements.rs`).
fn compact(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A call that can be coalesced, owned so that it outlives a caller that gives up.
trait Job: Send + Sync + Sized + 'static {
    /// Its queue in `inner`.
    fn queue(inner: &Inner) -> &Queue<Self>;
    /// The key it writes.
    fn key(&self) -> &str;
    /// The batch statement over `jobs`.
    fn bind_batch<'q>(sql: &SqlStr, jobs: &[&'q Self]) -> Statement<'q, Postgres>;
}

/// A claim of a key with no row (the store's plain insert).
struct Claim {
    key: String,
    fingerprint: Vec<u8>,
    token: i64,
    lease_ms: i64,
}

impl Job for Claim {
    fn queue(inner: &Inner) -> &Queue<Self> {
        &inner.claims
    }

    fn key(&self) -> &str {
        &self.key
    }

    fn bind_batch<'q>(sql: &SqlStr, jobs: &[&'q Self]) -> Statement<'q, Postgres> {
        sqlx::query(sql.clone())
            .bind(jobs.iter().map(|j| j.key.as_str()).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| &j.fingerprint[..]).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.lease_ms).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.token).collect::<Vec<_>>())
    }
}

/// A completion.
struct Completion {
    key: String,
    token: i64,
    status: i16,
    headers: Vec<u8>,
    body: Vec<u8>,
    body_omitted: bool,
    ttl_ms: i64,
}

impl Job for Completion {
    fn queue(inner: &Inner) -> &Queue<Self> {
        &inner.completions
    }

    fn key(&self) -> &str {
        &self.key
    }

    fn bind_batch<'q>(sql: &SqlStr, jobs: &[&'q Self]) -> Statement<'q, Postgres> {
        sqlx::query(sql.clone())
            .bind(jobs.iter().map(|j| j.key.as_str()).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.token).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.status).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| &j.headers[..]).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| &j.body[..]).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.body_omitted).collect::<Vec<_>>())
            .bind(jobs.iter().map(|j| j.ttl_ms).collect::<Vec<_>>())
    }
}

/// What a batch statement starts with: [`LOCK_TIMEOUT`] for its own transaction, read before
/// its first row is written (the statement's `FROM` lists `cfg`).
fn lock_timeout() -> String {
    format!("cfg AS (SELECT set_config('lock_timeout', '{LOCK_TIMEOUT}', true))")
}

/// The store's plain insert over arrays: the keys it inserted.
fn claims_sql(table: &str) -> String {
    let cfg = lock_timeout();
    format!(
        r#"WITH {cfg}
INSERT INTO "{table}" (key, fingerprint, token, state, expires_at)
SELECT u.key, u.fingerprint, u.token, 0,
    statement_timestamp() + u.lease_ms * interval '1 millisecond'
FROM cfg, unnest($1::text[], $2::bytea[], $3::bigint[], $4::bigint[])
    AS u(key, fingerprint, lease_ms, token)
ON CONFLICT (key) DO NOTHING
RETURNING key"#
    )
}

/// The store's completion over arrays, on the same conditions (see `statements.rs`): the keys
/// it changed, each with its notice if a waiter marked it.
fn completions_sql(table: &str) -> String {
    let notify = notify_each(table, "done");
    let cfg = lock_timeout();
    format!(
        r#"WITH {cfg},
v AS (
SELECT * FROM unnest($1::text[], $2::bigint[], $3::smallint[], $4::bytea[], $5::bytea[],
    $6::boolean[], $7::bigint[]) AS v(key, token, status, headers, body, body_omitted, ttl_ms)
),
done AS (
UPDATE "{table}" AS cur SET state = 1,
    status       = CASE WHEN cur.state = 0 THEN v.status ELSE cur.status END,
    headers      = CASE WHEN cur.state = 0 THEN v.headers ELSE cur.headers END,
    body         = CASE WHEN cur.state = 0 THEN v.body ELSE cur.body END,
    body_omitted = CASE WHEN cur.state = 0 THEN v.body_omitted ELSE cur.body_omitted END,
    expires_at   = CASE WHEN cur.state = 0
        THEN statement_timestamp() + v.ttl_ms * interval '1 millisecond' ELSE cur.expires_at END
FROM cfg, v
WHERE cur.key = v.key AND cur.token = v.token
    AND (cur.state = 0 OR cur.expires_at > statement_timestamp())
RETURNING cur.key, cur.watched
)
SELECT done.key, {notify}"#
    )
}
