//! Draining: what a drain waits for.

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tower::{Layer, ServiceExt};
use tower_idempotency_core::{IdempotencyLayer, MemoryStore, Outcome};

#[tokio::test]
async fn a_drain_waits_for_a_request_still_uploading_its_body() {
    let layer = IdempotencyLayer::client_keys(MemoryStore::new());
    let shutdown = layer.shutdown_handle();
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer.layer(tower::service_fn({
        let runs = runs.clone();
        move |_request: Request<Body>| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(Response::new(Body::from("created"))) }
        }
    }));

    // A body whose first poll is signalled and whose bytes arrive only when the test sends them.
    let (polled, body_polled) = tokio::sync::oneshot::channel::<()>();
    let (chunks, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    let stream = futures_util::stream::unfold((Some(polled), rx), |(polled, mut rx)| async move {
        if let Some(polled) = polled {
            let _ = polled.send(());
        }
        rx.recv().await.map(|chunk| (chunk, (None, rx)))
    });
    let request = Request::post("/orders")
        .header("idempotency-key", "uploading")
        .body(Body::from_stream(stream))
        .unwrap();
    let uploading = tokio::spawn(service.clone().oneshot(request));
    body_polled.await.unwrap();
    assert_eq!(
        shutdown.in_flight(),
        1,
        "a request reading its body is in flight"
    );

    let mut drain = Box::pin({
        let (shutdown, runs) = (shutdown.clone(), runs.clone());
        async move {
            let finished = shutdown.drain(Duration::from_secs(10)).await;
            (finished, runs.load(Ordering::SeqCst))
        }
    });
    // The first poll begins the drain; it must then wait for the accepted request.
    assert!(
        futures_util::poll!(&mut drain).is_pending(),
        "the drain did not wait for a request still uploading its body"
    );
    // New guarded work is refused once the drain has begun.
    let refused = service
        .clone()
        .oneshot(
            Request::post("/orders")
                .header("idempotency-key", "late")
                .body(Body::from("{}"))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);

    chunks.send(Ok(Bytes::from_static(b"{}"))).await.unwrap();
    drop(chunks);
    let response = uploading.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.extensions().get::<Outcome>(),
        Some(&Outcome::Executed)
    );
    let (finished, runs_when_drained) = drain.await;
    assert!(finished);
    assert_eq!(
        runs_when_drained, 1,
        "the drain returned before the accepted request's handler ran"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
