//! `loadtest-peer`: the harness's echo handler (`POST /orders`, answering `201` with the request
//! body) behind `idempotent` 2.0's `IdempotencyLayer` with default settings, on its memory store
//! or its Valkey/Redis store, or bare (the same handler without a layer, to show that serving
//! from a child process costs the same as serving in the harness's own).
//!
//! The load harness starts one per measured cell and drives it like its own targets. It serves on
//! one Tokio worker thread, as the harness's server runtime does, binds `127.0.0.1:0`, prints
//! `listening <addr>` on stdout and exits when its stdin closes, so it never outlives the
//! harness.
//!
//! ```text
//! loadtest-peer --store bare|memory|valkey [--redis-url URL] [--prefix PREFIX]
//! ```
#![warn(missing_docs)]

use std::{io::Write as _, process::ExitCode};

use axum::{routing::post, serve::ListenerExt, Router};
use bytes::Bytes;
use http::StatusCode;
use idempotent::{memory::MemoryStore, middleware::IdempotencyLayer, valkey::ValkeyStore};
use tokio::{io::AsyncReadExt, net::TcpListener};

/// The store behind the layer, or none.
enum Store {
    Bare,
    Memory,
    Valkey { url: String, prefix: String },
}

/// Why the peer could not start.
#[derive(Debug)]
enum PeerError {
    Usage(String),
    Io(std::io::Error),
    Store(String),
}

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerError::Usage(flag) => write!(f, "bad flag {flag}"),
            PeerError::Io(e) => write!(f, "i/o error: {e}"),
            PeerError::Store(e) => write!(f, "cannot open the store: {e}"),
        }
    }
}

impl From<std::io::Error> for PeerError {
    fn from(e: std::io::Error) -> Self {
        PeerError::Io(e)
    }
}

fn parse(raw: &[String]) -> Result<Store, PeerError> {
    let (mut store, mut url, mut prefix) = (None, None, None);
    let mut it = raw.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .cloned()
            .ok_or_else(|| PeerError::Usage(flag.clone()));
        match flag.as_str() {
            "--store" => store = Some(value?),
            "--redis-url" => url = Some(value?),
            "--prefix" => prefix = Some(value?),
            _ => return Err(PeerError::Usage(flag.clone())),
        }
    }
    match store.as_deref() {
        Some("bare") => Ok(Store::Bare),
        Some("memory") => Ok(Store::Memory),
        Some("valkey") => Ok(Store::Valkey {
            url: url.unwrap_or_else(|| "redis://127.0.0.1:6379".into()),
            prefix: prefix.unwrap_or_else(|| "loadtest_peer".into()),
        }),
        _ => Err(PeerError::Usage("--store".into())),
    }
}

/// The same handler as the harness's `create_order`.
async fn create_order(body: Bytes) -> (StatusCode, Bytes) {
    (StatusCode::CREATED, body)
}

async fn router(store: Store) -> Result<Router, PeerError> {
    let routes = Router::new().route("/orders", post(create_order));
    Ok(match store {
        Store::Bare => routes,
        Store::Memory => {
            let store = MemoryStore::builder()
                .try_build()
                .map_err(|e| PeerError::Store(e.to_string()))?;
            routes.layer(IdempotencyLayer::new(store))
        }
        Store::Valkey { url, prefix } => {
            let store = ValkeyStore::with_url(url)
                .prefix(prefix)
                .try_build()
                .await
                .map_err(|e| PeerError::Store(e.to_string()))?;
            routes.layer(IdempotencyLayer::new(store))
        }
    })
}

async fn serve(store: Store) -> Result<(), PeerError> {
    let app = router(store).await?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    // Small responses must not wait for Nagle's algorithm (as in the harness's servers).
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening {addr}")?;
        stdout.flush()?;
    }
    let server = async move { axum::serve(listener, app).await };
    // The harness holds our stdin open while it needs us; end of file (or its death) stops us.
    let parent_gone = async {
        let mut sink = [0u8; 64];
        let mut stdin = tokio::io::stdin();
        while matches!(stdin.read(&mut sink).await, Ok(n) if n > 0) {}
    };
    tokio::select! {
        served = server => served?,
        () = parent_gone => {}
    }
    Ok(())
}

fn main() -> ExitCode {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let outcome = parse(&raw).and_then(|store| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("peer-server")
            .enable_all()
            .build()?
            .block_on(serve(store))
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadtest-peer: {e}");
            ExitCode::FAILURE
        }
    }
}
