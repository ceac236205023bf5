//! Test support: connecting to the shared Redis, and stores on it or on the throw-away cluster
//! of `tower_idempotency_testkit`, whose keys are deleted even when a test fails.
#![allow(dead_code)] // Each test binary uses a different subset.

use std::{sync::Arc, time::Duration};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tower_idempotency_redis::RedisStore;
use tower_idempotency_testkit::skip;
#[allow(unused_imports)] // Each test binary uses a different subset.
pub use tower_idempotency_testkit::{random_u64, redis_url, Cluster, Guarded, RedisServer};

pub fn random_prefix() -> String {
    format!("tidem-test:{:016x}", random_u64())
}

/// The connection and response timeouts of the tests that do not test them: generous, so that a
/// loaded 2-core machine never turns a slow answer into a failure.
const RELAXED_TIMEOUT: Duration = Duration::from_secs(10);
/// The response timeout of the tests that check a stopped or dead server fails calls quickly.
pub const QUICK_TIMEOUT: Duration = Duration::from_millis(500);

fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1)
}

/// A connection manager with [`RELAXED_TIMEOUT`]s.
pub async fn manager(url: &str) -> redis::RedisResult<ConnectionManager> {
    manager_timing_out(url, RELAXED_TIMEOUT).await
}

/// A connection manager whose connection and response timeouts are `timeout`.
pub async fn manager_timing_out(
    url: &str,
    timeout: Duration,
) -> redis::RedisResult<ConnectionManager> {
    ConnectionManager::new_with_config(redis::Client::open(url)?, manager_config(timeout)).await
}

/// Deletes every key under a prefix on the given nodes when dropped. For a cluster, each master
/// is scanned on its own connection: `SCAN` only sees the keys of the node it is sent to.
pub struct Cleanup {
    nodes: Vec<String>,
    prefix: String,
}

impl Cleanup {
    pub fn new(nodes: Vec<String>, prefix: &str) -> Arc<Self> {
        Arc::new(Self {
            nodes,
            prefix: prefix.to_owned(),
        })
    }

    pub fn count_keys(&self) -> usize {
        self.nodes
            .iter()
            .map(|url| scan(url, &self.prefix).map(|k| k.len()).unwrap_or(0))
            .sum()
    }
}

fn scan(url: &str, prefix: &str) -> redis::RedisResult<Vec<String>> {
    let mut con = redis::Client::open(url)?.get_connection()?;
    let keys: Vec<String> = redis::cmd("SCAN")
        .cursor_arg(0)
        .arg("MATCH")
        .arg(format!("{prefix}:*"))
        .arg("COUNT")
        .arg(1000)
        .clone()
        .iter(&mut con)?
        .collect::<Result<_, _>>()?;
    Ok(keys)
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for url in &self.nodes {
            let Ok(keys) = scan(url, &self.prefix) else {
                continue;
            };
            if let Ok(mut con) = redis::Client::open(url.as_str()).and_then(|c| c.get_connection())
            {
                for key in keys {
                    let _: redis::RedisResult<()> = redis::cmd("DEL").arg(key).query(&mut con);
                }
            }
        }
    }
}

/// A store that deletes its keys when the last clone is dropped.
pub type TestStore = Guarded<RedisStore, Arc<Cleanup>>;

/// A store on the shared standalone Redis with its own prefix, or `None` (after saying why) when
/// Redis is unreachable outside CI.
pub async fn standalone_store() -> Option<TestStore> {
    let prefix = random_prefix();
    standalone_store_with_prefix(&prefix).await
}

pub async fn standalone_store_with_prefix(prefix: &str) -> Option<TestStore> {
    let url = redis_url();
    let manager = match manager(&url).await {
        Ok(manager) => manager,
        Err(e) => {
            skip(
                "redis store tests",
                &format!("cannot connect to REDIS_URL ({e:?})"),
            );
            return None;
        }
    };
    let store = RedisStore::new(manager, prefix).expect("valid prefix");
    store.preload_scripts().await.expect("script load");
    Some(TestStore::new(store, Cleanup::new(vec![url], prefix)))
}

pub async fn cluster_connection(
    cluster: &Cluster,
) -> redis::RedisResult<redis::cluster_async::ClusterConnection> {
    redis::cluster::ClusterClientBuilder::new(cluster.urls())
        .connection_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_secs(2))
        .build()?
        .get_async_connection()
        .await
}

/// A store on the shared test cluster with its own prefix.
pub async fn cluster_store() -> Option<TestStore> {
    let cluster = Cluster::shared()?;
    let prefix = random_prefix();
    let connection = cluster_connection(cluster)
        .await
        .expect("cluster connection");
    let store = RedisStore::cluster(connection, &prefix).expect("valid prefix");
    store.preload_scripts().await.expect("script load");
    Some(TestStore::new(store, Cleanup::new(cluster.urls(), &prefix)))
}

/// One throw-away `redis-server` serving TLS per test binary, started on first use, or `None`
/// after [`skip`]ping (fails under CI). It is never dropped, so it dies with the test process.
pub fn tls_server() -> Option<&'static RedisServer> {
    static SERVER: std::sync::OnceLock<Option<RedisServer>> = std::sync::OnceLock::new();
    SERVER.get_or_init(RedisServer::start_tls).as_ref()
}

/// A store on [`tls_server`] with its own prefix, connected through `rediss://` and trusting
/// only the server's test CA; its keys are deleted over the plain port.
#[cfg(feature = "tls")]
pub async fn tls_store() -> Option<TestStore> {
    let server = tls_server()?;
    let prefix = random_prefix();
    let options = tower_idempotency_redis::ConnectOptions::new().root_certificates(server.ca_pem());
    let store = RedisStore::connect_with(&server.tls_url(), &prefix, options)
        .await
        .expect("a store over TLS");
    Some(TestStore::new(
        store,
        Cleanup::new(vec![server.url()], &prefix),
    ))
}
