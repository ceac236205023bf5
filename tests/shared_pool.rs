//! One Postgres pool shared by the application's own queries, a `PostgresStore` (which keeps
//! half the pool as lanes) and an inbox worker (one transaction per running event), under
//! concurrent load over real HTTP: no request is refused for want of a connection, every order
//! is written once and every event is processed once.

mod support;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    extract::State,
    http::{HeaderMap, StatusCode},
    routing::{post, post_service},
    Router,
};
use futures_util::future::join_all;
use support::*;
use tower_idempotency::{
    inbox::{HandlerError, IdempotentTx, Inbox, InboxEvent},
    sqlx::{self, postgres::PgPoolOptions, PgPool, Postgres},
    webhooks::stripe::{self, StripeVerifier},
    IdempotencyLayer, PostgresStore,
};
use tower_idempotency_testkit::unix_now;

const SECRET: &str = "whsec_shared_pool_test";
/// The pool's size: the store keeps half of it as lanes.
const POOL: u32 = 6;
const ORDERS: usize = 60;
const EVENTS: usize = 60;

struct Tables {
    records: String,
    inbox: String,
    orders: String,
    charges: String,
}

/// `POST /orders`: the application's own write on the shared pool, behind the layer.
async fn create_order(
    State((pool, tables)): State<(PgPool, Arc<Tables>)>,
    headers: HeaderMap,
) -> StatusCode {
    let key = headers["idempotency-key"].to_str().unwrap_or_default();
    let insert = format!(r#"INSERT INTO "{}" (key) VALUES ($1)"#, tables.orders);
    match sqlx::query(sqlx::AssertSqlSafe(&*insert))
        .bind(key)
        .execute(&pool)
        .await
    {
        Ok(_) => StatusCode::CREATED,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_the_inbox_and_the_application_share_one_pool() {
    require_postgres!("shared pool (postgres)");
    let pool = PgPoolOptions::new()
        .max_connections(POOL)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&database_url())
        .await
        .expect("pg");
    let suffix = random_suffix();
    let tables = Arc::new(Tables {
        records: format!("shared_records_{suffix}"),
        inbox: format!("shared_inbox_{suffix}"),
        orders: format!("shared_orders_{suffix}"),
        charges: format!("shared_charges_{suffix}"),
    });
    let _guards = [
        &tables.records,
        &tables.inbox,
        &tables.orders,
        &tables.charges,
    ]
    .map(|table| PgTableGuard {
        table: table.clone(),
    });
    let ddl = format!(
        r#"CREATE TABLE "{}" (key text NOT NULL); CREATE TABLE "{}" (event_id text NOT NULL)"#,
        tables.orders, tables.charges
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(&*ddl))
        .execute(&pool)
        .await
        .expect("ddl");

    let store = PostgresStore::new(pool.clone(), &tables.records).expect("table");
    store.migrate().await.expect("migrate");
    assert_eq!(store.connection_lanes(), POOL as usize / 2);
    let inbox = Inbox::<Postgres>::new(pool.clone(), &tables.inbox).expect("inbox");
    inbox.migrate().await.expect("migrate inbox");
    let charges = tables.charges.clone();
    let worker = inbox
        .worker(move |event: InboxEvent, mut tx: IdempotentTx<Postgres>| {
            let insert = format!(r#"INSERT INTO "{charges}" (event_id) VALUES ($1)"#);
            async move {
                sqlx::query(sqlx::AssertSqlSafe(&*insert))
                    .bind(&event.key.event_id)
                    .execute(&mut *tx)
                    .await?;
                Ok::<_, HandlerError>(())
            }
        })
        .concurrency(4)
        .spawn();

    let app = Router::new()
        .route("/orders", post(create_order))
        .route_layer(IdempotencyLayer::client_keys(store).namespace("orders"))
        .with_state((pool.clone(), tables.clone()))
        .route(
            "/inbox/stripe",
            post_service(inbox.ack(StripeVerifier::new([SECRET]))),
        );
    let base = serve(app).await;
    let client = reqwest::Client::new();

    let orders = (0..ORDERS).map(|i| {
        let request = client
            .post(format!("{base}/orders"))
            .header("idempotency-key", format!("order-{i}"));
        async move { request.send().await.expect("order").status() }
    });
    let deliveries = (0..EVENTS).map(|i| {
        let body = format!(r#"{{"id":"evt_shared_{i}","type":"charge.succeeded"}}"#);
        let signature = stripe::sign(SECRET, unix_now(), body.as_bytes());
        let request = client
            .post(format!("{base}/inbox/stripe"))
            .header("content-type", "application/json")
            .header("stripe-signature", signature)
            .body(body);
        async move { request.send().await.expect("delivery").status() }
    });
    let (orders, deliveries) = tokio::join!(join_all(orders), join_all(deliveries));
    assert!(
        orders.iter().all(|s| *s == StatusCode::CREATED),
        "every order answered 201: {orders:?}"
    );
    assert!(
        deliveries.iter().all(|s| *s == StatusCode::OK),
        "every delivery acknowledged: {deliveries:?}"
    );

    // Each order's retry is a replay, not a second row.
    for i in 0..ORDERS {
        let retry = client
            .post(format!("{base}/orders"))
            .header("idempotency-key", format!("order-{i}"))
            .send()
            .await
            .expect("retry");
        assert_eq!(retry.status(), StatusCode::CREATED);
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    let counts = loop {
        let counts = inbox.counts().await.expect("counts");
        if counts.processed as usize == EVENTS || Instant::now() > deadline {
            break counts;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(counts.processed as usize, EVENTS, "{counts:?}");
    assert_eq!(counts.failed, 0, "{counts:?}");
    assert!(
        worker.drain(Duration::from_secs(30)).await,
        "the worker drained"
    );

    let count = |table: &str| {
        let sql = format!(r#"SELECT count(*) FROM "{table}""#);
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(&*sql))
                .fetch_one(&pool)
                .await
                .expect("count")
        }
    };
    assert_eq!(count(&tables.orders).await as usize, ORDERS);
    assert_eq!(count(&tables.charges).await as usize, EVENTS);
}
