//! A Slack Events API endpoint: verified `X-Slack-Signature`, keyed by `event_id`, answering the
//! `url_verification` handshake Slack sends when the request URL is configured.
//!
//! ```text
//! SLACK_SIGNING_SECRET=... cargo run --example slack
//! ```

use std::time::{SystemTime, UNIX_EPOCH};

use axum::{
    response::{IntoResponse, Response},
    routing::post,
    Router,
};
use tower_idempotency::{
    webhooks::slack, IdempotencyLayer, MemoryStore, VerifiedWebhook, WebhookLayerExt,
};

const ADDR: &str = "127.0.0.1:3003";

async fn slack_events(webhook: VerifiedWebhook) -> Response {
    if let Some(answer) = slack::url_verification_response(&webhook) {
        return answer;
    }
    let payload = webhook.json().cloned().unwrap_or_default();
    println!("event {}: {}", webhook.event_id(), payload["event"]["type"]);
    "ok".into_response()
}

fn curl(secret: &str, body: &str) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let signature = slack::sign(secret, now, body.as_bytes());
    format!(
        "curl -i http://{ADDR}/webhooks/slack -H 'X-Slack-Request-Timestamp: {now}' \\\n    \
         -H 'X-Slack-Signature: {signature}' -d '{body}'"
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secret = std::env::var("SLACK_SIGNING_SECRET").unwrap_or_else(|_| "example-secret".into());
    let app = Router::new()
        .route("/webhooks/slack", post(slack_events))
        .route_layer(IdempotencyLayer::slack(
            [secret.clone()],
            MemoryStore::new(),
        ));

    let listener = tokio::net::TcpListener::bind(ADDR).await?;
    let challenge = r#"{"type":"url_verification","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}"#;
    let event =
        r#"{"type":"event_callback","event_id":"Ev0123ABC","event":{"type":"app_mention"}}"#;
    println!("listening on http://{ADDR}; try (valid for 5 minutes):");
    println!("  {}", curl(&secret, challenge));
    println!("  {}", curl(&secret, event));
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
