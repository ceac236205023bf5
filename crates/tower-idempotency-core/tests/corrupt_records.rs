//! A stored record the layer cannot replay is answered like an unreadable one, never a panic.

use std::{convert::Infallible, time::Duration};

use axum::body::Body;
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use tower::{Layer, ServiceExt};
use tower_idempotency_core::{
    CachedResponse, ClaimOutcome, CompletedRecord, FencingToken, Fingerprint, IdempotencyLayer,
    Outcome, Ownership, RecordState, Store, StoreError,
};

/// Answers every claim with a completed record whose header map has no room left.
struct FullRecord(HeaderMap);

#[async_trait::async_trait]
impl Store for FullRecord {
    async fn claim(
        &self,
        _: &str,
        fingerprint: &Fingerprint,
        _: FencingToken,
        _: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        Ok(ClaimOutcome::Completed {
            record: CompletedRecord {
                fingerprint: *fingerprint,
                response: CachedResponse {
                    status: StatusCode::CREATED,
                    headers: self.0.clone(),
                    body: bytes::Bytes::from_static(b"created"),
                    body_omitted: false,
                },
            },
            ttl_remaining: Duration::from_secs(60),
        })
    }
    async fn renew(&self, _: &str, _: FencingToken, _: Duration) -> Result<Ownership, StoreError> {
        Ok(Ownership::Stale)
    }
    async fn complete(
        &self,
        _: &str,
        _: FencingToken,
        _: &CachedResponse,
        _: Duration,
    ) -> Result<Ownership, StoreError> {
        Ok(Ownership::Stale)
    }
    async fn release(&self, _: &str, _: FencingToken) -> Result<Ownership, StoreError> {
        Ok(Ownership::Stale)
    }
    async fn get(&self, _: &str) -> Result<Option<RecordState>, StoreError> {
        Ok(None)
    }

    async fn forget(&self, _: &str) -> Result<bool, StoreError> {
        Ok(false)
    }
}

fn full_header_map() -> HeaderMap {
    let mut headers = HeaderMap::new();
    for i in 0.. {
        let name = HeaderName::try_from(format!("x-{i}")).unwrap();
        if headers
            .try_append(name, HeaderValue::from_static(""))
            .is_err()
        {
            return headers;
        }
    }
    unreachable!()
}

#[tokio::test]
async fn a_record_too_full_to_replay_is_a_503_not_a_panic() {
    let service = IdempotencyLayer::client_keys(FullRecord(full_header_map())).layer(
        tower::service_fn(|_request: Request<Body>| async {
            Ok::<_, Infallible>(http::Response::new(Body::empty()))
        }),
    );
    let request = Request::post("/orders")
        .header("idempotency-key", "k")
        .body(Body::from("{}"))
        .unwrap();
    // Spawned, so a panic in the layer fails this assertion instead of the whole test binary.
    let response = tokio::spawn(service.oneshot(request))
        .await
        .expect("the layer must not panic")
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        response.extensions().get::<Outcome>(),
        Some(&Outcome::StoreUnavailable)
    );
}
