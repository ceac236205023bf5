//! One fixture per shipped provider, for tests and benches (feature `test-support`; not a
//! stable API).
//!
//! A [`Fixture`] knows how its provider signs a delivery: the credential, the event body, the
//! headers, and the key the layer derives. The vectors, the end-to-end and bad-input tests, the
//! redaction checks and the benches iterate [`fixtures()`], so a new provider is covered by
//! writing its fixture next to its verifier and listing it in `providers/mod.rs`.
//!
//! ```
//! use std::time::{Duration, UNIX_EPOCH};
//! use tower_idempotency_webhooks::testing::{self, Signer};
//!
//! let now = 1_700_000_000;
//! for fixture in testing::fixtures() {
//!     let event = fixture.event("evt_1", now);
//!     let delivery = fixture.deliver(Signer::Genuine, &event, &event, now);
//!     let verified = fixture
//!         .verifier()
//!         .verify(&delivery.parts(), &delivery.body.clone().into(), UNIX_EPOCH + Duration::from_secs(now))
//!         .unwrap();
//!     assert_eq!(verified.provider(), fixture.provider());
//! }
//! ```

use std::sync::Arc;

use http::{request::Parts, Method, StatusCode};

use crate::Verifier;

mod hmac;

pub use hmac::{HmacFixture, MakeBody, MakeDelivery, MakeKey, MakeVerifier};

/// The path every fixture's deliveries are sent to (and, where the provider signs the URL,
/// signed for).
pub const PATH: &str = "/hook/acct_1";
/// The public origin of [`PATH`] for the providers that sign the URL (Square, Twilio): the URL
/// the provider was given, not the address a test server listens on.
pub const PUBLIC_ORIGIN: &str = "https://hooks.example.com";
/// The attacker's HMAC secret or token, for [`Signer::Attacker`] (see [`HmacFixture`]).
pub const ATTACKER_SECRET: &str = "attacker-secret";
/// How far outside the replay window the timestamp negatives are signed, in seconds.
pub const OUTSIDE_WINDOW_SECS: u64 = 3600;

/// Whose credential signs a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signer {
    /// The credential the fixture's verifier holds.
    Genuine,
    /// Another one ([`ATTACKER_SECRET`], or another key pair).
    Attacker,
}

/// One event: its id and the body the provider sends for it (before any signature the provider
/// puts in the body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The event's id, as the provider names it.
    pub id: String,
    /// The body.
    pub body: String,
}

/// The headers and body of one `POST` to [`PATH`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// Header names and values, in order (a name may repeat).
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: String,
}

impl Delivery {
    /// A delivery of `body` with `headers`.
    pub fn new(headers: Vec<(&'static str, String)>, body: impl Into<String>) -> Self {
        Self {
            headers,
            body: body.into(),
        }
    }

    /// The request head, as a verifier sees it: `POST` [`PATH`] with the headers.
    pub fn parts(&self) -> Parts {
        let mut builder = http::Request::post(PATH);
        for (name, value) in &self.headers {
            builder = builder.header(*name, value.as_str());
        }
        builder
            .body(())
            .expect("fixture headers are valid")
            .into_parts()
            .0
    }

    /// The value of header `name`, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The delivery without header `name`.
    pub fn without(mut self, name: &str) -> Self {
        self.headers.retain(|(n, _)| *n != name);
        self
    }

    /// The delivery with header `name` set to `value` (added if absent).
    pub fn with(mut self, name: &'static str, value: impl Into<String>) -> Self {
        let value = value.into();
        match self.headers.iter_mut().find(|(n, _)| *n == name) {
            Some(header) => header.1 = value,
            None => self.headers.push((name, value)),
        }
        self
    }
}

/// A delivery the verifier must refuse, and how.
#[derive(Clone, Debug)]
pub struct Negative {
    /// What is wrong with it.
    pub name: String,
    /// The delivery.
    pub delivery: Delivery,
    /// The status it is answered with.
    pub status: StatusCode,
    /// The problem slug it is answered with (`urn:tower-idempotency:problem:<slug>`).
    pub slug: &'static str,
}

/// What a captured delivery re-sent under another key gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Refused with this problem slug; the handler does not run.
    Refused(&'static str),
    /// The handler runs again: the provider's credential does not bind the delivery.
    Runs,
}

/// `(captured delivery, other event) -> re-send`, changing only what is not signed.
pub type Rewrite = fn(&Delivery, &Event) -> Delivery;

/// How a captured delivery can be re-sent under another key without a new signature.
#[derive(Clone, Copy, Debug)]
pub enum Recapture {
    /// The key is read from this header; the re-send changes only its value.
    Header(&'static str, Outcome),
    /// A provider-specific rewrite of the unsigned parts.
    Custom(Rewrite, Outcome),
    /// Everything the key is made of is signed: a change is a tampered delivery.
    Signed,
}

/// How to sign a valid delivery of one provider, and its negative cases.
pub trait Fixture: Send + Sync {
    /// The provider name (the verifier's `provider()`).
    fn provider(&self) -> &'static str;

    /// A verifier holding the genuine credential, for deliveries to [`PATH`].
    fn verifier(&self) -> Arc<dyn Verifier>;

    /// The body of the event `id`, as sent at `now` (unix seconds).
    fn event(&self, id: &str, now: u64) -> Event;

    /// A delivery of `sent` carrying the signature over `signed`, made at `now` with `signer`'s
    /// credential. `signed != sent` is a tampered delivery.
    fn deliver(&self, signer: Signer, signed: &Event, sent: &Event, now: u64) -> Delivery;

    /// The header that carries the signature (`None`: it is in the body).
    fn signature_header(&self) -> Option<&'static str>;

    /// Every spelling of the credential the verifier holds that must never appear in a
    /// `Debug`, an error or a log (none for a public key).
    fn secret_forms(&self) -> Vec<String>;

    /// The idempotency key the layer derives from `delivery` of `event`.
    fn key(&self, event: &Event, _delivery: &Delivery) -> String {
        event.id.clone()
    }

    /// Whether a changed body fails verification (not for a bare shared token).
    fn detects_tampering(&self) -> bool {
        true
    }

    /// Whether the signature covers the request's path.
    fn signs_path(&self) -> bool {
        false
    }

    /// Methods besides `POST` the provider sends deliveries with.
    fn other_methods(&self) -> &'static [Method] {
        &[]
    }

    /// How a captured delivery can be re-sent under another key.
    fn recapture(&self) -> Recapture {
        Recapture::Signed
    }

    /// A valid delivery of `event` at `now`.
    fn sign(&self, event: &Event, now: u64) -> Delivery {
        self.deliver(Signer::Genuine, event, event, now)
    }

    /// Deliveries the verifier refuses at `now`: another credential, a tampered body, no
    /// signature, a timestamp outside the window; a fixture adds its provider's own.
    fn negatives(&self, now: u64) -> Vec<Negative> {
        common_negatives(self, now)
    }
}

/// The negatives every provider shares (see [`Fixture::negatives`]).
pub fn common_negatives<F: Fixture + ?Sized>(fixture: &F, now: u64) -> Vec<Negative> {
    const MISMATCH: (StatusCode, &str) = (StatusCode::UNAUTHORIZED, "webhook-signature-mismatch");
    let negative = |name: &str, delivery, (status, slug)| Negative {
        name: name.to_owned(),
        delivery,
        status,
        slug,
    };
    let event = fixture.event(&format!("{}_negative", fixture.provider()), now);
    let other = fixture.event(&format!("{}_other", fixture.provider()), now);
    let mut out = vec![negative(
        "signed with another credential",
        fixture.deliver(Signer::Attacker, &event, &event, now),
        MISMATCH,
    )];
    if fixture.detects_tampering() {
        out.push(negative(
            "tampered body",
            fixture.deliver(Signer::Genuine, &event, &other, now),
            MISMATCH,
        ));
    }
    if let Some(header) = fixture.signature_header() {
        out.push(negative(
            "no signature header",
            fixture.sign(&event, now).without(header),
            (StatusCode::BAD_REQUEST, "webhook-missing-header"),
        ));
    }
    if fixture.verifier().replay_window().is_some() {
        for (name, at) in [
            ("stale timestamp, validly signed", now - OUTSIDE_WINDOW_SECS),
            (
                "future timestamp, validly signed",
                now + OUTSIDE_WINDOW_SECS,
            ),
        ] {
            let event = fixture.event(&event.id, at);
            out.push(negative(
                name,
                fixture.sign(&event, at),
                (
                    StatusCode::UNAUTHORIZED,
                    "webhook-timestamp-outside-tolerance",
                ),
            ));
        }
    }
    out
}

/// The fixture of every provider this build includes.
pub fn fixtures() -> Vec<Box<dyn Fixture>> {
    crate::providers::fixtures()
}

/// The fixture of `provider`.
///
/// # Panics
/// If this build has no such provider.
pub fn fixture(provider: &str) -> Box<dyn Fixture> {
    fixtures()
        .into_iter()
        .find(|fixture| fixture.provider() == provider)
        .unwrap_or_else(|| panic!("no fixture for provider {provider}"))
}

/// A deterministic 32-byte seed for a test key pair: the genuine and the attacker's differ.
pub fn key_seed(signer: Signer) -> [u8; 32] {
    match signer {
        Signer::Genuine => [7; 32],
        Signer::Attacker => [8; 32],
    }
}
