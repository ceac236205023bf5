//! Runs one verification case of the benches in a loop, for profilers whose counts are stable
//! on a noisy machine (`valgrind --tool=callgrind`, `perf record`). Two runs with different
//! counts, subtracted, give the instructions per verification without the set-up:
//!
//! ```sh
//! cargo build --release --manifest-path bench/Cargo.toml -p tower-idempotency-tools --bin verify_loop
//! valgrind --tool=callgrind target/release/verify_loop stripe 1024 1000
//! ```
//!
//! Arguments: a case name from `tower-idempotency-webhooks/benches/common` (`stripe`, `github`, ..., or a floor such as
//! `floor_hmac_sha256`), the body size in bytes, the number of verifications.

#[path = "../../../../crates/tower-idempotency-webhooks/benches/common/mod.rs"]
mod common;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: verify_loop CASE BODY_BYTES COUNT";
    let [name, size, count] = args.as_slice() else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let (Ok(size), Ok(count)) = (size.parse::<usize>(), count.parse::<usize>()) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let (cases, floors) = common::cases(size);
    let run = cases
        .iter()
        .find(|case| case.name == *name)
        .map(|case| &case.run)
        .or_else(|| floors.iter().find(|(n, _)| n == name).map(|(_, run)| run))
        .unwrap_or_else(|| {
            eprintln!("no case named {name}");
            std::process::exit(2);
        });
    let mut ok = 0usize;
    for _ in 0..count {
        ok += usize::from(std::hint::black_box(run()));
    }
    assert_eq!(ok, count, "every run of {name} must succeed");
}
