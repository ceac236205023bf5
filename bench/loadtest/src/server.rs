//! The servers under test: one echo handler, bare or behind `IdempotencyLayer::client_keys`.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use axum::{extract::State, routing::post, serve::ListenerExt, Router};
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tower_idempotency_core::IdempotencyLayer;

/// Holds requests inside the handler until released (for the in-flight memory measurement).
#[derive(Clone)]
pub struct Gate {
    /// Requests currently waiting inside the handler.
    pub entered: Arc<AtomicU64>,
    /// Set to `true` to let them finish.
    pub open: watch::Receiver<bool>,
}

/// Handler state.
#[derive(Clone, Default)]
pub struct App {
    /// How many times the handler ran.
    pub runs: Arc<AtomicU64>,
    /// Optional gate.
    pub gate: Option<Gate>,
    /// When set, counts handler runs per `Idempotency-Key` (to prove exactly-once across
    /// instances); off in throughput runs because it costs a header-map clone and a lock.
    pub seen: Option<Arc<Mutex<HashMap<String, u32>>>>,
}

async fn create_order(State(app): State<App>, body: Bytes) -> (StatusCode, Bytes) {
    app.runs.fetch_add(1, Ordering::Relaxed);
    if let Some(gate) = &app.gate {
        gate.entered.fetch_add(1, Ordering::SeqCst);
        let mut open = gate.open.clone();
        // An error means the sender is gone: nothing will ever open it, so just answer.
        let _ = open.wait_for(|open| *open).await;
    }
    (StatusCode::CREATED, body)
}

async fn create_order_tracked(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Bytes) {
    if let (Some(seen), Some(key)) = (&app.seen, headers.get("idempotency-key")) {
        let key = String::from_utf8_lossy(key.as_bytes()).into_owned();
        *seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_default() += 1;
    }
    create_order(State(app), body).await
}

/// The router: the echo handler on `POST /orders`, guarded by `layer` when given.
pub fn router(app: App, layer: Option<IdempotencyLayer>) -> Router {
    let routes = if app.seen.is_some() {
        Router::new().route("/orders", post(create_order_tracked))
    } else {
        Router::new().route("/orders", post(create_order))
    };
    let routes = match layer {
        Some(layer) => routes.route_layer(layer),
        None => routes,
    };
    routes.with_state(app)
}

/// A running server.
pub struct Server {
    /// Its loopback address.
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds `127.0.0.1:0` and serves `router` on the current runtime.
pub async fn serve(router: Router) -> std::io::Result<Server> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    // Small responses must not wait for Nagle's algorithm.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let task = tokio::spawn(async move {
        // Only fails when the listener fails; the run then reports connection errors.
        let _ = axum::serve(listener, router).await;
    });
    Ok(Server { addr, task })
}
