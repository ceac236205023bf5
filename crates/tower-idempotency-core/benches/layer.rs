//! In-process cost of the layer (tower `oneshot`, no network) beside the bare handler, measured
//! in the same run: a first request (claim + handler + complete) and a replay, with the memory
//! store; plus the fingerprint and key scoping on their own.
//!
//! Run: `cargo bench -p tower-idempotency-core --bench layer`

use std::{
    hint::black_box,
    sync::atomic::{AtomicU64, Ordering},
};

use axum::{response::Response, routing::post, Router};
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use http::Request;
use tower::ServiceExt;
use tower_idempotency_core::{
    FingerprintMode, IdempotencyLayer, MemoryStore, PrincipalSource, Scope,
};
use tower_idempotency_testkit::{echo_created, order_request};

fn layer_vs_bare(c: &mut Criterion) {
    // Current-thread: criterion drives each iteration with `block_on` from outside the runtime,
    // so a multi-threaded runtime would add two cross-thread hand-offs per spawned handler.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bare = Router::new().route("/orders", post(echo_created));
    let guarded = Router::new()
        .route("/orders", post(echo_created))
        .route_layer(IdempotencyLayer::client_keys(
            MemoryStore::new().with_max_entries(10_000_000),
        ));
    let counter = AtomicU64::new(0);

    for size in [1024usize, 64 * 1024] {
        let body = Bytes::from(vec![b'x'; size]);
        let mut group = c.benchmark_group(format!("request_{}k", size / 1024));
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function("bare_handler", |b| {
            b.to_async(&runtime).iter(|| async {
                let response = send_order(bare.clone(), "k", &body).await;
                black_box(response);
            })
        });
        group.bench_function("layer_first_request", |b| {
            b.to_async(&runtime).iter(|| async {
                let key = format!("new-{}", counter.fetch_add(1, Ordering::Relaxed));
                let response = send_order(guarded.clone(), &key, &body).await;
                assert_eq!(response.status(), 201);
                black_box(response);
            })
        });
        // A key per body size: the same key with another body is a 422, not a replay.
        let replay_key = format!("replayed-{size}");
        runtime.block_on(async {
            let response = send_order(guarded.clone(), &replay_key, &body).await;
            assert_eq!(response.status(), 201);
        });
        group.bench_function("layer_replay", |b| {
            b.to_async(&runtime).iter(|| async {
                let response = send_order(guarded.clone(), &replay_key, &body).await;
                assert!(response.headers().contains_key("idempotent-replayed"));
                black_box(response);
            })
        });
        group.finish();
    }
}

/// The answer of `router` to an order posted with `key` and `body`.
async fn send_order(router: Router, key: &str, body: &Bytes) -> Response {
    router.oneshot(order_request(key, body)).await.unwrap()
}

fn fingerprint_and_scope(c: &mut Criterion) {
    let mut group = c.benchmark_group("fingerprint");
    let (parts, ()) = Request::post("/orders?expand=1")
        .body(())
        .unwrap()
        .into_parts();
    for size in [1024usize, 64 * 1024] {
        let body = vec![b'x'; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("request", size), &body, |b, body| {
            b.iter(|| FingerprintMode::Request.fingerprint(&parts, black_box(body)))
        });
        // The same input through SHA-256, the hash the fingerprint is measured against.
        group.bench_with_input(BenchmarkId::new("sha256", size), &body, |b, body| {
            b.iter(|| {
                use sha2::{Digest, Sha256};
                let mut hasher = Sha256::new();
                for part in [b"POST".as_slice(), b"/orders?expand=1"] {
                    hasher.update((part.len() as u64).to_be_bytes());
                    hasher.update(part);
                }
                hasher.update(black_box(body));
                hasher.finalize()
            })
        });
    }
    group.finish();
    let scope = Scope::new("orders", PrincipalSource::Extension);
    c.bench_function("scope_store_key", |b| {
        b.iter(|| scope.store_key(&parts, black_box("8e03978e-40d5-43e8-bc93-6894a57f9324")))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .measurement_time(std::time::Duration::from_secs(3))
        .warm_up_time(std::time::Duration::from_secs(1));
    targets = layer_vs_bare, fingerprint_and_scope
}
criterion_main!(benches);
