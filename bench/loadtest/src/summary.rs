//! The summary over rounds: per body, target, workload and concurrency, the median of each round's
//! ratio to the bare handler with its range, and the ratio to the cell's reference measured in
//! the same round (the peer for the memory and Redis stores, the SQL floor for the SQL stores).

use std::fmt::Write as _;

use crate::{load::Workload, Cell, Results};

/// The target (and its workload) a store's cell is compared with, in the same round.
pub(crate) fn reference(target: &str, workload: Workload) -> Option<(&'static str, Workload)> {
    match (target, workload) {
        ("memory" | "memory-constfp", w) => Some(("idempotent-memory", w)),
        ("redis" | "redis+cache", w) => Some(("idempotent-valkey", w)),
        ("sqlite" | "sqlite+cache", Workload::New) => Some(("sqlite-floor-write", Workload::New)),
        ("postgres" | "postgres+cache", Workload::New) => {
            Some(("postgres-floor-write", Workload::New))
        }
        ("postgres" | "postgres+cache", Workload::Replay) => {
            Some(("postgres-floor-read", Workload::Replay))
        }
        ("mysql", Workload::New) => Some(("mysql-floor-write", Workload::New)),
        ("mysql", Workload::Replay) => Some(("mysql-floor-read", Workload::Replay)),
        _ => None,
    }
}

/// The median of `values` (not empty).
pub(crate) fn median(values: &mut [f64]) -> f64 {
    spread(values).0
}

/// Median, minimum and maximum of `values` (not empty).
fn spread(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    (median, values[0], values[n - 1])
}

/// `0.91 (0.88–0.93)`, or the single value for one round.
fn show((median, min, max): (f64, f64, f64)) -> String {
    if (max - min).abs() < 0.005 {
        format!("{median:.2}")
    } else {
        format!("{median:.2} ({min:.2}–{max:.2})")
    }
}

/// The cells of one (body, target, workload, concurrency), one per round.
struct Row<'a> {
    first: &'a Cell,
    rounds: Vec<&'a Cell>,
}

fn rows(results: &Results) -> Vec<Row<'_>> {
    let mut rows: Vec<Row<'_>> = Vec::new();
    for cell in results.cells.iter().filter(|c| c.target != "bare") {
        let same = |row: &&mut Row<'_>| {
            let f = row.first;
            f.body_bytes == cell.body_bytes
                && f.target == cell.target
                && f.workload == cell.workload
                && f.concurrency == cell.concurrency
        };
        match rows.iter_mut().find(same) {
            Some(row) => row.rounds.push(cell),
            None => rows.push(Row {
                first: cell,
                rounds: vec![cell],
            }),
        }
    }
    rows
}

/// The summary table, one line per (body, target, workload, concurrency).
pub(crate) fn table(md: &mut String, results: &Results) {
    let rounds = results.cells.iter().map(|c| c.round).max().unwrap_or(0);
    let _ = writeln!(
        md,
        "#### Summary over {rounds} round(s): median (min–max) of the per-round ratios\n"
    );
    md.push_str("| body | target | workload | c | req/s | ratio to bare | p99 µs | server CPU µs/req | reference | ratio to reference | CPU/req to reference |\n");
    md.push_str("|---|---|---|---:|---:|---|---:|---:|---|---|---|\n");
    for row in rows(results) {
        let f = row.first;
        let mut rps: Vec<f64> = row.rounds.iter().map(|c| c.result.rps).collect();
        let mut p99: Vec<f64> = row.rounds.iter().map(|c| c.result.p99_us).collect();
        let mut to_bare: Vec<f64> = row.rounds.iter().filter_map(|c| c.ratio_vs_bare).collect();
        let mut cpu: Vec<f64> = row.rounds.iter().filter_map(|c| c.server_cpu_us).collect();
        let reference = reference(&f.target, f.workload);
        // Per round: (throughput, CPU per request) of the cell over its reference's.
        let paired: Vec<(f64, Option<f64>)> = reference
            .map(|(target, workload)| {
                row.rounds
                    .iter()
                    .filter_map(|c| {
                        let r = results.cells.iter().find(|r| {
                            r.target == target
                                && r.workload == workload
                                && r.round == c.round
                                && r.body_bytes == c.body_bytes
                                && r.concurrency == c.concurrency
                        })?;
                        let cpu = c
                            .server_cpu_us
                            .zip(r.server_cpu_us)
                            .filter(|(_, theirs)| *theirs > 0.0)
                            .map(|(ours, theirs)| ours / theirs);
                        (r.result.rps > 0.0).then(|| (c.result.rps / r.result.rps, cpu))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut to_reference: Vec<f64> = paired.iter().map(|p| p.0).collect();
        let mut cpu_to_reference: Vec<f64> = paired.iter().filter_map(|p| p.1).collect();
        let cell = |values: &mut Vec<f64>| {
            if values.is_empty() {
                "-".to_owned()
            } else {
                show(spread(values))
            }
        };
        let _ = writeln!(
            md,
            "| {} KiB | {} | {} | {} | {:.0} | {} | {:.0} | {} | {} | {} | {} |",
            f.body_bytes / 1024,
            f.target,
            f.workload.name(),
            f.concurrency,
            spread(&mut rps).0,
            cell(&mut to_bare),
            spread(&mut p99).0,
            if cpu.is_empty() {
                "-".to_owned()
            } else {
                format!("{:.1}", median(&mut cpu))
            },
            reference.map_or("-".into(), |(t, w)| format!("{t} {}", w.name())),
            cell(&mut to_reference),
            cell(&mut cpu_to_reference),
        );
    }
    let mut bare: Vec<String> = Vec::new();
    for round in 1..=rounds {
        let runs: Vec<String> = results
            .cells
            .iter()
            .filter(|c| c.target == "bare" && c.round == round && c.body_bytes == 1024)
            .map(|c| format!("{:.0}", c.result.rps))
            .collect();
        bare.push(format!("round {round}: {}", runs.join(", ")));
    }
    let _ = writeln!(md, "\nBare handler, 1 KiB, req/s: {}.\n", bare.join("; "));
}

/// The sustained fresh-key runs.
pub(crate) fn sustained_table(md: &mut String, results: &Results) {
    if results.sustained.is_empty() {
        return;
    }
    crate::report::table(
        md,
        "#### Fresh keys for a long window, default capacity (1 KiB)\n\n\
         | target | c | window ms | requests | req/s | p99 µs | refused (503) |\n|---|---:|---:|---:|---:|---:|---:|\n",
        &results.sustained,
        |s| {
            format!(
                "| {} | {} | {} | {} | {:.0} | {:.0} | {} |",
                s.target,
                s.concurrency,
                s.duration_ms,
                s.total_requests,
                s.result.rps,
                s.result.p99_us,
                s.refused
            )
        },
    );
    md.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_median_min_and_max() {
        assert_eq!(spread(&mut [0.9, 0.7, 0.8]), (0.8, 0.7, 0.9));
        assert_eq!(spread(&mut [1.0, 0.5]), (0.75, 0.5, 1.0));
        assert_eq!(show((0.8, 0.7, 0.9)), "0.80 (0.70–0.90)");
        assert_eq!(show((0.8, 0.8, 0.8)), "0.80");
    }

    #[test]
    fn stores_are_compared_with_their_peer_or_floor() {
        // Each store is compared on the workload it ran.
        for (store, workload, compared_with) in [
            ("memory", Workload::Replay, Some("idempotent-memory")),
            ("redis", Workload::New, Some("idempotent-valkey")),
            ("postgres", Workload::Replay, Some("postgres-floor-read")),
            ("sqlite", Workload::New, Some("sqlite-floor-write")),
            ("sqlite", Workload::Replay, None),
            ("idempotent-memory", Workload::New, None),
        ] {
            let expected = compared_with.map(|reference| (reference, workload));
            assert_eq!(reference(store, workload), expected, "{store}");
        }
    }
}
