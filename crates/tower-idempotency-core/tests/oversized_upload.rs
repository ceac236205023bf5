//! A body over the cap, sent by a client that uploads everything before it reads the answer
//! (Python's httpx and requests do): it must read the `413`, not a reset connection.

use std::time::Duration;

use axum::{routing::post, Router};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tower_idempotency_core::{IdempotencyLayer, MemoryStore};
use tower_idempotency_testkit::Server;

const CAP: usize = 1024 * 1024;

async fn serve() -> Server {
    let app = Router::new()
        .route("/orders", post(|| async { "created" }))
        .route_layer(IdempotencyLayer::client_keys(MemoryStore::new()).max_body_bytes(CAP));
    Server::start(app).await
}

/// Writes the whole request at the pace of a network (a pause between 64 KiB pieces, so the
/// server sometimes finds nothing to read), then reads the answer's status line.
async fn upload_then_read(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    for piece in body.chunks(64 * 1024) {
        stream
            .write_all(piece)
            .await
            .expect("the server reads the upload instead of resetting the connection");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            Err(error) => panic!("reading the answer failed: {error} (after {answer:?})"),
        }
    }
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_client_that_uploads_before_reading_gets_the_413() {
    let server = serve().await;
    let body = vec![b'x'; 2 * CAP];
    let head = format!(
        "POST /orders HTTP/1.1\r\nhost: localhost\r\nidempotency-key: big\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    let status = upload_then_read(server.addr, &head, &body).await;
    assert!(status.starts_with("HTTP/1.1 413"), "{status:?}");
}

#[tokio::test]
async fn a_chunked_upload_over_the_cap_gets_the_413() {
    let server = serve().await;
    let mut body = Vec::new();
    for _ in 0..32 {
        body.extend_from_slice(format!("{:x}\r\n", 64 * 1024).as_bytes());
        body.extend_from_slice(&[b'x'; 64 * 1024]);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"0\r\n\r\n");
    let head = "POST /orders HTTP/1.1\r\nhost: localhost\r\nidempotency-key: big\r\n\
                transfer-encoding: chunked\r\n\r\n";
    let status = upload_then_read(server.addr, head, &body).await;
    assert!(status.starts_with("HTTP/1.1 413"), "{status:?}");
}

#[tokio::test]
async fn a_client_waiting_for_100_continue_gets_the_413_without_sending() {
    let server = serve().await;
    let head = format!(
        "POST /orders HTTP/1.1\r\nhost: localhost\r\nidempotency-key: big\r\n\
         expect: 100-continue\r\ncontent-length: {}\r\n\r\n",
        2 * CAP
    );
    let status = upload_then_read(server.addr, &head, &[]).await;
    assert!(
        status.starts_with("HTTP/1.1 413"),
        "no 100 Continue first: {status:?}"
    );
}
