//! Connecting a store: the key prefix check, the constructors from URLs, the eviction policy
//! check and the script preload they run.

use std::time::Duration;

use redis::{aio::ConnectionManager, aio::ConnectionManagerConfig, ErrorKind, RedisError, Value};

use crate::{connection::Connection, scripts, RedisStore};

/// A prefix that cannot be used for keys.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The prefix is empty or longer than 64 bytes.
    #[error("key prefix must be 1 to 64 bytes long, got {len}")]
    PrefixLength {
        /// The prefix's length in bytes.
        len: usize,
    },
    /// The prefix holds a byte outside `A-Z a-z 0-9 : _ . -`.
    #[error("key prefix may only contain A-Z a-z 0-9 : _ . - (invalid byte at {position})")]
    PrefixCharacter {
        /// Byte offset of the first invalid character.
        position: usize,
    },
}

/// Why [`RedisStore::connect`] or [`RedisStore::connect_cluster`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The prefix was rejected.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The URL was invalid or the server could not be reached.
    #[error("cannot connect to redis")]
    Redis(#[source] RedisError),
    /// A server may evict keys under memory pressure (`maxmemory-policy` is not `noeviction`):
    /// an evicted in-flight or completed record lets a duplicate run the handler again. Set the
    /// policy to `noeviction`, or accept the risk with [`ConnectOptions::allow_eviction`].
    #[error("redis maxmemory-policy is {policy}; records could be evicted (use noeviction)")]
    EvictingPolicy {
        /// The policy a server reported.
        policy: String,
    },
}

/// Options for [`RedisStore::connect_with`] and [`RedisStore::connect_cluster_with`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ConnectOptions {
    allow_eviction: bool,
    #[cfg(feature = "tls")]
    root_certificates: Option<Pem>,
}

/// PEM bytes, which `Debug` counts rather than prints.
#[cfg(feature = "tls")]
#[derive(Clone)]
struct Pem(Vec<u8>);

#[cfg(feature = "tls")]
impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes of PEM>", self.0.len())
    }
}

impl ConnectOptions {
    /// The defaults: refuse a server whose `maxmemory-policy` may evict keys.
    pub fn new() -> Self {
        Self::default()
    }

    /// Connects even when a server's `maxmemory-policy` may evict keys (anything but
    /// `noeviction`). Under memory pressure Redis may then delete an in-flight record (a
    /// duplicate runs the handler while the first still runs) or a completed one (a retry runs
    /// it again): only for deployments that accept that.
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
    }

    /// Trusts only the certificates in `pem` (one or more PEM `CERTIFICATE` blocks: a private
    /// CA, or a managed service's own) for the servers of `rediss://` URLs, instead of the
    /// system's root certificates; `redis://` URLs stay plain. The server's name must still
    /// match its certificate.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificates = Some(Pem(pem.into()));
        self
    }

    /// A client for `url`: over TLS for a `rediss://` URL, trusting
    /// [`root_certificates`](Self::root_certificates) when they are set.
    fn client(&self, url: &str) -> Result<redis::Client, RedisError> {
        #[cfg(feature = "tls")]
        if url.starts_with("rediss:") {
            ensure_crypto_provider();
            if let Some(certificates) = self.certificates() {
                return redis::Client::build_with_tls(url, certificates);
            }
        }
        redis::Client::open(url)
    }

    /// The root certificates for redis's TLS connections, when they are set.
    #[cfg(feature = "tls")]
    fn certificates(&self) -> Option<redis::TlsCertificates> {
        self.root_certificates
            .as_ref()
            .map(|Pem(pem)| redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            })
    }
}

/// Installs ring as the process's rustls crypto provider when none is installed yet (before
/// the first `rediss://` connection). rustls picks a provider by itself only when exactly one
/// provider feature is enabled in the build; an application whose other dependencies enable
/// aws-lc-rs too (reqwest's default TLS does) would otherwise have no provider for the store's
/// connections. An application that installs
/// its own provider before connecting keeps it (aws-lc-rs's, for post-quantum key exchange,
/// which rustls deprecates ring's provider for lacking).
#[cfg(feature = "tls")]
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one between the check and here: theirs stays.
        #[allow(deprecated)] // ring: no C toolchain beyond cc, and a light build.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Checks a key prefix: 1 to 64 bytes of `A-Z a-z 0-9 : _ . -`.
pub fn validate_prefix(prefix: &str) -> Result<(), ConfigError> {
    if prefix.is_empty() || prefix.len() > 64 {
        return Err(ConfigError::PrefixLength { len: prefix.len() });
    }
    match prefix
        .bytes()
        .position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'.' | b'-')))
    {
        Some(position) => Err(ConfigError::PrefixCharacter { position }),
        None => Ok(()),
    }
}

impl RedisStore {
    /// Connects to one Redis server (`redis://host:port/db`, or `rediss://host:port/db` over
    /// TLS with the `tls` feature) with a 2 s connection and response timeout and 3 reconnection
    /// attempts, checks that the server does not evict keys (see
    /// [`ConnectError::EvictingPolicy`]), and preloads the scripts.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, ConnectError> {
        Self::connect_with(url, prefix, ConnectOptions::new()).await
    }

    /// [`connect`](Self::connect) with options.
    pub async fn connect_with(
        url: &str,
        prefix: &str,
        options: ConnectOptions,
    ) -> Result<Self, ConnectError> {
        validate_prefix(prefix)?;
        let client = options.client(url).map_err(ConnectError::Redis)?;
        let notices = client.clone();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(3);
        let manager = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(ConnectError::Redis)?;
        Self::new(manager, prefix)?
            .with_notices([notices])
            .checked(&options)
            .await
    }

    /// Connects to a Redis Cluster through any of its nodes (`redis://host:port`, or
    /// `rediss://host:port` over TLS with the `tls` feature) with a 2 s
    /// connection and response timeout, checks that no master evicts keys (see
    /// [`ConnectError::EvictingPolicy`]), and preloads the scripts on every master.
    pub async fn connect_cluster<'a>(
        nodes: impl IntoIterator<Item = &'a str>,
        prefix: &str,
    ) -> Result<Self, ConnectError> {
        Self::connect_cluster_with(nodes, prefix, ConnectOptions::new()).await
    }

    /// [`connect_cluster`](Self::connect_cluster) with options.
    pub async fn connect_cluster_with<'a>(
        nodes: impl IntoIterator<Item = &'a str>,
        prefix: &str,
        options: ConnectOptions,
    ) -> Result<Self, ConnectError> {
        validate_prefix(prefix)?;
        let nodes: Vec<&str> = nodes.into_iter().collect();
        let notices = nodes
            .iter()
            .map(|node| options.client(node))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ConnectError::Redis)?;
        #[cfg(feature = "tls")]
        let tls = nodes.iter().any(|node| node.starts_with("rediss:"));
        let builder = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2));
        // The certificates turn TLS on for every node: only for `rediss://` nodes.
        #[cfg(feature = "tls")]
        let builder = match options.certificates() {
            Some(certificates) if tls => builder.certs(certificates),
            _ => builder,
        };
        let client = builder.build().map_err(ConnectError::Redis)?;
        let connection = client
            .get_async_connection()
            .await
            .map_err(ConnectError::Redis)?;
        Self::cluster(connection, prefix)?
            .with_notices(notices)
            .checked(&options)
            .await
    }

    /// The last steps of connecting: the eviction check, then the script preload.
    async fn checked(self, options: &ConnectOptions) -> Result<Self, ConnectError> {
        self.check_eviction(options).await?;
        self.preload_scripts().await.map_err(ConnectError::Redis)?;
        Ok(self)
    }

    async fn check_eviction(&self, options: &ConnectOptions) -> Result<(), ConnectError> {
        let policies = self
            .eviction_policies()
            .await
            .map_err(ConnectError::Redis)?;
        match policies.into_iter().find(|p| p != "noeviction") {
            Some(policy) if options.allow_eviction => {
                tracing::warn!(%policy, "redis may evict idempotency records under memory pressure (eviction allowed by ConnectOptions)");
                Ok(())
            }
            Some(policy) => Err(ConnectError::EvictingPolicy { policy }),
            None => Ok(()),
        }
    }

    /// The `maxmemory-policy` of the server, or of every master of a cluster, read from
    /// `INFO memory` (which managed services that disable `CONFIG` still answer). Anything but
    /// `noeviction` lets Redis delete records under memory pressure; [`connect`](Self::connect)
    /// and [`connect_cluster`](Self::connect_cluster) check it, a store built with
    /// [`new`](Self::new) or [`cluster`](Self::cluster) can call this itself.
    pub async fn eviction_policies(&self) -> Result<Vec<String>, RedisError> {
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        let reply = match self.connection.clone() {
            Connection::Single(mut c) => info.query_async::<Value>(&mut c).await?,
            Connection::Cluster(mut c) => {
                use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                c.route_command(info, all).await?
            }
        };
        let mut policies = Vec::new();
        collect_policies(&reply, &mut policies);
        if policies.is_empty() {
            return Err(RedisError::from((
                ErrorKind::Parse,
                "INFO memory has no maxmemory_policy",
            )));
        }
        Ok(policies)
    }

    /// Loads the scripts (`SCRIPT LOAD`; on every master of a cluster) so the first calls need
    /// no `NOSCRIPT` detour. Optional: calls load a missing script by themselves.
    pub async fn preload_scripts(&self) -> Result<(), RedisError> {
        let mut connection = self.connection.clone();
        for script in scripts::all() {
            script.prepare_invoke().load_async(&mut connection).await?;
        }
        Ok(())
    }
}

/// Every `maxmemory_policy:` line in an `INFO` reply (one text per node in a cluster's reply).
fn collect_policies(reply: &Value, policies: &mut Vec<String>) {
    let text = match reply {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::VerbatimString { text, .. } | Value::SimpleString(text) => text.clone(),
        Value::Array(items) | Value::Set(items) => {
            return items.iter().for_each(|v| collect_policies(v, policies))
        }
        Value::Map(pairs) => {
            return pairs
                .iter()
                .for_each(|(_, v)| collect_policies(v, policies))
        }
        _ => return,
    };
    policies.extend(
        text.lines()
            .filter_map(|line| line.trim().strip_prefix("maxmemory_policy:"))
            .map(str::to_owned),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_validated() {
        assert_eq!(validate_prefix("app:idem_1.v-2"), Ok(()));
        assert_eq!(
            validate_prefix(""),
            Err(ConfigError::PrefixLength { len: 0 })
        );
        assert_eq!(validate_prefix(&"a".repeat(64)), Ok(()));
        assert_eq!(
            validate_prefix(&"a".repeat(65)),
            Err(ConfigError::PrefixLength { len: 65 })
        );
        assert_eq!(
            validate_prefix("ab{c}"),
            Err(ConfigError::PrefixCharacter { position: 2 })
        );
        assert_eq!(
            validate_prefix("a b"),
            Err(ConfigError::PrefixCharacter { position: 1 })
        );
        assert_eq!(
            validate_prefix("é"),
            Err(ConfigError::PrefixCharacter { position: 0 })
        );
    }
}
