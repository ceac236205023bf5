//! A loopback TCP proxy for tests and measurements: it forwards both ways, can drop, stall or cut
//! connections, lose the reply to one chosen command, and count what clients send (Redis
//! commands or Postgres round trips) so that a store's round trips are measured on the wire.

use std::{
    io,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        tcp::{OwnedReadHalf, OwnedWriteHalf},
        TcpListener, TcpStream,
    },
    sync::{watch, Notify},
};

/// What a [`Proxy`] does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward bytes both ways.
    Pass,
    /// Close every new connection at once (existing ones keep forwarding).
    Drop,
    /// Accept and hold connections, forwarding no bytes either way.
    Stall,
    /// Forward what clients send, hold back what servers answer (a reply lost or late after
    /// the command ran).
    HoldReplies,
}

/// The wire protocol a counting [`Proxy`] counts in what clients send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Complete Redis (RESP or inline) commands.
    Resp,
    /// Postgres round trips: `Sync` and simple `Query` messages, each an exchange the client
    /// waits for (a statement, or sqlx's ping, a bare `Sync`). The client must not negotiate TLS
    /// (`sslmode=disable`), so that the stream is plain protocol from its first byte.
    Postgres,
}

/// A loopback TCP proxy in front of one upstream `host:port`. Dropping it cuts every
/// connection and stops listening.
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    upstream: watch::Sender<String>,
    mode: watch::Sender<Mode>,
    cut: watch::Sender<u64>,
    lose: Arc<LoseReply>,
    count: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

/// The armed "lose the reply" trigger of a [`Proxy`]: the needles a client's command must all
/// contain, and how many replies it has lost.
#[derive(Default)]
struct LoseReply {
    needles: Mutex<Option<Vec<Vec<u8>>>>,
    lost: AtomicUsize,
}

impl LoseReply {
    /// Disarms and answers `true` when armed and `bytes` contain every needle.
    fn matches(&self, bytes: &[u8]) -> bool {
        let mut needles = self.needles.lock().unwrap();
        let hit = needles.as_ref().is_some_and(|needles| {
            needles
                .iter()
                .all(|needle| bytes.windows(needle.len()).any(|w| w == needle.as_slice()))
        });
        if hit {
            *needles = None;
        }
        hit
    }
}

/// One proxied connection's part in losing a reply: the client side marks the reply as to be
/// lost before forwarding the command, the server side then reads that reply, forwards nothing
/// and closes the connection.
struct Losing<'a> {
    lose: &'a LoseReply,
    pending: &'a AtomicBool,
    close: &'a Notify,
}

/// What the proxy shares with every connection it accepts.
#[derive(Clone)]
struct Shared {
    upstream: watch::Receiver<String>,
    mode: watch::Receiver<Mode>,
    cut: watch::Receiver<u64>,
    lose: Arc<LoseReply>,
    count: Arc<AtomicU64>,
    protocol: Option<Protocol>,
}

impl Proxy {
    /// Starts a proxy to `upstream` (`host:port`) on the current runtime, forwarding.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound.
    pub async fn start(upstream: impl Into<String>) -> Self {
        Self::listen(upstream.into(), None)
            .await
            .expect("bind proxy")
    }

    /// Starts a proxy whose upstream is not known yet (a server that must be told the proxy's
    /// port before it starts): it closes every connection until [`Proxy::forward_to`].
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound.
    pub async fn without_upstream() -> Self {
        Self::start(String::new()).await
    }

    /// Forwards the connections accepted from now on to `upstream` (`host:port`).
    pub fn forward_to(&self, upstream: impl Into<String>) {
        self.upstream.send_replace(upstream.into());
    }

    /// Starts a proxy to `upstream` that counts what clients send in `protocol`
    /// ([`Proxy::counted`]).
    pub async fn counting(upstream: impl Into<String>, protocol: Protocol) -> io::Result<Self> {
        Self::listen(upstream.into(), Some(protocol)).await
    }

    async fn listen(upstream: String, protocol: Option<Protocol>) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (upstream, _) = watch::channel(upstream);
        let (mode, _) = watch::channel(Mode::Pass);
        let (cut, _) = watch::channel(0u64);
        let lose = Arc::new(LoseReply::default());
        let count = Arc::new(AtomicU64::new(0));
        let shared = Shared {
            upstream: upstream.subscribe(),
            mode: mode.subscribe(),
            cut: cut.subscribe(),
            lose: lose.clone(),
            count: count.clone(),
            protocol,
        };
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *shared.mode.borrow() == Mode::Drop {
                    drop(client);
                    continue;
                }
                tokio::spawn(connection(client, shared.clone()));
            }
        });
        Ok(Self {
            addr,
            upstream,
            mode,
            cut,
            lose,
            count,
            task,
        })
    }

    /// Arms a one-shot trigger: the next command a client sends through this proxy that
    /// contains every one of `needles` is forwarded and runs, but its reply is read and thrown
    /// away and the connection is closed instead, as when a connection fails after the server
    /// acted. Replaces a trigger that has not fired yet.
    pub fn lose_reply_to(&self, needles: &[&[u8]]) {
        *self.lose.needles.lock().unwrap() = Some(needles.iter().map(|n| n.to_vec()).collect());
    }

    /// How many replies [`Proxy::lose_reply_to`] has lost so far.
    pub fn lost_replies(&self) -> usize {
        self.lose.lost.load(Ordering::SeqCst)
    }

    /// Commands or round trips clients sent so far (0 unless started by [`Proxy::counting`]).
    pub fn counted(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// What the proxy does with traffic from now on.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Closes every connection currently open through the proxy.
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

/// Forwards one client connection until either side closes, the proxy cuts it or it loses a
/// reply.
async fn connection(client: TcpStream, mut shared: Shared) {
    let upstream = shared.upstream.borrow().clone();
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    // Small requests and replies must not wait for Nagle's algorithm.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // Dropping the pumps drops both halves of both sockets: a hard close.
    let epoch = *shared.cut.borrow_and_update();
    let (pending, close) = (AtomicBool::new(false), Notify::new());
    let losing = Losing {
        lose: &shared.lose,
        pending: &pending,
        close: &close,
    };
    let counter = shared.protocol.map(|p| (Counter::new(p), &*shared.count));
    let (mode, cut) = (&shared.mode, &shared.cut);
    let mut cut_now = cut.clone();
    tokio::select! {
        biased;
        _ = cut_now.changed() => {}
        _ = close.notified() => {}
        _ = async {
            tokio::join!(
                pump(cr, sw, Pump { mode: mode.clone(), cut: cut.clone(), epoch, holds: &[Mode::Stall] }, Side::Client(&losing, counter)),
                pump(sr, cw, Pump { mode: mode.clone(), cut: cut.clone(), epoch, holds: &[Mode::Stall, Mode::HoldReplies] }, Side::Server(&losing))
            )
        } => {}
    }
}

/// When a [`pump`] forwards: not while the mode is one of `holds`, and not after the
/// connection's `cut` moved past `epoch`.
struct Pump<'a> {
    mode: watch::Receiver<Mode>,
    cut: watch::Receiver<u64>,
    epoch: u64,
    holds: &'a [Mode],
}

/// Which way a [`pump`] copies: client to server (counting what it forwards when the proxy
/// counts), or server to client.
enum Side<'a> {
    Client(&'a Losing<'a>, Option<(Counter, &'a AtomicU64)>),
    Server(&'a Losing<'a>),
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut p: Pump<'_>,
    mut side: Side<'_>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if p.mode.wait_for(|m| !p.holds.contains(m)).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        // Bytes read just before a stall began are held back too, and dropped if the
        // connection was cut meanwhile (cut happens before the mode returns to pass).
        if p.mode.wait_for(|m| !p.holds.contains(m)).await.is_err() || *p.cut.borrow() != p.epoch {
            return;
        }
        match &mut side {
            Side::Client(losing, counter) => {
                if let Some((counter, count)) = counter {
                    count.fetch_add(counter.feed(&buf[..n]), Ordering::SeqCst);
                }
                if losing.lose.matches(&buf[..n]) {
                    losing.pending.store(true, Ordering::SeqCst);
                }
            }
            Side::Server(losing) if losing.pending.load(Ordering::SeqCst) => {
                losing.lose.lost.fetch_add(1, Ordering::SeqCst);
                losing.close.notify_one();
                return;
            }
            Side::Server(_) => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Counts the messages of a [`Protocol`] in a client-to-server stream fed in arbitrary chunks.
/// Hand-written: the proxy needs only where each message ends, which no client library exposes
/// for a byte stream it did not produce.
struct Counter {
    protocol: Protocol,
    pending: Vec<u8>,
    /// Postgres: whether the startup message (a length without a type byte) has gone by.
    started: bool,
}

impl Counter {
    fn new(protocol: Protocol) -> Self {
        Self {
            protocol,
            pending: Vec::new(),
            started: false,
        }
    }

    /// Takes the next chunk and answers how many messages it completed.
    fn feed(&mut self, data: &[u8]) -> u64 {
        self.pending.extend_from_slice(data);
        let mut consumed = 0;
        let mut count = 0;
        while let Some((len, counts)) = self.next_message(&self.pending[consumed..]) {
            consumed += len;
            count += u64::from(counts);
            self.started = true;
        }
        self.pending.drain(..consumed);
        count
    }

    /// The length of the first complete message in `bytes` and whether it counts.
    fn next_message(&self, bytes: &[u8]) -> Option<(usize, bool)> {
        match self.protocol {
            Protocol::Resp => command_len(bytes).map(|len| (len, true)),
            Protocol::Postgres => {
                let at = usize::from(self.started);
                let len = bytes.get(at..at + 4)?;
                let total = at + u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
                let counts = self.started && matches!(bytes[0], b'S' | b'Q');
                (bytes.len() >= total).then_some((total, counts))
            }
        }
    }
}

/// Length of the first complete Redis command in `bytes`, if it is all there.
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

    /// Every split of `stream` into two chunks counts `expected` messages and leaves nothing.
    fn counts_across_splits(protocol: Protocol, stream: &[u8], expected: u64) {
        assert_eq!(Counter::new(protocol).feed(stream), expected);
        for split in 1..stream.len() {
            let mut counter = Counter::new(protocol);
            let n = counter.feed(&stream[..split]) + counter.feed(&stream[split..]);
            assert_eq!(n, expected, "split at {split}");
            assert!(counter.pending.is_empty());
        }
    }

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
        counts_across_splits(Protocol::Postgres, &stream, 3);
    }

    #[test]
    fn counts_redis_commands_split_across_chunks() {
        let stream =
            b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\nPING\r\n";
        counts_across_splits(Protocol::Resp, stream, 3);
    }
}
