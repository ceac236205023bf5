//! Apps served over real HTTP on free loopback ports.

use axum::{
    body::{Body, Bytes},
    http::{HeaderMap, HeaderValue, Request, StatusCode},
    Router,
};
use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

use tokio::{net::TcpListener, sync::Notify};
use tower_idempotency_core::CachedResponse;

/// An app on a free loopback port that shuts down gracefully when dropped: the conformance
/// suite's.
pub use tower_idempotency_core::conformance::LoopbackServer as Server;

/// Serves `app` on a free loopback port until the test's runtime ends, and answers its base URL
/// (`http://127.0.0.1:port`, no trailing slash).
///
/// # Panics
///
/// When no loopback port can be bound; the server task panics when serving fails.
pub async fn serve(app: Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    format!("http://{addr}")
}

/// The handler the layer's bench and profile loop measure around: `201 Created` with the request's
/// body, so that a replay's cost grows with the body as a real one's does.
pub async fn echo_created(body: Bytes) -> (StatusCode, Bytes) {
    (StatusCode::CREATED, body)
}

/// A JSON `POST /orders` of `body` under idempotency key `key`, for [`echo_created`] behind the
/// layer.
///
/// # Panics
///
/// When `key` is not a valid header value.
pub fn order_request(key: &str, body: &Bytes) -> Request<Body> {
    Request::post("/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(body.clone()))
        .expect("valid request")
}

/// A recorded `201 Created` JSON response whose body is `size` bytes, for the stores' benches.
pub fn created_json(size: usize) -> CachedResponse {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    CachedResponse {
        status: StatusCode::CREATED,
        headers,
        body: Bytes::from(vec![b'x'; size]),
        body_omitted: false,
    }
}

/// The load harness's request body: a JSON order of `size` bytes (padded in its `note`; never
/// shorter than the order itself).
pub fn order_body(size: usize) -> Bytes {
    const HEAD: &[u8] = br#"{"customer":"cus_4f1c9a","currency":"eur","items":[{"sku":"sku-001","qty":2,"price":1999},{"sku":"sku-002","qty":1,"price":4999}],"note":""#;
    const TAIL: &[u8] = br#""}"#;
    let mut body = Vec::with_capacity(size.max(HEAD.len() + TAIL.len()));
    body.extend_from_slice(HEAD);
    body.resize(size.saturating_sub(TAIL.len()).max(HEAD.len()), b'x');
    body.extend_from_slice(TAIL);
    Bytes::from(body)
}

/// Sends a delivery `request` (a webhook provider's signed `POST`) and answers its status.
///
/// # Panics
///
/// When the request cannot be sent.
pub async fn delivery_status(request: reqwest::RequestBuilder) -> u16 {
    request.send().await.expect("deliver").status().as_u16()
}

/// Sends `POST url` with the body `{}` under idempotency key `key`: the response, and whether the
/// layer answered it as a replay (`Idempotent-Replayed: true`).
///
/// # Panics
///
/// When the request cannot be sent.
pub async fn post_order(
    client: &reqwest::Client,
    url: &str,
    key: &str,
) -> (reqwest::Response, bool) {
    let response = client
        .post(url)
        .header("idempotency-key", key)
        .body("{}")
        .send()
        .await
        .expect("request");
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    (response, replayed)
}

/// The state of a test handler that counts its executions and, when made
/// [`blocking`](Self::blocking), holds the first one: it notifies `started` and waits for
/// `proceed`, so a test can send duplicates while the first request runs.
#[derive(Clone, Debug, Default)]
pub struct HeldHandler {
    /// Executions so far.
    pub executions: Arc<AtomicUsize>,
    /// Notified when a blocking handler's first execution starts.
    pub started: Arc<Notify>,
    /// Lets a blocking handler's first execution go on.
    pub proceed: Arc<Notify>,
    /// Whether the first execution waits for `proceed`.
    pub block: bool,
}

impl HeldHandler {
    /// A handler whose first execution waits for `proceed`.
    pub fn blocking() -> Self {
        Self {
            block: true,
            ..Self::default()
        }
    }

    /// Counts an execution and answers its number (from 1). Only the first execution of a
    /// blocking handler waits: a second one (a regression) must answer, not hang.
    pub async fn execute(&self) -> usize {
        let n = self.executions.fetch_add(1, Ordering::SeqCst) + 1;
        if self.block && n == 1 {
            self.started.notify_one();
            self.proceed.notified().await;
        }
        n
    }

    /// Executions so far.
    pub fn count(&self) -> usize {
        self.executions.load(Ordering::SeqCst)
    }
}
