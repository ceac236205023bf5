//! The layer's metrics in the Prometheus text format: a Prometheus recorder is installed, an
//! order is sent twice with one `Idempotency-Key` (executed, then replayed) and once without
//! one (rejected), and the `idempotency_*` lines of the rendered text are printed. Any other
//! exporter of the `metrics` facade (OpenTelemetry, StatsD) is plugged in the same way.
//!
//! ```text
//! cargo run --example metrics --features metrics
//! ```

use axum::{
    body::Body,
    http::{Request, StatusCode},
    routing::post,
    Router,
};
use metrics_exporter_prometheus::PrometheusBuilder;
use tower::ServiceExt;
use tower_idempotency::{metrics::describe_metrics, IdempotencyLayer, MemoryStore};

async fn create_order() -> (StatusCode, &'static str) {
    (StatusCode::CREATED, "order created\n")
}

fn order(key: Option<&str>) -> Request<Body> {
    let mut request = Request::post("/orders");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.body(Body::from(r#"{"sku":"tea"}"#)).unwrap()
}

#[tokio::main]
async fn main() {
    // Install the recorder first: the layer records into whichever recorder is installed.
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .expect("no other recorder is installed");
    describe_metrics();

    let app = Router::new()
        .route("/orders", post(create_order))
        .route_layer(IdempotencyLayer::client_keys(MemoryStore::new()).namespace("orders"));
    for key in [Some("order-1"), Some("order-1"), None] {
        let response = app.clone().oneshot(order(key)).await.unwrap();
        println!("POST /orders (key {key:?}): {}", response.status());
    }

    // A server answers `GET /metrics` with this text (see `examples/receiver/metrics.rs`).
    let text = prometheus.render();
    for line in text.lines().filter(|line| line.contains("idempotency_")) {
        println!("{line}");
    }
}
