//! The transactional mode behind webhook layers (Stripe and GitHub) on SQLite, Postgres and
//! (feature `mysql`) MariaDB/MySQL,
//! over real HTTP: 25 concurrent deliveries of one event write exactly one row, a handler
//! answering `500` leaves none and the provider's retry writes one.

mod support;

use std::sync::Arc;
use tower_idempotency_testkit::unix_now;

use axum::{http::StatusCode, routing::post, Router};
use futures_util::future::join_all;
use support::*;
use tower_idempotency::{
    sqlx::{self, Database, Pool, Postgres, Sqlite},
    webhooks::{github, stripe},
    IdempotencyLayer, IdempotentTx, PostgresStore, SqliteStore, Store, VerifiedWebhook,
    WebhookLayerExt,
};

const STRIPE_SECRET: &str = "whsec_transactional_test";
const GITHUB_SECRET: &str = "transactional-test-github";

/// One row per event, then `500` for an event whose id ends in `-fail` (its row rolls back).
macro_rules! handler {
    ($name:ident, $db:ty, $insert:literal) => {
        async fn $name(
            axum::extract::State(table): axum::extract::State<Arc<String>>,
            mut tx: IdempotentTx<$db>,
            event: VerifiedWebhook,
        ) -> StatusCode {
            let sql = format!($insert, table = table);
            sqlx::query(sqlx::AssertSqlSafe(&*sql))
                .bind(event.event_id())
                .execute(&mut *tx)
                .await
                .expect("insert");
            if event.event_id().ends_with("-fail") {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::OK
            }
        }
    };
}

handler!(
    sqlite_event,
    Sqlite,
    r#"INSERT INTO "{table}" (event_id) VALUES (?1)"#
);
handler!(
    postgres_event,
    Postgres,
    r#"INSERT INTO "{table}" (event_id) VALUES ($1)"#
);

#[cfg(feature = "mysql")]
handler!(
    mysql_event,
    sqlx::MySql,
    "INSERT INTO `{table}` (event_id) VALUES (?)"
);

async fn rows<DB: Database>(pool: &Pool<DB>, table: &str, event: &str) -> i64
where
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments: sqlx::IntoArguments<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let placeholder = if DB::NAME == "PostgreSQL" { "$1" } else { "?1" };
    let sql = format!(r#"SELECT count(*) FROM "{table}" WHERE event_id = {placeholder}"#);
    sqlx::query_scalar(sqlx::AssertSqlSafe(&*sql))
        .bind(event)
        .fetch_one(pool)
        .await
        .expect("count")
}

fn stripe_delivery(event: &str) -> (String, Vec<(&'static str, String)>) {
    let body = format!(r#"{{"id":"{event}","object":"event","type":"charge.succeeded"}}"#);
    let now = unix_now();
    let signature = stripe::sign(STRIPE_SECRET, now, body.as_bytes());
    (body, vec![("stripe-signature", signature)])
}

fn github_delivery(event: &str) -> (String, Vec<(&'static str, String)>) {
    // Each event's body differs, as GitHub's do: one signature seen under two delivery ids is
    // refused as a replayed capture (`replayed-signature`).
    let body = format!(r#"{{"action":"opened","issue":{{"title":"{event}"}}}}"#);
    let signature = github::sign(GITHUB_SECRET, body.as_bytes());
    (
        body,
        vec![
            ("x-hub-signature-256", signature),
            ("x-github-delivery", event.to_owned()),
            ("x-github-event", "issues".to_owned()),
        ],
    )
}

async fn deliver(url: &str, (body, headers): &(String, Vec<(&'static str, String)>)) -> u16 {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.clone());
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    tower_idempotency_testkit::delivery_status(request).await
}

/// For `/stripe` and `/github` on `base`: 25 concurrent deliveries of one event leave one row
/// and a later delivery is a replay; an event whose handler answers `500` leaves no row, and its
/// key is released: the provider's retry runs the handler again (which fails again, rolling
/// back again). `rows` counts an event's rows.
async fn check(base: &str, rows: impl AsyncFn(&str) -> i64) {
    type Delivery = fn(&str) -> (String, Vec<(&'static str, String)>);
    let providers: [(&str, Delivery); 2] =
        [("stripe", stripe_delivery), ("github", github_delivery)];
    for (route, make) in providers {
        let url = format!("{base}/{route}");
        let event = format!("evt-{}", random_suffix());
        let delivery = make(&event);
        let answers = join_all((0..25).map(|_| deliver(&url, &delivery))).await;
        assert!(
            answers.iter().all(|s| *s == 200 || *s == 409),
            "{route}: {answers:?}"
        );
        assert_eq!(deliver(&url, &delivery).await, 200, "{route}: replay");
        assert_eq!(rows(&event).await, 1, "{route}: one row");

        let failing = format!("evt-{}-fail", random_suffix());
        let delivery = make(&failing);
        assert_eq!(deliver(&url, &delivery).await, 500, "{route}");
        assert_eq!(rows(&failing).await, 0, "{route}: rolled back");
        // Released: the provider's retry runs the handler again (and it fails again).
        assert_eq!(deliver(&url, &delivery).await, 500, "{route}: retry ran");
        assert_eq!(rows(&failing).await, 0, "{route}: rolled back");
    }
}

fn app<H, T>(store: Arc<dyn Store>, table: &str, handler: H) -> Router
where
    H: axum::handler::Handler<T, Arc<String>> + Clone,
    T: 'static,
{
    Router::new()
        .route("/stripe", post(handler.clone()))
        .route_layer(IdempotencyLayer::stripe([STRIPE_SECRET], store.clone()).transactional())
        .merge(
            Router::new()
                .route("/github", post(handler))
                .route_layer(IdempotencyLayer::github([GITHUB_SECRET], store).transactional()),
        )
        .with_state(Arc::new(table.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_layers_commit_effects_once_sqlite() {
    let path = std::env::temp_dir().join(format!("tidem-tx-webhooks-{}.db", random_suffix()));
    let url = format!("sqlite://{}", path.display());
    let store = Arc::new(SqliteStore::connect(&url).await.expect("sqlite"));
    store.migrate().await.expect("migrate");
    let table = format!("events_{}", random_suffix());
    let ddl = format!(r#"CREATE TABLE "{table}" (event_id TEXT NOT NULL)"#);
    sqlx::raw_sql(sqlx::AssertSqlSafe(&*ddl))
        .execute(store.pool())
        .await
        .expect("ddl");
    let base = serve(app(store.clone(), &table, sqlite_event)).await;
    check(&base, async |event: &str| {
        rows(store.pool(), &table, event).await
    })
    .await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_layers_commit_effects_once_postgres() {
    require_postgres!("transactional webhooks (postgres)");
    let pool = sqlx::PgPool::connect(&database_url()).await.expect("pg");
    let records = format!("tx_webhooks_{}", random_suffix());
    let store = Arc::new(PostgresStore::new(pool.clone(), &records).expect("table"));
    store.migrate().await.expect("migrate");
    let table = format!("events_{}", random_suffix());
    let ddl = format!(r#"CREATE TABLE "{table}" (event_id text NOT NULL)"#);
    sqlx::raw_sql(sqlx::AssertSqlSafe(&*ddl))
        .execute(&pool)
        .await
        .expect("ddl");
    let base = serve(app(store.clone(), &table, postgres_event)).await;
    check(&base, async |event: &str| rows(&pool, &table, event).await).await;
    let drop = format!(r#"DROP TABLE "{table}"; DROP TABLE "{records}";"#);
    sqlx::raw_sql(sqlx::AssertSqlSafe(&*drop))
        .execute(&pool)
        .await
        .expect("drop");
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_layers_commit_effects_once_mysql() {
    if !tower_idempotency_testkit::mysql_or_skip("transactional webhooks (mysql)") {
        return;
    }
    let url = tower_idempotency_testkit::mysql_url();
    let records = tower_idempotency_testkit::mysql_table("tx_webhooks");
    let store = Arc::new(
        tower_idempotency::MySqlStore::connect_with_table(&url, &records)
            .await
            .expect("mysql"),
    );
    store.migrate().await.expect("migrate");
    let pool = store.pool().clone();
    let table = tower_idempotency_testkit::mysql_table("events");
    let ddl = format!("CREATE TABLE `{table}` (event_id VARCHAR(255) NOT NULL) ENGINE = InnoDB");
    sqlx::raw_sql(sqlx::AssertSqlSafe(&*ddl))
        .execute(&pool)
        .await
        .expect("ddl");
    let base = serve(app(store.clone(), &table, mysql_event)).await;
    check(&base, async |event: &str| {
        let sql = format!("SELECT count(*) FROM `{table}` WHERE event_id = ?");
        sqlx::query_scalar(sqlx::AssertSqlSafe(&*sql))
            .bind(event)
            .fetch_one(&pool)
            .await
            .expect("count")
    })
    .await;
    let drop = format!("DROP TABLE `{table}`, `{records}`");
    sqlx::raw_sql(sqlx::AssertSqlSafe(&*drop))
        .execute(&pool)
        .await
        .expect("drop");
}
