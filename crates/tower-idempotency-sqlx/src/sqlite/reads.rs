//! The SQLite store's inline reads: a replay's primary-key read run on the calling task, without
//! a trip to a connection's worker thread.
//!
//! Why the store reads this way: docs/stores.md, "SQLite"; what it saves: the load harness's
//! `--stores sqlite` replays. These reads use their own connections (through rusqlite, on the
//! same bundled SQLite as sqlx) and never wait:
//!
//! - a read takes a connection only if one is free (`try_lock`), with SQLite's busy timeout at
//!   zero, and only in WAL mode, where a reader never waits for the writer;
//! - a row whose body is larger than [`INLINE_BODY_LIMIT`] is not read here (its length comes
//!   from the record header, without loading the body);
//! - anything else (no free connection, any SQLite error, a closed pool, a database not in WAL
//!   mode, an in-memory database) answers "not here", and the store reads on a reader lane as
//!   it would without them. So a wrong or missing answer here never changes a result: it costs
//!   the lane read.

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Mutex,
    },
    time::Duration,
};

use rusqlite::{Connection, OpenFlags, OptionalExtension};
use sqlx::SqlitePool;

use super::statements::decode_rusqlite;
use crate::store::record::RawRecord;

/// The largest body an inline read returns; a larger record is read on a reader lane, so that
/// copying it does not hold the calling thread.
const INLINE_BODY_LIMIT: i64 = 64 * 1024;

/// Connections kept for inline reads. A read never waits for one, so more than the threads
/// that run requests at once only costs memory (each has its own page cache).
const CONNECTIONS: usize = 4;

/// A store's connections for inline reads of its table.
pub(crate) struct InlineReads {
    path: PathBuf,
    sql: String,
    connections: [Mutex<Option<Connection>>; CONNECTIONS],
    next: AtomicUsize,
    /// Set once the database is found not to be in WAL mode: every read then takes a lane.
    off: AtomicBool,
}

impl std::fmt::Debug for InlineReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlineReads")
            .field("path", &self.path)
            .field("off", &self.off)
            .finish_non_exhaustive()
    }
}

/// What an inline read found.
pub(crate) enum Inline {
    /// The row, or `None`: no live record.
    Read(Option<RawRecord>),
    /// Not answered here; read on a lane.
    Elsewhere,
}

impl InlineReads {
    /// Inline reads for `table` in the file `pool` opens, or `None` for a database that is not a
    /// plain file (in memory, or behind a VFS). Opens nothing yet: connections open on first use.
    pub(crate) fn for_pool(pool: &SqlitePool, table: &str) -> Option<Self> {
        let options = pool.connect_options();
        let parameters = super::url_parameters(&options)?;
        let plain_file = parameters.iter().all(|(name, value)| match name.as_str() {
            "mode" => value != "memory",
            "vfs" | "immutable" => false,
            _ => true,
        });
        if !plain_file {
            return None;
        }
        Some(Self {
            path: options.get_filename().to_path_buf(),
            sql: format!(
                r#"SELECT token, fingerprint, state, expires_at, status, headers,
    CASE WHEN length(body) <= {INLINE_BODY_LIMIT} THEN body END, body_omitted,
    length(body) > {INLINE_BODY_LIMIT}
FROM "{table}" WHERE key = ?1 AND expires_at > ?2"#
            ),
            connections: Default::default(),
            next: AtomicUsize::new(0),
            off: AtomicBool::new(false),
        })
    }

    /// The live record of `key` at `now_ms`, if a free connection can read it now.
    pub(crate) fn get(&self, key: &str, now_ms: i64) -> Inline {
        if self.off.load(Ordering::Relaxed) {
            return Inline::Elsewhere;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..CONNECTIONS {
            let Ok(mut slot) = self.connections[(start + i) % CONNECTIONS].try_lock() else {
                continue;
            };
            if slot.is_none() {
                match self.open() {
                    Ok(Some(conn)) => *slot = Some(conn),
                    Ok(None) => {
                        self.off.store(true, Ordering::Relaxed);
                        return Inline::Elsewhere;
                    }
                    Err(error) => {
                        tracing::debug!(%error, "opening an inline SQLite reader failed");
                        return Inline::Elsewhere;
                    }
                }
            }
            let conn = slot.as_ref().expect("opened above");
            return match self.read(conn, key, now_ms) {
                Ok(inline) => inline,
                Err(error) => {
                    // A connection that failed is reopened on its next use.
                    tracing::debug!(%error, "inline SQLite read failed; reading on a lane");
                    *slot = None;
                    Inline::Elsewhere
                }
            };
        }
        Inline::Elsewhere
    }

    /// A read-only connection to the store's file, or `None` if the database is not in WAL
    /// mode (a reader could then wait for the writer).
    fn open(&self) -> rusqlite::Result<Option<Connection>> {
        // Not SQLITE_OPEN_CREATE: a missing file is the pool's to create.
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(Duration::ZERO)?;
        conn.pragma_update(None, "query_only", true)?;
        let mode: String = conn.pragma_query_value(None, "journal_mode", |row| row.get(0))?;
        Ok(mode.eq_ignore_ascii_case("wal").then_some(conn))
    }

    /// [`Inline::Elsewhere`] when the record's body is over [`INLINE_BODY_LIMIT`].
    fn read(&self, conn: &Connection, key: &str, now_ms: i64) -> rusqlite::Result<Inline> {
        let mut statement = conn.prepare_cached(&self.sql)?;
        let found = statement
            .query_row((key, now_ms), |row| {
                if row.get::<_, Option<bool>>(8)?.unwrap_or(false) {
                    return Ok(Inline::Elsewhere);
                }
                Ok(Inline::Read(Some(decode_rusqlite(row, now_ms)?)))
            })
            .optional()?;
        Ok(found.unwrap_or(Inline::Read(None)))
    }
}
