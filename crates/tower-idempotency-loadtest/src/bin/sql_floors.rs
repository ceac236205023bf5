//! The SQL stores against their raw floors, side by side in one run on loopback (`POST /orders`,
//! 1 KiB body, the main harness's load generator and echo handler). Per store and round, in
//! this order: the bare handler; the layer on the store with new keys; the new-key floor; the
//! layer with replays; the replay floor; the bare handler again (ratios use the mean of both).
//!
//! Both floors answer with the body, as the echo handler behind the layer does.
//!
//! - new-key floor: the handler runs two raw single-row writes per request on the store's
//!   kind of connections: `INSERT` of the key's row, then `UPDATE` of it with the response (on
//!   SQLite one writer connection behind an async mutex; on Postgres as many held connections
//!   as the store has lanes);
//! - replay floor: the handler reads the row by primary key (`SELECT *`), on as many held
//!   connections as the store reads on (SQLite: its reader lanes; Postgres: its lanes).
//!
//! ```text
//! cargo run --release -p tower-idempotency-loadtest --bin sql_floors -- \
//!     [--rounds 3] [--seconds 3] [--concurrency 32] [--stores sqlite,postgres]
//! ```
//!
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) names the Postgres
//! database; tables get random names and are dropped at the end, the SQLite files removed.

#[allow(dead_code)]
#[path = "../load.rs"]
mod load;
#[allow(dead_code)]
#[path = "../server.rs"]
mod server;

use std::{
    hash::{BuildHasher, RandomState},
    sync::Arc,
    time::Duration,
};

use axum::{extract::State, routing::post, Router};
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use load::{drive, Keys, LoadResult, Plan, Stop, REPLAY_KEYS};
use tokio::sync::{Mutex, Semaphore};
use tower_idempotency_core::IdempotencyLayer;
use tower_idempotency_sqlx::{
    postgres_schema_sql, sqlite_schema_sql,
    sqlx::{self, Connection, PgConnection, SqliteConnection},
    PostgresStore, SqliteStore,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    rounds: usize,
    measure: Duration,
    concurrency: usize,
    stores: Vec<String>,
}

fn parse_args() -> Result<Args, BoxError> {
    let mut args = Args {
        rounds: 3,
        measure: Duration::from_secs(3),
        concurrency: 32,
        stores: vec!["sqlite".into(), "postgres".into()],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--rounds" => args.rounds = value.parse()?,
            "--seconds" => args.measure = Duration::from_secs_f64(value.parse()?),
            "--concurrency" => args.concurrency = value.parse()?,
            "--stores" => args.stores = value.split(',').map(str::to_owned).collect(),
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    Ok(args)
}

fn suffix() -> String {
    format!(
        "{:08x}",
        RandomState::new().hash_one(std::time::SystemTime::now()) as u32
    )
}

/// Connections held for the floor's statements, handed out one caller at a time.
struct Held<C> {
    free: Semaphore,
    connections: std::sync::Mutex<Vec<C>>,
}

impl<C> Held<C> {
    fn new(connections: Vec<C>) -> Self {
        Self {
            free: Semaphore::new(connections.len()),
            connections: std::sync::Mutex::new(connections),
        }
    }

    async fn with<T>(&self, run: impl AsyncFnOnce(&mut C) -> T) -> T {
        let _permit = self.free.acquire().await.expect("never closed");
        let mut connection = self.connections.lock().unwrap().pop().expect("a permit");
        let result = run(&mut connection).await;
        self.connections.lock().unwrap().push(connection);
        result
    }
}

/// The floor's SQL on its table (the store's own schema, so rows are the same shape).
struct FloorSql {
    insert: String,
    update: String,
    select: String,
}

impl FloorSql {
    fn new(table: &str, p: [&str; 3], expires: &str) -> Self {
        let [a, b, c] = p;
        Self {
            insert: format!(
                r#"INSERT INTO "{table}" (key, fingerprint, token, state, expires_at)
VALUES ({a}, {b}, {c}, 0, {expires})"#
            ),
            update: format!(
                r#"UPDATE "{table}" SET state = 1, status = 201, headers = {b}, body = {c},
    expires_at = {expires} WHERE key = {a}"#
            ),
            // The whole row is read, as a replay reads it; its body is the answer.
            select: format!(
                r#"SELECT body, token, fingerprint, state, expires_at, status, headers,
    body_omitted FROM "{table}" WHERE key = {a}"#
            ),
        }
    }
}

enum Floor {
    Sqlite {
        writer: Mutex<SqliteConnection>,
        readers: Held<SqliteConnection>,
        sql: FloorSql,
    },
    Postgres {
        connections: Held<PgConnection>,
        sql: FloorSql,
    },
}

fn key_of(headers: &HeaderMap) -> String {
    headers
        .get("idempotency-key")
        .map(|k| String::from_utf8_lossy(k.as_bytes()).into_owned())
        .unwrap_or_default()
}

/// Two single-row writes: the key's row, then the response into it. Answers with the body, as
/// the echo handler behind the layer does.
async fn write_twice(
    State(floor): State<Arc<Floor>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Bytes) {
    let key = key_of(&headers);
    let ok = match &*floor {
        Floor::Sqlite { writer, sql, .. } => {
            let insert = sqlx::query(&sql.insert)
                .bind(&key)
                .bind(&[7u8; 32][..])
                .bind(1_i64);
            let inserted = insert.execute(&mut *writer.lock().await).await.is_ok();
            let update = sqlx::query(&sql.update)
                .bind(&key)
                .bind(&b""[..])
                .bind(&body[..]);
            inserted && update.execute(&mut *writer.lock().await).await.is_ok()
        }
        Floor::Postgres { connections, sql } => {
            let insert = sqlx::query(&sql.insert)
                .bind(&key)
                .bind(&[7u8; 32][..])
                .bind(1_i64);
            let inserted = connections
                .with(async |c| insert.execute(c).await.is_ok())
                .await;
            let update = sqlx::query(&sql.update)
                .bind(&key)
                .bind(&b""[..])
                .bind(&body[..]);
            inserted
                && connections
                    .with(async |c| update.execute(c).await.is_ok())
                    .await
        }
    };
    match ok {
        true => (StatusCode::CREATED, body),
        false => (StatusCode::INTERNAL_SERVER_ERROR, Bytes::new()),
    }
}

/// One primary-key read of the key's row; answers with the row's body, as a replay does.
async fn read_once(State(floor): State<Arc<Floor>>, headers: HeaderMap) -> (StatusCode, Bytes) {
    let key = key_of(&headers);
    let body: Option<Vec<u8>> = match &*floor {
        Floor::Sqlite { readers, sql, .. } => {
            let select = sqlx::query_scalar(&sql.select).bind(&key);
            readers.with(async |c| select.fetch_optional(c).await).await
        }
        Floor::Postgres { connections, sql } => {
            let select = sqlx::query_scalar(&sql.select).bind(&key);
            connections
                .with(async |c| select.fetch_optional(c).await)
                .await
        }
    }
    .ok()
    .flatten();
    match body {
        Some(body) => (StatusCode::CREATED, Bytes::from(body)),
        None => (StatusCode::NOT_FOUND, Bytes::new()),
    }
}

/// A store under test and its floor.
struct Subject {
    name: &'static str,
    layer: IdempotencyLayer,
    floor: Arc<Floor>,
    cleanup: Box<dyn FnOnce(&tokio::runtime::Handle)>,
}

async fn sqlite_subject(run: &str) -> Result<Subject, BoxError> {
    let dir = std::env::temp_dir();
    let store_path = dir.join(format!("sql-floors-{run}.db"));
    let floor_path = dir.join(format!("sql-floors-{run}-floor.db"));
    let store = SqliteStore::connect(&format!("sqlite://{}", store_path.display())).await?;
    store.migrate().await?;
    let url = format!("sqlite://{}?mode=rwc", floor_path.display());
    let open = || async {
        let mut c = SqliteConnection::connect(&url).await?;
        sqlx::raw_sql(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000",
        )
        .execute(&mut c)
        .await?;
        Ok::<_, sqlx::Error>(c)
    };
    let mut writer = open().await?;
    sqlx::raw_sql(&sqlite_schema_sql("floor"))
        .execute(&mut writer)
        .await?;
    // As many readers as the store has reader lanes (one of its lanes is the writer).
    let mut readers = Vec::new();
    for _ in 0..store.connection_lanes().saturating_sub(1).max(1) {
        readers.push(open().await?);
    }
    let floor = Floor::Sqlite {
        writer: Mutex::new(writer),
        readers: Held::new(readers),
        sql: FloorSql::new("floor", ["?1", "?2", "?3"], "9999999999999"),
    };
    Ok(Subject {
        name: "sqlite",
        layer: IdempotencyLayer::client_keys(store),
        floor: Arc::new(floor),
        cleanup: Box::new(move |_| {
            for path in [store_path, floor_path] {
                for ext in ["", "-wal", "-shm"] {
                    let mut p = path.clone().into_os_string();
                    p.push(ext);
                    let _ = std::fs::remove_file(p);
                }
            }
        }),
    })
}

async fn postgres_subject(run: &str) -> Result<Subject, BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let (table, floor_table) = (format!("sqlfloors_{run}"), format!("sqlfloors_{run}_floor"));
    let store = PostgresStore::connect_with_table(&url, &table).await?;
    store.migrate().await?;
    let mut connections = Vec::new();
    for _ in 0..store.connection_lanes().max(1) {
        connections.push(PgConnection::connect(&url).await?);
    }
    sqlx::raw_sql(&postgres_schema_sql(&floor_table))
        .execute(&mut connections[0])
        .await?;
    let expires = "statement_timestamp() + interval '1 day'";
    let floor = Floor::Postgres {
        connections: Held::new(connections),
        sql: FloorSql::new(&floor_table, ["$1", "$2", "$3"], expires),
    };
    Ok(Subject {
        name: "postgres",
        layer: IdempotencyLayer::client_keys(store),
        floor: Arc::new(floor),
        cleanup: Box::new(move |rt| {
            let drop = format!(r#"DROP TABLE IF EXISTS "{table}", "{floor_table}""#);
            let _ = rt.block_on(async {
                let mut c = PgConnection::connect(&url).await?;
                sqlx::raw_sql(&drop).execute(&mut c).await
            });
        }),
    })
}

/// The servers' and the load generator's runtimes, one worker each (the harness's default).
struct Runtimes {
    server: tokio::runtime::Runtime,
    client: tokio::runtime::Runtime,
}

impl Runtimes {
    fn new() -> std::io::Result<Self> {
        let build = |name: &str| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name(name)
                .enable_all()
                .build()
        };
        Ok(Self {
            server: build("floors-server")?,
            client: build("floors-client")?,
        })
    }

    /// Serves `router`, sends `keys` from `concurrency` workers (a count, or timed), and stops.
    fn cell(
        &self,
        router: Router,
        run: String,
        keys: Keys,
        stop: Stop,
        concurrency: usize,
    ) -> Result<LoadResult, BoxError> {
        let server = self.server.block_on(server::serve(router))?;
        let plan = Plan {
            targets: vec![server.addr],
            run,
            keys,
            body: Bytes::from(vec![b'x'; 1024]),
            concurrency,
            stop,
        };
        Ok(self.client.block_on(drive(plan))?)
    }
}

fn echo(layer: Option<IdempotencyLayer>) -> Router {
    server::router(server::App::default(), layer)
}

fn floor_router(floor: &Arc<Floor>, new_keys: bool) -> Router {
    let route = if new_keys {
        post(write_twice)
    } else {
        post(read_once)
    };
    Router::new()
        .route("/orders", route)
        .with_state(floor.clone())
}

/// One round of one store: the six cells, printed as one table row.
fn round(rts: &Runtimes, args: &Args, subject: &Subject, round: usize) -> Result<(), BoxError> {
    let timed = Stop::Timed {
        warmup: Duration::from_millis(500),
        measure: args.measure,
    };
    let prewarm = Stop::Count(REPLAY_KEYS);
    let c = args.concurrency;
    let run = |cell: &str| format!("{}-{}-{round}-{cell}", subject.name, suffix());
    let bare_first = rts.cell(echo(None), run("bare"), Keys::Unique, timed, c)?;
    let new = rts.cell(
        echo(Some(subject.layer.clone())),
        run("new"),
        Keys::Unique,
        timed,
        c,
    )?;
    let floor_new = rts.cell(
        floor_router(&subject.floor, true),
        run("floor-new"),
        Keys::Unique,
        timed,
        c,
    )?;
    let replays = run("replay");
    let cycle = Keys::Cycle(REPLAY_KEYS);
    rts.cell(
        echo(Some(subject.layer.clone())),
        replays.clone(),
        cycle,
        prewarm,
        16,
    )?;
    let replay = rts.cell(echo(Some(subject.layer.clone())), replays, cycle, timed, c)?;
    let reads = run("floor-replay");
    rts.cell(
        floor_router(&subject.floor, true),
        reads.clone(),
        cycle,
        prewarm,
        16,
    )?;
    let floor_replay = rts.cell(floor_router(&subject.floor, false), reads, cycle, timed, c)?;
    let bare_last = rts.cell(echo(None), run("bare"), Keys::Unique, timed, c)?;
    let bare = (bare_first.rps + bare_last.rps) / 2.0;
    let failed = |r: &LoadResult| r.errors + r.other_status;
    println!(
        "| {} | {round} | {bare:.0} | {:.0} ({:.2}) p99 {:.1} ms | {:.0} ({:.2}) p99 {:.1} ms | **{:.2}** | {:.0} ({:.2}) p99 {:.1} ms | {:.0} ({:.2}) p99 {:.1} ms | **{:.2}** | {} |",
        subject.name,
        new.rps, new.rps / bare, new.p99_us / 1000.0,
        floor_new.rps, floor_new.rps / bare, floor_new.p99_us / 1000.0,
        new.rps / floor_new.rps,
        replay.rps, replay.rps / bare, replay.p99_us / 1000.0,
        floor_replay.rps, floor_replay.rps / bare, floor_replay.p99_us / 1000.0,
        replay.rps / floor_replay.rps,
        failed(&new) + failed(&floor_new) + failed(&replay) + failed(&floor_replay),
    );
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let args = parse_args()?;
    let rts = Runtimes::new()?;
    let run = suffix();
    let mut subjects = Vec::new();
    for name in &args.stores {
        let subject = match name.as_str() {
            "sqlite" => rts.server.block_on(sqlite_subject(&run))?,
            "postgres" => rts.server.block_on(postgres_subject(&run))?,
            other => return Err(format!("unknown store {other}").into()),
        };
        subjects.push(subject);
    }
    eprintln!(
        "sql_floors: c={} {:?} per cell, load average {}",
        args.concurrency,
        args.measure,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!("| store | round | bare req/s | new keys (ratio to bare) | new-key floor: 2 writes | new / floor | replays | replay floor: PK SELECT | replay / floor | failed |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut outcome = Ok(());
    'rounds: for r in 1..=args.rounds {
        for subject in &subjects {
            if let Err(error) = round(&rts, &args, subject, r) {
                outcome = Err(error);
                break 'rounds;
            }
        }
    }
    for subject in subjects {
        (subject.cleanup)(rts.server.handle());
    }
    outcome
}
