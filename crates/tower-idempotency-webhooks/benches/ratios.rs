//! Provider/floor ratios measured *paired*: each round times a batch of the floor and a batch
//! of the provider back to back, so load from other processes hits both alike; the ratio is
//! the fastest provider batch over the fastest floor batch (and the median of per-round
//! ratios). `cargo bench --bench ratios` prints a Markdown table.
//!
//! Batches are short (200 µs) and rounds many (400), so that a slow stretch of the machine hits
//! few rounds and the fastest batches of both sides come from quiet moments. The minimum is the
//! stable figure; the median moves with the machine's state between runs.

mod common;

use std::{
    hint::black_box,
    time::{Duration, Instant},
};

const ROUNDS: usize = 400;
const BATCH: Duration = Duration::from_micros(200);

fn per_iter(run: &dyn Fn() -> bool, iters: u32) -> f64 {
    let start = Instant::now();
    for _ in 0..iters {
        black_box(run());
    }
    start.elapsed().as_secs_f64() / f64::from(iters)
}

fn iters_for(run: &dyn Fn() -> bool) -> u32 {
    let once = per_iter(run, 3).max(1e-9);
    ((BATCH.as_secs_f64() / once) as u32).clamp(1, 1_000_000)
}

fn fmt(secs: f64) -> String {
    if secs >= 1e-6 {
        format!("{:.2} µs", secs * 1e6)
    } else {
        format!("{:.0} ns", secs * 1e9)
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    println!("| case | floor | size | case time | floor time | ratio (min) | ratio (median) |");
    println!("|---|---|---|---|---|---|---|");
    for size in [1024usize, 64 * 1024] {
        let (cases, floors) = common::cases(size);
        for case in &cases {
            let floor = &floors.iter().find(|(n, _)| *n == case.floor).unwrap().1;
            let (fi, ci) = (iters_for(floor.as_ref()), iters_for(case.run.as_ref()));
            let (mut best_f, mut best_c, mut ratios) = (f64::MAX, f64::MAX, Vec::new());
            for _ in 0..ROUNDS {
                let f = per_iter(floor.as_ref(), fi);
                let c = per_iter(case.run.as_ref(), ci);
                best_f = best_f.min(f);
                best_c = best_c.min(c);
                ratios.push(c / f);
            }
            ratios.sort_by(f64::total_cmp);
            println!(
                "| {} | {} | {} KiB | {} | {} | {:.2}x | {:.2}x |",
                case.name,
                case.floor.trim_start_matches("floor_"),
                size / 1024,
                fmt(best_c),
                fmt(best_f),
                best_c / best_f,
                ratios[ratios.len() / 2]
            );
        }
    }
}
