//! How the pools this crate family opens test a connection before lending it.
//!
//! sqlx tests every connection it lends (`PoolOptions::test_before_acquire`, on by default):
//! one round trip to the database each time a connection is borrowed, before the caller's first
//! statement. A store's call, an inbox's acknowledgement and each of a worker's claims and
//! attempts borrow a connection, so that test is a round trip more on each of them, while a
//! connection that went back to the pool a moment ago is almost never the one the database
//! dropped. [`ping_when_idle`] tests only a connection that sat idle for a while, as pgx's pool
//! (Go) and HikariCP (Java) do.
//!
//! ```no_run
//! use tower_idempotency_sqlx::{ping_when_idle, PING_AFTER_IDLE};
//!
//! # async fn run() -> Result<(), sqlx::Error> {
//! let options = sqlx::postgres::PgPoolOptions::new().max_connections(16);
//! let pool = ping_when_idle(options, PING_AFTER_IDLE)
//!     .connect("postgres://postgres@127.0.0.1/app")
//!     .await?;
//! # let _ = pool;
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use sqlx::{pool::PoolOptions, Connection, Database};

/// How long a connection sits idle in a pool before [`ping_when_idle`] tests it: 1 s, as pgx's
/// pool does.
pub const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// `options` testing a connection before lending it only when it sat idle in the pool for at
/// least `after`, instead of every time (sqlx's default).
///
/// A tested connection that does not answer is closed and the pool lends another, as with
/// sqlx's default. What changes: a connection the database dropped less than `after` after
/// it was last used is found by the caller's first statement instead, which fails as it would
/// if the database dropped it a moment later. Every caller in this crate family handles that
/// failure: a store call fails closed (503), an acknowledgement is not answered `2xx` (the
/// sender retries), and a worker's claim or attempt is retried after its backoff.
pub fn ping_when_idle<DB: Database>(options: PoolOptions<DB>, after: Duration) -> PoolOptions<DB> {
    options
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            Box::pin(async move {
                if meta.idle_for < after {
                    return Ok(true);
                }
                match conn.ping().await {
                    Ok(()) => Ok(true),
                    Err(error) => {
                        // `false` closes it, and the pool lends another.
                        tracing::debug!(%error, "an idle connection did not answer; closing it");
                        Ok(false)
                    }
                }
            })
        })
}
