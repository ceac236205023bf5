//! Verification cost per provider for 1 KiB and 64 KiB bodies, next to the raw HMAC-SHA256 of
//! the same bytes (the floor every HMAC scheme pays).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hmac::{Hmac, Mac};
use http::request::Parts;
use tower_idempotency_webhooks::{github, slack, standard, stripe, Verifier};

const TS: u64 = 1_700_000_000;

fn parts(headers: &[(&str, String)]) -> Parts {
    let mut builder = http::Request::post("/hook");
    for (name, value) in headers {
        builder = builder.header(*name, value.as_str());
    }
    builder.body(()).unwrap().into_parts().0
}

fn body(len: usize) -> Bytes {
    let filler = "x".repeat(len.saturating_sub(40));
    Bytes::from(format!(
        r#"{{"id":"evt_1","event_id":"evt_1","f":"{filler}"}}"#
    ))
}

fn bench(c: &mut Criterion) {
    let now = UNIX_EPOCH + Duration::from_secs(TS);
    let secret = "whsec_bench_secret_0123456789";
    let sw_key = standard::decode_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
    for size in [1024usize, 64 * 1024] {
        let body = body(size);
        let mut group = c.benchmark_group(format!("verify_{}KiB", size / 1024));
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(BenchmarkId::new("raw_hmac_sha256", size), |b| {
            b.iter(|| {
                let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
                mac.update(&body);
                mac.finalize().into_bytes()
            })
        });
        let cases: Vec<(&str, Box<dyn Verifier>, Parts)> = vec![
            (
                "stripe",
                Box::new(stripe::StripeVerifier::new([secret])),
                parts(&[("stripe-signature", stripe::sign(secret, TS, &body))]),
            ),
            (
                "github",
                Box::new(github::GitHubVerifier::new([secret])),
                parts(&[
                    ("x-hub-signature-256", github::sign(secret, &body)),
                    ("x-github-delivery", "d".into()),
                ]),
            ),
            (
                "slack",
                Box::new(slack::SlackVerifier::new([secret])),
                parts(&[
                    ("x-slack-signature", slack::sign(secret, TS, &body)),
                    ("x-slack-request-timestamp", TS.to_string()),
                ]),
            ),
            (
                "standard_webhooks",
                Box::new(
                    standard::StandardWebhooksVerifier::new([
                        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                    ])
                    .unwrap(),
                ),
                parts(&[
                    (
                        "webhook-signature",
                        standard::sign(&sw_key, "msg_1", TS, &body),
                    ),
                    ("webhook-id", "msg_1".into()),
                    ("webhook-timestamp", TS.to_string()),
                ]),
            ),
            (
                "stripe_wrong_secret",
                Box::new(stripe::StripeVerifier::new(["whsec_other"])),
                parts(&[("stripe-signature", stripe::sign(secret, TS, &body))]),
            ),
        ];
        for (name, verifier, parts) in &cases {
            group.bench_function(BenchmarkId::new(*name, size), |b| {
                b.iter(|| {
                    let _ = verifier.verify(parts, &body, now);
                })
            });
        }
        group.finish();
    }
    let _ = SystemTime::now();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(800));
    targets = bench
}
criterion_main!(benches);
