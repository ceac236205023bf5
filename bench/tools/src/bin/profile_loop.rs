//! A loop of in-process requests through the layer (memory store, or SQLite on a scratch file;
//! current-thread runtime), for profilers: `perf record`, `perf stat`,
//! `valgrind --tool=callgrind`. No criterion, no network, so a profile shows the layer and the
//! handler and little else.
//!
//! ```sh
//! cargo build --release --manifest-path bench/Cargo.toml -p tower-idempotency-tools --bin profile_loop
//! perf stat -e task-clock target/release/profile_loop replay 1024 200000
//! perf record -g target/release/profile_loop new 1024 200000
//! perf stat -e task-clock target/release/profile_loop replay 1024 200000 sqlite
//! ```
//!
//! Arguments: `bare|new|replay`, the body size in bytes, the number of requests, and optionally
//! the store, `memory` (the default) or `sqlite` (a file in the system's temporary directory,
//! removed at the end).

use axum::{routing::post, Router};
use bytes::Bytes;
use tower::ServiceExt;
use tower_idempotency_core::{IdempotencyLayer, MemoryStore};
use tower_idempotency_sqlx::SqliteStore;
use tower_idempotency_testkit::{echo_created, order_request};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: profile_loop bare|new|replay BODY_BYTES REQUESTS [memory|sqlite]";
    let (mode, size, requests, store) = match args.as_slice() {
        [mode, size, requests] => (mode, size, requests, "memory"),
        [mode, size, requests, store] => (mode, size, requests, store.as_str()),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let (Ok(size), Ok(requests)) = (size.parse::<usize>(), requests.parse::<usize>()) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let bare = Router::new().route("/orders", post(echo_created));
    let scratch = std::env::temp_dir().join(format!("profile_loop-{}.db", std::process::id()));
    let layer = match store {
        "memory" => IdempotencyLayer::client_keys(MemoryStore::new().with_max_entries(100_000_000)),
        "sqlite" => runtime.block_on(async {
            let store = SqliteStore::connect(&format!("sqlite://{}", scratch.display()))
                .await
                .expect("open the scratch SQLite file");
            store.migrate().await.expect("migrate");
            IdempotencyLayer::client_keys(store)
        }),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let guarded = Router::new()
        .route("/orders", post(echo_created))
        .route_layer(layer);
    let body = Bytes::from(vec![b'x'; size]);
    runtime.block_on(async {
        let first = guarded
            .clone()
            .oneshot(order_request("replayed", &body))
            .await;
        assert_eq!(first.expect("infallible").status(), 201);
        for i in 0..requests {
            let response = match mode.as_str() {
                "bare" => bare.clone().oneshot(order_request("k", &body)).await,
                "new" => {
                    guarded
                        .clone()
                        .oneshot(order_request(&format!("new-{i}"), &body))
                        .await
                }
                "replay" => {
                    guarded
                        .clone()
                        .oneshot(order_request("replayed", &body))
                        .await
                }
                _ => {
                    eprintln!("{usage}");
                    std::process::exit(2);
                }
            };
            let response = response.expect("infallible");
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await;
            assert_eq!(bytes.expect("body").len(), size);
        }
    });
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", scratch.display()));
    }
}
