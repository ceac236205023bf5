//! MySQL's and MariaDB's SQL: the DDL and the statements, the same text on both servers.
//!
//! - No `RETURNING` (MySQL has none): the claim statement and `forget` are followed, or
//!   preceded, by [`Statements::lock`], a locking read of the row, in one transaction (see
//!   `Backend::fetch_row` in `mod.rs`).
//! - No `VALUES()` in `ON DUPLICATE KEY UPDATE` (deprecated on MySQL 8.0.20+) and no row alias
//!   (`AS new`, which MariaDB lacks): the upsert binds its values a second time.
//! - The database's clock: `UTC_TIMESTAMP(6)`, read once per statement and independent of the
//!   session's `time_zone`; durations are bound in microseconds.
//! - MySQL evaluates `SET` assignments left to right, each seeing the ones before it: columns
//!   that are tested (`expires_at`, `state`) are assigned last.
//! - Every write bumps `revision`, so a statement's count of affected rows is the same whether
//!   the connection reports matched rows (`CLIENT_FOUND_ROWS`, sqlx's default) or changed rows:
//!   every matched row is changed, and an upsert that finds the key reports 2, never 1.

use crate::{
    store::backend::{Statements, PURGE_BATCH},
    table_sql,
};

/// The longest key the table holds: its primary key is a `VARBINARY(1024)` (a scoped key is
/// at most 255 bytes of namespace and 65 of digest).
pub(crate) const MAX_KEY_BYTES: usize = 1024;

/// The DDL [`MySqlStore::migrate`](crate::SqlStore::migrate) runs, for teams that run their own
/// migrations.
///
/// `table` must pass [`validate_table_name`](crate::validate_table_name); this function does not
/// check it. Creates the InnoDB table with its index on `expires_at` (for purging) in one
/// statement, which runs on MySQL 8.0+ and MariaDB 10.6+ (MySQL has no
/// `CREATE INDEX IF NOT EXISTS`). Keys are `VARBINARY`, compared byte by byte.
pub fn schema_sql(table: &str) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS `{table}` (
    `key`        VARBINARY({MAX_KEY_BYTES}) NOT NULL,
    fingerprint  VARBINARY(64) NOT NULL,
    token        BIGINT NOT NULL,
    state        SMALLINT NOT NULL CHECK (state IN (0, 1)),
    expires_at   DATETIME(6) NOT NULL,
    status       SMALLINT NULL,
    headers      LONGBLOB NULL,
    body         LONGBLOB NULL,
    body_omitted BOOLEAN NOT NULL DEFAULT FALSE,
    revision     BIGINT UNSIGNED NOT NULL DEFAULT 0,
    PRIMARY KEY (`key`),
    INDEX `{table}_expires_at_idx` (expires_at)
) ENGINE = InnoDB"#
    )
}

/// The database's time, read once per statement.
const NOW: &str = "UTC_TIMESTAMP(6)";

/// Columns every statement that reads a row returns, in
/// [`Backend::decode`](crate::Backend::decode)'s order.
fn returned() -> String {
    format!(
        "token, fingerprint, state, \
         CAST(GREATEST(0, CEIL(TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at) / 1000)) AS SIGNED) \
         AS remaining_ms, status, headers, body, body_omitted"
    )
}

/// `sql` with each run of whitespace as one space (sqlx finds a prepared statement by its
/// text); none of the statements holds a string literal that this changes.
fn compact(sql: String) -> sqlx::SqlStr {
    table_sql(sql.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The statements on `table`. Parameters are positional (`?`), bound in the order they
/// appear: see `bind` in `mod.rs`.
pub(crate) fn statements(table: &str) -> Statements {
    let returned = returned();
    let expired = format!("expires_at <= {NOW}");
    let lease_end = format!("{NOW} + INTERVAL ? MICROSECOND");
    Statements {
        // key, fingerprint, token, lease. A key with a row is left as it is (its revision
        // bumped, so the count of affected rows is 2).
        insert: compact(format!(
            r#"INSERT INTO `{table}` (`key`, fingerprint, token, state, expires_at)
VALUES (?, ?, ?, 0, {lease_end})
ON DUPLICATE KEY UPDATE revision = revision + 1"#
        )),
        // key, fingerprint, token, lease, then fingerprint, token, lease again for the update.
        // Installs the claim on a key without a row or with an expired one, leaves a live row
        // as it is; the row lock it takes is held until `lock` has read the row back.
        claim: compact(format!(
            r#"INSERT INTO `{table}` (`key`, fingerprint, token, state, expires_at)
VALUES (?, ?, ?, 0, {lease_end})
ON DUPLICATE KEY UPDATE
    fingerprint  = IF({expired}, ?, fingerprint),
    token        = IF({expired}, ?, token),
    status       = IF({expired}, NULL, status),
    headers      = IF({expired}, NULL, headers),
    body         = IF({expired}, NULL, body),
    body_omitted = IF({expired}, FALSE, body_omitted),
    state        = IF({expired}, 0, state),
    revision     = revision + 1,
    expires_at   = IF({expired}, {lease_end}, expires_at)"#
        )),
        // status, headers, body, body_omitted, ttl, key, token. A completed live row of the
        // same token is a resend of the completion that landed: it counts as changed
        // (`Current`) and keeps its values.
        complete: compact(format!(
            r#"UPDATE `{table}` SET
    status       = IF(state = 0, ?, status),
    headers      = IF(state = 0, ?, headers),
    body         = IF(state = 0, ?, body),
    body_omitted = IF(state = 0, ?, body_omitted),
    expires_at   = IF(state = 0, {lease_end}, expires_at),
    state        = 1,
    revision     = revision + 1
WHERE `key` = ? AND token = ? AND (state = 0 OR expires_at > {NOW})"#
        )),
        // lease, key, token.
        renew: compact(format!(
            r#"UPDATE `{table}` SET expires_at = {lease_end}, revision = revision + 1
WHERE `key` = ? AND token = ? AND state = 0"#
        )),
        // key, token.
        release: compact(format!(
            r#"DELETE FROM `{table}` WHERE `key` = ? AND token = ? AND state = 0"#
        )),
        // key. A consistent (non-locking) read.
        get: compact(format!(
            r#"SELECT {returned} FROM `{table}` WHERE `key` = ? AND expires_at > {NOW}"#
        )),
        // key. Deletes one record whatever its state, after `lock` read it.
        forget: compact(format!(r#"DELETE FROM `{table}` WHERE `key` = ?"#)),
        // Batched. MySQL has no `LIMIT` in an `IN` subquery, so `SKIP LOCKED` cannot pick the
        // rows: a row a transaction holds may be waited for (up to the lock wait timeout).
        purge: compact(format!(
            r#"DELETE FROM `{table}` WHERE expires_at <= {NOW}
ORDER BY expires_at LIMIT {PURGE_BATCH}"#
        )),
        // key. The newest committed row (a locking read), whatever its state.
        lock: Some(compact(format!(
            r#"SELECT {returned} FROM `{table}` WHERE `key` = ? FOR UPDATE"#
        ))),
    }
}
