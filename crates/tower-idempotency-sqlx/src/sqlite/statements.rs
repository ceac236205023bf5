//! SQLite's SQL: the DDL, the statements, their parameters, and rows as rusqlite reads them.

use std::borrow::Cow;

use crate::store::{
    backend::{Statements, PURGE_BATCH},
    record::{Params, RawRecord},
};
use crate::table_sql;

/// The DDL [`SqliteStore::migrate`](crate::SqlStore::migrate) runs, for teams that run their
/// own migrations.
///
/// `table` must pass [`validate_table_name`](crate::validate_table_name); this function does not
/// check it. `expires_at` is in unix milliseconds.
pub fn schema_sql(table: &str) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS "{table}" (
    key          TEXT PRIMARY KEY NOT NULL,
    fingerprint  BLOB NOT NULL,
    token        INTEGER NOT NULL,
    state        INTEGER NOT NULL CHECK (state IN (0, 1)),
    expires_at   INTEGER NOT NULL,
    status       INTEGER,
    headers      BLOB,
    body         BLOB,
    body_omitted INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS "{table}_expires_at_idx" ON "{table}" (expires_at);
"#
    )
}

const RETURNED: &str = "token, fingerprint, state, expires_at, status, headers, body, body_omitted";

pub(crate) fn statements(table: &str) -> Statements {
    // ?1 key, ?2 fingerprint, ?3 new token, ?4 now (unix ms), ?5 lease end (unix ms).
    let expired = "expires_at <= ?4";
    Statements {
        insert: table_sql(format!(
            r#"INSERT INTO "{table}" (key, fingerprint, token, state, expires_at)
VALUES (?1, ?2, ?3, 0, ?5) ON CONFLICT (key) DO NOTHING"#
        )),
        // One statement, like the Postgres claim: the update always fires so RETURNING
        // reports the existing row to a duplicate. Rewriting a live row with its own values
        // is cheap in SQLite: pages whose content is unchanged are not written.
        claim: table_sql(format!(
            r#"INSERT INTO "{table}" (key, fingerprint, token, state, expires_at)
VALUES (?1, ?2, ?3, 0, ?5)
ON CONFLICT (key) DO UPDATE SET
    fingerprint  = CASE WHEN {expired} THEN excluded.fingerprint ELSE fingerprint END,
    token        = CASE WHEN {expired} THEN excluded.token ELSE token END,
    state        = CASE WHEN {expired} THEN 0 ELSE state END,
    status       = CASE WHEN {expired} THEN NULL ELSE status END,
    headers      = CASE WHEN {expired} THEN NULL ELSE headers END,
    body         = CASE WHEN {expired} THEN NULL ELSE body END,
    body_omitted = CASE WHEN {expired} THEN 0 ELSE body_omitted END,
    expires_at   = CASE WHEN {expired} THEN excluded.expires_at ELSE expires_at END
RETURNING {RETURNED}"#
        )),
        // A completed row of the same token is a resend of the completion that landed: it
        // counts as changed (`Current`) and keeps its values.
        complete: table_sql(format!(
            r#"UPDATE "{table}" SET state = 1,
    status       = CASE WHEN state = 0 THEN ?3 ELSE status END,
    headers      = CASE WHEN state = 0 THEN ?4 ELSE headers END,
    body         = CASE WHEN state = 0 THEN ?5 ELSE body END,
    body_omitted = CASE WHEN state = 0 THEN ?6 ELSE body_omitted END,
    expires_at   = CASE WHEN state = 0 THEN ?7 ELSE expires_at END
WHERE key = ?1 AND token = ?2"#
        )),
        renew: table_sql(format!(
            r#"UPDATE "{table}" SET expires_at = ?3 WHERE key = ?1 AND token = ?2 AND state = 0"#
        )),
        release: table_sql(format!(
            r#"DELETE FROM "{table}" WHERE key = ?1 AND token = ?2 AND state = 0"#
        )),
        get: table_sql(format!(
            r#"SELECT {RETURNED} FROM "{table}" WHERE key = ?1 AND expires_at > ?2"#
        )),
        // Deletes one record whatever its state, and returns it.
        forget: table_sql(format!(
            r#"DELETE FROM "{table}" WHERE key = ?1 RETURNING {RETURNED}"#
        )),
        purge: table_sql(format!(
            r#"DELETE FROM "{table}" WHERE rowid IN (
    SELECT rowid FROM "{table}" WHERE expires_at <= ?1 LIMIT {PURGE_BATCH})"#
        )),
        lock: None,
    }
}

/// A small integer column (`state`, `status`), which SQLite stores as `i64`, as a
/// [`RawRecord`] holds it: out-of-range values become -1, which decoding reports as corrupt.
pub(crate) fn narrow(value: i64) -> i16 {
    i16::try_from(value).unwrap_or(-1)
}

/// A statement parameter as SQLite takes it, for either driver that runs the store's statements:
/// sqlx (the lanes, callers' transactions) and rusqlite (the writer thread).
#[derive(Debug)]
pub(crate) enum Value<'q> {
    Int(i64),
    Text(Cow<'q, str>),
    Blob(Cow<'q, [u8]>),
}

impl Value<'_> {
    /// The value with its text or bytes copied, to outlive the parameters it came from.
    fn into_owned(self) -> Value<'static> {
        match self {
            Value::Int(value) => Value::Int(value),
            Value::Text(value) => Value::Text(Cow::Owned(value.into_owned())),
            Value::Blob(value) => Value::Blob(Cow::Owned(value.into_owned())),
        }
    }
}

/// `params` in the order the statement numbers them (`?1`, `?2`, ..). Rows are dated by the
/// store's clock, `now` (unix ms): `expires_at` is an absolute time.
pub(crate) fn values<'q>(now: i64, params: Params<'q>) -> Vec<Value<'q>> {
    let text = |value: &'q str| Value::Text(Cow::Borrowed(value));
    let blob = |value: &'q [u8]| Value::Blob(Cow::Borrowed(value));
    let until = |ms: i64| Value::Int(now.saturating_add(ms));
    match params {
        Params::Claim(claim) => vec![
            text(claim.key),
            blob(claim.fingerprint),
            Value::Int(claim.token),
            Value::Int(now),
            until(claim.lease_ms),
        ],
        Params::Complete(complete) => vec![
            text(complete.key),
            Value::Int(complete.token),
            Value::Int(i64::from(complete.status)),
            Value::Blob(Cow::Owned(complete.headers)),
            blob(complete.body),
            Value::Int(i64::from(complete.body_omitted)),
            until(complete.ttl_ms),
        ],
        Params::Renew {
            key,
            token,
            lease_ms,
        } => vec![text(key), Value::Int(token), until(lease_ms)],
        Params::Release { key, token } => vec![text(key), Value::Int(token)],
        Params::Get { key } => vec![text(key), Value::Int(now)],
        Params::Forget { key } => vec![text(key)],
        Params::Purge => vec![Value::Int(now)],
    }
}

/// [`values`] copied, for the writer thread, which they must outlive the caller to reach.
pub(crate) fn owned_values(now: i64, params: Params<'_>) -> Vec<Value<'static>> {
    values(now, params)
        .into_iter()
        .map(Value::into_owned)
        .collect()
}

/// A row of the [`RETURNED`] columns, in their order, as rusqlite reads it (the writer's claim
/// and forget, the inline reads); `now` is the time the statement was bound with.
pub(crate) fn decode_rusqlite(row: &rusqlite::Row<'_>, now: i64) -> rusqlite::Result<RawRecord> {
    let expires_at: i64 = row.get(3)?;
    let status: Option<i64> = row.get(4)?;
    Ok(RawRecord {
        token: row.get(0)?,
        fingerprint: row.get(1)?,
        state: narrow(row.get(2)?),
        remaining_ms: expires_at.saturating_sub(now),
        status: status.map(narrow),
        headers: row.get(5)?,
        body: row.get(6)?,
        body_omitted: row.get(7)?,
    })
}
