//! A Stripe webhook endpoint: verified `Stripe-Signature`, keyed by the event id, backed by the
//! embedded SQLite store (`stripe-example.db` in the working directory).
//!
//! ```text
//! STRIPE_WEBHOOK_SECRET=whsec_... cargo run --example stripe
//! ```
//!
//! Without `STRIPE_WEBHOOK_SECRET` a demo secret is used; the example prints a signed `curl`
//! command to try (run it twice: the second answer is a replay).

use std::time::{SystemTime, UNIX_EPOCH};

use axum::{routing::post, Json, Router};
use serde_json::{json, Value};
use tower_idempotency::{
    webhooks::stripe, IdempotencyLayer, SqliteStore, VerifiedWebhook, WebhookLayerExt,
};

const ADDR: &str = "127.0.0.1:3001";

async fn stripe_events(webhook: VerifiedWebhook) -> Json<Value> {
    let event = webhook.json().cloned().unwrap_or_default();
    // Runs once per event id, however often Stripe delivers it.
    println!("handling {} ({})", webhook.event_id(), event["type"]);
    Json(json!({ "received": webhook.event_id() }))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secret = std::env::var("STRIPE_WEBHOOK_SECRET").unwrap_or_else(|_| "whsec_example".into());
    let store = SqliteStore::connect("sqlite://stripe-example.db").await?;
    store.migrate().await?;
    let app = Router::new()
        .route("/webhooks/stripe", post(stripe_events))
        .route_layer(IdempotencyLayer::stripe([secret.clone()], store));

    let listener = tokio::net::TcpListener::bind(ADDR).await?;
    let body = r#"{"id":"evt_example_1","object":"event","type":"invoice.paid"}"#;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let signature = stripe::sign(&secret, now, body.as_bytes());
    println!("listening on http://{ADDR}; try (valid for 5 minutes, run it twice):");
    println!(
        "  curl -i http://{ADDR}/webhooks/stripe -H 'Stripe-Signature: {signature}' -d '{body}'"
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
