//! One log line per request: what the idempotency layer did, and why it refused.

use std::time::Instant;

use axum::{body::Body, extract::Request, http::header, middleware::Next, response::Response};
use serde_json::Value;
use tower_idempotency::{
    problem::{PROBLEM_JSON, PROBLEM_TYPE_PREFIX},
    Outcome,
};

/// The problem `type` slug of a rejection, re-buffering the (small) problem body.
async fn problem_slug(response: Response) -> (Response, Option<String>) {
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v == PROBLEM_JSON);
    if !is_problem {
        return (response, None);
    }
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 64 * 1024).await else {
        return (Response::from_parts(parts, Body::empty()), None);
    };
    let slug = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|problem| problem["type"].as_str().map(str::to_owned))
        .map(|t| t.trim_start_matches(PROBLEM_TYPE_PREFIX).to_owned());
    (Response::from_parts(parts, Body::from(bytes)), slug)
}

/// One line per request: what the idempotency layer did, and why it refused.
pub async fn log_request(request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let started = Instant::now();
    let response = next.run(request).await;
    let outcome = response
        .extensions()
        .get::<Outcome>()
        .map_or("unguarded", Outcome::as_str);
    let (response, problem) = problem_slug(response).await;
    let status = response.status().as_u16();
    let problem = problem.as_deref().unwrap_or("-");
    let elapsed_ms = started.elapsed().as_millis() as u64;
    if response.status().is_server_error() {
        tracing::warn!(%method, path, status, outcome, problem, elapsed_ms, "request");
    } else {
        tracing::info!(%method, path, status, outcome, problem, elapsed_ms, "request");
    }
    response
}
