//! `tower-idempotency inbox list|retry|replay|audit` end to end: an inbox fed over real HTTP
//! fails an event, the built binary lists it (table and JSON) and re-queues it; once processed it
//! replays it; the audit lists each change and who made it; on SQLite, Postgres and MariaDB.

mod support;

use std::time::{Duration, Instant};
use tower_idempotency_testkit::unix_now;

use axum::{routing::post_service, Router};
use serde_json::Value;
use support::*;
use tower_idempotency::{
    inbox::{EventKey, EventState, HandlerError, IdempotentTx, Inbox, InboxDatabase, InboxEvent},
    sqlx,
    webhooks::stripe::{self, StripeVerifier},
};

const SECRET: &str = "whsec_cli_inbox_test";

/// Every attempt fails: the handler refuses every event.
async fn refuse<DB: InboxDatabase>(
    _event: InboxEvent,
    _tx: IdempotentTx<DB>,
) -> Result<(), HandlerError> {
    Err("refused by the test handler".into())
}

/// Every attempt succeeds.
async fn accept<DB: InboxDatabase>(
    _event: InboxEvent,
    _tx: IdempotentTx<DB>,
) -> Result<(), HandlerError> {
    Ok(())
}

/// Delivers two events through the inbox over HTTP; a worker with one attempt fails them.
async fn fail_two_events<DB: InboxDatabase>(inbox: &Inbox<DB>, label: &str) -> [String; 2] {
    inbox.migrate().await.unwrap();
    let worker = inbox
        .worker(refuse::<DB>)
        .max_attempts(1)
        .poll_every(Duration::from_millis(10))
        .spawn();
    let app = Router::new().route(
        "/inbox/stripe",
        post_service(inbox.ack(StripeVerifier::new([SECRET]))),
    );
    let base = serve(app).await;
    let client = reqwest::Client::new();
    let ids = [format!("evt_cli_a_{label}"), format!("evt_cli_b_{label}")];
    for id in &ids {
        let body = format!(r#"{{"id":"{id}","type":"charge.succeeded"}}"#);
        let now = unix_now();
        let response = client
            .post(format!("{base}/inbox/stripe"))
            .header(
                stripe::SIGNATURE_HEADER,
                stripe::sign(SECRET, now, body.as_bytes()),
            )
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{label}");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while inbox.counts().await.unwrap().failed < 2 {
        assert!(
            Instant::now() < deadline,
            "{label}: the events never failed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(worker.drain(Duration::from_secs(30)).await);
    ids
}

/// Fails two events in `inbox`, then drives the tool against `url` and the inbox's table.
async fn list_and_retry<DB: InboxDatabase>(inbox: Inbox<DB>, url: &str, label: &str) {
    let ids = fail_two_events(&inbox, label).await;
    let table = inbox.table().to_owned();
    let args = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["--store".to_owned(), url.to_owned()];
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        args.extend(["--inbox-table".to_owned(), table.clone()]);
        args
    };
    let listed = stdout(&cli(&args(&["inbox", "list"])).await);
    let lines: Vec<&str> = listed.lines().collect();
    assert!(lines[0].starts_with("PROVIDER"), "{label}: {listed}");
    assert_eq!(lines.len(), 3, "{label}: {listed}");
    for id in &ids {
        let row = lines
            .iter()
            .find(|line| line.contains(id.as_str()))
            .unwrap();
        assert!(row.contains("failed") && row.contains("refused by the test handler"));
    }

    let events = json(&args(&["--json", "inbox", "list"])).await;
    assert_eq!(events.as_array().unwrap().len(), 2, "{label}: {events}");
    assert_eq!(events[0]["state"], "failed");
    assert_eq!(events[0]["attempts"], 1);

    // `inbox events`: newest first, one a page, the cursor to the next.
    let first = json(&args(&[
        "--json", "inbox", "events", "--state", "failed", "--limit", "1",
    ]))
    .await;
    assert_eq!(
        first["events"][0]["event_id"],
        ids[1].as_str(),
        "{label}: {first}"
    );
    let cursor = first["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let second = json(&args(&[
        "--json", "inbox", "events", "--limit", "1", "--cursor", &cursor,
    ]))
    .await;
    assert_eq!(
        second["events"][0]["event_id"],
        ids[0].as_str(),
        "{label}: {second}"
    );
    assert_eq!(second["next_cursor"], Value::Null);
    let none = json(&args(&[
        "--json",
        "inbox",
        "events",
        "--provider",
        "github",
    ]))
    .await;
    assert_eq!(none["events"], serde_json::json!([]), "{label}");

    let counts = json(&args(&["--json", "inbox", "counts"])).await;
    assert_eq!(counts["failed"], 2, "{label}: {counts}");
    assert_eq!(counts["pending"], 0);
    assert_eq!(counts["providers"][0]["provider"], "stripe");
    assert_eq!(counts["providers"][0]["failed"], 2);
    assert_eq!(counts["oldest_pending_age_secs"], Value::Null);

    let shown = json(&args(&["--json", "inbox", "show", "stripe", &ids[1]])).await;
    assert_eq!(shown["event_id"], ids[1].as_str(), "{label}: {shown}");
    assert_eq!(shown["type"], "charge.succeeded");
    assert_eq!(shown["last_error"], "refused by the test handler");
    assert!(shown["body"].as_str().unwrap().contains(ids[1].as_str()));
    let history = shown["history"].as_array().unwrap();
    let last = history.last().expect("an attempt on record");
    assert_eq!(last["outcome"], "failed", "{label}: {shown}");
    assert_eq!(last["error"], "refused by the test handler");
    let text = stdout(&cli(&args(&["inbox", "show", "stripe", &ids[1]])).await);
    assert!(
        text.contains("outcome=failed error=\"refused by the test handler\""),
        "{label}: {text}"
    );
    let missing = cli(&args(&["inbox", "show", "stripe", "evt_absent"])).await;
    assert!(!missing.status.success());

    let dry_run = |kind: &str| args(&["--json", "inbox", "retry", "--dry-run", "--type", kind]);
    let dry = json(&dry_run("charge.succeeded")).await;
    assert_eq!(dry["matched"], 2, "{label}: {dry}");
    assert_eq!(dry["retried"], 0);
    let other = json(&dry_run("invoice.paid")).await;
    assert_eq!(other["matched"], 0, "{label}: {other}");
    assert_eq!(
        inbox.counts().await.unwrap().failed,
        2,
        "a dry run changes nothing"
    );

    let purged = json(&args(&[
        "--json",
        "inbox",
        "purge",
        "--older-than-secs",
        "0",
    ]))
    .await;
    assert_eq!(purged["purged"], 0, "{label}: nothing was processed");

    let retried = json(&args(&[
        "--json",
        "--operator",
        "ops@example",
        "inbox",
        "retry",
        "stripe",
        &ids[0],
    ]))
    .await;
    assert_eq!(retried["retried"]["event_id"], ids[0].as_str());
    let key = EventKey::new("stripe", ids[0].as_str());
    assert_eq!(
        inbox.get(&key).await.unwrap().unwrap().state,
        EventState::Pending
    );
    let pending = json(&args(&["--json", "inbox", "list", "--state", "pending"])).await;
    assert_eq!(
        pending[0]["event_id"],
        ids[0].as_str(),
        "{label}: {pending}"
    );

    // Not failed any more: refused, with an exit status and a message that says so.
    let again = cli(&args(&["inbox", "retry", "stripe", &ids[0]])).await;
    assert!(!again.status.success());
    let message = String::from_utf8_lossy(&again.stderr);
    assert!(message.contains("no failed event"), "{label}: {message}");

    // Processed, then replayed: one by key, the bulk's dry run by type first.
    let worker = inbox
        .worker(accept::<DB>)
        .poll_every(Duration::from_millis(10))
        .spawn();
    let deadline = Instant::now() + Duration::from_secs(20);
    while inbox.get(&key).await.unwrap().unwrap().state != EventState::Processed {
        assert!(Instant::now() < deadline, "{label}: never processed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(worker.drain(Duration::from_secs(30)).await);
    let dry = json(&args(&[
        "--json",
        "inbox",
        "replay",
        "--dry-run",
        "--type",
        "charge.succeeded",
    ]))
    .await;
    assert_eq!(
        (dry["matched"].as_u64(), dry["replayed"].as_u64()),
        (Some(1), Some(0)),
        "{label}: {dry}"
    );
    let replayed = json(&args(&[
        "--json",
        "--operator",
        "ops@example",
        "inbox",
        "replay",
        "stripe",
        &ids[0],
    ]))
    .await;
    assert_eq!(replayed["replayed"]["event_id"], ids[0].as_str(), "{label}");
    let event = inbox.event(&key).await.unwrap().unwrap();
    assert_eq!(event.record.state, EventState::Pending);
    let last = event.history.last().unwrap();
    assert_eq!(
        last.outcome,
        tower_idempotency::jobs::AttemptOutcome::Replayed
    );
    // A failed event is retried, not replayed.
    let refused = cli(&args(&["inbox", "replay", "stripe", &ids[1]])).await;
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("no processed or skipped event"),
        "{label}: {message}"
    );

    // The audit, newest first: who made each change, what, on which events.
    let audit = json(&args(&["--json", "inbox", "audit"])).await;
    let entries: Vec<(&str, &str, &str, u64)> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            (
                entry["who"].as_str().unwrap(),
                entry["action"].as_str().unwrap(),
                entry["target"].as_str().unwrap(),
                entry["changed"].as_u64().unwrap(),
            )
        })
        .collect();
    let target = format!("stripe/{}", ids[0]);
    let user = format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    );
    assert_eq!(
        entries,
        [
            ("ops@example", "replay", target.as_str(), 1),
            ("ops@example", "retry", target.as_str(), 1),
            (user.as_str(), "purge", "finished more than 0 s ago", 0),
        ],
        "{label}"
    );
    let table = stdout(&cli(&args(&["inbox", "audit", "--limit", "1"])).await);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("AT"), "{label}: {table}");
    assert_eq!(lines.len(), 2, "{label}: {table}");
    assert!(
        lines[1].contains("ops@example") && lines[1].contains("replay"),
        "{table}"
    );
    // `pause`, `pauses`, `resume`: the pause is stored for every worker, by the CLI's operator,
    // and audited.
    let paused = stdout(
        &cli(&args(&[
            "inbox",
            "pause",
            "stripe",
            "--type",
            "test.refuse",
        ]))
        .await,
    );
    assert_eq!(paused.trim(), "paused stripe/test.refuse", "{label}");
    let again = json(&args(&[
        "--json",
        "inbox",
        "pause",
        "stripe",
        "--type",
        "test.refuse",
    ]))
    .await;
    assert_eq!(again["changed"], false, "{label}: {again}");
    let stored = inbox.pauses().await.unwrap();
    assert_eq!(stored.len(), 1, "{label}");
    assert_eq!(
        (stored[0].scope.as_str(), stored[0].by.as_str()),
        ("stripe/test.refuse", user.as_str())
    );
    let listed = stdout(&cli(&args(&["inbox", "pauses"])).await);
    let row = listed.lines().nth(1).unwrap_or_default();
    assert!(
        row.starts_with("stripe/test.refuse ") && row.ends_with(user.as_str()),
        "{label}: {listed}"
    );
    let listed = json(&args(&["--json", "inbox", "pauses"])).await;
    assert_eq!(
        listed[0]["scope"], "stripe/test.refuse",
        "{label}: {listed}"
    );
    let resumed = stdout(
        &cli(&args(&[
            "inbox",
            "resume",
            "stripe",
            "--type",
            "test.refuse",
        ]))
        .await,
    );
    assert_eq!(resumed.trim(), "resumed stripe/test.refuse", "{label}");
    assert!(inbox.pauses().await.unwrap().is_empty(), "{label}");
    let again = cli(&args(&[
        "inbox",
        "resume",
        "stripe",
        "--type",
        "test.refuse",
    ]))
    .await;
    assert_eq!(again.status.code(), Some(1), "{label}");
    let message = String::from_utf8_lossy(&again.stderr);
    assert!(message.contains("this is not paused"), "{label}: {message}");
    // Audited: the pause that took effect and the resume, not the second pause.
    let audit = json(&args(&["--json", "inbox", "audit", "--limit", "3"])).await;
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions[..2], ["resume", "pause"], "{label}: {audit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_list_and_retry_sqlite() {
    let dir = std::env::temp_dir().join(format!("tidem-cli-inbox-{}", random_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}/inbox.db", dir.display());
    let options: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
    let options = options
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    let inbox = Inbox::new(pool.clone(), "webhook_inbox").unwrap();
    list_and_retry(inbox, &url, "sqlite").await;
    pool.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_list_and_retry_postgres() {
    require_postgres!("inbox CLI test (postgres)");
    let url = database_url();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let table = format!("cli_inbox_{}", random_suffix());
    let inbox = Inbox::new(pool.clone(), &table).unwrap();
    list_and_retry(inbox, &url, "postgres").await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(
        tower_idempotency_testkit::drop_job_tables_sql(&table),
    ))
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_list_and_retry_mysql() {
    if !tower_idempotency_testkit::mysql_or_skip("inbox CLI test (mysql)") {
        return;
    }
    let url = tower_idempotency_testkit::mysql_url();
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    let table = tower_idempotency_testkit::mysql_table("cli_inbox");
    let inbox = Inbox::new(pool.clone(), &table).unwrap();
    // The `mariadb://` spelling of the same database.
    let url = url.replacen("mysql:", "mariadb:", 1);
    list_and_retry(inbox, &url, "mysql").await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(
        tower_idempotency_testkit::drop_job_tables_sql(&table),
    ))
    .execute(&pool)
    .await
    .unwrap();
}
