//! The transactional mode: a payment's row and the idempotency key's completion commit in one
//! SQLite transaction, so a crash between the handler's write and the recorded result leaves no
//! row, and the retry writes the only one. A Stripe webhook uses the same switch.
//!
//! ```text
//! cargo run --example payments_transactional
//! ```
//!
//! The example prints a `curl` command to try (run it twice: the second answer is a replay, and
//! `payments-example.db` holds one row).

use axum::{http::StatusCode, routing::post, Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tower_idempotency::{
    sqlx::{self, Sqlite},
    IdempotencyLayer, IdempotentTx, SqliteStore, VerifiedWebhook, WebhookLayerExt,
};

const ADDR: &str = "127.0.0.1:3013";

#[derive(Deserialize)]
struct Payment {
    amount: i64,
}

/// Writes through the request's transaction; the layer commits it with the key's completion
/// when this returns a 2xx, and rolls it back otherwise.
async fn pay(
    mut tx: IdempotentTx<Sqlite>,
    Json(payment): Json<Payment>,
) -> Result<(StatusCode, Json<Value>), StatusCode> {
    let id: i64 = sqlx::query_scalar("INSERT INTO payments (amount) VALUES (?1) RETURNING id")
        .bind(payment.amount)
        .fetch_one(&mut *tx)
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    println!("payment {id} written (commits with the key)");
    let receipt = json!({ "payment_id": format!("pay_{id}"), "amount": payment.amount });
    Ok((StatusCode::CREATED, Json(receipt)))
}

/// A webhook's effects in the same transaction as its event id.
async fn stripe_event(
    mut tx: IdempotentTx<Sqlite>,
    event: VerifiedWebhook,
) -> Result<StatusCode, StatusCode> {
    sqlx::query("INSERT INTO stripe_events (event_id) VALUES (?1)")
        .bind(event.event_id())
        .execute(&mut *tx)
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    Ok(StatusCode::OK)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = std::sync::Arc::new(SqliteStore::connect("sqlite://payments-example.db").await?);
    store.migrate().await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS payments (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS stripe_events (event_id TEXT NOT NULL);",
    )
    .execute(store.pool())
    .await?;
    let secret = std::env::var("STRIPE_WEBHOOK_SECRET").unwrap_or_else(|_| "whsec_example".into());
    let app = Router::new()
        .route("/payments", post(pay))
        .route_layer(
            IdempotencyLayer::client_keys(store.clone())
                .namespace("payments")
                .transactional(),
        )
        .merge(
            Router::new()
                .route("/webhooks/stripe", post(stripe_event))
                .route_layer(IdempotencyLayer::stripe([secret], store).transactional()),
        );

    let listener = tokio::net::TcpListener::bind(ADDR).await?;
    println!("listening on http://{ADDR}; try (run it twice):");
    println!(
        "  curl -i http://{ADDR}/payments -H 'Idempotency-Key: pay-1' \
         -H 'Content-Type: application/json' -d '{{\"amount\": 4200}}'"
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
