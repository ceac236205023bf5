//! The operator's statements (the `ops` module's calls): filtered keyset listing, one event's detail,
//! discarding, counts per provider and the oldest pending event. Each statement is the same text
//! on both databases; the `ops_backend!` macro writes the typed calls once for each.

use futures_util::future::BoxFuture;

use crate::event::{EventKey, EventSummary};

/// The columns of an [`EventSummary`], in its decoding order.
const SUMMARY: &str =
    "provider, event_id, state, attempts, received_at, available_at, finished_at, last_error";

/// The filters of a scan, as bound values.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct ScanParams {
    pub state: Option<i16>,
    pub provider: Option<String>,
    /// Received at or after, unix milliseconds.
    pub from: Option<i64>,
    /// Received before, unix milliseconds.
    pub until: Option<i64>,
    /// Only the rows after this one in the scan's order (newest first).
    pub after: Option<(i64, String, String)>,
    pub limit: i64,
}

/// One scanned row: the summary and the body (for the event's type).
#[doc(hidden)]
#[derive(Debug)]
pub struct ScannedRow {
    pub summary: EventSummary,
    pub body: Vec<u8>,
}

/// One event's full row.
#[doc(hidden)]
#[derive(Debug)]
pub struct DetailRow {
    pub summary: EventSummary,
    pub headers: String,
    pub body: Vec<u8>,
}

/// The rows matching `params`, newest first (received time, then provider and event id).
pub(crate) fn scan_sql(table: &str) -> String {
    format!(
        "SELECT {SUMMARY}, body FROM {table} \
         WHERE ($1 IS NULL OR state = $1) AND ($2 IS NULL OR provider = $2) \
         AND ($3 IS NULL OR received_at >= $3) AND ($4 IS NULL OR received_at < $4) \
         AND ($5 IS NULL OR (received_at, provider, event_id) < ($5, $6, $7)) \
         ORDER BY received_at DESC, provider DESC, event_id DESC LIMIT $8"
    )
}

/// The last error of a discarded event kept for its authenticator.
pub(crate) const DISCARDED: &str = "discarded by an operator; kept without its body and headers \
     until its provider's retry horizon, so that its delivery re-sent under another id is still \
     refused";

/// Discards a failed event whose authenticator must still refuse a replay: finished as skipped
/// (never run again; purged once past the retention and the horizon), its body and headers
/// dropped, its authenticator kept. Bound: provider, event id, now, an empty body, the error.
fn keep_sql(table: &str) -> String {
    format!(
        "UPDATE {table} SET state = 3, body = $4, headers = '[]', finished_at = $3, \
         last_error = $5, lease_token = NULL, lease_until = NULL \
         WHERE provider = $1 AND event_id = $2 AND state = 2 \
         AND authenticator IS NOT NULL AND authenticator_until > $3"
    )
}

/// Deletes a failed event without an authenticator to keep. Bound: provider, event id, now.
fn delete_sql(table: &str) -> String {
    format!(
        "DELETE FROM {table} WHERE provider = $1 AND event_id = $2 AND state = 2 \
         AND (authenticator IS NULL OR authenticator_until IS NULL OR authenticator_until <= $3)"
    )
}

/// The operator's statements on one database. Sealed with [`InboxDatabase`](crate::InboxDatabase);
/// not a public API.
#[doc(hidden)]
pub trait OpsDatabase: sqlx::Database {
    #[doc(hidden)]
    fn scan<'a>(
        pool: &'a sqlx::Pool<Self>,
        table: &'a str,
        params: &'a ScanParams,
    ) -> BoxFuture<'a, sqlx::Result<Vec<ScannedRow>>>;

    #[doc(hidden)]
    fn detail<'a>(
        pool: &'a sqlx::Pool<Self>,
        table: &'a str,
        key: &'a EventKey,
    ) -> BoxFuture<'a, sqlx::Result<Option<DetailRow>>>;

    /// Discards a failed event: deletes it, or, while its authenticator must still refuse a
    /// replay (`authenticator_until` after `now`), keeps its row finished without its body
    /// and headers; whether it did either.
    #[doc(hidden)]
    fn discard<'a>(
        pool: &'a sqlx::Pool<Self>,
        table: &'a str,
        key: &'a EventKey,
        now: i64,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;

    /// `(provider, state, count)` for every provider and state present.
    #[doc(hidden)]
    fn provider_counts<'a>(
        pool: &'a sqlx::Pool<Self>,
        table: &'a str,
    ) -> BoxFuture<'a, sqlx::Result<Vec<(String, i16, i64)>>>;

    /// The received time of the oldest pending event, unix milliseconds.
    #[doc(hidden)]
    fn oldest_pending<'a>(
        pool: &'a sqlx::Pool<Self>,
        table: &'a str,
    ) -> BoxFuture<'a, sqlx::Result<Option<i64>>>;
}

macro_rules! ops_backend {
    ($db:ty, $feature:literal) => {
        #[cfg(feature = $feature)]
        const _: () = {
            fn summary(row: &<$db as sqlx::Database>::Row) -> sqlx::Result<EventSummary> {
                use sqlx::Row;
                Ok(EventSummary {
                    provider: row.try_get(0)?,
                    event_id: row.try_get(1)?,
                    state: crate::EventState::from_code(row.try_get(2)?),
                    attempts: u32::try_from(row.try_get::<i32, _>(3)?).unwrap_or(0),
                    received_at_ms: row.try_get(4)?,
                    available_at_ms: row.try_get(5)?,
                    finished_at_ms: row.try_get(6)?,
                    last_error: row.try_get(7)?,
                })
            }

            impl OpsDatabase for $db {
                fn scan<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    table: &'a str,
                    params: &'a ScanParams,
                ) -> BoxFuture<'a, sqlx::Result<Vec<ScannedRow>>> {
                    Box::pin(async move {
                        use sqlx::Row;
                        let statement = scan_sql(table);
                        let (at, provider, event_id) = match &params.after {
                            Some((at, provider, event_id)) => {
                                (Some(*at), Some(provider.as_str()), Some(event_id.as_str()))
                            }
                            None => (None, None, None),
                        };
                        let rows = sqlx::query(sqlx::AssertSqlSafe(&*statement))
                            .bind(params.state)
                            .bind(params.provider.as_deref())
                            .bind(params.from)
                            .bind(params.until)
                            .bind(at)
                            .bind(provider)
                            .bind(event_id)
                            .bind(params.limit)
                            .fetch_all(pool)
                            .await?;
                        rows.iter()
                            .map(|row| {
                                Ok(ScannedRow {
                                    summary: summary(row)?,
                                    body: row.try_get(8)?,
                                })
                            })
                            .collect()
                    })
                }

                fn detail<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    table: &'a str,
                    key: &'a EventKey,
                ) -> BoxFuture<'a, sqlx::Result<Option<DetailRow>>> {
                    Box::pin(async move {
                        use sqlx::Row;
                        let statement = format!(
                            "SELECT {SUMMARY}, headers, body FROM {table} \
                             WHERE provider = $1 AND event_id = $2"
                        );
                        let row = sqlx::query(sqlx::AssertSqlSafe(&*statement))
                            .bind(&key.provider)
                            .bind(&key.event_id)
                            .fetch_optional(pool)
                            .await?;
                        row.map(|row| {
                            Ok(DetailRow {
                                summary: summary(&row)?,
                                headers: row.try_get(8)?,
                                body: row.try_get(9)?,
                            })
                        })
                        .transpose()
                    })
                }

                fn discard<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    table: &'a str,
                    key: &'a EventKey,
                    now: i64,
                ) -> BoxFuture<'a, sqlx::Result<bool>> {
                    Box::pin(async move {
                        // Each statement checks the horizon itself, so whichever matches the
                        // row does the right thing.
                        let kept = sqlx::query(sqlx::AssertSqlSafe(&*keep_sql(table)))
                            .bind(&key.provider)
                            .bind(&key.event_id)
                            .bind(now)
                            .bind(Vec::<u8>::new())
                            .bind(DISCARDED)
                            .execute(pool)
                            .await?;
                        if kept.rows_affected() == 1 {
                            return Ok(true);
                        }
                        let done = sqlx::query(sqlx::AssertSqlSafe(&*delete_sql(table)))
                            .bind(&key.provider)
                            .bind(&key.event_id)
                            .bind(now)
                            .execute(pool)
                            .await?;
                        Ok(done.rows_affected() == 1)
                    })
                }

                fn provider_counts<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    table: &'a str,
                ) -> BoxFuture<'a, sqlx::Result<Vec<(String, i16, i64)>>> {
                    Box::pin(async move {
                        let statement = format!(
                            "SELECT provider, state, count(*) FROM {table} \
                             GROUP BY provider, state ORDER BY provider, state"
                        );
                        sqlx::query_as(sqlx::AssertSqlSafe(&*statement))
                            .fetch_all(pool)
                            .await
                    })
                }

                fn oldest_pending<'a>(
                    pool: &'a sqlx::Pool<Self>,
                    table: &'a str,
                ) -> BoxFuture<'a, sqlx::Result<Option<i64>>> {
                    Box::pin(async move {
                        let statement =
                            format!("SELECT min(received_at) FROM {table} WHERE state = 0");
                        sqlx::query_scalar(sqlx::AssertSqlSafe(&*statement))
                            .fetch_one(pool)
                            .await
                    })
                }
            }
        };
    };
}

ops_backend!(sqlx::Postgres, "postgres");
ops_backend!(sqlx::Sqlite, "sqlite");
