//! Store round trips per request: what reaches the backend, counted on the wire where there is
//! one.

use std::{
    net::{SocketAddr, ToSocketAddrs},
    str::FromStr,
    sync::{atomic::Ordering, Arc},
};

use serde::{Deserialize, Serialize};
use tower_idempotency_redis::RedisStore;
use tower_idempotency_sqlx::{sqlx, PostgresStore};

use crate::{
    load::{drive, Keys, Plan, Stop, Workload, REPLAY_KEYS},
    peer::PeerStore,
    proxy::{self, CountingProxy},
    setup::{body, Backends, Runtimes, Target},
    throughput::launch,
    Args, HarnessError, Result,
};

/// Store round trips per request, from a dedicated counting pass.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RoundTrips {
    /// The store.
    pub store: String,
    /// The workload.
    pub workload: Workload,
    /// Workers in the pass.
    pub concurrency: usize,
    /// Requests sent.
    pub requests: u64,
    /// `statements` (sqlx counter) or `commands` (counted on the wire by a proxy).
    pub unit: String,
    /// Round trips in total.
    pub round_trips: u64,
    /// Per request.
    pub per_request: f64,
    /// Status mix of the pass.
    pub executed: u64,
    /// Replays.
    pub replayed: u64,
    /// `409`s.
    pub conflicts: u64,
}

/// A counting pass per workload: 16 workers, a fixed number of requests, round trips counted on
/// the wire by a proxy (Redis commands, Postgres exchanges) or, for SQLite, which has no wire,
/// by the store's statement counter.
pub(crate) fn count(
    args: &Args,
    rts: &Runtimes,
    b: &Backends,
    target: &Target,
) -> Result<Vec<RoundTrips>> {
    let Some((counted, proxy, unit)) = counted_target(rts, b, target)? else {
        return Ok(Vec::new());
    };
    // A peer's Valkey store connects through the proxy too.
    let redis_url = match &proxy {
        Some(p) => format!("redis://{}", p.addr),
        None => b.redis_url.clone(),
    };
    let counter = || match (&proxy, &counted) {
        (Some(p), _) => p.count.load(Ordering::SeqCst),
        (None, t) => t.statements().unwrap_or(0),
    };
    let requests = if args.quick { 200 } else { 2000 };
    let mut rows = Vec::new();
    for workload in Workload::ALL {
        let server = launch(rts, b, &counted, &redis_url)?;
        let run = format!("{}-rt-{}-{}", b.run, target.name(), workload.name());
        let keys = match workload {
            Workload::New => Keys::Unique,
            Workload::Replay => Keys::Cycle(REPLAY_KEYS),
            Workload::Hot => Keys::Hot,
        };
        let plan = |stop| Plan {
            targets: vec![server.addr()],
            run: run.clone(),
            keys,
            body: body(1024),
            concurrency: 16,
            stop,
        };
        if workload == Workload::Replay {
            rts.client.block_on(drive(plan(Stop::Count(REPLAY_KEYS))))?;
        } else {
            // Outside the count: the store's first statements on each connection (taking it
            // from the pool, preparing each statement once), on keys of their own.
            let warm = Plan {
                run: format!("{run}-warm"),
                ..plan(Stop::Count(64))
            };
            rts.client.block_on(drive(warm))?;
        }
        let before = counter();
        let result = rts.client.block_on(drive(plan(Stop::Count(requests))))?;
        let trips = counter() - before;
        let row = RoundTrips {
            store: target.name().into(),
            workload,
            concurrency: 16,
            requests: result.total_requests,
            unit: unit.into(),
            round_trips: trips,
            per_request: trips as f64 / result.total_requests.max(1) as f64,
            executed: result.executed,
            replayed: result.replayed,
            conflicts: result.conflicts,
        };
        eprintln!(
            "  {:>8} {:>6} {:.2} {unit}/request",
            target.name(),
            workload.name(),
            row.per_request
        );
        rows.push(row);
    }
    Ok(rows)
}

/// The store to count, its counting proxy (none for SQLite) and the unit counted; `None` for a
/// target without a backend.
fn counted_target(
    rts: &Runtimes,
    b: &Backends,
    target: &Target,
) -> Result<Option<(Target, Option<CountingProxy>, &'static str)>> {
    Ok(Some(match target {
        Target::Bare
        | Target::Memory
        | Target::MemoryConstantFingerprint
        | Target::SqlFloor(_)
        | Target::Peer(PeerStore::Bare | PeerStore::Memory) => return Ok(None),
        // The peer connects through the proxy (see `count`); it has no in-process store.
        Target::Peer(PeerStore::Valkey) => {
            let upstream = redis_addr(&b.redis_url)?;
            let proxy = rts
                .server
                .block_on(proxy::start(upstream, proxy::Protocol::Resp))?;
            (target.clone(), Some(proxy), "commands")
        }
        Target::Sqlite(_) => (target.clone(), None, "statements"),
        Target::Postgres(_) | Target::PostgresCached(_) => {
            let (store, proxy) = postgres_through_proxy(rts, b)?;
            let counted = match target {
                Target::PostgresCached(_) => Target::PostgresCached(store),
                _ => Target::Postgres(store),
            };
            (counted, Some(proxy), "round trips")
        }
        // The Redis store under count connects through the proxy, with the same prefix.
        Target::Redis(_) | Target::RedisCached(_) => {
            let upstream = redis_addr(&b.redis_url)?;
            let proxy = rts
                .server
                .block_on(proxy::start(upstream, proxy::Protocol::Resp))?;
            let url = format!("redis://{}", proxy.addr);
            let store = rts
                .server
                .block_on(RedisStore::connect(&url, &b.redis_prefix))
                .map_err(|_| HarnessError::Child("redis through the counting proxy"))?;
            let counted = match target {
                Target::RedisCached(_) => Target::RedisCached(store),
                _ => Target::Redis(store),
            };
            (counted, Some(proxy), "commands")
        }
    }))
}

/// A Postgres store on the run's table whose pool connects through a counting proxy.
fn postgres_through_proxy(
    rts: &Runtimes,
    b: &Backends,
) -> Result<(Arc<PostgresStore>, CountingProxy)> {
    let options = sqlx::postgres::PgConnectOptions::from_str(&b.pg_url)?;
    let upstream = (options.get_host(), options.get_port())
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| HarnessError::Usage("DATABASE_URL host does not resolve".into()))?;
    let proxy = rts
        .server
        .block_on(proxy::start(upstream, proxy::Protocol::Postgres))?;
    let options = options
        .host("127.0.0.1")
        .port(proxy.addr.port())
        .ssl_mode(sqlx::postgres::PgSslMode::Disable);
    let store = rts.server.block_on(async {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(10)
            .connect_with(options)
            .await?;
        Ok::<_, sqlx::Error>(Arc::new(b.postgres(
            PostgresStore::new(pool, &b.pg_table).expect("the harness's table name is valid"),
        )))
    })?;
    Ok((store, proxy))
}

/// The address of `REDIS_URL` (`redis://[user@]host[:port][/db]`).
fn redis_addr(url: &str) -> Result<SocketAddr> {
    let rest = url
        .strip_prefix("redis://")
        .ok_or_else(|| HarnessError::Usage("REDIS_URL must be redis://host:port".into()))?;
    let hostport = rest.split('/').next().unwrap_or(rest);
    let hostport = hostport.rsplit('@').next().unwrap_or(hostport);
    let hostport = if hostport.contains(':') {
        hostport.to_owned()
    } else {
        format!("{hostport}:6379")
    };
    hostport
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| HarnessError::Usage("REDIS_URL host does not resolve".into()))
}
