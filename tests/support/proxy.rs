//! A loopback TCP proxy for fault tests that can drop, stall or cut connections, or lose the
//! reply to one chosen command. Shared by the facade's tests and the Redis store's tests (which
//! include this file by path), so it depends on tokio alone.
#![allow(dead_code)] // Each test binary uses a different subset.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex,
    },
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
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

/// A loopback TCP proxy that can drop, stall or cut connections on command.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: watch::Sender<Mode>,
    cut: watch::Sender<u64>,
    lose: Arc<LoseReply>,
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

impl Proxy {
    pub async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let (mode, _) = watch::channel(Mode::Pass);
        let (cut, _) = watch::channel(0u64);
        let lose = Arc::new(LoseReply::default());
        let (mode_tx, cut_tx, lose_tx) = (mode.clone(), cut.clone(), lose.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *mode_tx.borrow() == Mode::Drop {
                    drop(client);
                    continue;
                }
                let upstream = upstream.clone();
                let (mode, mut cut) = (mode_tx.subscribe(), cut_tx.subscribe());
                let lose = lose_tx.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    // Dropping the pumps drops both halves of both sockets: a hard close.
                    let epoch = *cut.borrow_and_update();
                    let (a, b) = (cut.clone(), cut.clone());
                    let (pending, close) = (AtomicBool::new(false), Notify::new());
                    let losing = Losing {
                        lose: &lose,
                        pending: &pending,
                        close: &close,
                    };
                    tokio::select! {
                        biased;
                        _ = cut.changed() => {}
                        _ = close.notified() => {}
                        _ = async {
                            tokio::join!(
                                pump(cr, sw, mode.clone(), a, epoch, &[Mode::Stall], Side::Client(&losing)),
                                pump(sr, cw, mode, b, epoch, &[Mode::Stall, Mode::HoldReplies], Side::Server(&losing))
                            )
                        } => {}
                    }
                });
            }
        });
        Self {
            addr,
            mode,
            cut,
            lose,
            task,
        }
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

/// Which way a [`pump`] copies: client to server, or server to client.
#[derive(Clone, Copy)]
enum Side<'a> {
    Client(&'a Losing<'a>),
    Server(&'a Losing<'a>),
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    cut: watch::Receiver<u64>,
    epoch: u64,
    holds: &[Mode],
    side: Side<'_>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if mode.wait_for(|m| !holds.contains(m)).await.is_err() {
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
        if mode.wait_for(|m| !holds.contains(m)).await.is_err() || *cut.borrow() != epoch {
            return;
        }
        match side {
            Side::Client(losing) if losing.lose.matches(&buf[..n]) => {
                losing.pending.store(true, Ordering::SeqCst);
            }
            Side::Server(losing) if losing.pending.load(Ordering::SeqCst) => {
                losing.lose.lost.fetch_add(1, Ordering::SeqCst);
                losing.close.notify_one();
                return;
            }
            _ => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
