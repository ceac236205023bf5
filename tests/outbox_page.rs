//! The outbox's operator page in a real browser: headless Chromium, driven through chromedriver
//! (WebDriver), against the reference receiver as a child process with `INBOX_ADMIN=1` and
//! `OUTBOX_TARGET_URL` pointing at this test's server, on SQLite and on Postgres. The server
//! refuses (`400`) until the test switches it to accept, so a `test.outbox` event's message fails
//! at once: the page lists it, its detail shows the refusal and the attempt on record, "Retry" puts it back and the relay
//! delivers it once (the server counts accepted requests per `Idempotency-Key`); the last hour's
//! charts count the message enqueued and failed, then delivered. The test writes
//! the page's screenshot to `target/tmp/outbox-page.png` (docs/outbox-page.png is a copy).
//!
//! Under `CI=true` a missing `/usr/bin/chromium` or `/usr/bin/chromedriver` fails the test.
#![cfg(unix)]

mod browser;
mod receiver_process;
mod support;

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use axum::{extract::State, http::HeaderMap, http::StatusCode, routing::post, Router};
use browser::{attrs, browser_installed, click, deliver, open_page, text_until, texts, Driver};
use fantoccini::Locator;
use receiver_process::{sqlite_store, Database, Receiver};
use serde_json::Value;
use support::*;
use tower_idempotency_testkit::Server;

const SECRET: &str = "whsec_outbox_page_test";

/// The outbox's target: refuses with `400` until `accept` is set, then answers `200`; counts
/// the requests it refused and accepted per `Idempotency-Key`.
#[derive(Clone, Default)]
struct Target {
    accept: Arc<AtomicBool>,
    refused: Arc<Mutex<HashMap<String, u32>>>,
    accepted: Arc<Mutex<HashMap<String, u32>>>,
}

impl Target {
    fn count(map: &Mutex<HashMap<String, u32>>, key: &str) -> u32 {
        map.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

async fn orders(State(target): State<Target>, headers: HeaderMap) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let (map, status) = if target.accept.load(Ordering::SeqCst) {
        (&target.accepted, StatusCode::OK)
    } else {
        (&target.refused, StatusCode::BAD_REQUEST)
    };
    *map.lock().unwrap().entry(key).or_default() += 1;
    status
}

fn body(id: &str) -> String {
    format!(r#"{{"id":"{id}","object":"event","type":"test.outbox","data":{{"object":{{}}}}}}"#)
}

/// The message from the admin JSON route, once `done` holds (20 s at most).
async fn message_until(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let found = || async {
        let response = client
            .get(format!("{base}/admin/outbox/message"))
            .query(&[("key", key)])
            .send()
            .await
            .unwrap();
        if response.status() == 200 {
            Some(serde_json::from_slice::<Value>(&response.bytes().await.unwrap()).unwrap())
        } else {
            None
        }
    };
    let settled = |found: &Option<Value>| found.as_ref().is_some_and(&done);
    let what = format!("{key} settling");
    poll_until(&what, Duration::from_millis(25), found, settled)
        .await
        .expect("settled")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_page_lists_shows_and_retries_in_chromium_sqlite() {
    if !browser_installed("the outbox page's browser test") {
        return;
    }
    let (_dir, store) = sqlite_store("outbox-page");
    outbox_page(&store, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_page_lists_shows_and_retries_in_chromium_postgres() {
    if !browser_installed("the outbox page's browser test") {
        return;
    }
    let database = Database::create(format!("tidem_opage_{}", random_suffix())).await;
    outbox_page(&database.url(), false).await;
}

/// The page against a receiver on `store`; `screenshot`: write it.
async fn outbox_page(store: &str, screenshot: bool) {
    let target = Target::default();
    let server = Server::start(
        Router::new()
            .route("/orders", post(orders))
            .with_state(target.clone()),
    )
    .await;
    let url = format!("http://{}/orders", server.addr);
    let receiver = Receiver::stripe(
        store,
        SECRET,
        &[
            ("INBOX_ADMIN", "1".to_owned()),
            ("INBOX_MAX_ATTEMPTS", "3".to_owned()),
            ("INBOX_BACKOFF_MS", "10".to_owned()),
            ("INBOX_SWEEP_MS", "20".to_owned()),
            ("OUTBOX_TARGET_URL", url.clone()),
        ],
    );
    let base = receiver.base.clone();
    let client = reqwest::Client::new();
    // The event id (and so the message key) is text on the page, not markup.
    let event = "evt_outbox_page<script>";
    let key = format!("{event}/0");
    deliver(&client, &base, SECRET, &body(event)).await;
    let failed = message_until(&client, &base, &key, |m| m["state"] == "failed").await;
    assert_eq!(failed["attempts"], 1, "a 400 fails the message at once");
    assert_eq!(Target::count(&target.refused, &key), 1);

    let driver = Driver::start();
    let browser = driver.session().await;
    open_page(&browser, &format!("{base}/admin/outbox")).await;
    let listed = attrs(&browser, "#messages tbody tr", "data-key").await;
    assert_eq!(
        listed,
        vec![key.clone()],
        "the page lists the failed message"
    );
    // pending, delivered, failed, discarded
    let counts = texts(&browser, "#counts tbody td").await;
    assert_eq!(counts, ["0", "0", "1", "0"]);
    text_until(&browser, "#messages td.err", "HTTP 400").await;
    // The last hour's charts: the one message enqueued and failed.
    let mount = format!("{base}/admin/outbox");
    let totals = [("received", 1), ("delivered", 0), ("failed", 1)];
    browser::assert_charts(&browser, &client, &mount, totals).await;
    browser::assert_fits_the_window(&browser, "the overview").await;
    if screenshot {
        browser::screenshot(&browser, "outbox-page.png").await;
    }

    // The detail, reached by its link.
    click(&browser, Locator::LinkText(&key)).await;
    text_until(&browser, "#message-key", &key).await;
    browser::assert_fits_the_window(&browser, "a message's page").await;
    let error = text_until(&browser, "#last-error", "refused").await;
    // Its one attempt is on record: failed, with the target's status.
    let outcomes = texts(&browser, "#attempts td.outcome").await;
    assert_eq!(outcomes, ["failed"]);
    let cells = texts(&browser, "#attempts tbody td.num").await;
    assert!(cells.contains(&"400".to_owned()), "{cells:?}");
    assert_eq!(error, "HTTP 400: the receiver refused the message with 400");
    assert_eq!(text_until(&browser, "#method", "POST").await, "POST");
    assert_eq!(text_until(&browser, "#url", &url).await, url);
    let shown = text_until(&browser, "#body", "\"event\"").await;
    assert_eq!(shown, format!("{{\n  \"event\": \"{event}\"\n}}"));

    // The target accepts from now on; "Retry" puts the message back and the relay delivers it.
    target.accept.store(true, Ordering::SeqCst);
    click(&browser, Locator::Id("retry")).await;
    text_until(&browser, "#status", "Retried").await;
    let delivered = message_until(&client, &base, &key, |m| m["state"] == "delivered").await;
    assert_eq!(delivered["attempts"], 1, "one attempt after the retry");
    assert_eq!(delivered["last_status"], 200);
    assert_eq!(Target::count(&target.accepted, &key), 1, "delivered once");
    assert_eq!(Target::count(&target.refused, &key), 1);
    // A second retry finds nothing failed.
    browser.refresh().await.unwrap();
    text_until(&browser, "#state", "delivered").await;
    assert!(browser.find(Locator::Id("retry")).await.is_err());
    // The charts read the rows as they are: the message now counts as delivered, not failed.
    browser.goto(&format!("{mount}/page")).await.unwrap();
    let totals = [("received", 1), ("delivered", 1), ("failed", 0)];
    browser::assert_charts(&browser, &client, &mount, totals).await;

    // The overview's audit: the page's retry, made by the operator the receiver's extractor
    // names.
    open_page(&browser, &format!("{base}/admin/outbox")).await;
    let actions = texts(&browser, "#audit td.action").await;
    assert_eq!(actions, ["retry"]);
    assert_eq!(
        texts(&browser, "#audit td.who").await,
        ["receiver-operator"]
    );
    assert_eq!(texts(&browser, "#audit td.err").await, [key.as_str()]);

    browser.close().await.unwrap();
    drop(driver);
    drop(receiver);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_paused_from_the_outbox_page_waits_for_its_resume_sqlite() {
    if !browser_installed("the outbox page's pause test") {
        return;
    }
    let (_dir, store) = sqlite_store("outbox-pause");
    host_paused_from_the_page(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_paused_from_the_outbox_page_waits_for_its_resume_postgres() {
    if !browser_installed("the outbox page's pause test") {
        return;
    }
    let database = Database::create(format!("tidem_opause_{}", random_suffix())).await;
    host_paused_from_the_page(&database.url()).await;
}

/// The target's host is paused from the page's form: the page lists the pause, a message to it
/// stays pending with no attempt and reads `paused`; "Resume" delivers it once.
async fn host_paused_from_the_page(store: &str) {
    let target = Target::default();
    target.accept.store(true, Ordering::SeqCst);
    let server = Server::start(
        Router::new()
            .route("/orders", post(orders))
            .with_state(target.clone()),
    )
    .await;
    let receiver = Receiver::stripe(
        store,
        SECRET,
        &[
            ("INBOX_ADMIN", "1".to_owned()),
            ("INBOX_BACKOFF_MS", "10".to_owned()),
            ("INBOX_SWEEP_MS", "20".to_owned()),
            (
                "OUTBOX_TARGET_URL",
                format!("http://{}/orders", server.addr),
            ),
        ],
    );
    let base = receiver.base.clone();
    let client = reqwest::Client::new();
    let driver = Driver::start();
    let browser = driver.session().await;
    let page = open_page(&browser, &format!("{base}/admin/outbox")).await;
    text_until(&browser, "#no-pauses", "Nothing is paused").await;
    let host = browser.find(Locator::Id("pause-host")).await.unwrap();
    host.send_keys(" 127.0.0.1 ").await.unwrap();
    click(&browser, Locator::Id("pause")).await;
    text_until(&browser, "#pauses tbody td", "127.0.0.1").await;
    let by = texts(&browser, "#pauses tbody td").await;
    assert_eq!(by[2], "receiver-operator", "{by:?}");

    let key = "evt_outbox_pause/0";
    deliver(&client, &base, SECRET, &body("evt_outbox_pause")).await;
    let parked = message_until(&client, &base, key, |m| {
        m["available_at_ms"] == tower_idempotency::jobs::PARKED_AT
    })
    .await;
    assert_eq!(
        (parked["state"].as_str(), parked["attempts"].as_u64()),
        (Some("pending"), Some(0))
    );
    assert_eq!(
        Target::count(&target.accepted, key),
        0,
        "not delivered while paused"
    );
    browser
        .goto(&format!("{page}?state=pending"))
        .await
        .unwrap();
    let state = texts(&browser, "#messages tbody td:nth-child(4)").await;
    assert_eq!(state, ["paused"]);

    click(&browser, Locator::Css("button[data-resume=\"127.0.0.1\"]")).await;
    text_until(&browser, "#no-pauses", "Nothing is paused").await;
    let delivered = message_until(&client, &base, key, |m| m["state"] == "delivered").await;
    assert_eq!(delivered["attempts"], 1, "one attempt after the resume");
    assert_eq!(Target::count(&target.accepted, key), 1, "delivered once");

    browser.close().await.unwrap();
    drop(driver);
    drop(receiver);
    server.stop().await;
}
