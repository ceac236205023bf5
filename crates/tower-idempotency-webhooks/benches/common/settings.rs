//! The criterion settings and `main` of the criterion benches (`verify.rs`, `forged.rs`), apart
//! from `common/mod.rs`, which the bench workspace's `verify_loop` also includes without
//! criterion.

use std::time::Duration;

/// A short warm-up and two seconds of measurement, `sample_size` samples.
pub fn criterion(sample_size: usize) -> criterion::Criterion {
    criterion::Criterion::default()
        .sample_size(sample_size)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
}

/// The bench's `main`: criterion runs `$bench` with `$sample_size` samples ([`criterion`]).
macro_rules! bench_main {
    ($bench:path, $sample_size:expr) => {
        criterion::criterion_group! {
            name = benches;
            config = $crate::settings::criterion($sample_size);
            targets = $bench
        }
        criterion::criterion_main!(benches);
    };
}
pub(crate) use bench_main;
