//! The browser tests' helpers: chromedriver on a reserved loopback port driving headless
//! Chromium (fantoccini), opening, reading and clicking a page, and a signed Stripe delivery to
//! the receiver under test.
#![allow(dead_code)]

use std::{
    os::unix::process::CommandExt,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use fantoccini::{Client, ClientBuilder, Locator};
use tower_idempotency_testkit::{skip, ReservedPort};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// chromedriver on a reserved loopback port, in a process group of its own: dropped, the group
/// is killed, with the Chromium it started (which a test that failed before closing its session
/// would otherwise leave running).
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
            .process_group(0)
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
        // The group's id is chromedriver's pid (`process_group(0)`).
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until the element `css` has text containing `want` (20 s at most); answers the text.
pub async fn text_until(browser: &Client, css: &str, want: &str) -> String {
    let text = || async {
        match browser.find(Locator::Css(css)).await {
            Ok(element) => element.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    };
    let what = format!("{css} reading {want:?}");
    let reads = |text: &String| text.contains(want);
    tower_idempotency_testkit::poll_until(&what, Duration::from_millis(50), text, reads).await
}

/// Finds the element `locator` and clicks it.
pub async fn click(browser: &Client, locator: Locator<'_>) {
    browser.find(locator).await.unwrap().click().await.unwrap();
}

/// Opens an admin router's mount path `mount` (`{base}/admin/inbox`), which must lead to its
/// `{mount}/page`, and turns the page's refresh off so that no reload replaces the elements under
/// the test; answers the page's URL.
pub async fn open_page(browser: &Client, mount: &str) -> String {
    let page = format!("{mount}/page");
    browser.goto(mount).await.unwrap();
    assert_eq!(browser.current_url().await.unwrap().as_str(), page);
    click(browser, Locator::Id("refresh")).await;
    browser.refresh().await.unwrap();
    page
}

/// The attribute `attr` of every element `css`, in the page's order.
pub async fn attrs(browser: &Client, css: &str, attr: &str) -> Vec<String> {
    let mut values = Vec::new();
    for element in browser.find_all(Locator::Css(css)).await.unwrap() {
        values.push(element.attr(attr).await.unwrap().unwrap());
    }
    values
}

/// The text of every element `css`, in the page's order.
pub async fn texts(browser: &Client, css: &str) -> Vec<String> {
    let mut values = Vec::new();
    for element in browser.find_all(Locator::Css(css)).await.unwrap() {
        values.push(element.text().await.unwrap());
    }
    values
}

/// Asserts that the open page fits the 1280-pixel window: its document is no wider than the
/// viewport, so nothing needs horizontal scrolling.
pub async fn assert_fits_the_window(browser: &Client, what: &str) {
    let widths = browser
        .execute(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth];",
            vec![],
        )
        .await
        .unwrap();
    let (scroll, client) = (widths[0].as_u64().unwrap(), widths[1].as_u64().unwrap());
    assert!(
        scroll <= client,
        "{what} is {scroll} px wide in a {client} px viewport"
    );
}

/// Writes the page's screenshot to `target/tmp/<name>`.
pub async fn screenshot(browser: &Client, name: &str) {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, browser.screenshot().await.unwrap()).unwrap();
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
    assert_eq!(
        crate::receiver_process::deliver_stripe(client, base, secret, body).await,
        200
    );
}

/// Asserts the overview's activity charts (`#chart-counts`, `#chart-lag`) and the admin
/// router's `GET {mount}/activity` agree with `totals`, the jobs received, done (under the
/// page's name for it) and failed in the last hour: the counts chart's series, its legend and
/// its `data-totals`, the lag chart's legend (nothing pending now), an SVG with a title drawn
/// at a readable width, and the JSON route's sixty minutes.
pub async fn assert_charts(
    browser: &Client,
    client: &reqwest::Client,
    mount: &str,
    totals: [(&str, u64); 3],
) {
    let legend: Vec<String> = totals
        .iter()
        .map(|(name, n)| format!("{name} {n}"))
        .collect();
    let shown = texts(browser, "#chart-counts figcaption .series").await;
    assert_eq!(shown, legend, "the counts chart's legend");
    let data: Vec<String> = totals
        .iter()
        .map(|(name, n)| format!("{name}={n}"))
        .collect();
    assert_eq!(
        attrs(browser, "#chart-counts", "data-totals").await,
        [data.join(" ")]
    );
    let names: Vec<&str> = totals.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        attrs(browser, "#chart-counts", "data-series").await,
        [names.join(",")]
    );
    assert_eq!(
        attrs(browser, "#chart-lag", "data-series").await,
        ["oldest"]
    );
    let drawn = browser
        .execute(
            "return ['#chart-counts', '#chart-lag'].map(function (id) { \
               var svg = document.querySelector(id + ' svg'); \
               return [svg.querySelector('title').textContent, \
                       Math.round(svg.getBoundingClientRect().width), \
                       svg.querySelectorAll('polyline').length]; });",
            vec![],
        )
        .await
        .unwrap();
    for chart in drawn.as_array().unwrap() {
        let title = chart[0].as_str().unwrap();
        assert!(title.contains("last hour"), "{title}");
        let width = chart[1].as_u64().unwrap();
        assert!((300..=640).contains(&width), "{title}: {width} px wide");
        assert!(chart[2].as_u64().unwrap() > 1, "{title}: no line drawn");
    }
    let activity = crate::receiver_process::get_json(client, format!("{mount}/activity")).await;
    let minutes = activity["minutes"].as_array().unwrap();
    assert_eq!(minutes.len(), 60);
    let sum = |field: &str| {
        minutes
            .iter()
            .map(|m| m[field].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(
        [sum("received"), sum("done"), sum("failed")],
        totals.map(|(_, n)| n),
        "GET {mount}/activity"
    );
}
