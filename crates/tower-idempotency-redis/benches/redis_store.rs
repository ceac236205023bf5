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

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use redis::{aio::ConnectionManager, AsyncCommands};
use tower_idempotency_core::{CachedResponse, ClaimOutcome, CompletedRecord, Fingerprint, Store};
use tower_idempotency_redis::RedisStore;
use tower_idempotency_testkit::created_json;

const PREFIX: &str = "tidem-bench";
const TTL: Duration = Duration::from_secs(120);
const SIZES: [usize; 2] = [1024, 64 * 1024];
const FP: Fingerprint = Fingerprint([5; 32]);
const LEASE: Duration = Duration::from_secs(30);

/// What both groups share: the runtime, the store and a raw connection to the same server.
struct Bench {
    runtime: tokio::runtime::Runtime,
    store: RedisStore,
    raw: ConnectionManager,
    counter: AtomicU64,
}

impl Bench {
    /// `None` (and a note on stderr) when Redis is unreachable.
    fn connect() -> Option<Self> {
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
            return None;
        };
        Some(Self {
            runtime,
            store,
            raw,
            counter: AtomicU64::new(0),
        })
    }

    fn next_key(&self) -> String {
        format!(
            "bench:{:064x}",
            self.counter.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// `claim` with a fresh token, as the layer sends it.
    async fn claim(&self, key: &str) -> ClaimOutcome {
        let token = tower_idempotency_core::FencingToken::random().unwrap();
        self.store.claim(key, &FP, token, LEASE).await.unwrap()
    }

    /// Claims and completes a new key with `cached`.
    async fn claim_complete(&self, key: &str, cached: &CachedResponse) {
        let ClaimOutcome::Claimed { token } = self.claim(key).await else {
            panic!("new key not claimed");
        };
        self.store.complete(key, token, cached, TTL).await.unwrap();
    }

    fn first_request(&self, c: &mut Criterion) {
        let mut first = c.benchmark_group("first_request");
        for size in SIZES {
            let cached = created_json(size);
            let record_len = 41
                + CompletedRecord {
                    fingerprint: FP,
                    response: cached.clone(),
                }
                .encode()
                .len();
            first.bench_function(BenchmarkId::new("store_claim_complete", size), |b| {
                b.to_async(&self.runtime)
                    .iter(|| async { self.claim_complete(&self.next_key(), &cached).await })
            });
            let small = vec![b'i'; 41];
            let value = vec![b'c'; record_len];
            first.bench_function(BenchmarkId::new("floor_setnx_set", size), |b| {
                b.to_async(&self.runtime).iter(|| async {
                    let key = format!("{PREFIX}:{{{}}}", self.next_key());
                    let mut raw = self.raw.clone();
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
    }

    /// A completed key of `size`, and a plain key holding a copy of its record for the floor.
    fn completed_key(&self, size: usize) -> (String, String) {
        let key = self.next_key();
        let copy = self.runtime.block_on(async {
            self.claim_complete(&key, &created_json(size)).await;
            let mut raw = self.raw.clone();
            let value: Vec<u8> = raw.get(self.store.redis_key(&key)).await.unwrap();
            let copy = format!("{PREFIX}:{{floor-{size}}}");
            let _: () = raw.set_ex(&copy, &value, 120).await.unwrap();
            copy
        });
        (key, copy)
    }

    fn replay(&self, c: &mut Criterion) {
        let mut replay = c.benchmark_group("replay");
        for size in SIZES {
            let (key, copy) = self.completed_key(size);
            replay.bench_function(BenchmarkId::new("store_claim_replay", size), |b| {
                b.to_async(&self.runtime).iter(|| async {
                    match self.claim(&key).await {
                        ClaimOutcome::Completed { record, .. } => {
                            assert_eq!(record.response.body.len(), size)
                        }
                        other => panic!("expected a replay, got {other:?}"),
                    }
                })
            });
            replay.bench_function(BenchmarkId::new("floor_get", size), |b| {
                b.to_async(&self.runtime).iter(|| async {
                    let mut raw = self.raw.clone();
                    let v: Vec<u8> = raw.get(&copy).await.unwrap();
                    assert!(v.len() > size);
                })
            });
        }
        replay.finish();
    }

    fn clean_up(&self) {
        self.runtime.block_on(async {
            let mut raw = self.raw.clone();
            let keys: Vec<String> = raw.keys(format!("{PREFIX}:*")).await.unwrap_or_default();
            for chunk in keys.chunks(500) {
                let _: redis::RedisResult<()> = raw.del(chunk).await;
            }
        });
    }
}

fn bench(c: &mut Criterion) {
    let Some(bench) = Bench::connect() else {
        return;
    };
    bench.first_request(c);
    bench.replay(c);
    bench.clean_up();
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
