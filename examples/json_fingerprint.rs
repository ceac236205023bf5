//! Fingerprints over chosen JSON fields: clients that resend a payment with a new `sent_at` or
//! trace id get the first response back instead of `422`; a changed amount is still `422`, and a
//! body that is not JSON is `400`.
//!
//! ```text
//! cargo run --example json_fingerprint
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use axum::{http::StatusCode, routing::post, Router};
use tower_idempotency::{FingerprintMode, IdempotencyLayer, MemoryStore};

const ADDR: &str = "127.0.0.1:3010";

async fn create_payment(body: String) -> (StatusCode, String) {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    println!("payment {id} created");
    (StatusCode::CREATED, format!("payment {id}: {body}\n"))
}

async fn create_refund(body: String) -> (StatusCode, String) {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    println!("refund {id} created");
    (StatusCode::CREATED, format!("refund {id}: {body}\n"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = MemoryStore::new();
    let app = Router::new()
        // Only the amount, currency and customer decide whether a resend is the same payment.
        .route("/payments", post(create_payment))
        .route_layer(
            IdempotencyLayer::client_keys(store)
                .namespace("payments")
                .fingerprint(FingerprintMode::json_fields([
                    "/amount",
                    "/currency",
                    "/customer/id",
                ])),
        )
        // Everything but the client's timestamp and trace id must match.
        .merge(
            Router::new()
                .route("/refunds", post(create_refund))
                .route_layer(
                    IdempotencyLayer::client_keys(MemoryStore::new())
                        .namespace("refunds")
                        .fingerprint(FingerprintMode::json_excluding([
                            "/sent_at",
                            "/meta/trace_id",
                        ])),
                ),
        );

    let listener = tokio::net::TcpListener::bind(ADDR).await?;
    println!("listening on http://{ADDR}; try, in this order:");
    let send = |path: &str, body: &str| {
        println!(
            "  curl -i http://{ADDR}{path} -H 'Idempotency-Key: k-1' \
             -H 'content-type: application/json' -d '{body}'"
        )
    };
    send(
        "/payments",
        r#"{"amount":100,"currency":"EUR","customer":{"id":"c1"},"sent_at":"10:00"}"#,
    );
    println!("  (a replay: other order, other sent_at)");
    send(
        "/payments",
        r#"{"sent_at":"10:01","customer":{"id":"c1"},"currency":"EUR","amount":100}"#,
    );
    println!("  (422: the amount changed)");
    send(
        "/payments",
        r#"{"amount":101,"currency":"EUR","customer":{"id":"c1"}}"#,
    );
    println!("  (400: not JSON)");
    send("/payments", "amount=100");
    println!("  (the refund route ignores only sent_at and meta.trace_id)");
    send(
        "/refunds",
        r#"{"payment":"p1","sent_at":1,"meta":{"trace_id":"t1"}}"#,
    );
    send(
        "/refunds",
        r#"{"payment":"p1","sent_at":2,"meta":{"trace_id":"t2"}}"#,
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
