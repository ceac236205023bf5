//! SQL floors served over HTTP: the echo handler's route running, per request, the raw
//! statements a SQL store cannot do with less, with no layer in front. Each is a throughput
//! target like the stores, so its ratio to the bare handler comes from the same run, through the
//! same HTTP path and load generator, and a store's cell divided by its floor's compares like with
//! like:
//!
//! - `sqlite-floor-write`: two single-row writes per request (`INSERT` of the key, then
//!   `UPDATE` of its state and body; each its own autocommit transaction), on one connection that
//!   the requests take in turn, so writes are serialised in process and never meet SQLite's busy
//!   handler; WAL and `synchronous = NORMAL`, as the store opens its file.
//! - `postgres-floor-write`: `INSERT` then `UPDATE` of one row per request, both on one
//!   connection out of as many as the store keeps checked out (its lanes: half of its 10-connection
//!   pool unless `--store-lanes` says otherwise).
//! - `postgres-floor-read`: a primary-key `SELECT` of a 1 KiB row per request, on the same
//!   connections; driven with the replay workload's keys, whose rows are written before the cell.
//! - `mysql-floor-write` and `mysql-floor-read`: the same statements on MySQL/MariaDB (InnoDB,
//!   `VARBINARY` key), on as many connections as the MySQL store keeps as lanes, each session at
//!   READ COMMITTED as the store's `connect` sets it.
//!
//! The floors use tables of their own (`<run table>_floor` in the SQLite file, in Postgres and in
//! MySQL), dropped with the run's other tables.

use std::{
    str::FromStr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use axum::{extract::State, routing::post, Router};
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tokio::sync::{Mutex, MutexGuard};
use tower_idempotency_sqlx::sqlx::{
    self,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous},
    Connection, MySqlConnection, PgConnection, SqliteConnection,
};

use crate::{load::REPLAY_KEYS, setup::Backends, Result};

/// Which floor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FloorKind {
    /// SQLite: `INSERT` then `UPDATE` of one row, one writer connection.
    SqliteWrite,
    /// Postgres: `INSERT` then `UPDATE` of one row on one connection.
    PostgresWrite,
    /// Postgres: `SELECT` of a 1 KiB row by primary key.
    PostgresRead,
    /// MySQL/MariaDB: `INSERT` then `UPDATE` of one row on one connection.
    MySqlWrite,
    /// MySQL/MariaDB: `SELECT` of a 1 KiB row by primary key.
    MySqlRead,
}

impl FloorKind {
    /// The name the flags and tables use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            FloorKind::SqliteWrite => "sqlite-floor-write",
            FloorKind::PostgresWrite => "postgres-floor-write",
            FloorKind::PostgresRead => "postgres-floor-read",
            FloorKind::MySqlWrite => "mysql-floor-write",
            FloorKind::MySqlRead => "mysql-floor-read",
        }
    }

    /// Whether it is driven with the replay keys (a read) rather than fresh keys (writes).
    pub(crate) fn reads(self) -> bool {
        matches!(self, FloorKind::PostgresRead | FloorKind::MySqlRead)
    }
}

enum Connections {
    Sqlite(Mutex<SqliteConnection>),
    Postgres(Vec<Mutex<PgConnection>>),
    MySql(Vec<Mutex<MySqlConnection>>),
}

/// An open floor: its connections and statements.
pub(crate) struct SqlFloor {
    kind: FloorKind,
    connections: Connections,
    next: AtomicUsize,
    insert: String,
    update: String,
    select: String,
}

impl SqlFloor {
    /// Opens `kind` on the run's backends and creates its table.
    pub(crate) async fn open(kind: FloorKind, b: &Backends) -> Result<Self> {
        let table = format!("{}_floor", b.pg_table);
        let connections = match kind {
            FloorKind::SqliteWrite => {
                let options = SqliteConnectOptions::from_str(&format!(
                    "sqlite://{}",
                    b.sqlite_path.display()
                ))?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal);
                let mut connection = SqliteConnection::connect_with(&options).await?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
                    "CREATE TABLE IF NOT EXISTS \"{table}\" (key TEXT PRIMARY KEY, state INTEGER NOT NULL, body BLOB)"
                )))
                .execute(&mut connection)
                .await?;
                Connections::Sqlite(Mutex::new(connection))
            }
            FloorKind::PostgresWrite | FloorKind::PostgresRead => {
                let lanes = b.store_lanes.unwrap_or(5).max(1);
                let mut connections = Vec::with_capacity(lanes);
                for _ in 0..lanes {
                    connections.push(Mutex::new(PgConnection::connect(&b.pg_url).await?));
                }
                sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
                    "CREATE TABLE IF NOT EXISTS \"{table}\" (key text COLLATE \"C\" PRIMARY KEY, state smallint NOT NULL, body bytea) WITH (fillfactor = 80)"
                )))
                .execute(&mut *connections[0].lock().await)
                .await?;
                Connections::Postgres(connections)
            }
            FloorKind::MySqlWrite | FloorKind::MySqlRead => {
                let lanes = b.store_lanes.unwrap_or(5).max(1);
                let mut connections = Vec::with_capacity(lanes);
                for _ in 0..lanes {
                    let mut connection = MySqlConnection::connect(&b.mysql_url).await?;
                    sqlx::raw_sql("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .execute(&mut connection)
                        .await?;
                    connections.push(Mutex::new(connection));
                }
                sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
                    "CREATE TABLE IF NOT EXISTS `{table}` (`key` VARBINARY(1024) PRIMARY KEY, state SMALLINT NOT NULL, body LONGBLOB) ENGINE = InnoDB"
                )))
                .execute(&mut *connections[0].lock().await)
                .await?;
                return Ok(Self {
                    kind,
                    connections: Connections::MySql(connections),
                    next: AtomicUsize::new(0),
                    insert: format!("INSERT INTO `{table}` (`key`, state) VALUES (?, 0)"),
                    // Bound body, then key: MySQL's parameters are positional.
                    update: format!("UPDATE `{table}` SET state = 1, body = ? WHERE `key` = ?"),
                    select: format!("SELECT body FROM `{table}` WHERE `key` = ?"),
                });
            }
        };
        let (p1, p2) = match kind {
            FloorKind::SqliteWrite => ("?1", "?2"),
            _ => ("$1", "$2"),
        };
        Ok(Self {
            kind,
            connections,
            next: AtomicUsize::new(0),
            insert: format!("INSERT INTO \"{table}\" (key, state) VALUES ({p1}, 0)"),
            update: format!("UPDATE \"{table}\" SET state = 1, body = {p2} WHERE key = {p1}"),
            select: format!("SELECT body FROM \"{table}\" WHERE key = {p1}"),
        })
    }

    /// Which floor this is.
    pub(crate) fn kind(&self) -> FloorKind {
        self.kind
    }

    /// A free connection of `connections` if there is one, else the next in turn.
    async fn postgres<'a, C>(&self, connections: &'a [Mutex<C>]) -> MutexGuard<'a, C> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..connections.len() {
            if let Ok(guard) = connections[(start + i) % connections.len()].try_lock() {
                return guard;
            }
        }
        connections[start % connections.len()].lock().await
    }

    /// Writes the rows the read floor's cell `run` will select (the replay workload's keys).
    pub(crate) async fn prepare_reads(&self, run: &str, body: &Bytes) -> Result<()> {
        for n in 0..REPLAY_KEYS {
            let key = crate::load::Keys::Cycle(REPLAY_KEYS).key(run, n);
            self.write(&key, body).await?;
        }
        Ok(())
    }

    async fn write(&self, key: &str, body: &[u8]) -> Result<(), sqlx::Error> {
        // The same two statements on either connection type; a macro because sqlx's executor
        // bounds, generic over the database, would be longer than the statements.
        macro_rules! insert_then_update {
            ($connection:expr) => {{
                let connection = $connection;
                sqlx::query(sqlx::AssertSqlSafe(&*self.insert))
                    .bind(key)
                    .execute(&mut *connection)
                    .await?;
                sqlx::query(sqlx::AssertSqlSafe(&*self.update))
                    .bind(key)
                    .bind(body)
                    .execute(&mut *connection)
                    .await?;
            }};
        }
        match &self.connections {
            Connections::Sqlite(connection) => insert_then_update!(&mut *connection.lock().await),
            Connections::Postgres(connections) => {
                insert_then_update!(&mut *self.postgres(connections).await)
            }
            Connections::MySql(connections) => {
                let connection = &mut *self.postgres(connections).await;
                sqlx::query(sqlx::AssertSqlSafe(&*self.insert))
                    .bind(key.as_bytes())
                    .execute(&mut *connection)
                    .await?;
                sqlx::query(sqlx::AssertSqlSafe(&*self.update))
                    .bind(body)
                    .bind(key.as_bytes())
                    .execute(&mut *connection)
                    .await?;
            }
        }
        Ok(())
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>, sqlx::Error> {
        match &self.connections {
            Connections::Postgres(connections) => {
                let mut connection = self.postgres(connections).await;
                sqlx::query_scalar(sqlx::AssertSqlSafe(&*self.select))
                    .bind(key)
                    .fetch_optional(&mut *connection)
                    .await
            }
            Connections::Sqlite(connection) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(&*self.select))
                    .bind(key)
                    .fetch_optional(&mut *connection.lock().await)
                    .await
            }
            Connections::MySql(connections) => {
                let mut connection = self.postgres(connections).await;
                sqlx::query_scalar(sqlx::AssertSqlSafe(&*self.select))
                    .bind(key.as_bytes())
                    .fetch_optional(&mut *connection)
                    .await
            }
        }
    }
}

/// The floor's handler: the raw statements, then the echo handler's answer (`201` with the
/// request body; the read floor answers with the row's body, as a replay does).
async fn create_order(
    State(floor): State<Arc<SqlFloor>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Bytes) {
    let Some(key) = headers.get("idempotency-key").and_then(|k| k.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, Bytes::new());
    };
    if floor.kind.reads() {
        return match floor.read(key).await {
            Ok(Some(row)) => (StatusCode::CREATED, Bytes::from(row)),
            // Any other answer stops the run (the load generator refuses unexpected statuses).
            Ok(None) => (StatusCode::NOT_FOUND, Bytes::new()),
            Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, Bytes::new()),
        };
    }
    match floor.write(key, &body).await {
        Ok(()) => (StatusCode::CREATED, body),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, Bytes::new()),
    }
}

/// The floor on `POST /orders`.
pub(crate) fn router(floor: Arc<SqlFloor>) -> Router {
    Router::new()
        .route("/orders", post(create_order))
        .with_state(floor)
}
