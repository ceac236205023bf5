//! Latency of the SQL stores against the floor of the same database in the same run:
//!
//! - `claim_complete`: a first request's store work (claim, then complete with a 1 KiB body),
//!   against `raw_insert`, one plain `INSERT` of a key and 1 KiB blob (claim + complete are two
//!   statements, so twice `raw_insert` is the floor).
//! - `replay`: a duplicate's store work (one claim answering the completed record), against
//!   `raw_select`, a plain `SELECT` of the blob by key.
//!
//! The floors run on one connection taken from the pool once and held: a statement on it is one
//! round trip, as the stores' statements are on their connection lanes. Through the pool each
//! statement would also pay sqlx's pings on hand-out and return (see the crate docs).
//!
//! `cargo bench -p tower-idempotency-sqlx`. Postgres benchmarks are skipped (with a line on
//! stderr) when `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) is unreachable.

use std::{
    hash::{BuildHasher, RandomState},
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use criterion::{criterion_group, criterion_main, Criterion};
use http::HeaderValue;
use sqlx::Pool;
use tokio::runtime::Runtime;
use tower_idempotency_core::{CachedResponse, ClaimOutcome, Fingerprint, Store};
use tower_idempotency_sqlx::{PostgresStore, SqliteStore};
use tower_idempotency_testkit::created_json;

const BODY: usize = 1024;
const LEASE: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(3600);

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn fresh_key() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let salt = RandomState::new().hash_one(n);
    format!("bench:{salt:016x}{n:048x}")
}

fn cached() -> CachedResponse {
    let mut response = created_json(BODY);
    response
        .headers
        .insert("location", HeaderValue::from_static("/orders/ord_1"));
    response
}

async fn claim_complete(store: &dyn Store, response: &CachedResponse) {
    completed_key(store, response).await;
}

async fn completed_key(store: &dyn Store, response: &CachedResponse) -> String {
    let key = fresh_key();
    let ClaimOutcome::Claimed { token } = store
        .claim(
            &key,
            &Fingerprint([1; 32]),
            tower_idempotency_core::FencingToken::random().unwrap(),
            LEASE,
        )
        .await
        .expect("claim")
    else {
        panic!("fresh key not claimed")
    };
    store
        .complete(&key, token, response, TTL)
        .await
        .expect("complete");
    key
}

async fn replay(store: &dyn Store, key: &str) {
    let outcome = store
        .claim(
            key,
            &Fingerprint([1; 32]),
            tower_idempotency_core::FencingToken::random().unwrap(),
            LEASE,
        )
        .await
        .expect("claim");
    assert!(matches!(outcome, ClaimOutcome::Completed { .. }));
}

/// The floor's statements on one database: an insert of a key and a blob, and a select of the
/// blob by key.
struct FloorSql {
    insert: String,
    select: String,
}

/// The group `name`: the store's work on `store`, and its floors on one connection of `pool`,
/// taken once and held.
fn group<DB>(
    c: &mut Criterion,
    name: &str,
    rt: &Runtime,
    store: &dyn Store,
    pool: &Pool<DB>,
    floor: &FloorSql,
) where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> Vec<u8>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    (Vec<u8>,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let response = cached();
    let blob = vec![b'x'; BODY + 64];
    let replay_key = rt.block_on(completed_key(store, &response));
    let select_key = fresh_key();
    rt.block_on(
        sqlx::query(sqlx::AssertSqlSafe(&*floor.insert))
            .bind(&select_key)
            .bind(&blob)
            .execute(pool),
    )
    .expect("seed");
    let floor_connection =
        tokio::sync::Mutex::new(rt.block_on(pool.acquire()).expect("floor connection"));

    let mut group = c.benchmark_group(name);
    group.bench_function("claim_complete", |b| {
        b.to_async(rt).iter(|| claim_complete(store, &response))
    });
    group.bench_function("raw_insert", |b| {
        b.to_async(rt).iter(|| async {
            sqlx::query(sqlx::AssertSqlSafe(&*floor.insert))
                .bind(fresh_key())
                .bind(&blob)
                .execute(&mut **floor_connection.lock().await)
                .await
                .expect("insert");
        })
    });
    group.bench_function("replay", |b| {
        b.to_async(rt).iter(|| replay(store, &replay_key))
    });
    group.bench_function("raw_select", |b| {
        b.to_async(rt).iter(|| async {
            let value: Vec<u8> = sqlx::query_scalar(sqlx::AssertSqlSafe(&*floor.select))
                .bind(&select_key)
                .fetch_one(&mut **floor_connection.lock().await)
                .await
                .expect("select");
            assert_eq!(value.len(), blob.len());
        })
    });
    group.finish();
    // Handing a connection back to sqlx's pool needs the runtime.
    rt.block_on(async move { drop(floor_connection) });
}

fn sqlite(c: &mut Criterion) {
    let rt = Runtime::new().expect("runtime");
    let path = std::env::temp_dir().join(format!(
        "tower-idem-bench-{:016x}.db",
        RandomState::new().hash_one(0)
    ));
    let url = format!("sqlite://{}", path.display());
    let store = rt.block_on(async {
        let store = SqliteStore::connect_with_table(&url, "idem")
            .await
            .expect("open");
        store.migrate().await.expect("migrate");
        sqlx::raw_sql("CREATE TABLE floor (key TEXT PRIMARY KEY, value BLOB NOT NULL)")
            .execute(store.pool())
            .await
            .expect("floor table");
        store
    });
    let floor = FloorSql {
        insert: "INSERT INTO floor VALUES (?1, ?2)".into(),
        select: "SELECT value FROM floor WHERE key = ?1".into(),
    };
    group(c, "sqlite", &rt, &store, store.pool(), &floor);
    rt.block_on(store.pool().close());
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
}

fn postgres(c: &mut Criterion) {
    let rt = Runtime::new().expect("runtime");
    let suffix = format!("{:016x}", RandomState::new().hash_one(1));
    let (table, floor) = (format!("idem_bench_{suffix}"), format!("floor_{suffix}"));
    let store = match rt.block_on(postgres_store(&table, &floor)) {
        Ok(store) => store,
        Err(why) => {
            eprintln!("SKIPPED postgres benchmarks: {why}");
            return;
        }
    };
    let floor_sql = FloorSql {
        insert: format!("INSERT INTO {floor} VALUES ($1, $2)"),
        select: format!("SELECT value FROM {floor} WHERE key = $1"),
    };
    group(c, "postgres", &rt, &store, store.pool(), &floor_sql);
    rt.block_on(async {
        let drop = format!("DROP TABLE IF EXISTS {table}; DROP TABLE IF EXISTS {floor}");
        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(&*drop))
            .execute(store.pool())
            .await;
    });
}

/// The store on `table` and the floor's table `floor`, on `DATABASE_URL`; why not, when the
/// database is unreachable.
async fn postgres_store(table: &str, floor: &str) -> Result<PostgresStore, String> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let pool = tokio::time::timeout(Duration::from_secs(5), sqlx::PgPool::connect(&url))
        .await
        .map_err(|_| "connecting timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    let store = PostgresStore::new(pool, table).expect("table name");
    store.migrate().await.map_err(|e| e.to_string())?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
        "CREATE TABLE {floor} (key text COLLATE \"C\" PRIMARY KEY, value bytea NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .map_err(|e| e.to_string())?;
    Ok(store)
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = sqlite, postgres
}
criterion_main!(benches);
