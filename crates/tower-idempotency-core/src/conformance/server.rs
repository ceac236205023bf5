//! The test servers' common parts: a loopback server that stops when dropped, concurrent duplicates, and
//! polling for a condition.

use std::{
    net::SocketAddr,
    sync::{atomic::AtomicUsize, Arc},
    time::Duration,
};

use axum::Router;
use bytes::Bytes;
use http::StatusCode;
use tokio::{sync::oneshot, task::JoinHandle};

/// An app served on a free loopback port that shuts down gracefully when dropped or stopped,
/// for checks and tests that must see the server go (or must not leave it running into the
/// next case).
pub struct LoopbackServer {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl LoopbackServer {
    /// Serves `app` on a free loopback port.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound; the server task panics when serving fails.
    pub async fn start(app: Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
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

impl Drop for LoopbackServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A test server: `POST /orders` behind the layer, counting handler executions.
pub(super) struct Server {
    pub(super) url: String,
    pub(super) executions: Arc<AtomicUsize>,
    _server: LoopbackServer,
}

impl Server {
    /// Serves `app` on a loopback port until the returned server is dropped.
    pub(super) async fn start(app: Router, executions: Arc<AtomicUsize>) -> Self {
        let server = LoopbackServer::start(app).await;
        Self {
            url: server.url("/orders"),
            executions,
            _server: server,
        }
    }

    /// Sends 25 identical POSTs under `key` to this server at once (see [`concurrent_posts`]).
    pub(super) async fn concurrent_posts(&self, key: &str) -> Vec<(StatusCode, bool, Bytes)> {
        let urls = std::slice::from_ref(&self.url);
        concurrent_posts(&reqwest::Client::new(), urls, key).await
    }
}

/// Sends 25 identical POSTs at once, spread over `urls`; answers each one's status, whether it
/// was a replay, and its body.
pub(super) async fn concurrent_posts(
    client: &reqwest::Client,
    urls: &[String],
    key: &str,
) -> Vec<(StatusCode, bool, Bytes)> {
    const CONCURRENT: usize = 25;
    let barrier = Arc::new(tokio::sync::Barrier::new(CONCURRENT));
    let requests: Vec<_> = (0..CONCURRENT)
        .map(|i| {
            let (client, barrier, key) = (client.clone(), barrier.clone(), key.to_owned());
            let url = urls[i % urls.len()].clone();
            tokio::spawn(async move {
                barrier.wait().await;
                let response = client
                    .post(url)
                    .header("idempotency-key", key)
                    .body(r#"{"sku":"book","qty":1}"#)
                    .send()
                    .await
                    .expect("request");
                let status = response.status();
                let replayed = response.headers().contains_key("idempotent-replayed");
                (status, replayed, response.bytes().await.expect("body"))
            })
        })
        .collect();
    let mut answers = Vec::new();
    for request in requests {
        answers.push(request.await.expect("task"));
    }
    answers
}

/// Waits until `condition` holds (polled every 5 ms, at most 30 s: then panics).
pub(super) async fn until(what: &str, condition: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sends one POST of `{}` under `key`; `what` names it in the panic when it gets no response.
pub(super) async fn post_once(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    what: &str,
) -> reqwest::Response {
    client
        .post(url)
        .header("idempotency-key", key)
        .body("{}")
        .send()
        .await
        .unwrap_or_else(|error| panic!("{what}: {error}"))
}
