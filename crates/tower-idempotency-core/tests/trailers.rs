//! Response trailers (gRPC's status travels in them): the first caller receives them, and a
//! response that has them is not cached, since a replay could not carry them.

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tower::{Layer, ServiceExt};
use tower_idempotency_core::{IdempotencyLayer, MemoryStore, Outcome};

fn keyed(key: &str) -> Request<axum::body::Body> {
    Request::post("/orders")
        .header("idempotency-key", key)
        .body(axum::body::Body::from("{}"))
        .unwrap()
}

#[tokio::test]
async fn a_response_with_trailers_reaches_the_caller_whole_and_is_not_cached() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = IdempotencyLayer::client_keys(MemoryStore::new()).layer(tower::service_fn({
        let runs = runs.clone();
        move |_request: Request<axum::body::Body>| {
            runs.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", "0".parse().unwrap());
                let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
                    Ok(Frame::data(Bytes::from_static(b"message"))),
                    Ok(Frame::trailers(trailers)),
                ];
                let body = StreamBody::new(futures_util::stream::iter(frames));
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(StatusCode::OK)
                        .body(body)
                        .unwrap(),
                )
            }
        }
    }));

    let first = service.clone().oneshot(keyed("grpc")).await.unwrap();
    assert_eq!(
        first.extensions().get::<Outcome>(),
        Some(&Outcome::ExecutedReleased),
        "not cached: a replay would lose the trailers"
    );
    let collected = first.into_body().collect().await.unwrap();
    let trailers = collected
        .trailers()
        .cloned()
        .expect("the trailers reach the caller");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(collected.to_bytes(), "message");

    let second = service.oneshot(keyed("grpc")).await.unwrap();
    assert_eq!(
        second.extensions().get::<Outcome>(),
        Some(&Outcome::ExecutedReleased)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
