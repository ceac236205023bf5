//! Replay and the audit over real HTTP, on SQLite, Postgres and MariaDB: a processed event
//! replayed through the admin router runs the handler again and its history shows both runs
//! and the replay between; a failed event is not replayable; a bulk replay's dry run changes
//! nothing and the replay takes exactly the filter's events; every change is audited as made
//! by the operator the caller's own extractor names, and a request it refuses changes nothing.

#[macro_use]
mod common;

use std::time::Duration;

use axum::{extract::FromRequestParts, http::request::Parts, middleware};
use common::*;
use tower_idempotency_inbox::{
    admin::{self, AuditAction, AuditEntry},
    EventKey, EventState,
};
use tower_idempotency_jobs::AttemptOutcome;
use tower_idempotency_sqlx::sqlx;
use tower_idempotency_testkit::{poll_until, CapturedLogs};

/// The signed-in operator, as a user's own auth layer reads it: the `x-operator` header;
/// refused `401` without one.
struct SignedIn(String);

impl std::fmt::Display for SignedIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for SignedIn {
    type Rejection = http::StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .headers
            .get("x-operator")
            .and_then(|value| value.to_str().ok())
            .map(|name| Self(name.to_owned()))
            .ok_or(http::StatusCode::UNAUTHORIZED)
    }
}

/// The outcomes of `id`'s recorded attempts, oldest first.
async fn outcomes<DB: Fixture>(setup: &Setup<DB>, id: &str) -> Vec<AttemptOutcome> {
    let key = EventKey::new("stripe", id);
    let attempts = setup.inbox.attempts(&key).await.unwrap();
    attempts
        .into_iter()
        .map(|attempt| attempt.outcome)
        .collect()
}

/// Waits until `id` is processed after `runs` runs of the handler.
async fn processed_after<DB: Fixture>(setup: &Setup<DB>, probe: &Probe, id: &str, runs: u32) {
    let what = format!("{id} processed after {runs} runs");
    poll_until(
        &what,
        Duration::from_millis(10),
        || async { (setup.event(id).await.state, probe.runs(id)) },
        |(state, seen)| *state == EventState::Processed && *seen == runs,
    )
    .await;
}

async fn replay_and_audit<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let worker = quick(setup.inbox.worker(probe.handler::<DB>())).spawn();
    let url = serve(&setup.inbox).await;
    let admin =
        admin::router(setup.inbox.clone()).layer(middleware::from_fn(admin::operator::<SignedIn>));
    let admin_url = serve_router(admin).await;
    let client = reqwest::Client::new();
    for (id, kind) in [
        ("evt_a", "charge.succeeded"),
        ("evt_b", "charge.succeeded"),
        ("evt_c", "invoice.paid"),
        ("evt_p", "test.permanent"),
    ] {
        assert_eq!(
            deliver(&client, &url, SECRET, &event_body(id, kind)).await,
            200
        );
    }
    for id in ["evt_a", "evt_b", "evt_c"] {
        processed_after(&setup, &probe, id, 1).await;
    }
    setup.wait_for("evt_p", EventState::Failed).await;
    let post = |path: &str, who: Option<&str>, body: Option<serde_json::Value>| {
        let mut request = client
            .post(format!("{admin_url}{path}"))
            .header("x-inbox-admin", "1");
        if let Some(who) = who {
            request = request.header("x-operator", who);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        request.send()
    };

    // Without an operator the caller's extractor refuses it, and nothing changes.
    let refused = post("/events/stripe/evt_a/replay", None, None)
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    assert_eq!(setup.event("evt_a").await.state, EventState::Processed);

    // One event: the handler runs it again, and its history shows both runs.
    let replayed = post("/events/stripe/evt_a/replay", Some("alice"), None)
        .await
        .unwrap();
    assert_eq!(replayed.status(), 202, "{}", DB::LABEL);
    processed_after(&setup, &probe, "evt_a", 2).await;
    assert_eq!(
        setup.effects("evt_a").await,
        2,
        "the handler's effect twice"
    );
    assert_eq!(
        outcomes(&setup, "evt_a").await,
        [
            AttemptOutcome::Done,
            AttemptOutcome::Replayed,
            AttemptOutcome::Done
        ]
    );
    assert_eq!(setup.event("evt_a").await.attempts, 1, "a fresh count");
    // A failed event is retried, not replayed; an unknown one is not found.
    for path in [
        "/events/stripe/evt_p/replay",
        "/events/stripe/evt_none/replay",
    ] {
        let status = post(path, Some("alice"), None).await.unwrap().status();
        assert_eq!(status, 404, "{path}");
    }
    assert_eq!(setup.event("evt_p").await.state, EventState::Failed);

    // In bulk by type: the dry run counts and changes nothing; the replay takes exactly those.
    let filter = serde_json::json!({"type": "charge.succeeded"});
    let dry = post(
        "/replay",
        Some("bob"),
        Some(serde_json::json!({"filter": filter, "dry_run": true})),
    )
    .await
    .unwrap();
    assert_eq!(dry.status(), 200, "{}", DB::LABEL);
    let dry = json(dry).await;
    assert_eq!(
        (dry["matched"].as_u64(), dry["replayed"].as_u64()),
        (Some(2), Some(0))
    );
    assert_eq!(setup.event("evt_b").await.state, EventState::Processed);
    let bulk = post(
        "/replay",
        Some("bob"),
        Some(serde_json::json!({"filter": filter})),
    )
    .await
    .unwrap();
    let bulk = json(bulk).await;
    assert_eq!(
        (bulk["matched"].as_u64(), bulk["replayed"].as_u64()),
        (Some(2), Some(2))
    );
    processed_after(&setup, &probe, "evt_a", 3).await;
    processed_after(&setup, &probe, "evt_b", 2).await;
    assert_eq!(probe.runs("evt_c"), 1, "another type is not replayed");
    let purge = post("/purge?older_than_secs=3600", Some("carol"), None)
        .await
        .unwrap();
    assert_eq!(purge.status(), 200);

    // The audit: newest first, who the extractor named, what, on which events, how many.
    let audit = client
        .get(format!("{admin_url}/audit"))
        .header("x-operator", "dave")
        .send()
        .await
        .unwrap();
    let audit = json(audit).await;
    let entries: Vec<(String, String, String, u64)> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            (
                entry["who"].as_str().unwrap().to_owned(),
                entry["action"].as_str().unwrap().to_owned(),
                entry["target"].as_str().unwrap().to_owned(),
                entry["changed"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected = [
        ("carol", "purge", "finished more than 3600 s ago", 0),
        ("bob", "bulk_replay", "type=charge.succeeded", 2),
        ("alice", "replay", "stripe/evt_a", 1),
    ]
    .map(|(who, action, target, changed)| (who.into(), action.into(), target.into(), changed));
    assert_eq!(entries, expected, "{}", DB::LABEL);
    let stored = setup.inbox.audit_log(1).await.unwrap();
    assert_eq!(stored[0].action, Some(AuditAction::Purge));

    // Each entry is logged too, under the audit's target, with its fields.
    let (logs, guard) = CapturedLogs::start(tracing::Level::INFO);
    let entry = AuditEntry::now("erin", AuditAction::Discard, "stripe/evt_x", 1);
    setup.inbox.audit(&entry).await.unwrap();
    drop(guard);
    let line = logs.text();
    for field in [
        "tower_idempotency::audit",
        "who=erin",
        "discard",
        "target=stripe/evt_x",
        "changed=1",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    setup.finish(worker).await;
}

on_both!(and_mysql: replay_and_audit);
