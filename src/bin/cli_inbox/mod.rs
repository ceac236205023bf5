//! `tower-idempotency inbox list|retry`: the webhook inbox's failed and pending events, from the
//! command line ([docs/cli.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/cli.md)).

use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;
use tower_idempotency::inbox::{
    EventKey, EventState, EventSummary, Inbox, InboxDatabase, InboxError, DEFAULT_TABLE,
};

use crate::{describe, CliError};

#[derive(Debug, Subcommand)]
pub enum InboxCommand {
    /// List the inbox's events in one state, oldest first.
    List(ListArgs),
    /// Put a failed event back to pending, with a fresh count of attempts; a running worker
    /// picks it up at its next sweep.
    Retry(RetryArgs),
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

#[derive(Debug, Args)]
pub struct RetryArgs {
    /// The provider's name (`stripe`, `github`, ...).
    provider: String,
    /// The provider's event id.
    event_id: String,
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

/// What an inbox command answers.
pub enum Answer {
    Events(Vec<EventSummary>),
    Retried(EventKey),
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
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
}

impl InboxCommand {
    fn table(&self) -> &str {
        match self {
            Self::List(args) => &args.inbox_table,
            Self::Retry(args) => &args.inbox_table,
        }
    }
}

/// Runs `command` on the inbox of the database `url` names (SQLite or Postgres), without
/// creating anything.
pub async fn run(url: &str, command: &InboxCommand) -> Result<Answer, CliError> {
    let scheme = url.split_once(':').map_or(url, |(scheme, _)| scheme);
    let connect = |store: &'static str| {
        move |error: &dyn std::error::Error| CliError::Connect {
            store,
            reason: describe(error, url),
        }
    };
    let failed = |error: InboxError| CliError::Store(describe(&error, url));
    match scheme {
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            crate::check_sqlite_file(url)?;
            let pool = tower_idempotency::sqlx::SqlitePool::connect(url)
                .await
                .map_err(|e| connect("sqlite")(&e))?;
            let inbox = Inbox::new(pool, command.table()).map_err(|e| connect("sqlite")(&e))?;
            execute(&inbox, command).await.map_err(failed)?
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            let pool = tower_idempotency::sqlx::PgPool::connect(url)
                .await
                .map_err(|e| connect("postgres")(&e))?;
            let inbox = Inbox::new(pool, command.table()).map_err(|e| connect("postgres")(&e))?;
            execute(&inbox, command).await.map_err(failed)?
        }
        "memory" | "redis" | "rediss" => Err(CliError::NotSql),
        _ => Err(CliError::UnsupportedScheme),
    }
}

async fn execute<DB: InboxDatabase>(
    inbox: &Inbox<DB>,
    command: &InboxCommand,
) -> Result<Result<Answer, CliError>, InboxError> {
    Ok(match command {
        InboxCommand::List(args) => Ok(Answer::Events(
            inbox.list(args.state.into(), args.limit).await?,
        )),
        InboxCommand::Retry(args) => {
            let key = EventKey::new(args.provider.as_str(), args.event_id.as_str());
            if inbox.retry(&key).await? {
                Ok(Answer::Retried(key))
            } else {
                Err(CliError::NotFailed)
            }
        }
    })
}
