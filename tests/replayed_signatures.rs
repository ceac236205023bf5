//! A captured webhook delivery re-sent under new delivery ids, over real HTTP against every
//! store: many copies at once run the handler exactly once and the others are refused `401
//! replayed-signature`; GitHub's redelivery (same id and body) is replayed, also when it is
//! signed with a rotated secret.

mod support;

use std::time::Duration;

use axum::{extract::State, routing::post, Router};
use support::*;
use tokio::sync::mpsc;
use tower_idempotency::{
    webhooks::github, IdempotencyLayer, MemoryStore, PostgresStore, RedisStore, SqliteStore, Store,
    VerifiedWebhook, WebhookLayerExt,
};
use tower_idempotency_testkit::HeldHandler;

const OLD_SECRET: &str = "gh-replay-old-secret-0b6f2e8d41a7c953";
const NEW_SECRET: &str = "gh-replay-new-secret-5c1d9a7e3f20b846";
const COPIES: usize = 20;
const REPLAYED_SIGNATURE: &str = "urn:tower-idempotency:problem:replayed-signature";

/// Counts the delivery and holds the first one until the test lets it go on.
async fn handle(State(handler): State<HeldHandler>, webhook: VerifiedWebhook) -> String {
    handler.execute().await;
    format!("handled {}", webhook.event_id())
}

/// `response` is the refusal of a copy: `401 replayed-signature`.
async fn assert_replayed_signature(response: reqwest::Response, what: &str) {
    assert_eq!(response.status(), 401, "{what}");
    assert_eq!(
        problem_type(&response.bytes().await.unwrap()),
        REPLAYED_SIGNATURE,
        "{what}"
    );
}

async fn captured_signature_under_many_ids(store: impl Store, what: &str) {
    let handler = HeldHandler::blocking();
    let layer = IdempotencyLayer::github([NEW_SECRET, OLD_SECRET], store);
    let app = Router::new()
        .route("/hook", post(handle))
        .route_layer(layer)
        .with_state(handler.clone());
    let url = format!("{}/hook", serve(app).await);
    let client = reqwest::Client::new();
    let suffix = random_suffix();
    let body = format!(r#"{{"action":"opened","issue":{{"number":1,"title":"{suffix}"}}}}"#);
    let send = |id: &str, secret: &str| {
        client
            .post(&url)
            .header(
                github::SIGNATURE_HEADER,
                github::sign(secret, body.as_bytes()),
            )
            .header(github::DELIVERY_HEADER, id)
            .header("x-github-event", "issues")
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
    };

    // One genuine delivery (signed with the old secret) and copies of it under new ids, all at
    // once; the one that runs is held until every other copy is answered.
    let (tx, mut rx) = mpsc::unbounded_channel();
    for n in 0..COPIES {
        let (tx, pending) = (tx.clone(), send(&format!("{suffix}-{n}"), OLD_SECRET));
        tokio::spawn(async move { tx.send(pending.await.unwrap()).unwrap() });
    }
    for _ in 1..COPIES {
        let response = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{what}: no answer within 20 s"))
            .unwrap();
        assert_replayed_signature(response, what).await;
    }
    assert_eq!(handler.count(), 1, "{what}");
    handler.proceed.notify_one();
    let winner = rx.recv().await.unwrap();
    assert_eq!(winner.status(), 200, "{what}");
    let winner = winner.text().await.unwrap();
    let id = winner.strip_prefix("handled ").unwrap().to_owned();

    // GitHub's redelivery: same delivery id, same body; before and after the secret rotated.
    for secret in [OLD_SECRET, NEW_SECRET] {
        let redelivery = send(&id, secret).await.unwrap();
        assert_eq!(redelivery.status(), 200, "{what}");
        assert_eq!(
            redelivery.headers()["idempotent-replayed"],
            "true",
            "{what}"
        );
        assert_eq!(redelivery.text().await.unwrap(), winner, "{what}");
    }
    // Either signature under yet another id is still refused.
    for secret in [OLD_SECRET, NEW_SECRET] {
        let copy = send(&format!("{suffix}-late"), secret).await.unwrap();
        assert_replayed_signature(copy, what).await;
    }
    assert_eq!(handler.count(), 1, "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory() {
    captured_signature_under_many_ids(MemoryStore::new(), "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let path = std::env::temp_dir().join(format!("tidem-replayed-{}.db", random_suffix()));
    let store = SqliteStore::connect(&format!("sqlite://{}", path.display()))
        .await
        .expect("open sqlite");
    store.migrate().await.expect("migrate");
    captured_signature_under_many_ids(store, "sqlite").await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    require_postgres!("replayed signatures (postgres)");
    let guard = PgTableGuard {
        table: format!("tidem_replayed_{}", random_suffix()),
    };
    let store = PostgresStore::connect_with_table(&database_url(), &guard.table)
        .await
        .expect("connect postgres");
    store.migrate().await.expect("migrate");
    captured_signature_under_many_ids(store, "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis() {
    if !reachable(&host_port(&redis_url())) {
        return skip("replayed signatures (redis)", "Redis is not reachable");
    }
    let guard = RedisPrefixGuard {
        url: redis_url(),
        prefix: format!("tidem-replayed-{}", random_suffix()),
    };
    let store = RedisStore::connect(&redis_url(), &guard.prefix)
        .await
        .expect("connect redis");
    captured_signature_under_many_ids(store, "redis").await;
}
