//! Store round trips per request: what reaches the backend, counted on the wire where there is
//! one.

use std::{
    net::{SocketAddr, ToSocketAddrs},
    str::FromStr,
    sync::Arc,
};

use serde::{Deserialize, Serialize};
use tower_idempotency_redis::RedisStore;
use tower_idempotency_sqlx::{sqlx, PostgresStore};
use tower_idempotency_testkit::{Protocol, Proxy};

use crate::{
    load::{drive, Keys, Plan, Stop, Workload, REPLAY_KEYS},
    peer::PeerStore,
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
    /// Redis only: the server's CPU time per request (`INFO commandstats` `usec`, scripts'
    /// inner commands included), and the commands it counted per request. Server-wide counters:
    /// other clients of the same server during the pass would add to them.
    #[serde(default)]
    pub redis_server: Option<RedisServerCost>,
}

/// What a Redis pass cost the server, per request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RedisServerCost {
    /// Microseconds of command execution per request.
    pub usec_per_request: f64,
    /// `command × calls per request`, e.g. `set 1.00, evalsha 1.00`.
    pub calls: String,
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
    let counting = Counting {
        rts,
        b,
        target,
        counted,
        proxy,
        unit,
        redis_url,
        requests: if args.quick { 200 } else { 2000 },
    };
    let mut rows = Vec::new();
    for workload in Workload::ALL {
        let row = counting.pass(workload)?;
        print_row(&row, target.name());
        rows.push(row);
    }
    Ok(rows)
}

/// What one target's counting passes share.
struct Counting<'a> {
    rts: &'a Runtimes,
    b: &'a Backends,
    target: &'a Target,
    /// The store under count (connected through the proxy where there is one).
    counted: Target,
    proxy: Option<Proxy>,
    unit: &'static str,
    redis_url: String,
    requests: u64,
}

impl Counting<'_> {
    /// Round trips so far: the proxy's count, or the store's statements.
    fn counter(&self) -> u64 {
        match &self.proxy {
            Some(p) => p.counted(),
            None => self.counted.statements().unwrap_or(0),
        }
    }

    /// One workload's pass on a server of its own: warmed up, then counted.
    fn pass(&self, workload: Workload) -> Result<RoundTrips> {
        let server = launch(self.rts, self.b, &self.counted, &self.redis_url)?;
        let run = format!(
            "{}-rt-{}-{}",
            self.b.run,
            self.target.name(),
            workload.name()
        );
        let keys = match workload {
            Workload::New => Keys::Unique,
            Workload::Replay => Keys::Cycle(REPLAY_KEYS),
            Workload::Hot => Keys::Hot,
        };
        let plan = |run: String, stop| Plan {
            targets: vec![server.addr()],
            run,
            keys,
            body: body(1024),
            concurrency: 16,
            stop,
        };
        let warm = if workload == Workload::Replay {
            plan(run.clone(), Stop::Count(REPLAY_KEYS))
        } else {
            // Outside the count: the store's first statements on each connection (taking it
            // from the pool, preparing each statement once), on keys of their own.
            plan(format!("{run}-warm"), Stop::Count(64))
        };
        self.rts.client.block_on(drive(warm))?;
        self.counted_pass(workload, plan(run, Stop::Count(self.requests)))
    }

    /// Drives `plan` between two readings of the counter (and, on Redis, of the server's
    /// command statistics).
    fn counted_pass(&self, workload: Workload, plan: Plan) -> Result<RoundTrips> {
        let stats = |url: &str| self.rts.server.block_on(command_stats(url));
        let redis_before = match &self.proxy {
            Some(_) if self.unit == "commands" => Some(stats(&self.b.redis_url)?),
            _ => None,
        };
        let before = self.counter();
        let result = self.rts.client.block_on(drive(plan))?;
        let trips = self.counter() - before;
        let redis_server = match redis_before {
            Some(before) => Some(server_cost(
                &before,
                &stats(&self.b.redis_url)?,
                result.total_requests,
            )),
            None => None,
        };
        Ok(RoundTrips {
            store: self.target.name().into(),
            workload,
            concurrency: 16,
            requests: result.total_requests,
            unit: self.unit.into(),
            round_trips: trips,
            per_request: trips as f64 / result.total_requests.max(1) as f64,
            executed: result.executed,
            replayed: result.replayed,
            conflicts: result.conflicts,
            redis_server,
        })
    }
}

/// The pass's line on stderr.
fn print_row(row: &RoundTrips, target: &str) {
    eprintln!(
        "  {:>8} {:>6} {:.2} {}/request{}",
        target,
        row.workload.name(),
        row.per_request,
        row.unit,
        row.redis_server.as_ref().map_or(String::new(), |c| format!(
            "; server {:.1} us/request ({})",
            c.usec_per_request, c.calls
        ))
    );
}

/// The store to count, its counting proxy (none for SQLite) and the unit counted; `None` for a
/// target without a backend.
fn counted_target(
    rts: &Runtimes,
    b: &Backends,
    target: &Target,
) -> Result<Option<(Target, Option<Proxy>, &'static str)>> {
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
                .block_on(Proxy::counting(upstream.to_string(), Protocol::Resp))?;
            (target.clone(), Some(proxy), "commands")
        }
        Target::Sqlite(_) | Target::SqliteCached(_) => (target.clone(), None, "statements"),
        // Statements as the store counts them (the claim of a key with a row is one, over four
        // round trips: see docs/stores.md).
        Target::MySql(_) => (target.clone(), None, "statements"),
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
                .block_on(Proxy::counting(upstream.to_string(), Protocol::Resp))?;
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
fn postgres_through_proxy(rts: &Runtimes, b: &Backends) -> Result<(Arc<PostgresStore>, Proxy)> {
    let options = sqlx::postgres::PgConnectOptions::from_str(&b.pg_url)?;
    let upstream = (options.get_host(), options.get_port())
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| HarnessError::Usage("DATABASE_URL host does not resolve".into()))?;
    let proxy = rts
        .server
        .block_on(Proxy::counting(upstream.to_string(), Protocol::Postgres))?;
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

/// `INFO commandstats`: per command, (calls, usec).
type CommandStats = std::collections::BTreeMap<String, (u64, u64)>;

async fn command_stats(url: &str) -> Result<CommandStats> {
    let client = redis::Client::open(url)?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut connection)
        .await?;
    // Lines like `cmdstat_set:calls=3,usec=12,usec_per_call=4.00,...`.
    Ok(info
        .lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(key)?.parse::<u64>().ok())
            };
            Some((name.to_owned(), (field("calls=")?, field("usec=")?)))
        })
        .collect())
}

/// The difference of two snapshots, per request, less the `INFO` that took the first one (a
/// script's own `INFO` calls, as `idempotent`'s claim makes, stay in).
fn server_cost(before: &CommandStats, after: &CommandStats, requests: u64) -> RedisServerCost {
    let n = requests.max(1) as f64;
    let mut usec = 0;
    let mut calls = Vec::new();
    for (name, &(after_calls, after_usec)) in after {
        let (before_calls, before_usec) = before.get(name).copied().unwrap_or((0, 0));
        let ours = u64::from(name == "info");
        let delta = after_calls.saturating_sub(before_calls + ours);
        if delta > 0 {
            usec += after_usec.saturating_sub(before_usec);
            calls.push(format!("{name} {:.2}", delta as f64 / n));
        }
    }
    RedisServerCost {
        usec_per_request: usec as f64 / n,
        calls: calls.join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_cost_is_the_per_request_difference_without_the_snapshot_info() {
        let stats = |pairs: &[(&str, (u64, u64))]| -> CommandStats {
            pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
        };
        let before = stats(&[("set", (10, 100)), ("info", (1, 50))]);
        let after = stats(&[
            ("set", (30, 140)),
            ("info", (2, 60)),
            ("evalsha", (20, 200)),
        ]);
        let cost = server_cost(&before, &after, 20);
        assert_eq!(cost.calls, "evalsha 1.00, set 1.00");
        assert_eq!(cost.usec_per_request, 12.0);
        // A script's own INFO calls count.
        let after = stats(&[("set", (10, 100)), ("info", (22, 250))]);
        let cost = server_cost(&before, &after, 20);
        assert_eq!(cost.calls, "info 1.00");
        assert_eq!(cost.usec_per_request, 10.0);
    }
}
