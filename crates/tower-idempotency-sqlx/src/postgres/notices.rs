//! Postgres notices of settled keys, for requests waiting on a key another instance holds
//! ([`Store::settlements`](tower_idempotency_core::Store::settlements)).
//!
//! `complete`, `release` and `forget` run `pg_notify` on the table's [`channel`] in their own
//! statement, for the row they changed only and only if a waiter marked it, so a notice is sent
//! exactly when the change commits (inside a caller's transaction, at its commit) and never for
//! a stale call. The payload is the hex SHA-256 of the key ([`Settlements::key_digest`]): 64
//! bytes whatever the key, far below `NOTIFY`'s 8000-byte limit.
//!
//! Only marked keys are notified because Postgres serialises the commits of notifying
//! transactions cluster wide: a completion nobody waits for must not pay that. A waiter marks
//! the key before it waits ([`watch_sql`], run by [`Settlements::watch`]); the mark and the
//! settlement both lock the row, so either the mark commits first and the settlement notifies,
//! or the settlement does and the mark finds the key no longer in flight (the waiter claims
//! again at once). A new claim of the key clears the mark.
//!
//! Each store object keeps one `LISTEN` connection of its own (not one of its pool's), opened on
//! the first request through a waiting layer with the pool's connect options, and fans notices out
//! to its waiters in this process. When that connection fails, it is opened again ([`Subscriber`]);
//! meanwhile waiters re-claim on their timer. Dropping the store closes it.

use std::{future::Future, pin::Pin};

use sqlx::{
    postgres::{PgListener, PgPoolOptions},
    PgPool,
};
use tower_idempotency_core::{Settlements, StoreError, Subscriber};

/// The `NOTIFY` channel of `table`'s notices. Table names are at most 48 bytes
/// ([`validate_table_name`](crate::validate_table_name)), so this stays within Postgres's
/// 63-byte identifiers.
pub(crate) fn channel(table: &str) -> String {
    format!("{table}_settled")
}

/// What the statements that settle a key `SELECT` from `rows` (a CTE returning `key` and
/// `watched`): a `pg_notify` for each watched row, a null for the others; a row either way, so
/// the command tag counts the rows changed. `CASE` never evaluates a volatile branch it does
/// not take, so a statement settling no watched row takes no notify lock.
pub(crate) fn notify_each(table: &str, rows: &str) -> String {
    format!(
        "CASE WHEN {rows}.watched THEN \
         pg_notify('{}', encode(sha256(convert_to({rows}.key, 'UTF8')), 'hex')) END FROM {rows}",
        channel(table)
    )
}

/// Marks `$1` as waited on while it is in flight; one row changed means marked, none that the
/// key is no longer in flight.
pub(crate) fn watch_sql(table: &str) -> String {
    format!(
        r#"UPDATE "{table}" SET watched = true
WHERE key = $1 AND state = 0 AND expires_at > statement_timestamp()"#
    )
}

/// A store's notices and the task holding its `LISTEN` connection, started on first use. Public
/// only to be Postgres's [`Backend::Engine`](crate::Backend::Engine); this module is private.
#[derive(Debug)]
pub struct PgNotices {
    subscriber: Subscriber,
    pool: PgPool,
    channel: String,
}

impl PgNotices {
    pub(crate) fn new(pool: &PgPool, table: &str) -> Self {
        Self {
            subscriber: Subscriber::new(Settlements::hashed().with_watch(watch(pool, table))),
            pool: pool.clone(),
            channel: channel(table),
        }
    }

    /// The notices, opening the `LISTEN` connection first if it is not open yet.
    pub(crate) fn settlements(&self) -> Settlements {
        self.subscriber.settlements(|| {
            // One connection, never recycled: a listener must stay on it.
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .max_lifetime(None)
                .idle_timeout(None)
                .connect_lazy_with((*self.pool.connect_options()).clone());
            let channel = self.channel.clone();
            move |notices| listen(pool.clone(), channel.clone(), notices)
        })
    }
}

type Marking = Pin<Box<dyn Future<Output = Result<bool, StoreError>> + Send>>;

/// The step of [`Settlements::watch`]: [`watch_sql`] on the store's pool.
fn watch(pool: &PgPool, table: &str) -> impl Fn(&str) -> Marking + Send + Sync + 'static {
    let pool = pool.clone();
    let sql = crate::table_sql(watch_sql(table));
    move |key| {
        let (pool, sql, key) = (pool.clone(), sql.clone(), key.to_owned());
        Box::pin(async move {
            let done = sqlx::query(sql)
                .bind(key)
                .execute(&pool)
                .await
                .map_err(|e| crate::store::error::map_error(e, None, 0))?;
            Ok(done.rows_affected() == 1)
        })
    }
}

/// One connection's life: `LISTEN`, then hand every notice over until the connection is lost
/// (`Ok`) or fails (`Err`).
async fn listen(pool: PgPool, channel: String, notices: Settlements) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(&pool).await?;
    // A lost connection ends this session; the next one starts from a fresh `LISTEN`.
    listener.eager_reconnect(false);
    listener.listen(&channel).await?;
    notices.connected(true);
    while let Some(notice) = listener.try_recv().await? {
        notices.settled(notice.payload());
    }
    Ok(())
}
