//! The public conformance suite of the transactional mode (feature `conformance`): run it
//! against your own SQL store, as this crate runs it against [`PostgresStore`](crate::PostgresStore)
//! and [`SqliteStore`](crate::SqliteStore).
//!
//! Each case takes a [`Fixture`]: the store under test (whose [`Store::transactions`] must be
//! `Some`, attaching a [`TxHandle`](crate::TxHandle) of the same database, see
//! [`TxHandle::new`](crate::TxHandle::new)) and a pool on
//! the database the store's transactions write to. Every case creates its own effects table
//! with a random name there (and drops it when it passes), serves a handler that inserts one row
//! `(idempotency_key, amount)` through [`IdempotentTx`](crate::IdempotentTx) behind a transactional
//! [`IdempotencyLayer`] on `127.0.0.1:0`, and checks the rows the database holds afterwards.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tower_idempotency_sqlx::{conformance, PostgresStore};
//!
//! let store = Arc::new(PostgresStore::connect("postgres://app@127.0.0.1/test").await?);
//! store.migrate().await?;
//! let fixture = conformance::Fixture { store: store.clone(), pool: store.pool().clone() };
//! conformance::concurrent_rounds_write_one_row_per_key(&fixture).await;
//! # Ok(())
//! # }
//! ```

use std::{
    hash::{BuildHasher, RandomState},
    sync::Arc,
};

use sqlx::{Database, Pool};
use tower_idempotency_core::{IdempotencyLayer, Store};

mod cases;
mod effects_db;
mod server;

pub use cases::{
    caller_disconnect_still_commits_once, concurrent_rounds_write_one_row_per_key,
    directive_commits_a_non_2xx, duplicate_in_flight_gets_409, failed_commit_writes_nothing,
    misconfiguration_is_refused, oversized_result_commits_without_its_body,
    released_answers_write_nothing,
};
pub use effects_db::EffectsDb;
pub use server::{EffectsServer, EFFECT_HEADER, LARGE_BODY_BYTES};

/// The store under test and a pool on the database its transactions write to.
#[derive(Clone)]
pub struct Fixture<DB: Database> {
    /// The store under test; [`Store::transactions`] must be `Some`.
    pub store: Arc<dyn Store>,
    /// A pool on the same database, for the effects table.
    pub pool: Pool<DB>,
}

/// A fresh client key.
pub fn fresh_key(case: &str) -> String {
    format!("tx-{case}-{}", random_suffix())
}

/// 16 hex digits that differ from one call to the next, for table names and keys.
fn random_suffix() -> String {
    format!(
        "{:016x}",
        RandomState::new().hash_one(std::time::SystemTime::now())
    )
}

/// The transactional layer the suite uses on `store`.
pub fn layer(store: Arc<dyn Store>) -> IdempotencyLayer {
    IdempotencyLayer::client_keys(store).transactional()
}

fn problem_type(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_owned))
        .unwrap_or_default()
}
