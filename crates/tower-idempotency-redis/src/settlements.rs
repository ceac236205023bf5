//! Redis pub/sub notices of settled keys, for requests waiting on a key another instance holds
//! ([`Store::settlements`](tower_idempotency_core::store::Store::settlements)).
//!
//! The scripts that complete, release and forget a record `PUBLISH` the store key on
//! `<prefix>:settled` when they changed it (see `scripts.rs`). A store given clients
//! ([`RedisStore::with_notices`](crate::RedisStore::with_notices)) keeps one `SUBSCRIBE`
//! connection, opened on the first request through a waiting layer and shared by its clones, and
//! fans notices out to its waiters in this process. When that connection fails, the next client is
//! tried ([`Subscriber`] paces the attempts); meanwhile waiters re-claim on their timer. A `PING`
//! every 15 s (answered within 5 s) finds a connection that died silently. Dropping the last clone
//! closes it.

use std::time::Duration;

use futures_util::StreamExt;
use redis::{Client, RedisError};
use tower_idempotency_core::store::{Settlements, Subscriber};

/// The channel of the notices of the store with key prefix `prefix`.
pub(crate) fn channel(prefix: &str) -> String {
    format!("{prefix}:settled")
}

/// How often an idle subscription is checked with a `PING`, and how long the answer may take.
const PING_EVERY: Duration = Duration::from_secs(15);
const PING_WITHIN: Duration = Duration::from_secs(5);

/// A store's notices and the task holding its subscription, started on first use.
pub(crate) struct RedisNotices {
    subscriber: Subscriber,
    /// Tried in turn, one at a time: a cluster delivers a notice on every node.
    clients: Vec<Client>,
    /// The channel the scripts publish on.
    pub(crate) channel: String,
}

impl RedisNotices {
    pub(crate) fn new(prefix: &str, clients: Vec<Client>) -> Self {
        Self {
            subscriber: Subscriber::new(Settlements::new()),
            clients,
            channel: channel(prefix),
        }
    }

    /// Whether the store was given clients to subscribe with.
    pub(crate) fn subscribes(&self) -> bool {
        !self.clients.is_empty()
    }

    /// The notices, subscribing first if no subscription is open yet.
    pub(crate) fn settlements(&self) -> Settlements {
        self.subscriber.settlements(|| {
            let (clients, channel) = (self.clients.clone(), self.channel.clone());
            let mut next = 0;
            move |notices| {
                let client = clients[next % clients.len()].clone();
                next += 1;
                subscribe(client, channel.clone(), notices)
            }
        })
    }
}

/// One connection's life: `SUBSCRIBE`, then hand every notice over until the connection ends
/// (`Ok`), fails or stops answering `PING` (`Err`).
async fn subscribe(
    client: Client,
    channel: String,
    notices: Settlements,
) -> Result<(), RedisError> {
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(&channel).await?;
    notices.connected(true);
    let (mut sink, mut messages) = pubsub.split();
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    loop {
        tokio::select! {
            message = messages.next() => match message {
                Some(message) => {
                    if let Ok(key) = message.get_payload::<String>() {
                        notices.settled(&key);
                    }
                }
                None => return Ok(()),
            },
            _ = ping.tick() => {
                match tokio::time::timeout(PING_WITHIN, sink.ping::<redis::Value>()).await {
                    Ok(answer) => drop(answer?),
                    Err(_) => return Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
                }
            }
        }
    }
}
