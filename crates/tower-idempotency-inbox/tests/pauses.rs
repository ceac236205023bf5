//! Pausing on SQLite, Postgres and (feature `mysql`) MySQL or MariaDB: a paused event type's
//! and a paused provider's events are acknowledged and stay pending with no attempt spent
//! while other events are processed; another handle on the table (a restart) reads the pauses
//! and its worker keeps the events parked; once resumed, each is processed exactly once.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::*;
use tower_idempotency_inbox::{admin, EventKey, EventState, Inbox, InboxError};
use tower_idempotency_jobs::PARKED_AT;
use tower_idempotency_sqlx::sqlx;

/// Polls until the Stripe event `id` is parked (pending, due at [`PARKED_AT`]); answers its
/// attempts.
async fn wait_parked<DB: Fixture>(inbox: &Inbox<DB>, id: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let event = inbox.get(&EventKey::new("stripe", id)).await.unwrap();
        if let Some(event) = event.as_ref().filter(|event| {
            event.state == EventState::Pending && event.available_at_ms == PARKED_AT
        }) {
            return event.attempts;
        }
        assert!(
            Instant::now() < deadline,
            "{id} was never parked: {event:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn paused_events_wait_for_their_resume<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let inbox = &setup.inbox;
    let sender = Sender::new(inbox).await;
    assert!(inbox
        .pause("stripe", Some("test.held"), "tester")
        .await
        .unwrap());
    assert!(!inbox
        .pause("stripe", Some("test.held"), "other")
        .await
        .unwrap());
    assert!(matches!(
        inbox.pause(" ", None, "tester").await,
        Err(InboxError::InvalidScope(_))
    ));
    let probe = setup.probe();
    let worker = quick(inbox.worker(probe.handler::<DB>())).spawn();
    sender.acknowledged("evt_held", "test.held").await;
    sender.acknowledged("evt_open", "test.open").await;
    setup.wait_for("evt_open", EventState::Processed).await;
    assert_eq!(wait_parked(inbox, "evt_held").await, 0);

    // The whole provider.
    assert!(inbox.pause("stripe", None, "tester").await.unwrap());
    sender.acknowledged("evt_later", "test.open").await;
    assert_eq!(wait_parked(inbox, "evt_later").await, 0);
    assert!(worker.drain(Duration::from_secs(30)).await);
    assert_eq!((probe.runs("evt_held"), probe.runs("evt_later")), (0, 0));
    assert_eq!(inbox.counts().await.unwrap().pending, 2);

    // A restart: another handle on the table reads both pauses; resuming the type leaves the
    // provider paused, so its worker parks the events again.
    let restarted = Inbox::<DB>::new(setup.pool.clone(), &setup.inbox_table).unwrap();
    let scopes: Vec<(String, String)> = restarted
        .pauses()
        .await
        .unwrap()
        .into_iter()
        .map(|pause| (pause.scope, pause.by))
        .collect();
    assert_eq!(
        scopes,
        [
            ("stripe".to_owned(), "tester".to_owned()),
            ("stripe/test.held".to_owned(), "tester".to_owned())
        ]
    );
    let worker = quick(restarted.worker(probe.handler::<DB>())).spawn();
    assert!(restarted.resume("stripe", Some("test.held")).await.unwrap());
    assert!(!restarted.resume("stripe", Some("test.held")).await.unwrap());
    assert_eq!(wait_parked(&restarted, "evt_held").await, 0);
    assert_eq!((probe.runs("evt_held"), probe.runs("evt_later")), (0, 0));

    assert!(restarted.resume("stripe", None).await.unwrap());
    assert!(restarted.pauses().await.unwrap().is_empty());
    for id in ["evt_held", "evt_later"] {
        assert_eq!(
            wait_for_state(&restarted, id, EventState::Processed).await,
            1
        );
    }
    assert!(worker.drain(Duration::from_secs(30)).await);
    for id in ["evt_held", "evt_later", "evt_open"] {
        assert_eq!(probe.runs(id), 1, "{id}");
        assert_eq!(setup.effects(id).await, 1, "{id}");
    }
    setup.cleanup().await;
}

/// The admin router's pause routes: a cross-site form is refused, an empty scope is `400`, a
/// pause `201` then `200`, the listing names it and who paused it, a resume `200` then `404`.
async fn the_pause_routes_answer<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let base = serve_router(admin::router(setup.inbox.clone())).await;
    let client = reqwest::Client::new();
    let post = |path: &str, scope: &str| {
        client
            .post(format!("{base}/{path}"))
            .header("content-type", "application/json")
            .body(serde_json::json!({ "scope": scope }).to_string())
            .send()
    };
    let form = client
        .post(format!("{base}/pauses"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("scope=stripe")
        .send()
        .await
        .unwrap();
    assert_eq!(form.status(), 403);
    assert_eq!(post("pauses", " ").await.unwrap().status(), 400);
    assert_eq!(
        post("pauses", "stripe/invoice.paid")
            .await
            .unwrap()
            .status(),
        201
    );
    assert_eq!(
        post("pauses", "stripe/invoice.paid")
            .await
            .unwrap()
            .status(),
        200
    );
    let listed = get_json(&client, format!("{base}/pauses")).await;
    assert_eq!(listed[0]["scope"], "stripe/invoice.paid", "{listed}");
    assert_eq!(
        listed[0]["by"],
        tower_idempotency_jobs::admin::Operator::UNIDENTIFIED,
        "{listed}"
    );
    let paused = setup.inbox.pauses().await.unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(
        post("pauses/resume", "stripe/invoice.paid")
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        post("pauses/resume", "stripe/invoice.paid")
            .await
            .unwrap()
            .status(),
        404
    );
    assert!(setup.inbox.pauses().await.unwrap().is_empty());
    setup.cleanup().await;
}

on_both!(and_mysql: paused_events_wait_for_their_resume, the_pause_routes_answer);
