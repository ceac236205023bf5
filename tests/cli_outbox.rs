//! `tower-idempotency outbox list|show|retry|discard|purge` end to end: a relay fails two
//! messages, a third to a credentialed URL waits, and the built binary lists, shows (without the
//! credentials), retries, discards and purges them, on SQLite and on Postgres.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::*;
use tower_idempotency::{
    outbox::{Dispatch, DispatchError, Message, MessageState, Outbox, OutboxDatabase},
    sqlx,
};

const REFUSAL: &str = "refused by the test dispatcher";
/// A target URL carrying a password (`hunter2`) and a query credential (`t`).
const SECRET_URL: &str = "https://ops:hunter2@host/x?token=t";
const SHOWN_URL: &str = "https://host/x?token=***";

/// Asserts that `args` exits `1` with `expected` in its message.
async fn refused(args: &[String], expected: &str, label: &str) {
    let output = cli(args).await;
    assert_eq!(output.status.code(), Some(1), "{label}: {args:?}");
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains(expected), "{label}: {message}");
}

/// Enqueues two dispatched messages that a relay fails (its dispatcher refuses them for good),
/// then a third, pending, to [`SECRET_URL`]; answers the keys of the failed two.
async fn fill<DB: OutboxDatabase>(
    outbox: &Outbox<DB>,
    pool: &sqlx::Pool<DB>,
    label: &str,
) -> [String; 2] {
    outbox.migrate().await.unwrap();
    let keys = [format!("cli-fail-a-{label}"), format!("cli-fail-b-{label}")];
    let mut conn = pool.acquire().await.unwrap();
    for key in &keys {
        let message = Message::dispatch("orders", "payload").key(key.as_str());
        outbox.enqueue(&mut conn, message).await.unwrap();
    }
    drop(conn);
    let relay = outbox
        .relay()
        .max_attempts(1)
        .dispatcher(|_: Dispatch| async { Err(DispatchError::permanent(REFUSAL)) });
    let round = relay.run_once().await.unwrap();
    assert_eq!(round.claimed, 2, "{label}: {round:?}");
    assert_eq!(outbox.counts().await.unwrap().failed, 2, "{label}");
    let mut conn = pool.acquire().await.unwrap();
    let secret = Message::post_json(SECRET_URL, &serde_json::json!({"api_key": "sk_body_7"}))
        .header("authorization", "Bearer tok_header_9")
        .key(format!("cli-secret-{label}"));
    outbox.enqueue(&mut conn, secret).await.unwrap();
    keys
}

/// Fills `outbox`, then drives the tool against `url` and the outbox's table.
async fn drive<DB: OutboxDatabase>(
    outbox: Outbox<DB>,
    pool: sqlx::Pool<DB>,
    url: &str,
    label: &str,
) {
    let keys = fill(&outbox, &pool, label).await;
    let secret_key = format!("cli-secret-{label}");
    let table = outbox.table().to_owned();
    let args = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["--store".to_owned(), url.to_owned()];
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        args.extend(["--outbox-table".to_owned(), table.clone()]);
        args
    };
    let assert_clean = |what: &str, text: &str| {
        for secret in ["hunter2", "token=t", "sk_body_7", "tok_header_9"] {
            assert!(
                !text.contains(secret),
                "{label} {what} shows {secret}: {text}"
            );
        }
    };

    // `list`: failed by default, a table and JSON.
    let listed = stdout(&cli(&args(&["outbox", "list"])).await);
    let lines: Vec<&str> = listed.lines().collect();
    assert!(lines[0].starts_with("KEY"), "{label}: {listed}");
    assert_eq!(lines.len(), 3, "{label}: {listed}");
    for key in &keys {
        let row = lines
            .iter()
            .find(|line| line.contains(key.as_str()))
            .unwrap();
        assert!(
            row.contains("failed") && row.contains(REFUSAL),
            "{label}: {row}"
        );
    }
    let failed = json(&args(&["--json", "outbox", "list", "--limit", "1"])).await;
    assert_eq!(failed.as_array().unwrap().len(), 1, "{label}: {failed}");
    assert_eq!(failed[0]["key"], keys[0].as_str());
    assert_eq!(failed[0]["state"], "failed");
    assert_eq!(failed[0]["attempts"], 1);
    assert_eq!(failed[0]["last_error"], REFUSAL);
    // The pending message's URL is listed without its credentials.
    let pending = stdout(&cli(&args(&["--json", "outbox", "list", "--state", "pending"])).await);
    assert_clean("list", &pending);
    let pending: Value = serde_json::from_str(&pending).unwrap();
    assert_eq!(pending[0]["key"], secret_key.as_str(), "{label}: {pending}");
    assert_eq!(pending[0]["url"], SHOWN_URL);

    // `show`: the redacted detail, as text and as JSON.
    let shown = stdout(&cli(&args(&["outbox", "show", &secret_key])).await);
    assert_clean("show", &shown);
    assert!(
        shown.contains(&format!("target: POST {SHOWN_URL}")),
        "{label}: {shown}"
    );
    assert!(shown.contains("state: pending"), "{label}: {shown}");
    let shown = stdout(&cli(&args(&["--json", "outbox", "show", &secret_key])).await);
    assert_clean("show --json", &shown);
    let shown: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["key"], secret_key.as_str(), "{label}: {shown}");
    assert_eq!(shown["url"], SHOWN_URL);
    let failed = json(&args(&["--json", "outbox", "show", &keys[1]])).await;
    assert_eq!(failed["last_error"], REFUSAL, "{label}: {failed}");
    assert_eq!(failed["topic"], "orders");
    assert_eq!(failed["body"], "payload");
    assert_eq!(
        failed["history"][0]["outcome"], "failed",
        "{label}: {failed}"
    );
    assert_eq!(failed["history"][0]["error"], REFUSAL);
    let text = stdout(&cli(&args(&["outbox", "show", &keys[1]])).await);
    assert!(
        text.contains("attempt 1: started_at_ms="),
        "{label}: {text}"
    );
    refused(
        &args(&["outbox", "show", "absent"]),
        "no message with this key",
        label,
    )
    .await;

    // `retry`: a failed message goes back to pending; then it is not failed any more.
    let retried = json(&args(&["--json", "outbox", "retry", &keys[0]])).await;
    assert_eq!(retried["retried"], keys[0].as_str(), "{label}: {retried}");
    let state = |key: String| {
        let outbox = outbox.clone();
        async move { outbox.get(&key).await.unwrap().map(|message| message.state) }
    };
    assert_eq!(state(keys[0].clone()).await, Some(MessageState::Pending));
    refused(
        &args(&["outbox", "retry", &keys[0]]),
        "no failed message with this key",
        label,
    )
    .await;
    refused(
        &args(&["outbox", "retry", "absent"]),
        "no failed message with this key",
        label,
    )
    .await;

    // `discard`: a failed message is given up; an absent one is refused.
    let discarded = stdout(&cli(&args(&["outbox", "discard", &keys[1]])).await);
    assert_eq!(
        discarded.trim(),
        format!("discarded {}", keys[1]),
        "{label}"
    );
    assert_eq!(state(keys[1].clone()).await, Some(MessageState::Discarded));
    refused(
        &args(&["outbox", "discard", "absent"]),
        "no failed or idle pending message with this key",
        label,
    )
    .await;

    // `purge`: nothing finished an hour ago; the discarded message is finished now.
    let kept = json(&args(&[
        "--json",
        "outbox",
        "purge",
        "--older-than-secs",
        "3600",
    ]))
    .await;
    assert_eq!(kept["purged"], 0, "{label}: {kept}");
    assert_eq!(state(keys[1].clone()).await, Some(MessageState::Discarded));
    let purged = json(&args(&[
        "--json",
        "outbox",
        "purge",
        "--older-than-secs",
        "0",
    ]))
    .await;
    assert_eq!(purged["purged"], 1, "{label}: {purged}");
    assert_eq!(state(keys[1].clone()).await, None);
    assert_eq!(state(secret_key.clone()).await, Some(MessageState::Pending));

    // The audit, newest first: each change that took effect, as `--operator` or the user made it.
    let audit = json(&args(&["--json", "--operator", "ops", "outbox", "audit"])).await;
    let entries: Vec<(&str, &str, u64)> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            (
                entry["action"].as_str().unwrap(),
                entry["target"].as_str().unwrap(),
                entry["changed"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [
            ("purge", "finished more than 0 s ago", 1),
            ("purge", "finished more than 3600 s ago", 0),
            ("discard", keys[1].as_str(), 1),
            ("retry", keys[0].as_str(), 1),
        ],
        "{label}: {audit}"
    );
    let user = format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    );
    assert!(audit
        .as_array()
        .unwrap()
        .iter()
        .all(|entry| entry["who"] == user.as_str()));
    // `pause`, `pauses`, `resume`: the pause is stored for every worker, by the CLI's operator,
    // and audited.
    let paused = stdout(&cli(&args(&["outbox", "pause", "API.Example.com"])).await);
    assert_eq!(paused.trim(), "paused api.example.com", "{label}");
    let again = json(&args(&["--json", "outbox", "pause", "API.Example.com"])).await;
    assert_eq!(again["changed"], false, "{label}: {again}");
    let stored = outbox.pauses().await.unwrap();
    assert_eq!(stored.len(), 1, "{label}");
    assert_eq!(
        (stored[0].scope.as_str(), stored[0].by.as_str()),
        ("api.example.com", user.as_str())
    );
    let listed = stdout(&cli(&args(&["outbox", "pauses"])).await);
    let row = listed.lines().nth(1).unwrap_or_default();
    assert!(
        row.starts_with("api.example.com ") && row.ends_with(user.as_str()),
        "{label}: {listed}"
    );
    let listed = json(&args(&["--json", "outbox", "pauses"])).await;
    assert_eq!(listed[0]["scope"], "api.example.com", "{label}: {listed}");
    let resumed = stdout(&cli(&args(&["outbox", "resume", "API.Example.com"])).await);
    assert_eq!(resumed.trim(), "resumed api.example.com", "{label}");
    assert!(outbox.pauses().await.unwrap().is_empty(), "{label}");
    let again = cli(&args(&["outbox", "resume", "API.Example.com"])).await;
    assert_eq!(again.status.code(), Some(1), "{label}");
    let message = String::from_utf8_lossy(&again.stderr);
    assert!(message.contains("this is not paused"), "{label}: {message}");
    // Audited: the pause that took effect and the resume, not the second pause.
    let audit = json(&args(&["--json", "outbox", "audit", "--limit", "3"])).await;
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions[..2], ["resume", "pause"], "{label}: {audit}");

    // A store that holds no outbox is refused before anything runs.
    refused(
        &["--store", "redis://127.0.0.1:6379", "outbox", "list"].map(str::to_owned),
        "the outbox lives in a SQLite or Postgres database",
        label,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_commands_sqlite() {
    let dir = std::env::temp_dir().join(format!("tidem-cli-outbox-{}", random_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}/outbox.db", dir.display());
    let options: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
    let options = options
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    let outbox = Outbox::new(pool.clone(), "outbox").unwrap();
    drive(outbox, pool.clone(), &url, "sqlite").await;
    pool.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_commands_postgres() {
    require_postgres!("outbox CLI test (postgres)");
    let url = database_url();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let table = format!("cli_outbox_{}", random_suffix());
    let outbox = Outbox::new(pool.clone(), &table).unwrap();
    drive(outbox, pool.clone(), &url, "postgres").await;
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
async fn outbox_commands_mysql() {
    if !tower_idempotency_testkit::mysql_or_skip("outbox CLI test (mysql)") {
        return;
    }
    let url = tower_idempotency_testkit::mysql_url();
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    let table = tower_idempotency_testkit::mysql_table("cli_outbox");
    let outbox = Outbox::new(pool.clone(), &table).unwrap();
    drive(outbox, pool.clone(), &url, "mysql").await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(
        tower_idempotency_testkit::drop_job_tables_sql(&table),
    ))
    .execute(&pool)
    .await
    .unwrap();
}
