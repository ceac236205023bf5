//! The driver conformance suite, unchanged, on SQLite (a file per test, in cargo's temporary
//! directory for tests, `target/tmp`) and on the shared Postgres (`DATABASE_URL`).

use std::str::FromStr;

use sqlx::{postgres::PgPoolOptions, sqlite::SqliteConnectOptions, SqlitePool};
use tower_idempotency_testkit::{database_url, random_suffix};

async fn sqlite() -> SqlitePool {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("jobs-conformance-{}.db", random_suffix()));
    let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
        .unwrap()
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(std::time::Duration::from_millis(100));
    SqlitePool::connect_with(options).await.unwrap()
}

async fn postgres() -> sqlx::PgPool {
    PgPoolOptions::new()
        .max_connections(8)
        .connect(&database_url())
        .await
        .expect("the shared Postgres (DATABASE_URL) is needed by the driver suite")
}

tower_idempotency_jobs::jobs_driver_conformance_tests!(sqlite, sqlx::Sqlite, sqlite());
tower_idempotency_jobs::jobs_driver_conformance_tests!(postgres, sqlx::Postgres, postgres());
