//! `GET /metrics`: the layer's metrics (docs/observability.md) in the Prometheus text format.

use std::time::Duration;

use axum::{http::header, routing::get, Router};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};
use tower_idempotency::metrics::{describe_metrics, STORE_CALL_DURATION_SECONDS};

/// How often the recorder folds recorded histogram samples into its buckets.
const UPKEEP: Duration = Duration::from_secs(5);
/// Store call latency buckets, in seconds: an in-process store answers in microseconds, a
/// network store in milliseconds; the store timeout bounds the rest.
const STORE_CALL_BUCKETS: &[f64] = &[
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Installs the Prometheus recorder as the global one and returns the route that renders it.
pub fn install() -> Result<Router, BuildError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(STORE_CALL_DURATION_SECONDS.to_owned()),
            STORE_CALL_BUCKETS,
        )?
        .install_recorder()?;
    describe_metrics();
    #[cfg(feature = "inbox")]
    tower_idempotency::inbox::describe_metrics();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(UPKEEP);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    let render = move || {
        let text = handle.render();
        async move {
            (
                [(
                    header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )],
                text,
            )
        }
    };
    Ok(Router::new().route("/metrics", get(render)))
}
