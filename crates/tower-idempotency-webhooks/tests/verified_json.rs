//! `VerifiedJson<T>` on a Stripe route over real HTTP: the handler gets its typed event beside
//! the event id; a body that is not its event type is a problem without the body's content, and
//! the handler does not run.

use std::sync::{Arc, Mutex};

use axum::{extract::State, routing::post, Router};
use serde::Deserialize;
use tower_idempotency_core::{IdempotencyLayer, MemoryStore};
use tower_idempotency_testkit::{serve, unix_now};
use tower_idempotency_webhooks::{stripe, VerifiedJson, WebhookLayerExt};

#[derive(Debug, Deserialize)]
struct Paid {
    id: String,
    amount: u64,
}

type Seen = Arc<Mutex<Vec<(String, u64)>>>;

async fn paid(State(seen): State<Seen>, paid: VerifiedJson<Paid>) -> String {
    seen.lock()
        .unwrap()
        .push((paid.event.id.clone(), paid.event.amount));
    format!(
        "{} {} {}",
        paid.provider(),
        paid.event_id(),
        paid.event.amount
    )
}

#[tokio::test]
async fn a_stripe_route_reads_its_typed_event_and_refuses_other_bodies_without_quoting_them() {
    let seen = Seen::default();
    let app = Router::new()
        .route("/stripe", post(paid))
        .route_layer(IdempotencyLayer::stripe(
            ["whsec_verified_json"],
            MemoryStore::new(),
        ))
        .with_state(seen.clone());
    let base = serve(app).await;
    let client = reqwest::Client::new();
    let send = |body: &'static str| {
        client
            .post(format!("{base}/stripe"))
            .header(
                "stripe-signature",
                stripe::sign("whsec_verified_json", unix_now(), body.as_bytes()),
            )
            .header("content-type", "application/json")
            .body(body)
            .send()
    };

    let ok = send(r#"{"id":"evt_vj_1","object":"event","amount":5}"#)
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.text().await.unwrap(), "stripe evt_vj_1 5");

    // A field of another type: 422, and the value is not quoted back.
    let shape = send(r#"{"id":"evt_vj_2","object":"event","amount":"secret-value"}"#)
        .await
        .unwrap();
    assert_eq!(shape.status(), 422);
    assert_eq!(shape.headers()["content-type"], "application/problem+json");
    let problem = shape.text().await.unwrap();
    assert!(
        problem.contains("urn:tower-idempotency:problem:webhook-body-unexpected"),
        "{problem}"
    );
    assert!(!problem.contains("secret-value"), "{problem}");

    // A repeated id: the delivery is keyed by the first, and the typed event refuses the
    // repetition rather than read the second.
    let repeated = send(r#"{"id":"evt_vj_3","id":"evt_vj_4","amount":5}"#)
        .await
        .unwrap();
    assert_eq!(repeated.status(), 422);

    // The verifier stops reading after the id; the extractor finds the rest is not JSON: 400,
    // with where it stopped.
    let truncated = send(r#"{"id":"evt_vj_5","amount":5,"#).await.unwrap();
    assert_eq!(truncated.status(), 400);
    let problem = truncated.text().await.unwrap();
    assert!(
        problem.contains("urn:tower-idempotency:problem:webhook-body-not-json")
            && problem.contains("(line 1, column 28)"),
        "{problem}"
    );

    assert_eq!(
        *seen.lock().unwrap(),
        [("evt_vj_1".to_owned(), 5)],
        "the handler ran for the one body of its type"
    );
}
