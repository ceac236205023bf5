//! Verification cost of every shipped provider for 1 KiB and 64 KiB bodies, next to the floor:
//! the raw primitive over the same bytes (HMAC-SHA256; HMAC-SHA1 for Twilio; Ed25519 verify for
//! Discord; ECDSA P-256 verify for SendGrid). `scripts/bench-ratios.py` prints the ratios from
//! the saved samples; `benches/ratios.rs` measures them paired (robust on a busy machine).

mod common;
#[path = "common/settings.rs"]
mod settings;

use criterion::{BenchmarkId, Criterion, Throughput};

fn bench(c: &mut Criterion) {
    for size in [1024usize, 64 * 1024] {
        let (cases, floors) = common::cases(size);
        let mut group = c.benchmark_group(format!("verify_{}KiB", size / 1024));
        group.throughput(Throughput::Bytes(size as u64));
        for (name, run) in floors.iter() {
            group.bench_function(BenchmarkId::new(*name, size), |b| b.iter(run));
        }
        for case in &cases {
            group.bench_function(BenchmarkId::new(&case.name, size), |b| b.iter(&case.run));
        }
        group.finish();
    }
}

settings::bench_main!(bench, 20);
