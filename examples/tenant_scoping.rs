//! Per-tenant scoping: an auth layer maps the bearer token to a tenant and inserts
//! `tower_idempotency::Principal`; the idempotency layer then scopes every key by it, so two
//! tenants sending the same `Idempotency-Key` never see each other's responses.
//!
//! ```text
//! cargo run --example tenant_scoping
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use axum::{
    extract::{Extension, Request},
    http::{header, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::post,
    Router,
};
use tower_idempotency::{IdempotencyLayer, MemoryStore, Principal};

const ADDR: &str = "127.0.0.1:3008";
/// Token -> tenant; a real application checks a session or an API key here.
const TOKENS: [(&str, &str); 2] = [("token-acme", "acme"), ("token-globex", "globex")];

async fn authenticate(mut request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let tenant = TOKENS
        .iter()
        .find(|(t, _)| Some(*t) == token)
        .map(|(_, tenant)| *tenant);
    let Some(tenant) = tenant else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    request.extensions_mut().insert(Principal::new(tenant));
    next.run(request).await
}

async fn create_invoice(
    Extension(tenant): Extension<Principal>,
    body: String,
) -> (StatusCode, String) {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    println!("tenant {}: invoice {id}", tenant.as_str());
    (
        StatusCode::CREATED,
        format!("invoice {id} for {} ({body})\n", tenant.as_str()),
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let app = Router::new()
        .route("/invoices", post(create_invoice))
        .route_layer(
            IdempotencyLayer::client_keys(MemoryStore::new())
                .namespace("invoices")
                // A request that reaches the layer without a Principal (the auth layer missing
                // on this route) is refused with a 500 instead of sharing keys across tenants.
                .require_principal(),
        )
        // Added after the idempotency layer, so it runs first and the Principal is there in time.
        .layer(middleware::from_fn(authenticate));

    let listener = tokio::net::TcpListener::bind(ADDR).await?;
    println!("listening on http://{ADDR}; the same key for two tenants makes two invoices:");
    for (token, _) in TOKENS {
        println!(
            "  curl -i http://{ADDR}/invoices -H 'Authorization: Bearer {token}' \
             -H 'Idempotency-Key: monthly-2026-11' -d '100 EUR'"
        );
    }
    println!("(repeat one of them: a replay of that tenant's invoice)");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
