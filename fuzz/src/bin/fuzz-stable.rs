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

/// What the command line asks for.
struct Options {
    seconds: u64,
    iterations: Option<u64>,
    seed: Option<u64>,
    /// The targets to run; all when empty.
    only: Vec<String>,
}

/// Parses the command line; `None` when it asked for `--write-corpus` or `--list`, which are
/// done by then.
fn options() -> Option<Options> {
    let mut options = Options {
        seconds: 10,
        iterations: None,
        seed: std::env::var("SEED")
            .ok()
            .and_then(|s| s.parse::<u64>().ok()),
        only: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                options.seconds = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--seconds N")
            }
            "--seed" => {
                options.seed = Some(args.next().and_then(|s| s.parse().ok()).expect("--seed S"))
            }
            "--iterations" => {
                options.iterations = Some(
                    args.next()
                        .and_then(|s| s.parse::<u64>().ok())
                        .expect("--iterations N"),
                )
            }
            "--write-corpus" => {
                write_corpus();
                return None;
            }
            "--list" => {
                for (name, _, _) in TARGETS {
                    println!("{name}");
                }
                return None;
            }
            name => options.only.push(name.to_owned()),
        }
    }
    Some(options)
}

/// Seed inputs for libFuzzer: fuzz/corpus/<target>/seed-<n>.
fn write_corpus() {
    for (name, _, seeds) in TARGETS {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(name);
        std::fs::create_dir_all(&dir).expect("create corpus dir");
        for (i, seed) in seeds().iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), seed).expect("write seed");
        }
    }
}

fn main() {
    let Some(options) = options() else {
        return;
    };
    let seed = options.seed.unwrap_or_else(|| {
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
    for (index, (name, target, seeds)) in TARGETS.iter().enumerate() {
        if !options.only.is_empty() && !options.only.iter().any(|o| o == name) {
            continue;
        }
        let rng =
            ChaCha8Rng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let run = Run {
            name,
            seed,
            rng,
            corpus: seeds(),
            runs: 0,
            bytes_total: 0,
        };
        if !run.until(&options, *target) {
            std::process::exit(1);
        }
    }
}

/// One target's run: its generator, its seed inputs and what it has done so far.
struct Run<'a> {
    name: &'a str,
    seed: u64,
    rng: ChaCha8Rng,
    corpus: Vec<Vec<u8>>,
    runs: u64,
    bytes_total: u64,
}

impl Run<'_> {
    /// Runs `target` for the options' time or iterations, or until it fails, then prints the
    /// run's line; whether it passed.
    fn until(mut self, options: &Options, target: fn(&[u8])) -> bool {
        let deadline = Instant::now() + Duration::from_secs(options.seconds);
        let mut passed = true;
        loop {
            if let Some(limit) = options.iterations {
                if self.runs >= limit {
                    break;
                }
            } else if self.runs.is_multiple_of(64) && Instant::now() >= deadline {
                break;
            }
            let data = self.next_input();
            if panic::catch_unwind(AssertUnwindSafe(|| target(&data))).is_err() {
                self.save_crash(&data);
                passed = false;
                break;
            }
        }
        self.report(passed);
        passed
    }

    /// The seeds first, unmutated, so the deep paths are known to be reached; then generated
    /// inputs.
    fn next_input(&mut self) -> Vec<u8> {
        let data = match self.corpus.get(self.runs as usize) {
            Some(seed_input) => seed_input.clone(),
            None => input(&mut self.rng, &self.corpus),
        };
        self.bytes_total += data.len() as u64;
        self.runs += 1;
        data
    }

    /// Writes the failing input to fuzz/artifacts/<target>/ and prints its hex.
    fn save_crash(&self, data: &[u8]) {
        let (name, seed, runs) = (self.name, self.seed, self.runs);
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("artifacts")
            .join(name);
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!("crash-{seed}-{runs}"));
        let _ = std::fs::write(&path, data);
        eprintln!(
            "fuzz-stable: {name} FAILED on run {runs}; input saved to {} (hex {})",
            path.display(),
            hex(data)
        );
    }

    /// The run's line: runs, bytes and how deep the outcomes went.
    fn report(&self, passed: bool) {
        let [accepted, refused, success, replayed, problems] = stats::take();
        let detail = if success + problems > 0 {
            format!("answers: {success} 2xx ({replayed} replayed), {problems} problems")
        } else if accepted + refused > 0 {
            format!("verifications: {accepted} accepted, {refused} refused")
        } else {
            String::new()
        };
        println!(
            "fuzz-stable: {:<20} {:>9} runs, {:>6} KiB, ok={passed} {detail}",
            self.name,
            self.runs,
            self.bytes_total / 1024,
        );
    }
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}
