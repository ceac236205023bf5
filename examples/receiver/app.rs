//! The router and the state its handlers share; `GET /health`.

use std::{sync::Arc, time::Duration};

use axum::{
    extract::State,
    http::{HeaderMap, StatusCode},
    middleware,
    routing::get,
    Json, Router,
};
use serde_json::{json, Value};
use tower_idempotency::{key::IDEMPOTENCY_KEY, IdempotencyLayer, ShutdownHandle, Store};

use crate::{
    config::{Config, StartError},
    effects::{effects, Effects},
    inbox, log, orders, payments,
    webhook::{webhook_layers, webhook_routes},
};

/// A syntactically valid scoped key that no request can produce (its namespace is not used).
const HEALTH_PROBE_KEY: &str =
    "health-probe:0000000000000000000000000000000000000000000000000000000000000000";

#[derive(Clone)]
pub struct App {
    pub effects: Effects,
    pub store: Arc<dyn Store>,
    pub handler_delay: Duration,
    pub payments: Option<payments::Payments>,
    pub inbox_effects: Option<inbox::Effects>,
}

impl App {
    /// Records the side effect, then simulates the rest of the work (a database write, a call).
    pub async fn execute(&self, route: &str, key: &str) {
        self.effects.record(route, key);
        if !self.handler_delay.is_zero() {
            tokio::time::sleep(self.handler_delay).await;
        }
    }
}

/// The request's `Idempotency-Key`. The client-keyed layers refuse requests without one before
/// they reach a handler, so the empty default is never used.
pub fn idempotency_key(headers: &HeaderMap) -> &str {
    headers
        .get(&IDEMPOTENCY_KEY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// `200` when the store answers a read within two seconds, `503` otherwise.
async fn health(State(app): State<App>) -> (StatusCode, Json<Value>) {
    let probe = tokio::time::timeout(Duration::from_secs(2), app.store.get(HEALTH_PROBE_KEY));
    match probe.await {
        Ok(Ok(_)) => (StatusCode::OK, Json(json!({ "status": "ok" }))),
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "store unavailable" })),
        ),
    }
}

/// The router, and the shutdown handle of every idempotency layer in it.
pub fn build_app(
    config: &Config,
    store: Arc<dyn Store>,
    payments: Option<payments::Payments>,
    inbox_effects: Option<inbox::Effects>,
) -> Result<(Router, Vec<ShutdownHandle>), StartError> {
    let mut handles = Vec::new();
    let mut router = Router::new()
        .route("/health", get(health))
        .route("/effects", get(effects));
    for (route, layer) in webhook_layers(&store)? {
        let layer = config.tune(layer);
        handles.push(layer.shutdown_handle());
        tracing::info!(path = format!("/webhooks/{route}"), "webhook route mounted");
        router = router.merge(webhook_routes(route, layer));
    }
    let (orders, handle) = orders::route(config, store.clone());
    handles.push(handle);
    router = router.merge(orders);
    if let Some(payments) = &payments {
        let layer = IdempotencyLayer::client_keys(store.clone())
            .namespace("payments")
            .transactional();
        let layer = config.tune(layer);
        handles.push(layer.shutdown_handle());
        tracing::info!(path = "/payments", "transactional route mounted");
        router = router.merge(payments.route(layer));
    }
    let app = App {
        effects: Effects::default(),
        store,
        handler_delay: config.handler_delay,
        payments,
        inbox_effects,
    };
    let router = router
        .layer(middleware::from_fn(log::log_request))
        .with_state(app);
    Ok((router, handles))
}
