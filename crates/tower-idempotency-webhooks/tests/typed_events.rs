//! A handler reads a verified delivery as its own typed event, over real HTTP: the types are
//! shaped like async-stripe's `Event` (an `EventType` enum, `data.object` tagged by its
//! `object` field, `previous_attributes`).

use std::sync::{Arc, Mutex};

use axum::{extract::State, http::StatusCode, routing::post, Router};
use serde::Deserialize;
use tower_idempotency_core::{IdempotencyLayer, MemoryStore};
use tower_idempotency_testkit::{serve, unix_now};
use tower_idempotency_webhooks::{stripe, VerifiedWebhook, WebhookLayerExt};

#[derive(Debug, Deserialize)]
struct Event {
    id: String,
    #[serde(rename = "type")]
    type_: EventType,
    created: i64,
    livemode: bool,
    data: EventData,
}

#[derive(Debug, PartialEq, Deserialize)]
enum EventType {
    #[serde(rename = "payment_intent.succeeded")]
    PaymentIntentSucceeded,
    #[serde(rename = "charge.refunded")]
    ChargeRefunded,
}

#[derive(Debug, Deserialize)]
struct EventData {
    object: EventObject,
    previous_attributes: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "object")]
enum EventObject {
    #[serde(rename = "payment_intent")]
    PaymentIntent(PaymentIntent),
    #[serde(rename = "charge")]
    Charge { id: String },
}

#[derive(Debug, Deserialize)]
struct PaymentIntent {
    id: String,
    amount: i64,
    currency: String,
}

type Seen = Arc<Mutex<Vec<String>>>;

/// Answers 422 when the delivery is not an `Event`, and records what it read otherwise.
async fn typed(State(seen): State<Seen>, webhook: VerifiedWebhook) -> StatusCode {
    let Ok(event) = webhook.deserialize::<Event>() else {
        return StatusCode::UNPROCESSABLE_ENTITY;
    };
    assert_eq!(event.id, webhook.event_id());
    let line = match (&event.type_, &event.data.object) {
        (EventType::PaymentIntentSucceeded, EventObject::PaymentIntent(pi)) => {
            format!("{} {} {}{}", event.id, pi.id, pi.amount, pi.currency)
        }
        (EventType::ChargeRefunded, EventObject::Charge { id }) => format!("{} {id}", event.id),
        (type_, _) => format!("{} mismatched {type_:?}", event.id),
    };
    let line = format!(
        "{line} created={} live={} previous={}",
        event.created,
        event.livemode,
        event.data.previous_attributes.is_some()
    );
    seen.lock().unwrap().push(line);
    StatusCode::OK
}

#[tokio::test]
async fn a_verified_delivery_deserializes_into_a_stripe_shaped_event() {
    let seen = Seen::default();
    let app = Router::new()
        .route("/stripe", post(typed))
        .route_layer(IdempotencyLayer::stripe(
            ["whsec_typed"],
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
                stripe::sign("whsec_typed", unix_now(), body.as_bytes()),
            )
            .header("content-type", "application/json")
            .body(body)
            .send()
    };

    let paid = r#"{"id":"evt_typed_1","object":"event","type":"payment_intent.succeeded","created":1700000000,"livemode":false,"data":{"object":{"id":"pi_1","object":"payment_intent","amount":2000,"currency":"usd"}}}"#;
    let refunded = r#"{"id":"evt_typed_2","object":"event","type":"charge.refunded","created":1700000005,"livemode":true,"data":{"object":{"id":"ch_1","object":"charge"},"previous_attributes":{"refunded":false}}}"#;
    // A repeated field: the key reader keeps the first `id`, a struct refuses the body.
    let repeated = r#"{"id":"evt_typed_3","id":"evt_other","object":"event","type":"charge.refunded","created":1,"livemode":false,"data":{"object":{"id":"ch_2","object":"charge"}}}"#;
    assert_eq!(send(paid).await.unwrap().status(), 200);
    assert_eq!(send(refunded).await.unwrap().status(), 200);
    assert_eq!(send(repeated).await.unwrap().status(), 422);

    assert_eq!(
        *seen.lock().unwrap(),
        [
            "evt_typed_1 pi_1 2000usd created=1700000000 live=false previous=false",
            "evt_typed_2 ch_1 created=1700000005 live=true previous=true",
        ]
    );
}
