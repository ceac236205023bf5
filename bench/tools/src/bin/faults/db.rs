//! The driver's own connection to the receivers' database: the state it checks at the end, the
//! counts it polls while draining, and the database-side faults (SQLite's write lock held, a
//! Postgres table locked).

use std::{collections::BTreeMap, str::FromStr, time::Duration};

use tower_idempotency_sqlx::sqlx::{
    self,
    postgres::{PgConnectOptions, PgPoolOptions},
    sqlite::{SqliteConnectOptions, SqlitePoolOptions},
    Connection, PgPool, SqlitePool,
};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The inbox's and the outbox's tables (the receiver's defaults) and the receiver's own.
pub const INBOX: &str = "webhook_inbox";
pub const OUTBOX: &str = "outbox";

pub enum Db {
    Sqlite { pool: SqlitePool, path: String },
    Postgres { pool: PgPool, url: String },
}

/// One inbox row.
#[derive(Clone, Debug)]
pub struct InboxRow {
    pub state: i64,
    pub attempts: i64,
    pub last_error: String,
    /// `available_at` and `lease_until` (Unix ms; 0 when NULL), and whether a lease token is set.
    pub available_at: i64,
    pub lease_until: i64,
    pub leased: bool,
}

/// One outbox row.
#[derive(Clone, Debug)]
pub struct OutboxRow {
    pub scope: String,
    pub state: i64,
    pub attempts: i64,
}

/// Everything the checks read, after the drain.
pub struct Snapshot {
    pub inbox: BTreeMap<String, InboxRow>,
    pub effects: BTreeMap<String, i64>,
    /// Per object id, the event ids in the order the handler committed them.
    pub order: BTreeMap<String, Vec<String>>,
    pub outbox: BTreeMap<String, OutboxRow>,
}

/// Runs `$body` with `$pool` bound to whichever pool `$db` holds (the statements are the same
/// text on both databases).
macro_rules! on_pool {
    ($db:expr, $pool:ident => $body:expr) => {
        match $db {
            Db::Sqlite { pool: $pool, .. } => $body,
            Db::Postgres { pool: $pool, .. } => $body,
        }
    };
}

impl Db {
    /// `sqlite://PATH` or a Postgres URL (direct, not through the proxy).
    pub async fn open(url: &str) -> Result<Self, BoxError> {
        if let Some(path) = url.strip_prefix("sqlite://") {
            let options = SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(30));
            let pool = SqlitePoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await?;
            Ok(Self::Sqlite {
                pool,
                path: path.to_owned(),
            })
        } else {
            let options = PgConnectOptions::from_str(url)?;
            let pool = PgPoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await?;
            Ok(Self::Postgres {
                pool,
                url: url.to_owned(),
            })
        }
    }

    async fn count(&self, sql: &str) -> Result<i64, BoxError> {
        // A table the receivers have not created yet has no rows.
        let result: Result<(i64,), sqlx::Error> =
            on_pool!(self, pool => sqlx::query_as(sqlx::AssertSqlSafe(sql)).fetch_one(pool).await);
        match result {
            Ok((n,)) => Ok(n),
            Err(error) if error.to_string().contains("no such table") => Ok(0),
            Err(error) if error.to_string().contains("does not exist") => Ok(0),
            Err(error) => Err(error.into()),
        }
    }

    /// Inbox rows due or running (state pending).
    pub async fn pending_events(&self) -> Result<i64, BoxError> {
        self.count(&format!("SELECT count(*) FROM {INBOX} WHERE state = 0"))
            .await
    }

    /// Inbox rows claimed by a worker right now (pending, with a lease token).
    pub async fn claimed_events(&self) -> Result<i64, BoxError> {
        self.count(&format!(
            "SELECT count(*) FROM {INBOX} WHERE state = 0 AND lease_token IS NOT NULL"
        ))
        .await
    }

    /// Outbox messages not delivered nor failed.
    pub async fn pending_messages(&self) -> Result<i64, BoxError> {
        self.count(&format!("SELECT count(*) FROM {OUTBOX} WHERE state = 0"))
            .await
    }

    /// The inbox's rows, all or only the pending ones.
    async fn inbox_rows(&self, pending_only: bool) -> Result<BTreeMap<String, InboxRow>, BoxError> {
        let filter = if pending_only { "WHERE state = 0" } else { "" };
        let inbox_sql = format!(
            "SELECT event_id, CAST(state AS BIGINT), CAST(attempts AS BIGINT), \
             COALESCE(last_error, ''), CAST(available_at AS BIGINT), \
             CAST(COALESCE(lease_until, 0) AS BIGINT), lease_token IS NOT NULL FROM {INBOX} {filter}"
        );
        type Row = (String, i64, i64, String, i64, i64, bool);
        let rows: Vec<Row> = on_pool!(self, pool => sqlx::query_as(sqlx::AssertSqlSafe(&*inbox_sql)).fetch_all(pool).await?);
        Ok(rows
            .into_iter()
            .map(
                |(id, state, attempts, last_error, available_at, lease_until, leased)| {
                    let row = InboxRow {
                        state,
                        attempts,
                        last_error,
                        available_at,
                        lease_until,
                        leased,
                    };
                    (id, row)
                },
            )
            .collect())
    }

    /// The pending inbox rows.
    pub async fn pending_rows(&self) -> Result<BTreeMap<String, InboxRow>, BoxError> {
        self.inbox_rows(true).await
    }

    pub async fn snapshot(&self) -> Result<Snapshot, BoxError> {
        let inbox = self.inbox_rows(false).await?;
        let effects_sql = "SELECT event_id, count(*) FROM inbox_effects GROUP BY event_id";
        let rows: Vec<(String, i64)> = on_pool!(self, pool => sqlx::query_as(sqlx::AssertSqlSafe(effects_sql)).fetch_all(pool).await?);
        let effects = rows.into_iter().collect();
        let order_sql = "SELECT object_id, event_id FROM inbox_order ORDER BY seq";
        let rows: Vec<(String, String)> = on_pool!(self, pool => sqlx::query_as(sqlx::AssertSqlSafe(order_sql)).fetch_all(pool).await?);
        let mut order = BTreeMap::<String, Vec<String>>::new();
        for (object, event) in rows {
            order.entry(object).or_default().push(event);
        }
        let outbox_sql = format!(
            "SELECT key, COALESCE(scope, ''), CAST(state AS BIGINT), CAST(attempts AS BIGINT) \
             FROM {OUTBOX}"
        );
        let rows: Vec<(String, String, i64, i64)> = on_pool!(self, pool => sqlx::query_as(sqlx::AssertSqlSafe(&*outbox_sql)).fetch_all(pool).await?);
        let outbox = rows
            .into_iter()
            .map(|(key, scope, state, attempts)| {
                let row = OutboxRow {
                    scope,
                    state,
                    attempts,
                };
                (key, row)
            })
            .collect();
        Ok(Snapshot {
            inbox,
            effects,
            order,
            outbox,
        })
    }

    /// SQLite: holds the write lock (`BEGIN IMMEDIATE`) for `hold`, on a connection of its own.
    /// Answers how long taking the lock waited.
    pub async fn hold_write_lock(&self, hold: Duration) -> Result<Duration, BoxError> {
        let Self::Sqlite { path, .. } = self else {
            return Err("the write lock is SQLite's".into());
        };
        let path = path.clone();
        apart(move || async move {
            let options = SqliteConnectOptions::new()
                .filename(path)
                .busy_timeout(Duration::from_secs(30));
            let mut conn = sqlx::SqliteConnection::connect_with(&options).await?;
            let asked = std::time::Instant::now();
            sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut conn).await?;
            let waited = asked.elapsed();
            tokio::time::sleep(hold).await;
            sqlx::raw_sql("ROLLBACK").execute(&mut conn).await?;
            conn.close().await?;
            Ok(waited)
        })
        .await
    }

    /// Postgres: holds `table` locked `ACCESS EXCLUSIVE` for `hold`, on a connection of its
    /// own. Answers how long taking the lock waited.
    pub async fn lock_table(
        &self,
        table: &'static str,
        hold: Duration,
    ) -> Result<Duration, BoxError> {
        let Self::Postgres { url, .. } = self else {
            return Err("the table lock is Postgres's".into());
        };
        let url = url.clone();
        apart(move || async move {
            let mut conn = sqlx::PgConnection::connect(&url).await?;
            let asked = std::time::Instant::now();
            let mut tx = conn.begin().await?;
            let lock = format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE");
            sqlx::raw_sql(sqlx::AssertSqlSafe(&*lock))
                .execute(&mut *tx)
                .await?;
            let waited = asked.elapsed();
            tokio::time::sleep(hold).await;
            tx.rollback().await?;
            conn.close().await?;
            Ok(waited)
        })
        .await
    }
}

/// Runs the future `work` makes on a thread and runtime of its own: sqlx's statements on a borrowed connection
/// make futures the compiler cannot prove `Send` for every lifetime, which a spawned fault
/// loop needs.
async fn apart<T, F, W>(work: F) -> Result<T, BoxError>
where
    T: Send + 'static,
    F: FnOnce() -> W + Send + 'static,
    W: std::future::Future<Output = Result<T, BoxError>>,
{
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(work())
    })
    .await?
}
