//! A Standard Webhooks (and Svix) endpoint: verified `webhook-signature` over
//! `{webhook-id}.{webhook-timestamp}.{body}`, keyed by `webhook-id`.
//!
//! ```text
//! STANDARD_WEBHOOKS_SECRET=whsec_<base64> cargo run --example standard_webhooks
//! ```

use std::time::{SystemTime, UNIX_EPOCH};

use axum::{routing::post, Router};
use tower_idempotency::{
    webhooks::standard, IdempotencyLayer, MemoryStore, VerifiedWebhook, WebhookLayerExt,
};

const ADDR: &str = "127.0.0.1:3004";
// `whsec_` + base64 of the key bytes, as senders show it.
const DEMO_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

async fn events(webhook: VerifiedWebhook) -> &'static str {
    let payload = webhook.json().cloned().unwrap_or_default();
    println!("message {}: {}", webhook.event_id(), payload["type"]);
    "ok"
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secret = std::env::var("STANDARD_WEBHOOKS_SECRET").unwrap_or_else(|_| DEMO_SECRET.into());
    // A malformed secret is a configuration error, reported before serving.
    let layer = IdempotencyLayer::standard_webhooks([&secret], MemoryStore::new())?;
    let app = Router::new()
        .route("/webhooks/standard", post(events))
        .route_layer(layer);

    let listener = tokio::net::TcpListener::bind(ADDR).await?;
    let (id, body) = (
        "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W",
        r#"{"type":"user.created","data":{"id":1}}"#,
    );
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let signature = standard::sign(&standard::decode_secret(&secret)?, id, now, body.as_bytes());
    println!("listening on http://{ADDR}; try (valid for 5 minutes, run it twice):");
    println!(
        "  curl -i http://{ADDR}/webhooks/standard -H 'webhook-id: {id}' \\\n    \
         -H 'webhook-timestamp: {now}' -H 'webhook-signature: {signature}' -d '{body}'"
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
