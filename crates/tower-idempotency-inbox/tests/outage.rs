//! A `200` means stored, over real HTTP on a SQLite file and on Postgres, while the database is
//! locked, cut off or refusing a row: copies of one key in one batch share the first copy's
//! outcome; an outage fails the queued acknowledgements at once (not row by row, one busy
//! timeout each); every acknowledgement has a deadline; the queue of waiting deliveries is
//! bounded.
//!
//! The database is held by the test: on SQLite a connection of its own in `BEGIN IMMEDIATE` (the
//! write lock), on Postgres a transaction holding `LOCK TABLE .. ACCESS EXCLUSIVE` on the inbox
//! table. "Cut" terminates, on Postgres, the backends waiting on that lock (their connections
//! fail); on SQLite the busy timeout of the inbox's pool ends the wait.

#[macro_use]
mod common;

use std::{
    path::PathBuf,
    str::FromStr,
    time::{Duration, Instant},
};

use common::*;
use futures_util::future::join_all;
use tokio::task::JoinHandle;
use tower_idempotency_inbox::{EventKey, Inbox};
use tower_idempotency_sqlx::sqlx::{self, Executor};
use tower_idempotency_webhooks::stripe;

/// A bound no answer in these tests comes near unless the code under test hangs.
const HANG: Duration = Duration::from_secs(30);

/// A database whose inbox the test can lock and cut off.
trait Held: Fixture {
    /// A pool whose waits for a lock end after `busy` (SQLite's busy timeout; Postgres waits
    /// until the lock is released or the backend is terminated).
    async fn pool(busy: Duration) -> (sqlx::Pool<Self>, String, Option<PathBuf>);
    /// Holds the inbox table until the returned connection is dropped.
    async fn hold(pool: &sqlx::Pool<Self>, table: &str) -> sqlx::pool::PoolConnection<Self>;
    /// Ends the hold: rolls the holding transaction back before the connection goes back to the
    /// pool (which does not know it began one).
    async fn release(held: sqlx::pool::PoolConnection<Self>);
    /// Ends the lock waits of the inbox's connections with a connection failure; answers how
    /// many were cut (always 0 on SQLite, where the busy timeout ends them).
    async fn cut(pool: &sqlx::Pool<Self>, table: &str) -> i64;
}

impl Held for sqlx::Sqlite {
    async fn release(mut held: sqlx::pool::PoolConnection<Self>) {
        held.execute("ROLLBACK").await.unwrap();
    }

    async fn pool(busy: Duration) -> (sqlx::SqlitePool, String, Option<PathBuf>) {
        let dir = std::env::temp_dir().join(format!("tidem-outage-{}", suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}/inbox.db", dir.display());
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(&url)
            .unwrap()
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(busy);
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .unwrap();
        (pool, format!("t{}", suffix()), Some(dir))
    }

    async fn hold(pool: &sqlx::SqlitePool, _table: &str) -> sqlx::pool::PoolConnection<Self> {
        let mut conn = pool.acquire().await.unwrap();
        conn.execute("BEGIN IMMEDIATE").await.unwrap();
        conn
    }

    async fn cut(_pool: &sqlx::SqlitePool, _table: &str) -> i64 {
        0
    }
}

impl Held for sqlx::Postgres {
    async fn release(mut held: sqlx::pool::PoolConnection<Self>) {
        held.execute("ROLLBACK").await.unwrap();
    }

    async fn pool(_busy: Duration) -> (sqlx::PgPool, String, Option<PathBuf>) {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(&database_url())
            .await
            .expect("Postgres at DATABASE_URL");
        (pool, format!("t{}", suffix()), None)
    }

    async fn hold(pool: &sqlx::PgPool, table: &str) -> sqlx::pool::PoolConnection<Self> {
        let mut conn = pool.acquire().await.unwrap();
        conn.execute("BEGIN").await.unwrap();
        conn.execute(sqlx::AssertSqlSafe(
            format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE").as_str(),
        ))
        .await
        .unwrap();
        conn
    }

    async fn cut(pool: &sqlx::PgPool, table: &str) -> i64 {
        let cut = format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO {table} %' \
             AND pid <> pg_backend_pid()"
        );
        sqlx::query_scalar(sqlx::AssertSqlSafe(&*cut))
            .fetch_one(pool)
            .await
            .unwrap()
    }
}

/// One test's inbox, served over HTTP.
struct Outage<DB: Held> {
    pool: sqlx::Pool<DB>,
    inbox: Inbox<DB>,
    table: String,
    url: String,
    dir: Option<PathBuf>,
}

impl<DB: Held> Outage<DB> {
    async fn new(busy: Duration, configure: impl FnOnce(Inbox<DB>) -> Inbox<DB>) -> Self {
        let (pool, prefix, dir) = DB::pool(busy).await;
        let table = format!("{prefix}_inbox");
        let inbox = configure(Inbox::new(pool.clone(), &table).unwrap());
        inbox.migrate().await.unwrap();
        let url = serve(&inbox).await;
        Self {
            pool,
            inbox,
            table,
            url,
            dir,
        }
    }

    /// Delivers `id` on a task of its own; answers its status and `Retry-After`.
    fn send(&self, id: &str) -> JoinHandle<(u16, Option<String>)> {
        let (url, body) = (self.url.clone(), event_body(id, "charge.succeeded"));
        tokio::spawn(async move {
            let now = tower_idempotency_testkit::unix_now();
            let response = reqwest::Client::new()
                .post(&url)
                .header(
                    stripe::SIGNATURE_HEADER,
                    stripe::sign(SECRET, now, body.as_bytes()),
                )
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .expect("the inbox answers");
            let retry_after = response
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            (response.status().as_u16(), retry_after)
        })
    }

    /// Waits until the inbox has sent `n` statements in all (a signal that an insert is in
    /// flight: the statement is counted as it is sent).
    async fn sent(&self, n: u64) {
        let deadline = Instant::now() + HANG;
        while self.inbox.statements_executed() < n {
            assert!(Instant::now() < deadline, "no insert was sent");
            tokio::task::yield_now().await;
        }
    }

    /// Waits until `n` deliveries are queued behind the batch in flight.
    async fn queued(&self, n: usize) {
        let deadline = Instant::now() + HANG;
        while self.inbox.acks_waiting() < n {
            assert!(Instant::now() < deadline, "the deliveries never queued");
            tokio::task::yield_now().await;
        }
    }

    /// Awaits every answer of `sent` while the database stays held, cutting (on Postgres) every
    /// insert that waits on the hold until all are answered.
    async fn answered_while_cut(
        &self,
        sent: Vec<JoinHandle<(u16, Option<String>)>>,
    ) -> Vec<(u16, Option<String>)> {
        tokio::time::timeout(HANG, async {
            while !sent.iter().all(|s| s.is_finished()) {
                DB::cut(&self.pool, &self.table).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answers(sent).await
        })
        .await
        .expect("every delivery is answered while the database is unavailable")
    }

    /// Whether `id` is stored.
    async fn stored(&self, id: &str) -> bool {
        let key = EventKey::new("stripe", id);
        self.inbox.get(&key).await.unwrap().is_some()
    }

    async fn cleanup(self) {
        DB::drop_tables(&self.pool, &[self.table.as_str()]).await;
        self.pool.close().await;
        if let Some(dir) = self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Awaits every answer, failing the test when one hangs.
async fn answers(sent: Vec<JoinHandle<(u16, Option<String>)>>) -> Vec<(u16, Option<String>)> {
    tokio::time::timeout(HANG, join_all(sent))
        .await
        .expect("every delivery is answered")
        .into_iter()
        .map(|answer| answer.unwrap())
        .collect()
}

/// The database refuses the row of `evt_refused` (a trigger); two copies of it, queued behind a
/// batch in flight, go into the next batch together with five good events: both copies are
/// answered `503` (neither is a "duplicate" of a row that was never stored), the five `200`.
async fn copies_of_a_refused_row_share_its_failure<DB: Held>() {
    let setup = Outage::<DB>::new(Duration::from_secs(30), |inbox| inbox).await;
    let table = &setup.table;
    refuse_row(&setup.pool, table, "evt_refused").await;
    let held = DB::hold(&setup.pool, table).await;
    let first = setup.send("evt_first");
    setup.sent(1).await;
    let good = ids("evt_good", 5);
    let mut batch = vec![setup.send("evt_refused"), setup.send("evt_refused")];
    batch.extend(good.iter().map(|id| setup.send(id)));
    setup.queued(7).await;
    DB::release(held).await;
    assert_eq!(answers(vec![first]).await[0].0, 200, "{}", DB::LABEL);
    let answered = answers(batch).await;
    let statuses: Vec<u16> = answered.iter().map(|a| a.0).collect();
    assert_eq!(statuses[..2], [503, 503], "{}: {statuses:?}", DB::LABEL);
    assert!(
        statuses[2..].iter().all(|&s| s == 200),
        "{}: {statuses:?}",
        DB::LABEL
    );
    assert!(!setup.stored("evt_refused").await, "{}", DB::LABEL);
    for id in &good {
        assert!(setup.stored(id).await, "{}: {id}", DB::LABEL);
    }
    drop_refusal_on(&setup.pool, table).await;
    setup.cleanup().await;
}

/// The database goes away under a batch in flight (SQLite: the write lock held past the busy
/// timeout; Postgres: the waiting backend terminated), with two copies of one event queued
/// behind it: every delivery is answered `503`, none `200`, and none is stored. Once the
/// database is back, the provider's retry is stored and answered `200`.
async fn copies_behind_an_outage_are_never_answered_stored<DB: Held>() {
    let setup = Outage::<DB>::new(Duration::from_millis(500), |inbox| inbox).await;
    let held = DB::hold(&setup.pool, &setup.table).await;
    let first = setup.send("evt_x");
    setup.sent(1).await;
    let copies = vec![setup.send("evt_a"), setup.send("evt_a")];
    setup.queued(2).await;
    // Cut every insert that waits on the lock until all three are answered.
    let mut sent = vec![first];
    sent.extend(copies);
    let answered = setup.answered_while_cut(sent).await;
    DB::release(held).await;
    for (status, retry_after) in &answered {
        assert_eq!(*status, 503, "{}: {answered:?}", DB::LABEL);
        assert!(retry_after.is_some(), "{}: {answered:?}", DB::LABEL);
    }
    assert!(!setup.stored("evt_a").await, "{}", DB::LABEL);
    assert_eq!(answers(vec![setup.send("evt_a")]).await[0].0, 200);
    assert!(setup.stored("evt_a").await, "{}", DB::LABEL);
    setup.cleanup().await;
}

/// An outage answers the deliveries queued behind the failed batch at once, without a
/// statement each: six deliveries queued behind one whose insert timed out on SQLite's busy
/// lock cost no further statement (row by row, each would wait one busy timeout).
async fn an_outage_fails_the_queue_without_a_statement_each<DB: Held>() {
    let setup = Outage::<DB>::new(Duration::from_millis(500), |inbox| inbox).await;
    let held = DB::hold(&setup.pool, &setup.table).await;
    let first = setup.send("evt_first");
    setup.sent(1).await;
    let queued: Vec<_> = ids("evt_queued", 6)
        .iter()
        .map(|id| setup.send(id))
        .collect();
    setup.queued(6).await;
    let mut sent = vec![first];
    sent.extend(queued);
    let answered = setup.answered_while_cut(sent).await;
    let statements = setup.inbox.statements_executed();
    DB::release(held).await;
    assert!(
        answered.iter().all(|a| a.0 == 503),
        "{}: {answered:?}",
        DB::LABEL
    );
    assert_eq!(statements, 1, "{}: statements sent", DB::LABEL);
    setup.cleanup().await;
}

/// With the table held far longer than the acknowledgement deadline (1 s here), every delivery
/// is answered `503` with `Retry-After` while the lock is still held; once it is released, a
/// retry of each is answered `200` and stored once.
async fn every_acknowledgement_has_a_deadline<DB: Held>() {
    let deadline = Duration::from_secs(1);
    let setup = Outage::<DB>::new(HANG * 2, |inbox| inbox.ack_deadline(deadline)).await;
    let held = DB::hold(&setup.pool, &setup.table).await;
    let ids = ids("evt_deadline", 5);
    let started = Instant::now();
    let answered = answers(ids.iter().map(|id| setup.send(id)).collect()).await;
    let waited = started.elapsed();
    DB::release(held).await;
    for (status, retry_after) in &answered {
        assert_eq!(*status, 503, "{}: {answered:?}", DB::LABEL);
        assert!(retry_after.is_some(), "{}: {answered:?}", DB::LABEL);
    }
    assert!(
        waited >= deadline,
        "{}: answered before the deadline",
        DB::LABEL
    );
    let retried = answers(ids.iter().map(|id| setup.send(id)).collect()).await;
    assert!(
        retried.iter().all(|a| a.0 == 200),
        "{}: {retried:?}",
        DB::LABEL
    );
    let counts = setup.inbox.counts().await.unwrap();
    assert_eq!(counts.pending, 5, "{}", DB::LABEL);
    setup.cleanup().await;
}

/// With at most two deliveries waiting, five sent behind a held batch: three are answered
/// `503` at once (while the table is still held), the two that waited are stored once it is
/// released.
async fn a_full_queue_answers_at_once<DB: Held>() {
    let setup = Outage::<DB>::new(HANG * 2, |inbox| {
        inbox.max_waiting_acks(2).ack_deadline(HANG * 2)
    })
    .await;
    let held = DB::hold(&setup.pool, &setup.table).await;
    let first = setup.send("evt_first");
    setup.sent(1).await;
    let waiting = vec![setup.send("evt_w_0"), setup.send("evt_w_1")];
    setup.queued(2).await;
    let refused = answers(ids("evt_full", 3).iter().map(|id| setup.send(id)).collect()).await;
    assert!(
        refused.iter().all(|a| a.0 == 503 && a.1.is_some()),
        "{}: {refused:?}",
        DB::LABEL
    );
    assert!(!waiting.iter().any(|w| w.is_finished()), "{}", DB::LABEL);
    DB::release(held).await;
    let mut stored = vec![first];
    stored.extend(waiting);
    assert!(
        answers(stored).await.iter().all(|a| a.0 == 200),
        "{}",
        DB::LABEL
    );
    assert_eq!(
        setup.inbox.counts().await.unwrap().pending,
        3,
        "{}",
        DB::LABEL
    );
    setup.cleanup().await;
}

on_both!(
    copies_of_a_refused_row_share_its_failure,
    copies_behind_an_outage_are_never_answered_stored,
    an_outage_fails_the_queue_without_a_statement_each,
    every_acknowledgement_has_a_deadline,
    a_full_queue_answers_at_once,
);
