//! Postgres notices of settled keys, for requests waiting on a key another instance holds
//! ([`Store::settlements`](tower_idempotency_core::store::Store::settlements)).
//!
//! `complete`, `release` and `forget` run `pg_notify` on the table's [`channel`] in their own
//! statement, for the row they changed only, so a notice is sent exactly when the change
//! commits (inside a caller's transaction, at its commit) and never for a stale call. The
//! payload is the hex SHA-256 of the key ([`Settlements::key_digest`]): 64 bytes whatever the
//! key, far below `NOTIFY`'s 8000-byte limit.
//!
//! Each store object keeps one `LISTEN` connection of its own (not one of its pool's), opened
//! on the first wait with the pool's connect options, and fans notices out to its waiters in
//! this process. When that connection fails, it is opened again after 100 ms, doubling up to
//! 5 s; meanwhile waiters re-claim on their timer. Dropping the store closes it.

use std::{sync::OnceLock, time::Duration};

use sqlx::{
    postgres::{PgListener, PgPoolOptions},
    PgPool,
};
use tokio::sync::oneshot;
use tower_idempotency_core::store::Settlements;

/// The `NOTIFY` channel of `table`'s notices. Table names are at most 48 bytes
/// ([`validate_table_name`](crate::validate_table_name)), so this stays within Postgres's
/// 63-byte identifiers.
pub(crate) fn channel(table: &str) -> String {
    format!("{table}_settled")
}

/// What the statements that settle a key `SELECT` from `rows` (a CTE returning `key`): one
/// `pg_notify` per row with `notify`, a constant without; a row either way, so the command tag
/// counts the rows changed.
pub(crate) fn notify_each(table: &str, rows: &str, notify: bool) -> String {
    if !notify {
        return format!("1 FROM {rows}");
    }
    format!(
        "pg_notify('{}', encode(sha256(convert_to({rows}.key, 'UTF8')), 'hex')) FROM {rows}",
        channel(table)
    )
}

/// The first wait before opening the `LISTEN` connection again; it doubles up to
/// [`LONGEST_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(100);
const LONGEST_RETRY: Duration = Duration::from_secs(5);

/// A store's notices and the task holding its `LISTEN` connection, started on first use.
#[derive(Debug)]
pub(crate) struct PgNotices {
    settlements: Settlements,
    pool: PgPool,
    channel: String,
    /// Dropped with the store, which ends the listening task.
    stop: OnceLock<oneshot::Sender<()>>,
}

impl PgNotices {
    pub(crate) fn new(pool: &PgPool, table: &str) -> Self {
        Self {
            settlements: Settlements::hashed(),
            pool: pool.clone(),
            channel: channel(table),
            stop: OnceLock::new(),
        }
    }

    /// The notices, starting the listening task if it is not running yet and a Tokio runtime
    /// is at hand (without one the waiters poll, and a later call starts it).
    pub(crate) fn settlements(&self) -> Settlements {
        if self.stop.get().is_none() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                self.stop.get_or_init(|| {
                    let (stop, stopped) = oneshot::channel();
                    let listening = Listening {
                        settlements: self.settlements.clone(),
                        // One connection, never recycled: a listener must stay on it.
                        pool: PgPoolOptions::new()
                            .max_connections(1)
                            .max_lifetime(None)
                            .idle_timeout(None)
                            .connect_lazy_with((*self.pool.connect_options()).clone()),
                        channel: self.channel.clone(),
                    };
                    runtime.spawn(listening.run(stopped));
                    stop
                });
            }
        }
        self.settlements.clone()
    }
}

struct Listening {
    settlements: Settlements,
    pool: PgPool,
    channel: String,
}

impl Listening {
    /// Listens, reconnecting with a growing pause, until `stopped` (the store is dropped).
    async fn run(self, mut stopped: oneshot::Receiver<()>) {
        let mut retry = FIRST_RETRY;
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                ended = self.session(&mut retry) => {
                    if let Err(error) = ended {
                        tracing::warn!(%error, channel = %self.channel, "postgres LISTEN connection failed; waiters poll until it is back");
                    }
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
        self.pool.close().await;
    }

    /// One connection's life: `LISTEN`, then hand every notice over until the connection is
    /// lost (`Ok`) or fails (`Err`).
    async fn session(&self, retry: &mut Duration) -> Result<(), sqlx::Error> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        // A lost connection ends this session; the next one starts from a fresh `LISTEN`.
        listener.eager_reconnect(false);
        listener.listen(&self.channel).await?;
        self.settlements.connected(true);
        *retry = FIRST_RETRY;
        while let Some(notice) = listener.try_recv().await? {
            self.settlements.settled(notice.payload());
        }
        Ok(())
    }
}
