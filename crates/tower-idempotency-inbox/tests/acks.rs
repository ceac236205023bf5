//! Acknowledgements committed together, over real HTTP on a SQLite file and on Postgres: a burst
//! of deliveries (with copies of some inside it) is answered `200` once each row is stored, each
//! event once; a row the database refuses fails only its own delivery, not the batch it was in;
//! with more than one commit in flight, deliveries behind one that hangs are committed by the
//! others.

#[macro_use]
mod common;

use common::*;
use futures_util::future::join_all;
use tower_idempotency_inbox::EventState;
use tower_idempotency_sqlx::sqlx;

/// Delivers every body at once; answers the statuses in the same order.
async fn deliver_together(url: &str, bodies: &[String]) -> Vec<u16> {
    let client = reqwest::Client::new();
    join_all(
        bodies
            .iter()
            .map(|body| deliver(&client, url, SECRET, body)),
    )
    .await
}

/// 120 distinct events and 40 copies of some of them, all at once: every delivery gets `200`,
/// each event is processed once. On Postgres the burst costs fewer statements than deliveries
/// (deliveries that arrived while an insert was in flight went in together).
async fn a_burst_is_committed_together_and_stored_once<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let worker = setup.inbox.worker(probe.handler::<DB>()).spawn();
    let url = serve(&setup.inbox).await;
    let ids: Vec<String> = (0..120).map(|i| format!("evt_burst_{i}")).collect();
    let mut bodies: Vec<String> = ids
        .iter()
        .map(|id| event_body(id, "charge.succeeded"))
        .collect();
    bodies.extend((0..40).map(|i| event_body(&ids[i * 3], "charge.succeeded")));
    let before = setup.inbox.statements_executed();
    let statuses = deliver_together(&url, &bodies).await;
    let statements = setup.inbox.statements_executed() - before;
    assert!(
        statuses.iter().all(|&s| s == 200),
        "{}: {statuses:?}",
        DB::LABEL
    );
    for id in &ids {
        assert_eq!(
            setup.wait_for(id, EventState::Processed).await,
            1,
            "{}",
            DB::LABEL
        );
        assert_eq!(setup.effects(id).await, 1, "{}: {id}", DB::LABEL);
        assert_eq!(probe.runs(id), 1, "{}: {id}", DB::LABEL);
    }
    let counts = setup.inbox.counts().await.unwrap();
    assert_eq!(counts.processed, 120, "{}", DB::LABEL);
    if DB::LABEL == "postgres" {
        assert!(
            statements < bodies.len() as u64,
            "postgres: {statements} statements for {} deliveries",
            bodies.len()
        );
    }
    setup.finish(worker).await;
}

/// A trigger refuses one event id: delivered at once with 40 others, that one is answered `503`
/// (the provider retries it) and the 40 are stored, though some shared its batch.
async fn a_refused_row_fails_only_its_own_delivery<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let table = &setup.inbox_table;
    refuse_row(&setup.pool, table, "evt_refused").await;
    let url = serve(&setup.inbox).await;
    let ids: Vec<String> = (0..40).map(|i| format!("evt_ok_{i}")).collect();
    let mut bodies = vec![event_body("evt_refused", "charge.succeeded")];
    bodies.extend(ids.iter().map(|id| event_body(id, "charge.succeeded")));
    let statuses = deliver_together(&url, &bodies).await;
    assert_eq!(statuses[0], 503, "{}", DB::LABEL);
    assert!(
        statuses[1..].iter().all(|&s| s == 200),
        "{}: {statuses:?}",
        DB::LABEL
    );
    let counts = setup.inbox.counts().await.unwrap();
    assert_eq!(counts.pending, 40, "{}", DB::LABEL);
    drop_refusal(&setup, table).await;
    setup.cleanup().await;
}

/// With `ack_commits_in_flight(4)`, Postgres runs several acknowledgement commits at once:
/// while one delivery's insert waits on a lock the test holds (a trigger takes it), ten
/// deliveries sent after it are all stored and answered `200`; the held one is answered once the
/// lock is released. With one commit at a time the ten would wait behind it, and the bound
/// below would fail the test.
#[tokio::test]
async fn postgres_deliveries_behind_a_hanging_commit_are_committed_beside_it() {
    let setup = Setup::<sqlx::Postgres>::new().await;
    let table = &setup.inbox_table;
    let trigger = format!(
        "CREATE FUNCTION {table}_refuse() RETURNS trigger AS $$ BEGIN \
         IF NEW.event_id = 'evt_held' THEN PERFORM pg_advisory_xact_lock_shared(hashtext('{table}')); END IF; \
         RETURN NEW; END $$ LANGUAGE plpgsql; \
         CREATE TRIGGER {table}_refuse BEFORE INSERT ON {table} \
         FOR EACH ROW EXECUTE FUNCTION {table}_refuse()"
    );
    <sqlx::Postgres as Fixture>::exec(&setup.pool, &trigger).await;
    let mut holder = setup.pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(hashtext($1))")
        .bind(table)
        .execute(&mut *holder)
        .await
        .unwrap();
    let url = serve(&setup.inbox.clone().ack_commits_in_flight(4)).await;
    let held = tokio::spawn({
        let url = url.clone();
        async move {
            let client = reqwest::Client::new();
            deliver(
                &client,
                &url,
                SECRET,
                &event_body("evt_held", "charge.succeeded"),
            )
            .await
        }
    });
    // The held delivery's insert is waiting on the test's lock.
    let blocked = format!(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
         WHERE l.locktype = 'advisory' AND NOT l.granted AND a.query LIKE '%{table}%'"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (waiting,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(&*blocked))
            .fetch_one(&setup.pool)
            .await
            .unwrap();
        if waiting == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the held insert never blocked"
        );
        tokio::task::yield_now().await;
    }
    let bodies: Vec<String> = ids("evt_beside", 10)
        .iter()
        .map(|id| event_body(id, "charge.succeeded"))
        .collect();
    let statuses = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        deliver_together(&url, &bodies),
    )
    .await
    .expect("the deliveries behind the hanging commit are answered");
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert!(
        !held.is_finished(),
        "the held delivery waits for its commit"
    );
    assert_eq!(setup.inbox.counts().await.unwrap().pending, 10);
    sqlx::query("SELECT pg_advisory_unlock(hashtext($1))")
        .bind(table)
        .execute(&mut *holder)
        .await
        .unwrap();
    drop(holder);
    assert_eq!(held.await.unwrap(), 200);
    assert_eq!(setup.inbox.counts().await.unwrap().pending, 11);
    drop_refusal(&setup, table).await;
    setup.cleanup().await;
}

on_both!(
    a_burst_is_committed_together_and_stored_once,
    a_refused_row_fails_only_its_own_delivery,
);
