// The idempotency layer in a tower::ServiceBuilder with tower-http's layers, outermost first.
use std::{sync::Arc, time::Duration};

use axum::{http::StatusCode, routing::post, Router};
use tower::ServiceBuilder;
use tower_http::{
    compression::CompressionLayer, limit::RequestBodyLimitLayer, timeout::TimeoutLayer,
    trace::TraceLayer,
};
use tower_idempotency::{IdempotencyLayer, SqliteStore};

async fn create_order(body: String) -> (StatusCode, String) {
    (StatusCode::CREATED, body)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(SqliteStore::connect("sqlite://idempotency.db").await?);
    store.migrate().await?;

    let orders = ServiceBuilder::new()
        // 1. Tracing first: its span covers the layer's refusals and replays too.
        .layer(TraceLayer::new_for_http())
        // 2. The upload limit before anything reads the body: a declared length over it is
        //    answered 413 at once (the idempotency layer's own `max_body_bytes` answers 413 for
        //    a streamed body over its cap).
        .layer(RequestBodyLimitLayer::new(64 * 1024))
        // 3. The caller's deadline outside the idempotency layer: a caller that times out gets
        //    its 408, and the handler, never cancelled halfway, finishes and records its result
        //    for the retry.
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            Duration::from_secs(10),
        ))
        // 4. Compression outside: the record keeps the plain response, and each replay is
        //    compressed for the Accept-Encoding of the caller that receives it.
        .layer(CompressionLayer::new())
        // 5. The idempotency layer, next to the handler.
        .layer(IdempotencyLayer::client_keys(store).namespace("orders"));

    let app = Router::new()
        .route("/orders", post(create_order))
        .route_layer(orders);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app).await?;
    Ok(())
}
