//! A GitHub webhook endpoint: verified `X-Hub-Signature-256`, keyed by `X-GitHub-Delivery`, so
//! a redelivery from the GitHub UI replays the first answer instead of running twice.
//!
//! ```text
//! GITHUB_WEBHOOK_SECRET=... cargo run --example github
//! ```

use axum::{http::HeaderMap, routing::post, Router};
use tower_idempotency::{
    webhooks::github, IdempotencyLayer, MemoryStore, VerifiedWebhook, WebhookLayerExt,
};

const ADDR: &str = "127.0.0.1:3002";

async fn github_events(headers: HeaderMap, webhook: VerifiedWebhook) -> String {
    let event = headers
        .get("x-github-event")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("unknown");
    let payload = webhook.json().cloned().unwrap_or_default();
    println!(
        "delivery {}: {event} {}",
        webhook.event_id(),
        payload["action"]
    );
    format!("handled {event}")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secret = std::env::var("GITHUB_WEBHOOK_SECRET").unwrap_or_else(|_| "example-secret".into());
    // MemoryStore keeps this example self-contained; use SqliteStore or PostgresStore in production.
    let app = Router::new()
        .route("/webhooks/github", post(github_events))
        .route_layer(IdempotencyLayer::github(
            [secret.clone()],
            MemoryStore::new(),
        ));

    let listener = tokio::net::TcpListener::bind(ADDR).await?;
    let body = r#"{"action":"opened","number":1}"#;
    let signature = github::sign(&secret, body.as_bytes());
    println!("listening on http://{ADDR}; try (twice: the second answer is a replay):");
    println!(
        "  curl -i http://{ADDR}/webhooks/github -H 'X-GitHub-Event: pull_request' \\\n    \
         -H 'X-GitHub-Delivery: 72d3162e-cc78-11e3-81ab-4c9367dc0958' \\\n    \
         -H 'X-Hub-Signature-256: {signature}' -d '{body}'"
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
