//! Raw store floors: the backend's own round trip, without the layer or HTTP, to compare a
//! replay's latency with.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tower_idempotency_core::{PrincipalSource, Scope};
use tower_idempotency_redis::RedisStore;
use tower_idempotency_sqlx::{sqlx, PostgresStore};

use crate::{
    load,
    setup::{Backends, Runtimes, Target},
    Args, Result,
};

/// A raw store round trip, without the layer or HTTP.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Floor {
    /// The store.
    pub store: String,
    /// What was sent.
    pub operation: String,
    /// Concurrent callers.
    pub concurrency: usize,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Median, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
}

/// Runs `op` from `concurrency` tasks on the server runtime for the cell's duration.
fn floor_run<F, Fut>(
    args: &Args,
    rts: &Runtimes,
    concurrency: usize,
    op: F,
) -> (f64, Histogram<u64>)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let warmup = args.warmup.min(Duration::from_millis(300));
    let measure = args.duration.min(Duration::from_millis(1500));
    rts.server.block_on(async move {
        let start = Instant::now();
        let measure_start = start + warmup;
        let end = measure_start + measure;
        let tasks: Vec<_> = (0..concurrency)
            .map(|task| {
                let op = op.clone();
                tokio::spawn(async move {
                    let mut h = load::histogram();
                    loop {
                        let t = Instant::now();
                        if t >= end {
                            break;
                        }
                        if !op(task).await {
                            break;
                        }
                        if t >= measure_start {
                            let _ = h.record((t.elapsed().as_nanos() as u64).max(1));
                        }
                    }
                    h
                })
            })
            .collect();
        let mut merged = load::histogram();
        for task in tasks {
            if let Ok(h) = task.await {
                let _ = merged.add(&h);
            }
        }
        (merged.len() as f64 / measure.as_secs_f64(), merged)
    })
}

/// The raw floors of `target`'s backend (Postgres `SELECT`, Redis `GET`) at each concurrency.
pub(crate) fn measure(
    args: &Args,
    rts: &Runtimes,
    b: &Backends,
    target: &Target,
) -> Result<Vec<Floor>> {
    match target {
        Target::Postgres(store) => postgres(args, rts, b, store),
        Target::Redis(store) => redis_get(args, rts, b, store),
        _ => Ok(Vec::new()),
    }
}

/// The [`Floor`] row of `operation` on `store`: a [`floor_run`] of `op`, printed as it is made.
fn row<F, Fut>(
    args: &Args,
    rts: &Runtimes,
    store: &str,
    operation: &str,
    concurrency: usize,
    op: F,
) -> Floor
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let (ops, h) = floor_run(args, rts, concurrency, op);
    let row = Floor {
        store: store.into(),
        operation: operation.into(),
        concurrency,
        ops_per_s: ops,
        p50_us: h.value_at_quantile(0.5) as f64 / 1000.0,
        p99_us: h.value_at_quantile(0.99) as f64 / 1000.0,
    };
    eprintln!(
        "  floor {:>8} {:<40} c={:<3} p50 {:>6.0} us p99 {:>6.0} us",
        row.store, row.operation, concurrency, row.p50_us, row.p99_us
    );
    row
}

/// `SELECT` of a completed 1 KiB row by key, one connection per caller.
fn postgres(
    args: &Args,
    rts: &Runtimes,
    b: &Backends,
    store: &PostgresStore,
) -> Result<Vec<Floor>> {
    let pool = store.pool().clone();
    let table = store.table().to_owned();
    // A completed row written by the replay cells (1 KiB body).
    let key: Option<String> = rts.server.block_on(
        sqlx::query_scalar(sqlx::AssertSqlSafe(&*format!(
            "SELECT key FROM \"{table}\" WHERE state = 1 AND length(body) = 1024 LIMIT 1"
        )))
        .fetch_optional(&pool),
    )?;
    let Some(key) = key else {
        return Ok(Vec::new());
    };
    let select = Arc::new(format!("SELECT * FROM \"{table}\" WHERE key = $1"));
    let mut rows = Vec::new();
    for &c in &args.concurrency {
        // One connection per caller, outside the pool: a raw round trip, not the pool's
        // hand-out and return pings around it.
        let connections = rts.server.block_on(async {
            let mut connections = Vec::with_capacity(c);
            for _ in 0..c {
                let connection =
                    <sqlx::PgConnection as sqlx::Connection>::connect(&b.pg_url).await?;
                connections.push(tokio::sync::Mutex::new(connection));
            }
            Ok::<_, sqlx::Error>(Arc::new(connections))
        })?;
        let (key, select) = (key.clone(), select.clone());
        let op = move |task: usize| {
            let (connections, key, select) = (connections.clone(), key.clone(), select.clone());
            async move {
                let mut connection = connections[task].lock().await;
                sqlx::query(sqlx::AssertSqlSafe(select.as_str()))
                    .bind(&key)
                    .fetch_optional(&mut *connection)
                    .await
                    .is_ok()
            }
        };
        let operation = "SELECT * WHERE key = $1 (1 KiB row, own connection)";
        rows.push(row(args, rts, "postgres", operation, c, op));
    }
    Ok(rows)
}

/// `GET` of a value the size of a completed 1 KiB record, on one multiplexed connection.
fn redis_get(args: &Args, rts: &Runtimes, b: &Backends, store: &RedisStore) -> Result<Vec<Floor>> {
    let client = redis::Client::open(b.redis_url.as_str())?;
    let conn = rts
        .server
        .block_on(client.get_multiplexed_async_connection())?;
    // The record of a replay key: same size and layout as what a replay reads.
    let scope = Scope::new("idempotency", PrincipalSource::Extension);
    let (parts, ()) = http::Request::post("/orders")
        .body(())
        .expect("valid request")
        .into_parts();
    let key = store.redis_key(&scope.store_key(&parts, &format!("{}-floor-0", b.run)));
    let mut setup = conn.clone();
    let value = vec![b'x'; 1024 + 120];
    let () = rts.server.block_on(
        redis::cmd("SET")
            .arg(&key)
            .arg(&value)
            .arg("PX")
            .arg(600_000)
            .query_async(&mut setup),
    )?;
    let key = Arc::new(key);
    let mut rows = Vec::new();
    for &c in &args.concurrency {
        let (conn, key) = (conn.clone(), key.clone());
        let op = move |_task: usize| {
            let (mut conn, key) = (conn.clone(), key.clone());
            async move {
                redis::cmd("GET")
                    .arg(key.as_str())
                    .query_async::<Vec<u8>>(&mut conn)
                    .await
                    .is_ok()
            }
        };
        rows.push(row(args, rts, "redis", "GET (1.1 KiB value)", c, op));
    }
    Ok(rows)
}
