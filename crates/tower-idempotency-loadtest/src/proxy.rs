//! A loopback TCP proxy in front of Redis or Postgres that counts what clients send, so the
//! stores' round trips per request are measured on the wire rather than taken from their docs
//! or their own counters. Redis: complete commands (`INFO commandstats` is server-wide and other
//! clients of a shared server would pollute it). Postgres: `Sync` and simple `Query` messages,
//! each an exchange the client waits for (a statement, or sqlx's ping, which is a bare `Sync`).
//! Used only for the counting passes: it adds a hop, so throughput runs connect directly.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// The wire protocol a proxy counts.
#[derive(Clone, Copy, Debug)]
pub enum Protocol {
    /// Redis commands.
    Resp,
    /// Postgres round trips (the client must not negotiate TLS: `sslmode=disable`).
    Postgres,
}

/// A running proxy.
pub struct CountingProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// Commands (Redis) or round trips (Postgres) forwarded so far.
    pub count: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a proxy to `upstream` on the current runtime.
pub async fn start(upstream: SocketAddr, protocol: Protocol) -> std::io::Result<CountingProxy> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let count = Arc::new(AtomicU64::new(0));
    let counter = count.clone();
    let task = tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let upstream_leg = async move {
                    let mut parser = match protocol {
                        Protocol::Resp => Parser::Resp(RespCounter::default()),
                        Protocol::Postgres => Parser::Postgres(PgCounter::default()),
                    };
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match client_read.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        counter.fetch_add(parser.feed(&buf[..n]), Ordering::Relaxed);
                        if server_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                };
                let downstream_leg = async move {
                    let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                };
                tokio::join!(upstream_leg, downstream_leg);
            });
        }
    });
    Ok(CountingProxy { addr, count, task })
}

enum Parser {
    Resp(RespCounter),
    Postgres(PgCounter),
}

impl Parser {
    fn feed(&mut self, data: &[u8]) -> u64 {
        match self {
            Parser::Resp(p) => p.feed(data),
            Parser::Postgres(p) => p.feed(data),
        }
    }
}

/// Counts `Sync` (`S`) and `Query` (`Q`) messages in a Postgres client-to-server stream fed in
/// arbitrary chunks. The first message (startup) has no type byte, only a length.
#[derive(Default)]
struct PgCounter {
    pending: Vec<u8>,
    started: bool,
}

impl PgCounter {
    fn feed(&mut self, data: &[u8]) -> u64 {
        self.pending.extend_from_slice(data);
        let mut consumed = 0;
        let mut count = 0;
        loop {
            let rest = &self.pending[consumed..];
            let at = usize::from(self.started);
            let Some(len) = rest.get(at..at + 4) else {
                break;
            };
            let total = at + u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
            if rest.len() < total {
                break;
            }
            if self.started && matches!(rest[0], b'S' | b'Q') {
                count += 1;
            }
            self.started = true;
            consumed += total;
        }
        self.pending.drain(..consumed);
        count
    }
}

/// Counts complete RESP commands in a client-to-server byte stream fed in arbitrary chunks.
#[derive(Default)]
struct RespCounter {
    pending: Vec<u8>,
}

impl RespCounter {
    fn feed(&mut self, data: &[u8]) -> u64 {
        self.pending.extend_from_slice(data);
        let mut consumed = 0;
        let mut count = 0;
        while let Some(len) = command_len(&self.pending[consumed..]) {
            consumed += len;
            count += 1;
        }
        self.pending.drain(..consumed);
        count
    }
}

/// Length of the first complete command in `bytes`, if it is all there.
fn command_len(bytes: &[u8]) -> Option<usize> {
    if *bytes.first()? != b'*' {
        // An inline command: one line.
        return line_end(bytes, 0).map(|end| end + 2);
    }
    let (args, mut pos) = int_line(bytes, 1)?;
    for _ in 0..args {
        if *bytes.get(pos)? != b'$' {
            return None;
        }
        let (len, data) = int_line(bytes, pos + 1)?;
        pos = data + len + 2;
        if pos > bytes.len() {
            return None;
        }
    }
    Some(pos)
}

fn line_end(bytes: &[u8], from: usize) -> Option<usize> {
    bytes
        .get(from..)?
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|p| from + p)
}

fn int_line(bytes: &[u8], from: usize) -> Option<(usize, usize)> {
    let end = line_end(bytes, from)?;
    let value = std::str::from_utf8(&bytes[from..end]).ok()?.parse().ok()?;
    Some((value, end + 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_postgres_round_trips_split_across_chunks() {
        let message = |kind: u8, body: &[u8]| {
            let mut m = vec![kind];
            m.extend_from_slice(&(4 + body.len() as u32).to_be_bytes());
            m.extend_from_slice(body);
            m
        };
        // Startup (no type byte), then Parse/Bind/Execute/Sync, a bare Sync (a ping), a Query.
        let mut stream = Vec::new();
        stream.extend_from_slice(&(8u32 + 4).to_be_bytes());
        stream.extend_from_slice(&196608u32.to_be_bytes());
        stream.extend_from_slice(b"S\0Q\0");
        stream.extend(message(b'P', b"\0SELECT 1\0\0\0"));
        stream.extend(message(b'B', b"\0\0\0\0\0\0\0\0"));
        stream.extend(message(b'E', b"\0\0\0\0\0"));
        stream.extend(message(b'S', b""));
        stream.extend(message(b'S', b""));
        stream.extend(message(b'Q', b"SELECT 1\0"));
        let mut whole = PgCounter::default();
        assert_eq!(whole.feed(&stream), 3);
        for split in 1..stream.len() {
            let mut parser = PgCounter::default();
            let n = parser.feed(&stream[..split]) + parser.feed(&stream[split..]);
            assert_eq!(n, 3, "split at {split}");
            assert!(parser.pending.is_empty());
        }
    }

    #[test]
    fn counts_commands_split_across_chunks() {
        let stream =
            b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\nPING\r\n";
        let mut whole = RespCounter::default();
        assert_eq!(whole.feed(stream), 3);
        for split in 1..stream.len() {
            let mut parser = RespCounter::default();
            let n = parser.feed(&stream[..split]) + parser.feed(&stream[split..]);
            assert_eq!(n, 3, "split at {split}");
            assert!(parser.pending.is_empty());
        }
    }
}
