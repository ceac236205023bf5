//! Stable-toolchain fuzz runner: runs the cargo-fuzz target bodies over inputs generated
//! deterministically from a seed (ChaCha8), half fresh random bytes and half mutations of the
//! targets' valid seed inputs (bit flips, byte/range insertions, deletions, splices with
//! another input and "interesting" bytes such as `=,;\n%` and digits).
//!
//! ```text
//! fuzz-stable [--seconds N] [--seed S] [--iterations N] [TARGET...]
//! fuzz-stable --write-corpus     # seed fuzz/corpus/<target>/ for `cargo fuzz run`
//! ```
//!
//! Each target runs for `--seconds` (default 10) or `--iterations`. The seed (default: from the
//! clock) is printed first; `--seed` (or env `SEED`) reproduces a run exactly, in the same
//! order. On a panic the failing input is written to `fuzz/artifacts/<target>/crash-<seed>-<n>`
//! and its hex is printed, and the process exits non-zero.

use std::{
    panic::{self, AssertUnwindSafe},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tower_idempotency_fuzz::{stats, TARGETS};

const INTERESTING: &[u8] = b"=,;: \n\r\t%+&?/\"\\0123456789vthx_-";
const MAX_LEN: usize = 2048;

fn mutate(rng: &mut ChaCha8Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    for _ in 0..rng.gen_range(1..=8) {
        match rng.gen_range(0..7) {
            0 if !input.is_empty() => {
                let i = rng.gen_range(0..input.len());
                input[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if !input.is_empty() => {
                let i = rng.gen_range(0..input.len());
                input[i] = INTERESTING[rng.gen_range(0..INTERESTING.len())];
            }
            2 => {
                let i = rng.gen_range(0..=input.len());
                let byte = if rng.gen_bool(0.5) {
                    INTERESTING[rng.gen_range(0..INTERESTING.len())]
                } else {
                    rng.gen()
                };
                input.insert(i, byte);
            }
            3 if !input.is_empty() => {
                let start = rng.gen_range(0..input.len());
                let end = rng.gen_range(start..=input.len().min(start + 32));
                input.drain(start..end);
            }
            4 if !input.is_empty() => {
                // Duplicate a range (repeated members, long headers).
                let start = rng.gen_range(0..input.len());
                let end = rng.gen_range(start..=input.len().min(start + 64));
                let chunk = input[start..end].to_vec();
                let at = rng.gen_range(0..=input.len());
                for _ in 0..rng.gen_range(1..=4) {
                    input.splice(at..at, chunk.iter().copied());
                }
            }
            5 if !corpus.is_empty() => {
                let other = &corpus[rng.gen_range(0..corpus.len())];
                if !other.is_empty() {
                    let start = rng.gen_range(0..other.len());
                    let end = rng.gen_range(start..=other.len());
                    let at = rng.gen_range(0..=input.len());
                    input.splice(at..at, other[start..end].iter().copied());
                }
            }
            _ => {
                let i = rng.gen_range(0..=input.len());
                input.truncate(i);
            }
        }
    }
    input.truncate(MAX_LEN);
}

fn input(rng: &mut ChaCha8Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    if seeds.is_empty() || rng.gen_bool(0.3) {
        let len = rng.gen_range(0..=256);
        let mut bytes = vec![0; len];
        rng.fill_bytes(&mut bytes);
        // Mostly printable text, which header parsers actually get past.
        if rng.gen_bool(0.7) {
            for b in &mut bytes {
                *b = 0x20 + *b % 0x5f;
            }
        }
        bytes
    } else {
        let mut bytes = seeds[rng.gen_range(0..seeds.len())].clone();
        if rng.gen_bool(0.9) {
            mutate(rng, &mut bytes, seeds);
        }
        bytes
    }
}

fn main() {
    let mut seconds = 10u64;
    let mut iterations = None;
    let mut seed = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    let mut only = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--seconds N")
            }
            "--seed" => seed = Some(args.next().and_then(|s| s.parse().ok()).expect("--seed S")),
            "--iterations" => {
                iterations = Some(
                    args.next()
                        .and_then(|s| s.parse::<u64>().ok())
                        .expect("--iterations N"),
                )
            }
            "--write-corpus" => {
                // Seed inputs for libFuzzer: fuzz/corpus/<target>/seed-<n>.
                for (name, _, seeds) in TARGETS {
                    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("corpus")
                        .join(name);
                    std::fs::create_dir_all(&dir).expect("create corpus dir");
                    for (i, seed) in seeds().iter().enumerate() {
                        std::fs::write(dir.join(format!("seed-{i}")), seed).expect("write seed");
                    }
                }
                return;
            }
            "--list" => {
                for (name, _, _) in TARGETS {
                    println!("{name}");
                }
                return;
            }
            name => only.push(name.to_owned()),
        }
    }
    let seed = seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    println!("fuzz-stable: seed {seed} (reproduce with SEED={seed})");
    // Panics are expected only as findings; keep their messages, drop the default noise.
    let default_hook = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        eprintln!("{info}");
        let _ = &default_hook;
    }));
    let mut failed = false;
    for (index, (name, target, seeds)) in TARGETS.iter().enumerate() {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        let mut rng =
            ChaCha8Rng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let corpus = seeds();
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let mut runs = 0u64;
        let mut bytes_total = 0u64;
        loop {
            if let Some(limit) = iterations {
                if runs >= limit {
                    break;
                }
            } else if runs.is_multiple_of(64) && Instant::now() >= deadline {
                break;
            }
            // Seeds first, unmutated, so the deep paths are known to be reached.
            let data = match corpus.get(runs as usize) {
                Some(seed_input) => seed_input.clone(),
                None => input(&mut rng, &corpus),
            };
            bytes_total += data.len() as u64;
            runs += 1;
            if panic::catch_unwind(AssertUnwindSafe(|| target(&data))).is_err() {
                let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("artifacts")
                    .join(name);
                let _ = std::fs::create_dir_all(&dir);
                let path = dir.join(format!("crash-{seed}-{runs}"));
                let _ = std::fs::write(&path, &data);
                eprintln!(
                    "fuzz-stable: {name} FAILED on run {runs}; input saved to {} (hex {})",
                    path.display(),
                    hex(&data)
                );
                failed = true;
                break;
            }
        }
        let [accepted, refused, success, replayed, problems] = stats::take();
        let detail = if success + problems > 0 {
            format!("answers: {success} 2xx ({replayed} replayed), {problems} problems")
        } else if accepted + refused > 0 {
            format!("verifications: {accepted} accepted, {refused} refused")
        } else {
            String::new()
        };
        println!(
            "fuzz-stable: {name:<20} {runs:>9} runs, {:>6} KiB, ok={} {detail}",
            bytes_total / 1024,
            !failed
        );
        if failed {
            break;
        }
    }
    if failed {
        std::process::exit(1);
    }
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}
