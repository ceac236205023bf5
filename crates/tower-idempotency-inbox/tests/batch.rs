//! The worker's batched claims, over real HTTP on a SQLite file and on Postgres (each test with
//! tables of its own): a batch claim that fails, a worker dropped with a batch running, two
//! workers on one table, slow handlers inside a batch, and the statements a backlog costs.

#[macro_use]
mod common;

use std::time::Duration;

use common::*;
use tower_idempotency_inbox::{EventState, Inbox, InboxWorker};
use tower_idempotency_sqlx::sqlx;

/// Waits until every one of `ids` is processed, drains `workers` (no attempt runs or starts
/// after that), then asserts that each ran once, on its first attempt, with one effect: a second
/// run that started after the event was processed is counted too.
async fn each_processed_once<DB: Fixture>(
    setup: &Setup<DB>,
    probe: &Probe,
    ids: &[String],
    workers: impl IntoIterator<Item = InboxWorker>,
) {
    for id in ids {
        setup.wait_for(id, EventState::Processed).await;
    }
    for worker in workers {
        assert!(worker.drain(Duration::from_secs(30)).await, "{}", DB::LABEL);
    }
    for id in ids {
        let event = setup.event(id).await;
        assert_eq!(event.state, EventState::Processed, "{}: {id}", DB::LABEL);
        assert_eq!(event.attempts, 1, "{}: {id}", DB::LABEL);
        assert_eq!(probe.runs(id), 1, "{}: {id}", DB::LABEL);
        assert_eq!(setup.effects(id).await, 1, "{}: {id}", DB::LABEL);
    }
}

/// Waits until the inbox has sent `n` more statements than `before`.
async fn wait_statements<DB: Fixture>(inbox: &Inbox<DB>, before: u64, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while inbox.statements_executed() < before + n {
        assert!(std::time::Instant::now() < deadline, "{}", DB::LABEL);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A trigger refuses every claim (any update of `attempts`) while a flag is set: 40 events are
/// acknowledged over HTTP and the worker's batch claims fail again and again (no handler runs,
/// nothing is lost); once the flag is cleared, each event is processed once, on its first
/// attempt.
async fn failed_batch_claim_loses_nothing<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let (table, flag) = (&setup.inbox_table, format!("{}_flag", setup.inbox_table));
    // The flag's column type, and its set and cleared values, in each dialect.
    let (kind, set, clear) = if DB::LABEL == "postgres" {
        ("boolean", "true", "false")
    } else {
        ("INTEGER", "1", "0")
    };
    DB::exec(
        &setup.pool,
        &format!("CREATE TABLE {flag} (fail {kind} NOT NULL)"),
    )
    .await;
    DB::exec(&setup.pool, &format!("INSERT INTO {flag} VALUES ({set})")).await;
    if DB::LABEL == "postgres" {
        let function = format!(
            "CREATE FUNCTION {flag}_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF (SELECT fail FROM {flag}) THEN RAISE EXCEPTION 'claims refused'; END IF; \
             RETURN NEW; END $$"
        );
        DB::exec(&setup.pool, &function).await;
        let trigger = format!(
            "CREATE TRIGGER {flag}_refuse BEFORE UPDATE OF attempts ON {table} \
             FOR EACH ROW EXECUTE FUNCTION {flag}_refuse()"
        );
        DB::exec(&setup.pool, &trigger).await;
    } else {
        let trigger = format!(
            "CREATE TRIGGER {flag}_refuse BEFORE UPDATE OF attempts ON {table} \
             WHEN (SELECT fail FROM {flag}) = 1 \
             BEGIN SELECT RAISE(ABORT, 'claims refused'); END"
        );
        DB::exec(&setup.pool, &trigger).await;
    }
    let probe = setup.probe();
    let worker = quick(setup.inbox.worker(probe.handler::<DB>()))
        .concurrency(8)
        .spawn();
    let sender = Sender::new(&setup.inbox).await;
    let before = setup.inbox.statements_executed();
    let all = sender.deliver("evt_refused", 40, "charge.succeeded").await;
    // Acknowledgements, then claims and sweeps (at least a few sweeps' worth) that all fail.
    wait_statements(&setup.inbox, before, 100).await;
    assert_eq!(probe.total_runs(), 0, "{}", DB::LABEL);
    let counts = setup.inbox.counts().await.unwrap();
    assert_eq!(counts.pending, 40, "{}", DB::LABEL);
    DB::exec(&setup.pool, &format!("UPDATE {flag} SET fail = {clear}")).await;
    each_processed_once(&setup, &probe, &all, [worker]).await;
    assert_eq!(probe.total_runs(), 40, "{}", DB::LABEL);
    DB::drop_tables(&setup.pool, &[&flag]).await;
    drop_refusal(&setup, &flag).await;
    setup.cleanup().await;
}

/// Six gated events, acknowledged before the worker starts, claimed by a worker with twelve
/// handlers (in batches), which is stopped without a grace period once a handler runs and two or
/// more are claimed: the running transactions roll back (no effect). A second worker attempts
/// them again once their 1 s lease ends; each is then processed once (one effect, one more run,
/// one more attempt). On SQLite one handler at a time holds the write lock; the others wait for
/// it in their claimed attempt (and so would an acknowledgement, which is why every event is
/// acknowledged before the first handler runs).
async fn worker_aborted_mid_batch_processes_each_once<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let sender = Sender::new(&setup.inbox).await;
    let all = sender.deliver("evt_crash", 6, "test.gated").await;
    let first = quick(setup.inbox.worker(probe.handler::<DB>()))
        .concurrency(12)
        .lease(Duration::from_millis(1000))
        .spawn();
    probe.wait_started(1).await;
    // At least a batch claimed: on SQLite a claim after the first batch waits for the write
    // lock the gated handler holds, so not every event need be claimed yet.
    let attempts = || async {
        let mut attempts = Vec::new();
        for id in &all {
            let key = tower_idempotency_inbox::EventKey::new("stripe", id.as_str());
            attempts.push(setup.inbox.get(&key).await.unwrap().unwrap().attempts);
        }
        attempts
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while attempts().await.iter().filter(|&&n| n > 0).count() < 2 {
        assert!(std::time::Instant::now() < deadline, "{}", DB::LABEL);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Aborts the running attempts at once (as dropping it does, but waiting for the abort: on
    // SQLite the dispatcher may be waiting for the write lock the gated handler holds).
    assert!(!first.drain(Duration::ZERO).await, "{}", DB::LABEL);
    let runs_before: Vec<u32> = all.iter().map(|id| probe.runs(id)).collect();
    let claimed_before = attempts().await;
    for id in &all {
        assert_eq!(setup.effects(id).await, 0, "{}: {id}", DB::LABEL);
    }
    probe.open_gate();
    let second = quick(setup.inbox.worker(probe.handler::<DB>()))
        .concurrency(12)
        .lease(Duration::from_millis(1000))
        .spawn();
    for ((id, before), claimed) in all.iter().zip(runs_before).zip(claimed_before) {
        let attempts = setup.wait_for(id, EventState::Processed).await;
        assert!(attempts > claimed, "{}: {id}", DB::LABEL);
        assert_eq!(probe.runs(id), before + 1, "{}: {id}", DB::LABEL);
        assert_eq!(setup.effects(id).await, 1, "{}: {id}", DB::LABEL);
    }
    assert!(second.drain(Duration::from_secs(30)).await);
    setup.cleanup().await;
}

/// Two inboxes on one table, each with its worker (eight handlers) and its own HTTP route, and
/// 300 events delivered to both alternately, each event to both: once every event is processed
/// and both workers are drained, each ran once, on its first attempt, with one effect.
async fn two_workers_claim_disjoint_batches<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let other = Inbox::new(setup.pool.clone(), &setup.inbox_table).unwrap();
    let probe = setup.probe();
    let workers = [&setup.inbox, &other].map(|inbox| {
        quick(inbox.worker(probe.handler::<DB>()))
            .concurrency(8)
            .spawn()
    });
    let urls = [serve(&setup.inbox).await, serve(&other).await];
    let client = reqwest::Client::new();
    let all = ids("evt_shared", 300);
    for chunk in all.chunks(50) {
        let [a, b] = &urls;
        tokio::join!(
            deliver_all(&client, a, chunk, "charge.succeeded"),
            deliver_all(&client, b, chunk, "charge.succeeded"),
        );
    }
    each_processed_once(&setup, &probe, &all, workers).await;
    assert_eq!(probe.total_runs(), 300, "{}", DB::LABEL);
    let counts = setup.inbox.counts().await.unwrap();
    assert_eq!((counts.processed, counts.failed), (300, 0), "{}", DB::LABEL);
    setup.cleanup().await;
}

/// The claim tokens of the events whose ids start with `prefix`, read from the table: the events
/// one claim statement took share its token.
async fn lease_tokens<DB: Fixture>(setup: &Setup<DB>, prefix: &str) -> Vec<Option<i64>> {
    lease_column(setup, prefix, "lease_token").await
}

/// `column` (a claim's) of the events whose ids start with `prefix`, in the order of their ids.
async fn lease_column<DB: Fixture>(
    setup: &Setup<DB>,
    prefix: &str,
    column: &str,
) -> Vec<Option<i64>> {
    let sql = format!(
        "SELECT {column} FROM {} WHERE event_id LIKE '{prefix}%' ORDER BY event_id",
        setup.inbox_table
    );
    let pool: &dyn std::any::Any = &setup.pool;
    if let Some(pool) = pool.downcast_ref::<sqlx::PgPool>() {
        sqlx::query_scalar(sqlx::AssertSqlSafe(&*sql))
            .fetch_all(pool)
            .await
            .unwrap()
    } else {
        let pool = pool
            .downcast_ref::<sqlx::SqlitePool>()
            .expect("SQLite or Postgres");
        sqlx::query_scalar(sqlx::AssertSqlSafe(&*sql))
            .fetch_all(pool)
            .await
            .unwrap()
    }
}

/// Three handlers that take three times the 1 s lease, acknowledged before the worker starts, so
/// its first sweep finds them together and claims them in one statement: while they run, the
/// three rows hold that statement's one claim token. Ten quick events follow once two have
/// started. Every claim is renewed: once all are processed and the worker drained, each slow
/// event ran once, on its first attempt, and the quick ones are processed too. (On SQLite a
/// handler's transaction takes the write lock at its first statement, after the slow handlers'
/// delay, so the quick events' acknowledgements wait at most for a write.)
async fn slow_handlers_in_a_batch_keep_their_lease<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe().slow(Duration::from_millis(3000));
    let sender = Sender::new(&setup.inbox).await;
    let slow = sender.deliver("evt_slow", 3, "test.slow").await;
    let worker = quick(setup.inbox.worker(probe.handler::<DB>()))
        .concurrency(8)
        .lease(Duration::from_millis(1000))
        .max_attempts(4)
        .spawn();
    probe.wait_started(1).await;
    let tokens = lease_tokens(&setup, "evt_slow").await;
    assert_eq!(tokens.len(), 3, "{}", DB::LABEL);
    assert!(
        tokens[0].is_some() && tokens.iter().all(|t| *t == tokens[0]),
        "{}: the slow events were not claimed in one statement: {tokens:?}",
        DB::LABEL
    );
    probe.wait_started(2).await;
    let quick_ids = sender.deliver("evt_quick", 10, "charge.succeeded").await;
    let all: Vec<String> = quick_ids.into_iter().chain(slow).collect();
    each_processed_once(&setup, &probe, &all, [worker]).await;
    let counts = setup.inbox.counts().await.unwrap();
    assert_eq!((counts.processed, counts.failed), (13, 0), "{}", DB::LABEL);
    setup.cleanup().await;
}

/// A backlog of 50 events acknowledged before any worker runs, then a worker (on an inbox of its
/// own on the table, so its statements are counted apart from the test's reads) with 16 handlers
/// and no attempt history that sweeps once: each event is processed once, and the worker sends
/// fewer statements than one claim and one completion per event would (its first batch alone
/// claims 16 in one). A second backlog with the history on costs one statement more per event on
/// SQLite (its record, inside the handler's transaction) and none on Postgres, where the
/// completion writes the record in the same statement.
async fn a_backlog_is_claimed_in_batches<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let sender = Sender::new(&setup.inbox).await;
    let all = sender.deliver("evt_backlog", 50, "charge.succeeded").await;
    let probe = setup.probe();
    let working = Inbox::new(setup.pool.clone(), &setup.inbox_table).unwrap();
    let worker = working
        .worker(probe.handler::<DB>())
        .concurrency(16)
        .poll_every(Duration::from_secs(3600))
        .history(0)
        .spawn();
    each_processed_once(&setup, &probe, &all, [worker]).await;
    let sent = working.statements_executed();
    assert!(
        sent < 2 * 50,
        "{}: the worker sent {sent} statements for 50 events",
        DB::LABEL
    );

    let more = sender.deliver("evt_recorded", 50, "charge.succeeded").await;
    let recording = Inbox::new(setup.pool.clone(), &setup.inbox_table).unwrap();
    let worker = recording
        .worker(probe.handler::<DB>())
        .concurrency(16)
        .poll_every(Duration::from_secs(3600))
        .spawn();
    each_processed_once(&setup, &probe, &more, [worker]).await;
    let recorded = recording.statements_executed();
    let bound = if DB::LABEL == "postgres" { 2 } else { 3 };
    assert!(
        recorded < bound * 50,
        "{}: with its history the worker sent {recorded} statements for 50 events",
        DB::LABEL
    );
    for id in &more {
        let key = tower_idempotency_inbox::EventKey::new("stripe", id.as_str());
        let attempts = setup.inbox.attempts(&key).await.unwrap();
        assert_eq!(attempts.len(), 1, "{}: {id}", DB::LABEL);
    }
    setup.cleanup().await;
}

/// Waits until `n` of the events whose ids start with `prefix` have their claim's `column` set;
/// answers that column of each.
async fn claimed_at_least<DB: Fixture>(
    setup: &Setup<DB>,
    prefix: &str,
    column: &str,
    n: usize,
) -> Vec<Option<i64>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let values = lease_column(setup, prefix, column).await;
        if values.iter().flatten().count() >= n {
            return values;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{}: only {values:?} claimed",
            DB::LABEL
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Unix ms now.
fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    i64::try_from(since.unwrap().as_millis()).unwrap()
}

/// A worker with one handler holds two events claimed. Three gated events are acknowledged
/// before it starts; while the first runs, the second is claimed too (the third is not) and no
/// second handler runs. The waiting event's claim (a 1 s lease) is renewed past its first end.
/// Once the gate opens, each event runs once, on its first attempt.
async fn a_claimed_event_waits_for_a_free_handler_with_its_claim_renewed<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let sender = Sender::new(&setup.inbox).await;
    let all = sender.deliver("evt_ahead", 3, "test.gated").await;
    let worker = quick(setup.inbox.worker(probe.handler::<DB>()))
        .concurrency(1)
        .lease(Duration::from_millis(1000))
        .spawn();
    probe.wait_started(1).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let claimed = claimed_at_least(&setup, "evt_ahead", "lease_until", 2).await;
    assert_eq!(claimed.iter().flatten().count(), 2, "{}", DB::LABEL);
    assert_eq!(probe.total_runs(), 1, "{}", DB::LABEL);
    // `all` is in the order of its ids, as `claimed` is.
    let waiting = (0..all.len())
        .find(|&i| probe.runs(&all[i]) == 0 && claimed[i].is_some())
        .expect("a claimed event waits");
    let first_end = claimed[waiting].unwrap();
    // Past the end of the claim it was given: it has been renewed meanwhile.
    while now_ms() <= first_end + 200 {
        assert!(std::time::Instant::now() < deadline, "{}", DB::LABEL);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ends = lease_column(&setup, "evt_ahead", "lease_until").await;
    let end = ends[waiting].expect("still claimed");
    assert!(end > now_ms(), "{}: the waiting claim lapsed", DB::LABEL);
    assert_eq!(probe.total_runs(), 1, "{}", DB::LABEL);
    probe.open_gate();
    each_processed_once(&setup, &probe, &all, [worker]).await;
    setup.cleanup().await;
}

/// Draining a worker gives back the events it claimed ahead of a free handler. A worker with
/// one handler runs the first of two gated events and holds the second claimed; once the drain
/// starts, the second's claim is given back (no lease, no attempt counted) while the first still
/// runs. Once the gate opens, the drain ends with the first processed and the second pending
/// and never run.
async fn a_drain_gives_back_the_events_claimed_ahead<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let sender = Sender::new(&setup.inbox).await;
    let all = sender.deliver("evt_back", 2, "test.gated").await;
    let worker = quick(setup.inbox.worker(probe.handler::<DB>()))
        .concurrency(1)
        .spawn();
    probe.wait_started(1).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    claimed_at_least(&setup, "evt_back", "lease_token", 2).await;
    let (running, waiting) = match probe.runs(&all[0]) {
        1 => (&all[0], &all[1]),
        _ => (&all[1], &all[0]),
    };
    let draining = tokio::spawn(worker.drain(Duration::from_secs(30)));
    loop {
        let event = setup.event(waiting).await;
        if event.attempts == 0 {
            assert_eq!(event.state, EventState::Pending, "{}", DB::LABEL);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", DB::LABEL);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let index = all.iter().position(|id| id == waiting).unwrap();
    let tokens = lease_column(&setup, "evt_back", "lease_token").await;
    assert_eq!(tokens[index], None, "{}: the claim was kept", DB::LABEL);
    assert!(!draining.is_finished(), "{}", DB::LABEL);
    probe.open_gate();
    assert!(draining.await.unwrap(), "{}", DB::LABEL);
    let first = setup.event(running).await;
    assert_eq!((first.state, first.attempts), (EventState::Processed, 1));
    let second = setup.event(waiting).await;
    assert_eq!((second.state, second.attempts), (EventState::Pending, 0));
    assert_eq!(probe.runs(waiting), 0, "{}", DB::LABEL);
    setup.cleanup().await;
}

on_both!(
    a_claimed_event_waits_for_a_free_handler_with_its_claim_renewed,
    a_drain_gives_back_the_events_claimed_ahead,
    failed_batch_claim_loses_nothing,
    worker_aborted_mid_batch_processes_each_once,
    two_workers_claim_disjoint_batches,
    slow_handlers_in_a_batch_keep_their_lease,
    a_backlog_is_claimed_in_batches,
);
