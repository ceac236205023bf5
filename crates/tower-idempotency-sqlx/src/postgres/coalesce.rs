//! Claims of new keys and completions, coalesced: while one of them is in flight, the ones that
//! arrive queue up, and the next statement carries every queued one over arrays (`unnest`), so
//! a new key costs a share of two commits instead of two.
//!
//! Each caller gets the answer its own statement would have given. The batched statements are
//! the single ones over a set: the claim inserts with `ON CONFLICT DO NOTHING` and answers
//! "claimed" for the keys it returned; the completion updates the rows whose key and fencing
//! token match, on the same conditions as the single statement, and answers "current" for the
//! keys it returned. A key is in a batch once: a second call for the same key waits for the
//! next batch, so it sees the first one's row exactly as its own statement would have.
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
//! Batches run on a task of their own (spawned when a queue gets work and none is running,
//! ending when it is empty), so a cancelled caller never cancels its batch-mates' statement,
//! on lanes of their own: one connection per kind of statement, kept checked out as the
//! store's lanes are (see `store/lanes.rs`), as far as the store's lanes leave all but one of
//! the pool's connections; past that (and with no store lanes) a batch takes a connection
//! from the pool.

use std::{
    collections::HashSet,
    fmt,
    future::Future,
    sync::{Arc, Mutex, MutexGuard},
};

use sqlx::{postgres::PgRow, PgPool, Postgres, Row, SqlStr};
use tokio::sync::oneshot;

use super::notices::notify_each;
use crate::store::{
    backend::{Done, Pick, Statement, Write, Wrote},
    lanes::Lanes,
    record::Params,
};

/// The most calls one statement carries; the rest wait for the next one.
const MAX_BATCH: usize = 512;

/// How long a batch statement waits for a row lock before it gives up and hands its calls back.
const LOCK_TIMEOUT: &str = "100ms";

/// A store's queues of claims and completions and the lanes their statements run on.
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
    lanes: Lanes<Postgres>,
    claims: Queue<Claim>,
    completions: Queue<Completion>,
}

impl Coalescer {
    /// Queues for `table`'s statements on `pool`, run on `lanes` lanes of their own (`0`: a
    /// connection from the pool per batch). Opens no connection.
    pub(crate) fn new(pool: &PgPool, table: &str, lanes: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                lanes: Lanes::new(pool.clone(), lanes),
                claims: Queue::new(&claims_sql(table)),
                completions: Queue::new(&completions_sql(table)),
            }),
        }
    }

    /// How many calls wait for the statement in flight of their kind.
    pub(crate) fn queued(&self) -> usize {
        self.inner.claims.lock().waiting.len() + self.inner.completions.lock().waiting.len()
    }

    /// Runs `write` through its queue when it is a claim of a new key or a completion;
    /// otherwise hands it back.
    pub(crate) fn write<'a>(
        &self,
        write: Write<'a>,
    ) -> Result<impl Future<Output = Wrote<'a>> + Send + 'a, Write<'a>> {
        let job = match (write.pick, &write.params) {
            (Pick::Insert, Params::Claim(claim)) => Pending::Claim(Claim {
                key: claim.key.to_owned(),
                fingerprint: claim.fingerprint.to_vec(),
                token: claim.token,
                lease_ms: claim.lease_ms,
            }),
            (Pick::Complete, Params::Complete(complete)) => Pending::Completion(Completion {
                key: complete.key.to_owned(),
                token: complete.token,
                status: complete.status as i16,
                headers: complete.headers.clone(),
                body: complete.body.to_vec(),
                body_omitted: complete.body_omitted,
                ttl_ms: complete.ttl_ms,
            }),
            _ => return Err(write),
        };
        let inner = self.inner.clone();
        Ok(async move {
            let answer = match job {
                Pending::Claim(claim) => submit(&inner, claim),
                Pending::Completion(completion) => submit(&inner, completion),
            };
            // A queue whose task ended without answering hands the call back too.
            match answer.await {
                Ok(Some(rows)) => Ok(Ok(Done::Changed(rows))),
                Ok(None) | Err(_) => Err(write),
            }
        })
    }
}

enum Pending {
    Claim(Claim),
    Completion(Completion),
}

/// Queues `job` and starts its queue's task if none is running; the receiver gets the answer.
fn submit<J: Job>(inner: &Arc<Inner>, job: J) -> oneshot::Receiver<Answer> {
    let (answer, answered) = oneshot::channel();
    let queue = J::queue(inner);
    let start = {
        let mut state = queue.lock();
        state.waiting.push(Waiting { job, answer });
        !std::mem::replace(&mut state.running, true)
    };
    if start {
        tokio::spawn(drain::<J>(inner.clone()));
    }
    answered
}

/// Runs batches of `J` until its queue is empty.
async fn drain<J: Job>(inner: Arc<Inner>) {
    let queue = J::queue(&inner);
    let _running = Running(queue);
    loop {
        let batch = {
            let mut state = queue.lock();
            let batch = take_batch(&mut state.waiting);
            if batch.is_empty() {
                state.running = false;
                return;
            }
            batch
        };
        run(&inner, queue, batch).await;
    }
}

/// Ends a queue's run however its task ends: a task that panicked or whose runtime went away
/// drops the calls it had queued (their callers get an error) and lets the next call start a
/// new task.
struct Running<'a, J: Job>(&'a Queue<J>);

impl<J: Job> Drop for Running<'_, J> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        if state.running {
            state.running = false;
            state.waiting.clear();
        }
    }
}

/// The next batch: the calls whose callers still wait, in order, at most one per key and at
/// most [`MAX_BATCH`]; the others stay queued. Sorted by key, so two instances' batches lock
/// shared keys in the same order.
fn take_batch<J: Job>(waiting: &mut Vec<Waiting<J>>) -> Vec<Waiting<J>> {
    let mut keys = HashSet::new();
    let mut batch = Vec::new();
    let mut rest = Vec::new();
    for call in waiting.drain(..) {
        if call.answer.is_closed() {
            continue;
        }
        if batch.len() < MAX_BATCH && keys.insert(call.job.key().to_owned()) {
            batch.push(call);
        } else {
            rest.push(call);
        }
    }
    *waiting = rest;
    batch.sort_by(|a, b| a.job.key().cmp(b.job.key()));
    batch
}

/// Runs one batch and answers its callers: how many rows each call changed, or, when the
/// statement failed, `None` (run it alone).
async fn run<J: Job>(inner: &Inner, queue: &Queue<J>, batch: Vec<Waiting<J>>) {
    let jobs: Vec<&J> = batch.iter().map(|call| &call.job).collect();
    let statement = J::bind_batch(&queue.batch, &jobs);
    let changed = match on_lane(&inner.lanes, statement).await {
        Ok(rows) => changed_keys(&rows).ok(),
        Err(_) => None,
    };
    for call in batch {
        let answer = changed
            .as_ref()
            .map(|changed| u64::from(changed.contains(call.job.key())));
        let _ = call.answer.send(answer);
    }
}

/// Runs a batch statement on one of `lanes`: the rows it returned.
async fn on_lane(
    lanes: &Lanes<Postgres>,
    statement: Statement<'_, Postgres>,
) -> Result<Vec<PgRow>, sqlx::Error> {
    let mut lane = lanes.take().await?;
    let rows = match lane.connection().await {
        Ok(conn) => statement.fetch_all(&mut *conn).await,
        Err(error) => Err(error),
    };
    lane.settle(rows.is_ok());
    rows
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
    /// Whether a task is running this queue's batches.
    running: bool,
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
                running: false,
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
