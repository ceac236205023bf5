//! Retention on SQLite and Postgres: processed events are purged in bounded batches, pending,
//! failed and recent processed ones are kept, a worker purges on its own, and a captured GitHub
//! delivery re-sent under a new id is still refused after a purge inside GitHub's retry horizon.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use axum::{routing::post_service, Router};
use common::*;
use tower_idempotency_inbox::{EventKey, EventState, Inbox, StateCounts};
use tower_idempotency_sqlx::sqlx;
use tower_idempotency_webhooks::github::{self, GitHubVerifier};

const GITHUB_SECRET: &str = "github_inbox_retention_secret_4e2a";
const HOUR_MS: i64 = 60 * 60 * 1000;

fn now_ms() -> i64 {
    let since = std::time::UNIX_EPOCH.elapsed().unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

/// A bytea/BLOB literal of `{}` in each database's spelling.
fn body_literal<DB: Fixture>() -> &'static str {
    if DB::LABEL == "postgres" {
        "'\\x7b7d'"
    } else {
        "x'7b7d'"
    }
}

/// Inserts `n` Stripe events `{prefix}_{i}` in `state`, received and finished at `at` (unix ms;
/// pending ones have no finish time).
async fn insert_rows<DB: Fixture>(setup: &Setup<DB>, prefix: &str, n: u32, state: i16, at: i64) {
    let finished = if state == 0 {
        "NULL".to_owned()
    } else {
        at.to_string()
    };
    let sql = format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {n}) \
         INSERT INTO {table} (provider, event_id, headers, body, received_at, state, \
         available_at, finished_at) \
         SELECT 'stripe', '{prefix}_' || i, '[]', {body}, {at}, {state}, {future}, {finished} \
         FROM n",
        table = setup.inbox_table,
        body = body_literal::<DB>(),
        // Pending rows are not due: no worker of these tests picks them up.
        future = at + 24 * HOUR_MS,
    );
    DB::exec(&setup.pool, &sql).await;
}

/// 2 500 events processed two hours ago, 5 processed now, 5 pending and 5 failed two hours ago.
async fn fill<DB: Fixture>(setup: &Setup<DB>) {
    let old = now_ms() - 2 * HOUR_MS;
    insert_rows(setup, "evt_old", 2500, 1, old).await;
    insert_rows(setup, "evt_recent", 5, 1, now_ms()).await;
    insert_rows(setup, "evt_pending", 5, 0, old).await;
    insert_rows(setup, "evt_failed", 5, 2, old).await;
}

/// What [`fill`] leaves after a purge of everything older than an hour.
const KEPT: StateCounts = StateCounts {
    pending: 5,
    processed: 5,
    failed: 5,
    skipped: 0,
};

async fn purges_in_bounded_batches<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    fill(&setup).await;
    let retention = Duration::from_secs(3600);
    let mut batches = Vec::new();
    loop {
        let purged = setup.inbox.purge_batch(retention, 1000).await.unwrap();
        batches.push(purged);
        if purged == 0 {
            break;
        }
        assert!(batches.len() < 10, "{}: {batches:?}", DB::LABEL);
    }
    assert_eq!(batches, [1000, 1000, 500, 0], "{}", DB::LABEL);
    assert_eq!(setup.inbox.counts().await.unwrap(), KEPT, "{}", DB::LABEL);
    for id in ["evt_recent_1", "evt_pending_1", "evt_failed_1"] {
        let key = EventKey::new("stripe", id);
        assert!(setup.inbox.get(&key).await.unwrap().is_some(), "{id}");
    }
    setup.cleanup().await;
}

/// Logs every row deleted from the inbox table into `{log}` under the statement that deleted it
/// (Postgres: its transaction id; SQLite: `now` with milliseconds, the same throughout one
/// statement, and a purge batch of hundreds of rows takes longer than a millisecond).
async fn log_deletions<DB: Fixture>(setup: &Setup<DB>, log: &str) {
    let inbox = &setup.inbox_table;
    if DB::LABEL == "postgres" {
        DB::exec(
            &setup.pool,
            &format!("CREATE TABLE {log} (statement bigint NOT NULL)"),
        )
        .await;
        let function = format!(
            "CREATE FUNCTION {log}_note() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             INSERT INTO {log} VALUES (txid_current()); RETURN OLD; END $$"
        );
        DB::exec(&setup.pool, &function).await;
        let trigger = format!(
            "CREATE TRIGGER {log}_note AFTER DELETE ON {inbox} \
             FOR EACH ROW EXECUTE FUNCTION {log}_note()"
        );
        DB::exec(&setup.pool, &trigger).await;
    } else {
        DB::exec(
            &setup.pool,
            &format!("CREATE TABLE {log} (statement TEXT NOT NULL)"),
        )
        .await;
        let trigger = format!(
            "CREATE TRIGGER {log}_note AFTER DELETE ON {inbox} BEGIN \
             INSERT INTO {log} VALUES (strftime('%Y-%m-%d %H:%M:%f', 'now')); END"
        );
        DB::exec(&setup.pool, &trigger).await;
    }
}

/// 2 500 old processed events and a worker purging every 50 ms in batches of 1 000, while the
/// test polls the counts: the worker alone deletes exactly the old processed events, in three
/// statements of 1 000, 1 000 and 500 rows (counted by a trigger, apart from the sweeps and the
/// polling), and keeps the rest.
async fn a_worker_purges_on_its_own<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    fill(&setup).await;
    let log = format!("{}_deleted", setup.inbox_table);
    log_deletions(&setup, &log).await;
    let worker = setup
        .inbox
        .worker(setup.probe().handler::<DB>())
        .retention(Duration::from_secs(3600))
        .purge_batch(1000)
        .purge_every(Duration::from_millis(50))
        .spawn();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let counts = setup.inbox.counts().await.unwrap();
        if counts.processed == KEPT.processed {
            assert_eq!(counts, KEPT, "{}", DB::LABEL);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{}: never purged: {counts:?}",
            DB::LABEL
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(worker.drain(Duration::from_secs(10)).await);
    assert_eq!(setup.inbox.counts().await.unwrap(), KEPT, "{}", DB::LABEL);
    // The statements' sizes, written where the fixture counts rows: one `statement` row per
    // deleting statement, one `purged <n>` row per statement of n rows.
    let effects = &setup.effects_table;
    let tally = format!(
        "INSERT INTO {effects} (event_id) SELECT 'statement' FROM {log} GROUP BY statement; \
         INSERT INTO {effects} (event_id) SELECT 'purged ' || count(*) FROM {log} GROUP BY statement"
    );
    DB::exec(&setup.pool, &tally).await;
    let sizes = (
        setup.effects("statement").await,
        setup.effects("purged 1000").await,
        setup.effects("purged 500").await,
    );
    assert_eq!(
        sizes,
        (3, 2, 1),
        "{}: (statements, of 1000, of 500)",
        DB::LABEL
    );
    DB::drop_tables(&setup.pool, &[&log]).await;
    if DB::LABEL == "postgres" {
        DB::exec(
            &setup.pool,
            &format!("DROP FUNCTION IF EXISTS {log}_note() CASCADE"),
        )
        .await;
    }
    setup.cleanup().await;
}

/// Posts a GitHub delivery of `body` (signed once, by the caller) under `delivery`.
async fn deliver_github(
    client: &reqwest::Client,
    url: &str,
    signature: &str,
    delivery: &str,
    body: &str,
) -> u16 {
    let request = client
        .post(url)
        .header(github::SIGNATURE_HEADER, signature)
        .header(github::DELIVERY_HEADER, delivery)
        .header("x-github-event", "issues")
        .header("content-type", "application/json")
        .body(body.to_owned());
    tower_idempotency_testkit::delivery_status(request).await
}

async fn wait_processed<DB: Fixture>(inbox: &Inbox<DB>, key: &EventKey) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let event = inbox.get(key).await.unwrap();
        if event.as_ref().map(|e| e.state) == Some(EventState::Processed) {
            return;
        }
        assert!(Instant::now() < deadline, "{key:?}: {event:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn a_purge_keeps_refusing_a_replay_under_a_new_id<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let worker = setup
        .inbox
        .worker(probe.handler::<DB>())
        .poll_every(Duration::from_millis(10))
        .spawn();
    let app =
        Router::new()
            .route(
                "/inbox/github",
                post_service(setup.inbox.ack(GitHubVerifier::new([GITHUB_SECRET]))),
            )
            .route(
                "/inbox/stripe",
                post_service(setup.inbox.ack(
                    tower_idempotency_webhooks::stripe::StripeVerifier::new([SECRET]),
                )),
            );
    let base = serve_router(app).await;
    let (github_url, stripe_url) = (
        format!("{base}/inbox/github"),
        format!("{base}/inbox/stripe"),
    );
    let client = reqwest::Client::new();
    let body = r#"{"action":"opened","issue":{"number":7}}"#;
    let signature = github::sign(GITHUB_SECRET, body.as_bytes());
    let first = EventKey::new("github", "d-retention-1");
    assert_eq!(
        deliver_github(&client, &github_url, &signature, &first.event_id, body).await,
        200
    );
    let stripe_id = format!("evt_retention_{}", DB::LABEL);
    let stripe_body = event_body(&stripe_id, "charge.succeeded");
    assert_eq!(
        deliver(&client, &stripe_url, SECRET, &stripe_body).await,
        200
    );
    let stripe = EventKey::new("stripe", &stripe_id);
    wait_processed(&setup.inbox, &first).await;
    wait_processed(&setup.inbox, &stripe).await;

    // The row keeps GitHub's retry horizon (its TTL, four days) from its acknowledgement:
    // marked in the effects table when it does.
    let github_ttl = github::DEFAULT_TTL.as_millis();
    let mark = format!(
        "INSERT INTO {effects} (event_id) SELECT 'horizon' FROM {inbox} \
         WHERE event_id = '{id}' AND authenticator_until - received_at = {github_ttl}",
        effects = setup.effects_table,
        inbox = setup.inbox_table,
        id = first.event_id,
    );
    DB::exec(&setup.pool, &mark).await;
    assert_eq!(setup.effects("horizon").await, 1, "{}", DB::LABEL);

    // Both processed two hours ago, past a one-hour retention; the GitHub one is inside its
    // horizon.
    let backdate = format!(
        "UPDATE {} SET finished_at = {}",
        setup.inbox_table,
        now_ms() - 2 * HOUR_MS
    );
    DB::exec(&setup.pool, &backdate).await;
    let hour = Duration::from_secs(3600);
    assert_eq!(setup.inbox.purge_processed(hour).await.unwrap(), 1);
    assert_eq!(setup.inbox.purge_batch(hour, 1000).await.unwrap(), 0);
    assert!(setup.inbox.get(&stripe).await.unwrap().is_none(), "purged");
    assert!(setup.inbox.get(&first).await.unwrap().is_some(), "kept");

    // The captured delivery under a new id: answered 200, nothing stored, nothing run.
    let replay = EventKey::new("github", "d-retention-2");
    assert_eq!(
        deliver_github(&client, &github_url, &signature, &replay.event_id, body).await,
        200
    );
    assert!(
        setup.inbox.get(&replay).await.unwrap().is_none(),
        "{}: a replay under a new id was stored after the purge",
        DB::LABEL
    );

    // Once the horizon has passed, the row goes, and the credential is accepted again (as the
    // webhook layer's authenticator record expires after its TTL).
    let expire = format!(
        "UPDATE {} SET authenticator_until = {}",
        setup.inbox_table,
        now_ms() - 1
    );
    DB::exec(&setup.pool, &expire).await;
    assert_eq!(setup.inbox.purge_batch(hour, 1000).await.unwrap(), 1);
    assert!(setup.inbox.get(&first).await.unwrap().is_none());
    let late = EventKey::new("github", "d-retention-3");
    assert_eq!(
        deliver_github(&client, &github_url, &signature, &late.event_id, body).await,
        200
    );
    wait_processed(&setup.inbox, &late).await;
    assert_eq!(probe.runs(&first.event_id), 1);
    assert_eq!(probe.runs(&replay.event_id), 0);
    setup.finish(worker).await;
}

on_both!(
    purges_in_bounded_batches,
    a_worker_purges_on_its_own,
    a_purge_keeps_refusing_a_replay_under_a_new_id,
);
