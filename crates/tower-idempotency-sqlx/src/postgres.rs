//! Postgres's SQL for [`PostgresStore`](crate::PostgresStore).

use std::time::Duration;

use sqlx::{postgres::PgPoolOptions, PgPool, Postgres, Row};
use tower_idempotency_core::Settlements;

use crate::{
    backend::{sealed::Sealed, Backend, Engine, Params, Statement, Statements, PURGE_BATCH},
    record::RawRecord,
    settlements::{notify_each, PgNotices},
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

/// Columns every statement that reads a row returns first, in [`Backend::decode`]'s order.
const RETURNED: &str = "token, fingerprint, state, \
     GREATEST(0, CEIL(EXTRACT(EPOCH FROM (expires_at - statement_timestamp())) * 1000))::bigint \
     AS remaining_ms, status, headers, body, body_omitted";

/// `sql` with each run of whitespace as one space. sqlx finds a prepared statement by hashing
/// and comparing its text on every call, so the layout kept above for reading would cost on
/// every statement; none of the statements holds a string literal or comment that this changes.
fn compact(sql: String) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn statements(table: &str) -> Statements {
    readable_statements(table).map(compact)
}

fn readable_statements(table: &str) -> Statements {
    let expired = "cur.expires_at <= statement_timestamp()";
    let notify = notify_each(table, "done");
    Statements {
        insert: format!(
            r#"INSERT INTO "{table}" (key, fingerprint, token, state, expires_at)
VALUES ($1, $2, $4, 0, statement_timestamp() + $3::bigint * interval '1 millisecond')
ON CONFLICT (key) DO NOTHING"#
        ),
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
        claim: format!(
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
        ),
        // A completed live row of the same token is a resend of the completion that landed: it
        // counts as changed (`Current`) and keeps its values.
        // Completion, release and forget notify waiters in other instances (see
        // `settlements.rs`) for the row they changed if a waiter marked it; the command tag
        // still counts the rows changed, and forget still returns the row it deleted.
        complete: format!(
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
        ),
        renew: format!(
            r#"UPDATE "{table}"
SET expires_at = statement_timestamp() + $3::bigint * interval '1 millisecond'
WHERE key = $1 AND token = $2 AND state = 0"#
        ),
        release: format!(
            r#"WITH done AS (
DELETE FROM "{table}" WHERE key = $1 AND token = $2 AND state = 0 RETURNING key, watched
)
SELECT {notify}"#
        ),
        get: format!(
            r#"SELECT {RETURNED} FROM "{table}"
WHERE key = $1 AND expires_at > statement_timestamp()"#
        ),
        // Deletes one record whatever its state, and returns it.
        forget: format!(
            r#"WITH done AS (
DELETE FROM "{table}" WHERE key = $1 RETURNING {RETURNED}, key, watched
)
SELECT done.*, {notify}"#
        ),
        // Batched, skipping rows a claimer holds locked, so purging never blocks requests.
        purge: format!(
            r#"DELETE FROM "{table}" WHERE key IN (
    SELECT key FROM "{table}" WHERE expires_at <= statement_timestamp()
    LIMIT {PURGE_BATCH} FOR UPDATE SKIP LOCKED)"#
        ),
    }
}

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

    fn bind<'q>(sql: &'q str, _now: i64, params: Params<'q>) -> Statement<'q, Self> {
        // Rows are dated by the database's clock (`statement_timestamp()`), so application
        // hosts need no synchronised clocks; the store's clock is not bound.
        let query = sqlx::query(sql);
        match params {
            Params::Claim {
                key,
                fingerprint,
                token,
                lease_ms,
            } => query.bind(key).bind(fingerprint).bind(lease_ms).bind(token),
            Params::Complete {
                key,
                token,
                status,
                headers,
                body,
                body_omitted,
                ttl_ms,
            } => query
                .bind(key)
                .bind(token)
                .bind(status as i16)
                .bind(headers)
                .bind(body)
                .bind(body_omitted)
                .bind(ttl_ms),
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

    /// By position ([`RETURNED`] leads every row that is decoded): a column found by name is a
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

    /// 10 connections, 5 s acquire timeout.
    async fn connect_pool(url: &str) -> Result<PgPool, sqlx::Error> {
        PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(5))
            .connect(url)
            .await
    }

    /// Its notices of settled keys: every statement runs on the lanes, rows are dated by the
    /// database.
    type Engine = PgNotices;

    fn engine(pool: &PgPool, table: &str) -> PgNotices {
        PgNotices::new(pool, table)
    }
}

impl Engine for PgNotices {
    fn settlements(&self) -> Option<Settlements> {
        Some(self.settlements())
    }
}
