//! Workload for `scripts/constant-time.sh`: runs one fixed delivery through the public
//! [`Verifier::verify`] many times, with a wrong signature that differs from the right one in
//! its first or its last hex digit, so callgrind's instruction counts show whether rejecting it
//! depends on *where* it is wrong.
//!
//! Usage: `ct_probe <mode>`, where every mode name has 11 bytes (equal argv lengths keep the
//! process start-up identical between modes):
//!
//! - `stripe-head` / `stripe-tail` / `stripe-good`: `Stripe-Signature` v1 wrong in its first
//!   digit / wrong in its last digit / correct;
//! - `gitlab-head` / `gitlab-tail` / `gitlab-good`: the same for `X-Gitlab-Token`;
//! - `naive-head` / `naive-tail` (padded to `naive-head-` / `naive-tail-`): a deliberately
//!   early-exit comparison of the same MAC bytes, which the script must see as *different*,
//!   proving that the method detects a leak.
//!
//! Only [`ct_probe_measure`] is counted (`--toggle-collect=ct_probe_measure`): setup differs between
//! modes by design (which digit is changed) and must not blur the comparison.

use std::{
    hint::black_box,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use http::{request::Parts, Request};
use tower_idempotency_webhooks::{
    gitlab::GitLabVerifier, stripe, stripe::StripeVerifier, Verifier,
};

/// Verifications per run: enough that a one-instruction difference per call shows up as
/// thousands, small enough that callgrind finishes in about a second.
const N: usize = 2000;
const TIMESTAMP: u64 = 1_700_000_000;
const STRIPE_SECRET: &str = "whsec_ct_probe_fixed_secret";
/// First and last characters are equal, so "change the first" and "change the last" leave the
/// same multiset of characters (header validation and hashing see the same bytes, reordered).
const GITLAB_TOKEN: &str = "glpat-ct-probe-fixed-token-g";
/// The replacement character: same class (lowercase hex letter / visible ASCII) everywhere.
const SUBSTITUTE: u8 = b'f';

#[derive(Clone, Copy)]
enum Position {
    Head,
    Tail,
    Good,
}

/// `text` with the character at `position` replaced by [`SUBSTITUTE`].
fn corrupt(text: &str, position: Position) -> String {
    let mut bytes = text.as_bytes().to_vec();
    let index = match position {
        Position::Head => 0,
        Position::Tail => bytes.len() - 1,
        Position::Good => return text.to_owned(),
    };
    assert_ne!(bytes[index], SUBSTITUTE, "the substitution must change it");
    bytes[index] = SUBSTITUTE;
    String::from_utf8(bytes).expect("ASCII in, ASCII out")
}

/// The counted region: callgrind's `--toggle-collect` names this symbol.
#[no_mangle]
#[inline(never)]
fn ct_probe_measure(run: &dyn Fn() -> bool) -> usize {
    let mut accepted = 0;
    for _ in 0..N {
        accepted += usize::from(black_box(run)());
    }
    accepted
}

fn parts(headers: &[(&str, &str)]) -> Parts {
    let mut builder = Request::post("/webhooks");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).expect("valid request").into_parts().0
}

/// A delivery whose signature's first and last hex digits are equal (see [`GITLAB_TOKEN`] for
/// why), found by a deterministic search over the event id.
fn stripe_delivery() -> (Bytes, String) {
    for n in 0u32.. {
        let body = format!(r#"{{"id":"evt_ct_probe_{n:04}","object":"event"}}"#);
        let header = stripe::sign(STRIPE_SECRET, TIMESTAMP, body.as_bytes());
        let hex = header.rsplit_once("v1=").expect("v1 present").1.to_owned();
        let (first, last) = (hex.as_bytes()[0], hex.as_bytes()[hex.len() - 1]);
        if first == last && first != SUBSTITUTE {
            return (Bytes::from(body), hex);
        }
    }
    unreachable!("one in sixteen candidates qualifies")
}

fn run_stripe(position: Position) -> usize {
    let (body, hex) = stripe_delivery();
    let header = format!("t={TIMESTAMP},v1={}", corrupt(&hex, position));
    let parts = parts(&[(stripe::SIGNATURE_HEADER, &header)]);
    let verifier = StripeVerifier::new([STRIPE_SECRET]);
    let now = UNIX_EPOCH + Duration::from_secs(TIMESTAMP + 10);
    ct_probe_measure(&|| {
        verifier
            .verify(black_box(&parts), black_box(&body), black_box(now))
            .is_ok()
    })
}

fn run_gitlab(position: Position) -> usize {
    let token = corrupt(GITLAB_TOKEN, position);
    let parts = parts(&[
        (tower_idempotency_webhooks::gitlab::TOKEN_HEADER, &token),
        (
            tower_idempotency_webhooks::gitlab::IDEMPOTENCY_HEADER,
            "ct-probe-delivery",
        ),
    ]);
    let body = Bytes::from_static(b"{}");
    let verifier = GitLabVerifier::new([GITLAB_TOKEN]);
    let now: SystemTime = UNIX_EPOCH + Duration::from_secs(TIMESTAMP);
    ct_probe_measure(&|| {
        verifier
            .verify(black_box(&parts), black_box(&body), black_box(now))
            .is_ok()
    })
}

/// The leak the script must be able to see: stops at the first differing byte.
#[inline(never)]
fn naive_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    for (x, y) in a.iter().zip(b) {
        if black_box(*x) != black_box(*y) {
            return false;
        }
    }
    true
}

fn run_naive(position: Position) -> usize {
    let (_, hex) = stripe_delivery();
    let expected = hex::decode(&hex).expect("hex");
    let received = hex::decode(corrupt(&hex, position)).expect("hex");
    ct_probe_measure(&|| naive_eq(black_box(&expected), black_box(&received)))
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let (verifier, position) = mode.split_once('-').unwrap_or_default();
    let position = match position.trim_end_matches('-') {
        "head" => Position::Head,
        "tail" => Position::Tail,
        "good" => Position::Good,
        _ => usage(&mode),
    };
    let accepted = match verifier {
        "stripe" => run_stripe(position),
        "gitlab" => run_gitlab(position),
        "naive" => run_naive(position),
        _ => usage(&mode),
    };
    // A wrong signature that was accepted would make the counts meaningless.
    let expected = if matches!(position, Position::Good) {
        N
    } else {
        0
    };
    assert_eq!(
        accepted, expected,
        "{mode}: unexpected verification results"
    );
    println!("{mode}: {accepted}/{N} accepted");
}

fn usage(mode: &str) -> ! {
    eprintln!(
        "usage: ct_probe {{stripe,gitlab}}-{{head,tail,good}} | naive-{{head,tail}}- (got {mode:?})"
    );
    std::process::exit(2)
}
