//! Postgres's SQL: the DDL and the statements.

use super::notices::notify_each;
use sqlx::SqlStr;

use crate::{
    store::backend::{Statements, PURGE_BATCH},
    table_sql,
};

/// The DDL [`PostgresStore::migrate`](crate::SqlStore::migrate) runs, for teams that run their own migrations.
///
/// `table` must pass [`validate_table_name`](crate::validate_table_name); this function does not
/// check it. Creates the table and an index on `expires_at` for purging. Fencing tokens are the
/// callers' random 63-bit values, so no sequence is needed (a `{table}_token_seq` left by an
/// earlier schema is unused and may be dropped).
pub fn schema_sql(table: &str) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS "{table}" (
    key          text COLLATE "C" PRIMARY KEY,
    fingerprint  bytea NOT NULL,
    token        bigint NOT NULL,
    state        smallint NOT NULL CHECK (state IN (0, 1)),
    expires_at   timestamptz NOT NULL,
    status       smallint,
    headers      bytea,
    body         bytea,
    body_omitted boolean NOT NULL DEFAULT false,
    watched      boolean NOT NULL DEFAULT false
) WITH (fillfactor = 80);
-- `CREATE INDEX IF NOT EXISTS` takes its table lock before it looks for the index, so on a
-- live table it would queue behind every open transaction (a `claim_in` in a business
-- transaction) and every store call would queue behind it. Look first.
DO $$
BEGIN
    -- In the table's own schema: `to_regclass` would search the whole search_path.
    IF NOT EXISTS (
        SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = '"{table}"'::regclass AND c.relname = '{table}_expires_at_idx'
    ) THEN
        CREATE INDEX IF NOT EXISTS "{table}_expires_at_idx" ON "{table}" (expires_at);
    END IF;
    -- Tables created before waiters marked keys; `ADD COLUMN IF NOT EXISTS` locks first too.
    IF NOT EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = '"{table}"'::regclass AND attname = 'watched' AND NOT attisdropped
    ) THEN
        ALTER TABLE "{table}" ADD COLUMN IF NOT EXISTS watched boolean NOT NULL DEFAULT false;
    END IF;
END
$$;
"#
    )
}

/// Columns every statement that reads a row returns first, in
/// [`Backend::decode`](crate::Backend::decode)'s order.
const RETURNED: &str = "token, fingerprint, state, \
     GREATEST(0, CEIL(EXTRACT(EPOCH FROM (expires_at - statement_timestamp())) * 1000))::bigint \
     AS remaining_ms, status, headers, body, body_omitted";

/// `sql` with each run of whitespace as one space. sqlx finds a prepared statement by hashing
/// and comparing its text on every call, so the layout kept above for reading would cost on
/// every statement; none of the statements holds a string literal or comment that this changes.
fn compact(sql: SqlStr) -> SqlStr {
    table_sql(
        sql.as_str()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
    )
}

pub(crate) fn statements(table: &str) -> Statements {
    let s = readable_statements(table);
    Statements {
        insert: compact(s.insert),
        claim: compact(s.claim),
        complete: compact(s.complete),
        renew: compact(s.renew),
        release: compact(s.release),
        get: compact(s.get),
        forget: compact(s.forget),
        purge: compact(s.purge),
        lock: None,
    }
}

fn readable_statements(table: &str) -> Statements {
    let expired = "cur.expires_at <= statement_timestamp()";
    let notify = notify_each(table, "done");
    Statements {
        insert: table_sql(format!(
            r#"INSERT INTO "{table}" (key, fingerprint, token, state, expires_at)
VALUES ($1, $2, $4, 0, statement_timestamp() + $3::bigint * interval '1 millisecond')
ON CONFLICT (key) DO NOTHING"#
        )),
        // One statement, one round trip, in every case.
        //
        // `live`: a live row in the statement's snapshot is reported as it is, read-only, so
        // replays and in-flight duplicates write nothing. It can only report a record, never
        // grant a claim: the claim is always decided by the upsert on the primary key.
        //
        // `ins` runs when the snapshot holds no live row. Its update always fires: on a row
        // that turns out to be live (committed by a concurrent transaction after our
        // snapshot) it writes the row's own values back, which locks the newest version and
        // makes RETURNING report it; a plain fallback `SELECT` would read the snapshot and
        // find nothing. On an expired row it installs the new claim.
        claim: table_sql(format!(
            r#"WITH live AS (
    SELECT {RETURNED} FROM "{table}"
    WHERE key = $1 AND expires_at > statement_timestamp()
),
next AS (
    SELECT $4::bigint AS token WHERE NOT EXISTS (SELECT 1 FROM live)
),
ins AS (
    INSERT INTO "{table}" AS cur (key, fingerprint, token, state, expires_at)
    SELECT $1, $2, next.token, 0, statement_timestamp() + $3::bigint * interval '1 millisecond'
    FROM next
    ON CONFLICT (key) DO UPDATE SET
        fingerprint  = CASE WHEN {expired} THEN excluded.fingerprint ELSE cur.fingerprint END,
        token        = CASE WHEN {expired} THEN excluded.token ELSE cur.token END,
        state        = CASE WHEN {expired} THEN 0 ELSE cur.state END,
        status       = CASE WHEN {expired} THEN NULL ELSE cur.status END,
        headers      = CASE WHEN {expired} THEN NULL ELSE cur.headers END,
        body         = CASE WHEN {expired} THEN NULL ELSE cur.body END,
        body_omitted = CASE WHEN {expired} THEN false ELSE cur.body_omitted END,
        watched      = CASE WHEN {expired} THEN false ELSE cur.watched END,
        expires_at   = CASE WHEN {expired} THEN excluded.expires_at ELSE cur.expires_at END
    RETURNING {RETURNED}
)
SELECT * FROM live UNION ALL SELECT * FROM ins"#
        )),
        // A completed live row of the same token is a resend of the completion that landed: it
        // counts as changed (`Current`) and keeps its values.
        // Completion, release and forget notify waiters in other instances (see
        // `notices.rs`) for the row they changed if a waiter marked it; the command tag
        // still counts the rows changed, and forget still returns the row it deleted.
        complete: table_sql(format!(
            r#"WITH done AS (
UPDATE "{table}" SET state = 1,
    status       = CASE WHEN state = 0 THEN $3 ELSE status END,
    headers      = CASE WHEN state = 0 THEN $4 ELSE headers END,
    body         = CASE WHEN state = 0 THEN $5 ELSE body END,
    body_omitted = CASE WHEN state = 0 THEN $6 ELSE body_omitted END,
    expires_at   = CASE WHEN state = 0
        THEN statement_timestamp() + $7::bigint * interval '1 millisecond' ELSE expires_at END
WHERE key = $1 AND token = $2 AND (state = 0 OR expires_at > statement_timestamp())
RETURNING key, watched
)
SELECT {notify}"#
        )),
        renew: table_sql(format!(
            r#"UPDATE "{table}"
SET expires_at = statement_timestamp() + $3::bigint * interval '1 millisecond'
WHERE key = $1 AND token = $2 AND state = 0"#
        )),
        release: table_sql(format!(
            r#"WITH done AS (
DELETE FROM "{table}" WHERE key = $1 AND token = $2 AND state = 0 RETURNING key, watched
)
SELECT {notify}"#
        )),
        get: table_sql(format!(
            r#"SELECT {RETURNED} FROM "{table}"
WHERE key = $1 AND expires_at > statement_timestamp()"#
        )),
        // Deletes one record whatever its state, and returns it.
        forget: table_sql(format!(
            r#"WITH done AS (
DELETE FROM "{table}" WHERE key = $1 RETURNING {RETURNED}, key, watched
)
SELECT done.*, {notify}"#
        )),
        // Batched, skipping rows a claimer holds locked, so purging never blocks requests.
        purge: table_sql(format!(
            r#"DELETE FROM "{table}" WHERE key IN (
    SELECT key FROM "{table}" WHERE expires_at <= statement_timestamp()
    LIMIT {PURGE_BATCH} FOR UPDATE SKIP LOCKED)"#
        )),
        lock: None,
    }
}
