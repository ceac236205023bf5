// cargo add tower-idempotency axum tokio -F tokio/full
use std::{sync::Arc, time::Duration};

use axum::{
    http::StatusCode,
    routing::{get, post},
    Router,
};
use tower_idempotency::{IdempotencyLayer, SqliteStore, VerifiedWebhook, WebhookLayerExt};

async fn create_order(body: String) -> (StatusCode, String) {
    (StatusCode::CREATED, body)
}

async fn stripe_event(event: VerifiedWebhook) -> &'static str {
    println!("stripe event {}", event.event_id());
    "ok"
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stripe_secret = std::env::var("STRIPE_WEBHOOK_SECRET")?;
    // One SQLite file holds every key; expired records are deleted once an hour.
    let store = Arc::new(SqliteStore::connect("sqlite://idempotency.db").await?);
    store.migrate().await?;
    store.spawn_purger(Duration::from_secs(3600));

    // Clients must send Idempotency-Key; retries get the first response back.
    let orders = IdempotencyLayer::client_keys(store.clone()).namespace("orders");
    // Stripe deliveries are verified, keyed by event id and run once.
    let stripe = IdempotencyLayer::stripe([stripe_secret], store);
    let drains = [orders.shutdown_handle(), stripe.shutdown_handle()];

    let app = Router::new()
        .route("/orders", post(create_order))
        .route_layer(orders)
        .merge(
            Router::new()
                .route("/webhooks/stripe", post(stripe_event))
                .route_layer(stripe),
        )
        .route("/health", get(|| async { "ok" }));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // Handlers whose caller left still run: give them 30 s to record their results.
    for handle in drains {
        handle.drain(Duration::from_secs(30)).await;
    }
    Ok(())
}
