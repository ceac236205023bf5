//! What every measurement shares: the runtimes, the targets under test and the backends they
//! connect to (opened at the start, cleaned up at the end).

use std::{path::PathBuf, sync::Arc};

use tokio::runtime::{Handle, Runtime};
use tower_idempotency_core::{
    Fingerprint, FingerprintMode, IdempotencyLayer, LocalReplayCache, MemoryStore,
};
use tower_idempotency_redis::RedisStore;
use tower_idempotency_sqlx::{sqlx, MySqlStore, PostgresStore, SqliteStore};
/// A JSON order of `size` bytes: every measurement's request body.
pub(crate) use tower_idempotency_testkit::order_body as body;

use crate::{
    alloc,
    peer::PeerStore,
    sql_floors::{FloorKind, SqlFloor},
    Result,
};

/// The two runtimes: the servers (and stores) on one, the load generator on the other.
pub(crate) struct Runtimes {
    _owned: Vec<Runtime>,
    /// The servers' runtime (and the stores').
    pub(crate) server: Handle,
    /// The load generator's runtime.
    pub(crate) client: Handle,
}

/// One 2-worker runtime for both (`shared`), or one 1-worker runtime each.
pub(crate) fn runtimes(shared: bool) -> Result<Runtimes> {
    let build = |name: &str, workers: usize, server: bool| {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder
            .worker_threads(workers)
            .thread_name(name)
            .enable_all();
        if server {
            builder.on_thread_start(|| {
                alloc::mark_server_thread();
                crate::cpu::register_server_thread();
            });
        }
        builder.build()
    };
    if shared {
        let rt = build("loadtest", 2, false)?;
        let handle = rt.handle().clone();
        Ok(Runtimes {
            server: handle.clone(),
            client: handle,
            _owned: vec![rt],
        })
    } else {
        let server = build("lt-server", 1, true)?;
        let client = build("lt-client", 1, false)?;
        Ok(Runtimes {
            server: server.handle().clone(),
            client: client.handle().clone(),
            _owned: vec![server, client],
        })
    }
}

/// A store under test.
#[derive(Clone)]
pub(crate) enum Target {
    Bare,
    Memory,
    /// An experiment, not a configuration to ship: the memory store with the request fingerprint
    /// replaced by a constant, to show how much of the layer's cost is the SHA-256 of the body.
    MemoryConstantFingerprint,
    Sqlite(Arc<SqliteStore>),
    Postgres(Arc<PostgresStore>),
    MySql(Arc<MySqlStore>),
    Redis(RedisStore),
    /// The SQLite store behind a `LocalReplayCache`.
    SqliteCached(Arc<SqliteStore>),
    /// The Postgres store behind a `LocalReplayCache`.
    PostgresCached(Arc<PostgresStore>),
    /// The Redis store behind a `LocalReplayCache`.
    RedisCached(RedisStore),
    /// `idempotent` 2.0 (or its bare control) in a `loadtest-peer` child process.
    Peer(PeerStore),
    /// A SQL floor: raw statements in the handler, no layer.
    SqlFloor(Arc<SqlFloor>),
}

impl Target {
    /// The name the flags and tables use.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Target::Bare => "bare",
            Target::Memory => "memory",
            Target::MemoryConstantFingerprint => "memory-constfp",
            Target::Sqlite(_) => "sqlite",
            Target::Postgres(_) => "postgres",
            Target::MySql(_) => "mysql",
            Target::Redis(_) => "redis",
            Target::SqliteCached(_) => "sqlite+cache",
            Target::PostgresCached(_) => "postgres+cache",
            Target::RedisCached(_) => "redis+cache",
            Target::Peer(peer) => peer.name(),
            Target::SqlFloor(floor) => floor.kind().name(),
        }
    }

    /// A fresh layer (none for the targets without one, or served out of process); the memory
    /// store (and a local cache) is new each time so a cell's records are freed after it. The
    /// memory store has its default capacity, as a user gets it.
    pub(crate) fn layer(&self) -> Option<IdempotencyLayer> {
        Some(match self {
            Target::Bare | Target::Peer(_) | Target::SqlFloor(_) => return None,
            Target::Memory => IdempotencyLayer::client_keys(MemoryStore::new()),
            Target::MemoryConstantFingerprint => IdempotencyLayer::client_keys(MemoryStore::new())
                .fingerprint(FingerprintMode::Custom(Arc::new(|_, _| {
                    Fingerprint([0; 32])
                }))),
            Target::Sqlite(s) => IdempotencyLayer::client_keys(s.clone()),
            Target::Postgres(s) => IdempotencyLayer::client_keys(s.clone()),
            Target::MySql(s) => IdempotencyLayer::client_keys(s.clone()),
            Target::Redis(s) => IdempotencyLayer::client_keys(s.clone()),
            Target::SqliteCached(s) => {
                IdempotencyLayer::client_keys(LocalReplayCache::new(s.clone()))
            }
            Target::PostgresCached(s) => {
                IdempotencyLayer::client_keys(LocalReplayCache::new(s.clone()))
            }
            Target::RedisCached(s) => {
                IdempotencyLayer::client_keys(LocalReplayCache::new(s.clone()))
            }
        })
    }

    /// Like [`Target::layer`], plus a handle on the memory stores' allocation: once it is the
    /// last reference, the cell's records are gone and their memory can be handed back.
    pub(crate) fn layer_with_handle(
        &self,
    ) -> (
        Option<IdempotencyLayer>,
        Option<Arc<dyn std::any::Any + Send + Sync>>,
    ) {
        match self {
            Target::Memory => {
                let store = Arc::new(MemoryStore::new());
                (
                    Some(IdempotencyLayer::client_keys(store.clone())),
                    Some(store),
                )
            }
            _ => (self.layer(), None),
        }
    }

    /// SQL statements executed so far, for the stores that count them.
    pub(crate) fn statements(&self) -> Option<u64> {
        match self {
            Target::Sqlite(s) | Target::SqliteCached(s) => Some(s.statements_executed()),
            Target::Postgres(s) | Target::PostgresCached(s) => Some(s.statements_executed()),
            Target::MySql(s) => Some(s.statements_executed()),
            _ => None,
        }
    }
}

/// Every target, in table order (each store beside its peer and its floors); all but `bare`
/// are what `--stores` runs by default.
pub(crate) const TARGETS: [&str; 18] = [
    "bare",
    "peer-bare",
    "memory",
    "memory-constfp",
    "idempotent-memory",
    "sqlite",
    "sqlite+cache",
    "sqlite-floor-write",
    "postgres",
    "postgres+cache",
    "postgres-floor-write",
    "postgres-floor-read",
    "mysql",
    "mysql-floor-write",
    "mysql-floor-read",
    "redis",
    "redis+cache",
    "idempotent-valkey",
];

/// `/proc/loadavg`'s three averages.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A name for this run's keys, table and prefix.
pub(crate) fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}{:x}", std::process::id(), nanos & 0xffff_ffff)
}

/// Where the stores live, and the names this run uses there.
pub(crate) struct Backends {
    pub(crate) run: String,
    pub(crate) sqlite_path: PathBuf,
    pub(crate) pg_url: String,
    pub(crate) pg_table: String,
    /// `MYSQL_URL`'s database; its tables have the Postgres tables' names.
    pub(crate) mysql_url: String,
    pub(crate) redis_url: String,
    pub(crate) redis_prefix: String,
    /// `--store-lanes`, applied to every sqlx store the harness opens.
    pub(crate) store_lanes: Option<usize>,
    /// Whether the Postgres stores coalesce claims and completions (`--coalescing`).
    pub(crate) coalescing: bool,
    /// The `loadtest-peer` binary (`--peer-bin`).
    pub(crate) peer_binary: PathBuf,
    /// The peer's Valkey prefix (`idempotent` refuses `:` in one).
    pub(crate) peer_prefix: String,
}

impl Backends {
    /// The backends of `DATABASE_URL` and `REDIS_URL` (loopback defaults) and a temporary SQLite
    /// file, with names of the run `run`.
    pub(crate) fn from_env(run: String, store_lanes: Option<usize>, peer_binary: PathBuf) -> Self {
        Self {
            peer_prefix: crate::peer::valkey_prefix(&run),
            peer_binary,
            sqlite_path: std::env::temp_dir().join(format!("tower-idempotency-loadtest-{run}.db")),
            pg_url: std::env::var("DATABASE_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
            pg_table: format!("loadtest_{run}"),
            mysql_url: std::env::var("MYSQL_URL")
                .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into()),
            redis_url: std::env::var("REDIS_URL")
                .unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
            redis_prefix: format!("loadtest:{run}"),
            store_lanes,
            coalescing: false,
            run,
        }
    }

    /// These backends with the Postgres stores' coalescing on or off.
    pub(crate) fn with_coalescing(mut self, on: bool) -> Self {
        self.coalescing = on;
        self
    }

    /// `store` with the run's `--store-lanes` and `--coalescing`.
    pub(crate) fn postgres(&self, store: PostgresStore) -> PostgresStore {
        let store = store.with_coalescing(self.coalescing);
        match self.store_lanes {
            Some(lanes) => store.with_connection_lanes(lanes),
            None => store,
        }
    }
}

/// Connects and migrates the store `name`; `Err` says why it is skipped.
pub(crate) async fn open_store(name: &str, b: &Backends) -> Result<Target, String> {
    let describe = |e: &dyn std::error::Error| {
        let mut text = e.to_string();
        if let Some(source) = e.source() {
            text.push_str(&format!(": {source}"));
        }
        text
    };
    match name {
        "memory" => Ok(Target::Memory),
        "memory-constfp" => Ok(Target::MemoryConstantFingerprint),
        "sqlite" | "sqlite+cache" => {
            let url = format!("sqlite://{}", b.sqlite_path.display());
            let store = SqliteStore::connect(&url).await.map_err(|e| describe(&e))?;
            let store = match b.store_lanes {
                Some(lanes) => store.with_connection_lanes(lanes),
                None => store,
            };
            store.migrate().await.map_err(|e| describe(&e))?;
            let store = Arc::new(store);
            Ok(if name == "sqlite" {
                Target::Sqlite(store)
            } else {
                Target::SqliteCached(store)
            })
        }
        // Both Postgres targets share the table (each cell uses keys of its own run); the
        // migration is idempotent, and needed by whichever of them runs first.
        "postgres" | "postgres+cache" => {
            let store = PostgresStore::connect_with_table(&b.pg_url, &b.pg_table)
                .await
                .map_err(|e| describe(&e))?;
            let store = b.postgres(store);
            store.migrate().await.map_err(|e| describe(&e))?;
            let store = Arc::new(store);
            Ok(if name == "postgres" {
                Target::Postgres(store)
            } else {
                Target::PostgresCached(store)
            })
        }
        "mysql" => {
            let store = MySqlStore::connect_with_table(&b.mysql_url, &b.pg_table)
                .await
                .map_err(|e| describe(&e))?;
            let store = match b.store_lanes {
                Some(lanes) => store.with_connection_lanes(lanes),
                None => store,
            };
            store.migrate().await.map_err(|e| describe(&e))?;
            Ok(Target::MySql(Arc::new(store)))
        }
        // Both Redis targets share the prefix too.
        "redis" | "redis+cache" => {
            let store = RedisStore::connect(&b.redis_url, &b.redis_prefix)
                .await
                .map_err(|e| describe(&e))?;
            Ok(if name == "redis" {
                Target::Redis(store)
            } else {
                Target::RedisCached(store)
            })
        }
        "idempotent-memory" | "idempotent-valkey" | "peer-bare" => {
            crate::peer::check_binary(&b.peer_binary)?;
            Ok(Target::Peer(match name {
                "idempotent-memory" => PeerStore::Memory,
                "idempotent-valkey" => PeerStore::Valkey,
                _ => PeerStore::Bare,
            }))
        }
        "sqlite-floor-write"
        | "postgres-floor-write"
        | "postgres-floor-read"
        | "mysql-floor-write"
        | "mysql-floor-read" => {
            let kind = match name {
                "sqlite-floor-write" => FloorKind::SqliteWrite,
                "postgres-floor-write" => FloorKind::PostgresWrite,
                "mysql-floor-write" => FloorKind::MySqlWrite,
                "mysql-floor-read" => FloorKind::MySqlRead,
                _ => FloorKind::PostgresRead,
            };
            let floor = SqlFloor::open(kind, b).await.map_err(|e| describe(&e))?;
            Ok(Target::SqlFloor(Arc::new(floor)))
        }
        other => Err(format!("unknown store {other:?}")),
    }
}

/// Drops the run's Postgres and MySQL tables, deletes its Redis keys and its SQLite files.
pub(crate) fn cleanup(rts: &Runtimes, b: &Backends) {
    let pg = async {
        let pool = sqlx::PgPool::connect(&b.pg_url).await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
            "DROP TABLE IF EXISTS \"{0}\"; DROP SEQUENCE IF EXISTS \"{0}_token_seq\"; DROP TABLE IF EXISTS \"{0}_floor\";",
            b.pg_table
        )))
        .execute(&pool)
        .await?;
        pool.close().await;
        Ok::<_, sqlx::Error>(())
    };
    if let Err(e) = rts.server.block_on(pg) {
        eprintln!("loadtest: could not drop table {}: {e}", b.pg_table);
    }
    let mysql = async {
        let pool = sqlx::MySqlPool::connect(&b.mysql_url).await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
            "DROP TABLE IF EXISTS `{0}`, `{0}_floor`",
            b.pg_table
        )))
        .execute(&pool)
        .await?;
        pool.close().await;
        Ok::<_, sqlx::Error>(())
    };
    if let Err(e) = rts.server.block_on(mysql) {
        eprintln!(
            "loadtest: could not drop the MySQL tables {}: {e}",
            b.pg_table
        );
    }
    for prefix in [&b.redis_prefix, &b.peer_prefix] {
        match rts
            .server
            .block_on(delete_redis_prefix(&b.redis_url, prefix))
        {
            Ok(n) => eprintln!("loadtest: deleted {n} redis keys under {prefix}"),
            Err(e) => eprintln!("loadtest: could not clean redis prefix {prefix}: {e}"),
        }
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut path = b.sqlite_path.clone().into_os_string();
        path.push(suffix);
        let _ = std::fs::remove_file(path);
    }
}

/// Deletes every key under `prefix:`; returns how many.
async fn delete_redis_prefix(url: &str, prefix: &str) -> Result<usize, redis::RedisError> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let pattern = format!("{prefix}:*");
    let mut cursor: u64 = 0;
    let mut deleted = 0usize;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(5000)
            .query_async(&mut conn)
            .await?;
        if !keys.is_empty() {
            deleted += keys.len();
            let () = redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(&mut conn)
                .await?;
        }
        if next == 0 {
            return Ok(deleted);
        }
        cursor = next;
    }
}

#[cfg(test)]
mod tests {
    use super::body;

    #[test]
    fn bodies_are_json_orders_of_the_requested_size() {
        for size in [1024, 64 * 1024] {
            let bytes = body(size);
            assert_eq!(bytes.len(), size);
            let order: serde_json::Value = serde_json::from_slice(&bytes).expect("valid JSON");
            assert_eq!(order["items"].as_array().map(Vec::len), Some(2));
        }
        // Smaller than the order itself: the whole order, unpadded.
        let small = body(10);
        assert!(small.len() > 10);
        assert!(serde_json::from_slice::<serde_json::Value>(&small).is_ok());
    }
}
