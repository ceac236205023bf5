//! `tower-idempotency inbox list|counts|show|retry|replay|discard|purge|audit|pause|resume|pauses`:
//! the webhook inbox's events,
//! from the command line ([docs/cli.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/cli.md)).

use std::{num::NonZeroU32, time::Duration};

use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;
use tower_idempotency::inbox::{
    BulkReplay, BulkRetry, BulkRetryOptions, EventDetail, EventFilter, EventKey, EventPage,
    EventState, EventSummary, Inbox, InboxDatabase, InboxError, ProviderCounts, StateCounts,
    DEFAULT_TABLE,
};

use tower_idempotency::jobs::audit::{AuditAction, AuditEntry, DEFAULT_AUDIT_LIMIT};

use crate::{describe, CliError};

#[derive(Debug, Subcommand)]
pub enum InboxCommand {
    /// List the inbox's events in one state, oldest first.
    List(ListArgs),
    /// List events by filters, newest first, a page at a time (`--cursor` from the last line).
    Events(EventsArgs),
    /// How many events are in each state, overall and per provider, and the age of the
    /// oldest pending one.
    Counts(TableArg),
    /// One event in full: kept headers (credentials redacted), body, attempts, last error.
    Show(KeyArgs),
    /// Put a failed event back to pending, with a fresh count of attempts; or, without an
    /// event, every failed event matching the filters (`--dry-run` only counts them).
    Retry(RetryArgs),
    /// Run a processed or skipped event through the handler again (a fresh count of attempts,
    /// the replay recorded in its history); or, without an event, every processed and skipped
    /// event matching the filters (`--dry-run` only counts them).
    Replay(RetryArgs),
    /// Delete a failed event.
    Discard(KeyArgs),
    /// Delete the events processed more than `--older-than-secs` ago.
    Purge(PurgeArgs),
    /// The newest operator changes (retry, replay, discard, purge, pause, resume): when, who,
    /// what, how many events.
    Audit(AuditArgs),
    /// Pause a provider's events, or (with `--type`) those of one of its event types: they are
    /// still acknowledged, and stay pending without spending an attempt until resumed, on
    /// every worker.
    Pause(PauseArgs),
    /// Resume what `pause` paused: its events are due at once.
    Resume(PauseArgs),
    /// List what is paused (`provider` or `provider/type`).
    Pauses(TableArg),
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// At most this many, newest first.
    #[arg(long, default_value_t = DEFAULT_AUDIT_LIMIT)]
    limit: u32,
    /// The inbox table.
    #[arg(long, default_value = DEFAULT_TABLE)]
    inbox_table: String,
}

#[derive(Debug, Args)]
pub struct PauseArgs {
    /// The provider's name (`stripe`, `github`, ...).
    provider: String,
    /// Only its events of this type (the body's top-level `type`).
    #[arg(long = "type")]
    event_type: Option<String>,
    /// The inbox table.
    #[arg(long, default_value = DEFAULT_TABLE)]
    inbox_table: String,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only events in this state.
    #[arg(long, value_enum)]
    state: Option<State>,
    /// Only events from this provider.
    #[arg(long)]
    provider: Option<String>,
    /// Only events of this type (the body's top-level `type`).
    #[arg(long = "type")]
    event_type: Option<String>,
    /// Only events acknowledged at or after this RFC 3339 time.
    #[arg(long, value_parser = rfc3339)]
    received_after: Option<std::time::SystemTime>,
    /// Only events acknowledged before this RFC 3339 time.
    #[arg(long, value_parser = rfc3339)]
    received_before: Option<std::time::SystemTime>,
    /// The previous page's next cursor.
    #[arg(long)]
    cursor: Option<String>,
    /// At most this many (up to 500).
    #[arg(long, default_value_t = 100)]
    limit: u32,
    /// The inbox table.
    #[arg(long, default_value = DEFAULT_TABLE)]
    inbox_table: String,
}

#[derive(Debug, Args)]
pub struct TableArg {
    /// The inbox table.
    #[arg(long, default_value = DEFAULT_TABLE)]
    inbox_table: String,
}

#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The provider's name (`stripe`, `github`, ...).
    provider: String,
    /// The provider's event id.
    event_id: String,
    /// The inbox table.
    #[arg(long, default_value = DEFAULT_TABLE)]
    inbox_table: String,
}

#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Purge the events processed longer ago than this many seconds; keep them longer than
    /// the providers' retry schedule.
    #[arg(long)]
    older_than_secs: u64,
    /// The inbox table.
    #[arg(long, default_value = DEFAULT_TABLE)]
    inbox_table: String,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Which events.
    #[arg(long, value_enum, default_value_t = State::Failed)]
    state: State,
    /// At most this many (up to 1000).
    #[arg(long, default_value_t = 100)]
    limit: u32,
    /// The inbox table.
    #[arg(long, default_value = DEFAULT_TABLE)]
    inbox_table: String,
}

/// One event, or the filters of a bulk call: a retry takes failed events, a replay processed
/// and skipped ones.
#[derive(Debug, Args)]
pub struct RetryArgs {
    /// The provider's name (`stripe`, `github`, ...) of the one event.
    #[arg(requires = "event_id")]
    provider: Option<String>,
    /// The provider's event id.
    event_id: Option<String>,
    /// Without an event: only count the events the filters match.
    #[arg(long, conflicts_with = "provider")]
    dry_run: bool,
    /// Without an event: release the events at this many per second.
    #[arg(long, conflicts_with = "provider")]
    per_second: Option<NonZeroU32>,
    /// Only events from this provider.
    #[arg(long = "from-provider", conflicts_with = "provider")]
    from_provider: Option<String>,
    /// Only events of this type (the body's top-level `type`).
    #[arg(long = "type", conflicts_with = "provider")]
    event_type: Option<String>,
    /// Only events acknowledged at or after this RFC 3339 time.
    #[arg(long, value_parser = rfc3339, conflicts_with = "provider")]
    received_after: Option<std::time::SystemTime>,
    /// Only events acknowledged before this RFC 3339 time.
    #[arg(long, value_parser = rfc3339, conflicts_with = "provider")]
    received_before: Option<std::time::SystemTime>,
    /// The inbox table.
    #[arg(long, default_value = DEFAULT_TABLE)]
    inbox_table: String,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum State {
    Failed,
    Pending,
    Processed,
}

impl From<State> for EventState {
    fn from(state: State) -> Self {
        match state {
            State::Failed => EventState::Failed,
            State::Pending => EventState::Pending,
            State::Processed => EventState::Processed,
        }
    }
}

fn rfc3339(text: &str) -> Result<std::time::SystemTime, String> {
    tower_idempotency::inbox::parse_rfc3339(text)
        .ok_or_else(|| "not an RFC 3339 time (2026-01-02T03:04:05Z)".to_owned())
}

/// What an inbox command answers.
pub enum Answer {
    Events(Vec<EventSummary>),
    Page(EventPage),
    Retried(EventKey),
    Counts {
        states: StateCounts,
        providers: Vec<ProviderCounts>,
        oldest_pending_age: Option<Duration>,
    },
    Detail(Box<EventDetail>),
    Bulk(BulkRetry),
    Replayed(EventKey),
    BulkReplay(BulkReplay),
    Discarded(EventKey),
    Purged(u64),
    Audit(Vec<AuditEntry>),
    Paused(String, bool),
    Resumed(String),
    Pauses(Vec<tower_idempotency::jobs::Pause>),
}

impl Answer {
    pub fn print(&self, as_json: bool) {
        match self {
            Self::Retried(key) if as_json => {
                println!("{}", serde_json::json!({ "retried": key }));
            }
            Self::Retried(key) => println!("retried {} {}", key.provider, key.event_id),
            Self::Events(events) if as_json => {
                println!("{}", serde_json::to_value(events).unwrap_or(Value::Null));
            }
            Self::Events(events) => print_table(events),
            Self::Page(page) if as_json => {
                println!("{}", serde_json::to_value(page).unwrap_or(Value::Null));
            }
            Self::Page(page) => {
                println!("PROVIDER  EVENT_ID  TYPE  STATE  ATTEMPTS  RECEIVED_AT  LAST_ERROR");
                for event in &page.events {
                    println!(
                        "{}  {}  {}  {}  {}  {}  {}",
                        event.provider,
                        event.event_id,
                        event.event_type.as_deref().unwrap_or("-"),
                        event.state.as_str(),
                        event.attempts,
                        event.received_at,
                        event
                            .last_error
                            .as_deref()
                            .unwrap_or("-")
                            .replace(['\n', '\r'], " ")
                    );
                }
                if let Some(cursor) = &page.next_cursor {
                    println!("next page: --cursor {cursor}");
                }
            }
            Self::Counts {
                states,
                providers,
                oldest_pending_age,
            } => {
                let age = oldest_pending_age.map(|age| age.as_secs_f64());
                if as_json {
                    let json = serde_json::json!({
                        "pending": states.pending,
                        "processed": states.processed,
                        "failed": states.failed,
                        "providers": providers,
                        "oldest_pending_age_secs": age,
                    });
                    println!("{json}");
                } else {
                    println!("PROVIDER  PENDING  PROCESSED  FAILED");
                    for p in providers {
                        println!(
                            "{}  {}  {}  {}",
                            p.provider, p.pending, p.processed, p.failed
                        );
                    }
                    println!(
                        "total  {}  {}  {}",
                        states.pending, states.processed, states.failed
                    );
                    match age {
                        Some(age) => println!("oldest pending: {age:.3} s"),
                        None => println!("oldest pending: none"),
                    }
                }
            }
            Self::Detail(detail) if as_json => {
                println!("{}", serde_json::to_value(detail).unwrap_or(Value::Null));
            }
            Self::Detail(detail) => {
                let record = &detail.record;
                println!("provider: {}", record.provider);
                println!("event_id: {}", record.event_id);
                println!("type: {}", record.event_type.as_deref().unwrap_or("-"));
                println!("state: {}", record.state.as_str());
                println!("attempts: {}", record.attempts);
                println!("received_at: {}", record.received_at);
                println!("available_at: {}", record.available_at);
                println!(
                    "finished_at: {}",
                    record.finished_at.as_deref().unwrap_or("-")
                );
                println!(
                    "last_error: {}",
                    record.last_error.as_deref().unwrap_or("-")
                );
                for (name, value) in &detail.headers {
                    println!("header: {name}: {value}");
                }
                crate::print_attempts(&detail.history);
                println!();
                println!("{}", detail.body_pretty.as_deref().unwrap_or(&detail.body));
            }
            Self::Bulk(bulk) if as_json => {
                println!("{}", serde_json::to_value(bulk).unwrap_or(Value::Null));
            }
            Self::Bulk(bulk) if bulk.dry_run => {
                println!("would retry {} failed events", bulk.matched);
            }
            Self::Bulk(bulk) => match &bulk.last_due_at {
                Some(last) => println!(
                    "retried {} of {} failed events, the last due at {last}",
                    bulk.retried, bulk.matched
                ),
                None => println!("retried {} of {} failed events", bulk.retried, bulk.matched),
            },
            Self::Discarded(key) if as_json => {
                println!("{}", serde_json::json!({ "discarded": key }));
            }
            Self::Discarded(key) => println!("discarded {} {}", key.provider, key.event_id),
            Self::Purged(purged) if as_json => {
                println!("{}", serde_json::json!({ "purged": purged }));
            }
            Self::Purged(purged) => println!("purged {purged} processed events"),
            Self::Replayed(key) if as_json => {
                println!("{}", serde_json::json!({ "replayed": key }));
            }
            Self::Replayed(key) => println!("replayed {} {}", key.provider, key.event_id),
            Self::BulkReplay(bulk) if as_json => {
                println!("{}", serde_json::to_value(bulk).unwrap_or(Value::Null));
            }
            Self::BulkReplay(bulk) if bulk.dry_run => {
                println!("would replay {} processed or skipped events", bulk.matched);
            }
            Self::BulkReplay(bulk) => println!(
                "replayed {} of {} processed or skipped events",
                bulk.replayed, bulk.matched
            ),
            Self::Audit(entries) => crate::print_audit(entries, as_json),
            Self::Paused(scope, changed) => crate::print_paused("paused", scope, *changed, as_json),
            Self::Resumed(scope) => crate::print_paused("resumed", scope, true, as_json),
            Self::Pauses(pauses) => crate::print_pauses(pauses, as_json),
        }
    }
}

/// One row per event under a header, columns padded to their widest cell.
fn print_table(events: &[EventSummary]) {
    let header = [
        "PROVIDER",
        "EVENT_ID",
        "STATE",
        "ATTEMPTS",
        "RECEIVED_AT_MS",
        "LAST_ERROR",
    ];
    let rows: Vec<[String; 6]> = events
        .iter()
        .map(|event| {
            [
                event.provider.clone(),
                event.event_id.clone(),
                event.state.as_str().to_owned(),
                event.attempts.to_string(),
                event.received_at_ms.to_string(),
                // One line per event: the error's own line breaks are flattened.
                event
                    .last_error
                    .as_deref()
                    .unwrap_or("-")
                    .replace(['\n', '\r'], " "),
            ]
        })
        .collect();
    crate::print_table(header, &rows);
}

impl InboxCommand {
    fn table(&self) -> &str {
        match self {
            Self::List(args) => &args.inbox_table,
            Self::Events(args) => &args.inbox_table,
            Self::Retry(args) | Self::Replay(args) => &args.inbox_table,
            Self::Audit(args) => &args.inbox_table,
            Self::Counts(args) => &args.inbox_table,
            Self::Show(args) | Self::Discard(args) => &args.inbox_table,
            Self::Purge(args) => &args.inbox_table,
            Self::Pause(args) | Self::Resume(args) => &args.inbox_table,
            Self::Pauses(args) => &args.inbox_table,
        }
    }
}

/// Runs `command` on the inbox of the database `url` names (SQLite, Postgres or MySQL), without
/// creating anything; a change is audited as made by `who`.
pub async fn run(url: &str, command: &InboxCommand, who: &str) -> Result<Answer, CliError> {
    let failed = |error: InboxError| CliError::Store(describe(&error, url));
    match crate::sql_pool(url, CliError::NotSql).await? {
        #[cfg(feature = "sqlite")]
        crate::SqlPool::Sqlite(pool) => {
            let inbox = Inbox::new(pool, command.table())
                .map_err(|e| crate::connect_error("sqlite", &e, url))?;
            execute(&inbox, command, who).await.map_err(failed)?
        }
        #[cfg(feature = "postgres")]
        crate::SqlPool::Postgres(pool) => {
            let inbox = Inbox::new(pool, command.table())
                .map_err(|e| crate::connect_error("postgres", &e, url))?;
            execute(&inbox, command, who).await.map_err(failed)?
        }
        #[cfg(feature = "mysql")]
        crate::SqlPool::MySql(pool) => {
            let inbox = Inbox::new(pool, command.table())
                .map_err(|e| crate::connect_error("mysql", &e, url))?;
            execute(&inbox, command, who).await.map_err(failed)?
        }
    }
}

/// The options of a bulk call.
fn options(args: &RetryArgs) -> BulkRetryOptions {
    BulkRetryOptions {
        dry_run: args.dry_run,
        per_second: args.per_second,
    }
}

/// The filters of a bulk call.
fn filter(args: &RetryArgs, state: Option<EventState>) -> EventFilter {
    EventFilter {
        state,
        provider: args.from_provider.clone(),
        event_type: args.event_type.clone(),
        received_after: args.received_after,
        received_before: args.received_before,
    }
}

async fn execute<DB: InboxDatabase>(
    inbox: &Inbox<DB>,
    command: &InboxCommand,
    who: &str,
) -> Result<Result<Answer, CliError>, InboxError> {
    let answer = answer(inbox, command, who).await?;
    if let Ok(done) = &answer {
        let change = match (command, done) {
            (_, Answer::Retried(key)) => Some((AuditAction::Retry, described(key), 1)),
            (_, Answer::Replayed(key)) => Some((AuditAction::Replay, described(key), 1)),
            (_, Answer::Discarded(key)) => Some((AuditAction::Discard, described(key), 1)),
            (_, Answer::Paused(scope, true)) => Some((AuditAction::Pause, scope.clone(), 1)),
            (_, Answer::Resumed(scope)) => Some((AuditAction::Resume, scope.clone(), 1)),
            (InboxCommand::Purge(args), Answer::Purged(purged)) => Some((
                AuditAction::Purge,
                format!("finished more than {} s ago", args.older_than_secs),
                *purged,
            )),
            (InboxCommand::Retry(args), Answer::Bulk(bulk)) if !bulk.dry_run => Some((
                AuditAction::BulkRetry,
                filter(args, Some(EventState::Failed)).described(),
                bulk.retried,
            )),
            (InboxCommand::Replay(args), Answer::BulkReplay(bulk)) if !bulk.dry_run => Some((
                AuditAction::BulkReplay,
                filter(args, None).described(),
                bulk.replayed,
            )),
            _ => None,
        };
        if let Some((action, target, changed)) = change {
            if inbox
                .audit(&AuditEntry::now(who, action, target, changed))
                .await
                .is_err()
            {
                eprintln!("warning: the change was made, but its audit entry was not stored");
            }
        }
    }
    Ok(answer)
}

fn described(key: &EventKey) -> String {
    format!("{}/{}", key.provider, key.event_id)
}

async fn answer<DB: InboxDatabase>(
    inbox: &Inbox<DB>,
    command: &InboxCommand,
    who: &str,
) -> Result<Result<Answer, CliError>, InboxError> {
    Ok(match command {
        InboxCommand::List(args) => Ok(Answer::Events(
            inbox.list(args.state.into(), args.limit).await?,
        )),
        InboxCommand::Events(args) => {
            let filter = EventFilter {
                state: args.state.map(Into::into),
                provider: args.provider.clone(),
                event_type: args.event_type.clone(),
                received_after: args.received_after,
                received_before: args.received_before,
            };
            match inbox
                .events(&filter, args.cursor.as_deref(), args.limit)
                .await
            {
                Ok(page) => Ok(Answer::Page(page)),
                Err(InboxError::InvalidCursor) => Err(CliError::BadCursor),
                Err(error) => return Err(error),
            }
        }
        InboxCommand::Retry(RetryArgs {
            provider: Some(provider),
            event_id: Some(event_id),
            ..
        }) => {
            let key = EventKey::new(provider.as_str(), event_id.as_str());
            if inbox.retry(&key).await? {
                Ok(Answer::Retried(key))
            } else {
                Err(CliError::NotFailed)
            }
        }
        InboxCommand::Retry(args) => {
            let filter = filter(args, Some(EventState::Failed));
            Ok(Answer::Bulk(
                inbox.retry_matching(&filter, options(args)).await?,
            ))
        }
        InboxCommand::Replay(RetryArgs {
            provider: Some(provider),
            event_id: Some(event_id),
            ..
        }) => {
            let key = EventKey::new(provider.as_str(), event_id.as_str());
            if inbox.replay(&key).await? {
                Ok(Answer::Replayed(key))
            } else {
                Err(CliError::NotReplayable)
            }
        }
        InboxCommand::Replay(args) => Ok(Answer::BulkReplay(
            inbox
                .replay_matching(&filter(args, None), options(args))
                .await?,
        )),
        InboxCommand::Audit(args) => Ok(Answer::Audit(inbox.audit_log(args.limit).await?)),
        InboxCommand::Counts(_) => Ok(Answer::Counts {
            states: inbox.counts().await?,
            providers: inbox.counts_by_provider().await?,
            oldest_pending_age: inbox.oldest_pending_age().await?,
        }),
        InboxCommand::Show(args) => {
            let key = EventKey::new(args.provider.as_str(), args.event_id.as_str());
            match inbox.event(&key).await? {
                Some(detail) => Ok(Answer::Detail(Box::new(detail))),
                None => Err(CliError::NoEvent),
            }
        }
        InboxCommand::Discard(args) => {
            let key = EventKey::new(args.provider.as_str(), args.event_id.as_str());
            if inbox.discard(&key).await? {
                Ok(Answer::Discarded(key))
            } else {
                Err(CliError::NotFailed)
            }
        }
        InboxCommand::Purge(args) => Ok(Answer::Purged(
            inbox
                .purge_processed(Duration::from_secs(args.older_than_secs))
                .await?,
        )),
        InboxCommand::Pause(args) => {
            let kind = args.event_type.as_deref();
            let scope = tower_idempotency::inbox::admin::pause_scope(&args.provider, kind);
            let paused = inbox.pause(&args.provider, kind, who).await?;
            Ok(Answer::Paused(scope, paused))
        }
        InboxCommand::Resume(args) => {
            let kind = args.event_type.as_deref();
            if inbox.resume(&args.provider, kind).await? {
                let scope = tower_idempotency::inbox::admin::pause_scope(&args.provider, kind);
                Ok(Answer::Resumed(scope))
            } else {
                Err(CliError::NotPaused)
            }
        }
        InboxCommand::Pauses(_) => Ok(Answer::Pauses(inbox.pauses().await?)),
    })
}
