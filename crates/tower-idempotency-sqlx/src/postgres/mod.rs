//! The Postgres store, [`PostgresStore`](crate::PostgresStore): its SQL (`statements`), its
//! notices of settled keys to waiters in other instances (`notices`), and the queues that
//! coalesce concurrent claims of new keys and completions into one statement each
//! (`coalesce`). Every other statement runs on the store's lanes. Why it is built this way:
//! docs/stores.md, "Postgres".

mod coalesce;
mod notices;
mod statements;

use std::{future::Future, sync::Arc, time::Duration};

use sqlx::{postgres::PgPoolOptions, PgPool, Postgres, Row};
use tower_idempotency_core::Settlements;

pub use statements::schema_sql;

use self::{coalesce::Coalescer, notices::PgNotices, statements::statements};
use crate::{
    store::{
        backend::{sealed::Sealed, Backend, Engine, Statement, Statements, Write, Wrote},
        lanes::{Lanes, StoreLanes},
        record::{Params, RawRecord},
    },
    SqlStore,
};

impl Sealed for Postgres {}

impl Backend for Postgres {
    const STORE_NAME: &'static str = "postgres";
    const BEGIN: &'static str = "BEGIN";
    const EXCLUSIVE: bool = false;
    const ONE_WRITER: bool = false;

    fn schema_sql(table: &str) -> String {
        schema_sql(table)
    }

    /// Safe to run from several instances at once: a multi-statement simple query runs as one
    /// implicit transaction, so the advisory lock serialises concurrent
    /// `CREATE .. IF NOT EXISTS`, which can otherwise race on the catalog.
    fn migration_sql(table: &str) -> String {
        format!(
            "SELECT pg_advisory_xact_lock(hashtext('tower_idempotency_sqlx:migrate'));\n{}",
            schema_sql(table)
        )
    }

    fn statements(table: &str) -> Statements {
        statements(table)
    }

    fn bind<'q>(sql: &sqlx::SqlStr, _now: i64, params: Params<'q>) -> Statement<'q, Self> {
        // Rows are dated by the database's clock (`statement_timestamp()`), so application
        // hosts need no synchronised clocks; the store's clock is not bound.
        let query = sqlx::query(sql.clone());
        match params {
            Params::Claim(claim) => query
                .bind(claim.key)
                .bind(claim.fingerprint)
                .bind(claim.lease_ms)
                .bind(claim.token),
            Params::Complete(complete) => query
                .bind(complete.key)
                .bind(complete.token)
                .bind(complete.status as i16)
                .bind(complete.headers)
                .bind(complete.body)
                .bind(complete.body_omitted)
                .bind(complete.ttl_ms),
            Params::Renew {
                key,
                token,
                lease_ms,
            } => query.bind(key).bind(token).bind(lease_ms),
            Params::Release { key, token } => query.bind(key).bind(token),
            Params::Get { key } | Params::Forget { key } => query.bind(key),
            Params::Purge => query,
        }
    }

    /// By position (`RETURNED` in statements.rs leads every row that is decoded): a column found by name is a
    /// hash lookup per column per row.
    fn decode(row: &sqlx::postgres::PgRow, _now: i64) -> Result<RawRecord, sqlx::Error> {
        Ok(RawRecord {
            token: row.try_get(0)?,
            fingerprint: row.try_get(1)?,
            state: row.try_get(2)?,
            remaining_ms: row.try_get(3)?,
            status: row.try_get(4)?,
            headers: row.try_get(5)?,
            body: row.try_get(6)?,
            body_omitted: row.try_get(7)?,
        })
    }

    fn rows_affected(done: &sqlx::postgres::PgQueryResult) -> u64 {
        done.rows_affected()
    }

    /// 10 connections, 5 s acquire timeout, a connection tested before it is lent only when it
    /// sat idle ([`crate::ping_when_idle`]).
    async fn connect_pool(url: &str) -> Result<PgPool, sqlx::Error> {
        let options = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(5));
        crate::ping_when_idle(options, crate::PING_AFTER_IDLE)
            .connect(url)
            .await
    }

    /// Its notices of settled keys and its coalescing queues; rows are dated by the database.
    type Engine = PgEngine;

    fn engine(pool: &PgPool, table: &str) -> PgEngine {
        PgEngine {
            notices: PgNotices::new(pool, table),
            table: table.to_owned(),
            writes: None,
            coalescing: false,
            coalescer: None,
        }
    }
}

/// What a Postgres store keeps besides its lanes: its notices of settled keys, and the queues
/// that coalesce claims of new keys and completions on its write lanes. Public only to be
/// Postgres's [`Backend::Engine`](crate::Backend::Engine); this module is private.
#[derive(Debug)]
pub struct PgEngine {
    notices: PgNotices,
    table: String,
    /// The store's write lanes, which batches run on.
    writes: Option<Arc<Lanes<Postgres>>>,
    coalescing: bool,
    /// `None`: coalescing is off, or the store has not handed over its lanes yet.
    coalescer: Option<Coalescer>,
}

impl PgEngine {
    /// New queues on the current lanes, or none with coalescing off.
    fn coalesce(&mut self) {
        self.coalescer = match &self.writes {
            Some(writes) if self.coalescing => Some(Coalescer::new(&self.table, writes.clone())),
            _ => None,
        };
    }
}

impl Engine<Postgres> for PgEngine {
    fn write<'a>(
        &'a self,
        write: Write<'a>,
    ) -> Result<impl Future<Output = Wrote<'a>> + Send + 'a, Write<'a>> {
        match &self.coalescer {
            Some(coalescer) => coalescer.write(write),
            None => Err(write),
        }
    }

    fn lanes(&mut self, lanes: &StoreLanes<Postgres>) {
        self.writes = Some(lanes.shared_writes());
        self.coalesce();
    }

    fn settlements(&self) -> Option<Settlements> {
        Some(self.notices.settlements())
    }
}

impl SqlStore<Postgres> {
    /// Whether concurrent claims of new keys and completions are coalesced (default: off).
    ///
    /// On, a claim of a key the store has not seen (a plain insert) or a completion that finds
    /// one of the store's write [lanes](Self::with_connection_lanes) free runs as its own
    /// statement, as with coalescing off. One that finds every lane busy queues, and the next
    /// lane to free carries every queued call of its kind as one statement over arrays and one
    /// commit; each caller gets the answer its own statement would have given (fencing
    /// included). Calls wait only where their own statements would have waited for a lane, and
    /// a second call for a key already queued runs as its own statement. No connection is taken
    /// beyond the lanes.
    ///
    /// Off, each call is its own statement and commit on one of the lanes. Switch it on where
    /// many callers write new keys at once on a pool of many lanes (it saves commits and server
    /// CPU there); off, a key hot with duplicates is answered faster. How batches are built, and
    /// the measurements: docs/stores.md, "Postgres".
    pub fn with_coalescing(mut self, on: bool) -> Self {
        self.engine.coalescing = on;
        self.engine.coalesce();
        self
    }

    /// How many claims of new keys and completions wait for a lane, to go out together on the
    /// next one to free (`0` with coalescing off); see
    /// [`with_coalescing`](Self::with_coalescing). A gauge for metrics.
    pub fn coalescing_queued(&self) -> usize {
        self.engine.coalescer.as_ref().map_or(0, Coalescer::queued)
    }
}
