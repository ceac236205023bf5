//! The operator's page in a real browser: headless Chromium, driven through chromedriver
//! (WebDriver), against the reference receiver as a child process with `INBOX_ADMIN=1`, on
//! SQLite and on Postgres. Failing events are listed; one event's detail shows its error; "Retry" puts it back
//! and the worker processes it once; the bulk retry of a type filter shows its count, asks to
//! confirm and retries exactly the matching events; a processed event's "Replay" asks to confirm
//! (saying the handler runs again) and runs it once more; the audit lists each change and who
//! made it; the last hour's charts count the deliveries received, processed and failed. The test
//! writes the page's screenshot to
//! `target/tmp/inbox-page.png` (docs/inbox-page.png is a copy).
//!
//! Under `CI=true` a missing `/usr/bin/chromium` or `/usr/bin/chromedriver` fails the test.
#![cfg(unix)]

mod browser;
mod receiver_process;
mod support;

use std::{path::Path, time::Duration};

use browser::{attrs, browser_installed, click, deliver, open_page, text_until, texts, Driver};
use fantoccini::{Client, Locator};
use receiver_process::{get_json, scalars, sqlite_store, Database, Receiver, TestDir};
use support::*;

const SECRET: &str = "whsec_inbox_page_test";
fn body(id: &str, kind: &str) -> String {
    format!(
        r#"{{"id":"{id}","object":"event","type":"{kind}","data":{{"object":{{"note":"<b>bold</b>"}}}}}}"#
    )
}

/// The event's `(state, attempts)` from the receiver's listing, once `done` holds (20 s at most).
async fn event_until(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    done: impl Fn(&str, u64) -> bool,
) -> (String, u64) {
    let found = || async {
        let page = get_json(client, format!("{base}/inbox/events?limit=500")).await;
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|event| event["event_id"] == id)
            .map(|event| {
                (
                    event["state"].as_str().unwrap().to_owned(),
                    event["attempts"].as_u64().unwrap(),
                )
            })
    };
    let settled = |found: &Option<(String, u64)>| {
        found
            .as_ref()
            .is_some_and(|(state, attempts)| done(state, *attempts))
    };
    let what = format!("{id} settling");
    poll_until(&what, Duration::from_millis(25), found, settled)
        .await
        .expect("settled")
}

async fn event_ids_listed(browser: &Client) -> Vec<String> {
    let mut ids = attrs(browser, "#events tbody tr", "data-event-id").await;
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_page_lists_shows_and_retries_in_chromium_sqlite() {
    if !browser_installed("the operator page's browser test") {
        return;
    }
    let (dir, store) = sqlite_store("inbox-page");
    operator_page(&store, dir.path(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_page_lists_shows_and_retries_in_chromium_postgres() {
    if !browser_installed("the operator page's browser test") {
        return;
    }
    let dir = TestDir::new("inbox-page");
    let database = Database::create(format!("tidem_page_{}", random_suffix())).await;
    operator_page(&database.url(), dir.path(), false).await;
}

/// The page against a receiver on `store`; `dir` holds the heal file; `screenshot`: write it.
async fn operator_page(store: &str, dir: &Path, screenshot: bool) {
    let store = store.to_owned();
    let heal = dir.join("heal");
    let receiver = Receiver::stripe(
        &store,
        SECRET,
        &[
            ("INBOX_ADMIN", "1".to_owned()),
            ("INBOX_HEAL_FILE", heal.display().to_string()),
            ("INBOX_MAX_ATTEMPTS", "2".to_owned()),
            ("INBOX_BACKOFF_MS", "10".to_owned()),
            ("INBOX_SWEEP_MS", "20".to_owned()),
        ],
    );
    let base = receiver.base.clone();
    let client = reqwest::Client::new();
    // One permanent failure to retry alone, two poisoned events and one more permanent failure
    // for the bulk retry by type, and one event that succeeds.
    let single = "evt_page_single<script>";
    let poisoned = ["evt_page_poison_a", "evt_page_poison_b"];
    let other = "evt_page_other";
    deliver(&client, &base, SECRET, &body(single, "test.permanent")).await;
    for id in poisoned {
        deliver(&client, &base, SECRET, &body(id, "test.poison")).await;
    }
    deliver(&client, &base, SECRET, &body(other, "test.permanent")).await;
    deliver(
        &client,
        &base,
        SECRET,
        &body("evt_page_fine", "charge.succeeded"),
    )
    .await;
    for id in [single, poisoned[0], poisoned[1], other] {
        event_until(&client, &base, id, |state, _| state == "failed").await;
    }

    let driver = Driver::start();
    let browser = driver.session().await;
    let page = open_page(&browser, &format!("{base}/admin/inbox")).await;
    let listed = event_ids_listed(&browser).await;
    let mut failed = vec![
        single.to_owned(),
        poisoned[0].to_owned(),
        poisoned[1].to_owned(),
        other.to_owned(),
    ];
    failed.sort();
    assert_eq!(listed, failed, "the page lists the failed events");
    // The stripe row: pending, processed, failed, skipped.
    let counts = texts(&browser, "#counts tbody tr:first-child td").await;
    assert_eq!(counts, ["0", "1", "4", "0"]);
    // The last hour's charts: the five deliveries received, one processed, four failed.
    let mount = format!("{base}/admin/inbox");
    let totals = [("received", 5), ("processed", 1), ("failed", 4)];
    browser::assert_charts(&browser, &client, &mount, totals).await;
    browser::assert_fits_the_window(&browser, "the overview").await;

    // The detail of the single event, reached by its link (its id is text, not markup).
    click(&browser, Locator::LinkText(single)).await;
    text_until(&browser, "#event-id", single).await;
    browser::assert_fits_the_window(&browser, "an event's page").await;
    let error = text_until(&browser, "#last-error", "test.permanent fails permanently").await;
    assert_eq!(error, "test.permanent fails permanently");
    // Its one attempt is on record, failed with the handler's error.
    let outcomes = texts(&browser, "#attempts td.outcome").await;
    assert_eq!(outcomes, ["failed"]);
    let errors = texts(&browser, "#attempts td.err").await;
    assert_eq!(errors, ["test.permanent fails permanently"]);
    let shown = text_until(&browser, "#body", "\"type\": \"test.permanent\"").await;
    assert!(shown.contains("<b>bold</b>"), "the body is text: {shown}");
    std::fs::write(&heal, b"").unwrap();
    click(&browser, Locator::Id("retry")).await;
    text_until(&browser, "#status", "Retried").await;
    let (_, attempts) = event_until(&client, &base, single, |state, _| state == "processed").await;
    assert_eq!(attempts, 1, "processed by one attempt after the retry");
    let effects = "SELECT count(*) FROM inbox_effects WHERE event_id = $1";
    assert_eq!(scalars(&store, effects, single).await[0], 1);

    // Replay of the processed event: the page asks first, saying the handler runs again, then
    // the worker runs it once more; its history shows each run and the replay between.
    browser.refresh().await.unwrap();
    text_until(&browser, "#state", "processed").await;
    assert!(browser.find(Locator::Id("retry")).await.is_err());
    click(&browser, Locator::Id("replay")).await;
    let question = text_until(&browser, "#confirm-text", "runs again").await;
    assert_eq!(
        question,
        "The handler runs again for this event. Replay it?"
    );
    click(&browser, Locator::Id("confirm-cancel")).await;
    assert!(!browser
        .find(Locator::Id("confirm"))
        .await
        .unwrap()
        .is_displayed()
        .await
        .unwrap());
    assert_eq!(
        scalars(&store, effects, single).await[0],
        1,
        "asking and cancelling changed nothing"
    );
    click(&browser, Locator::Id("replay")).await;
    text_until(&browser, "#confirm-text", "runs again").await;
    click(&browser, Locator::Id("confirm-go")).await;
    text_until(&browser, "#status", "Replayed").await;
    let runs = || scalars(&store, effects, single);
    poll_until("the replay's run", Duration::from_millis(25), runs, |n| {
        n[0] == 2
    })
    .await;
    event_until(&client, &base, single, |state, _| state == "processed").await;
    browser.refresh().await.unwrap();
    text_until(&browser, "#state", "processed").await;
    let outcomes = texts(&browser, "#attempts td.outcome").await;
    assert_eq!(outcomes, ["failed", "done", "replayed", "done"]);

    // Bulk retry by type: the count first, then the confirmation.
    browser.goto(&page).await.unwrap();
    let kind = browser.find(Locator::Id("f-type")).await.unwrap();
    kind.send_keys("test.poison").await.unwrap();
    click(&browser, Locator::Css("form.filters button[type=submit]")).await;
    text_until(&browser, "#events-heading", "failed").await;
    let listed = || event_ids_listed(&browser);
    let filtered = |listed: &Vec<String>| listed == &poisoned;
    poll_until(
        "the type filter",
        Duration::from_millis(50),
        listed,
        filtered,
    )
    .await;
    click(&browser, Locator::Id("bulk-retry-count")).await;
    let question = text_until(&browser, "#bulk-retry-text", "match").await;
    assert_eq!(question, "2 failed events match this filter. Retry them?");
    for id in poisoned {
        let (state, _) = event_until(&client, &base, id, |_, _| true).await;
        assert_eq!(state, "failed", "the count changed nothing");
    }
    click(&browser, Locator::Id("bulk-retry-go")).await;
    text_until(&browser, "#status", "Retried 2 of 2").await;
    for id in poisoned {
        event_until(&client, &base, id, |state, _| state == "processed").await;
        assert_eq!(scalars(&store, effects, id).await[0], 1, "{id}");
    }
    let (state, attempts) = event_until(&client, &base, other, |_, _| true).await;
    assert_eq!(
        (state.as_str(), attempts),
        ("failed", 1),
        "outside the filter"
    );

    // The overview's audit, newest first: each change, by the operator the receiver's
    // extractor names, on its events.
    browser.goto(&page).await.unwrap();
    let actions = texts(&browser, "#audit td.action").await;
    assert_eq!(actions, ["bulk_retry", "replay", "retry"]);
    let who = texts(&browser, "#audit td.who").await;
    assert!(who.iter().all(|who| who == "receiver-operator"), "{who:?}");
    let targets = texts(&browser, "#audit td.err").await;
    assert_eq!(
        targets,
        [
            "state=failed type=test.poison".to_owned(),
            format!("stripe/{single}"),
            format!("stripe/{single}"),
        ]
    );
    browser::assert_fits_the_window(&browser, "the overview with its audit").await;
    if screenshot {
        browser::screenshot(&browser, "inbox-page.png").await;
    }

    browser.close().await.unwrap();
    drop(driver);
    drop(receiver);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_paused_from_the_page_waits_for_its_resume_sqlite() {
    if !browser_installed("the operator page's pause test") {
        return;
    }
    let (_dir, store) = sqlite_store("inbox-pause");
    type_paused_from_the_page(&store, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_paused_from_the_page_waits_for_its_resume_postgres() {
    if !browser_installed("the operator page's pause test") {
        return;
    }
    let database = Database::create(format!("tidem_ipause_{}", random_suffix())).await;
    type_paused_from_the_page(&database.url(), false).await;
}

/// A provider's event type is paused from the page's form: the page lists the pause; an event
/// of that type stays pending with no attempt and reads `paused`, while another type's is
/// processed; "Resume" processes it once. `screenshot`: write the pending listing's to
/// `target/tmp/inbox-pause.png`.
async fn type_paused_from_the_page(store: &str, screenshot: bool) {
    let receiver = Receiver::stripe(
        store,
        SECRET,
        &[
            ("INBOX_ADMIN", "1".to_owned()),
            ("INBOX_BACKOFF_MS", "10".to_owned()),
            ("INBOX_SWEEP_MS", "20".to_owned()),
        ],
    );
    let base = receiver.base.clone();
    let client = reqwest::Client::new();
    let driver = Driver::start();
    let browser = driver.session().await;
    let page = open_page(&browser, &format!("{base}/admin/inbox")).await;
    text_until(&browser, "#no-pauses", "Nothing is paused").await;
    let provider = browser.find(Locator::Id("pause-provider")).await.unwrap();
    provider.send_keys("stripe").await.unwrap();
    let kind = browser.find(Locator::Id("pause-type")).await.unwrap();
    kind.send_keys("charge.held").await.unwrap();
    click(&browser, Locator::Id("pause")).await;
    text_until(&browser, "#pauses tbody td", "stripe/charge.held").await;
    let cells = texts(&browser, "#pauses tbody td").await;
    assert_eq!(cells[2], "receiver-operator", "{cells:?}");

    let (held, open) = ("evt_page_held", "evt_page_open");
    deliver(&client, &base, SECRET, &body(held, "charge.held")).await;
    deliver(&client, &base, SECRET, &body(open, "charge.succeeded")).await;
    event_until(&client, &base, open, |state, _| state == "processed").await;
    let parked = || async {
        let page = get_json(&client, format!("{base}/inbox/events?limit=500")).await;
        let events = page["events"].as_array().unwrap().clone();
        events.into_iter().find(|event| event["event_id"] == held)
    };
    let is_parked = |event: &Option<serde_json::Value>| {
        event.as_ref().is_some_and(|event| {
            event["available_at"]
                .as_str()
                .is_some_and(|at| at.starts_with("9999-"))
        })
    };
    let event = poll_until(
        "the held event parked",
        Duration::from_millis(25),
        parked,
        is_parked,
    )
    .await
    .expect("parked");
    assert_eq!(
        (event["state"].as_str(), event["attempts"].as_u64()),
        (Some("pending"), Some(0))
    );
    let effects = "SELECT count(*) FROM inbox_effects WHERE event_id = $1";
    assert_eq!(scalars(store, effects, held).await[0], 0);
    browser
        .goto(&format!("{page}?state=pending"))
        .await
        .unwrap();
    let state = texts(&browser, "#events tbody td:nth-child(4)").await;
    assert_eq!(state, ["paused"]);
    browser::assert_fits_the_window(&browser, "the overview with a pause").await;
    if screenshot {
        browser::screenshot(&browser, "inbox-pause.png").await;
    }

    click(
        &browser,
        Locator::Css("button[data-resume=\"stripe/charge.held\"]"),
    )
    .await;
    text_until(&browser, "#no-pauses", "Nothing is paused").await;
    let (_, attempts) = event_until(&client, &base, held, |state, _| state == "processed").await;
    assert_eq!(attempts, 1, "processed by one attempt after the resume");
    assert_eq!(scalars(store, effects, held).await[0], 1);

    browser.close().await.unwrap();
    drop(driver);
    drop(receiver);
}
