//! The operator's page in a real browser: headless Chromium, driven through chromedriver
//! (WebDriver), against the reference receiver as a child process with `INBOX_ADMIN=1`, on
//! SQLite and on Postgres. Failing events are listed; one event's detail shows its error; "Retry" puts it back
//! and the worker processes it once; the bulk retry of a type filter shows its count, asks to
//! confirm and retries exactly the matching events. The test writes the page's screenshot to
//! `target/tmp/inbox-page.png` (docs/inbox-page.png is a copy).
//!
//! Under `CI=true` a missing `/usr/bin/chromium` or `/usr/bin/chromedriver` fails the test.
#![cfg(all(
    feature = "sqlite",
    feature = "postgres",
    feature = "webhooks",
    feature = "inbox",
    unix
))]

mod browser;
mod receiver_process;
mod support;

use std::{
    path::Path,
    time::{Duration, Instant},
};

use browser::{browser_installed, deliver, text_until, Driver};
use fantoccini::{Client, Locator};
use receiver_process::{scalars, Database, Receiver};
use serde_json::Value;
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
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let bytes = client
            .get(format!("{base}/inbox/events?limit=500"))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let page: Value = serde_json::from_slice(&bytes).unwrap();
        let found = page["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|event| event["event_id"] == id)
            .map(|event| {
                (
                    event["state"].as_str().unwrap().to_owned(),
                    event["attempts"].as_u64().unwrap(),
                )
            });
        if let Some((state, attempts)) = &found {
            if done(state, *attempts) {
                return (state.to_owned(), *attempts);
            }
        }
        assert!(Instant::now() < deadline, "{id} never settled: {found:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn event_ids_listed(browser: &Client) -> Vec<String> {
    let mut ids = Vec::new();
    for row in browser
        .find_all(Locator::Css("#events tbody tr"))
        .await
        .unwrap()
    {
        ids.push(row.attr("data-event-id").await.unwrap().unwrap());
    }
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_page_lists_shows_and_retries_in_chromium_sqlite() {
    if !browser_installed("the operator page's browser test") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tidem-inbox-page-{}", random_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("sqlite://{}", dir.join("receiver.db").display());
    operator_page(&store, &dir, true).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_page_lists_shows_and_retries_in_chromium_postgres() {
    if !browser_installed("the operator page's browser test") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tidem-inbox-page-{}", random_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let database = Database::create(format!("tidem_page_{}", random_suffix())).await;
    operator_page(&database.url(), &dir, false).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The page against a receiver on `store`; `dir` holds the heal file; `screenshot`: write it.
async fn operator_page(store: &str, dir: &Path, screenshot: bool) {
    let store = store.to_owned();
    let heal = dir.join("heal");
    let receiver = Receiver::start(&[
        ("IDEMPOTENCY_STORE", store.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        ("INBOX_ADMIN", "1".to_owned()),
        ("INBOX_HEAL_FILE", heal.display().to_string()),
        ("INBOX_MAX_ATTEMPTS", "2".to_owned()),
        ("INBOX_BACKOFF_MS", "10".to_owned()),
        ("INBOX_SWEEP_MS", "20".to_owned()),
    ]);
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
    let page = format!("{base}/admin/inbox/page");
    // The mount path leads to the page.
    browser.goto(&format!("{base}/admin/inbox")).await.unwrap();
    assert_eq!(browser.current_url().await.unwrap().as_str(), page);
    // Turned off so that no reload replaces the elements under the test.
    let refresh = browser.find(Locator::Id("refresh")).await.unwrap();
    refresh.click().await.unwrap();
    browser.refresh().await.unwrap();
    let mut listed = event_ids_listed(&browser).await;
    let mut failed = vec![
        single.to_owned(),
        poisoned[0].to_owned(),
        poisoned[1].to_owned(),
        other.to_owned(),
    ];
    failed.sort();
    assert_eq!(listed, failed, "the page lists the failed events");
    // The stripe row: pending, processed, failed, skipped.
    let mut counts = Vec::new();
    for cell in browser
        .find_all(Locator::Css("#counts tbody tr:first-child td"))
        .await
        .unwrap()
    {
        counts.push(cell.text().await.unwrap());
    }
    assert_eq!(counts, ["0", "1", "4", "0"]);
    if screenshot {
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("inbox-page.png");
        std::fs::write(&target, browser.screenshot().await.unwrap()).unwrap();
    }

    // The detail of the single event, reached by its link (its id is text, not markup).
    browser
        .find(Locator::LinkText(single))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    text_until(&browser, "#event-id", single).await;
    let error = text_until(&browser, "#last-error", "test.permanent fails permanently").await;
    assert_eq!(error, "test.permanent fails permanently");
    let shown = text_until(&browser, "#body", "\"type\": \"test.permanent\"").await;
    assert!(shown.contains("<b>bold</b>"), "the body is text: {shown}");
    std::fs::write(&heal, b"").unwrap();
    browser
        .find(Locator::Id("retry"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    text_until(&browser, "#status", "Retried").await;
    let (_, attempts) = event_until(&client, &base, single, |state, _| state == "processed").await;
    assert_eq!(attempts, 1, "processed by one attempt after the retry");
    let effects = "SELECT count(*) FROM inbox_effects WHERE event_id = $1";
    assert_eq!(scalars(&store, effects, single).await[0], 1);

    // Bulk retry by type: the count first, then the confirmation.
    browser.goto(&page).await.unwrap();
    let kind = browser.find(Locator::Id("f-type")).await.unwrap();
    kind.send_keys("test.poison").await.unwrap();
    browser
        .find(Locator::Css("form.filters button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    text_until(&browser, "#events-heading", "failed").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        listed = event_ids_listed(&browser).await;
        if listed == poisoned {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the type filter lists {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    browser
        .find(Locator::Id("bulk-count"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let question = text_until(&browser, "#bulk-text", "match").await;
    assert_eq!(question, "2 failed events match this filter. Retry them?");
    for id in poisoned {
        let (state, _) = event_until(&client, &base, id, |_, _| true).await;
        assert_eq!(state, "failed", "the count changed nothing");
    }
    browser
        .find(Locator::Id("bulk-go"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
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

    browser.close().await.unwrap();
    drop(driver);
    drop(receiver);
}
