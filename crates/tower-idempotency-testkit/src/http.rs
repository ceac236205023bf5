//! Apps served over real HTTP on free loopback ports.

use std::net::SocketAddr;

use axum::{
    body::{Body, Bytes},
    http::{Request, StatusCode},
    Router,
};
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};

/// Serves `app` on a free loopback port until the test's runtime ends, and answers its base URL
/// (`http://127.0.0.1:port`, no trailing slash).
///
/// # Panics
///
/// When no loopback port can be bound; the server task panics when serving fails.
pub async fn serve(app: Router) -> String {
    let listener = bind().await;
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    format!("http://{addr}")
}

/// An app on a free loopback port that shuts down gracefully when dropped, for tests that must
/// see the server go (or must not leave it running into the next case).
pub struct Server {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Server {
    /// Serves `app` on a free loopback port.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound; the server task panics when serving fails.
    pub async fn start(app: Router) -> Self {
        let listener = bind().await;
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .expect("serve");
        });
        Self {
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Shuts the server down and waits until it has finished its open connections.
    ///
    /// # Panics
    ///
    /// When serving failed.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("the server ends cleanly");
        }
    }

    /// `http://127.0.0.1:port` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback")
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
