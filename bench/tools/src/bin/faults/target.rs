//! The outbox target the receivers' relays deliver to: a loopback HTTP server that dedupes by
//! `Idempotency-Key` and counts, and that can answer `500`, time out, redirect, drop the
//! connection or go away, as the fault loop sets it.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        atomic::{AtomicI64, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, service::service_fn, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, sync::watch, task::JoinSet};

/// How the target answers, set by the fault loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Runs each key once and answers `200` (a duplicate of a run key: `200`, not run again).
    Ok,
    /// Answers `500` without running.
    Error500,
    /// Runs, then answers only after longer than the relay's attempt timeout.
    Timeout,
    /// Answers `301` to a path that only takes `GET`.
    Redirect,
    /// Reads the request, then closes the connection without an answer (running it first
    /// every other time).
    Drop,
    /// Stops listening and cuts its connections: connections are refused.
    Gone,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error500 => "target-500",
            Self::Timeout => "target-timeout",
            Self::Redirect => "target-redirect",
            Self::Drop => "target-drop",
            Self::Gone => "target-gone",
        }
    }
}

/// What the target saw of one key.
#[derive(Clone, Default, Debug)]
pub struct KeySeen {
    /// `POST`s that carried the key.
    pub posts: u64,
    /// Times the target ran the key's work (at most one: it dedupes).
    pub runs: u64,
    /// `POST`s of the key answered `2xx`.
    pub answered_ok: u64,
    /// The event ids the key's bodies named.
    pub events: BTreeSet<String>,
}

/// The target's shared state.
pub struct Target {
    pub port: u16,
    mode: watch::Sender<Mode>,
    pub keys: Mutex<BTreeMap<String, KeySeen>>,
    /// `POST`s without an `Idempotency-Key`.
    pub keyless: AtomicU64,
    /// `GET`s of the redirect's landing path (a relay that follows a `301` as a `GET`).
    pub landing_gets: AtomicU64,
    /// Requests being answered now.
    pub in_flight: AtomicI64,
    /// Requests by what the target did.
    pub answers: Mutex<BTreeMap<&'static str, u64>>,
}

/// The redirect's landing path: `GET` only.
const LANDING: &str = "/landing";
/// How long a `Timeout` answer takes (the receivers' relay gives up after at most half a lease).
const TIMEOUT_ANSWER: Duration = Duration::from_secs(4);

#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped on purpose")
    }
}

impl std::error::Error for Dropped {}

impl Target {
    /// Binds a loopback port and serves until the process ends.
    pub async fn start(seed: u64) -> std::io::Result<Arc<Self>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (mode, _) = watch::channel(Mode::Ok);
        let target = Arc::new(Self {
            port,
            mode,
            keys: Mutex::default(),
            keyless: AtomicU64::new(0),
            landing_gets: AtomicU64::new(0),
            in_flight: AtomicI64::new(0),
            answers: Mutex::default(),
        });
        tokio::spawn(serve(target.clone(), Some(listener), seed));
        Ok(target)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    fn count(&self, what: &'static str) {
        *self.answers.lock().unwrap().entry(what).or_default() += 1;
    }

    /// Records a `POST` of `key` naming `event`; runs it when `run` and it never ran.
    fn post(&self, key: &str, event: Option<String>, run: bool, ok: bool) {
        let mut keys = self.keys.lock().unwrap();
        let seen = keys.entry(key.to_owned()).or_default();
        seen.posts += 1;
        seen.events.extend(event);
        if run && seen.runs == 0 {
            seen.runs = 1;
        }
        if ok {
            seen.answered_ok += 1;
        }
    }
}

/// Accepts connections while the mode is not `Gone`; on `Gone` closes the listener and cuts
/// every connection, and binds the same port again when the mode changes.
async fn serve(target: Arc<Target>, mut listener: Option<TcpListener>, seed: u64) {
    let mut mode = target.mode.subscribe();
    let mut rng = fastrand::Rng::with_seed(seed);
    loop {
        let Some(bound) = listener.take() else {
            let _ = mode.wait_for(|m| *m != Mode::Gone).await;
            // The port was ours a moment ago: retry until it binds.
            loop {
                match TcpListener::bind(("127.0.0.1", target.port)).await {
                    Ok(l) => {
                        listener = Some(l);
                        break;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            continue;
        };
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                gone = mode.wait_for(|m| *m == Mode::Gone) => {
                    if gone.is_err() { return; }
                    break;
                }
                accepted = bound.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let target = target.clone();
                    let delay_seed = rng.u64(..);
                    connections.spawn(async move {
                        let rng = Arc::new(Mutex::new(fastrand::Rng::with_seed(delay_seed)));
                        let service = service_fn(move |request| {
                            handle(target.clone(), rng.clone(), request)
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        drop(bound);
        connections.shutdown().await;
    }
}

fn answer(status: StatusCode, location: Option<&str>) -> Response<Full<Bytes>> {
    let mut response = Response::builder().status(status);
    if let Some(location) = location {
        response = response.header("location", location);
    }
    response
        .body(Full::new(Bytes::new()))
        .expect("valid response")
}

/// Decrements the in-flight count when the answer is done (or the connection dropped).
struct InFlight<'a>(&'a AtomicI64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn handle(
    target: Arc<Target>,
    rng: Arc<Mutex<fastrand::Rng>>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Dropped> {
    target.in_flight.fetch_add(1, Ordering::SeqCst);
    let _guard = InFlight(&target.in_flight);
    let (parts, body) = request.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return Err(Dropped);
    };
    if parts.uri.path() == LANDING {
        if parts.method == hyper::Method::GET {
            target.landing_gets.fetch_add(1, Ordering::SeqCst);
            target.count("landing GET");
            return Ok(answer(StatusCode::OK, None));
        }
        return Ok(answer(StatusCode::METHOD_NOT_ALLOWED, None));
    }
    if parts.method != hyper::Method::POST {
        target.count("not a POST");
        return Ok(answer(StatusCode::METHOD_NOT_ALLOWED, None));
    }
    let Some(key) = parts
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        target.keyless.fetch_add(1, Ordering::SeqCst);
        target.count("POST without key");
        return Ok(answer(StatusCode::BAD_REQUEST, None));
    };
    let event = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["event"].as_str().map(str::to_owned));
    let mode = *target.mode.borrow();
    match mode {
        Mode::Ok | Mode::Gone => {
            let delay = rng.lock().unwrap().u64(0..300);
            tokio::time::sleep(Duration::from_millis(delay)).await;
            target.post(&key, event, true, true);
            target.count("ok");
            Ok(answer(StatusCode::OK, None))
        }
        Mode::Error500 => {
            target.post(&key, event, false, false);
            target.count("500");
            Ok(answer(StatusCode::INTERNAL_SERVER_ERROR, None))
        }
        Mode::Timeout => {
            target.post(&key, event, true, false);
            target.count("ran, answered late");
            tokio::time::sleep(TIMEOUT_ANSWER).await;
            Ok(answer(StatusCode::OK, None))
        }
        Mode::Redirect => {
            target.post(&key, event, false, false);
            target.count("301");
            Ok(answer(StatusCode::MOVED_PERMANENTLY, Some(LANDING)))
        }
        Mode::Drop => {
            let run = rng.lock().unwrap().bool();
            target.post(&key, event, run, false);
            target.count(if run { "ran, dropped" } else { "dropped" });
            Err(Dropped)
        }
    }
}
