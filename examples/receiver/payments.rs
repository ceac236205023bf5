//! `POST /payments`: the transactional mode on the SQL stores. The handler inserts one row
//! `(idempotency_key, amount)` into `payments` through the request's transaction, which the layer
//! commits together with the key's completion: a crash before the commit leaves no row, and the
//! retry writes the only one. On SQLite, Postgres, and MySQL or MariaDB.

use axum::{
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
    Json, Router,
};
use serde_json::json;
use tower_idempotency::{sqlx, IdempotencyLayer, IdempotentTx};

use crate::sql::{Pool, Table};
use crate::{
    app::{idempotency_key, App},
    BoxError,
};

/// The payments table's own pool (for its DDL and `GET /effects`).
#[derive(Clone)]
pub struct Payments(Pool);

#[derive(serde::Deserialize)]
pub struct Payment {
    amount: i64,
}

fn answer(id: i64, amount: i64) -> Response {
    let body = json!({ "payment_id": format!("pay_{id}"), "amount": amount });
    (StatusCode::CREATED, Json(body)).into_response()
}

fn failed(error: sqlx::Error) -> Response {
    tracing::error!(%error, "inserting the payment failed");
    StatusCode::INTERNAL_SERVER_ERROR.into_response()
}

const TABLE: Table = Table {
    #[cfg(feature = "sqlite")]
    sqlite: "CREATE TABLE IF NOT EXISTS payments (\
             id INTEGER PRIMARY KEY AUTOINCREMENT, \
             idempotency_key TEXT NOT NULL, amount INTEGER NOT NULL)",
    #[cfg(feature = "postgres")]
    postgres: "SELECT pg_advisory_xact_lock(hashtext('receiver:payments'));\
               CREATE TABLE IF NOT EXISTS payments (\
               id bigserial PRIMARY KEY, \
               idempotency_key text NOT NULL, amount bigint NOT NULL)",
    // InnoDB: the rows commit with the key's completion.
    #[cfg(feature = "mysql")]
    mysql: "CREATE TABLE IF NOT EXISTS payments (\
            id BIGINT AUTO_INCREMENT PRIMARY KEY, \
            idempotency_key VARCHAR(255) NOT NULL, amount BIGINT NOT NULL, \
            INDEX payments_key_idx (idempotency_key)) ENGINE = InnoDB",
};

impl Payments {
    /// Opens a small pool of its own on the store's database and creates `payments`.
    pub async fn open(url: &str) -> Result<Option<Self>, BoxError> {
        Ok(Pool::open(url, 2, false, &TABLE).await?.map(Self))
    }

    /// The route, behind `layer` (transactional on this database's store).
    pub fn route(&self, layer: IdempotencyLayer) -> Router<App> {
        let router = match &self.0 {
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(_) => Router::new().route("/payments", post(pay_sqlite)),
            #[cfg(feature = "postgres")]
            Pool::Postgres(_) => Router::new().route("/payments", post(pay_postgres)),
            #[cfg(feature = "mysql")]
            Pool::MySql(_) => Router::new().route("/payments", post(pay_mysql)),
        };
        router.route_layer(layer)
    }

    /// Rows of `payments` per idempotency key.
    pub async fn rows(&self) -> Result<Vec<(String, u64)>, BoxError> {
        let sql = "SELECT idempotency_key, count(*) FROM payments GROUP BY idempotency_key";
        self.0.counts(sql).await
    }
}

/// The route's handler on one database: one row through the request's transaction.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! pay {
    ($name:ident, $db:ty) => {
        async fn $name(
            State(app): State<App>,
            mut tx: IdempotentTx<$db>,
            headers: HeaderMap,
            Json(payment): Json<Payment>,
        ) -> Response {
            let inserted: Result<i64, _> = sqlx::query_scalar(
                "INSERT INTO payments (idempotency_key, amount) VALUES ($1, $2) RETURNING id",
            )
            .bind(idempotency_key(&headers))
            .bind(payment.amount)
            .fetch_one(&mut *tx)
            .await;
            let id = match inserted {
                Ok(id) => id,
                Err(error) => return failed(error),
            };
            // Inside the transaction: a crash now leaves no row.
            tokio::time::sleep(app.handler_delay).await;
            answer(id, payment.amount)
        }
    };
}

#[cfg(feature = "sqlite")]
pay!(pay_sqlite, sqlx::Sqlite);
#[cfg(feature = "postgres")]
pay!(pay_postgres, sqlx::Postgres);

/// The route's handler on MySQL and MariaDB, which have no `RETURNING`: the new row's id is the
/// insert's `LAST_INSERT_ID()`.
#[cfg(feature = "mysql")]
async fn pay_mysql(
    State(app): State<App>,
    mut tx: IdempotentTx<sqlx::MySql>,
    headers: HeaderMap,
    Json(payment): Json<Payment>,
) -> Response {
    let inserted = sqlx::query("INSERT INTO payments (idempotency_key, amount) VALUES (?, ?)")
        .bind(idempotency_key(&headers))
        .bind(payment.amount)
        .execute(&mut *tx)
        .await;
    let id = match inserted {
        Ok(done) => i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX),
        Err(error) => return failed(error),
    };
    // Inside the transaction: a crash now leaves no row.
    tokio::time::sleep(app.handler_delay).await;
    answer(id, payment.amount)
}
