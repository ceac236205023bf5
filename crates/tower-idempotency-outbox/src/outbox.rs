//! [`Outbox`]: one outbox table on one database pool, and enqueuing into it.

use std::{fmt, sync::Arc};

use tokio::sync::Notify;
use tower_idempotency_core::MAX_KEY_LEN;
use tower_idempotency_sqlx::{validate_table_name, ConfigError};

use tower_idempotency_jobs::{time::now_ms, Statements};

use crate::{
    backend::{NewRow, OutboxDatabase, Sql},
    message::{Message, Target},
};

/// The table name [`Outbox::new`] is usually given.
pub const DEFAULT_TABLE: &str = "outbox";

/// Why an outbox call failed. Messages never carry a message's body, headers or key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The table name was refused before any SQL ran.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A message's key is empty, longer than 255 bytes or not visible ASCII, so it cannot be
    /// sent as an `Idempotency-Key`.
    #[error("the message key is not a valid Idempotency-Key (visible ASCII, 1 to 255 bytes)")]
    InvalidKey,
    /// An HTTP message's URL is not an absolute `http` or `https` URL.
    #[error("the message URL is not an absolute http(s) URL")]
    InvalidUrl,
    /// A broker message's target is invalid: an empty NATS subject or one with whitespace, or
    /// a RabbitMQ exchange or routing key longer than 255 bytes.
    #[error("the message's broker target is invalid")]
    InvalidBrokerTarget,
    /// The message's key is held by a different message (another method, URL, topic, header
    /// or body): nothing was enqueued and the stored message is unchanged.
    #[error("the message key is held by a different message")]
    KeyConflict,
    /// A listing's cursor is not one [`Outbox::messages`] made.
    #[error("the cursor is not one the outbox made")]
    InvalidCursor,
    /// A pause's scope is empty or too long ([`Outbox::pause`]).
    #[error(transparent)]
    InvalidScope(#[from] tower_idempotency_jobs::pauses::ScopeError),
    /// The database failed or could not be reached.
    #[error("the outbox database failed")]
    Database(#[source] sqlx::Error),
}

impl From<sqlx::Error> for OutboxError {
    fn from(error: sqlx::Error) -> Self {
        Self::Database(error)
    }
}

/// What [`Outbox::enqueue`] did with a message; both variants carry its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Enqueued {
    /// The message was inserted: it is stored when the caller's transaction commits.
    Inserted(String),
    /// The same message (method, URL or topic, headers and body) was already stored under the
    /// key: nothing was inserted, and the stored message stays as it is (delivered, pending,
    /// failed or discarded).
    AlreadyThere(String),
}

impl Enqueued {
    /// The message's key, sent as its `Idempotency-Key`.
    pub fn key(&self) -> &str {
        match self {
            Self::Inserted(key) | Self::AlreadyThere(key) => key,
        }
    }

    /// The message's key, owned.
    pub fn into_key(self) -> String {
        match self {
            Self::Inserted(key) | Self::AlreadyThere(key) => key,
        }
    }

    /// Whether this call inserted the message.
    pub fn inserted(&self) -> bool {
        matches!(self, Self::Inserted(_))
    }
}

/// A transactional outbox: one table on a sqlx pool of Postgres or SQLite. Cheap to clone;
/// clones share the table and wake the same relays.
///
/// A handler enqueues messages with [`enqueue`](Self::enqueue) on its own transaction (the
/// inbox's or a transactional route's [`IdempotentTx`](tower_idempotency_sqlx::IdempotentTx), or
/// any `sqlx::Transaction`): they are stored if and only if the handler's other writes commit. A
/// [`Relay`](crate::Relay) then delivers them.
#[derive_where::derive_where(Clone)]
pub struct Outbox<DB: OutboxDatabase> {
    pub(crate) pool: sqlx::Pool<DB>,
    pub(crate) sql: Arc<Sql>,
    pub(crate) jobs: Arc<Statements>,
    table: Arc<str>,
    pub(crate) wake: Arc<Notify>,
}

impl<DB: OutboxDatabase> fmt::Debug for Outbox<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        tower_idempotency_jobs::debug_handle(f, "Outbox", DB::NAME, &self.table)
    }
}

impl<DB: OutboxDatabase> Outbox<DB> {
    /// An outbox in `table` (a plain SQL identifier, see [`validate_table_name`]) on `pool`.
    /// Nothing runs until [`migrate`](Self::migrate) or the first call.
    pub fn new(pool: sqlx::Pool<DB>, table: &str) -> Result<Self, OutboxError> {
        validate_table_name(table)?;
        Ok(Self {
            pool,
            sql: Arc::new(Sql::new::<DB>(table)),
            jobs: Arc::new(DB::statements(crate::backend::table(table))),
            table: table.into(),
            wake: Arc::default(),
        })
    }

    /// Creates the table and its index when missing; safe to call at every start, from several
    /// instances at once.
    pub async fn migrate(&self) -> Result<(), OutboxError> {
        DB::run_script(&self.pool, &self.sql.schema).await?;
        Ok(())
    }

    /// The DDL [`migrate`](Self::migrate) runs, for teams that run their own migrations.
    pub fn schema_sql(&self) -> &str {
        &self.sql.schema
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The pool.
    pub fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    /// Inserts `message` through `conn`, the caller's open transaction (`&mut *tx`), so it is
    /// stored exactly when the transaction commits, and answers what happened under its key
    /// (the one it was given, or a generated UUIDv7):
    ///
    /// - [`Enqueued::Inserted`]: the key was free; the message is stored with the commit.
    /// - [`Enqueued::AlreadyThere`]: the same message (method, URL or topic, headers and body)
    ///   is stored under the key already, by an earlier commit or earlier in this transaction
    ///   (a retried handler enqueuing the same work); nothing changes.
    /// - [`OutboxError::KeyConflict`]: a different message holds the key; nothing changes.
    ///
    /// Keys are unique per outbox table, whatever enqueued them, and stay taken until the
    /// message is purged. The insert skips a taken key (`ON CONFLICT DO NOTHING`) and reads
    /// the stored message back on `conn`; on Postgres a concurrent transaction inserting the
    /// same key makes this call wait for its outcome. Neither outcome aborts the transaction.
    ///
    /// Relays poll for new messages; call [`wake`](Self::wake) after the commit to start the
    /// delivery at once.
    pub async fn enqueue(
        &self,
        conn: &mut DB::Connection,
        message: Message,
    ) -> Result<Enqueued, OutboxError> {
        self.insert(conn, None, message).await
    }

    /// A scope that numbers the messages enqueued through it: the `n`-th message without a key
    /// of its own gets the key `{scope}/{n}` (from 0). Name the scope after what the
    /// transaction processes: a retry of the same work, after a rollback, enqueues the same
    /// keys, so the receiver sees the same `Idempotency-Key` whichever attempt committed.
    ///
    /// Keys are unique per outbox, so the scope must be unique across everything that
    /// enqueues into it: carry the provider and the tenant with the event's or request's id,
    /// e.g. `outbox.scope(format!("{provider}/{tenant}/{event_id}"))` for an inbox event, or
    /// `format!("payments/{tenant}/{idempotency_key}")` for a request. Two providers (or two
    /// tenants) may use the same event id; scoped by the id alone, the second one's messages
    /// would be [`OutboxError::KeyConflict`] or, worse, taken as
    /// [`AlreadyThere`](Enqueued::AlreadyThere) when their content is the same.
    pub fn scope(&self, scope: impl Into<String>) -> Scope<DB> {
        Scope {
            outbox: self.clone(),
            scope: scope.into(),
            next: 0,
        }
    }

    /// Wakes the relays waiting for their next poll, for messages just committed.
    pub fn wake(&self) {
        self.wake.notify_waiters();
    }

    async fn insert(
        &self,
        conn: &mut DB::Connection,
        scope: Option<(&str, u32)>,
        message: Message,
    ) -> Result<Enqueued, OutboxError> {
        let key = match (message.key, scope) {
            (Some(key), _) => key,
            (None, Some((scope, n))) => format!("{scope}/{n}"),
            (None, None) => uuid::Uuid::now_v7().to_string(),
        };
        if !valid_key(&key) {
            return Err(OutboxError::InvalidKey);
        }
        let (method, url, topic) = match message.target {
            Target::Http { method, url } => {
                if !(url.starts_with("http://") || url.starts_with("https://"))
                    || url.parse::<http::Uri>().is_err()
                {
                    return Err(OutboxError::InvalidUrl);
                }
                (Some(method.as_str().to_owned()), Some(url), None)
            }
            Target::Dispatch { topic } => (None, None, Some(topic)),
            broker => (None, Some(crate::broker::stored(&broker)?), None),
        };
        let headers = serde_json::to_string(&message.headers).expect("strings serialize");
        let row = NewRow {
            key,
            scope: scope.map(|(scope, _)| scope.to_owned()),
            method,
            url,
            topic,
            headers,
            body: message.body.to_vec(),
            created_at: now_ms(),
        };
        // The insert skips a key already stored (or being stored by a transaction it waited
        // for); the read-back, on the same connection, tells the same message from another.
        // A row that is gone by the read-back (purged meanwhile) is inserted again, once.
        for _ in 0..2 {
            if DB::insert(&mut *conn, &self.sql, &row).await? {
                return Ok(Enqueued::Inserted(row.key));
            }
            match DB::existing(&mut *conn, &self.sql, &row.key).await? {
                Some(stored) if row.same_as(&stored) => return Ok(Enqueued::AlreadyThere(row.key)),
                Some(_) => return Err(OutboxError::KeyConflict),
                None => continue,
            }
        }
        Err(OutboxError::Database(sqlx::Error::RowNotFound))
    }
}

/// Enqueues messages numbered within one scope; from [`Outbox::scope`].
pub struct Scope<DB: OutboxDatabase> {
    outbox: Outbox<DB>,
    scope: String,
    next: u32,
}

impl<DB: OutboxDatabase> fmt::Debug for Scope<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("outbox", &self.outbox)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl<DB: OutboxDatabase> Scope<DB> {
    /// Inserts `message` through `conn` (the caller's transaction), keyed `{scope}/{n}` for the
    /// `n`-th message enqueued through this scope unless it has a key of its own; answers
    /// whether it was inserted or already there, or that the key holds a different message, as
    /// [`Outbox::enqueue`] does.
    pub async fn enqueue(
        &mut self,
        conn: &mut DB::Connection,
        message: Message,
    ) -> Result<Enqueued, OutboxError> {
        let n = self.next;
        self.next = self.next.saturating_add(1);
        self.outbox
            .insert(conn, Some((&self.scope, n)), message)
            .await
    }
}

/// The `Idempotency-Key` rule: visible ASCII, 1 to 255 bytes.
fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_LEN && key.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_idempotency_key_rule() {
        assert!(valid_key("evt_1/0"));
        assert!(!valid_key(""));
        assert!(!valid_key("has space"));
        assert!(!valid_key(&"k".repeat(MAX_KEY_LEN + 1)));
        assert!(valid_key(&"k".repeat(MAX_KEY_LEN)));
    }
}
