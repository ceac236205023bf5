//! The layer over real HTTP: a server on 127.0.0.1:0 and a real client.

use std::{sync::Arc, time::Duration};

use axum::{
    extract::State,
    http::{HeaderMap, StatusCode},
    response::IntoResponse,
    routing::post,
    Extension, Router,
};
use bytes::Bytes;
use tokio::{io::AsyncWriteExt, sync::Notify};
use tower_idempotency_core::{
    CacheDirective, CachePolicy, FingerprintMode, IdempotencyLayer, MemoryStore, Outcome, Principal,
};
use tower_idempotency_testkit::{Call, CapturedLogs, CountingStore, Hooked, Hooks, Outage};

type Handler = tower_idempotency_testkit::HeldHandler;

/// Lets the held first execution of `handler` go on and checks that its caller got the created
/// order.
async fn finish(
    handler: &Handler,
    first: tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
) {
    handler.proceed.notify_one();
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
}

async fn create_order(
    State(h): State<Handler>,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    let n = h.execute().await;
    match headers.get("x-behaviour").and_then(|v| v.to_str().ok()) {
        Some("panic-first") if n == 1 => panic!("handler exploded"),
        Some("fail") => (StatusCode::BAD_REQUEST, "invalid order").into_response(),
        Some("fail-but-final") => (
            StatusCode::PAYMENT_REQUIRED,
            Extension(CacheDirective::Complete),
            "card declined",
        )
            .into_response(),
        Some("big") => {
            (StatusCode::CREATED, [("x-order", "big")], vec![b'x'; 3000]).into_response()
        }
        _ => (
            StatusCode::CREATED,
            [
                ("content-type", "application/json"),
                ("set-cookie", "session=secret-cookie"),
            ],
            format!(
                r#"{{"execution":{n},"echo":{:?}}}"#,
                String::from_utf8_lossy(&body)
            ),
        )
            .into_response(),
    }
}

struct Server {
    base: String,
    client: reqwest::Client,
    _server: tower_idempotency_testkit::Server,
}

impl Server {
    async fn start(layer: IdempotencyLayer, handler: Handler) -> Self {
        Self::start_router(
            Router::new()
                .route("/orders", post(create_order).get(create_order))
                .route_layer(layer)
                .with_state(handler),
        )
        .await
    }

    async fn start_router(app: Router) -> Self {
        let server = tower_idempotency_testkit::Server::start(app).await;
        Self {
            base: server.url(""),
            client: reqwest::Client::new(),
            _server: server,
        }
    }

    /// Serves the counting handler behind a client-keys layer over a memory store.
    async fn client_keys(handler: &Handler) -> Self {
        Self::start(
            IdempotencyLayer::client_keys(MemoryStore::new()),
            handler.clone(),
        )
        .await
    }

    /// Posts `body` with `key` and waits for the response.
    async fn send(&self, key: Option<&str>, body: &'static str) -> reqwest::Response {
        self.post(key, body).send().await.unwrap()
    }

    /// Posts `body` with `key` and one more header, and waits for the response.
    async fn send_with(
        &self,
        key: Option<&str>,
        body: &'static str,
        (name, value): (&str, &str),
    ) -> reqwest::Response {
        self.post(key, body)
            .header(name, value)
            .send()
            .await
            .unwrap()
    }

    /// Posts any body (bytes, a stream) with `key` and waits for the response.
    async fn send_body(&self, key: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.client
            .post(format!("{}/orders", self.base))
            .header("idempotency-key", key)
            .body(body)
            .send()
            .await
            .unwrap()
    }

    /// Starts a request for `key` that the blocking `handler` holds, and waits until it runs.
    async fn hold(
        &self,
        handler: &Handler,
        key: &str,
    ) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
        let first = tokio::spawn(self.post(Some(key), "{}").send());
        handler.started.notified().await;
        first
    }

    fn post(&self, key: Option<&str>, body: &'static str) -> reqwest::RequestBuilder {
        let request = self.client.post(format!("{}/orders", self.base)).body(body);
        match key {
            Some(key) => request.header("idempotency-key", key),
            None => request,
        }
    }
}

async fn problem(response: reqwest::Response) -> (StatusCode, String, serde_json::Value) {
    let status = response.status();
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(content_type, "application/problem+json");
    let json: serde_json::Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    let kind = json["type"].as_str().unwrap().to_owned();
    (status, kind, json)
}

/// Asserts `response` is the problem `slug` with `status`, returning its JSON.
async fn assert_problem(
    response: reqwest::Response,
    status: StatusCode,
    slug: &str,
) -> serde_json::Value {
    let (got, kind, json) = problem(response).await;
    assert_eq!((got, kind), (status, problem_type(slug)));
    json
}

fn problem_type(slug: &str) -> String {
    format!("urn:tower-idempotency:problem:{slug}")
}

#[tokio::test]
async fn replay_is_byte_identical_and_marked() {
    let handler = Handler::default();
    let server = Server::client_keys(&handler).await;
    let first = server.send(Some("k-1"), "{\"a\":1}").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get("idempotent-replayed").is_none());
    assert!(
        first.headers().get("set-cookie").is_some(),
        "the first caller gets its cookie"
    );
    let first_body = first.bytes().await.unwrap();

    let second = server.send(Some("k-1"), "{\"a\":1}").await;
    assert_eq!(second.status(), StatusCode::CREATED);
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    assert_eq!(second.headers()["content-type"], "application/json");
    assert!(
        second.headers().get("set-cookie").is_none(),
        "Set-Cookie is never replayed"
    );
    assert_eq!(second.bytes().await.unwrap(), first_body);
    assert_eq!(handler.count(), 1);
}

#[tokio::test]
async fn same_key_with_another_payload_is_422() {
    let handler = Handler::default();
    let server = Server::client_keys(&handler).await;
    server.send(Some("k"), "{\"qty\":1}").await;
    let reused = server.send(Some("k"), "{\"qty\":2}").await;
    assert_problem(reused, StatusCode::UNPROCESSABLE_ENTITY, "key-reused").await;
    assert_eq!(handler.count(), 1);
}

#[tokio::test]
async fn missing_invalid_and_repeated_keys_are_400_and_never_run() {
    let handler = Handler::default();
    let server = Server::client_keys(&handler).await;
    let missing = server.send(None, "{}").await;
    let json = assert_problem(missing, StatusCode::BAD_REQUEST, "missing-key").await;
    assert_eq!(json["status"], 400);

    let long = "k".repeat(256);
    for bad in ["", "\"\"", long.as_str(), "has space", "\"unterminated"] {
        let response = server.send(Some(bad), "{}").await;
        let (status, kind, json) = problem(response).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}");
        assert_eq!(kind, problem_type("invalid-key"));
        assert!(
            !json.to_string().contains(&long),
            "the raw key is not echoed"
        );
    }
    let repeated = server
        .send_with(Some("a"), "{}", ("idempotency-key", "b"))
        .await;
    assert_eq!(problem(repeated).await.1, problem_type("invalid-key"));
    assert_eq!(handler.count(), 0);
}

#[tokio::test]
async fn oversized_bodies_are_413_with_and_without_content_length() {
    let handler = Handler::default();
    let layer = IdempotencyLayer::client_keys(MemoryStore::new()).max_body_bytes(1024);
    let server = Server::start(layer, handler.clone()).await;
    let big = vec![b'x'; 2048];

    let declared = server.send_body("big-1", big.clone()).await;
    assert_problem(declared, StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large").await;

    // Chunked: no Content-Length, the cap is enforced while reading.
    let chunks: Vec<Result<Bytes, std::io::Error>> = big
        .chunks(256)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let chunked = server
        .send_body(
            "big-2",
            reqwest::Body::wrap_stream(futures_util::stream::iter(chunks)),
        )
        .await;
    assert_problem(chunked, StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large").await;

    // A chunked body under the cap reaches the handler byte for byte.
    let small: Vec<Result<Bytes, std::io::Error>> =
        vec![Ok(Bytes::from("{\"a\":")), Ok(Bytes::from("1}"))];
    let ok = server
        .send_body(
            "small",
            reqwest::Body::wrap_stream(futures_util::stream::iter(small)),
        )
        .await;
    assert_eq!(ok.status(), StatusCode::CREATED);
    assert!(ok.text().await.unwrap().contains(r#"{\"a\":1}"#));
    assert_eq!(handler.count(), 1);
}

#[tokio::test]
async fn unguarded_methods_and_optional_keys_pass_through() {
    let handler = Handler::default();
    let layer = IdempotencyLayer::client_keys(MemoryStore::new()).optional_key();
    let server = Server::start(layer, handler.clone()).await;
    for _ in 0..2 {
        let r = server.send(None, "{}").await;
        assert_eq!(r.status(), StatusCode::CREATED);
        assert!(r.headers().get("idempotent-replayed").is_none());
        let get = server
            .client
            .get(format!("{}/orders", server.base))
            .header("idempotency-key", "g")
            .send()
            .await
            .unwrap();
        assert!(get.headers().get("idempotent-replayed").is_none());
    }
    assert_eq!(handler.count(), 4, "nothing was guarded");
}

#[tokio::test]
async fn non_2xx_releases_unless_the_policy_or_handler_says_otherwise() {
    let handler = Handler::default();
    let server = Server::client_keys(&handler).await;
    for _ in 0..2 {
        let r = server
            .send_with(Some("fails"), "{}", ("x-behaviour", "fail"))
            .await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    }
    assert_eq!(
        handler.count(),
        2,
        "a 400 releases the key: the retry runs again"
    );

    for _ in 0..2 {
        let r = server
            .send_with(Some("declined"), "{}", ("x-behaviour", "fail-but-final"))
            .await;
        assert_eq!(r.status(), StatusCode::PAYMENT_REQUIRED);
    }
    assert_eq!(handler.count(), 3, "CacheDirective::Complete keeps the 402");

    let always = Handler::default();
    let layer =
        IdempotencyLayer::client_keys(MemoryStore::new()).cache_policy(CachePolicy::always());
    let server = Server::start(layer, always.clone()).await;
    for _ in 0..2 {
        let r = server
            .send_with(Some("fails"), "{}", ("x-behaviour", "fail"))
            .await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    }
    assert_eq!(always.count(), 1, "CachePolicy::always stores the 400");
}

#[tokio::test]
async fn a_response_over_the_cache_cap_completes_and_replays_without_body() {
    let handler = Handler::default();
    let layer = IdempotencyLayer::client_keys(MemoryStore::new()).max_cached_body_bytes(1000);
    let server = Server::start(layer, handler.clone()).await;
    let first = server
        .send_with(Some("big"), "{}", ("x-behaviour", "big"))
        .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(
        first.bytes().await.unwrap().len(),
        3000,
        "the first caller gets the whole body"
    );
    let replay = server
        .send_with(Some("big"), "{}", ("x-behaviour", "big"))
        .await;
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()["idempotent-body-omitted"], "true");
    assert_eq!(replay.headers()["x-order"], "big");
    assert!(replay.bytes().await.unwrap().is_empty());
    assert_eq!(handler.count(), 1, "the handler never runs twice");
}

#[tokio::test]
async fn tenants_never_share_cached_responses() {
    let handler = Handler::default();
    let app = Router::new()
        .route("/orders", post(create_order))
        .route_layer(IdempotencyLayer::client_keys(MemoryStore::new()))
        // The application's auth layer, outside ours, sets the principal.
        .layer(axum::middleware::from_fn(
            |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
                let tenant = request
                    .headers()
                    .get("x-tenant")
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_owned();
                request.extensions_mut().insert(Principal::new(tenant));
                next.run(request).await
            },
        ))
        .with_state(handler.clone());
    let server = Server::start_router(app).await;
    let a = server
        .send_with(Some("same"), "{}", ("x-tenant", "a"))
        .await
        .text()
        .await
        .unwrap();
    let b = server
        .send_with(Some("same"), "{}", ("x-tenant", "b"))
        .await;
    assert!(b.headers().get("idempotent-replayed").is_none());
    assert_ne!(b.text().await.unwrap(), a);
    assert_eq!(handler.count(), 2);
    let a_again = server
        .send_with(Some("same"), "{}", ("x-tenant", "a"))
        .await;
    assert_eq!(a_again.text().await.unwrap(), a);
}

#[tokio::test]
async fn a_required_principal_that_is_missing_is_a_500_and_never_runs() {
    let handler = Handler::default();
    let app = Router::new()
        .route("/orders", post(create_order))
        .route_layer(IdempotencyLayer::client_keys(MemoryStore::new()).require_principal())
        // An auth layer that sets the principal only for requests that name a tenant (as one
        // placed on other routes, or after ours, would leave it unset).
        .layer(axum::middleware::from_fn(
            |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
                let tenant = request
                    .headers()
                    .get("x-tenant")
                    .map(|v| v.to_str().unwrap().to_owned());
                if let Some(tenant) = tenant {
                    request.extensions_mut().insert(Principal::new(tenant));
                }
                next.run(request).await
            },
        ))
        .with_state(handler.clone());
    let server = Server::start_router(app).await;
    let anonymous = server.send(Some("k"), "{}").await;
    let json = assert_problem(
        anonymous,
        StatusCode::INTERNAL_SERVER_ERROR,
        "principal-missing",
    )
    .await;
    assert_eq!(json["status"], 500);
    assert_eq!(handler.count(), 0, "an unscoped request never runs");
    let tenant = server.send_with(Some("k"), "{}", ("x-tenant", "a")).await;
    assert_eq!(tenant.status(), StatusCode::CREATED);
    assert_eq!(handler.count(), 1);
}

#[tokio::test]
async fn nested_routes_are_scoped_by_the_path_the_request_arrived_with() {
    // Inside `Router::nest` the layer sees `/orders` for every shop; the scope must use the
    // full path, or shop 2 would be replayed shop 1's order.
    async fn which_shop(axum::extract::Path(shop): axum::extract::Path<String>) -> String {
        format!("order for shop {shop}")
    }
    let shop = Router::new()
        .route("/orders", post(which_shop))
        .route_layer(IdempotencyLayer::client_keys(MemoryStore::new()));
    let server = Server::start_router(Router::new().nest("/shops/{shop}", shop)).await;
    let send = |shop: &str| {
        server
            .client
            .post(format!("{}/shops/{shop}/orders", server.base))
            .header("idempotency-key", "same")
            .body("{}")
            .send()
    };
    let first = send("1").await.unwrap();
    assert_eq!(first.text().await.unwrap(), "order for shop 1");
    let second = send("2").await.unwrap();
    assert!(second.headers().get("idempotent-replayed").is_none());
    assert_eq!(second.text().await.unwrap(), "order for shop 2");
    let again = send("1").await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.text().await.unwrap(), "order for shop 1");
}

#[tokio::test]
async fn in_flight_duplicate_gets_409_with_retry_after() {
    let handler = Handler::blocking();
    let layer =
        IdempotencyLayer::client_keys(MemoryStore::new()).retry_after(Duration::from_secs(2));
    let server = Server::start(layer, handler.clone()).await;
    let first = server.hold(&handler, "slow").await;
    let duplicate = server.send(Some("slow"), "{}").await;
    assert_eq!(duplicate.headers()["retry-after"], "2");
    assert_problem(duplicate, StatusCode::CONFLICT, "in-flight").await;
    finish(&handler, first).await;
    assert_eq!(handler.count(), 1);
}

#[tokio::test]
async fn retry_after_on_409_never_outlasts_the_holders_lease() {
    let handler = Handler::blocking();
    // A generous hint, but the holder's key frees (or is renewed) within its 3 s lease.
    let layer = IdempotencyLayer::client_keys(MemoryStore::new())
        .retry_after(Duration::from_secs(30))
        .lease(Duration::from_secs(3));
    let server = Server::start(layer, handler.clone()).await;
    let first = server.hold(&handler, "slow-lease").await;
    let duplicate = server.send(Some("slow-lease"), "{}").await;
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    let after: u64 = duplicate.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1..=3).contains(&after),
        "Retry-After {after} must lie within the holder's 3 s lease"
    );
    finish(&handler, first).await;
    assert_eq!(handler.count(), 1);
}

#[tokio::test]
async fn in_flight_status_is_configurable() {
    let handler = Handler::blocking();
    let layer = IdempotencyLayer::client_keys(MemoryStore::new())
        .in_flight_status(StatusCode::TOO_MANY_REQUESTS);
    let server = Server::start(layer, handler.clone()).await;
    let first = server.hold(&handler, "slow").await;
    let duplicate = server.send(Some("slow"), "{}").await;
    assert_eq!(duplicate.status(), StatusCode::TOO_MANY_REQUESTS);
    handler.proceed.notify_one();
    first.await.unwrap().unwrap();
}

/// Hooks that let a test await the moment a result is recorded.
#[derive(Default)]
struct Observed {
    completed: Notify,
}

#[async_trait::async_trait]
impl Hooks for Observed {
    fn after(&self, call: Call, _key: &str) {
        if call == Call::Complete {
            self.completed.notify_one();
        }
    }
}

#[tokio::test]
async fn a_disconnected_caller_still_gets_its_result_stored() {
    let handler = Handler::blocking();
    let store = Arc::new(Hooked::wrap(MemoryStore::new(), Observed::default()));
    // Signals when the server drops the request's future, i.e. has noticed the caller is gone.
    struct NotifyOnDrop(Arc<Notify>);
    impl Drop for NotifyOnDrop {
        fn drop(&mut self) {
            self.0.notify_one();
        }
    }
    let request_dropped = Arc::new(Notify::new());
    let on_drop = request_dropped.clone();
    let app = Router::new()
        .route("/orders", post(create_order))
        .route_layer(IdempotencyLayer::client_keys(store.clone()))
        .with_state(handler.clone())
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let guard = NotifyOnDrop(on_drop.clone());
                async move {
                    let _guard = guard;
                    next.run(request).await
                }
            },
        ));
    let server = Server::start_router(app).await;

    let address = server.base.trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    socket
        .write_all(b"POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: gone\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    handler.started.notified().await;
    drop(socket); // the caller goes away mid-handler
    request_dropped.notified().await; // the caller's future is gone; the handler has not finished
    handler.proceed.notify_one();
    tokio::time::timeout(Duration::from_secs(10), store.hooks.completed.notified())
        .await
        .expect("the handler was cancelled with its caller instead of finishing");

    let retry = server.send(Some("gone"), "{}").await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert!(retry.text().await.unwrap().contains("\"execution\":1"));
    assert_eq!(handler.count(), 1);
}

#[tokio::test]
async fn a_handler_panic_releases_the_key() {
    let handler = Handler::default();
    let server = Server::client_keys(&handler).await;
    let exploded = server
        .send_with(Some("boom"), "{}", ("x-behaviour", "panic-first"))
        .await;
    assert_problem(
        exploded,
        StatusCode::INTERNAL_SERVER_ERROR,
        "handler-failed",
    )
    .await;
    let retry = server
        .send_with(Some("boom"), "{}", ("x-behaviour", "panic-first"))
        .await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(handler.count(), 2);
}

#[tokio::test]
async fn a_failing_or_hung_store_fails_closed_with_503() {
    for layer in [
        IdempotencyLayer::client_keys(Outage::Down.store()),
        IdempotencyLayer::client_keys(Outage::Hung.store())
            .store_timeout(Duration::from_millis(100)),
    ] {
        let handler = Handler::default();
        let server = Server::start(layer, handler.clone()).await;
        let response = server.send(Some("k"), "{}").await;
        assert!(response.headers().contains_key("retry-after"));
        let json = assert_problem(
            response,
            StatusCode::SERVICE_UNAVAILABLE,
            "store-unavailable",
        )
        .await;
        assert!(
            !json.to_string().contains("connection refused"),
            "backend errors stay in the logs"
        );
        assert_eq!(handler.count(), 0, "the handler never runs without a claim");
    }
}

#[tokio::test]
async fn fail_open_is_explicit_and_marked() {
    let handler = Handler::default();
    let app = Router::new()
        .route("/orders", post(create_order))
        .route_layer(
            IdempotencyLayer::client_keys(Outage::Down.store()).fail_open_on_store_error(true),
        )
        .layer(axum::middleware::map_response(
            |response: axum::response::Response| async move {
                let outcome = response.extensions().get::<Outcome>().copied();
                let mut response = response;
                response
                    .headers_mut()
                    .insert("x-outcome", outcome.unwrap().as_str().parse().unwrap());
                response
            },
        ))
        .with_state(handler.clone());
    let server = Server::start_router(app).await;
    let response = server.send(Some("k"), "{}").await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(response.headers()["x-outcome"], "failed_open");
    assert_eq!(handler.count(), 1);
}

#[tokio::test]
async fn a_slow_handler_keeps_its_lease() {
    let handler = Handler::blocking();
    // Renewals run every third of the lease; a lease of a second leaves them room on a loaded
    // machine.
    let lease = Duration::from_secs(1);
    let layer = IdempotencyLayer::client_keys(MemoryStore::new()).lease(lease);
    let server = Server::start(layer, handler.clone()).await;
    let first = server.hold(&handler, "slow").await;
    // Well past the original lease: without renewal the duplicate would run the handler again.
    tokio::time::sleep(lease * 3).await;
    let duplicate = server.send(Some("slow"), "{}").await;
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    finish(&handler, first).await;
    assert_eq!(handler.count(), 1);
}

#[tokio::test]
async fn in_flight_bound_and_shutdown_drain() {
    let handler = Handler::blocking();
    let layer = IdempotencyLayer::client_keys(MemoryStore::new()).max_in_flight(1);
    let shutdown = layer.shutdown_handle();
    let server = Server::start(layer, handler.clone()).await;
    let first = server.hold(&handler, "a").await;

    let over = server.send(Some("b"), "{}").await;
    assert_problem(over, StatusCode::SERVICE_UNAVAILABLE, "overloaded").await;

    let drain = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { shutdown.drain(Duration::from_secs(10)).await }
    });
    assert_eq!(shutdown.in_flight(), 1);
    handler.proceed.notify_one();
    assert!(
        drain.await.unwrap(),
        "the running handler finished within the deadline"
    );
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
    assert_eq!(shutdown.in_flight(), 0);

    let after = server.send(Some("c"), "{}").await;
    assert_eq!(
        after.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "no new guarded work after drain"
    );
    assert_eq!(handler.count(), 1);
}

#[tokio::test]
async fn the_span_records_namespace_key_hash_and_outcome_but_never_the_raw_key() {
    let (captured, _guard) = CapturedLogs::start(tracing::Level::TRACE);

    let handler = Handler::default();
    let layer = IdempotencyLayer::client_keys(MemoryStore::new()).namespace("orders");
    let server = Server::start(layer, handler.clone()).await;
    for _ in 0..2 {
        server.send(Some("raw-key-do-not-log"), "{}").await;
    }
    let logs = captured.text();
    assert!(logs.contains("namespace=\"orders\""), "{logs}");
    assert!(logs.contains("key_hash="), "{logs}");
    assert!(logs.contains("outcome=\"executed\""), "{logs}");
    assert!(logs.contains("outcome=\"replayed\""), "{logs}");
    assert!(!logs.contains("raw-key-do-not-log"), "{logs}");
}

#[tokio::test]
async fn json_fields_fingerprint_replays_a_resend_with_other_volatile_fields() {
    let handler = Handler::default();
    let layer = IdempotencyLayer::client_keys(MemoryStore::new())
        .fingerprint(FingerprintMode::json_fields(["/amount", "/customer/id"]));
    let server = Server::start(layer, handler.clone()).await;
    let first = server
        .send(
            Some("pay-1"),
            r#"{"amount":100,"customer":{"id":"c1","name":"A"},"sent_at":"10:00:00"}"#,
        )
        .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first_body = first.bytes().await.unwrap();
    // The same chosen fields, in another order and layout, with other unchosen fields.
    let resend = server
        .send(Some("pay-1"),
            "{ \"sent_at\": \"10:00:05\",\n  \"customer\": {\"name\": \"B\", \"id\": \"c1\"},\n  \"amount\": 100 }").await;
    assert_eq!(resend.status(), StatusCode::CREATED);
    assert_eq!(resend.headers()["idempotent-replayed"], "true");
    assert_eq!(resend.bytes().await.unwrap(), first_body);
    // A chosen field changed: the key was reused for a different request.
    let changed = server
        .send(
            Some("pay-1"),
            r#"{"amount":101,"customer":{"id":"c1","name":"A"},"sent_at":"10:00:00"}"#,
        )
        .await;
    assert_problem(changed, StatusCode::UNPROCESSABLE_ENTITY, "key-reused").await;
    assert_eq!(handler.count(), 1);
}

#[tokio::test]
async fn json_excluding_fingerprint_ignores_only_the_excluded_fields() {
    let handler = Handler::default();
    let layer = IdempotencyLayer::client_keys(MemoryStore::new()).fingerprint(
        FingerprintMode::json_excluding(["/sent_at", "/meta/trace_id"]),
    );
    let server = Server::start(layer, handler.clone()).await;
    let first = server
        .send(
            Some("ex-1"),
            r#"{"amount":100,"sent_at":1,"meta":{"trace_id":"t1","source":"app"}}"#,
        )
        .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let resend = server
        .send(
            Some("ex-1"),
            r#"{"meta":{"source":"app","trace_id":"t2"},"amount":100,"sent_at":2}"#,
        )
        .await;
    assert_eq!(resend.status(), StatusCode::CREATED);
    assert_eq!(resend.headers()["idempotent-replayed"], "true");
    let changed = server
        .send(
            Some("ex-1"),
            r#"{"amount":100,"sent_at":1,"meta":{"trace_id":"t1","source":"web"}}"#,
        )
        .await;
    assert_problem(changed, StatusCode::UNPROCESSABLE_ENTITY, "key-reused").await;
    assert_eq!(handler.count(), 1);
}

#[tokio::test]
async fn a_json_fingerprint_answers_400_to_a_body_that_is_not_json() {
    let handler = Handler::default();
    let store = Arc::new(CountingStore::new(MemoryStore::new()));
    let layer = IdempotencyLayer::client_keys(store.clone())
        .fingerprint(FingerprintMode::json_fields(["/amount"]));
    let server = Server::start(layer, handler.clone()).await;
    let response = server
        .send(Some("form-1"), "amount=100&secret=s3cr3t")
        .await;
    let json = assert_problem(response, StatusCode::BAD_REQUEST, "body-not-json").await;
    assert!(
        !json.to_string().contains("s3cr3t"),
        "no body content in the problem"
    );
    assert_eq!(handler.count(), 0, "the handler did not run");
    assert_eq!(store.claims(), 0, "the key was not claimed");
}
