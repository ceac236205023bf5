//! Acknowledgements committed together, over real HTTP on a SQLite file and on Postgres: a burst
//! of deliveries (with copies of some inside it) is answered `200` once each row is stored, each
//! event once; a row the database refuses fails only its own delivery, not the batch it was in.

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
    let trigger = if DB::LABEL == "postgres" {
        format!(
            "CREATE FUNCTION {table}_refuse() RETURNS trigger AS $$ BEGIN \
             IF NEW.event_id = 'evt_refused' THEN RAISE EXCEPTION 'refused'; END IF; \
             RETURN NEW; END $$ LANGUAGE plpgsql; \
             CREATE TRIGGER {table}_refuse BEFORE INSERT ON {table} \
             FOR EACH ROW EXECUTE FUNCTION {table}_refuse()"
        )
    } else {
        format!(
            "CREATE TRIGGER {table}_refuse BEFORE INSERT ON {table} \
             WHEN NEW.event_id = 'evt_refused' BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
    };
    DB::exec(&setup.pool, &trigger).await;
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

on_both!(
    a_burst_is_committed_together_and_stored_once,
    a_refused_row_fails_only_its_own_delivery,
);
