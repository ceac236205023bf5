//! Opening a store from a URL, for applications configured by environment variables.

use std::sync::Arc;

use tower_idempotency_core::{BoxError, MemoryStore, Store};

/// Why [`connect_store`] could not open a store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectStoreError {
    /// The URL's scheme names no store.
    #[error(
        "unsupported store URL scheme (expected memory, sqlite://, postgres://, mysql:// or redis://)"
    )]
    UnsupportedScheme,
    /// The store exists but this build lacks its cargo feature.
    #[error("the {0} store needs the `{0}` cargo feature of tower-idempotency")]
    FeatureDisabled(&'static str),
    /// Connecting or migrating failed.
    #[error("could not open the {store} store")]
    Connect {
        /// Which store.
        store: &'static str,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
}

/// Opens the store a URL names, creating its schema where it has one:
///
/// | URL | store |
/// |---|---|
/// | `memory` | [`MemoryStore`] |
/// | `sqlite://PATH` | `SqliteStore` (file created if missing; feature `sqlite`) |
/// | `postgres://...`, `postgresql://...` | `PostgresStore` (feature `postgres`) |
/// | `mysql://...`, `mariadb://...` | `MySqlStore` (feature `mysql`; MySQL 8.0+, MariaDB 10.6+) |
/// | `redis://...` | `RedisStore`, key prefix `idempotency` (feature `redis`) |
///
/// ```no_run
/// # async fn run() -> Result<(), tower_idempotency::ConnectStoreError> {
/// let url = std::env::var("IDEMPOTENCY_STORE").unwrap_or_else(|_| "sqlite://app.db".into());
/// let store = tower_idempotency::connect_store(&url).await?;
/// let layer = tower_idempotency::IdempotencyLayer::client_keys(store);
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
pub async fn connect_store(url: &str) -> Result<Arc<dyn Store>, ConnectStoreError> {
    let scheme = url.split_once(':').map_or(url, |(scheme, _)| scheme);
    match scheme {
        "memory" => Ok(Arc::new(MemoryStore::new())),
        #[cfg(feature = "sqlite")]
        "sqlite" => sql::<tower_idempotency_sqlx::sqlx::Sqlite>("sqlite", url).await,
        #[cfg(not(feature = "sqlite"))]
        "sqlite" => Err(ConnectStoreError::FeatureDisabled("sqlite")),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            sql::<tower_idempotency_sqlx::sqlx::Postgres>("postgres", url).await
        }
        #[cfg(not(feature = "postgres"))]
        "postgres" | "postgresql" => Err(ConnectStoreError::FeatureDisabled("postgres")),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => sql::<tower_idempotency_sqlx::sqlx::MySql>("mysql", url).await,
        #[cfg(not(feature = "mysql"))]
        "mysql" | "mariadb" => Err(ConnectStoreError::FeatureDisabled("mysql")),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => redis(url).await,
        #[cfg(not(feature = "redis"))]
        "redis" | "rediss" => Err(ConnectStoreError::FeatureDisabled("redis")),
        _ => Err(ConnectStoreError::UnsupportedScheme),
    }
}

/// Maps a failure to connect or migrate `store` to [`ConnectStoreError::Connect`].
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis"
))]
fn connect_error<E: Into<BoxError>>(store: &'static str) -> impl FnOnce(E) -> ConnectStoreError {
    move |source| ConnectStoreError::Connect {
        store,
        source: source.into(),
    }
}

/// The SQL store (`store` names its backend `DB`) at `url`, its table created.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
async fn sql<DB: tower_idempotency_sqlx::Backend>(
    store: &'static str,
    url: &str,
) -> Result<Arc<dyn Store>, ConnectStoreError> {
    let sql = tower_idempotency_sqlx::SqlStore::<DB>::connect(url)
        .await
        .map_err(connect_error(store))?;
    sql.migrate().await.map_err(connect_error(store))?;
    Ok(Arc::new(sql))
}

#[cfg(feature = "redis")]
async fn redis(url: &str) -> Result<Arc<dyn Store>, ConnectStoreError> {
    let store = crate::RedisStore::connect(url, "idempotency")
        .await
        .map_err(connect_error("redis"))?;
    Ok(Arc::new(store))
}
