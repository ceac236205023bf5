//! Audit: every state-changing operator call (a retry, discard, purge, replay, pause or resume,
//! from a page, the JSON routes or the CLI) is logged with `tracing` (target
//! [`AUDIT_TARGET`], level `INFO`) and stored in a table beside the job table
//! (`{table}_audit`, [`Driver::audit_schema`]): when, who, what, on which jobs, and how many rows
//! it changed. A dry run changes nothing and is not recorded.
//!
//! "Who" is the [`Operator`](crate::admin::Operator) of the request: what the caller's own
//! authentication names, through [`admin::operator`](crate::admin::operator) and the user's
//! extractor; the CLI records `cli:` and the operating-system user, or its `--operator`.
//!
//! The entry is written after the change, on its own: a change whose entry could not be
//! stored is still logged, with the storing error.

use serde::Serialize;

use crate::{Dialect, Driver, Prepared, Table};

/// The `tracing` target of the audit's log lines.
pub const AUDIT_TARGET: &str = "tower_idempotency::audit";

/// The entries a listing shows unless told otherwise.
pub const DEFAULT_AUDIT_LIMIT: u32 = 20;

/// What an operator did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AuditAction {
    /// Re-queued one failed job.
    Retry,
    /// Re-queued the failed jobs a filter matched.
    BulkRetry,
    /// Gave one job up.
    Discard,
    /// Deleted finished jobs past an age.
    Purge,
    /// Ran one finished job again.
    Replay,
    /// Ran the finished jobs a filter matched again.
    BulkReplay,
    /// Paused a scope's jobs.
    Pause,
    /// Resumed a paused scope.
    Resume,
}

impl AuditAction {
    /// Every action, in the order of their codes.
    pub const ALL: [Self; 8] = [
        Self::Retry,
        Self::BulkRetry,
        Self::Discard,
        Self::Purge,
        Self::Replay,
        Self::BulkReplay,
        Self::Pause,
        Self::Resume,
    ];

    /// The stored name (`retry`, `bulk_retry`, `discard`, `purge`, `replay`, `bulk_replay`,
    /// `pause`, `resume`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::BulkRetry => "bulk_retry",
            Self::Discard => "discard",
            Self::Purge => "purge",
            Self::Replay => "replay",
            Self::BulkReplay => "bulk_replay",
            Self::Pause => "pause",
            Self::Resume => "resume",
        }
    }

    /// The action of a stored name.
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|action| action.as_str() == name)
    }
}

/// One recorded operator call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct AuditEntry {
    /// When, unix ms.
    pub at_ms: i64,
    /// Who ([`Operator`](crate::admin::Operator)).
    pub who: String,
    /// What (an unknown stored name, from a newer version, reads `None`).
    pub action: Option<AuditAction>,
    /// On which jobs: a key (`stripe/evt_1`), a filter (`provider=stripe type=charge.failed`),
    /// an age or a scope, as the half writes it.
    pub target: String,
    /// How many rows it changed.
    pub changed: u64,
}

impl AuditEntry {
    /// An entry of now: `who` did `action` on `target`, changing `changed` rows.
    pub fn now(
        who: impl Into<String>,
        action: AuditAction,
        target: impl Into<String>,
        changed: u64,
    ) -> Self {
        Self {
            at_ms: crate::time::now_ms(),
            who: crate::bounded(who.into()),
            action: Some(action),
            target: crate::bounded(target.into()),
            changed,
        }
    }

    /// The stored name of its action (`unknown` for one this version does not know).
    pub fn action_name(&self) -> &'static str {
        self.action.map_or("unknown", AuditAction::as_str)
    }
}

/// An audit row as the statements read it.
pub(crate) type AuditRow = (i64, String, String, String, i64);

impl From<AuditRow> for AuditEntry {
    fn from((at_ms, who, action, target, changed): AuditRow) -> Self {
        Self {
            at_ms,
            who,
            action: AuditAction::named(&action),
            target,
            changed: u64::try_from(changed).unwrap_or(0),
        }
    }
}

/// The audit's statements of one job table.
#[derive(Debug)]
pub struct AuditStatements {
    pub(crate) insert: Prepared,
    pub(crate) list: Prepared,
}

impl AuditStatements {
    /// The statements over `table`'s audit table in `dialect`.
    pub(crate) fn new(table: &Table, dialect: Dialect) -> Self {
        let sql = |text: String| Prepared::new(text, dialect.placeholders);
        let t = audit_table(table);
        Self {
            insert: sql(format!(
                "INSERT INTO {t} (at, who, action, target, changed) VALUES ($1, $2, $3, $4, $5)"
            )),
            list: sql(format!(
                "SELECT at, who, action, target, changed FROM {t} ORDER BY seq DESC LIMIT $1"
            )),
        }
    }
}

/// The name of `table`'s audit table: `{table}_audit`.
pub fn audit_table(table: &Table) -> String {
    format!("{}_audit", table.name)
}

/// The DDL of `table`'s audit table on `DB`.
pub(crate) fn schema<DB: Driver>(table: &Table) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} ({}, {});\n",
        audit_table(table),
        DB::HISTORY_SEQ,
        DB::AUDIT_COLUMNS,
    )
}

/// Logs `entry` (target [`AUDIT_TARGET`]) and stores it in the audit table of `sql`'s table;
/// a failure to store is logged beside it and answered.
pub async fn record<DB: Driver>(
    pool: &sqlx::Pool<DB>,
    sql: &crate::Statements,
    entry: &AuditEntry,
) -> sqlx::Result<()> {
    let table = sql.table().name();
    tracing::info!(
        target: AUDIT_TARGET,
        table,
        who = %entry.who,
        action = entry.action_name(),
        target = %entry.target,
        changed = entry.changed,
        "operator change"
    );
    let stored = DB::record_audit(pool, sql, entry).await;
    if let Err(error) = &stored {
        tracing::error!(target: AUDIT_TARGET, table, %error, "storing an audit entry failed");
    }
    stored
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_action_reads_back_from_its_name() {
        for action in AuditAction::ALL {
            assert_eq!(AuditAction::named(action.as_str()), Some(action));
        }
        assert_eq!(AuditAction::named("explode"), None);
    }

    #[test]
    fn an_unknown_stored_action_reads_as_none() {
        let entry = AuditEntry::from((1, "a".into(), "explode".into(), "t".into(), 2));
        assert_eq!(entry.action, None);
        assert_eq!(entry.action_name(), "unknown");
    }
}
