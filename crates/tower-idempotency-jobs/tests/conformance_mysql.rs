//! The driver conformance suite, unchanged, on the shared MySQL or MariaDB (`MYSQL_URL`):
//! skipped, saying so, when it is unreachable, unless CI=true.

use sqlx::mysql::MySqlPoolOptions;
use tower_idempotency_testkit::{mysql_or_skip, mysql_url};

/// A pool as an application brings it: the server's own isolation level (REPEATABLE READ by
/// default) and lock wait timeout.
async fn mysql() -> Option<sqlx::MySqlPool> {
    if !mysql_or_skip("the jobs driver suite on MySQL") {
        return None;
    }
    let pool = MySqlPoolOptions::new()
        .max_connections(8)
        .connect(&mysql_url())
        .await
        .expect("the shared MySQL or MariaDB (MYSQL_URL) accepts connections");
    Some(pool)
}

tower_idempotency_jobs::jobs_driver_conformance_tests!(mysql, sqlx::MySql, optional mysql());
