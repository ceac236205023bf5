//! The SQLite driver: one writer at a time, so a claim needs no lock clause; a batch of keys is
//! bound as one JSON array of strings per key column.

use crate::{
    driver::{KeyBatch, Placeholders},
    Dialect, Driver, JobKey, Statements, Table,
};

impl Driver for sqlx::Sqlite {
    const JOB_COLUMNS: &'static str = "state INTEGER NOT NULL DEFAULT 0,\n\
         attempts INTEGER NOT NULL DEFAULT 0,\n\
         available_at INTEGER NOT NULL,\n\
         lease_token INTEGER,\n\
         lease_until INTEGER,\n\
         finished_at INTEGER,\n\
         last_error TEXT";
    const BEGIN_WRITE: &'static str = "BEGIN IMMEDIATE";
    const CONCURRENCY: usize = 4;
    const HISTORY_SEQ: &'static str = "seq INTEGER PRIMARY KEY AUTOINCREMENT";
    const HISTORY_KEY_TYPE: &'static str = "TEXT";
    const AUDIT_COLUMNS: &'static str =
        "at INTEGER NOT NULL, who TEXT NOT NULL, action TEXT NOT NULL, \
         target TEXT NOT NULL, changed INTEGER NOT NULL";
    const HISTORY_COLUMNS: &'static str = "attempt INTEGER NOT NULL, started_at INTEGER NOT NULL, \
         duration_ms INTEGER NOT NULL, outcome INTEGER NOT NULL, error TEXT, status INTEGER, \
         response TEXT";

    fn statements(table: Table) -> Statements {
        Statements::new(
            table,
            Dialect {
                claim_lock: "",
                key_batch: KeyBatch::JsonArrays,
                placeholders: Placeholders::Numbered,
                returning: true,
                quote: "",
                null_integer: "CAST(NULL AS integer)",
                writing_with: false,
            },
        )
    }

    fn write_gate(pool: &sqlx::SqlitePool) -> Option<std::sync::Arc<crate::WriteGate>> {
        Some(crate::WriteGate::for_file(
            pool.connect_options().get_filename(),
        ))
    }

    crate::driver_calls!(sqlx::Sqlite, key_column);
}

/// Key column `column` of every key in `keys`, as a JSON array of strings.
fn key_column(keys: &[JobKey], column: usize) -> String {
    let values: Vec<&str> = keys.iter().map(|key| key.part(column)).collect();
    serde_json::to_string(&values).expect("strings serialize")
}
