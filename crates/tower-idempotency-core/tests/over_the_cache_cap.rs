//! A response body over the cache cap: completed once the cap is passed, before the rest streams.

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{Layer, ServiceExt};
use tower_idempotency_core::{IdempotencyLayer, MemoryStore, Outcome};

#[tokio::test]
async fn a_body_failing_after_the_cap_leaves_the_key_completed() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = IdempotencyLayer::client_keys(MemoryStore::new())
        .max_cached_body_bytes(16)
        .layer(tower::service_fn({
            let runs = runs.clone();
            move |_request: Request<Body>| {
                runs.fetch_add(1, Ordering::SeqCst);
                let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
                    Ok(Bytes::from(vec![b'x'; 32])),
                    Err(std::io::Error::other("the export died halfway")),
                ];
                async move {
                    Ok::<_, Infallible>(Response::new(Body::from_stream(
                        futures_util::stream::iter(chunks),
                    )))
                }
            }
        }));
    let request = || {
        Request::post("/exports")
            .header("idempotency-key", "k")
            .body(Body::from("{}"))
            .unwrap()
    };
    let first = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert!(
        first.into_body().collect().await.is_err(),
        "the first caller sees its stream fail"
    );
    let retry = service.oneshot(request()).await.unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(
        retry.extensions().get::<Outcome>(),
        Some(&Outcome::Replayed)
    );
    assert_eq!(retry.headers()["idempotent-body-omitted"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}
