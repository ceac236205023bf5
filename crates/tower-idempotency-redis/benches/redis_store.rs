//! Latency of the Redis store against the floor: raw commands moving the same bytes with the
//! same number of round trips, measured in the same run on the same connection.
//!
//! - `first_request`: `claim` + `complete` (`SET NX PX GET`, then one `EVALSHA`, or for records
//!   over 4 KiB a pipelined staging `SET` + `EVALSHA`) vs `SET NX PX` + `SET PX`: two round trips
//!   each.
//! - `replay`: `claim` of a completed key (`SET NX PX GET`) vs `GET` of a value of the same size.
//!
//! Needs Redis at `REDIS_URL` (default `redis://127.0.0.1:6379`); without it the benchmark says so
//! and measures nothing. Keys use their own prefix and are deleted at the end.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use http::{HeaderMap, HeaderValue, StatusCode};
use redis::{aio::ConnectionManager, AsyncCommands};
use tower_idempotency_core::{CachedResponse, ClaimOutcome, CompletedRecord, Fingerprint, Store};
use tower_idempotency_redis::RedisStore;

const PREFIX: &str = "tidem-bench";
const TTL: Duration = Duration::from_secs(120);
const SIZES: [usize; 2] = [1024, 64 * 1024];

fn response(size: usize) -> CachedResponse {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    CachedResponse {
        status: StatusCode::CREATED,
        headers,
        body: Bytes::from(vec![b'x'; size]),
        body_omitted: false,
    }
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let Ok((store, raw)) = runtime.block_on(async {
        let store = RedisStore::connect(&url, PREFIX).await?;
        let raw = ConnectionManager::new(redis::Client::open(url.as_str()).unwrap())
            .await
            .map_err(tower_idempotency_redis::ConnectError::Redis)?;
        Ok::<_, tower_idempotency_redis::ConnectError>((store, raw))
    }) else {
        eprintln!("SKIPPED redis store benchmark: Redis at {url} is unreachable");
        return;
    };
    let counter = AtomicU64::new(0);
    let next_key = || format!("bench:{:064x}", counter.fetch_add(1, Ordering::Relaxed));
    let fp = Fingerprint([5; 32]);
    let lease = Duration::from_secs(30);

    let mut first = c.benchmark_group("first_request");
    for size in SIZES {
        let cached = response(size);
        let record_len = 41
            + CompletedRecord {
                fingerprint: fp,
                response: cached.clone(),
            }
            .encode()
            .len();
        first.bench_function(BenchmarkId::new("store_claim_complete", size), |b| {
            b.to_async(&runtime).iter(|| async {
                let key = next_key();
                let ClaimOutcome::Claimed { token } = store
                    .claim(
                        &key,
                        &fp,
                        tower_idempotency_core::FencingToken::random().unwrap(),
                        lease,
                    )
                    .await
                    .unwrap()
                else {
                    panic!("new key not claimed");
                };
                store.complete(&key, token, &cached, TTL).await.unwrap();
            })
        });
        let small = vec![b'i'; 41];
        let value = vec![b'c'; record_len];
        first.bench_function(BenchmarkId::new("floor_setnx_set", size), |b| {
            b.to_async(&runtime).iter(|| async {
                let key = format!("{PREFIX}:{{{}}}", next_key());
                let mut raw = raw.clone();
                let _: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg(&small)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(&mut raw)
                    .await
                    .unwrap();
                let _: () = redis::cmd("SET")
                    .arg(&key)
                    .arg(&value)
                    .arg("PX")
                    .arg(120_000)
                    .query_async(&mut raw)
                    .await
                    .unwrap();
            })
        });
    }
    first.finish();

    let mut replay = c.benchmark_group("replay");
    for size in SIZES {
        let cached = response(size);
        let key = next_key();
        let value = runtime.block_on(async {
            let ClaimOutcome::Claimed { token } = store
                .claim(
                    &key,
                    &fp,
                    tower_idempotency_core::FencingToken::random().unwrap(),
                    lease,
                )
                .await
                .unwrap()
            else {
                panic!("new key not claimed");
            };
            store.complete(&key, token, &cached, TTL).await.unwrap();
            let mut raw = raw.clone();
            let value: Vec<u8> = raw.get(store.redis_key(&key)).await.unwrap();
            let copy = format!("{PREFIX}:{{floor-{size}}}");
            let _: () = raw.set_ex(&copy, &value, 120).await.unwrap();
            copy
        });
        replay.bench_function(BenchmarkId::new("store_claim_replay", size), |b| {
            b.to_async(&runtime).iter(|| async {
                match store
                    .claim(
                        &key,
                        &fp,
                        tower_idempotency_core::FencingToken::random().unwrap(),
                        lease,
                    )
                    .await
                    .unwrap()
                {
                    ClaimOutcome::Completed { record, .. } => {
                        assert_eq!(record.response.body.len(), size)
                    }
                    other => panic!("expected a replay, got {other:?}"),
                }
            })
        });
        replay.bench_function(BenchmarkId::new("floor_get", size), |b| {
            b.to_async(&runtime).iter(|| async {
                let mut raw = raw.clone();
                let v: Vec<u8> = raw.get(&value).await.unwrap();
                assert!(v.len() > size);
            })
        });
    }
    replay.finish();

    runtime.block_on(async {
        let mut raw = raw.clone();
        let keys: Vec<String> = raw.keys(format!("{PREFIX}:*")).await.unwrap_or_default();
        for chunk in keys.chunks(500) {
            let _: redis::RedisResult<()> = raw.del(chunk).await;
        }
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
