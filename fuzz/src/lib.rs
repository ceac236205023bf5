//! Fuzz target bodies, shared by the cargo-fuzz targets (`fuzz_targets/*.rs`, nightly) and the
//! stable runner (`src/bin/fuzz-stable.rs`), so both exercise exactly the same code.
//!
//! Every body must never panic on any input; beyond that each checks an oracle: parsers'
//! outputs respect their documented bounds, decoders round-trip, a delivery the harness signs
//! itself is never refused as a signature mismatch, and every non-2xx answer of the layer is an
//! RFC 9457 `application/problem+json` document.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{request::Parts, HeaderValue, Request};

mod check;
pub mod seeds;
mod targets;

pub use targets::{
    decoders::{decoders, idempotency_key},
    fixtures::fixtures,
    pipeline::pipeline,
    signatures::{paddle_signature, standard_signature, stripe_signature, v0_signature},
    twilio::twilio,
};

/// A fuzz target body.
pub type Target = fn(&[u8]);
/// A target's seed inputs.
pub type Seeds = fn() -> Vec<Vec<u8>>;

/// Outcome counters, so a run shows that the deep paths (accepted deliveries, replays, problem
/// answers) were reached and not only the early rejections.
pub mod stats {
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Verifications that accepted the delivery.
    pub static ACCEPTED: AtomicU64 = AtomicU64::new(0);
    /// Verifications that refused it.
    pub static REFUSED: AtomicU64 = AtomicU64::new(0);
    /// Layer answers that were 2xx.
    pub static SUCCESS: AtomicU64 = AtomicU64::new(0);
    /// Layer answers that were replays of a cached response.
    pub static REPLAYED: AtomicU64 = AtomicU64::new(0);
    /// Layer answers that were problems.
    pub static PROBLEMS: AtomicU64 = AtomicU64::new(0);

    /// Reads and resets all counters: (accepted, refused, success, replayed, problems).
    pub fn take() -> [u64; 5] {
        [&ACCEPTED, &REFUSED, &SUCCESS, &REPLAYED, &PROBLEMS].map(|c| c.swap(0, Ordering::Relaxed))
    }

    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Every target with its name and seed inputs (valid examples to mutate).
pub const TARGETS: &[(&str, Target, Seeds)] = &[
    ("stripe_signature", stripe_signature, seeds::stripe),
    ("paddle_signature", paddle_signature, seeds::paddle),
    ("standard_signature", standard_signature, seeds::standard),
    ("v0_signature", v0_signature, seeds::v0),
    ("decoders", decoders, seeds::decoders),
    ("twilio", twilio, seeds::twilio),
    ("fixtures", fixtures, seeds::fixtures),
    ("idempotency_key", idempotency_key, seeds::idempotency_key),
    ("pipeline", pipeline, seeds::pipeline),
];

const NOW: u64 = 1_700_000_000;
const SECRET: &str = "whsec_fuzz_secret";
const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const TWILIO_BASE: &str = "https://example.com";

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW)
}

/// Splits `data` into `N` newline-separated fields; the last one keeps any further newlines.
fn fields<const N: usize>(data: &[u8]) -> [&[u8]; N] {
    let mut out = [&data[..0]; N];
    for (slot, field) in out.iter_mut().zip(data.splitn(N, |b| *b == b'\n')) {
        *slot = field;
    }
    out
}

fn parts(uri: &str, headers: &[(&'static str, &[u8])]) -> Option<Parts> {
    let mut builder = Request::post(uri);
    for (name, value) in headers {
        builder = builder.header(*name, HeaderValue::from_bytes(value).ok()?);
    }
    Some(builder.body(()).ok()?.into_parts().0)
}
