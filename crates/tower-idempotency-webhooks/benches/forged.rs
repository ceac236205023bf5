//! What an unauthenticated request can make a verifier do before it is refused, at the layer's
//! default body cap (1 MiB), next to the floor: one HMAC-SHA256 over the same bytes. Every
//! case is a forgery (no key matches), so it runs to the first refusal:
//!
//! - `stripe_max_signatures`: [`MAX_SIGNATURES`] `v1` candidates, one secret (one MAC for all).
//! - `standard_v1a_max_signatures`: [`MAX_ASYMMETRIC_SIGNATURES`] Ed25519 `v1a` candidates
//!   against two public keys (each pair hashes the body).
//! - `standard_v1a_over_cap`: one candidate more, refused before any check.
//! - `twilio_max_params`: a form of [`twilio::MAX_FORM_PARAMS`] parameters (decoded, sorted,
//!   MAC'd twice: the port-less and the explicit-port URL).
//! - `twilio_over_cap`: a 1 MiB form of ~300k parameters, refused by its count.

mod common;
#[path = "common/settings.rs"]
mod settings;

use std::time::{Duration, UNIX_EPOCH};

use base64::Engine as _;
use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput};
use ed25519_dalek::SigningKey;
use hmac::{Hmac, Mac};
use http::request::Parts;
use sha2::Sha256;
use tower_idempotency_webhooks::{
    standard, stripe, twilio, Verifier, MAX_ASYMMETRIC_SIGNATURES, MAX_SIGNATURES,
};

use common::{parts, SECRET, TS};

const SIZE: usize = 1024 * 1024;

type Case = (&'static str, Box<dyn Verifier>, Parts, Bytes);

fn cases() -> Vec<Case> {
    let json = Bytes::from(format!(
        r#"{{"id":"evt_1","pad":"{}"}}"#,
        "x".repeat(SIZE - 30)
    ));
    let mut cases = vec![stripe_case(json.clone())];
    cases.extend(standard_cases(json));
    cases.extend(twilio_cases());
    cases
}

/// `MAX_SIGNATURES` forged `v1` candidates.
fn stripe_case(json: Bytes) -> Case {
    let forged_hex = "0".repeat(64);
    let stripe_header = std::iter::once(format!("t={TS}"))
        .chain((0..MAX_SIGNATURES).map(|_| format!("v1={forged_hex}")))
        .collect::<Vec<_>>()
        .join(",");
    (
        "stripe_max_signatures",
        Box::new(stripe::StripeVerifier::new([SECRET])),
        parts("/", &[("stripe-signature", stripe_header)]),
        json,
    )
}

/// Forged Ed25519 `v1a` candidates against two public keys: as many as allowed, and one more.
fn standard_cases(json: Bytes) -> [Case; 2] {
    let b64 = base64::engine::general_purpose::STANDARD;
    let keys: Vec<String> = [[7u8; 32], [8u8; 32]]
        .iter()
        .map(|seed| {
            let key = SigningKey::from_bytes(seed).verifying_key();
            format!("whpk_{}", b64.encode(key.as_bytes()))
        })
        .collect();
    // A valid point encoding with a scalar below the group order, so the check runs in full.
    let mut forged_sig = [0u8; 64];
    forged_sig[..32].copy_from_slice(
        SigningKey::from_bytes(&[9u8; 32])
            .verifying_key()
            .as_bytes(),
    );
    let v1a = |count: usize| vec![format!("v1a,{}", b64.encode(forged_sig)); count].join(" ");
    let standard_parts = |count: usize| {
        parts(
            "/",
            &[
                ("webhook-id", "msg_1".into()),
                ("webhook-timestamp", TS.to_string()),
                ("webhook-signature", v1a(count)),
            ],
        )
    };
    let standard = || standard::StandardWebhooksVerifier::from_public_keys(&keys).unwrap();
    [
        (
            "standard_v1a_max_signatures",
            Box::new(standard()),
            standard_parts(MAX_ASYMMETRIC_SIGNATURES),
            json.clone(),
        ),
        (
            "standard_v1a_over_cap",
            Box::new(standard()),
            standard_parts(MAX_ASYMMETRIC_SIGNATURES + 1),
            json,
        ),
    ]
}

/// Forged forms: as many parameters as allowed, and a 1 MiB form of far more.
fn twilio_cases() -> [Case; 2] {
    let b64 = base64::engine::general_purpose::STANDARD;
    let form = |params: usize| {
        let pair_len = (SIZE / params).max(4);
        let value = "a".repeat(pair_len - 3);
        Bytes::from(vec![format!("p={value}"); params].join("&"))
    };
    let twilio_parts = parts(
        "/twilio",
        &[
            ("x-twilio-signature", b64.encode([0u8; 20])),
            ("content-type", "application/x-www-form-urlencoded".into()),
        ],
    );
    let twilio = || twilio::TwilioVerifier::new("https://example.com", [SECRET]).unwrap();
    [
        (
            "twilio_max_params",
            Box::new(twilio()),
            twilio_parts.clone(),
            form(twilio::MAX_FORM_PARAMS),
        ),
        (
            "twilio_over_cap",
            Box::new(twilio()),
            twilio_parts,
            form(SIZE / 4),
        ),
    ]
}

fn bench(c: &mut Criterion) {
    let now = UNIX_EPOCH + Duration::from_secs(TS);
    let mut group = c.benchmark_group("forged_1MiB");
    group.throughput(Throughput::Bytes(SIZE as u64));
    let floor_body = vec![b'x'; SIZE];
    group.bench_function(BenchmarkId::new("floor_hmac_sha256", SIZE), |b| {
        b.iter(|| {
            let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(SECRET.as_bytes()).unwrap();
            mac.update(&floor_body);
            mac.finalize().into_bytes().len()
        })
    });
    for (name, verifier, parts, body) in cases() {
        // Every case is refused; a case that verified would measure something else.
        assert!(verifier.verify(&parts, &body, now).is_err(), "{name}");
        group.bench_function(BenchmarkId::new(name, SIZE), |b| {
            b.iter(|| verifier.verify(&parts, &body, now).is_err())
        });
    }
    group.finish();
}

settings::bench_main!(bench, 10);
