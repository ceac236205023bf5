//! The bad-input catalog: every malformed request is sent over real HTTP (raw TCP, so that
//! framing, header bytes and half-closes are under the test's control) to axum on
//! 127.0.0.1:0 behind the layer, and must be answered with the expected status and problem
//! `type` without running a handler and without a single store claim. Every provider's fixture
//! (`tower_idempotency_webhooks::testing`) adds its own negatives and a valid control, so a new
//! provider is in the catalog without a change here.
#![cfg(feature = "webhooks")]

mod support;

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, SystemTime},
};
use tower_idempotency_testkit::unix_now;

use axum::{body::Bytes, extract::State, routing::post, Router};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tower_idempotency::{
    webhooks::{github, linear, paddle, shopify, slack, standard, stripe, zoom},
    IdempotencyLayer, MemoryStore, WebhookLayerExt,
};
use tower_idempotency_webhooks::testing::{self, Fixture};
// Counts every claim: a rejected request must not reach the store at all.
use tower_idempotency_testkit::CountingStore;

const STRIPE: &str = "whsec_bad_input_stripe";
const GITHUB: &str = "gh_bad_input_secret";
const SLACK: &str = "slack_bad_input_secret";
const STANDARD: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SHOPIFY: &str = "shopify_bad_input_secret";
const PADDLE: &str = "pdl_bad_input_secret";
const LINEAR: &str = "linear_bad_input_secret";
const GITLAB: &str = "gitlab_bad_input_token";
const ZOOM: &str = "zoom_bad_input_secret";
const WRONG: &str = "not_the_configured_secret";
/// RFC 8032 test 1 public key: any valid key will do, no request here is signed with it.
const DISCORD_KEY: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
const MAX_BODY: usize = 64 * 1024;

async fn executed(State(calls): State<Arc<AtomicUsize>>, _body: Bytes) -> &'static str {
    calls.fetch_add(1, Ordering::SeqCst);
    "ok"
}

fn app(store: Arc<CountingStore>, calls: Arc<AtomicUsize>) -> Router {
    let route = |path: &str, layer: IdempotencyLayer| {
        Router::new()
            .route(path, post(executed))
            .route_layer(layer.max_body_bytes(MAX_BODY))
    };
    let s = || store.clone();
    let app = Router::new()
        .merge(route("/orders", IdempotencyLayer::client_keys(s())))
        .merge(route("/stripe", IdempotencyLayer::stripe([STRIPE], s())))
        .merge(route("/github", IdempotencyLayer::github([GITHUB], s())))
        .merge(route("/slack", IdempotencyLayer::slack([SLACK], s())))
        .merge(route(
            "/standard",
            IdempotencyLayer::standard_webhooks([STANDARD], s()).unwrap(),
        ))
        .merge(route("/shopify", IdempotencyLayer::shopify([SHOPIFY], s())))
        .merge(route("/paddle", IdempotencyLayer::paddle([PADDLE], s())))
        .merge(route("/linear", IdempotencyLayer::linear([LINEAR], s())))
        .merge(route("/gitlab", IdempotencyLayer::gitlab([GITLAB], s())))
        .merge(route("/zoom", IdempotencyLayer::zoom([ZOOM], s())))
        .merge(route(
            "/discord",
            IdempotencyLayer::discord([DISCORD_KEY], s()).unwrap(),
        ));
    // Every provider's fixture, its verifier's route nested under the provider's name (the
    // verifier sees the path the fixture signed for).
    let app = testing::fixtures().iter().fold(app, |app, fixture| {
        let layer = IdempotencyLayer::webhook(fixture.verifier(), s());
        app.nest(
            &format!("/fx/{}", fixture.provider()),
            route(testing::PATH, layer),
        )
    });
    app.with_state(calls)
}

/// How the body is framed on the wire.
#[derive(Clone)]
enum Framing {
    /// A correct `Content-Length`.
    Length,
    /// `Content-Length` with this value, whatever the body's real size.
    Declared(u64),
    /// `Transfer-Encoding: chunked`, in 8 KiB chunks.
    Chunked,
    /// The request is exactly these bytes.
    Raw(Vec<u8>),
}

#[derive(Clone)]
struct Req {
    path: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    framing: Framing,
    /// Close our sending side after the request (the client gave up mid-body).
    half_close: bool,
}

impl Req {
    fn new(path: impl Into<String>, body: impl Into<Vec<u8>>) -> Self {
        Self {
            path: path.into(),
            headers: Vec::new(),
            body: body.into(),
            framing: Framing::Length,
            half_close: false,
        }
    }

    fn header(mut self, name: &str, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.to_owned(), value.into()));
        self
    }

    fn framing(mut self, framing: Framing) -> Self {
        self.framing = framing;
        self
    }

    fn wire(&self) -> Vec<u8> {
        if let Framing::Raw(raw) = &self.framing {
            return raw.clone();
        }
        let mut out = format!(
            "POST {} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n",
            self.path
        )
        .into_bytes();
        for (name, value) in &self.headers {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        match &self.framing {
            Framing::Length => {
                out.extend_from_slice(
                    format!("content-length: {}\r\n\r\n", self.body.len()).as_bytes(),
                );
                out.extend_from_slice(&self.body);
            }
            Framing::Declared(n) => {
                out.extend_from_slice(format!("content-length: {n}\r\n\r\n").as_bytes());
                out.extend_from_slice(&self.body);
            }
            Framing::Chunked => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
                for chunk in self.body.chunks(8192) {
                    out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    out.extend_from_slice(chunk);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n\r\n");
            }
            Framing::Raw(_) => unreachable!(),
        }
        out
    }
}

/// The requests of a provider that signs in one header and names the event (or the time) in
/// another: most tables vary one part of this shape.
struct Signed {
    route: &'static str,
    signature: &'static str,
    other: (&'static str, String),
}

impl Signed {
    fn new(route: &'static str, signature: &'static str, other: (&'static str, &str)) -> Self {
        Self {
            route,
            signature,
            other: (other.0, other.1.to_owned()),
        }
    }

    /// Both headers.
    fn req(&self, body: &[u8], signature: impl Into<Vec<u8>>) -> Req {
        self.only_signature(body, signature)
            .header(self.other.0, self.other.1.clone())
    }

    /// The other header, no signature.
    fn unsigned(&self, body: &[u8]) -> Req {
        Req::new(self.route, body).header(self.other.0, self.other.1.clone())
    }

    /// The rows every provider of this shape answers alike: no signature, another secret's
    /// signature, a tampered body, no event id, and the signature twice.
    fn common_rows(
        &self,
        body: &[u8],
        good: &str,
        wrong: &str,
        tampered: &[u8],
    ) -> [(&'static str, Req, Expect); 5] {
        [
            (
                "missing header",
                self.unsigned(body),
                Problem(400, "webhook-missing-header"),
            ),
            (
                "wrong secret",
                self.req(body, wrong),
                Problem(BAD_SIG, "webhook-signature-mismatch"),
            ),
            (
                "tampered body",
                self.req(tampered, good),
                Problem(BAD_SIG, "webhook-signature-mismatch"),
            ),
            (
                "no event id, validly signed",
                self.only_signature(body, good),
                Problem(400, "webhook-missing-event-id"),
            ),
            (
                "signature repeated",
                self.req(body, good).header(self.signature, good),
                Problem(400, "webhook-duplicate-header"),
            ),
        ]
    }

    /// The signature, not the other header.
    fn only_signature(&self, body: &[u8], signature: impl Into<Vec<u8>>) -> Req {
        Req::new(self.route, body).header(self.signature, signature)
    }
}

/// What the server sent back, if anything.
#[derive(Debug)]
struct Answer {
    status: Option<u16>,
    headers: String,
    body: Vec<u8>,
}

/// Sends `req` while reading the answer, so a server that answers early (413) and closes is
/// observed as it answered, not as a reset.
async fn send_raw(addr: &str, req: &Req) -> Answer {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    let wire = req.wire();
    let half_close = req.half_close;
    let writing = tokio::spawn(async move {
        for piece in wire.chunks(16 * 1024) {
            if writer.write_all(piece).await.is_err() {
                return writer;
            }
        }
        if half_close {
            let _ = writer.shutdown().await;
        }
        writer
    });
    let mut received = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer and no close within 10 s");
    drop(writing.await);
    parse_answer(&received)
}

fn parse_answer(received: &[u8]) -> Answer {
    let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Answer {
            status: None,
            headers: String::new(),
            body: Vec::new(),
        };
    };
    let head = String::from_utf8_lossy(&received[..end]).into_owned();
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok());
    let mut body = received[end + 4..].to_vec();
    let length = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())?
    });
    if let Some(length) = length {
        body.truncate(length);
    }
    Answer {
        status,
        headers: head,
        body,
    }
}

/// What a case must produce.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// This status and problem `type` slug.
    Problem(u16, &'static str),
    /// This status and one of these problem `type` slugs.
    OneOf(u16, &'static [&'static str]),
    /// This problem, or the server closed the connection without answering.
    ProblemOrClosed(u16, &'static str),
    /// A bare HTTP-level refusal by hyper with this status, or a closed connection.
    HttpErrorOrClosed(u16),
}

struct Case {
    name: String,
    req: Req,
    expect: Expect,
}

fn case(name: impl Into<String>, req: Req, expect: Expect) -> Case {
    Case {
        name: name.into(),
        req,
        expect,
    }
}

/// One concern's table: each row's name is prefixed with the concern.
fn table(concern: &str, rows: impl IntoIterator<Item = (&'static str, Req, Expect)>) -> Vec<Case> {
    rows.into_iter()
        .map(|(name, req, expect)| case(format!("{concern}: {name}"), req, expect))
        .collect()
}

use Expect::*;

const BAD_SIG: u16 = 401;
const DEEP: &[&str] = &["webhook-body-not-json", "webhook-missing-event-id"];

fn stripe_event(id: &str) -> String {
    format!(r#"{{"id":"{id}","object":"event","type":"invoice.paid"}}"#)
}

/// The hex `v1` signature of a Stripe delivery, without the header around it.
fn stripe_hmac(secret: &str, ts: u64, body: &[u8]) -> String {
    stripe::sign(secret, ts, body)
        .split_once(",v1=")
        .unwrap()
        .1
        .to_owned()
}

fn deep_json(depth: usize) -> Vec<u8> {
    let mut body = Vec::with_capacity(depth * 6 + 10);
    for _ in 0..depth {
        body.extend_from_slice(b"{\"a\":");
    }
    body.extend_from_slice(b"1");
    body.extend(std::iter::repeat_n(b'}', depth));
    body
}

/// Every case, by concern.
fn catalog() -> Vec<Case> {
    let t = unix_now();
    [
        body_size_and_framing(t),
        client_keys(),
        header_injection(),
        stripe_header_grammar(t),
        stripe_header_values(t),
        stripe_bodies(t),
        github(),
        slack_and_zoom(t),
        slack_bodies(t),
        standard_webhooks_headers(t),
        standard_webhooks_signatures(t),
        shopify(),
        paddle(t),
        linear(t),
        gitlab(),
        discord(t),
        fixture_negatives(t),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Body size and framing (client keys).
fn body_size_and_framing(t: u64) -> Vec<Case> {
    let mut cases = Vec::new();
    let key = |req: Req| req.header("idempotency-key", "k-framing");
    let big = vec![b'x'; MAX_BODY + 1];
    cases.push(case(
        "oversized body, Content-Length declared",
        key(Req::new("/orders", big.clone())),
        Problem(413, "payload-too-large"),
    ));
    cases.push(case(
        "oversized body, Content-Length declared, body never sent",
        key(Req::new("/orders", Vec::new())).framing(Framing::Declared(10 * 1024 * 1024)),
        Problem(413, "payload-too-large"),
    ));
    cases.push(case(
        "oversized body, chunked (no Content-Length)",
        key(Req::new("/orders", big.clone())).framing(Framing::Chunked),
        ProblemOrClosed(413, "payload-too-large"),
    ));
    cases.push(case(
        "oversized body, chunked, 1 byte over",
        key(Req::new("/orders", vec![b'y'; MAX_BODY + 1])).framing(Framing::Chunked),
        ProblemOrClosed(413, "payload-too-large"),
    ));
    let mut lying_more =
        key(Req::new("/orders", b"short".to_vec())).framing(Framing::Declared(5000));
    lying_more.half_close = true;
    cases.push(case(
        "Content-Length declares more than sent, client closes",
        lying_more,
        ProblemOrClosed(400, "body-unreadable"),
    ));
    let mut chunked_cut = key(Req::new("/orders", Vec::new())).framing(Framing::Raw(
        b"POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: k-cut\r\ntransfer-encoding: chunked\r\n\r\n100\r\nonly a few bytes".to_vec(),
    ));
    chunked_cut.half_close = true;
    cases.push(case(
        "chunked body cut off mid-chunk, client closes",
        chunked_cut,
        ProblemOrClosed(400, "body-unreadable"),
    ));
    cases.push(case(
        "malformed chunk size",
        Req::new("/orders", Vec::new()).framing(Framing::Raw(
            b"POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: k-chunk\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\nzz\r\nabc\r\n0\r\n\r\n".to_vec(),
        )),
        ProblemOrClosed(400, "body-unreadable"),
    ));
    // Content-Length together with Transfer-Encoding is not in the catalog: RFC 9112 6.3 lets
    // the server use the chunked framing (and close afterwards), which hyper does, so it is a
    // valid request, not bad input.
    cases.push(case(
        "two different Content-Length headers",
        Req::new("/orders", Vec::new()).framing(Framing::Raw(
            b"POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: k-2cl\r\ncontent-length: 3\r\ncontent-length: 5\r\nconnection: close\r\n\r\nabcde".to_vec(),
        )),
        HttpErrorOrClosed(400),
    ));
    // A signed delivery whose Content-Length declares less than the signed body: the server
    // reads the declared prefix, whose signature cannot match; the rest is not a request.
    let body = stripe_event("evt_short_cl");
    let sig = stripe::sign(STRIPE, t, body.as_bytes());
    cases.push(case(
        "Content-Length declares less than sent (signed body truncated)",
        Req::new("/stripe", body.clone())
            .header("stripe-signature", sig)
            .framing(Framing::Declared(10)),
        Problem(BAD_SIG, "webhook-signature-mismatch"),
    ));
    cases
}

/// Client keys.
fn client_keys() -> Vec<Case> {
    let mut cases = Vec::new();
    cases.push(case(
        "missing Idempotency-Key",
        Req::new("/orders", "{}"),
        Problem(400, "missing-key"),
    ));
    for (name, value) in [
        ("empty key", b"".to_vec()),
        ("empty quoted key", b"\"\"".to_vec()),
        ("key of 256 bytes", vec![b'k'; 256]),
        ("key of 64 KiB", vec![b'k'; 64 * 1024]),
        ("non-ASCII key (UTF-8)", "clé-ü".as_bytes().to_vec()),
        ("non-ASCII key (Latin-1 byte)", b"cl\xe9".to_vec()),
        ("key with a space", b"a b".to_vec()),
        ("key with a tab", b"a\tb".to_vec()),
        ("unterminated quoted key", b"\"abc".to_vec()),
        ("quoted key with a bad escape", b"\"a\\qb\"".to_vec()),
        (
            "key that is a structured-field integer",
            b"\"a\" x".to_vec(),
        ),
    ] {
        cases.push(case(
            name,
            Req::new("/orders", "{}").header("idempotency-key", value),
            Problem(400, "invalid-key"),
        ));
    }
    for (name, first, second) in [
        ("repeated Idempotency-Key header", "one", "two"),
        (
            "repeated Idempotency-Key header, same value",
            "same",
            "same",
        ),
    ] {
        cases.push(case(
            name,
            Req::new("/orders", "{}")
                .header("idempotency-key", first)
                .header("idempotency-key", second),
            Problem(400, "invalid-key"),
        ));
    }
    cases
}

/// Header injection: bytes hyper's parser refuses before any service runs.
fn header_injection() -> Vec<Case> {
    let mut cases = Vec::new();
    for (name, raw) in [
        ("bare CR inside the key", &b"idempotency-key: a\rb"[..]),
        (
            "bare LF splitting the key into a second line",
            b"idempotency-key: a\nX-Injected: 1\nb",
        ),
        ("NUL inside the key", b"idempotency-key: a\0b"),
        (
            "obsolete line folding of the key",
            b"idempotency-key: a\r\n b",
        ),
        ("header name with a space", b"idempotency key: abc"),
        ("header without a colon", b"idempotency-key abc"),
    ] {
        let mut wire = b"POST /orders HTTP/1.1\r\nhost: x\r\nconnection: close\r\n".to_vec();
        wire.extend_from_slice(raw);
        wire.extend_from_slice(b"\r\ncontent-length: 2\r\n\r\n{}");
        cases.push(case(
            format!("header injection: {name}"),
            Req::new("/orders", Vec::new()).framing(Framing::Raw(wire)),
            HttpErrorOrClosed(400),
        ));
    }
    cases
}

/// Stripe: the grammar of the signature header.
fn stripe_header_grammar(t: u64) -> Vec<Case> {
    let mut cases = Vec::new();
    let body = stripe_event("evt_bad");
    let good = stripe_hmac(STRIPE, t, body.as_bytes());
    let s = |v: String| Req::new("/stripe", body.clone()).header("stripe-signature", v);
    let malformed = Problem(400, "webhook-malformed-header");
    for (name, value, expect) in [
        ("empty", String::new(), malformed),
        ("no `=`", "garbage".to_owned(), malformed),
        ("only a timestamp", format!("t={t}"), malformed),
        ("only a signature", format!("v1={good}"), malformed),
        (
            "timestamp twice",
            format!("t={t},t={t},v1={good}"),
            malformed,
        ),
        ("empty member", format!("t={t},,v1={good}"), malformed),
        ("empty signature", format!("t={t},v1="), malformed),
        ("signature not hex", format!("t={t},v1=zzzz"), malformed),
        (
            "17 signatures",
            format!("t={t}{}", ",v1=00".repeat(17)),
            malformed,
        ),
        (
            "300 members",
            format!("t={t}{}", ",x=1".repeat(300)),
            malformed,
        ),
        (
            "only an unknown scheme",
            format!("t={t},v0={good}"),
            Problem(BAD_SIG, "webhook-unsupported-version"),
        ),
        (
            "short hex signature",
            format!("t={t},v1=abcd"),
            Problem(BAD_SIG, "webhook-signature-mismatch"),
        ),
    ] {
        cases.push(case(format!("stripe: {name}"), s(value), expect));
    }
    cases
}

/// Stripe: timestamps and signatures in the header, and the header itself.
fn stripe_header_values(t: u64) -> Vec<Case> {
    let mut cases = Vec::new();
    let stale = t - 3600;
    let future = t + 3600;
    let body = stripe_event("evt_bad");
    let good = stripe_hmac(STRIPE, t, body.as_bytes());
    let s = |v: String| Req::new("/stripe", body.clone()).header("stripe-signature", v);
    let malformed = Problem(400, "webhook-malformed-header");
    for (name, value, expect) in [
        (
            "non-numeric timestamp",
            format!("t=abc,v1={good}"),
            Problem(400, "webhook-invalid-timestamp"),
        ),
        (
            "negative timestamp",
            format!("t=-5,v1={good}"),
            Problem(400, "webhook-invalid-timestamp"),
        ),
        (
            "overflowing timestamp (20 digits)",
            format!("t=99999999999999999999,v1={good}"),
            Problem(400, "webhook-invalid-timestamp"),
        ),
        (
            "wrong secret",
            format!("t={t},v1={}", stripe_hmac(WRONG, t, body.as_bytes())),
            Problem(BAD_SIG, "webhook-signature-mismatch"),
        ),
        (
            "stale timestamp, validly signed",
            format!(
                "t={stale},v1={}",
                stripe_hmac(STRIPE, stale, body.as_bytes())
            ),
            Problem(BAD_SIG, "webhook-timestamp-outside-tolerance"),
        ),
        (
            "future timestamp, validly signed",
            format!(
                "t={future},v1={}",
                stripe_hmac(STRIPE, future, body.as_bytes())
            ),
            Problem(BAD_SIG, "webhook-timestamp-outside-tolerance"),
        ),
        (
            "timestamp i64::MAX, validly signed",
            stripe::sign(STRIPE, i64::MAX as u64, body.as_bytes()),
            Problem(BAD_SIG, "webhook-timestamp-outside-tolerance"),
        ),
        (
            "timestamp u64::MAX, validly signed",
            stripe::sign(STRIPE, u64::MAX, body.as_bytes()),
            Problem(400, "webhook-invalid-timestamp"),
        ),
    ] {
        cases.push(case(format!("stripe: {name}"), s(value), expect));
    }
    cases.push(case(
        "stripe: missing header",
        Req::new("/stripe", body.clone()),
        Problem(400, "webhook-missing-header"),
    ));
    cases.push(case(
        "stripe: header repeated",
        s(stripe::sign(STRIPE, t, body.as_bytes()))
            .header("stripe-signature", stripe::sign(STRIPE, t, body.as_bytes())),
        Problem(400, "webhook-duplicate-header"),
    ));
    cases.push(case(
        "stripe: header over 8 KiB",
        s(format!("t={t},v1={}", "a".repeat(9000))),
        Problem(400, "webhook-header-too-large"),
    ));
    cases.push(case(
        "stripe: non-ASCII header",
        Req::new("/stripe", body.clone()).header("stripe-signature", b"t=1,v1=\xff\xfe".to_vec()),
        malformed,
    ));
    cases.push(case(
        "stripe: tampered body",
        Req::new("/stripe", body.replace("invoice.paid", "invoice.void"))
            .header("stripe-signature", stripe::sign(STRIPE, t, body.as_bytes())),
        Problem(BAD_SIG, "webhook-signature-mismatch"),
    ));
    cases
}

/// Stripe: validly signed bodies without a usable event id.
fn stripe_bodies(t: u64) -> Vec<Case> {
    let mut cases = Vec::new();
    let signed = |body: Vec<u8>| {
        let sig = stripe::sign(STRIPE, t, &body);
        Req::new("/stripe", body).header("stripe-signature", sig)
    };
    cases.push(case(
        "stripe: empty body, validly signed",
        signed(Vec::new()),
        Problem(400, "webhook-body-not-json"),
    ));
    cases.push(case(
        "stripe: non-JSON body, validly signed",
        signed(b"id=evt_1&type=x".to_vec()),
        Problem(400, "webhook-body-not-json"),
    ));
    cases.push(case(
        "stripe: invalid UTF-8 body, validly signed",
        signed(b"{\"id\":\"evt_\xff\xfe\"}".to_vec()),
        Problem(400, "webhook-body-not-json"),
    ));
    // Whether the verifier builds the document (serde_json's recursion limit: not JSON) or
    // streams past it (no id found), it answers 400 without recursing 10 000 deep.
    cases.push(case(
        "stripe: JSON nested 10 000 deep, validly signed",
        signed(deep_json(10_000)),
        OneOf(400, DEEP),
    ));
    cases.push(case(
        "stripe: JSON without an id, validly signed",
        signed(br#"{"object":"event"}"#.to_vec()),
        Problem(400, "webhook-missing-event-id"),
    ));
    cases.push(case(
        "stripe: id of 300 bytes, validly signed",
        signed(stripe_event(&"e".repeat(300)).into_bytes()),
        Problem(400, "webhook-invalid-event-id"),
    ));
    cases.push(case(
        "stripe: id with a control character, validly signed",
        signed(br#"{"id":"evt\u0001x"}"#.to_vec()),
        Problem(400, "webhook-invalid-event-id"),
    ));
    cases.push(case(
        "stripe: id is an object, validly signed",
        signed(br#"{"id":{"a":1}}"#.to_vec()),
        Problem(400, "webhook-missing-event-id"),
    ));
    cases
}

/// GitHub.
fn github() -> Vec<Case> {
    let body = br#"{"action":"opened"}"#.to_vec();
    let shape = Signed::new(
        "/github",
        "x-hub-signature-256",
        ("x-github-delivery", "d-1"),
    );
    let gh = |sig: &str| shape.req(&body, sig);
    let good = github::sign(GITHUB, &body);
    let common = shape.common_rows(
        &body,
        &good,
        &github::sign(WRONG, &body),
        b"{\"action\":\"closed\"}",
    );
    table(
        "github",
        common.into_iter().chain([
            (
                "only the legacy SHA-1 header",
                shape.unsigned(&body).header("x-hub-signature", "sha1=00"),
                Problem(BAD_SIG, "webhook-unsupported-version"),
            ),
            (
                "other scheme",
                gh("md5=abcdef"),
                Problem(BAD_SIG, "webhook-unsupported-version"),
            ),
            (
                "no scheme prefix",
                gh("abcdef"),
                Problem(400, "webhook-malformed-header"),
            ),
            (
                "not hex",
                gh("sha256=xyz"),
                Problem(400, "webhook-malformed-header"),
            ),
            // Malformed, as Stripe's empty `v1=` is: not a signature that fails to match.
            (
                "empty signature",
                gh("sha256="),
                Problem(400, "webhook-malformed-header"),
            ),
            (
                "delivery id of 300 bytes",
                shape
                    .only_signature(&body, good.clone())
                    .header("x-github-delivery", "d".repeat(300)),
                Problem(400, "webhook-invalid-event-id"),
            ),
            (
                "delivery id repeated",
                gh(&good).header("x-github-delivery", "d-2"),
                Problem(400, "webhook-duplicate-header"),
            ),
        ]),
    )
}

/// Slack and Zoom (v0 scheme, timestamp header).
fn slack_and_zoom(t: u64) -> Vec<Case> {
    let mut cases = Vec::new();
    let stale = t - 3600;
    let future = t + 3600;
    for (route, secret, sig_h, ts_h, body) in [
        (
            "/slack",
            SLACK,
            "x-slack-signature",
            "x-slack-request-timestamp",
            br#"{"type":"event_callback","event_id":"Ev1"}"#.to_vec(),
        ),
        (
            "/zoom",
            ZOOM,
            "x-zm-signature",
            "x-zm-request-timestamp",
            br#"{"event":"meeting.started","payload":{}}"#.to_vec(),
        ),
    ] {
        let provider = route.trim_start_matches('/');
        let req = |ts: String, sig: String, body: &[u8]| {
            Req::new(route, body.to_vec())
                .header(ts_h, ts)
                .header(sig_h, sig)
        };
        let v0 = |secret: &str, ts: u64, body: &[u8]| slack::sign(secret, ts, body);
        for (name, r, expect) in [
            (
                "missing signature",
                Req::new(route, body.clone()).header(ts_h, t.to_string()),
                Problem(400, "webhook-missing-header"),
            ),
            (
                "missing timestamp",
                Req::new(route, body.clone()).header(sig_h, v0(secret, t, &body)),
                Problem(400, "webhook-missing-header"),
            ),
            (
                "no scheme prefix",
                req(t.to_string(), "abcdef".into(), &body),
                Problem(400, "webhook-malformed-header"),
            ),
            (
                "other scheme",
                req(t.to_string(), "v1=abcdef".into(), &body),
                Problem(BAD_SIG, "webhook-unsupported-version"),
            ),
            (
                "not hex",
                req(t.to_string(), "v0=not-hex".into(), &body),
                Problem(400, "webhook-malformed-header"),
            ),
            (
                "non-numeric timestamp",
                req("soon".into(), v0(secret, t, &body), &body),
                Problem(400, "webhook-invalid-timestamp"),
            ),
            (
                "overflowing timestamp",
                req("99999999999999999999".into(), v0(secret, t, &body), &body),
                Problem(400, "webhook-invalid-timestamp"),
            ),
            (
                "timestamp with a sign",
                req(format!("+{t}"), v0(secret, t, &body), &body),
                Problem(400, "webhook-invalid-timestamp"),
            ),
            (
                "wrong secret",
                req(t.to_string(), v0(WRONG, t, &body), &body),
                Problem(BAD_SIG, "webhook-signature-mismatch"),
            ),
            (
                "tampered body",
                req(t.to_string(), v0(secret, t, &body), b"{\"type\":\"x\"}"),
                Problem(BAD_SIG, "webhook-signature-mismatch"),
            ),
            (
                "stale timestamp, validly signed",
                req(stale.to_string(), v0(secret, stale, &body), &body),
                Problem(BAD_SIG, "webhook-timestamp-outside-tolerance"),
            ),
            (
                "future timestamp, validly signed",
                req(future.to_string(), v0(secret, future, &body), &body),
                Problem(BAD_SIG, "webhook-timestamp-outside-tolerance"),
            ),
            (
                "non-JSON body, validly signed",
                req(t.to_string(), v0(secret, t, b"payload=1"), b"payload=1"),
                Problem(400, "webhook-body-not-json"),
            ),
        ] {
            cases.push(case(format!("{provider}: {name}"), r, expect));
        }
    }
    cases
}

/// Slack: validly signed bodies without a usable event id.
fn slack_bodies(t: u64) -> Vec<Case> {
    let mut cases = Vec::new();
    cases.push(case(
        "slack: JSON nested 10 000 deep, validly signed",
        Req::new("/slack", deep_json(10_000))
            .header("x-slack-request-timestamp", t.to_string())
            .header(
                "x-slack-signature",
                slack::sign(SLACK, t, &deep_json(10_000)),
            ),
        OneOf(400, DEEP),
    ));
    let slack_no_id = br#"{"type":"event_callback"}"#;
    cases.push(case(
        "slack: no event_id, validly signed",
        Req::new("/slack", slack_no_id.to_vec())
            .header("x-slack-request-timestamp", t.to_string())
            .header("x-slack-signature", slack::sign(SLACK, t, slack_no_id)),
        Problem(400, "webhook-missing-event-id"),
    ));
    let _ = zoom::PROVIDER;
    cases
}

/// A Standard Webhooks delivery of `body` with these three headers.
fn standard_req(id: &str, ts: String, signature: String, body: &[u8]) -> Req {
    Req::new("/standard", body.to_vec())
        .header("webhook-id", id)
        .header("webhook-timestamp", ts)
        .header("webhook-signature", signature)
}

/// Standard Webhooks: the headers and their grammar.
fn standard_webhooks_headers(t: u64) -> Vec<Case> {
    let key_bytes = standard::decode_secret(STANDARD).unwrap();
    let body = br#"{"type":"user.created"}"#.to_vec();
    let good = standard::sign(&key_bytes, "msg_1", t, &body);
    table(
        "standard-webhooks",
        [
            (
                "missing signature",
                Req::new("/standard", body.clone())
                    .header("webhook-id", "msg_1")
                    .header("webhook-timestamp", t.to_string()),
                Problem(400, "webhook-missing-header"),
            ),
            (
                "missing id",
                Req::new("/standard", body.clone())
                    .header("webhook-timestamp", t.to_string())
                    .header("webhook-signature", good.clone()),
                Problem(400, "webhook-missing-header"),
            ),
            (
                "missing timestamp",
                Req::new("/standard", body.clone())
                    .header("webhook-id", "msg_1")
                    .header("webhook-signature", good.clone()),
                Problem(400, "webhook-missing-header"),
            ),
            (
                "no version prefix",
                standard_req("msg_1", t.to_string(), "abcdef".into(), &body),
                Problem(400, "webhook-malformed-header"),
            ),
            (
                "only an unknown version",
                standard_req("msg_1", t.to_string(), "v2,abcdef".into(), &body),
                Problem(BAD_SIG, "webhook-unsupported-version"),
            ),
            (
                "not base64",
                standard_req("msg_1", t.to_string(), "v1,!!!".into(), &body),
                Problem(400, "webhook-malformed-header"),
            ),
            (
                "17 signatures",
                standard_req(
                    "msg_1",
                    t.to_string(),
                    vec![good.as_str(); 17].join(" "),
                    &body,
                ),
                Problem(400, "webhook-malformed-header"),
            ),
        ],
    )
}

/// Standard Webhooks: timestamps, signatures and ids.
fn standard_webhooks_signatures(t: u64) -> Vec<Case> {
    let stale = t - 3600;
    let future = t + 3600;
    let key_bytes = standard::decode_secret(STANDARD).unwrap();
    let body = br#"{"type":"user.created"}"#.to_vec();
    let good = standard::sign(&key_bytes, "msg_1", t, &body);
    let wrong_key = vec![7u8; 24];
    table(
        "standard-webhooks",
        [
            (
                "non-numeric timestamp",
                standard_req("msg_1", "now".into(), good.clone(), &body),
                Problem(400, "webhook-invalid-timestamp"),
            ),
            (
                "overflowing timestamp",
                standard_req("msg_1", "99999999999999999999".into(), good.clone(), &body),
                Problem(400, "webhook-invalid-timestamp"),
            ),
            (
                "wrong secret",
                standard_req(
                    "msg_1",
                    t.to_string(),
                    standard::sign(&wrong_key, "msg_1", t, &body),
                    &body,
                ),
                Problem(BAD_SIG, "webhook-signature-mismatch"),
            ),
            (
                "signature for another id",
                standard_req("msg_2", t.to_string(), good.clone(), &body),
                Problem(BAD_SIG, "webhook-signature-mismatch"),
            ),
            (
                "tampered body",
                standard_req(
                    "msg_1",
                    t.to_string(),
                    good.clone(),
                    b"{\"type\":\"user.deleted\"}",
                ),
                Problem(BAD_SIG, "webhook-signature-mismatch"),
            ),
            (
                "stale timestamp, validly signed",
                standard_req(
                    "msg_1",
                    stale.to_string(),
                    standard::sign(&key_bytes, "msg_1", stale, &body),
                    &body,
                ),
                Problem(BAD_SIG, "webhook-timestamp-outside-tolerance"),
            ),
            (
                "future timestamp, validly signed",
                standard_req(
                    "msg_1",
                    future.to_string(),
                    standard::sign(&key_bytes, "msg_1", future, &body),
                    &body,
                ),
                Problem(BAD_SIG, "webhook-timestamp-outside-tolerance"),
            ),
            (
                "id of 300 bytes, validly signed",
                standard_req(
                    &"m".repeat(300),
                    t.to_string(),
                    standard::sign(&key_bytes, &"m".repeat(300), t, &body),
                    &body,
                ),
                Problem(400, "webhook-invalid-event-id"),
            ),
        ],
    )
}

/// Shopify.
fn shopify() -> Vec<Case> {
    let body = br#"{"id":1}"#.to_vec();
    let good = shopify::sign(SHOPIFY, &body);
    let shape = Signed::new(
        "/shopify",
        "x-shopify-hmac-sha256",
        ("x-shopify-event-id", "ev-1"),
    );
    let sh = |sig: &str| shape.req(&body, sig);
    let common = shape.common_rows(&body, &good, &shopify::sign(WRONG, &body), b"{\"id\":2}");
    table(
        "shopify",
        common.into_iter().chain([
            (
                "not base64",
                sh("!!!not base64!!!"),
                Problem(400, "webhook-malformed-header"),
            ),
            ("empty", sh(""), Problem(400, "webhook-malformed-header")),
        ]),
    )
}

/// Paddle.
fn paddle(t: u64) -> Vec<Case> {
    let stale = t - 3600;
    let future = t + 3600;
    let body = br#"{"event_id":"evt_p1","event_type":"x"}"#.to_vec();
    let h1 = |secret: &str, ts: u64, body: &[u8]| {
        paddle::sign(secret, ts, body)
            .split_once(";h1=")
            .unwrap()
            .1
            .to_owned()
    };
    let good = h1(PADDLE, t, &body);
    let pd = |v: String| Req::new("/paddle", body.clone()).header("paddle-signature", v);
    let malformed = Problem(400, "webhook-malformed-header");
    table(
        "paddle",
        [
            (
                "missing header",
                Req::new("/paddle", body.clone()),
                Problem(400, "webhook-missing-header"),
            ),
            (
                "comma instead of semicolon",
                pd(format!("ts={t},h1={good}")),
                malformed,
            ),
            ("only a timestamp", pd(format!("ts={t}")), malformed),
            ("no timestamp", pd(format!("h1={good}")), malformed),
            (
                "only an unknown scheme",
                pd(format!("ts={t};h2={good}")),
                Problem(BAD_SIG, "webhook-unsupported-version"),
            ),
            ("not hex", pd(format!("ts={t};h1=zz")), malformed),
            (
                "non-numeric timestamp",
                pd(format!("ts=x;h1={good}")),
                Problem(400, "webhook-invalid-timestamp"),
            ),
            (
                "wrong secret",
                pd(format!("ts={t};h1={}", h1(WRONG, t, &body))),
                Problem(BAD_SIG, "webhook-signature-mismatch"),
            ),
            (
                "stale timestamp, validly signed",
                pd(paddle::sign(PADDLE, stale, &body)),
                Problem(BAD_SIG, "webhook-timestamp-outside-tolerance"),
            ),
            (
                "future timestamp, validly signed",
                pd(paddle::sign(PADDLE, future, &body)),
                Problem(BAD_SIG, "webhook-timestamp-outside-tolerance"),
            ),
            (
                "non-JSON body, validly signed",
                Req::new("/paddle", b"nope".to_vec())
                    .header("paddle-signature", paddle::sign(PADDLE, t, b"nope")),
                Problem(400, "webhook-body-not-json"),
            ),
        ],
    )
}

/// Linear (timestamp in the body, milliseconds).
fn linear(t: u64) -> Vec<Case> {
    let stale = t - 3600;
    let future = t + 3600;
    let lbody = |ms: u64| format!(r#"{{"action":"create","webhookTimestamp":{ms}}}"#).into_bytes();
    let body = lbody(t * 1000);
    let shape = Signed::new("/linear", "linear-signature", ("linear-delivery", "ld-1"));
    let li = |sig: String, body: &[u8]| shape.req(body, sig);
    table(
        "linear",
        [
            (
                "missing header",
                shape.unsigned(&body),
                Problem(400, "webhook-missing-header"),
            ),
            (
                "not hex",
                li("xyz".into(), &body),
                Problem(400, "webhook-malformed-header"),
            ),
            (
                "wrong secret",
                li(linear::sign(WRONG, &body), &body),
                Problem(BAD_SIG, "webhook-signature-mismatch"),
            ),
            (
                "tampered body",
                li(linear::sign(LINEAR, &body), &lbody(t * 1000 + 1)),
                Problem(BAD_SIG, "webhook-signature-mismatch"),
            ),
            (
                "stale body timestamp, validly signed",
                li(
                    linear::sign(LINEAR, &lbody(stale * 1000)),
                    &lbody(stale * 1000),
                ),
                Problem(BAD_SIG, "webhook-timestamp-outside-tolerance"),
            ),
            (
                "future body timestamp, validly signed",
                li(
                    linear::sign(LINEAR, &lbody(future * 1000)),
                    &lbody(future * 1000),
                ),
                Problem(BAD_SIG, "webhook-timestamp-outside-tolerance"),
            ),
            (
                "no body timestamp, validly signed",
                li(
                    linear::sign(LINEAR, b"{\"action\":\"x\"}"),
                    b"{\"action\":\"x\"}",
                ),
                Problem(400, "webhook-invalid-timestamp"),
            ),
            (
                "string body timestamp, validly signed",
                li(
                    linear::sign(LINEAR, b"{\"webhookTimestamp\":\"1\"}"),
                    b"{\"webhookTimestamp\":\"1\"}",
                ),
                Problem(400, "webhook-invalid-timestamp"),
            ),
            (
                "non-JSON body, validly signed",
                li(linear::sign(LINEAR, b"x"), b"x"),
                Problem(400, "webhook-body-not-json"),
            ),
        ],
    )
}

/// GitLab (shared token).
fn gitlab() -> Vec<Case> {
    let body = br#"{"object_kind":"push"}"#.to_vec();
    let shape = Signed::new("/gitlab", "x-gitlab-token", ("idempotency-key", "gl-1"));
    table(
        "gitlab",
        [
            (
                "missing token",
                shape.unsigned(&body),
                Problem(400, "webhook-missing-header"),
            ),
            (
                "wrong token",
                shape.req(&body, WRONG),
                Problem(BAD_SIG, "webhook-signature-mismatch"),
            ),
            (
                "token prefix only",
                shape.req(&body, &GITLAB[..5]),
                Problem(BAD_SIG, "webhook-signature-mismatch"),
            ),
            (
                "empty token",
                shape.req(&body, ""),
                Problem(400, "webhook-malformed-header"),
            ),
            (
                "token repeated",
                Req::new("/gitlab", body.clone())
                    .header("x-gitlab-token", GITLAB)
                    .header("x-gitlab-token", GITLAB)
                    .header("idempotency-key", "gl-1"),
                Problem(400, "webhook-duplicate-header"),
            ),
            (
                "no event id",
                shape.only_signature(&body, GITLAB),
                Problem(400, "webhook-missing-event-id"),
            ),
            (
                "key repeated",
                shape
                    .only_signature(&body, GITLAB)
                    .header("idempotency-key", "a")
                    .header("idempotency-key", "b"),
                Problem(400, "webhook-duplicate-header"),
            ),
        ],
    )
}

/// Discord (Ed25519; nothing here is validly signed).
fn discord(t: u64) -> Vec<Case> {
    let body = br#"{"id":"1","type":2}"#.to_vec();
    let shape = Signed::new(
        "/discord",
        "x-signature-ed25519",
        ("x-signature-timestamp", &t.to_string()),
    );
    table(
        "discord",
        [
            (
                "missing signature",
                shape.unsigned(&body),
                Problem(400, "webhook-missing-header"),
            ),
            (
                "not hex",
                shape.req(&body, "zz"),
                Problem(400, "webhook-malformed-header"),
            ),
            (
                "wrong length",
                shape.req(&body, "00".repeat(32)),
                Problem(400, "webhook-malformed-header"),
            ),
            (
                "forged signature",
                shape.req(&body, "11".repeat(64)),
                Problem(BAD_SIG, "webhook-signature-mismatch"),
            ),
        ],
    )
}

/// Where a fixture's deliveries are sent (see `app`).
fn fixture_path(fixture: &dyn Fixture) -> String {
    format!("/fx/{}{}", fixture.provider(), testing::PATH)
}

/// A fixture's delivery as a request to its route.
fn fixture_req(fixture: &dyn Fixture, delivery: &testing::Delivery) -> Req {
    let req = Req::new(fixture_path(fixture), delivery.body.clone());
    delivery
        .headers
        .iter()
        .fold(req, |req, (name, value)| req.header(name, value.clone()))
}

/// Every provider's own negatives (another credential, a tampered body, no signature, a
/// timestamp outside the window), from its fixture.
fn fixture_negatives(t: u64) -> Vec<Case> {
    let mut cases = Vec::new();
    for fixture in testing::fixtures() {
        for negative in fixture.negatives(t) {
            cases.push(case(
                format!("{} (fixture): {}", fixture.provider(), negative.name),
                fixture_req(fixture.as_ref(), &negative.delivery),
                Problem(negative.status.as_u16(), negative.slug),
            ));
        }
    }
    cases
}

/// Valid requests through the same app: they must execute, which shows the catalog's zeros
/// come from the inputs, not from a broken harness.
fn controls() -> Vec<Req> {
    let t = unix_now();
    let stripe_body = stripe_event("evt_control");
    let gh = br#"{"action":"opened"}"#.to_vec();
    let slack_body = br#"{"type":"event_callback","event_id":"EvControl"}"#.to_vec();
    let key_bytes = standard::decode_secret(STANDARD).unwrap();
    let sw_body = br#"{"type":"user.created"}"#.to_vec();
    let shop = br#"{"id":1}"#.to_vec();
    let pad = br#"{"event_id":"evt_pc","event_type":"x"}"#.to_vec();
    let lin = format!(r#"{{"action":"create","webhookTimestamp":{}}}"#, t * 1000).into_bytes();
    let zoom_body = br#"{"event":"meeting.started","payload":{"n":1}}"#.to_vec();
    vec![
        Req::new("/orders", "{}").header("idempotency-key", "control-1"),
        Req::new("/stripe", stripe_body.clone()).header(
            "stripe-signature",
            stripe::sign(STRIPE, t, stripe_body.as_bytes()),
        ),
        Req::new("/github", gh.clone())
            .header("x-hub-signature-256", github::sign(GITHUB, &gh))
            .header("x-github-delivery", "control"),
        Req::new("/slack", slack_body.clone())
            .header("x-slack-request-timestamp", t.to_string())
            .header("x-slack-signature", slack::sign(SLACK, t, &slack_body)),
        Req::new("/standard", sw_body.clone())
            .header("webhook-id", "msg_control")
            .header("webhook-timestamp", t.to_string())
            .header(
                "webhook-signature",
                standard::sign(&key_bytes, "msg_control", t, &sw_body),
            ),
        Req::new("/shopify", shop.clone())
            .header("x-shopify-hmac-sha256", shopify::sign(SHOPIFY, &shop))
            .header("x-shopify-event-id", "control"),
        Req::new("/paddle", pad.clone()).header("paddle-signature", paddle::sign(PADDLE, t, &pad)),
        Req::new("/linear", lin.clone())
            .header("linear-signature", linear::sign(LINEAR, &lin))
            .header("linear-delivery", "control"),
        Req::new("/gitlab", b"{}".to_vec())
            .header("x-gitlab-token", GITLAB)
            .header("idempotency-key", "control"),
        Req::new("/zoom", zoom_body.clone())
            .header("x-zm-request-timestamp", t.to_string())
            .header("x-zm-signature", zoom::sign(ZOOM, t, &zoom_body)),
    ]
}

/// Every fixture's valid delivery through its route runs the handler once and claims its key,
/// plus the record of its signature where the verifier binds one (`Authenticator`).
async fn fixture_controls(addr: &str, calls: &AtomicUsize, store: &CountingStore) {
    let t = unix_now();
    for fixture in testing::fixtures() {
        let event = fixture.event(&format!("{}_control", fixture.provider()), t);
        let delivery = fixture.sign(&event, t);
        let verified = fixture
            .verifier()
            .verify(
                &delivery.parts(),
                &delivery.body.clone().into(),
                SystemTime::now(),
            )
            .expect("a fixture's delivery verifies");
        let (runs, claims) = (calls.load(Ordering::SeqCst), store.claims());
        let answer = send_raw(addr, &fixture_req(fixture.as_ref(), &delivery)).await;
        assert_eq!(answer.status, Some(200), "{} control", fixture.provider());
        assert_eq!(
            calls.load(Ordering::SeqCst),
            runs + 1,
            "{}",
            fixture.provider()
        );
        let signature_record = usize::from(verified.authenticator().is_some());
        assert_eq!(
            store.claims(),
            claims + 1 + signature_record,
            "{}",
            fixture.provider()
        );
    }
}

/// Whether `answer` is what `expect` asks for; `slug` is its problem type's suffix.
fn matches(expect: Expect, answer: &Answer, slug: &str) -> bool {
    match expect {
        Problem(status, want) => answer.status == Some(status) && slug == want,
        OneOf(status, wants) => answer.status == Some(status) && wants.contains(&slug),
        ProblemOrClosed(status, want) => {
            answer.status.is_none() || (answer.status == Some(status) && slug == want)
        }
        HttpErrorOrClosed(status) => {
            answer.status.is_none() || (answer.status == Some(status) && slug.is_empty())
        }
    }
}

/// Sends every case: each gets what it expects, and none runs a handler or claims a key.
async fn run_catalog(addr: &str, calls: &AtomicUsize, store: &CountingStore) {
    let cases = catalog();
    let mut failures = Vec::new();
    for case in &cases {
        let answer = send_raw(addr, &case.req).await;
        let slug = support::problem_type(&answer.body);
        let slug = slug.trim_start_matches("urn:tower-idempotency:problem:");
        if !matches(case.expect, &answer, slug) {
            failures.push(format!(
                "{}: expected {:?}, got {:?} {slug:?}",
                case.name, case.expect, answer.status
            ));
        }
        if !matches!(case.expect, Problem(..) | OneOf(..)) {
            println!("  {}: {:?} {slug:?}", case.name, answer.status);
        }
        let problem_json = answer
            .headers
            .to_ascii_lowercase()
            .contains("application/problem+json");
        if matches!(case.expect, Problem(..) | OneOf(..)) && !problem_json {
            failures.push(format!("{}: not application/problem+json", case.name));
        }
        if calls.load(Ordering::SeqCst) != 0 || store.claims() != 0 {
            panic!(
                "{}: a handler ran ({}) or a key was claimed ({})",
                case.name,
                calls.load(Ordering::SeqCst),
                store.claims()
            );
        }
    }
    let mut groups = std::collections::BTreeMap::<&str, usize>::new();
    for case in &cases {
        let group = case
            .name
            .split_once(": ")
            .map_or("body and keys", |(g, _)| g);
        *groups.entry(group).or_default() += 1;
    }
    println!(
        "bad-input catalog: {} cases over HTTP {groups:?}",
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// The controls run, each once, and claim their keys (and the records of their signatures).
async fn run_controls(addr: &str, calls: &AtomicUsize, store: &CountingStore) {
    let controls = controls();
    for (n, req) in controls.iter().enumerate() {
        let answer = send_raw(addr, req).await;
        assert_eq!(
            answer.status,
            Some(200),
            "control {} ({}): {:?}",
            n,
            req.path,
            String::from_utf8_lossy(&answer.body)
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), controls.len());
    // GitHub, Shopify and Linear also claim the record of their signature (`Authenticator`).
    let signature_records = controls
        .iter()
        .filter(|req| ["/github", "/shopify", "/linear"].contains(&req.path.as_str()))
        .count();
    assert_eq!(signature_records, 3);
    assert_eq!(store.claims(), controls.len() + signature_records);
}

/// Zoom keys by a body digest, so 10 000-deep JSON is an authentic, valid delivery: it may run
/// once (streamed past without recursion) or be refused as not JSON (built with serde_json's
/// recursion limit), but it never crashes the server.
async fn deep_json_via_zoom(addr: &str, calls: &AtomicUsize) {
    let t = unix_now();
    let deep = deep_json(10_000);
    let req = Req::new("/zoom", deep.clone())
        .header("x-zm-request-timestamp", t.to_string())
        .header("x-zm-signature", zoom::sign(ZOOM, t, &deep));
    let before = calls.load(Ordering::SeqCst);
    let answer = send_raw(addr, &req).await;
    let ran = calls.load(Ordering::SeqCst) - before;
    assert!(
        (answer.status == Some(200) && ran == 1) || (answer.status == Some(400) && ran == 0),
        "deep JSON via zoom: {:?}, ran {ran}",
        answer.status
    );
    println!(
        "zoom, 10 000-deep JSON: {:?}, handler runs: {ran}",
        answer.status
    );
    let again = send_raw(addr, &req).await;
    assert_eq!(
        calls.load(Ordering::SeqCst) - before,
        ran,
        "a duplicate never runs"
    );
    assert_eq!(again.status, answer.status);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_catalog() {
    let store = Arc::new(CountingStore::new(MemoryStore::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let base = support::serve(app(store.clone(), calls.clone())).await;
    let addr = base.trim_start_matches("http://").to_owned();
    run_catalog(&addr, &calls, &store).await;
    run_controls(&addr, &calls, &store).await;
    fixture_controls(&addr, &calls, &store).await;
    deep_json_via_zoom(&addr, &calls).await;
}
