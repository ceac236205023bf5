//! Several receiver instances sharing one backend: throughput, and proof that no key ran twice
//! across instances.

use std::{
    collections::HashMap,
    sync::{atomic::Ordering, Arc, Mutex},
};

use serde::{Deserialize, Serialize};
use tower_idempotency_core::IdempotencyLayer;
use tower_idempotency_redis::RedisStore;
use tower_idempotency_sqlx::PostgresStore;

use crate::{
    load::{drive, Keys, LoadResult, Plan, Stop, Workload},
    server::{router, serve, App, Server},
    setup::{body, Backends, Runtimes, Target},
    Args, HarnessError, Result,
};

/// Several receiver instances sharing one backend.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScalingRow {
    /// The store.
    pub store: String,
    /// Receiver instances (own layer, own pool or connection, own listener).
    pub instances: usize,
    /// The workload.
    pub workload: Workload,
    /// Workers, spread round-robin over the instances.
    pub concurrency: usize,
    /// What the generator measured.
    pub result: LoadResult,
    /// Handler executions over all instances.
    pub handler_runs: u64,
    /// Keys whose handler ran more than once (must be 0).
    pub keys_run_twice: u64,
}

/// 1 to 4 receiver instances (each its own store connection/pool, layer and listener) sharing
/// one backend; workers are assigned to instances round-robin.
pub(crate) fn measure(
    args: &Args,
    rts: &Runtimes,
    b: &Backends,
    target: &Target,
) -> Result<Vec<ScalingRow>> {
    let concurrency = args.concurrency.iter().copied().max().unwrap_or(64);
    let mut rows = Vec::new();
    for instances in 1..=4usize {
        let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
        let Some((servers, apps)) = start_instances(rts, b, target, instances, &seen)? else {
            return Ok(rows);
        };
        for workload in [Workload::New, Workload::Hot] {
            seen.lock().unwrap_or_else(|p| p.into_inner()).clear();
            let runs_before: u64 = apps.iter().map(|a| a.runs.load(Ordering::SeqCst)).sum();
            let result = rts.client.block_on(drive(Plan {
                targets: servers.iter().map(|s| s.addr).collect(),
                run: format!(
                    "{}-scale-{}-{instances}-{}",
                    b.run,
                    target.name(),
                    workload.name()
                ),
                keys: if workload == Workload::New {
                    Keys::Unique
                } else {
                    Keys::Hot
                },
                body: body(1024),
                concurrency,
                stop: Stop::Timed {
                    warmup: args.warmup,
                    measure: args.duration,
                },
            }))?;
            let runs_after: u64 = apps.iter().map(|a| a.runs.load(Ordering::SeqCst)).sum();
            let keys_run_twice = seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .filter(|&&n| n > 1)
                .count() as u64;
            eprintln!(
                "  scale {:>8} x{instances} {:>4} c={concurrency} {:>8.0} req/s p99 {:>7.0} us, keys run twice: {keys_run_twice}",
                target.name(),
                workload.name(),
                result.rps,
                result.p99_us
            );
            rows.push(ScalingRow {
                store: target.name().into(),
                instances,
                workload,
                concurrency,
                result,
                handler_runs: runs_after - runs_before,
                keys_run_twice,
            });
        }
    }
    Ok(rows)
}

/// `instances` servers, each with a store of its own on the shared backend and a handler that
/// records its runs per key in `seen`; `None` for a target that is not Postgres or Redis.
fn start_instances(
    rts: &Runtimes,
    b: &Backends,
    target: &Target,
    instances: usize,
    seen: &Arc<Mutex<HashMap<String, u32>>>,
) -> Result<Option<(Vec<Server>, Vec<App>)>> {
    let mut servers = Vec::new();
    let mut apps = Vec::new();
    for _ in 0..instances {
        let layer = match target {
            Target::Postgres(_) => {
                let store = rts
                    .server
                    .block_on(PostgresStore::connect_with_table(&b.pg_url, &b.pg_table))
                    .map_err(|_| HarnessError::Child("postgres scaling instance"))?;
                IdempotencyLayer::client_keys(b.postgres(store))
            }
            Target::Redis(_) => {
                let store = rts
                    .server
                    .block_on(RedisStore::connect(&b.redis_url, &b.redis_prefix))
                    .map_err(|_| HarnessError::Child("redis scaling instance"))?;
                IdempotencyLayer::client_keys(store)
            }
            _ => return Ok(None),
        };
        let app = App {
            seen: Some(seen.clone()),
            ..App::default()
        };
        servers.push(
            rts.server
                .block_on(serve(router(app.clone(), Some(layer))))?,
        );
        apps.push(app);
    }
    Ok(Some((servers, apps)))
}
