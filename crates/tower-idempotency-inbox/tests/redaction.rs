//! What an operator sees of a credential-carrying delivery, over real HTTP on a SQLite file and
//! on Postgres: a signed Mailgun delivery whose handler fails is shown by the admin JSON and the
//! page with its signature object's `token` and `signature`, its credential headers and its
//! URLs' user-info and query values masked; discarding it keeps its authenticator until the
//! provider's horizon, so the same signed delivery re-sent under a new id is still refused.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use axum::{http::HeaderName, routing::post_service, Router};
use common::*;
use tower_idempotency_inbox::{admin, EventKey, EventState, Inbox};
use tower_idempotency_sqlx::sqlx;
use tower_idempotency_webhooks::mailgun::{self, MailgunVerifier};

const MAILGUN_KEY: &str = "mailgun_inbox_redaction_key_51c3";
const TOKEN: &str = "tok3n-0f-the-delivery-9b1e";
const API_KEY: &str = "apikey-value-d41a";
const AUTH_KEY: &str = "auth-key-value-77c0";
const URL_PASSWORD: &str = "url-passw0rd";
const QUERY_SECRET: &str = "query-secret-3e9f";

/// A Mailgun delivery of `event_id`, of the probe's type `kind`, signed with `TOKEN` at `now`.
fn mailgun_body(event_id: &str, kind: &str, signature: &serde_json::Value) -> String {
    serde_json::json!({
        "type": kind,
        "signature": signature,
        "event-data": {
            "id": event_id,
            "event": "delivered",
            "url": format!("https://ops:{URL_PASSWORD}@files.example.com/a?sig={QUERY_SECRET}&n=1"),
        },
    })
    .to_string()
}

async fn post_mailgun(client: &reqwest::Client, url: &str, body: &str) -> u16 {
    let request = client
        .post(url)
        .header("content-type", "application/json")
        .header("apikey", API_KEY)
        .header("x-auth-key", AUTH_KEY)
        .header(
            "referer",
            format!("https://admin:{URL_PASSWORD}@mail.example.com/x?key={QUERY_SECRET}"),
        )
        .body(body.to_owned());
    tower_idempotency_testkit::delivery_status(request).await
}

async fn wait_state<DB: Fixture>(inbox: &Inbox<DB>, key: &EventKey, state: EventState) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let event = inbox.get(key).await.unwrap();
        if event.as_ref().map(|e| e.state) == Some(state) {
            return;
        }
        assert!(Instant::now() < deadline, "{key:?}: {event:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Fails when `shown` carries one of the delivery's credentials.
fn assert_masked(label: &str, shown: &str) {
    for secret in [TOKEN, API_KEY, AUTH_KEY, URL_PASSWORD, QUERY_SECRET] {
        assert!(!shown.contains(secret), "{label} shows {secret}: {shown}");
    }
}

async fn a_failed_mailgun_delivery_is_shown_masked_and_discarded_keeping_its_authenticator<
    DB: Fixture,
>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let worker = quick(setup.inbox.worker(probe.handler::<DB>())).spawn();
    let ack = setup
        .inbox
        .ack(MailgunVerifier::new([MAILGUN_KEY]))
        .keep_header(HeaderName::from_static("apikey"))
        .keep_header(HeaderName::from_static("x-auth-key"))
        .keep_header(HeaderName::from_static("referer"));
    let app = Router::new()
        .route("/inbox/mailgun", post_service(ack))
        .nest("/admin", admin::router(setup.inbox.clone()));
    let base = serve_router(app).await;
    let url = format!("{base}/inbox/mailgun");
    let client = reqwest::Client::new();

    let now = tower_idempotency_testkit::unix_now();
    let signature = mailgun::sign(MAILGUN_KEY, now, TOKEN);
    let first = EventKey::new("mailgun", "mg-redaction-1");
    let body = mailgun_body(&first.event_id, "test.permanent", &signature);
    assert_eq!(post_mailgun(&client, &url, &body).await, 200);
    wait_state(&setup.inbox, &first, EventState::Failed).await;

    // The admin JSON and the page.
    let detail = get_json(
        &client,
        format!("{base}/admin/events/mailgun/mg-redaction-1"),
    )
    .await;
    assert_masked(&format!("{}: the JSON", DB::LABEL), &detail.to_string());
    let headers: Vec<(String, String)> = serde_json::from_value(detail["headers"].clone()).unwrap();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(header("apikey").as_deref(), Some("[redacted]"));
    assert_eq!(header("x-auth-key").as_deref(), Some("[redacted]"));
    assert_eq!(
        header("referer").as_deref(),
        Some("https://mail.example.com/x?key=***"),
        "{}",
        DB::LABEL
    );
    let shown: serde_json::Value = serde_json::from_str(detail["body"].as_str().unwrap()).unwrap();
    assert_eq!(shown["signature"]["token"], "[redacted]");
    assert_eq!(shown["signature"]["signature"], "[redacted]");
    // What is not a credential stays readable.
    assert_eq!(shown["signature"]["timestamp"], now.to_string());
    assert_eq!(shown["event-data"]["id"], "mg-redaction-1");
    assert_eq!(
        shown["event-data"]["url"],
        "https://files.example.com/a?sig=***&n=***"
    );
    let page = get(
        &client,
        format!("{base}/admin/detail?provider=mailgun&event_id=mg-redaction-1"),
    )
    .await;
    assert_eq!(page.status(), 200);
    let page = page.text().await.unwrap();
    assert!(page.contains("mg-redaction-1"), "{page}");
    assert_masked(&format!("{}: the page", DB::LABEL), &page);

    // Discarded inside Mailgun's horizon.
    assert!(setup.inbox.discard(&first).await.unwrap());
    // The same signed delivery re-sent under a new id: answered, nothing stored, nothing run.
    let replay = EventKey::new("mailgun", "mg-redaction-2");
    let body = mailgun_body(&replay.event_id, "charge.updated", &signature);
    assert_eq!(post_mailgun(&client, &url, &body).await, 200);
    assert!(
        setup.inbox.get(&replay).await.unwrap().is_none(),
        "{}: a replay under a new id was stored after the discard",
        DB::LABEL
    );

    // Kept inside Mailgun's horizon: the body goes, the authenticator stays.
    let kept = setup.inbox.get(&first).await.unwrap();
    assert!(
        kept.as_ref()
            .is_some_and(|event| event.state != EventState::Failed),
        "{}: {kept:?}",
        DB::LABEL
    );
    assert!(
        !setup.inbox.discard(&first).await.unwrap(),
        "not failed now"
    );
    let detail = setup.inbox.event(&first).await.unwrap().expect("kept");
    assert_eq!(detail.body, "", "{}", DB::LABEL);

    // An event without an authenticator (Stripe) is deleted by a discard.
    let sender = Sender::new(&setup.inbox).await;
    sender.acknowledged("evt_permanent", "test.permanent").await;
    setup.wait_for("evt_permanent", EventState::Failed).await;
    let stripe = EventKey::new("stripe", "evt_permanent");
    assert!(setup.inbox.discard(&stripe).await.unwrap());
    assert!(setup.inbox.get(&stripe).await.unwrap().is_none());

    // A delivery flushed through the worker meanwhile would have run by now: the replay never
    // did.
    sender.acknowledged("evt_last", "charge.updated").await;
    setup.wait_for("evt_last", EventState::Processed).await;
    assert_eq!(probe.runs(&replay.event_id), 0, "{}", DB::LABEL);
    assert_eq!(probe.runs(&first.event_id), 1, "{}", DB::LABEL);
    setup.finish(worker).await;
}

on_both!(and_mysql: a_failed_mailgun_delivery_is_shown_masked_and_discarded_keeping_its_authenticator);
