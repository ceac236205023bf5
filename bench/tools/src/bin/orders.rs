//! The coalescing A/B's server (bench/scripts/coalescing-ab.sh): an axum `POST /orders` that
//! answers 201 with the request's body at once, behind the client-key layer on a Postgres store,
//! as a new user would write it (`#[tokio::main]`, default settings). It prints
//! `listening on ADDR` once it serves, and drops its table when stopped (SIGTERM or Ctrl-C).
//!
//! ```sh
//! cargo run --release --manifest-path bench/Cargo.toml -p tower-idempotency-tools --bin orders -- default
//! ```
//!
//! Targets: `bare` (no layer), `default` (`PostgresStore::connect`, the store `connect_store`
//! opens: 10 connections, coalescing off), `default-coalescing` (the same with coalescing on),
//! `pool32` and `pool32-coalescing` (a 32-connection pool, coalescing off and on). Postgres is `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); each run uses a table of its own.

use std::{
    hash::{BuildHasher, RandomState},
    sync::Arc,
    time::SystemTime,
};

use axum::{routing::post, Router};
use bytes::Bytes;
use http::StatusCode;
use tower_idempotency_core::IdempotencyLayer;
use tower_idempotency_sqlx::{
    sqlx::{self, postgres::PgPoolOptions},
    PostgresStore,
};

const USAGE: &str = "usage: orders bare|default|default-coalescing|pool32|pool32-coalescing";

async fn created(body: Bytes) -> (StatusCode, Bytes) {
    (StatusCode::CREATED, body)
}

#[tokio::main]
async fn main() {
    let target = std::env::args().nth(1).unwrap_or_default();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let table = format!(
        "orders_ab_{:016x}",
        RandomState::new().hash_one(SystemTime::now())
    );
    let routes = Router::new().route("/orders", post(created));
    let (router, store) = match target.as_str() {
        "bare" => (routes, None),
        "default" | "default-coalescing" | "pool32" | "pool32-coalescing" => {
            let store = if target.starts_with("default") {
                PostgresStore::connect_with_table(&url, &table)
                    .await
                    .expect("connect to Postgres")
                    .with_coalescing(target.ends_with("-coalescing"))
            } else {
                let pool = PgPoolOptions::new()
                    .max_connections(32)
                    .connect(&url)
                    .await
                    .expect("connect to Postgres");
                PostgresStore::new(pool, &table)
                    .expect("table name")
                    .with_coalescing(target.ends_with("-coalescing"))
            };
            store.migrate().await.expect("migrate");
            let store = Arc::new(store);
            (
                routes.route_layer(IdempotencyLayer::client_keys(store.clone())),
                Some(store),
            )
        }
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2)
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    println!("listening on {}", listener.local_addr().expect("address"));
    axum::serve(listener, router)
        .with_graceful_shutdown(stopped())
        .await
        .expect("serve");
    if let Some(store) = store {
        // The table's name is this run's own, built above.
        let drop = format!(r#"DROP TABLE IF EXISTS "{table}""#);
        sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
            .execute(store.pool())
            .await
            .expect("drop the table");
    }
}

/// SIGTERM or Ctrl-C.
async fn stopped() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
