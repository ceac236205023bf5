//! `tower-idempotency outbox list|show|retry|discard|purge|audit|pause|resume|pauses`: the
//! transactional outbox's
//! messages, from the command line ([docs/cli.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/cli.md)).
//! Every URL it prints is shown without user-info and with its query values masked
//! (`admin::shown`), and `show` prints the redacted detail of [`Outbox::message`].

use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Value};
use tower_idempotency::outbox::{
    admin, MessageDetail, MessageState, MessageSummary, Outbox, OutboxDatabase, OutboxError,
    DEFAULT_TABLE,
};

use tower_idempotency::jobs::audit::{AuditAction, AuditEntry, DEFAULT_AUDIT_LIMIT};

use crate::{describe, CliError};

#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// List the outbox's messages in one state, oldest first.
    List(ListArgs),
    /// One message in full: target (URL credentials and query values masked), headers
    /// (credentials redacted), body (credential fields masked), attempts, last error.
    Show(KeyArgs),
    /// Put a failed message back to pending, due now, with a fresh count of attempts.
    Retry(KeyArgs),
    /// Give up a failed message, or a pending one no relay is delivering: it is never
    /// attempted again.
    Discard(KeyArgs),
    /// Delete the messages delivered or discarded more than `--older-than-secs` ago.
    Purge(PurgeArgs),
    /// The newest operator changes (retry, discard, purge, pause, resume): when, who, what, how
    /// many messages.
    Audit(AuditArgs),
    /// Pause the delivery to a target host (or `broker:nats`, `broker:rabbitmq`,
    /// `topic:NAME`): its messages stay pending and spend no attempt until resumed, on every
    /// relay.
    Pause(ScopeArgs),
    /// Resume a paused host: its messages are due at once.
    Resume(ScopeArgs),
    /// List what is paused.
    Pauses(TableArgs),
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// At most this many, newest first.
    #[arg(long, default_value_t = DEFAULT_AUDIT_LIMIT)]
    limit: u32,
    /// The outbox table.
    #[arg(long, default_value = DEFAULT_TABLE)]
    outbox_table: String,
}

#[derive(Debug, Args)]
pub struct ScopeArgs {
    /// The target host (`api.example.com`), `broker:nats`, `broker:rabbitmq` or `topic:NAME`.
    scope: String,
    /// The outbox table.
    #[arg(long, default_value = DEFAULT_TABLE)]
    outbox_table: String,
}

#[derive(Debug, Args)]
pub struct TableArgs {
    /// The outbox table.
    #[arg(long, default_value = DEFAULT_TABLE)]
    outbox_table: String,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Which messages.
    #[arg(long, value_enum, default_value_t = State::Failed)]
    state: State,
    /// At most this many (up to 1000).
    #[arg(long, default_value_t = 100)]
    limit: u32,
    /// The outbox table.
    #[arg(long, default_value = DEFAULT_TABLE)]
    outbox_table: String,
}

#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The message's key (its `Idempotency-Key`).
    key: String,
    /// The outbox table.
    #[arg(long, default_value = DEFAULT_TABLE)]
    outbox_table: String,
}

#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Purge the messages delivered or discarded longer ago than this many seconds.
    #[arg(long)]
    older_than_secs: u64,
    /// The outbox table.
    #[arg(long, default_value = DEFAULT_TABLE)]
    outbox_table: String,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum State {
    Pending,
    Delivered,
    Failed,
    Discarded,
}

impl From<State> for MessageState {
    fn from(state: State) -> Self {
        match state {
            State::Pending => MessageState::Pending,
            State::Delivered => MessageState::Delivered,
            State::Failed => MessageState::Failed,
            State::Discarded => MessageState::Discarded,
        }
    }
}

impl OutboxCommand {
    fn table(&self) -> &str {
        match self {
            Self::List(args) => &args.outbox_table,
            Self::Show(args) | Self::Retry(args) | Self::Discard(args) => &args.outbox_table,
            Self::Purge(args) => &args.outbox_table,
            Self::Audit(args) => &args.outbox_table,
            Self::Pause(args) | Self::Resume(args) => &args.outbox_table,
            Self::Pauses(args) => &args.outbox_table,
        }
    }
}

/// What an outbox command answers.
pub enum Answer {
    /// Summaries, their URLs already shown through `admin::shown`.
    Messages(Vec<MessageSummary>),
    Detail(Box<MessageDetail>),
    Retried(String),
    Discarded(String),
    Purged(u64),
    Audit(Vec<AuditEntry>),
    Paused(String, bool),
    Resumed(String),
    Pauses(Vec<tower_idempotency::jobs::Pause>),
}

impl Answer {
    pub fn print(&self, as_json: bool) {
        match self {
            Self::Messages(messages) if as_json => {
                println!("{}", serde_json::to_value(messages).unwrap_or(Value::Null));
            }
            Self::Messages(messages) => print_table(messages),
            Self::Detail(detail) if as_json => {
                println!("{}", serde_json::to_value(detail).unwrap_or(Value::Null));
            }
            Self::Detail(detail) => {
                let message = &detail.summary;
                println!("key: {}", message.key);
                println!("scope: {}", message.scope.as_deref().unwrap_or("-"));
                println!("target: {}", target(message));
                println!("state: {}", message.state.as_str());
                println!("attempts: {}", message.attempts);
                println!("created_at_ms: {}", message.created_at_ms);
                println!("available_at_ms: {}", message.available_at_ms);
                println!("finished_at_ms: {}", optional(message.finished_at_ms));
                println!("last_status: {}", optional(message.last_status));
                println!(
                    "last_error: {}",
                    message.last_error.as_deref().unwrap_or("-")
                );
                for (name, value) in &detail.headers {
                    println!("header: {name}: {value}");
                }
                crate::print_attempts(&detail.history);
                println!();
                println!("{}", detail.body_pretty.as_deref().unwrap_or(&detail.body));
            }
            Self::Retried(key) if as_json => println!("{}", json!({ "retried": key })),
            Self::Retried(key) => println!("retried {key}"),
            Self::Discarded(key) if as_json => println!("{}", json!({ "discarded": key })),
            Self::Discarded(key) => println!("discarded {key}"),
            Self::Purged(purged) if as_json => println!("{}", json!({ "purged": purged })),
            Self::Purged(purged) => println!("purged {purged} delivered or discarded messages"),
            Self::Audit(entries) => crate::print_audit(entries, as_json),
            Self::Paused(scope, changed) => crate::print_paused("paused", scope, *changed, as_json),
            Self::Resumed(scope) => crate::print_paused("resumed", scope, true, as_json),
            Self::Pauses(pauses) => crate::print_pauses(pauses, as_json),
        }
    }
}

fn optional<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| value.to_string())
}

/// Where a message goes: `METHOD URL` for an HTTP message, `topic TOPIC` for a dispatched one.
fn target(message: &MessageSummary) -> String {
    match (&message.method, &message.url, &message.topic) {
        (Some(method), Some(url), _) => format!("{method} {url}"),
        (_, _, Some(topic)) => format!("topic {topic}"),
        _ => "-".to_owned(),
    }
}

/// One row per message under a header, columns padded to their widest cell.
fn print_table(messages: &[MessageSummary]) {
    let header = [
        "KEY",
        "STATE",
        "ATTEMPTS",
        "CREATED_AT_MS",
        "LAST_STATUS",
        "TARGET",
        "LAST_ERROR",
    ];
    let rows: Vec<[String; 7]> = messages
        .iter()
        .map(|message| {
            [
                message.key.clone(),
                message.state.as_str().to_owned(),
                message.attempts.to_string(),
                message.created_at_ms.to_string(),
                optional(message.last_status),
                target(message),
                // One line per message: the error's own line breaks are flattened.
                message
                    .last_error
                    .as_deref()
                    .unwrap_or("-")
                    .replace(['\n', '\r'], " "),
            ]
        })
        .collect();
    crate::print_table(header, &rows);
}

/// Runs `command` on the outbox of the database `url` names (SQLite, Postgres or MySQL), without
/// creating anything; a change is audited as made by `who`.
pub async fn run(url: &str, command: &OutboxCommand, who: &str) -> Result<Answer, CliError> {
    let failed = |error: OutboxError| CliError::Store(describe(&error, url));
    match crate::sql_pool(url, CliError::OutboxNotSql).await? {
        #[cfg(feature = "sqlite")]
        crate::SqlPool::Sqlite(pool) => {
            let outbox = Outbox::new(pool, command.table())
                .map_err(|e| crate::connect_error("sqlite", &e, url))?;
            execute(&outbox, command, who).await.map_err(failed)?
        }
        #[cfg(feature = "postgres")]
        crate::SqlPool::Postgres(pool) => {
            let outbox = Outbox::new(pool, command.table())
                .map_err(|e| crate::connect_error("postgres", &e, url))?;
            execute(&outbox, command, who).await.map_err(failed)?
        }
        #[cfg(feature = "mysql")]
        crate::SqlPool::MySql(pool) => {
            let outbox = Outbox::new(pool, command.table())
                .map_err(|e| crate::connect_error("mysql", &e, url))?;
            execute(&outbox, command, who).await.map_err(failed)?
        }
    }
}

async fn execute<DB: OutboxDatabase>(
    outbox: &Outbox<DB>,
    command: &OutboxCommand,
    who: &str,
) -> Result<Result<Answer, CliError>, OutboxError> {
    let answer = answer(outbox, command, who).await?;
    let change = match (command, &answer) {
        (_, Ok(Answer::Retried(key))) => Some((AuditAction::Retry, key.clone(), 1)),
        (_, Ok(Answer::Discarded(key))) => Some((AuditAction::Discard, key.clone(), 1)),
        (_, Ok(Answer::Paused(scope, true))) => Some((AuditAction::Pause, scope.clone(), 1)),
        (_, Ok(Answer::Resumed(scope))) => Some((AuditAction::Resume, scope.clone(), 1)),
        (OutboxCommand::Purge(args), Ok(Answer::Purged(purged))) => Some((
            AuditAction::Purge,
            format!("finished more than {} s ago", args.older_than_secs),
            *purged,
        )),
        _ => None,
    };
    if let Some((action, target, changed)) = change {
        let entry = AuditEntry::now(who, action, target, changed);
        if outbox.audit(&entry).await.is_err() {
            eprintln!("warning: the change was made, but its audit entry was not stored");
        }
    }
    Ok(answer)
}

async fn answer<DB: OutboxDatabase>(
    outbox: &Outbox<DB>,
    command: &OutboxCommand,
    who: &str,
) -> Result<Result<Answer, CliError>, OutboxError> {
    Ok(match command {
        OutboxCommand::List(args) => {
            let messages = outbox.list(args.state.into(), args.limit).await?;
            Ok(Answer::Messages(
                messages.into_iter().map(admin::shown).collect(),
            ))
        }
        OutboxCommand::Show(args) => match outbox.message(&args.key).await? {
            Some(detail) => Ok(Answer::Detail(Box::new(detail))),
            None => Err(CliError::NoMessage),
        },
        OutboxCommand::Retry(args) => {
            if outbox.retry(&args.key).await? {
                Ok(Answer::Retried(args.key.clone()))
            } else {
                Err(CliError::NotFailedMessage)
            }
        }
        OutboxCommand::Discard(args) => {
            if outbox.discard(&args.key).await? {
                Ok(Answer::Discarded(args.key.clone()))
            } else {
                Err(CliError::NotDiscardable)
            }
        }
        OutboxCommand::Purge(args) => Ok(Answer::Purged(
            outbox
                .purge_finished(Duration::from_secs(args.older_than_secs))
                .await?,
        )),
        OutboxCommand::Audit(args) => Ok(Answer::Audit(outbox.audit_log(args.limit).await?)),
        OutboxCommand::Pause(args) => {
            let paused = outbox.pause(&args.scope, who).await?;
            Ok(Answer::Paused(admin::pause_scope(&args.scope), paused))
        }
        OutboxCommand::Resume(args) => {
            if outbox.resume(&args.scope).await? {
                Ok(Answer::Resumed(admin::pause_scope(&args.scope)))
            } else {
                Err(CliError::NotPaused)
            }
        }
        OutboxCommand::Pauses(_) => Ok(Answer::Pauses(outbox.pauses().await?)),
    })
}
