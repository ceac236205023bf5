//! The inbox benchmark's second peer queue: graphile-worker (Node.js), served by
//! `bench/peer-graphile/peer.mjs` in a child process (`node` itself, no wrapper, so the process
//! has no children of its own). The same route shape as the inbox: `POST /peer` checks the
//! Stripe signature, enqueues the event's id as a graphile-worker job and answers 200 once the
//! enqueue has committed; its worker inserts one row per event into an effects table of this
//! run. The node project's dependencies come from `npm ci --prefix bench/peer-graphile`.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, ChildStdin, Command},
};
use tower_idempotency_sqlx::sqlx::{self, PgPool};

use super::BoxError;

/// The node project: `bench/peer-graphile`.
fn project() -> PathBuf {
    let loadtest = Path::new(env!("CARGO_MANIFEST_DIR"));
    loadtest.parent().unwrap_or(loadtest).join("peer-graphile")
}

/// `Err` names the command that installs the node project's dependencies when they are missing.
pub fn check_installed() -> Result<(), BoxError> {
    let project = project();
    if project
        .join("node_modules/graphile-worker/package.json")
        .is_file()
    {
        Ok(())
    } else {
        Err(format!(
            "the graphile-worker peer's dependencies are missing ({}/node_modules): run \
             `npm ci --prefix bench/peer-graphile` (bench/scripts/bench.sh runs it)",
            project.display()
        )
        .into())
    }
}

/// The running peer: its node process, its graphile-worker schema and its effects table.
pub struct GraphilePeer {
    /// Its base URL, `http://127.0.0.1:PORT`.
    base: String,
    pool: PgPool,
    schema: String,
    effects_table: String,
    child: Child,
    /// Closing it is the process's signal to stop.
    stdin: Option<ChildStdin>,
    client: reqwest::Client,
}

impl GraphilePeer {
    /// Creates the effects table on `pool`'s database, then starts the peer on `url`'s database
    /// with graphile-worker's schema `schema` (migrated by the peer), a worker running
    /// `concurrency` jobs at once and a pool of `max_connections`; returns once the peer says it
    /// serves its route.
    pub async fn start(
        pool: &PgPool,
        url: &str,
        secret: &str,
        (schema, effects_table): (String, String),
        concurrency: usize,
        max_connections: u32,
    ) -> Result<Self, BoxError> {
        check_installed()?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
            "CREATE TABLE {effects_table} (event_id text NOT NULL)"
        )))
        .execute(pool)
        .await?;
        let project = project();
        let mut child = Command::new("node")
            .arg(project.join("peer.mjs"))
            .current_dir(&project)
            .env("DATABASE_URL", url)
            .env("PEER_SECRET", secret)
            .env("PEER_SCHEMA", &schema)
            .env("PEER_EFFECTS_TABLE", &effects_table)
            .env("PEER_CONCURRENCY", concurrency.to_string())
            .env("PEER_POOL_SIZE", max_connections.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Should the harness fail before `stop`, the process is killed with it.
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| {
                format!(
                    "starting `node` (Node.js 20 or later) for the graphile-worker peer: {error}"
                )
            })?;
        let stdin = child.stdin.take();
        let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        // Its first line, once graphile-worker is migrated and running and the route is served.
        let first = tokio::time::timeout(Duration::from_secs(120), lines.next_line()).await;
        let base = match first {
            Ok(Ok(Some(line))) => line.strip_prefix("listening ").map(str::to_owned),
            _ => None,
        }
        .ok_or("the graphile-worker peer did not report its address (its stderr is above)")?;
        // It prints nothing else on stdout; anything it would goes to stderr, keeping the
        // harness's stdout to its tables.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("peer-graphile: {line}");
            }
        });
        Ok(Self {
            base,
            pool: pool.clone(),
            schema,
            effects_table,
            child,
            stdin,
            client: reqwest::Client::new(),
        })
    }

    /// The enqueueing route's URL.
    pub fn url(&self) -> String {
        format!("{}/peer", self.base)
    }

    /// Whether every event enqueued so far has its row.
    pub async fn drained(&self) -> Result<bool, BoxError> {
        let enqueued: u64 = self
            .client
            .get(format!("{}/enqueued", self.base))
            .send()
            .await
            .map_err(|error| {
                format!("the graphile-worker peer does not answer (its stderr is above): {error}")
            })?
            .error_for_status()?
            .text()
            .await?
            .trim()
            .parse()?;
        let done: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(&*format!(
            "SELECT count(*) FROM {}",
            self.effects_table
        )))
        .fetch_one(&self.pool)
        .await?;
        Ok(u64::try_from(done).unwrap_or(0) >= enqueued)
    }

    /// Closes the process's stdin and waits until its worker has stopped and it has exited
    /// (killed after 30 s), then drops graphile-worker's schema and the effects table.
    pub async fn stop(mut self) -> Result<(), BoxError> {
        drop(self.stdin.take());
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    eprintln!("the graphile-worker peer exited with {status}");
                }
            }
            Err(_) => {
                eprintln!("the graphile-worker peer did not exit within 30 s: killed");
                self.child.kill().await?;
            }
        }
        sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
            "DROP SCHEMA {} CASCADE; DROP TABLE {};",
            self.schema, self.effects_table
        )))
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
