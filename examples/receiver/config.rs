//! The receiver's configuration: environment variables only, and why it could not start.

use std::{net::SocketAddr, str::FromStr, time::Duration};

use tower_idempotency::{webhooks, ConnectStoreError, IdempotencyLayer};

use crate::BoxError;

const DEFAULT_ADDR: &str = "127.0.0.1:3000";
const DEFAULT_STORE: &str = "sqlite://receiver.db";

/// Why the receiver could not start. Messages name variables, never their values.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{name} is not valid: {expected}")]
    Invalid {
        name: &'static str,
        expected: &'static str,
    },
    #[error("{name} is set but {needs} is not")]
    Incomplete {
        name: &'static str,
        needs: &'static str,
    },
    #[error("{name} is not usable")]
    Provider {
        name: &'static str,
        #[source]
        source: webhooks::ConfigError,
    },
    #[error(transparent)]
    Store(#[from] ConnectStoreError),
    #[error("the payments table could not be prepared")]
    Payments(#[source] BoxError),
    #[error("the webhook inbox could not be started")]
    Inbox(#[source] BoxError),
    #[error("cannot listen: {0}")]
    Io(#[from] std::io::Error),
    #[cfg(feature = "metrics")]
    #[error("the metrics recorder could not be installed")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
}

/// The webhook inbox's settings (`POST /inbox/stripe`, feature `inbox`).
pub struct InboxSettings {
    pub handler_delay: Duration,
    pub max_attempts: u32,
    pub backoff: Duration,
    pub lease: Option<Duration>,
    pub attempt_timeout: Option<Duration>,
    pub sweep: Option<Duration>,
    /// `OUTBOX_TARGET_URL`: where `test.outbox` events send their outbox message.
    pub outbox_target: Option<String>,
    /// `INBOX_ORDERING`: Stripe events ordered by `data.object.id` and `created`.
    pub ordering: Option<InboxOrdering>,
    /// `INBOX_ADMIN=1`: the operator's page and JSON routes at `/admin/inbox`.
    pub admin: bool,
    /// `INBOX_HEAL_FILE`: while this file exists, `test.permanent` events succeed.
    pub heal_file: Option<std::path::PathBuf>,
    /// `INBOX_RETENTION_SECS`: how long processed events are kept.
    pub retention: Option<Duration>,
    /// `INBOX_CONCURRENCY`: handlers the worker runs at once (default the worker's for the
    /// database: 16 on Postgres, 4 on SQLite).
    pub concurrency: Option<usize>,
    /// `INBOX_POOL_SIZE`: connections the inbox's pool opens at most (default twice the
    /// concurrency: each running handler holds one, and acknowledgements, claims and lease
    /// renewals need theirs meanwhile).
    pub pool_size: Option<u32>,
}

/// `INBOX_ORDERING=sequential|skip-stale`.
#[derive(Clone, Copy, Debug)]
pub enum InboxOrdering {
    Sequential,
    SkipStale,
}

pub struct Config {
    pub addr: SocketAddr,
    pub store_url: String,
    pub handler_delay: Duration,
    pub lease: Option<Duration>,
    pub ttl: Option<Duration>,
    /// `POST /orders` only: how long a duplicate waits for an in-flight result.
    pub wait: Option<Duration>,
    pub inbox: InboxSettings,
}

/// A variable's trimmed value; `None` when it is unset or blank.
pub fn var(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|value| value.trim().to_owned())
        .filter(|value| !value.is_empty())
}

fn parsed<T: FromStr>(name: &'static str, expected: &'static str) -> Result<Option<T>, StartError> {
    var(name)
        .map(|value| {
            value
                .parse()
                .map_err(|_| StartError::Invalid { name, expected })
        })
        .transpose()
}

/// A comma-separated list of secrets, current first; `None` when the variable is unset.
pub fn secrets(name: &str) -> Option<Vec<String>> {
    let list: Vec<String> = var(name)?
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    (!list.is_empty()).then_some(list)
}

impl Config {
    pub fn from_env() -> Result<Self, StartError> {
        let millis = "a whole number of milliseconds";
        let at_least_one = "a whole number of at least 1";
        let concurrency =
            parsed::<std::num::NonZeroUsize>("INBOX_CONCURRENCY", at_least_one)?.map(usize::from);
        let pool_size =
            parsed::<std::num::NonZeroU32>("INBOX_POOL_SIZE", at_least_one)?.map(u32::from);
        Ok(Self {
            addr: parsed("RECEIVER_ADDR", "an address such as 127.0.0.1:3000")?
                .unwrap_or_else(|| DEFAULT_ADDR.parse().expect("valid default")),
            store_url: var("IDEMPOTENCY_STORE").unwrap_or_else(|| DEFAULT_STORE.to_owned()),
            handler_delay: Duration::from_millis(parsed("HANDLER_DELAY_MS", millis)?.unwrap_or(0)),
            lease: parsed("IDEMPOTENCY_LEASE_MS", millis)?.map(Duration::from_millis),
            wait: parsed("IDEMPOTENCY_WAIT_MS", millis)?.map(Duration::from_millis),
            ttl: parsed("IDEMPOTENCY_TTL_SECS", "a whole number of seconds")?
                .map(Duration::from_secs),
            inbox: InboxSettings {
                handler_delay: Duration::from_millis(
                    parsed("HANDLER_DELAY_MS", millis)?.unwrap_or(0),
                ),
                max_attempts: parsed("INBOX_MAX_ATTEMPTS", "a whole number")?.unwrap_or(10),
                backoff: Duration::from_millis(parsed("INBOX_BACKOFF_MS", millis)?.unwrap_or(1000)),
                lease: parsed("INBOX_LEASE_MS", millis)?.map(Duration::from_millis),
                attempt_timeout: parsed("INBOX_ATTEMPT_TIMEOUT_MS", millis)?
                    .map(Duration::from_millis),
                sweep: parsed("INBOX_SWEEP_MS", millis)?.map(Duration::from_millis),
                ordering: match var("INBOX_ORDERING").as_deref() {
                    None => None,
                    Some("sequential") => Some(InboxOrdering::Sequential),
                    Some("skip-stale") => Some(InboxOrdering::SkipStale),
                    Some(_) => {
                        return Err(StartError::Invalid {
                            name: "INBOX_ORDERING",
                            expected: "sequential or skip-stale",
                        })
                    }
                },
                outbox_target: var("OUTBOX_TARGET_URL"),
                admin: parsed::<u8>("INBOX_ADMIN", "0 or 1")?.is_some_and(|admin| admin == 1),
                heal_file: var("INBOX_HEAL_FILE").map(Into::into),
                retention: parsed("INBOX_RETENTION_SECS", "a whole number of seconds")?
                    .map(Duration::from_secs),
                concurrency,
                pool_size,
            },
        })
    }

    /// Applies the lease and TTL overrides; unset ones keep the layer's (provider's) default.
    pub fn tune(&self, mut layer: IdempotencyLayer) -> IdempotencyLayer {
        if let Some(lease) = self.lease {
            layer = layer.lease(lease);
        }
        if let Some(ttl) = self.ttl {
            layer = layer.ttl(ttl);
        }
        layer
    }

    /// The store's kind, for logs: the URL itself may carry a password.
    pub fn store_kind(&self) -> &str {
        self.store_url.split(':').next().unwrap_or_default()
    }
}
