//! `tower-idempotency`: answers "what happened to this request?" and forgets keys by hand.
//!
//! ```text
//! tower-idempotency --store URL [--json] inspect  (STORE_KEY | --namespace NS --method M --path P [--principal ID] --key KEY)
//! tower-idempotency --store URL [--json] forget   (STORE_KEY | --namespace NS --method M --path P [--principal ID] --key KEY)
//! tower-idempotency --store URL [--json] purge-expired
//! tower-idempotency --store URL [--json] inbox list [--state failed|pending|processed] [--limit N]
//! tower-idempotency --store URL [--json] inbox retry PROVIDER EVENT_ID
//! tower-idempotency --store URL [--json] inbox retry [--dry-run] [--per-second N] [--from-provider P] [--type T] [--received-after TIME] [--received-before TIME]
//! tower-idempotency --store URL [--json] inbox events [--state S] [--provider P] [--type T] [--received-after TIME] [--received-before TIME] [--cursor C] [--limit N]
//! tower-idempotency --store URL [--json] inbox counts | show PROVIDER EVENT_ID | discard PROVIDER EVENT_ID | purge --older-than-secs N
//! tower-idempotency --store URL [--json] outbox list [--state failed|pending|delivered|discarded] [--limit N]
//! tower-idempotency --store URL [--json] outbox show KEY | retry KEY | discard KEY | purge --older-than-secs N
//! ```
//!
//! `--store` takes the URLs of the reference receiver's `IDEMPOTENCY_STORE` (`sqlite://PATH`,
//! `postgres://...`, `mysql://...`, `redis://...`) and defaults to that variable. The inbox and
//! outbox commands answer an error on MySQL, where the inbox and the outbox do not run yet. See [docs/cli.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/cli.md).

#[cfg(not(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis"
)))]
compile_error!(
    "the `cli` feature needs at least one store feature: sqlite, postgres, mysql or redis"
);

#[cfg(feature = "inbox")]
#[path = "cli_inbox/mod.rs"]
mod inbox;

#[cfg(feature = "outbox")]
#[path = "cli_outbox/mod.rs"]
mod outbox;

use std::{process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};
use tower_idempotency::store::{
    is_valid_namespace, store_key_from_parts, RecordState, Store, StoreError,
};

/// The default Redis key prefix, the one `connect_store` (and so the reference receiver) uses.
const DEFAULT_REDIS_PREFIX: &str = "idempotency";
/// The default SQL table of the SQLite, Postgres and MySQL stores.
const DEFAULT_TABLE: &str = "idempotency_records";

#[derive(Debug, Parser)]
#[command(
    name = "tower-idempotency",
    version,
    about = "Inspect, forget and purge idempotency records in a tower-idempotency store."
)]
struct Cli {
    /// The store: sqlite://PATH, postgres://..., mysql://..., redis://... (as the reference
    /// receiver's IDEMPOTENCY_STORE).
    #[arg(long, env = "IDEMPOTENCY_STORE", global = true, hide_env_values = true)]
    store: Option<String>,
    /// The table of the SQLite, Postgres or MySQL store.
    #[arg(long, global = true, default_value = DEFAULT_TABLE)]
    table: String,
    /// The key prefix of the Redis store.
    #[arg(long, global = true, default_value = DEFAULT_REDIS_PREFIX)]
    redis_prefix: String,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Who the inbox's and outbox's audit records a change as made by (default `cli:` and the
    /// operating-system user).
    #[arg(long, env = "IDEMPOTENCY_OPERATOR", global = true)]
    operator: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show a record: absent, in flight (with the time left on its lease) or completed (with
    /// its status).
    Inspect(KeyArgs),
    /// Delete a record whatever its state, so the next request with its key runs the handler.
    Forget(KeyArgs),
    /// Delete every expired record (SQLite, Postgres, MySQL; Redis expires records by itself).
    PurgeExpired,
    /// The webhook inbox's events (SQLite, Postgres): list, count, show, retry (one or in bulk),
    /// discard, purge.
    #[cfg(feature = "inbox")]
    #[command(subcommand)]
    Inbox(inbox::InboxCommand),
    /// The transactional outbox's messages (SQLite, Postgres): list, show, retry, discard,
    /// purge.
    #[cfg(feature = "outbox")]
    #[command(subcommand)]
    Outbox(outbox::OutboxCommand),
}

/// A record's key: the scoped store key, or the parts the layer builds it from.
#[derive(Debug, Args)]
struct KeyArgs {
    /// The scoped store key (`namespace:` and 64 hex digits).
    #[arg(required_unless_present = "key", conflicts_with = "key")]
    store_key: Option<String>,
    /// The layer's namespace.
    #[arg(long, requires = "key")]
    namespace: Option<String>,
    /// The request method, as sent (e.g. POST).
    #[arg(long, requires = "key")]
    method: Option<String>,
    /// The request path without the query, as it arrived (before `Router::nest` stripped a
    /// prefix).
    #[arg(long, requires = "key")]
    path: Option<String>,
    /// The principal (tenant) the request was scoped by, if any.
    #[arg(long, requires = "key")]
    principal: Option<String>,
    /// The client's Idempotency-Key, or the provider's event id.
    #[arg(long, requires_all = ["namespace", "method", "path"])]
    key: Option<String>,
}

/// Why a command failed. Messages never contain the store URL (it may carry a password).
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("no store given: pass --store URL or set IDEMPOTENCY_STORE")]
    NoStore,
    #[error(
        "unsupported store URL scheme (expected sqlite://, postgres://, mysql:// or redis://)"
    )]
    UnsupportedScheme,
    #[error("the memory store lives inside one process; this tool cannot reach it")]
    MemoryStore,
    #[error("this build of the tool lacks the `{0}` cargo feature")]
    #[cfg_attr(
        all(
            feature = "sqlite",
            feature = "postgres",
            feature = "mysql",
            feature = "redis"
        ),
        allow(dead_code)
    )]
    FeatureDisabled(&'static str),
    #[error("no SQLite database file at the given path")]
    NoSuchFile,
    #[error("could not open the {store} store: {reason}")]
    Connect { store: &'static str, reason: String },
    #[error("not a scoped store key (`namespace:` followed by 64 lowercase hex digits)")]
    BadStoreKey,
    #[error("invalid namespace: 1 to 255 bytes of [A-Za-z0-9._-]")]
    BadNamespace,
    #[error("the store failed: {0}")]
    Store(String),
    #[cfg(feature = "inbox")]
    #[error("the webhook inbox lives in a SQLite or Postgres database")]
    NotSql,
    #[cfg(feature = "outbox")]
    #[error("the outbox lives in a SQLite or Postgres database")]
    OutboxNotSql,
    #[cfg(feature = "inbox")]
    #[error("no failed event with this provider and event id")]
    NotFailed,
    #[cfg(feature = "inbox")]
    #[error("no processed or skipped event with this provider and event id that kept its body")]
    NotReplayable,
    #[cfg(feature = "inbox")]
    #[error("no event with this provider and event id")]
    NoEvent,
    #[cfg(feature = "inbox")]
    #[error("the cursor is not one the inbox made")]
    BadCursor,
    #[cfg(feature = "outbox")]
    #[error("no message with this key")]
    NoMessage,
    #[cfg(feature = "outbox")]
    #[error("no failed message with this key")]
    NotFailedMessage,
    #[cfg(feature = "outbox")]
    #[error("no failed or idle pending message with this key")]
    NotDiscardable,
    #[cfg(any(feature = "inbox", feature = "outbox"))]
    #[error("this is not paused")]
    NotPaused,
}

/// A `pauses` command's answer: a JSON array, or one row per paused scope.
#[cfg(any(feature = "inbox", feature = "outbox"))]
fn print_pauses(pauses: &[tower_idempotency::jobs::Pause], as_json: bool) {
    if as_json {
        let pauses = serde_json::to_value(pauses).unwrap_or(serde_json::Value::Null);
        println!("{pauses}");
        return;
    }
    let rows: Vec<[String; 3]> = pauses
        .iter()
        .map(|pause| {
            [
                pause.scope.clone(),
                pause.paused_at_ms.to_string(),
                pause.by.clone(),
            ]
        })
        .collect();
    print_table(["SCOPE", "PAUSED_AT_MS", "BY"], &rows);
}

/// A `pause` or `resume` command's answer.
#[cfg(any(feature = "inbox", feature = "outbox"))]
fn print_paused(what: &str, scope: &str, changed: bool, as_json: bool) {
    if as_json {
        println!("{}", serde_json::json!({ what: scope, "changed": changed }));
    } else if changed {
        println!("{what} {scope}");
    } else {
        println!("{scope} was {what} already");
    }
}

/// An error and its sources on one line, with the store URL (and its password) blanked out.
/// Who a change is audited as made by: `--operator`, else `cli:` and the operating-system user.
#[cfg(any(feature = "inbox", feature = "outbox"))]
fn operator(cli: &Cli) -> String {
    cli.operator.clone().unwrap_or_else(|| {
        let user = std::env::var("USER").or_else(|_| std::env::var("USERNAME"));
        format!("cli:{}", user.as_deref().unwrap_or("unknown"))
    })
}

/// An `audit` command's entries, newest first: a table, or JSON.
#[cfg(any(feature = "inbox", feature = "outbox"))]
fn print_audit(entries: &[tower_idempotency::jobs::audit::AuditEntry], as_json: bool) {
    if as_json {
        println!(
            "{}",
            serde_json::to_value(entries).unwrap_or(serde_json::Value::Null)
        );
        return;
    }
    let rows: Vec<[String; 5]> = entries
        .iter()
        .map(|entry| {
            [
                tower_idempotency::jobs::time::rfc3339_ms(entry.at_ms),
                entry.who.clone(),
                entry.action_name().to_owned(),
                entry.target.clone(),
                entry.changed.to_string(),
            ]
        })
        .collect();
    print_table(["AT", "WHO", "ACTION", "TARGET", "CHANGED"], &rows);
}

/// A `show` command's attempt history, a line per recorded attempt, oldest first.
#[cfg(any(feature = "inbox", feature = "outbox"))]
fn print_attempts(attempts: &[tower_idempotency::jobs::Attempt]) {
    for attempt in attempts {
        let mut line = format!(
            "attempt {}: started_at_ms={} took_ms={} outcome={}",
            attempt.attempt,
            attempt.started_at_ms,
            attempt.duration_ms,
            attempt.outcome.as_str()
        );
        if let Some(status) = attempt.status {
            line.push_str(&format!(" status={status}"));
        }
        if let Some(error) = &attempt.error {
            line.push_str(&format!(" error={error:?}"));
        }
        if let Some(answer) = &attempt.response {
            line.push_str(&format!(" answer={answer:?}"));
        }
        println!("{line}");
    }
}

fn describe(error: &dyn std::error::Error, url: &str) -> String {
    let chain: Vec<String> = std::iter::successors(Some(error), |error| error.source())
        .map(ToString::to_string)
        .collect();
    redact(&chain.join(": "), url)
}

fn redact(message: &str, url: &str) -> String {
    let mut message = message.replace(url, "<store URL>");
    if let Some(password) = password_of(url) {
        message = message.replace(password, "***");
    }
    message
}

/// The password of a `scheme://user:password@host` URL, if it has one.
fn password_of(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let userinfo = rest.split(['/', '?']).next()?.rsplit_once('@')?.0;
    let password = userinfo.split_once(':')?.1;
    (!password.is_empty()).then_some(password)
}

/// An open store, with what `purge-expired` needs of its concrete type. The SQL stores are
/// boxed: they are far larger than the Redis one.
enum Opened {
    #[cfg(feature = "sqlite")]
    Sqlite(Box<tower_idempotency::SqliteStore>),
    #[cfg(feature = "postgres")]
    Postgres(Box<tower_idempotency::PostgresStore>),
    #[cfg(feature = "mysql")]
    MySql(Box<tower_idempotency::MySqlStore>),
    #[cfg(feature = "redis")]
    Redis(tower_idempotency::RedisStore),
}

impl Opened {
    fn kind(&self) -> &'static str {
        match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(_) => "sqlite",
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => "postgres",
            #[cfg(feature = "mysql")]
            Self::MySql(_) => "mysql",
            #[cfg(feature = "redis")]
            Self::Redis(_) => "redis",
        }
    }

    fn store(&self) -> &dyn Store {
        match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(store) => store.as_ref(),
            #[cfg(feature = "postgres")]
            Self::Postgres(store) => store.as_ref(),
            #[cfg(feature = "mysql")]
            Self::MySql(store) => store.as_ref(),
            #[cfg(feature = "redis")]
            Self::Redis(store) => store,
        }
    }

    /// Deleted records, or `None` for a store that expires records by itself.
    async fn purge_expired(&self) -> Result<Option<u64>, StoreError> {
        match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(store) => store.purge_expired().await.map(Some),
            #[cfg(feature = "postgres")]
            Self::Postgres(store) => store.purge_expired().await.map(Some),
            #[cfg(feature = "mysql")]
            Self::MySql(store) => store.purge_expired().await.map(Some),
            #[cfg(feature = "redis")]
            Self::Redis(_) => Ok(None),
        }
    }
}

/// Opens the store a URL names, parsed as `connect_store` (the reference receiver's
/// `IDEMPOTENCY_STORE`) parses it, but with the table or prefix given and without creating a
/// schema or a database file: an administration tool reads what is there.
async fn open(cli: &Cli) -> Result<Opened, CliError> {
    let url = cli.store.as_deref().ok_or(CliError::NoStore)?;
    let scheme = url.split_once(':').map_or(url, |(scheme, _)| scheme);
    let connect = |store: &'static str| {
        move |error: &dyn std::error::Error| CliError::Connect {
            store,
            reason: describe(error, url),
        }
    };
    match scheme {
        "memory" => Err(CliError::MemoryStore),
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            check_sqlite_file(url)?;
            tower_idempotency::SqliteStore::connect_with_table(url, &cli.table)
                .await
                .map(|store| Opened::Sqlite(Box::new(store)))
                .map_err(|e| connect("sqlite")(&e))
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            tower_idempotency::PostgresStore::connect_with_table(url, &cli.table)
                .await
                .map(|store| Opened::Postgres(Box::new(store)))
                .map_err(|e| connect("postgres")(&e))
        }
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => tower_idempotency::MySqlStore::connect_with_table(url, &cli.table)
            .await
            .map(|store| Opened::MySql(Box::new(store)))
            .map_err(|e| connect("mysql")(&e)),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => tower_idempotency::RedisStore::connect(url, &cli.redis_prefix)
            .await
            .map(Opened::Redis)
            .map_err(|e| connect("redis")(&e)),
        #[cfg(not(feature = "sqlite"))]
        "sqlite" => Err(CliError::FeatureDisabled("sqlite")),
        #[cfg(not(feature = "postgres"))]
        "postgres" | "postgresql" => Err(CliError::FeatureDisabled("postgres")),
        #[cfg(not(feature = "mysql"))]
        "mysql" | "mariadb" => Err(CliError::FeatureDisabled("mysql")),
        #[cfg(not(feature = "redis"))]
        "redis" | "rediss" => Err(CliError::FeatureDisabled("redis")),
        _ => Err(CliError::UnsupportedScheme),
    }
}

/// Prints `header` and `rows` as columns padded to their widest cell, two spaces apart, without
/// trailing spaces. Hand-written: a dozen lines, and a table crate's borders or wrapping would
/// change what scripts that read the listings see.
#[cfg(any(feature = "inbox", feature = "outbox"))]
fn print_table<const N: usize>(header: [&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for row in rows {
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
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// The pool of the SQL database a URL names, for the inbox and outbox commands.
#[cfg(any(feature = "inbox", feature = "outbox"))]
enum SqlPool {
    #[cfg(feature = "sqlite")]
    Sqlite(tower_idempotency::sqlx::SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(tower_idempotency::sqlx::PgPool),
    #[cfg(feature = "mysql")]
    MySql(tower_idempotency::sqlx::MySqlPool),
}

/// Opens the SQLite, Postgres or MySQL database `url` names, without creating anything (a SQLite
/// file must exist); answers `not_sql` for a store that is not SQL (memory, Redis).
#[cfg(any(feature = "inbox", feature = "outbox"))]
async fn sql_pool(url: &str, not_sql: CliError) -> Result<SqlPool, CliError> {
    let scheme = url.split_once(':').map_or(url, |(scheme, _)| scheme);
    match scheme {
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            check_sqlite_file(url)?;
            tower_idempotency::sqlx::SqlitePool::connect(url)
                .await
                .map(SqlPool::Sqlite)
                .map_err(|e| connect_error("sqlite", &e, url))
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => tower_idempotency::sqlx::PgPool::connect(url)
            .await
            .map(SqlPool::Postgres)
            .map_err(|e| connect_error("postgres", &e, url)),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => {
            // sqlx names the protocol `mysql` whichever server speaks it.
            let url = url.replacen("mariadb:", "mysql:", 1);
            tower_idempotency::sqlx::MySqlPool::connect(&url)
                .await
                .map(SqlPool::MySql)
                .map_err(|e| connect_error("mysql", &e, &url))
        }
        "memory" | "redis" | "rediss" => Err(not_sql),
        _ => Err(CliError::UnsupportedScheme),
    }
}

/// A failure to open `store` at `url` (or to name its table there).
#[cfg(any(feature = "inbox", feature = "outbox"))]
fn connect_error(store: &'static str, error: &dyn std::error::Error, url: &str) -> CliError {
    CliError::Connect {
        store,
        reason: describe(error, url),
    }
}

/// Refuses a SQLite URL whose file does not exist: connecting would create an empty database.
#[cfg(feature = "sqlite")]
fn check_sqlite_file(url: &str) -> Result<(), CliError> {
    let path = url
        .trim_start_matches("sqlite:")
        .trim_start_matches("//")
        .split('?')
        .next()
        .unwrap_or_default();
    if path != ":memory:" && !std::path::Path::new(path).is_file() {
        return Err(CliError::NoSuchFile);
    }
    Ok(())
}

/// The scoped store key the arguments name.
fn store_key(args: &KeyArgs) -> Result<String, CliError> {
    if let Some(given) = &args.store_key {
        let valid = given.split_once(':').is_some_and(|(namespace, hash)| {
            is_valid_namespace(namespace)
                && hash.len() == 64
                && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        });
        return if valid {
            Ok(given.clone())
        } else {
            Err(CliError::BadStoreKey)
        };
    }
    // clap enforces that --key comes with --namespace, --method and --path.
    let (Some(namespace), Some(method), Some(path), Some(key)) =
        (&args.namespace, &args.method, &args.path, &args.key)
    else {
        return Err(CliError::BadStoreKey);
    };
    if !is_valid_namespace(namespace) {
        return Err(CliError::BadNamespace);
    }
    Ok(store_key_from_parts(
        namespace,
        method,
        path,
        args.principal.as_deref(),
        key,
    ))
}

/// A report: JSON, and the same fields as `name  value` lines.
struct Report(Vec<(&'static str, Value)>);

impl Report {
    fn print(&self, as_json: bool) {
        if as_json {
            let object: serde_json::Map<String, Value> = self
                .0
                .iter()
                .map(|(name, value)| ((*name).to_owned(), value.clone()))
                .collect();
            println!("{}", Value::Object(object));
            return;
        }
        let width = self.0.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
        for (name, value) in &self.0 {
            let shown = match value {
                Value::String(text) => text.clone(),
                Value::Null => "-".to_owned(),
                other => other.to_string(),
            };
            println!("{name:<width$}  {shown}");
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn inspect_report(key: String, state: Option<RecordState>) -> Report {
    let mut fields = vec![("key", json!(key))];
    match state {
        None => fields.push(("state", json!("absent"))),
        Some(RecordState::InFlight {
            fingerprint,
            token,
            lease_remaining,
        }) => fields.extend([
            ("state", json!("in_flight")),
            ("lease_remaining_ms", json!(millis(lease_remaining))),
            ("token", json!(token.0)),
            ("fingerprint", json!(hex::encode(fingerprint.as_bytes()))),
        ]),
        Some(RecordState::Completed {
            record,
            ttl_remaining,
        }) => {
            let response = &record.response;
            let content_type = response
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            fields.extend([
                ("state", json!("completed")),
                ("ttl_remaining_ms", json!(millis(ttl_remaining))),
                ("status", json!(response.status.as_u16())),
                ("content_type", json!(content_type)),
                ("body_bytes", json!(response.body.len())),
                ("body_omitted", json!(response.body_omitted)),
                (
                    "fingerprint",
                    json!(hex::encode(record.fingerprint.as_bytes())),
                ),
            ]);
        }
    }
    Report(fields)
}

/// What a command answers.
enum Answer {
    Report(Report),
    #[cfg(feature = "inbox")]
    Inbox(inbox::Answer),
    #[cfg(feature = "outbox")]
    Outbox(outbox::Answer),
}

impl Answer {
    fn print(&self, as_json: bool) {
        match self {
            Self::Report(report) => report.print(as_json),
            #[cfg(feature = "inbox")]
            Self::Inbox(answer) => answer.print(as_json),
            #[cfg(feature = "outbox")]
            Self::Outbox(answer) => answer.print(as_json),
        }
    }
}

async fn run(cli: Cli) -> Result<Answer, CliError> {
    #[cfg(feature = "inbox")]
    if let Command::Inbox(command) = &cli.command {
        let url = cli.store.as_deref().ok_or(CliError::NoStore)?;
        return inbox::run(url, command, &operator(&cli))
            .await
            .map(Answer::Inbox);
    }
    #[cfg(feature = "outbox")]
    if let Command::Outbox(command) = &cli.command {
        let url = cli.store.as_deref().ok_or(CliError::NoStore)?;
        return outbox::run(url, command, &operator(&cli))
            .await
            .map(Answer::Outbox);
    }
    run_store(cli).await.map(Answer::Report)
}

async fn run_store(cli: Cli) -> Result<Report, CliError> {
    let store_error = |error: StoreError| {
        CliError::Store(describe(&error, cli.store.as_deref().unwrap_or_default()))
    };
    // A malformed key is refused before the store is opened.
    let key = match &cli.command {
        Command::Inspect(args) | Command::Forget(args) => Some(store_key(args)?),
        _ => None,
    };
    let opened = open(&cli).await?;
    match (&cli.command, key) {
        (Command::Inspect(_), Some(key)) => {
            let state = opened.store().get(&key).await.map_err(store_error)?;
            Ok(inspect_report(key, state))
        }
        (Command::Forget(_), Some(key)) => {
            let forgotten = opened.store().forget(&key).await.map_err(store_error)?;
            Ok(Report(vec![
                ("key", json!(key)),
                ("forgotten", json!(forgotten)),
            ]))
        }
        _ => {
            let purged = opened.purge_expired().await.map_err(store_error)?;
            let note = match purged {
                Some(_) => Value::Null,
                None => json!("Redis expires records by itself; there is nothing to purge"),
            };
            Ok(Report(vec![
                ("store", json!(opened.kind())),
                ("purged", json!(purged)),
                ("note", note),
            ]))
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let as_json = cli.json;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: could not start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(report) => {
            report.print(as_json);
            ExitCode::SUCCESS
        }
        Err(error) => {
            if as_json {
                eprintln!("{}", json!({ "error": error.to_string() }));
            } else {
                eprintln!("error: {error}");
            }
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_blanked_out_of_messages() {
        let url = "postgres://app:hunter2@db.internal:5432/app";
        assert_eq!(password_of(url), Some("hunter2"));
        assert_eq!(password_of("redis://127.0.0.1:6379"), None);
        assert_eq!(password_of("redis://:pw@127.0.0.1:6379/0"), Some("pw"));
        let message = redact(&format!("failed at {url}; auth hunter2 refused"), url);
        assert!(!message.contains("hunter2"), "{message}");
        assert!(message.contains("<store URL>"), "{message}");
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
