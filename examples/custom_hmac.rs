//! A provider without a dedicated module, described with `HmacVerifier`: "Acme" signs
//! `{X-Acme-Timestamp}.{body}` with HMAC-SHA256 and sends `X-Acme-Signature: sha256=<hex>`; the
//! key is the body's `/event/id`.
//!
//! ```text
//! ACME_WEBHOOK_SECRET=... cargo run --example custom_hmac
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::{routing::post, Router};
use tower_idempotency::{
    webhooks::{
        generic::{EventId, HmacVerifier, Part},
        Encoding, HmacAlgorithm,
    },
    IdempotencyLayer, MemoryStore, VerifiedWebhook, WebhookLayerExt,
};

const ADDR: &str = "127.0.0.1:3009";

async fn acme_events(webhook: VerifiedWebhook) -> &'static str {
    println!("acme event {}", webhook.event_id());
    "ok"
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secret = std::env::var("ACME_WEBHOOK_SECRET").unwrap_or_else(|_| "example-secret".into());
    let verifier = HmacVerifier::builder("acme")
        .secrets([secret.clone()])
        .signature_header("x-acme-signature")
        .prefix("sha256=")
        .encoding(Encoding::Hex)
        .algorithm(HmacAlgorithm::Sha256)
        .timestamp_header("x-acme-timestamp")
        .signed_parts([Part::Timestamp, Part::Literal("."), Part::Body])
        .event_id(EventId::JsonPointer("/event/id"))
        // Longer than Acme retries (say, one day).
        .ttl(Duration::from_secs(2 * 24 * 3600))
        .build()?;
    let app = Router::new()
        .route("/webhooks/acme", post(acme_events))
        .route_layer(IdempotencyLayer::webhook(
            verifier.clone(),
            MemoryStore::new(),
        ));

    let listener = tokio::net::TcpListener::bind(ADDR).await?;
    let body = r#"{"event":{"id":"acme_evt_1","type":"thing.created"}}"#;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let signature = verifier.sign(&secret, Some(now), None, body.as_bytes());
    println!("listening on http://{ADDR}; try (valid for 5 minutes, run it twice):");
    println!(
        "  curl -i http://{ADDR}/webhooks/acme -H 'X-Acme-Timestamp: {now}' \\\n    \
         -H 'X-Acme-Signature: {signature}' -d '{body}'"
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
