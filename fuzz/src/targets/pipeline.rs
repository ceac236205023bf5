//! The whole layer over a fuzzed request, answered by a handler that echoes the body's length.

use std::{
    cell::RefCell,
    convert::Infallible,
    time::{SystemTime, UNIX_EPOCH},
};

use axum_core::body::Body;
use bytes::Bytes;
use http::{request::Builder, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{Layer, ServiceExt};
use tower_idempotency_core::{IdempotencyLayer, MemoryStore, ResponseBody};
use tower_idempotency_webhooks::{__fuzz, github, stripe, twilio, WebhookLayerExt};

use crate::{stats, SECRET, TWILIO_BASE};

struct Pipeline {
    runtime: tokio::runtime::Runtime,
    layers: Vec<IdempotencyLayer>,
}

impl Pipeline {
    /// A current-thread runtime and the layers a selector byte chooses from, by index.
    fn new() -> Self {
        Self {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("runtime"),
            layers: vec![
                IdempotencyLayer::client_keys(MemoryStore::new()).max_body_bytes(4096),
                IdempotencyLayer::stripe([SECRET], MemoryStore::new()),
                IdempotencyLayer::github([SECRET], MemoryStore::new()),
                IdempotencyLayer::twilio(TWILIO_BASE, [SECRET], MemoryStore::new())
                    .expect("valid URL"),
            ],
        }
    }
}

thread_local! {
    static PIPELINE: RefCell<Option<Pipeline>> = const { RefCell::new(None) };
}

async fn handler(request: Request<Body>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = request.into_body().collect().await.map(|b| b.to_bytes());
    let len = body.map(|b| b.len()).unwrap_or_default();
    Ok(Response::new(Full::new(Bytes::from(format!(
        "handled {len}"
    )))))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// The whole layer: selector bytes, the URI line, `name: value` header lines up to an empty
/// line, then the body; through a client-key, Stripe, GitHub or Twilio layer on a MemoryStore.
pub fn pipeline(data: &[u8]) {
    let (selector, rest) = match data {
        [a, b, rest @ ..] => ([*a, *b], rest),
        _ => return,
    };
    let which = usize::from(selector[0] % 4);
    let (builder, uri, body) = parse_request(selector[1], rest);
    let builder = if selector[0] & 0x80 != 0 {
        sign(builder, which, &uri, &body)
    } else {
        builder
    };
    let Ok(request) = builder.body(Full::new(body)) else {
        return;
    };
    PIPELINE.with(|cell| {
        let mut cell = cell.borrow_mut();
        let pipeline = cell.get_or_insert_with(Pipeline::new);
        let service = pipeline.layers[which].layer(tower::service_fn(handler));
        pipeline.runtime.block_on(async move {
            let response = service.oneshot(request).await.expect("infallible");
            check_response(response).await;
        });
    });
}

/// The request `rest` describes: a method chosen by `method`, the URI line, the header lines up
/// to an empty line (a line that is no valid header is skipped), and the body after them.
fn parse_request(method: u8, rest: &[u8]) -> (Builder, http::Uri, Bytes) {
    let mut lines = rest.split(|b| *b == b'\n');
    let uri = lines
        .next()
        .and_then(|u| std::str::from_utf8(u).ok())
        .and_then(|u| u.parse::<http::Uri>().ok())
        .unwrap_or_else(|| http::Uri::from_static("/"));
    let method = [
        http::Method::POST,
        http::Method::PUT,
        http::Method::PATCH,
        http::Method::GET,
        http::Method::DELETE,
    ][usize::from(method % 5)]
    .clone();
    let mut builder = Request::builder().method(method).uri(uri.clone());
    let mut consumed = rest.len().min(
        rest.iter()
            .position(|b| *b == b'\n')
            .map_or(rest.len(), |i| i + 1),
    );
    for line in lines {
        consumed = (consumed + line.len() + 1).min(rest.len());
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = header_line(line) {
            builder = builder.header(name, value);
        }
    }
    (builder, uri, Bytes::copy_from_slice(&rest[consumed..]))
}

/// `name: value` (the space optional), when both are valid.
fn header_line(line: &[u8]) -> Option<(http::HeaderName, HeaderValue)> {
    let colon = line.iter().position(|b| *b == b':')?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    let value = value.strip_prefix(b" ").unwrap_or(value);
    Some((
        http::HeaderName::from_bytes(name).ok()?,
        HeaderValue::from_bytes(value).ok()?,
    ))
}

/// Adds the signature the layer `which` verifies (none for the client-key layer).
fn sign(builder: Builder, which: usize, uri: &http::Uri, body: &Bytes) -> Builder {
    match which {
        1 => builder.header("stripe-signature", stripe::sign(SECRET, unix_now(), body)),
        2 => builder.header("x-hub-signature-256", github::sign(SECRET, body)),
        3 => {
            let pq = uri.path_and_query().map_or("/", |pq| pq.as_str());
            let params = __fuzz::twilio_sorted_params(body);
            let params: Vec<(&str, &str)> = params
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            builder
                .header("content-type", "application/x-www-form-urlencoded")
                .header(
                    "x-twilio-signature",
                    twilio::sign(SECRET, &format!("{TWILIO_BASE}{pq}"), &params),
                )
        }
        _ => builder,
    }
}

/// Counts the answer; a non-2xx one must be an RFC 9457 problem document without the secret.
async fn check_response(response: Response<ResponseBody<Full<Bytes>>>) {
    let status = response.status();
    if response.headers().contains_key("idempotent-replayed") {
        stats::bump(&stats::REPLAYED);
    }
    let content_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .map(|v| v.as_bytes().to_vec());
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if status.is_success() {
        stats::bump(&stats::SUCCESS);
        return;
    }
    stats::bump(&stats::PROBLEMS);
    assert_eq!(
        content_type.as_deref(),
        Some(&b"application/problem+json"[..]),
        "{status} without a problem document"
    );
    let problem: serde_json::Value = serde_json::from_slice(&body).expect("problem body is JSON");
    assert_eq!(problem["status"], status.as_u16());
    assert!(problem["type"]
        .as_str()
        .is_some_and(|t| t.starts_with("urn:tower-idempotency:problem:")));
    assert!(!String::from_utf8_lossy(&body).contains(SECRET));
}
