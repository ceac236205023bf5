//! The Postgres driver: claims lock with `FOR UPDATE SKIP LOCKED`, so workers sharing a table
//! (threads or instances) take disjoint jobs; a batch of keys is bound as one `text[]` per key
//! column.

use crate::{
    driver::{KeyBatch, Placeholders},
    Dialect, Driver, JobKey, Statements, Table,
};

impl Driver for sqlx::Postgres {
    const JOB_COLUMNS: &'static str = "state smallint NOT NULL DEFAULT 0,\n\
         attempts integer NOT NULL DEFAULT 0,\n\
         available_at bigint NOT NULL,\n\
         lease_token bigint,\n\
         lease_until bigint,\n\
         finished_at bigint,\n\
         last_error text";
    const BEGIN_WRITE: &'static str = "BEGIN";
    const CONCURRENCY: usize = 16;
    const HISTORY_SEQ: &'static str = "seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY";
    const HISTORY_KEY_TYPE: &'static str = "text COLLATE \"C\"";
    const AUDIT_COLUMNS: &'static str =
        "at bigint NOT NULL, who text NOT NULL, action text NOT NULL, \
         target text NOT NULL, changed bigint NOT NULL";
    const HISTORY_COLUMNS: &'static str = "attempt integer NOT NULL, started_at bigint NOT NULL, \
         duration_ms bigint NOT NULL, outcome smallint NOT NULL, error text, status integer, \
         response text";

    fn statements(table: Table) -> Statements {
        Statements::new(
            table,
            Dialect {
                claim_lock: " FOR UPDATE SKIP LOCKED",
                key_batch: KeyBatch::PostgresArrays,
                placeholders: Placeholders::Numbered,
                returning: true,
                quote: "",
                null_integer: "CAST(NULL AS integer)",
                writing_with: true,
            },
        )
    }

    crate::driver_calls!(sqlx::Postgres, key_column);
}

/// Key column `column` of every key in `keys`, as one array.
fn key_column(keys: &[JobKey], column: usize) -> Vec<String> {
    keys.iter().map(|key| key.part(column).to_owned()).collect()
}
