//! Redis pub/sub notices of settled keys, for requests waiting on a key another instance holds
//! ([`Store::settlements`](tower_idempotency_core::store::Store::settlements)).
//!
//! The scripts that complete, release and forget a record `PUBLISH` the store key on
//! `<prefix>:settled` when they changed it (see `scripts.rs`). A store given clients
//! ([`RedisStore::with_notices`](crate::RedisStore::with_notices)) keeps one `SUBSCRIBE`
//! connection, opened on the first wait and shared by its clones, and fans notices out to its
//! waiters in this process. When that connection fails, the next client is tried after 100 ms,
//! doubling up to 5 s; meanwhile waiters re-claim on their timer. A `PING` every 15 s (answered
//! within 5 s) finds a connection that died silently. Dropping the last clone closes it.

use std::{sync::OnceLock, time::Duration};

use futures_util::StreamExt;
use redis::{Client, RedisError};
use tokio::sync::oneshot;
use tower_idempotency_core::store::Settlements;

/// The channel of the notices of the store with key prefix `prefix`.
pub(crate) fn channel(prefix: &str) -> String {
    format!("{prefix}:settled")
}

/// The first wait before subscribing again; it doubles up to [`LONGEST_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(100);
const LONGEST_RETRY: Duration = Duration::from_secs(5);
/// How often an idle subscription is checked with a `PING`, and how long the answer may take.
const PING_EVERY: Duration = Duration::from_secs(15);
const PING_WITHIN: Duration = Duration::from_secs(5);

/// A store's notices and the task holding its subscription, started on first use.
pub(crate) struct RedisNotices {
    settlements: Settlements,
    /// Tried in turn, one at a time: a cluster delivers a notice on every node.
    clients: Vec<Client>,
    /// The channel the scripts publish on.
    pub(crate) channel: String,
    /// Dropped with the last clone of the store, which ends the subscribing task.
    stop: OnceLock<oneshot::Sender<()>>,
}

impl RedisNotices {
    pub(crate) fn new(prefix: &str, clients: Vec<Client>) -> Self {
        Self {
            settlements: Settlements::new(),
            clients,
            channel: channel(prefix),
            stop: OnceLock::new(),
        }
    }

    /// Whether the store was given clients to subscribe with.
    pub(crate) fn subscribes(&self) -> bool {
        !self.clients.is_empty()
    }

    /// The notices, starting the subscribing task if it is not running yet and a Tokio runtime
    /// is at hand (without one the waiters poll, and a later call starts it).
    pub(crate) fn settlements(&self) -> Settlements {
        if self.stop.get().is_none() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                self.stop.get_or_init(|| {
                    let (stop, stopped) = oneshot::channel();
                    let subscribing = Subscribing {
                        settlements: self.settlements.clone(),
                        clients: self.clients.clone(),
                        channel: self.channel.clone(),
                    };
                    runtime.spawn(subscribing.run(stopped));
                    stop
                });
            }
        }
        self.settlements.clone()
    }
}

struct Subscribing {
    settlements: Settlements,
    clients: Vec<Client>,
    channel: String,
}

impl Subscribing {
    /// Subscribes, moving to the next client with a growing pause after each failure, until
    /// `stopped` (the store is dropped).
    async fn run(self, mut stopped: oneshot::Receiver<()>) {
        let mut retry = FIRST_RETRY;
        for client in self.clients.iter().cycle() {
            tokio::select! {
                _ = &mut stopped => break,
                ended = self.session(client, &mut retry) => {
                    tracing::warn!(error = ?ended.err(), channel = %self.channel, "redis SUBSCRIBE connection lost; waiters poll until it is back");
                }
            }
            if self.settlements.is_connected() {
                self.settlements.connected(false);
            }
            tokio::select! {
                _ = &mut stopped => break,
                () = tokio::time::sleep(retry) => {}
            }
            retry = (retry * 2).min(LONGEST_RETRY);
        }
        self.settlements.connected(false);
    }

    /// One connection's life: `SUBSCRIBE`, then hand every notice over until the connection
    /// ends (`Ok`), fails or stops answering `PING` (`Err`).
    async fn session(&self, client: &Client, retry: &mut Duration) -> Result<(), RedisError> {
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(&self.channel).await?;
        self.settlements.connected(true);
        *retry = FIRST_RETRY;
        let (mut sink, mut messages) = pubsub.split();
        let mut ping =
            tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
        loop {
            tokio::select! {
                message = messages.next() => match message {
                    Some(message) => {
                        if let Ok(key) = message.get_payload::<String>() {
                            self.settlements.settled(&key);
                        }
                    }
                    None => return Ok(()),
                },
                _ = ping.tick() => {
                    match tokio::time::timeout(PING_WITHIN, sink.ping::<redis::Value>()).await {
                        Ok(answer) => drop(answer?),
                        Err(_) => return Err(RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))),
                    }
                }
            }
        }
    }
}
