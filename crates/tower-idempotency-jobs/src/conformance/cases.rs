//! The suite's cases. Each takes a pool and the name of a fresh table [`Fixture::create`] made.
//! Times are passed to the driver's calls explicitly, so a lease lapses without waiting.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::Notify;

use super::Fixture;
use crate::{
    time::now_ms, AttemptOutcome, Backoff, Claimed, Driver, Job, JobKey, JobState, JobSummary,
    NoColumns, Outcome, PageFilter, Settings, Table, Worker, SPENT,
};

/// A test job's payload: its `body` column.
#[derive(Debug)]
pub struct Body {
    /// The job's body.
    pub body: String,
}

impl<'r, R: sqlx::Row> sqlx::FromRow<'r, R> for Body
where
    &'r str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'r R) -> sqlx::Result<Self> {
        Ok(Self {
            body: row.try_get("body")?,
        })
    }
}

/// The suite's table shape: keyed by `(kind, id)`, grouped by `kind`, `last_status` recorded.
pub fn table(name: &str) -> Table {
    Table::new(name, &["kind", "id"], "created_at")
        .payload(&["body"])
        .status("last_status")
        .group("kind")
}

fn key(kind: &str, id: &str) -> JobKey {
    JobKey(vec![kind.to_owned(), id.to_owned()])
}

const LEASE: i64 = 60_000;

async fn get<DB: Fixture>(
    pool: &sqlx::Pool<DB>,
    sql: &crate::Statements,
    key: &JobKey,
) -> JobSummary<NoColumns> {
    DB::get::<NoColumns>(pool, sql, key)
        .await
        .expect("get")
        .expect("the job exists")
}

async fn add_many<DB: Fixture>(pool: &sqlx::Pool<DB>, table: &str, kind: &str, n: usize, at: i64) {
    for i in 0..n {
        let id = format!("{i:03}");
        DB::add(pool, table, kind, &id, &format!("{kind} {id}"), at)
            .await
            .expect("add");
    }
}

/// Claims take due jobs under a lease with an attempt counted; a second claim meanwhile takes
/// none; completion and failure need the claim's token.
pub async fn claims_are_leased_and_fenced<DB: Fixture>(pool: sqlx::Pool<DB>, name: String)
where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = DB::statements(table(&name));
    add_many(&pool, &name, "a", 3, 1_000).await;
    let now = now_ms();
    let first: Vec<Claimed<Body>> = DB::claim_due(&pool, &sql, now, 1, now + LEASE, 5, 10)
        .await
        .unwrap();
    assert_eq!(first.len(), 3);
    assert!(first.iter().all(|job| job.attempt == 1));
    let mut bodies: Vec<&str> = first.iter().map(|job| job.payload.body.as_str()).collect();
    bodies.sort_unstable();
    assert_eq!(bodies, ["a 000", "a 001", "a 002"]);
    let second: Vec<Claimed<Body>> = DB::claim_due(&pool, &sql, now, 2, now + LEASE, 5, 10)
        .await
        .unwrap();
    assert!(second.is_empty(), "a leased job was claimed again");

    let mut conn = pool.acquire().await.unwrap();
    let done = &first[0].key;
    assert!(!DB::complete(&mut conn, &sql, done, 2, now, Some(200))
        .await
        .unwrap());
    assert!(DB::complete(&mut conn, &sql, done, 1, now, Some(200))
        .await
        .unwrap());
    assert!(!DB::complete(&mut conn, &sql, done, 1, now, Some(200))
        .await
        .unwrap());
    drop(conn);
    let summary = get(&pool, &sql, done).await;
    assert_eq!(summary.state, JobState::Done);
    assert_eq!((summary.attempts, summary.status), (1, Some(200)));
    assert_eq!(summary.finished_at_ms, Some(now));

    let failed = &first[1].key;
    assert!(
        !DB::fail(&pool, &sql, failed, 2, now, 5, now + 10, "x", None)
            .await
            .unwrap()
    );
    assert!(
        DB::fail(&pool, &sql, failed, 1, now, 5, now + 10, "boom", Some(503))
            .await
            .unwrap()
    );
    let summary = get(&pool, &sql, failed).await;
    assert_eq!(summary.state, JobState::Pending);
    assert_eq!(summary.last_error.as_deref(), Some("boom"));
    assert_eq!(summary.status, Some(503));
    assert_eq!(summary.available_at_ms, now + 10);
    assert_eq!(summary.finished_at_ms, None);
}

/// A claim whose lease ended is taken by the next claim (its attempt counted); the first
/// claim's token can no longer record.
pub async fn a_lapsed_lease_is_claimed_again_and_its_old_claim_cannot_record<DB: Fixture>(
    pool: sqlx::Pool<DB>,
    name: String,
) where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = DB::statements(table(&name));
    add_many(&pool, &name, "a", 1, 1_000).await;
    let now = now_ms();
    let first: Vec<Claimed<Body>> = DB::claim_due(&pool, &sql, now, 1, now + 100, 5, 10)
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    let later = now + 100;
    let second: Vec<Claimed<Body>> = DB::claim_due(&pool, &sql, later, 2, later + LEASE, 5, 10)
        .await
        .unwrap();
    assert_eq!(second.len(), 1, "a lapsed lease was not claimed again");
    assert_eq!(second[0].attempt, 2);
    let key = &second[0].key;
    let mut conn = pool.acquire().await.unwrap();
    assert!(!DB::complete(&mut conn, &sql, key, 1, later, None)
        .await
        .unwrap());
    assert!(
        !DB::fail(&pool, &sql, key, 1, later, 5, later, "late", None)
            .await
            .unwrap()
    );
    assert!(DB::complete(&mut conn, &sql, key, 2, later, None)
        .await
        .unwrap());
}

/// A renewal extends every job of a claim, or one; a renewed lease is not claimed by another.
pub async fn renewals_keep_a_lease<DB: Fixture>(pool: sqlx::Pool<DB>, name: String)
where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = DB::statements(table(&name));
    add_many(&pool, &name, "a", 2, 1_000).await;
    let now = now_ms();
    let claimed: Vec<Claimed<Body>> = DB::claim_due(&pool, &sql, now, 1, now + 100, 5, 10)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    assert_eq!(DB::renew(&pool, &sql, 1, now + 10_000).await.unwrap(), 2);
    assert_eq!(DB::renew(&pool, &sql, 9, now + 10_000).await.unwrap(), 0);
    let stolen: Vec<Claimed<Body>> = DB::claim_due(&pool, &sql, now + 200, 2, now + LEASE, 5, 10)
        .await
        .unwrap();
    assert!(stolen.is_empty(), "a renewed lease was claimed");
    let key = &claimed[0].key;
    assert!(DB::renew_one(&pool, &sql, key, 1, now + 20_000)
        .await
        .unwrap());
    assert!(!DB::renew_one(&pool, &sql, key, 2, now + 20_000)
        .await
        .unwrap());
    let mut conn = pool.acquire().await.unwrap();
    assert!(DB::complete(&mut conn, &sql, key, 1, now, None)
        .await
        .unwrap());
    assert!(!DB::renew_one(&pool, &sql, key, 1, now + 30_000)
        .await
        .unwrap());
    assert_eq!(DB::renew(&pool, &sql, 1, now + 30_000).await.unwrap(), 1);
}

/// A claim given back before its attempt started returns the attempt it counted and frees its
/// lease (the next claim takes the job at once, as its first attempt); only the claim's token
/// gives it back, and only while the job is pending.
pub async fn a_claim_given_back_is_due_again_with_its_attempt<DB: Fixture>(
    pool: sqlx::Pool<DB>,
    name: String,
) where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = DB::statements(table(&name));
    add_many(&pool, &name, "a", 1, 1_000).await;
    let now = now_ms();
    let claimed: Vec<Claimed<Body>> = DB::claim_due(&pool, &sql, now, 1, now + LEASE, 5, 10)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let key = &claimed[0].key;
    assert!(!DB::give_back(&pool, &sql, key, 2).await.unwrap());
    assert!(DB::give_back(&pool, &sql, key, 1).await.unwrap());
    assert!(!DB::give_back(&pool, &sql, key, 1).await.unwrap());
    let summary = get(&pool, &sql, key).await;
    assert_eq!((summary.state, summary.attempts), (JobState::Pending, 0));
    let again: Vec<Claimed<Body>> = DB::claim_due(&pool, &sql, now, 3, now + LEASE, 5, 10)
        .await
        .unwrap();
    assert_eq!(again.len(), 1, "a job given back was not due");
    assert_eq!(again[0].attempt, 1);
    let mut conn = pool.acquire().await.unwrap();
    assert!(DB::complete(&mut conn, &sql, key, 3, now, None)
        .await
        .unwrap());
    drop(conn);
    assert!(!DB::give_back(&pool, &sql, key, 3).await.unwrap());
    assert_eq!(get(&pool, &sql, key).await.state, JobState::Done);
}

/// Claims that never record (a crashed worker) still count: once the attempts are spent, no
/// claim takes the job and the sweep fails it with [`SPENT`].
pub async fn attempts_are_bounded_whatever_ends_them<DB: Fixture>(
    pool: sqlx::Pool<DB>,
    name: String,
) where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = DB::statements(table(&name));
    add_many(&pool, &name, "a", 1, 1_000).await;
    let mut now = now_ms();
    for attempt in 1..=2 {
        let claimed: Vec<Claimed<Body>> =
            DB::claim_due(&pool, &sql, now, attempt.into(), now + 10, 2, 10)
                .await
                .unwrap();
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].attempt, attempt);
        now += 10;
    }
    let none: Vec<Claimed<Body>> = DB::claim_due(&pool, &sql, now, 3, now + 10, 2, 10)
        .await
        .unwrap();
    assert!(none.is_empty(), "a job past its attempts was claimed");
    assert!(DB::due(&pool, &sql, now, 10, 2).await.unwrap().is_empty());
    let spent = DB::exhaust(&pool, &sql, now, 2).await.unwrap();
    assert_eq!(spent, [key("a", "000")]);
    let summary = get(&pool, &sql, &key("a", "000")).await;
    assert_eq!(summary.state, JobState::Failed);
    assert_eq!(summary.last_error.as_deref(), Some(SPENT));
    assert_eq!(summary.finished_at_ms, Some(now));
    assert!(DB::exhaust(&pool, &sql, now, 2).await.unwrap().is_empty());
}

/// A failure recorded with no attempts left (`max_attempts` 0) fails the job at once.
pub async fn a_permanent_failure_fails_at_once<DB: Fixture>(pool: sqlx::Pool<DB>, name: String)
where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = DB::statements(table(&name));
    add_many(&pool, &name, "a", 1, 1_000).await;
    let now = now_ms();
    let claimed: Vec<Claimed<Body>> = DB::claim_due(&pool, &sql, now, 1, now + LEASE, 10, 10)
        .await
        .unwrap();
    assert!(DB::fail(
        &pool,
        &sql,
        &claimed[0].key,
        1,
        now,
        0,
        now,
        "refused",
        Some(422)
    )
    .await
    .unwrap());
    let summary = get(&pool, &sql, &claimed[0].key).await;
    assert_eq!(summary.state, JobState::Failed);
    assert_eq!(summary.finished_at_ms, Some(now));
    assert_eq!(summary.status, Some(422));
}

/// The suite's job: what it does follows the job's kind; every run is counted by key.
#[derive(Clone, Default)]
pub struct Recording {
    /// Runs per key.
    pub runs: Arc<Mutex<HashMap<JobKey, usize>>>,
    /// Notified when a `hold` job starts; such a job finishes once `release` is notified.
    pub started: Arc<Notify>,
    /// Lets `hold` jobs finish.
    pub release: Arc<Notify>,
}

impl<DB: Driver> Job<DB> for Recording
where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    type Payload = Body;

    async fn run(&self, job: Claimed<Body>) -> Outcome {
        *self
            .runs
            .lock()
            .unwrap()
            .entry(job.key.clone())
            .or_default() += 1;
        match job.key.part(0) {
            "error" => Outcome::Retry {
                status: Some(503),
                error: format!("unavailable on attempt {}", job.attempt),
                response: Some(format!("{{\"attempt\": {}}}", job.attempt)),
            },
            "timeout" => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Outcome::done()
            }
            "panic" => panic!("the suite's job panics"),
            "hold" => {
                let released = self.release.notified();
                self.started.notify_one();
                released.await;
                Outcome::Done {
                    status: Some(201),
                    response: None,
                }
            }
            _ => Outcome::Done {
                status: Some(200),
                response: Some("ok".into()),
            },
        }
    }

    /// The job's kind, the first word of its body.
    fn scopes(&self, payload: &Body) -> Vec<String> {
        payload.body.split(' ').take(1).map(str::to_owned).collect()
    }
}

fn settings(max_attempts: u32) -> Settings {
    let mut settings = Settings::new(8);
    settings.max_attempts = max_attempts;
    settings.backoff = Backoff::exponential(Duration::from_millis(1), Duration::from_millis(1));
    settings.attempt_timeout = Duration::from_millis(200);
    settings.lease = Duration::from_secs(10);
    settings.poll_every = Duration::from_millis(5);
    settings
}

/// The worker spends a job's attempts on errors, timeouts and panics alike, then fails it with
/// the last error; a job that succeeds is done at its first attempt.
pub async fn the_worker_bounds_attempts_through_errors_timeouts_and_panics<DB: Fixture>(
    pool: sqlx::Pool<DB>,
    name: String,
) where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = Arc::new(DB::statements(table(&name)));
    for kind in ["error", "timeout", "panic", "ok"] {
        add_many(&pool, &name, kind, 1, 1_000).await;
    }
    let job = Recording::default();
    let worker = Worker::new(
        pool.clone(),
        sql.clone(),
        job.clone(),
        settings(2),
        Arc::new(Notify::new()),
    );
    let mut rounds = 0;
    loop {
        let counts = DB::counts(&pool, &sql).await.unwrap();
        if counts.failed == 3 && counts.done == 1 {
            break;
        }
        rounds += 1;
        assert!(rounds < 100, "the jobs did not end: {counts:?}");
        worker.run_once().await.unwrap();
        // The backoff is 1 ms: the retries are due by the next round.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let runs = job.runs.lock().unwrap().clone();
    for (kind, error) in [
        ("error", "unavailable on attempt 2"),
        ("timeout", "the job timed out after 200 ms"),
        ("panic", "the job panicked"),
    ] {
        let summary = get(&pool, &sql, &key(kind, "000")).await;
        assert_eq!(summary.state, JobState::Failed, "{kind}");
        assert_eq!(summary.attempts, 2, "{kind}");
        assert_eq!(summary.last_error.as_deref(), Some(error), "{kind}");
        assert_eq!(runs[&key(kind, "000")], 2, "{kind}");
    }
    let ok = get(&pool, &sql, &key("ok", "000")).await;
    assert_eq!(
        (ok.state, ok.attempts, ok.status),
        (JobState::Done, 1, Some(200))
    );
}

/// A claim by keys takes those of the keys that are due and unleased, and nothing else.
pub async fn claims_by_key_take_only_due_jobs<DB: Fixture>(pool: sqlx::Pool<DB>, name: String)
where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = DB::statements(table(&name));
    add_many(&pool, &name, "a", 3, 1_000).await;
    add_many(&pool, &name, "b", 1, 1_000).await;
    let now = now_ms();
    let keys = [key("a", "000"), key("b", "000"), key("c", "none")];
    let claimed: Vec<Claimed<Body>> = DB::claim_keys(&pool, &sql, &keys, now, 1, now + LEASE, 5)
        .await
        .unwrap();
    let mut got: Vec<JobKey> = claimed.iter().map(|job| job.key.clone()).collect();
    got.sort();
    assert_eq!(got, [key("a", "000"), key("b", "000")]);
    assert!(claimed.iter().all(|job| job.attempt == 1));
    let again: Vec<Claimed<Body>> = DB::claim_keys(&pool, &sql, &keys, now, 2, now + LEASE, 5)
        .await
        .unwrap();
    assert!(again.is_empty(), "a leased job was claimed by key");
    let mut conn = pool.acquire().await.unwrap();
    assert!(
        DB::complete(&mut conn, &sql, &key("a", "000"), 1, now, None)
            .await
            .unwrap()
    );
    let later = now + LEASE;
    let after: Vec<Claimed<Body>> = DB::claim_keys(&pool, &sql, &keys, later, 3, later + LEASE, 5)
        .await
        .unwrap();
    let got: Vec<JobKey> = after.iter().map(|job| job.key.clone()).collect();
    assert_eq!(
        got,
        [key("b", "000")],
        "a done job was claimed, or a lapsed one was not"
    );
}

/// Retry takes only failed jobs back; discard takes failed jobs and idle pending ones.
pub async fn retry_and_discard_follow_the_states<DB: Fixture>(pool: sqlx::Pool<DB>, name: String)
where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = DB::statements(table(&name));
    add_many(&pool, &name, "a", 3, 1_000).await;
    let now = now_ms();
    let (failed, idle, leased) = (key("a", "000"), key("a", "001"), key("a", "002"));
    assert!(!DB::retry(&pool, &sql, &failed, now).await.unwrap());
    let claimed: Vec<Claimed<Body>> = DB::claim_keys(
        &pool,
        &sql,
        &[failed.clone(), leased.clone()],
        now,
        1,
        now + LEASE,
        5,
    )
    .await
    .unwrap();
    assert_eq!(claimed.len(), 2);
    assert!(DB::fail(&pool, &sql, &failed, 1, now, 0, now, "x", None)
        .await
        .unwrap());
    assert!(DB::retry(&pool, &sql, &failed, now + 1).await.unwrap());
    let summary = get(&pool, &sql, &failed).await;
    assert_eq!((summary.state, summary.attempts), (JobState::Pending, 0));
    assert_eq!(
        (summary.available_at_ms, summary.last_error),
        (now + 1, None)
    );

    assert!(
        !DB::discard(&pool, &sql, &leased, now).await.unwrap(),
        "a running job was discarded"
    );
    assert!(DB::discard(&pool, &sql, &idle, now).await.unwrap());
    assert_eq!(get(&pool, &sql, &idle).await.state, JobState::Discarded);
    assert!(!DB::discard(&pool, &sql, &idle, now).await.unwrap());
    assert!(!DB::retry(&pool, &sql, &idle, now).await.unwrap());
}

/// A purge deletes only done and discarded jobs finished before its bound, at most its limit.
pub async fn purge_is_bounded<DB: Fixture>(pool: sqlx::Pool<DB>, name: String)
where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = DB::statements(table(&name));
    add_many(&pool, &name, "a", 7, 1_000).await;
    let now = now_ms();
    let claimed: Vec<Claimed<Body>> = DB::claim_due(&pool, &sql, now, 1, now + LEASE, 5, 10)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 7);
    let mut conn = pool.acquire().await.unwrap();
    for i in 0..5 {
        let finished = 100 + i64::from(i);
        let key = key("a", &format!("{i:03}"));
        assert!(DB::complete(&mut conn, &sql, &key, 1, finished, None)
            .await
            .unwrap());
    }
    drop(conn);
    assert!(
        DB::fail(&pool, &sql, &key("a", "005"), 1, 50, 0, 50, "x", None)
            .await
            .unwrap()
    );
    assert_eq!(DB::purge(&pool, &sql, 103, 2).await.unwrap(), 2);
    assert_eq!(DB::purge(&pool, &sql, 103, 10).await.unwrap(), 1);
    assert_eq!(DB::purge(&pool, &sql, 103, 10).await.unwrap(), 0);
    let counts = DB::counts(&pool, &sql).await.unwrap();
    assert_eq!((counts.done, counts.failed, counts.pending), (2, 1, 1));
}

/// Pages of a listing follow (enqueue time, key), newest first: paging by the last position
/// neither repeats nor skips a job, and the filters hold on every page.
pub async fn pages_follow_the_keys<DB: Fixture>(pool: sqlx::Pool<DB>, name: String)
where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = DB::statements(table(&name));
    for i in 0..25 {
        let kind = if i % 2 == 0 { "a" } else { "b" };
        // Three jobs share each enqueue time: the key breaks the ties.
        DB::add(&pool, &name, kind, &format!("{i:03}"), "x", 1_000 + i / 3)
            .await
            .unwrap();
    }
    let mut expected: Vec<(i64, JobKey)> = (0..25)
        .map(|i| {
            let kind = if i % 2 == 0 { "a" } else { "b" };
            (1_000 + i / 3, key(kind, &format!("{i:03}")))
        })
        .collect();
    expected.sort_by(|x, y| y.cmp(x));
    let page_all = |filter: PageFilter| {
        let (pool, sql) = (&pool, &sql);
        async move {
            let mut filter = filter;
            let mut seen = Vec::new();
            loop {
                let page = DB::page::<NoColumns>(pool, sql, &filter, 10).await.unwrap();
                let last = page.last().map(|job| (job.created_at_ms, job.key.clone()));
                let full = page.len() == 10;
                seen.extend(page.into_iter().map(|job| (job.created_at_ms, job.key)));
                match (full, last) {
                    (true, Some(last)) => filter.after = Some(last),
                    _ => return seen,
                }
            }
        }
    };
    assert_eq!(page_all(PageFilter::default()).await, expected);
    let b: Vec<_> = expected
        .iter()
        .filter(|(_, k)| k.part(0) == "b")
        .cloned()
        .collect();
    let group = PageFilter {
        group: Some("b".into()),
        ..PageFilter::default()
    };
    assert_eq!(page_all(group).await, b);
    let window: Vec<_> = expected
        .iter()
        .filter(|(at, _)| (1_002..1_005).contains(at))
        .cloned()
        .collect();
    let range = PageFilter {
        from_ms: Some(1_002),
        until_ms: Some(1_005),
        ..PageFilter::default()
    };
    assert_eq!(page_all(range).await, window);
    let done = PageFilter {
        state: Some(JobState::Done),
        ..PageFilter::default()
    };
    assert!(page_all(done).await.is_empty());
    let oldest: Vec<(i64, JobKey)> = DB::list::<NoColumns>(&pool, &sql, JobState::Pending, 4)
        .await
        .unwrap()
        .into_iter()
        .map(|job| (job.created_at_ms, job.key))
        .collect();
    let mut ascending = expected.clone();
    ascending.reverse();
    assert_eq!(oldest, ascending[..4], "a listing is oldest first");
}

/// Counts per state and the oldest pending job's enqueue time.
pub async fn counts_and_lag<DB: Fixture>(pool: sqlx::Pool<DB>, name: String)
where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = DB::statements(table(&name));
    assert_eq!(DB::oldest_pending(&pool, &sql).await.unwrap(), None);
    DB::add(&pool, &name, "a", "old", "x", 500).await.unwrap();
    DB::add(&pool, &name, "a", "new", "x", 900).await.unwrap();
    let now = now_ms();
    let claimed: Vec<Claimed<Body>> =
        DB::claim_keys(&pool, &sql, &[key("a", "old")], now, 1, now + LEASE, 5)
            .await
            .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(DB::oldest_pending(&pool, &sql).await.unwrap(), Some(500));
    let mut conn = pool.acquire().await.unwrap();
    assert!(
        DB::complete(&mut conn, &sql, &key("a", "old"), 1, now, None)
            .await
            .unwrap()
    );
    assert_eq!(DB::oldest_pending(&pool, &sql).await.unwrap(), Some(900));
    let counts = DB::counts(&pool, &sql).await.unwrap();
    assert_eq!(
        (counts.pending, counts.done, counts.failed, counts.discarded),
        (1, 1, 0, 0)
    );
}

/// Four workers on one table run each of 40 jobs once (Postgres: their claims skip each
/// other's locked rows; SQLite: they take the write lock in turn).
pub async fn concurrent_workers_run_each_job_once<DB: Fixture>(pool: sqlx::Pool<DB>, name: String)
where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = Arc::new(DB::statements(table(&name)));
    add_many(&pool, &name, "a", 40, 1_000).await;
    let job = Recording::default();
    let mut settings = settings(3);
    settings.concurrency = 5;
    let workers: Vec<_> = (0..4)
        .map(|_| {
            Worker::new(
                pool.clone(),
                sql.clone(),
                job.clone(),
                settings,
                Arc::new(Notify::new()),
            )
            .spawn()
        })
        .collect();
    let mut checks = 0;
    while DB::counts(&pool, &sql).await.unwrap().done < 40 {
        checks += 1;
        assert!(checks < 3_000, "the workers did not finish");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for worker in workers {
        assert!(worker.drain(Duration::from_secs(10)).await);
    }
    let runs = job.runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 40);
    assert!(runs.values().all(|&n| n == 1), "a job ran twice: {runs:?}");
}

/// A table locked while a job runs delays its record; the record lands once the lock is gone,
/// and the job runs once.
pub async fn a_locked_table_delays_the_record_but_never_doubles_it<DB: Fixture>(
    pool: sqlx::Pool<DB>,
    name: String,
) where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = Arc::new(DB::statements(table(&name)));
    DB::add(&pool, &name, "hold", "000", "x", 1_000)
        .await
        .unwrap();
    let job = Recording::default();
    let worker = Worker::new(
        pool.clone(),
        sql.clone(),
        job.clone(),
        settings(3),
        Arc::new(Notify::new()),
    );
    let started = job.started.notified();
    let round = tokio::spawn(async move { worker.run_once().await });
    started.await;
    let (locked, is_locked) = tokio::sync::oneshot::channel();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let (pool, name) = (pool.clone(), name.clone());
        tokio::spawn(async move {
            DB::hold_lock(
                &pool,
                &name,
                locked,
                Box::pin(async move {
                    let _ = released.await;
                }),
            )
            .await
        })
    };
    is_locked.await.expect("the lock is held");
    job.release.notify_one();
    // The record waits behind the lock (a busy timeout on SQLite, a lock wait on Postgres),
    // then is retried until the lease ends; the lock goes after a while.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = release.send(());
    holder.await.unwrap().unwrap();
    let round = round.await.unwrap().unwrap();
    assert_eq!((round.claimed, round.done, round.unrecorded), (1, 1, 0));
    let summary = get(&pool, &sql, &key("hold", "000")).await;
    assert_eq!((summary.state, summary.attempts), (JobState::Done, 1));
    assert_eq!(job.runs.lock().unwrap()[&key("hold", "000")], 1);
}

/// A database that goes away while a job runs leaves the job unrecorded (never done), and it is
/// claimed again once the lease ends; a round on a database that is gone fails.
pub async fn a_database_gone_mid_batch_fails_the_round<DB: Fixture>(
    pool: sqlx::Pool<DB>,
    name: String,
) where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = Arc::new(DB::statements(table(&name)));
    DB::add(&pool, &name, "hold", "000", "x", 1_000)
        .await
        .unwrap();
    let options = (*pool.connect_options()).clone();
    let doomed = sqlx::Pool::<DB>::connect_with(options).await.unwrap();
    let job = Recording::default();
    let mut settings = settings(3);
    settings.lease = Duration::from_millis(300);
    settings.keep_leases = false;
    let worker = Worker::new(
        doomed.clone(),
        sql.clone(),
        job.clone(),
        settings,
        Arc::new(Notify::new()),
    );
    let started = job.started.notified();
    let round = {
        let worker = worker.clone();
        tokio::spawn(async move { worker.run_once().await })
    };
    started.await;
    doomed.close().await;
    job.release.notify_one();
    let round = round.await.unwrap().unwrap();
    assert_eq!((round.claimed, round.done, round.unrecorded), (1, 0, 1));
    assert!(
        worker.run_once().await.is_err(),
        "a round on a closed pool succeeded"
    );
    let summary = get(&pool, &sql, &key("hold", "000")).await;
    assert_eq!((summary.state, summary.attempts), (JobState::Pending, 1));
    let later = now_ms() + 1_000;
    let again: Vec<Claimed<Body>> = DB::claim_due(&pool, &sql, later, 9, later + LEASE, 3, 10)
        .await
        .unwrap();
    assert_eq!(again.len(), 1, "the unrecorded job was not claimed again");
    assert_eq!(again[0].attempt, 2);
}

/// The suite's [`Source`](crate::Source): sweeps with the driver's `exhaust` and `due`, claims a
/// batch with `claim_keys` and records each run with `complete`.
struct SuiteSource<DB: Driver> {
    pool: sqlx::Pool<DB>,
    sql: Arc<crate::Statements>,
    job: Recording,
}

impl<DB: Fixture> crate::Source for SuiteSource<DB>
where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    type Key = JobKey;

    async fn sweep(&mut self, swept: &mut std::collections::VecDeque<JobKey>) -> bool {
        let now = now_ms();
        let _ = DB::exhaust(&self.pool, &self.sql, now, 3).await;
        let due = DB::due(&self.pool, &self.sql, now, 16, 3)
            .await
            .unwrap_or_default();
        let full = due.len() >= 16;
        *swept = due.into();
        full
    }

    fn start(
        &self,
        batch: Vec<(JobKey, tokio::sync::OwnedSemaphorePermit)>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (pool, sql, job) = (self.pool.clone(), self.sql.clone(), self.job.clone());
        async move {
            let keys: Vec<JobKey> = batch.iter().map(|(key, _)| key.clone()).collect();
            let now = now_ms();
            let claimed: Vec<Claimed<Body>> =
                DB::claim_keys(&pool, &sql, &keys, now, 7, now + LEASE, 3)
                    .await
                    .unwrap_or_default();
            for claimed in claimed {
                let key = claimed.key.clone();
                let _ = Job::<DB>::run(&job, claimed).await;
                let mut conn = pool.acquire().await.unwrap();
                DB::complete(&mut conn, &sql, &key, 7, now_ms(), None)
                    .await
                    .unwrap();
            }
            drop(batch);
        }
    }

    fn stopped(&mut self) {}
}

/// The dispatcher runs fed jobs and jobs only its sweep finds, each once, and its drain
/// answers that nothing was left running.
pub async fn the_dispatcher_runs_fed_and_swept_jobs_once<DB: Fixture>(
    pool: sqlx::Pool<DB>,
    name: String,
) where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = Arc::new(DB::statements(table(&name)));
    add_many(&pool, &name, "a", 10, 1_000).await;
    let job = Recording::default();
    let source = SuiteSource {
        pool: pool.clone(),
        sql: sql.clone(),
        job: job.clone(),
    };
    let (feed, fed) = tokio::sync::mpsc::channel(16);
    for i in 0..5 {
        feed.send(key("a", &format!("{i:03}"))).await.unwrap();
    }
    let dispatcher = crate::Dispatcher::new(source, fed, 4, Duration::from_millis(20));
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let handle = crate::WorkerHandle::new(stop, tokio::spawn(dispatcher.run(stopped)));
    let mut checks = 0;
    while DB::counts(&pool, &sql).await.unwrap().done < 10 {
        checks += 1;
        assert!(checks < 3_000, "the dispatcher did not finish");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(handle.drain(Duration::from_secs(10)).await);
    let runs = job.runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 10);
    assert!(runs.values().all(|&n| n == 1), "a job ran twice: {runs:?}");
}

/// The worker records each attempt: a job that fails five times keeps its first attempt and
/// its last two (numbers, outcomes, status, error, answer, times), one that succeeds its one;
/// with a history of 0 nothing is written; the rows of a deleted job are purged, in batches.
pub async fn the_history_keeps_the_first_and_the_last_attempts<DB: Fixture>(
    pool: sqlx::Pool<DB>,
    name: String,
) where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = Arc::new(DB::statements(table(&name)));
    add_many(&pool, &name, "error", 1, 1_000).await;
    add_many(&pool, &name, "ok", 1, 1_000).await;
    add_many(&pool, &name, "quiet", 1, 1_000).await;
    let mut kept = settings(5);
    kept.history = 2;
    let before = now_ms();
    let worker = Worker::new(
        pool.clone(),
        sql.clone(),
        Recording::default(),
        kept,
        Arc::new(Notify::new()),
    );
    let mut rounds = 0;
    while DB::counts(&pool, &sql).await.unwrap().failed < 1 {
        rounds += 1;
        assert!(rounds < 100, "the failing job did not end");
        worker.run_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let failing = DB::attempts(&pool, &sql, &key("error", "000"))
        .await
        .unwrap();
    let shown: Vec<(u32, AttemptOutcome)> =
        failing.iter().map(|a| (a.attempt, a.outcome)).collect();
    assert_eq!(
        shown,
        [
            (1, AttemptOutcome::Retried),
            (4, AttemptOutcome::Retried),
            (5, AttemptOutcome::Failed)
        ]
    );
    for attempt in &failing {
        assert_eq!(attempt.status, Some(503));
        let error = format!("unavailable on attempt {}", attempt.attempt);
        assert_eq!(attempt.error.as_deref(), Some(error.as_str()));
        let answer = format!("{{\"attempt\": {}}}", attempt.attempt);
        assert_eq!(attempt.response.as_deref(), Some(answer.as_str()));
        assert!(attempt.started_at_ms >= before && attempt.started_at_ms <= now_ms());
    }
    let ok = DB::attempts(&pool, &sql, &key("ok", "000")).await.unwrap();
    assert_eq!(ok.len(), 1, "{ok:?}");
    assert_eq!(
        (
            ok[0].attempt,
            ok[0].outcome,
            ok[0].status,
            ok[0].error.as_deref()
        ),
        (1, AttemptOutcome::Done, Some(200), None)
    );
    assert_eq!(ok[0].response.as_deref(), Some("ok"));

    // No history: the job runs and nothing is recorded.
    let mut quiet = settings(5);
    quiet.history = 0;
    let ran = Worker::new(
        pool.clone(),
        sql.clone(),
        Recording::default(),
        quiet,
        Arc::new(Notify::new()),
    );
    DB::add(&pool, &name, "quiet", "001", "{}", 1_000)
        .await
        .unwrap();
    ran.run_once().await.unwrap();
    assert_eq!(
        get(&pool, &sql, &key("quiet", "001")).await.state,
        JobState::Done
    );
    assert!(DB::attempts(&pool, &sql, &key("quiet", "001"))
        .await
        .unwrap()
        .is_empty());

    // The rows of deleted jobs go with the purge of orphans, a batch at a time.
    let delete = format!("DELETE FROM {name} WHERE kind = 'error'");
    DB::run_script(&pool, &delete).await.unwrap();
    assert_eq!(DB::purge_attempts(&pool, &sql, 2).await.unwrap(), 2);
    assert_eq!(DB::purge_attempts(&pool, &sql, 2).await.unwrap(), 1);
    assert_eq!(DB::purge_attempts(&pool, &sql, 2).await.unwrap(), 0);
    assert!(DB::attempts(&pool, &sql, &key("error", "000"))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        DB::attempts(&pool, &sql, &key("ok", "000"))
            .await
            .unwrap()
            .len(),
        1
    );
}

/// The activity counts the jobs enqueued, done and failed in each minute of the hour, and
/// finds the oldest job pending at each minute's end among those pending now and those that
/// finished later; jobs enqueued or finished before the hour are not counted.
pub async fn activity_counts_each_minute_and_its_lag<DB: Fixture>(
    pool: sqlx::Pool<DB>,
    name: String,
) where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    use crate::chart::{window_start, MINUTES, MINUTE_MS};
    let sql = DB::statements(table(&name));
    // Half a minute into the current minute; `at(i)` is the start of the window's minute `i`.
    let now = 30_000_000 * MINUTE_MS + 30_000;
    let at = |i: i64| window_start(now) + i * MINUTE_MS;
    let empty = DB::activity(&pool, &sql, now).await.unwrap();
    assert_eq!(empty.start_ms, at(0));
    assert_eq!(empty.minutes.len(), MINUTES);
    assert_eq!(empty.totals(), (0, 0, 0));
    assert!(empty
        .minutes
        .iter()
        .all(|m| m.oldest_pending_secs.is_none()));

    // Enqueued before the window, done in minute 4: pending at the ends of minutes 0 to 3.
    DB::add(&pool, &name, "a", "early", "x", at(0) - 10 * MINUTE_MS)
        .await
        .unwrap();
    // Enqueued and finished before the window: nowhere.
    DB::add(&pool, &name, "a", "gone", "x", at(0) - 20 * MINUTE_MS)
        .await
        .unwrap();
    // Enqueued in minute 2 (the last millisecond) and minute 10; failed in minute 12.
    DB::add(&pool, &name, "a", "m2", "x", at(3) - 1)
        .await
        .unwrap();
    DB::add(&pool, &name, "a", "m10", "x", at(10) + 1_000)
        .await
        .unwrap();
    // Enqueued in minute 30 and discarded at the start of minute 31 (not counted as failed).
    DB::add(&pool, &name, "a", "m30", "x", at(30))
        .await
        .unwrap();
    // Enqueued in minute 40 and pending still; and two in the current minute, one done.
    DB::add(&pool, &name, "a", "m40", "x", at(40) + 5_000)
        .await
        .unwrap();
    DB::add(&pool, &name, "a", "m59a", "x", at(59))
        .await
        .unwrap();
    DB::add(&pool, &name, "a", "m59b", "x", at(59) + 1)
        .await
        .unwrap();

    let claimed: Vec<Claimed<Body>> = DB::claim_keys(
        &pool,
        &sql,
        &[
            key("a", "early"),
            key("a", "gone"),
            key("a", "m2"),
            key("a", "m10"),
            key("a", "m59a"),
        ],
        now,
        1,
        now + LEASE,
        5,
    )
    .await
    .unwrap();
    assert_eq!(claimed.len(), 5);
    let mut conn = pool.acquire().await.unwrap();
    for (id, finished) in [
        ("gone", at(0) - 1),
        ("early", at(4) + 100),
        ("m59a", now - 1),
    ] {
        assert!(
            DB::complete(&mut conn, &sql, &key("a", id), 1, finished, None)
                .await
                .unwrap()
        );
    }
    drop(conn);
    // Failed for good: m2 at the start of minute 12, m10 in minute 12 too.
    for (id, finished) in [("m2", at(12)), ("m10", at(12) + 59_999)] {
        assert!(DB::fail(
            &pool,
            &sql,
            &key("a", id),
            1,
            finished,
            0,
            finished,
            "x",
            None
        )
        .await
        .unwrap());
    }
    assert!(DB::discard(&pool, &sql, &key("a", "m30"), at(31))
        .await
        .unwrap());

    let activity = DB::activity(&pool, &sql, now).await.unwrap();
    let m = &activity.minutes;
    let received: Vec<(usize, u64)> = (0..MINUTES)
        .filter(|&i| m[i].received > 0)
        .map(|i| (i, m[i].received))
        .collect();
    assert_eq!(received, [(2, 1), (10, 1), (30, 1), (40, 1), (59, 2)]);
    let done: Vec<(usize, u64)> = (0..MINUTES)
        .filter(|&i| m[i].done > 0)
        .map(|i| (i, m[i].done))
        .collect();
    assert_eq!(done, [(4, 1), (59, 1)]);
    let failed: Vec<(usize, u64)> = (0..MINUTES)
        .filter(|&i| m[i].failed > 0)
        .map(|i| (i, m[i].failed))
        .collect();
    assert_eq!(failed, [(12, 2)]);
    assert_eq!(activity.totals(), (6, 2, 2));

    // The age at minute `i`'s end of a job enqueued at `from`, in whole seconds.
    let age = |i: i64, from: i64| Some(u64::try_from((at(i + 1) - from) / 1000).unwrap());
    let lag: Vec<Option<u64>> = m.iter().map(|m| m.oldest_pending_secs).collect();
    let early = at(0) - 10 * MINUTE_MS;
    for i in 0..4 {
        assert_eq!(lag[i as usize], age(i, early), "minute {i}: the early job");
    }
    for i in 4..12 {
        assert_eq!(
            lag[i as usize],
            age(i, at(3) - 1),
            "minute {i}: m2 (enqueued in minute 2)"
        );
    }
    assert!(lag[12..30].iter().all(Option::is_none), "{lag:?}");
    assert_eq!(lag[30], age(30, at(30)), "m30 until its discard");
    assert!(lag[31..40].iter().all(Option::is_none), "{lag:?}");
    for i in 40..59 {
        assert_eq!(lag[i as usize], age(i, at(40) + 5_000), "minute {i}: m40");
    }
    assert_eq!(
        lag[59],
        Some(u64::try_from((now - at(40) - 5_000) / 1000).unwrap())
    );
}

/// Audit entries read back as they were stored, newest first, up to the limit; an action this
/// version does not know reads as `None`.
pub async fn the_audit_lists_the_newest_entries_first<DB: Fixture>(
    pool: sqlx::Pool<DB>,
    name: String,
) {
    use crate::audit::{AuditAction, AuditEntry};

    let sql = DB::statements(table(&name));
    assert!(DB::audit_log(&pool, &sql, 10).await.unwrap().is_empty());
    let entries = [
        AuditEntry::now("alice", AuditAction::Retry, "kind/id-1", 1),
        AuditEntry::now("bob \u{e9}", AuditAction::BulkReplay, "type=x.y", 250),
        AuditEntry::now(
            "carol",
            AuditAction::Purge,
            "finished more than 60 s ago",
            0,
        ),
    ];
    for entry in &entries {
        crate::audit::record(&pool, &sql, entry).await.unwrap();
    }
    let listed = DB::audit_log(&pool, &sql, 2).await.unwrap();
    assert_eq!(listed, [entries[2].clone(), entries[1].clone()]);
    let all = DB::audit_log(&pool, &sql, 10).await.unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(all[2], entries[0]);
}

/// A paused scope's claimed jobs are parked by the worker: pending, their attempts given back,
/// claimed by no claim nor sweep, while another scope's run; a second set of statements (a
/// restart) sees the pause; a resume makes them due, and they run once.
pub async fn a_paused_scope_parks_its_jobs_until_resumed<DB: Fixture>(
    pool: sqlx::Pool<DB>,
    name: String,
) where
    Body: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = Arc::new(DB::statements(table(&name)));
    add_many(&pool, &name, "a", 2, 1_000).await;
    add_many(&pool, &name, "b", 1, 1_000).await;
    assert!(DB::pause(&pool, &sql, "a", 5, "tester").await.unwrap());
    assert!(!DB::pause(&pool, &sql, "a", 6, "other").await.unwrap());
    let job = Recording::default();
    let worker = Worker::new(
        pool.clone(),
        sql.clone(),
        job.clone(),
        settings(3),
        Arc::new(Notify::new()),
    );
    let round = worker.run_once().await.unwrap();
    assert_eq!((round.claimed, round.done, round.parked), (3, 1, 2));
    let round = worker.run_once().await.unwrap();
    assert_eq!(round.claimed, 0, "a parked job was claimed again");
    for id in ["000", "001"] {
        let parked = get(&pool, &sql, &key("a", id)).await;
        assert_eq!(parked.state, JobState::Pending);
        assert_eq!(parked.attempts, 0, "a parked job spent an attempt");
        assert_eq!(parked.available_at_ms, crate::PARKED_AT);
        assert!(DB::attempts(&pool, &sql, &key("a", id))
            .await
            .unwrap()
            .is_empty());
    }
    assert!(job.runs.lock().unwrap().get(&key("a", "000")).is_none());
    let now = now_ms();
    let keys = [key("a", "000"), key("a", "001")];
    let by_key: Vec<Claimed<Body>> = DB::claim_keys(&pool, &sql, &keys, now, 7, now + LEASE, 5)
        .await
        .unwrap();
    assert!(by_key.is_empty(), "a parked job was claimed by key");
    assert!(DB::due(&pool, &sql, now, 10, 5).await.unwrap().is_empty());
    assert_eq!(DB::counts(&pool, &sql).await.unwrap().pending, 2);

    // Another instance's statements read the same pause.
    let restarted = DB::statements(table(&name));
    let pauses = DB::pauses(&pool, &restarted).await.unwrap();
    assert_eq!(pauses.len(), 1);
    assert_eq!(
        (
            pauses[0].scope.as_str(),
            pauses[0].paused_at_ms,
            pauses[0].by.as_str()
        ),
        ("a", 5, "tester")
    );
    // Parking is fenced by the claim and by the pause.
    DB::add(&pool, &name, "c", "000", "c 000", 1_000)
        .await
        .unwrap();
    let claimed: Vec<Claimed<Body>> = DB::claim_keys(
        &pool,
        &restarted,
        &[key("c", "000")],
        now,
        8,
        now + LEASE,
        5,
    )
    .await
    .unwrap();
    assert_eq!(claimed.len(), 1);
    assert!(!DB::park(&pool, &restarted, &key("c", "000"), 9, "a")
        .await
        .unwrap());
    assert!(!DB::park(&pool, &restarted, &key("c", "000"), 8, "c")
        .await
        .unwrap());
    assert!(DB::park(&pool, &restarted, &key("c", "000"), 8, "a")
        .await
        .unwrap());
    assert_eq!(get(&pool, &sql, &key("c", "000")).await.attempts, 0);

    assert!(!DB::resume(&pool, &restarted, "none", now).await.unwrap());
    assert!(DB::resume(&pool, &restarted, "a", now).await.unwrap());
    assert!(DB::pauses(&pool, &sql).await.unwrap().is_empty());
    let parked = get(&pool, &sql, &key("a", "000")).await;
    assert_eq!(parked.available_at_ms, now);
    let mut rounds = 0;
    while DB::counts(&pool, &sql).await.unwrap().done < 4 {
        rounds += 1;
        assert!(rounds < 10, "the resumed jobs did not run");
        worker.run_once().await.unwrap();
    }
    let runs = job.runs.lock().unwrap().clone();
    for job in [key("a", "000"), key("a", "001"), key("c", "000")] {
        assert_eq!(runs[&job], 1, "{job:?}");
        assert_eq!(get(&pool, &sql, &job).await.attempts, 1);
    }
}
