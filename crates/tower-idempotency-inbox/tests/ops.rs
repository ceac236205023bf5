//! The operator's tools over real HTTP, on SQLite and on Postgres: the filtered listing pages
//! past a thousand events with its cursor; one event's detail redacts credential headers; a
//! cross-site-style form post is refused; discard; the bulk retry's dry run changes nothing and
//! its rate spreads the retried events' due times, and no attempt runs before its own.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use axum::{routing::post_service, Router};
use common::*;
use futures_util::{stream, StreamExt};
use http::HeaderName;
use tower_idempotency_inbox::{
    admin, parse_rfc3339, EventKey, EventState, WorkerBuilder, REDACTED,
};
use tower_idempotency_sqlx::sqlx;
use tower_idempotency_webhooks::stripe::StripeVerifier;

fn quick<DB: Fixture>(builder: WorkerBuilder<DB>) -> WorkerBuilder<DB> {
    quick_retries(builder, Duration::from_millis(10)).max_attempts(1)
}

/// 1 030 events acknowledged over HTTP (no worker: all pending) page out of `GET /events` in
/// pages of 500 with the cursor: every event once, newest first, the last page without a
/// cursor; the provider, type and time filters narrow it; a forged cursor is `400`.
async fn listing_pages_past_a_thousand<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let url = serve(&setup.inbox).await;
    let admin_url = serve_router(admin::router(setup.inbox.clone())).await;
    let client = reqwest::Client::new();
    let started = tower_idempotency_inbox::rfc3339(std::time::SystemTime::now());
    let total = 1030;
    let statuses: Vec<u16> = stream::iter(0..total)
        .map(|n| {
            let kind = if n % 10 == 0 {
                "invoice.paid"
            } else {
                "charge.succeeded"
            };
            let body = event_body(&format!("evt_page_{n:04}"), kind);
            let client = client.clone();
            let url = url.clone();
            async move { deliver(&client, &url, SECRET, &body).await }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(statuses.iter().all(|&status| status == 200));

    let mut seen = std::collections::HashSet::new();
    let mut previous: Option<(String, String)> = None;
    let mut cursor = String::new();
    let mut pages = 0;
    loop {
        let page = get_json(
            &client,
            format!("{admin_url}/events?state=pending&limit=500&cursor={cursor}"),
        )
        .await;
        pages += 1;
        for event in page["events"].as_array().unwrap() {
            let id = event["event_id"].as_str().unwrap().to_owned();
            let received = event["received_at"].as_str().unwrap().to_owned();
            assert!(parse_rfc3339(&received).is_some(), "{received}");
            if let Some((before, before_id)) = &previous {
                assert!(
                    (before.as_str(), before_id.as_str()) > (received.as_str(), id.as_str()),
                    "newest first: {before} {before_id} then {received} {id}"
                );
            }
            assert!(seen.insert(id.clone()), "{id} listed twice");
            previous = Some((received, id));
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = next.to_owned(),
            None => break,
        }
    }
    assert_eq!(seen.len(), total, "{}: every event once", DB::LABEL);
    assert_eq!(pages, 3);

    let count = |query: String| {
        let client = client.clone();
        let admin_url = admin_url.clone();
        async move {
            let page = get_json(&client, format!("{admin_url}/events?limit=500&{query}")).await;
            page["events"].as_array().unwrap().len()
        }
    };
    assert_eq!(count("type=invoice.paid".into()).await, 103);
    assert_eq!(count("provider=github".into()).await, 0);
    assert_eq!(count("state=failed".into()).await, 0);
    assert_eq!(
        count(format!("received_before={started}&provider=stripe")).await,
        0
    );
    assert_eq!(
        count("received_after=2999-01-01T00:00:00Z&state=&provider=".into()).await,
        0
    );
    let forged = get(&client, format!("{admin_url}/events?cursor=abc")).await;
    assert_eq!(forged.status(), 400);
    let bad_time = get(
        &client,
        format!("{admin_url}/events?received_after=yesterday"),
    )
    .await;
    assert_eq!(bad_time.status(), 400);
    setup.cleanup().await;
}

/// Failed events of two types and one processed event, acknowledged with their signature
/// header kept: the detail shows the error and body and redacts the signature; form posts (as
/// another site's page can make a browser send) are refused `403` and change nothing; discard
/// deletes one failed event; the bulk retry's dry run counts the matching failed events and
/// changes nothing; the retry at 5 per second puts exactly those back with due times 200 ms
/// apart, and the worker attempts none of them before its due time.
async fn operator_actions<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let worker = quick(setup.inbox.worker(probe.handler::<DB>())).spawn();
    let ack = setup
        .inbox
        .ack(StripeVerifier::new([SECRET]))
        .keep_header(HeaderName::from_static("stripe-signature"));
    let app = Router::new().route("/inbox/stripe", post_service(ack));
    let url = format!("{}/inbox/stripe", serve_router(app).await);
    let admin_url = serve_router(admin::router(setup.inbox.clone())).await;
    let client = reqwest::Client::new();
    let poison: Vec<String> = (0..5).map(|n| format!("evt_poison_{n}")).collect();
    let permanent: Vec<String> = (0..3).map(|n| format!("evt_permanent_{n}")).collect();
    for id in &poison {
        let body = event_body(id, "test.poison");
        assert_eq!(deliver(&client, &url, SECRET, &body).await, 200);
    }
    for id in &permanent {
        let body = event_body(id, "test.permanent");
        assert_eq!(deliver(&client, &url, SECRET, &body).await, 200);
    }
    let ok = event_body("evt_fine", "charge.succeeded");
    assert_eq!(deliver(&client, &url, SECRET, &ok).await, 200);
    for id in poison.iter().chain(&permanent) {
        setup.wait_for(id, EventState::Failed).await;
    }
    setup.wait_for("evt_fine", EventState::Processed).await;
    assert!(worker.drain(Duration::from_secs(30)).await);

    let detail = get_json(&client, format!("{admin_url}/events/stripe/evt_poison_0")).await;
    assert_eq!(detail["state"], "failed", "{detail}");
    assert_eq!(detail["type"], "test.poison");
    assert_eq!(detail["attempts"], 1);
    assert_eq!(detail["last_error"], "poisoned event: refusing it");
    assert!(detail["body_pretty"]
        .as_str()
        .unwrap()
        .contains("\n  \"type\": \"test.poison\""));
    let headers = detail["headers"].as_array().unwrap();
    let signature = headers
        .iter()
        .find(|header| header[0] == "stripe-signature")
        .expect("the kept signature header is listed");
    assert_eq!(signature[1], REDACTED, "{detail}");
    assert!(parse_rfc3339(detail["finished_at"].as_str().unwrap()).is_some());
    let missing = get(&client, format!("{admin_url}/events/stripe/evt_none")).await;
    assert_eq!(missing.status(), 404);

    // What a cross-site form can send: refused, nothing changed.
    let form = |path: &str, body: &'static str| {
        client
            .post(format!("{admin_url}{path}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("origin", "https://evil.example")
            .body(body)
            .send()
    };
    for (path, body) in [
        ("/events/stripe/evt_poison_4/discard", ""),
        ("/events/stripe/evt_poison_4/retry", ""),
        ("/failed/stripe/evt_poison_4/retry", ""),
        ("/retry", "dry_run=false"),
        ("/purge?older_than_secs=0", ""),
    ] {
        let status = form(path, body).await.unwrap().status();
        assert_eq!(status, 403, "{}: {path}", DB::LABEL);
    }
    let text_plain = client
        .post(format!("{admin_url}/retry"))
        .header("content-type", "text/plain")
        .body(r#"{"filter":{}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(text_plain.status(), 403);
    assert_eq!(setup.inbox.counts().await.unwrap().failed, 8);
    assert_eq!(setup.inbox.counts().await.unwrap().processed, 1);

    let admin_post = |path: &str| {
        client
            .post(format!("{admin_url}{path}"))
            .header("x-inbox-admin", "1")
            .send()
    };
    let discard = "/events/stripe/evt_poison_4/discard";
    assert_eq!(admin_post(discard).await.unwrap().status(), 204);
    assert_eq!(admin_post(discard).await.unwrap().status(), 404);
    let fine = "/events/stripe/evt_fine/discard";
    assert_eq!(admin_post(fine).await.unwrap().status(), 404, "not failed");
    let key = EventKey::new("stripe", "evt_poison_4");
    assert_eq!(setup.inbox.get(&key).await.unwrap(), None);

    let bulk = |body: serde_json::Value| {
        client
            .post(format!("{admin_url}/retry"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let dry = json(
        bulk(serde_json::json!({"filter": {"type": "test.poison"}, "dry_run": true}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(dry["matched"], 4, "{dry}");
    assert_eq!(dry["retried"], 0);
    assert_eq!(setup.inbox.counts().await.unwrap().failed, 7);
    let typo = bulk(serde_json::json!({"filter": {"kind": "test.poison"}}))
        .await
        .unwrap();
    assert_eq!(typo.status(), 422, "an unknown filter field is refused");

    let done = json(
        bulk(serde_json::json!({"filter": {"type": "test.poison"}, "per_second": 5}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(done["matched"], 4, "{done}");
    assert_eq!(done["retried"], 4);
    let mut due = std::collections::HashMap::new();
    for id in &poison[..4] {
        let event = setup.event(id).await;
        assert_eq!(event.state, EventState::Pending, "{id}");
        assert_eq!(event.attempts, 0);
        due.insert(id.clone(), event.available_at_ms);
    }
    let mut times: Vec<i64> = due.values().copied().collect();
    times.sort_unstable();
    let gaps: Vec<i64> = times.windows(2).map(|pair| pair[1] - pair[0]).collect();
    assert_eq!(gaps, [200, 200, 200], "due times at 5 per second");
    for id in &permanent {
        let event = setup.event(id).await;
        assert_eq!(
            event.state,
            EventState::Failed,
            "{id} is not of the filter's type"
        );
    }

    // Released at the rate: the worker attempts none of the four before its due time.
    let (released, released_wall) = (Instant::now(), std::time::SystemTime::now());
    let worker = quick(setup.inbox.worker(probe.handler::<DB>())).spawn();
    for id in &poison[..4] {
        setup.wait_for(id, EventState::Failed).await;
    }
    assert!(worker.drain(Duration::from_secs(30)).await);
    let released_ms = i64::try_from(
        released_wall
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let attempts: Vec<(String, i64)> = probe
        .order()
        .into_iter()
        .filter(|(_, at)| *at >= released)
        .map(|(id, at)| {
            let after = i64::try_from((at - released).as_millis()).unwrap();
            (id, released_ms + after)
        })
        .collect();
    assert_eq!(attempts.len(), 4, "each retried event attempted once");
    for (id, at) in &attempts {
        // The wall clock and the monotonic clock agree to within a couple of milliseconds.
        assert!(
            *at + 2 >= due[id],
            "{}: {id} attempted {} ms before its due time",
            DB::LABEL,
            due[id] - at
        );
    }
    setup.cleanup().await;
}

on_both!(and_mysql: listing_pages_past_a_thousand, operator_actions);
