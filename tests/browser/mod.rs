//! The browser tests' helpers: chromedriver on a reserved loopback port driving headless
//! Chromium (fantoccini), waiting for a page's text, and a signed Stripe delivery to the
//! receiver under test.
#![allow(dead_code)]

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use fantoccini::{Client, ClientBuilder, Locator};
use tower_idempotency::webhooks::stripe;
use tower_idempotency_testkit::{skip, unix_now, ReservedPort};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// chromedriver on a reserved loopback port, killed on drop.
pub struct Driver {
    child: Child,
    pub url: String,
    _port: ReservedPort,
}

impl Driver {
    pub fn start() -> Self {
        let port = ReservedPort::new();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={}", port.port()))
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        Self {
            child,
            url: format!("http://127.0.0.1:{}", port.port()),
            _port: port,
        }
    }

    /// A headless Chromium session, waiting for chromedriver to listen (20 s at most).
    pub async fn session(&self) -> Client {
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".to_owned(),
            serde_json::json!({
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                         "--disable-gpu", "--window-size=1280,1000"],
            }),
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(capabilities.clone())
                .connect(&self.url)
                .await
            {
                Ok(client) => return client,
                Err(error) => {
                    assert!(
                        Instant::now() < deadline,
                        "chromedriver never answered: {error}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until the element `css` has text containing `want` (20 s at most); answers the text.
pub async fn text_until(browser: &Client, css: &str, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = match browser.find(Locator::Css(css)).await {
            Ok(element) => element.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if text.contains(want) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{css} never read {want:?}: {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether Chromium and chromedriver are installed; under `CI=true` their absence fails.
pub fn browser_installed(test: &str) -> bool {
    let installed = Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists();
    if !installed {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{CHROMIUM} and {CHROMEDRIVER} are needed (Debian: apt-get install chromium chromium-driver)"
        );
        skip(test, "chromium is not installed");
    }
    installed
}

/// Delivers `body` to the receiver's `POST /inbox/stripe`, signed with `secret`; expects `200`.
pub async fn deliver(client: &reqwest::Client, base: &str, secret: &str, body: &str) {
    let status = client
        .post(format!("{base}/inbox/stripe"))
        .header(
            stripe::SIGNATURE_HEADER,
            stripe::sign(secret, unix_now(), body.as_bytes()),
        )
        .body(body.to_owned())
        .send()
        .await
        .expect("deliver")
        .status();
    assert_eq!(status, 200);
}
