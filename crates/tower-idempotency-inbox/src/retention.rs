//! Retention: processed events are deleted in bounded batches once they are older than the
//! retention, except while their authenticator still has to refuse a replay; and the statements
//! behind the state and lag gauges, which read only the open (pending and failed) rows.
//!
//! An authenticator (what authenticated a delivery whose event id the signature does not cover:
//! GitHub, Shopify, Linear, Mailgun) lives in the event's row, under the unique
//! `(provider, authenticator)` index that refuses a captured delivery re-sent under a new id.
//! The acknowledgement stores with it `authenticator_until`, the end of its provider's retry
//! horizon (the verifier's [`default_ttl`](tower_idempotency_webhooks::Verifier::default_ttl),
//! at least twice its replay window); a purge never deletes a row before that time, whatever
//! the retention. The row stays whole rather than leaving its authenticator in a table of its
//! own, so the refusal stays one unique index checked by the acknowledgement's single insert:
//! a second table would need a second statement, or a check that a concurrent purge could
//! pass between.
//!
//! **Positions.** Under [`OrderingPolicy::SkipStale`](crate::OrderingPolicy::SkipStale) an
//! event is stale when a processed event of its object is newer. The purge keeps that
//! knowledge when it deletes the processed rows: the newest position (event time and id) of each
//! object among a batch's processed rows moves to `<table>_positions` in the same statement
//! (Postgres) or transaction (SQLite) that deletes them, so the stale check, which reads the
//! table and the positions in one statement, always finds it in one or the other. Writing it
//! there rather than at each event's completion costs the worker's commits nothing. A position
//! is purged on its own bound: once it was written longer ago than the retention (so an
//! object's newest position is known for at least twice the retention after its event was
//! processed; the default week is longer than every built-in provider's retry horizon) and its
//! object has no pending or failed event left, which an operator's retry could still run.

use std::time::Duration;

use tower_idempotency_jobs::Prepared;

use crate::dialect::Db;

use crate::{
    event::{duration_ms, now_ms},
    EventState, Inbox, InboxDatabase, InboxError,
};

/// How long processed events are kept, unless configured otherwise: a week, longer than every
/// built-in provider's retry horizon.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 60 * 60);
/// Events one purge statement deletes at most, unless configured otherwise.
pub const DEFAULT_PURGE_BATCH: u32 = 1000;
/// How often a worker purges, unless configured otherwise.
pub const DEFAULT_PURGE_EVERY: Duration = Duration::from_secs(60);

/// One state's and provider's events that are open (pending or failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenGroup {
    pub state: EventState,
    pub provider: String,
    pub count: u64,
    /// The oldest `received_at` of the group, unix ms.
    pub oldest_received_at: i64,
}

/// The statements of the gauges and the retention, and the indexes that serve them.
#[derive(Debug)]
pub(crate) struct QueueSql {
    /// DDL appended to the table's.
    pub(crate) schema: String,
    pub(crate) open_groups: Prepared,
    /// Postgres: deletes a batch of finished events and moves the newest processed position of
    /// each object among them to the positions table, in one statement; answers the count.
    /// SQLite: deletes the batch and answers each deleted row's state and position. MySQL:
    /// picks and locks the batch, answering each row's key, state and position.
    pub(crate) purge_batch: Prepared,
    /// MySQL: deletes the picked rows, bound as two JSON arrays (providers, event ids).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) purge_picked: Option<Prepared>,
    /// SQLite and MySQL: records one object's position (`$1` provider, `$2` key, `$3` time,
    /// `$4` event id, `$5` now), keeping the newer one.
    #[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
    pub(crate) keep_position: Prepared,
    /// Deletes up to `$2` positions written before `$1` whose object has no pending or failed
    /// event.
    pub(crate) purge_positions: Prepared,
}

/// How the positions table keeps the newer of two positions of one object.
const NEWER_POSITION: &str = "ON CONFLICT (provider, order_key) DO UPDATE SET \
     updated_at = excluded.updated_at, \
     event_id = CASE WHEN excluded.event_time > p.event_time \
     THEN excluded.event_id ELSE p.event_id END, \
     event_time = CASE WHEN excluded.event_time > p.event_time \
     THEN excluded.event_time ELSE p.event_time END";

impl QueueSql {
    /// `lock` ends a purge's selection; `text` is the type of the positions table's text
    /// columns.
    fn new(table: &str, lock: &str, text: &str, db: Db) -> Self {
        let sql = |text: String| Prepared::new(text, db.placeholders());
        let finished = format!(
            "SELECT provider, event_id FROM {table} \
             WHERE state IN (1, 3) AND finished_at < $1 \
             AND (authenticator_until IS NULL OR authenticator_until <= $2) \
             ORDER BY finished_at LIMIT $3{lock}"
        );
        let doomed = format!("DELETE FROM {table} WHERE (provider, event_id) IN ({finished})");
        let positions = format!("{table}_positions");
        let stale_position = |p: &str| {
            format!(
                "updated_at < $1 \
                 AND NOT EXISTS (SELECT 1 FROM {table} e WHERE e.provider = {p}.provider \
                 AND e.order_key = {p}.order_key AND e.state IN (0, 2))"
            )
        };
        if db == Db::MySql {
            // No `RETURNING`, no `LIMIT` in an `IN` subquery, no `excluded`: the batch is
            // picked and locked, then deleted by key; a position is upserted with its values
            // bound again (`event_id` assigned before the `event_time` it compares).
            let batch = "SELECT p.v AS provider, e.v AS event_id FROM \
                 JSON_TABLE($1, '$[*]' COLUMNS (n FOR ORDINALITY, v TEXT PATH '$')) AS p JOIN \
                 JSON_TABLE($2, '$[*]' COLUMNS (n FOR ORDINALITY, v TEXT PATH '$')) AS e \
                 ON e.n = p.n";
            return Self {
                schema: format!(
                    "CREATE TABLE IF NOT EXISTS {positions} (\n\
                     provider {text} NOT NULL,\n\
                     order_key {text} NOT NULL,\n\
                     event_time BIGINT NOT NULL,\n\
                     event_id {text} NOT NULL,\n\
                     updated_at BIGINT NOT NULL,\n\
                     PRIMARY KEY (provider, order_key),\n\
                     INDEX {table}_pos_idx (updated_at)) ENGINE = InnoDB;\n"
                ),
                open_groups: sql(open_groups(table)),
                purge_batch: sql(finished.replace(
                    "SELECT provider, event_id FROM",
                    "SELECT provider, event_id, state, order_key, event_time FROM",
                )),
                purge_picked: Some(sql(format!(
                    "DELETE {table} FROM {table} JOIN ({batch}) AS b \
                     ON {table}.provider = b.provider AND {table}.event_id = b.event_id"
                ))),
                keep_position: sql(format!(
                    "INSERT INTO {positions} \
                     (provider, order_key, event_time, event_id, updated_at) \
                     VALUES ($1, $2, $3, $4, $5) ON DUPLICATE KEY UPDATE updated_at = $5, \
                     event_id = CASE WHEN $3 > event_time THEN $4 ELSE event_id END, \
                     event_time = CASE WHEN $3 > event_time THEN $3 ELSE event_time END"
                )),
                purge_positions: sql(format!(
                    "DELETE FROM {positions} WHERE {} ORDER BY updated_at LIMIT $2",
                    stale_position(&positions)
                )),
            };
        }
        let purge_batch = if db == Db::Postgres {
            // One statement: the rows and the positions they carry change together. DISTINCT
            // ON: an upsert may not touch one row twice.
            format!(
                "WITH doomed AS ({doomed} \
                 RETURNING provider, event_id, state, order_key, event_time), \
                 newest AS (SELECT DISTINCT ON (provider, order_key) \
                 provider, order_key, event_time, event_id FROM doomed \
                 WHERE state = 1 AND order_key IS NOT NULL AND event_time IS NOT NULL \
                 ORDER BY provider, order_key, event_time DESC, event_id DESC), \
                 kept AS (INSERT INTO {positions} AS p \
                 (provider, order_key, event_time, event_id, updated_at) \
                 SELECT provider, order_key, event_time, event_id, $2 FROM newest \
                 {NEWER_POSITION}) \
                 SELECT count(*) FROM doomed"
            )
        } else {
            format!("{doomed} RETURNING provider, event_id, state, order_key, event_time")
        };
        Self {
            // The gauges read the first, which holds only open (pending and failed) rows, without
            // the table; the purge walks the finished (processed and skipped) rows of the second.
            // The positions table holds the newest processed position of each object whose
            // processed events were purged (see `Inbox::purge_batch`).
            schema: format!(
                "CREATE INDEX IF NOT EXISTS {table}_open_idx ON {table} \
                 (state, provider, received_at) WHERE state IN (0, 2);\n\
                 CREATE INDEX IF NOT EXISTS {table}_finished_idx ON {table} (state, finished_at);\n\
                 CREATE TABLE IF NOT EXISTS {positions} (\n\
                 provider {text} NOT NULL,\n\
                 order_key {text} NOT NULL,\n\
                 event_time bigint NOT NULL,\n\
                 event_id {text} NOT NULL,\n\
                 updated_at bigint NOT NULL,\n\
                 PRIMARY KEY (provider, order_key));\n\
                 CREATE INDEX IF NOT EXISTS {table}_pos_idx ON {positions} (updated_at);\n"
            ),
            open_groups: sql(open_groups(table)),
            purge_batch: sql(purge_batch),
            purge_picked: None,
            keep_position: sql(format!(
                "INSERT INTO {positions} AS p \
                 (provider, order_key, event_time, event_id, updated_at) \
                 VALUES ($1, $2, $3, $4, $5) {NEWER_POSITION}"
            )),
            purge_positions: sql(format!(
                "DELETE FROM {positions} WHERE (provider, order_key) IN (\
                 SELECT provider, order_key FROM {positions} p WHERE {} \
                 ORDER BY updated_at LIMIT $2{lock})",
                stale_position("p")
            )),
        }
    }

    /// Several instances purge side by side: a batch skips the rows another one is deleting.
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(table: &str) -> Self {
        Self::new(
            table,
            " FOR UPDATE SKIP LOCKED",
            "text COLLATE \"C\"",
            Db::Postgres,
        )
    }

    #[cfg(feature = "sqlite")]
    pub(crate) fn sqlite(table: &str) -> Self {
        Self::new(table, "", "TEXT", Db::Sqlite)
    }

    /// As on Postgres, a batch skips the rows another instance's purge is deleting. The
    /// table's own indexes are declared in its `CREATE TABLE` (`backend.rs`).
    #[cfg(feature = "mysql")]
    pub(crate) fn mysql(table: &str) -> Self {
        Self::new(
            table,
            " FOR UPDATE SKIP LOCKED",
            crate::dialect::MYSQL_KEY,
            Db::MySql,
        )
    }
}

/// The gauges' statement: the open (pending and failed) rows by state and provider.
fn open_groups(table: &str) -> String {
    format!(
        "SELECT state, provider, count(*), min(received_at) FROM {table} \
         WHERE state IN (0, 2) GROUP BY state, provider"
    )
}

impl<DB: InboxDatabase> Inbox<DB> {
    /// Deletes up to `limit` events processed more than `retention` ago, oldest first, in one
    /// statement; answers how many. A row carrying an authenticator is kept until its provider's
    /// retry horizon has passed too (see [docs/inbox.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/inbox.md#retention)).
    /// The newest processed position of each ordered object among them is kept in
    /// `<table>_positions`, so an older event of it stays stale; up to `limit` positions
    /// written more than `retention` ago whose object has no pending or failed event are
    /// deleted (docs/inbox.md, "Retention").
    /// A running worker calls it in turn ([`WorkerBuilder::retention`](crate::WorkerBuilder::retention)).
    pub async fn purge_batch(&self, retention: Duration, limit: u32) -> Result<u64, InboxError> {
        let now = now_ms();
        let before = now.saturating_sub(duration_ms(retention));
        Ok(DB::purge_batch(&self.pool, &self.sql, before, now, i64::from(limit)).await?)
    }
}

/// A worker's retention settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Retention {
    pub(crate) after: Duration,
    pub(crate) batch: u32,
    pub(crate) every: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            after: DEFAULT_RETENTION,
            batch: DEFAULT_PURGE_BATCH,
            every: DEFAULT_PURGE_EVERY,
        }
    }
}

impl Retention {
    /// Every `every`, purges batch after batch until one is not full; runs until dropped.
    pub(crate) async fn run<DB: InboxDatabase>(self, inbox: Inbox<DB>) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            loop {
                match inbox.purge_batch(self.after, self.batch).await {
                    Ok(purged) => {
                        crate::metrics::purged(purged);
                        if purged < u64::from(self.batch) {
                            if let Err(error) = inbox.purge_orphan_attempts(self.batch).await {
                                tracing::warn!(%error, "purging the history of purged inbox events failed; retrying at the next round");
                            }
                            break;
                        }
                        // Others (acknowledgements, claims) may take the database between
                        // batches.
                        tokio::task::yield_now().await;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "purging processed inbox events failed; retrying at the next round");
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The plans of the gauges', the purge's and the claims' statements on a table of many
    //! processed rows, or of a backlog of pending ones: none reads the table, or its pending
    //! rows, from end to end.

    use super::*;
    use tower_idempotency_jobs::Statement;

    const PROCESSED: i64 = 20_000;

    /// The state of the `i`-th row [`fill`] writes: processed, but for a few pending and failed.
    const MOSTLY_PROCESSED: &str =
        "CASE WHEN i % 5000 = 0 THEN 0 WHEN i % 5000 = 1 THEN 2 ELSE 1 END";

    /// Fills `table` with [`PROCESSED`] rows in the `state` the SQL expression gives the `i`-th.
    fn fill(table: &str, body: &str, state: &str) -> String {
        format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {PROCESSED}) \
             INSERT INTO {table} (provider, event_id, headers, body, received_at, state, \
             available_at, finished_at) \
             SELECT 'stripe', 'evt_' || i, '[]', {body}, i, {state}, i, i FROM n"
        )
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn sqlite_plans_use_the_indexes() {
        use sqlx::Executor;
        // One connection: each connection to `:memory:` is a database of its own.
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        let inbox = Inbox::new(pool.clone(), "plans").unwrap();
        inbox.migrate().await.unwrap();
        pool.execute(sqlx::AssertSqlSafe(fill(
            "plans",
            "x'7b7d'",
            MOSTLY_PROCESSED,
        )))
        .await
        .unwrap();
        let plan = |statement: sqlx::SqlStr, binds: usize| {
            let pool = pool.clone();
            async move {
                let explain = format!("EXPLAIN QUERY PLAN {}", statement.as_str());
                let mut query = sqlx::query_as(sqlx::AssertSqlSafe(&*explain));
                for _ in 0..binds {
                    query = query.bind(0_i64);
                }
                let rows: Vec<(i64, i64, i64, String)> = query.fetch_all(&pool).await.unwrap();
                rows.into_iter()
                    .map(|row| row.3)
                    .collect::<Vec<_>>()
                    .join("\n")
            }
        };
        let gauges = plan(inbox.sql.queue.open_groups.text().clone(), 0).await;
        assert!(
            gauges.contains("USING COVERING INDEX plans_open_idx"),
            "{gauges}"
        );
        assert!(
            !gauges.contains("SCAN plans\n") && !gauges.ends_with("SCAN plans"),
            "{gauges}"
        );
        let purge = plan(inbox.sql.queue.purge_batch.text().clone(), 3).await;
        assert!(purge.contains("USING INDEX plans_finished_idx"), "{purge}");
        // The positions' purge finds an object's open events by the ordering index, and the
        // stale check finds its newer events and position by their keys.
        let positions = plan(inbox.sql.queue.purge_positions.text().clone(), 2).await;
        assert!(
            positions.contains("USING INDEX plans_pos_idx"),
            "{positions}"
        );
        assert!(positions.contains("plans_order_idx"), "{positions}");
        let newer = plan(inbox.sql.ordered.newer.text().clone(), 2).await;
        assert!(
            newer.contains("plans_positions_1 (provider=? AND order_key=?)"),
            "{newer}"
        );
        // The worker's batch claim finds its keys by the primary key, not by walking the due
        // rows of a backlog.
        let claim = plan(inbox.sql.jobs.text(Statement::ClaimKeys).clone(), 6).await;
        assert!(claim.contains("USING PRIMARY KEY"), "{claim}");
        assert!(!claim.contains("plans_due_idx"), "{claim}");
        // A backlog's sweeps read the due events in the due index's order, sorting nothing.
        let due = plan(inbox.sql.jobs.text(Statement::DueByTime).clone(), 3).await;
        assert!(due.contains("plans_due_idx"), "{due}");
        assert!(!due.contains("TEMP B-TREE"), "{due}");
        let groups =
            <sqlx::Sqlite as crate::backend::sealed::InboxSql>::open_groups(&pool, &inbox.sql)
                .await
                .unwrap();
        assert_eq!(groups.iter().map(|g| g.count).sum::<u64>(), 8);
    }

    /// Drops the inbox's table and the tables `migrate` creates beside it.
    #[cfg(feature = "postgres")]
    async fn drop_inbox(pool: &sqlx::PgPool, table: &str) {
        use sqlx::Executor;
        let tables = ["", "_attempts", "_audit", "_pauses", "_positions"]
            .map(|side| format!("{table}{side}"));
        pool.execute(sqlx::AssertSqlSafe(
            format!("DROP TABLE {}", tables.join(", ")).as_str(),
        ))
        .await
        .unwrap();
    }

    /// A migrated inbox on a Postgres table of its own, named `<prefix>_<random>`.
    #[cfg(feature = "postgres")]
    async fn postgres_inbox(prefix: &str) -> (sqlx::PgPool, String, Inbox<sqlx::Postgres>) {
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let pool = sqlx::PgPool::connect(&url).await.expect("Postgres");
        let table = format!("{prefix}_{:x}", fastrand::u64(..));
        let inbox = Inbox::new(pool.clone(), &table).unwrap();
        inbox.migrate().await.unwrap();
        (pool, table, inbox)
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn postgres_plans_use_the_indexes() {
        use sqlx::Executor;
        let (pool, table, inbox) = postgres_inbox("plans").await;
        pool.execute(sqlx::AssertSqlSafe(fill(
            &table,
            "'\\x7b7d'",
            MOSTLY_PROCESSED,
        )))
        .await
        .unwrap();
        // As autovacuum does after such a load: the planner needs the table's statistics.
        pool.execute(sqlx::AssertSqlSafe(format!("ANALYZE {table}").as_str()))
            .await
            .unwrap();
        let plan = |statement: sqlx::SqlStr, binds: usize| {
            let pool = pool.clone();
            async move {
                let explain = format!("EXPLAIN {}", statement.as_str());
                let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(&*explain));
                for _ in 0..binds {
                    query = query.bind(0_i64);
                }
                let lines: Vec<String> = query.fetch_all(&pool).await.unwrap();
                lines.join("\n")
            }
        };
        let gauges = plan(inbox.sql.queue.open_groups.text().clone(), 0).await;
        let purge = plan(inbox.sql.queue.purge_batch.text().clone(), 3).await;
        let positions = plan(inbox.sql.queue.purge_positions.text().clone(), 2).await;
        let newer = format!("EXPLAIN {}", inbox.sql.ordered.newer.text().as_str());
        let newer: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(&*newer))
            .bind("stripe")
            .bind("evt_5")
            .fetch_all(&pool)
            .await
            .unwrap();
        let newer = newer.join("\n");
        let groups =
            <sqlx::Postgres as crate::backend::sealed::InboxSql>::open_groups(&pool, &inbox.sql)
                .await
                .unwrap();
        drop_inbox(&pool, &table).await;
        assert!(
            gauges.contains(&format!("Index Only Scan using {table}_open_idx")),
            "{gauges}"
        );
        assert!(!gauges.contains("Seq Scan"), "{gauges}");
        assert!(purge.contains(&format!("{table}_finished_idx")), "{purge}");
        assert!(!purge.contains("Seq Scan"), "{purge}");
        assert!(
            positions.contains(&format!("{table}_pos_idx")),
            "{positions}"
        );
        assert!(!positions.contains("Seq Scan"), "{positions}");
        assert!(
            newer.contains(&format!("{table}_positions_pkey")),
            "{newer}"
        );
        assert!(!newer.contains("Seq Scan"), "{newer}");
        assert_eq!(groups.iter().map(|g| g.count).sum::<u64>(), 8);
    }

    /// A plan made for a batch's values knew its length and always looked cheaper than the
    /// generic plan, so Postgres planned every claim anew, which took longer than running it.
    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn postgres_claims_keep_one_generic_plan() {
        use sqlx::Executor;
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        // One connection: every claim runs the statement that connection prepared.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .expect("Postgres");
        let table = format!("generic_{:x}", fastrand::u64(..));
        let inbox = Inbox::new(pool.clone(), &table).unwrap();
        inbox.migrate().await.unwrap();
        pool.execute(sqlx::AssertSqlSafe(fill(&table, "'\\x7b7d'", "0")))
            .await
            .unwrap();
        let times = (i64::MAX / 2, 7_i64, i64::MAX / 2 + 1, 25_i32);
        for batch in 0..10 {
            let keys: Vec<crate::EventKey> = (1..=2)
                .map(|n| crate::EventKey::new("stripe", format!("evt_{}", 2 * batch + n)))
                .collect();
            let claimed = crate::backend::claim_many(&pool, &inbox.sql, &keys, times)
                .await
                .unwrap();
            assert_eq!(claimed.len(), 2, "both events of the batch are claimed");
        }
        let (generic, custom): (i64, i64) = sqlx::query_as(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1",
        )
        .bind(inbox.sql.jobs.text(Statement::ClaimKeys).as_str())
        .fetch_one(&pool)
        .await
        .unwrap();
        drop_inbox(&pool, &table).await;
        assert!(
            generic >= 4 && custom <= 6,
            "the claim keeps its generic plan: {generic} generic, {custom} custom plans of 10"
        );
    }

    /// The sweeps between the first of each poll interval read the due events in the due
    /// index's order and stop at their limit: sorted by anything else, each sweep of a backlog
    /// (one per 256 events, back to back) would read every due event.
    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn postgres_sweeps_read_the_due_index_in_order() {
        use sqlx::Executor;
        let (pool, table, inbox) = postgres_inbox("sweeps").await;
        pool.execute(sqlx::AssertSqlSafe(fill(&table, "'\\x7b7d'", "0")))
            .await
            .unwrap();
        pool.execute(sqlx::AssertSqlSafe(format!("ANALYZE {table}").as_str()))
            .await
            .unwrap();
        let explain = format!(
            "EXPLAIN {}",
            inbox.sql.jobs.text(Statement::DueByTime).as_str()
        );
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(&*explain))
            .bind(PROCESSED + 1)
            .bind(256_i64)
            .bind(25_i32)
            .fetch_all(&pool)
            .await
            .unwrap();
        drop_inbox(&pool, &table).await;
        let plan = plan.join("\n");
        assert!(plan.contains(&format!("{table}_due_idx")), "{plan}");
        assert!(!plan.contains("Sort"), "{plan}");
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn postgres_claims_find_their_keys_by_the_primary_key() {
        use sqlx::Executor;
        let (pool, table, inbox) = postgres_inbox("claims").await;
        // A backlog of pending events that autovacuum has not analysed yet: a burst.
        pool.execute(sqlx::AssertSqlSafe(fill(&table, "'\\x7b7d'", "0")))
            .await
            .unwrap();
        let explain = |statement: &sqlx::SqlStr| format!("EXPLAIN {}", statement.as_str());
        let (now, token, until, max) = (0_i64, 7_i64, 0_i64, 25_i32);
        let (claim_many, ordered) = (
            explain(inbox.sql.jobs.text(Statement::ClaimKeys)),
            explain(inbox.sql.ordered.claim.text()),
        );
        let many = sqlx::query_scalar(sqlx::AssertSqlSafe(&*claim_many))
            .bind(now)
            .bind(vec!["stripe"])
            .bind(vec!["evt_5"])
            .bind(token)
            .bind(until)
            .bind(max);
        let mut plans: Vec<Vec<String>> = vec![many.fetch_all(&pool).await.unwrap()];
        for statement in [&ordered] {
            let one = sqlx::query_scalar(sqlx::AssertSqlSafe(statement.as_str()))
                .bind(now)
                .bind("stripe")
                .bind("evt_5")
                .bind(token)
                .bind(until)
                .bind(max);
            plans.push(one.fetch_all(&pool).await.unwrap());
        }
        let renew = explain(inbox.sql.jobs.text(Statement::RenewOne));
        let renew = sqlx::query_scalar(sqlx::AssertSqlSafe(&*renew))
            .bind("stripe")
            .bind("evt_5")
            .bind(token)
            .bind(until);
        plans.push(renew.fetch_all(&pool).await.unwrap());
        drop_inbox(&pool, &table).await;
        for plan in plans.iter().map(|lines| lines.join("\n")) {
            assert!(plan.contains(&format!("{table}_pkey")), "{plan}");
            assert!(!plan.contains("_open_idx"), "{plan}");
            assert!(!plan.contains("_due_idx"), "{plan}");
        }
    }
}
