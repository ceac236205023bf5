//! Output: JSON (everything), CSV (throughput cells), Markdown tables and an SVG bar chart of the
//! layer/bare throughput ratio, drawn by hand so the harness needs no plotting dependency.

use std::fmt::Write as _;

use crate::{load::Workload, Args, Cell, HarnessError, Results};

/// Writes every output file and prints the Markdown to stdout.
pub fn write_all(args: &Args, results: &Results) -> Result<(), HarnessError> {
    std::fs::create_dir_all(&args.out)?;
    let json = serde_json::to_string_pretty(results)?;
    let stamp = results.started_unix;
    std::fs::write(args.out.join(format!("loadtest-{stamp}.json")), &json)?;
    std::fs::write(args.out.join("loadtest-latest.json"), &json)?;
    std::fs::write(args.out.join("loadtest-latest.csv"), csv(results))?;
    let markdown = markdown(results);
    std::fs::write(args.out.join("loadtest-latest.md"), &markdown)?;
    let chart = args
        .chart
        .clone()
        .unwrap_or_else(|| args.out.join("throughput.svg"));
    if let Some(dir) = chart.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&chart, svg(results))?;
    println!("{markdown}");
    eprintln!(
        "loadtest: wrote {} and {}",
        args.out.join("loadtest-latest.{json,csv,md}").display(),
        chart.display()
    );
    Ok(())
}

fn csv(results: &Results) -> String {
    let mut out = String::from(
        "target,workload,concurrency,body_bytes,requests,rps,p50_us,p99_us,p999_us,ratio_vs_bare,statements_per_request,executed,replayed,conflicts,other_status,errors\n",
    );
    for c in &results.cells {
        let r = &c.result;
        let _ = writeln!(
            out,
            "{},{},{},{},{},{:.1},{:.1},{:.1},{:.1},{},{},{},{},{},{},{}",
            c.target,
            c.workload.name(),
            c.concurrency,
            c.body_bytes,
            r.requests,
            r.rps,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            c.ratio_vs_bare.map_or(String::new(), |v| format!("{v:.3}")),
            c.statements_per_request
                .map_or(String::new(), |v| format!("{v:.2}")),
            r.executed,
            r.replayed,
            r.conflicts,
            r.other_status,
            r.errors
        );
    }
    out
}

fn kib(bytes: usize) -> String {
    format!("{} KiB", bytes / 1024)
}

fn markdown(results: &Results) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Run at unix {} on {} CPUs, runtime `{}`, {} round(s) of {} ms per cell after {} ms warm-up; load average {} at start, {} at end.\n",
        results.started_unix,
        results.cpus,
        results.runtime,
        results.rounds,
        results.duration_ms,
        results.warmup_ms,
        results.loadavg_start,
        results.loadavg_end
    );
    for skipped in &results.skipped {
        let _ = writeln!(md, "Skipped: {skipped}\n");
    }
    crate::summary::table(&mut md, results);
    crate::summary::sustained_table(&mut md, results);
    throughput_table(&mut md, results);
    round_trips_table(&mut md, results);
    floors_table(&mut md, results);
    scaling_table(&mut md, results);
    memory_tables(&mut md, results);
    md
}

/// The throughput cells, ordered by body, target, workload and concurrency.
fn throughput_table(md: &mut String, results: &Results) {
    md.push_str("#### Throughput and latency\n\n");
    md.push_str("| round | body | target | workload | conc. | req/s | p50 µs | p99 µs | layer/bare | SQL stmts/req | handler ran / replayed / 409 |\n");
    md.push_str("|---:|---|---|---|---:|---:|---:|---:|---:|---:|---|\n");
    let mut cells: Vec<&Cell> = results.cells.iter().collect();
    let order = |t: &str| {
        crate::setup::TARGETS
            .iter()
            .position(|x| *x == t)
            .unwrap_or(99)
    };
    cells.sort_by_key(|c| {
        (
            c.round,
            c.body_bytes,
            order(&c.target),
            c.workload as u8,
            c.concurrency,
        )
    });
    for c in cells {
        let r = &c.result;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {} / {} / {} |",
            c.round,
            kib(c.body_bytes),
            c.target,
            if c.target == "bare" {
                "-"
            } else {
                c.workload.name()
            },
            c.concurrency,
            r.rps,
            r.p50_us,
            r.p99_us,
            c.ratio_vs_bare
                .map_or("-".into(), |v| format!("{:.0}%", v * 100.0)),
            c.statements_per_request
                .map_or("-".into(), |v| format!("{v:.2}")),
            r.executed,
            r.replayed,
            r.conflicts
        );
    }
}

/// Appends `head` (a heading and a table's header rows) and a row per item; nothing at all
/// when there are no items.
pub(crate) fn table<T>(
    md: &mut String,
    head: &str,
    items: impl IntoIterator<Item = T>,
    row: impl Fn(T) -> String,
) {
    let mut items = items.into_iter().peekable();
    if items.peek().is_none() {
        return;
    }
    md.push_str(head);
    for item in items {
        md.push_str(&row(item));
        md.push('\n');
    }
}

/// Store round trips per request.
fn round_trips_table(md: &mut String, results: &Results) {
    table(
        md,
        "\n#### Store round trips per request (1 KiB, 16 workers)\n\n\
         | store | workload | requests | counted | per request | handler ran / replayed / 409 | Redis server µs / request | Redis commands / request |\n|---|---|---:|---|---:|---|---:|---|\n",
        &results.round_trips,
        |r| {
            format!(
                "| {} | {} | {} | {} | {:.3} | {} / {} / {} | {} | {} |",
                r.store,
                r.workload.name(),
                r.requests,
                r.unit,
                r.per_request,
                r.executed,
                r.replayed,
                r.conflicts,
                r.redis_server
                    .as_ref()
                    .map_or("-".into(), |c| format!("{:.1}", c.usec_per_request)),
                r.redis_server.as_ref().map_or("-", |c| c.calls.as_str()),
            )
        },
    );
}

/// Each raw floor against the replay p99 of its store, with and without the local cache.
fn floors_table(md: &mut String, results: &Results) {
    if !results.floors.is_empty() {
        md.push_str("\n#### Replay p99 against a raw store round trip\n\n");
        md.push_str("| store | conc. | raw operation | raw p50 µs | raw p99 µs | bare HTTP p99 µs | replay p99 µs | replay p99 / raw p99 | (replay − bare) p99 / raw p99 |\n|---|---:|---|---:|---:|---:|---:|---:|---:|\n");
        // Each raw floor is compared with the plain store and with the same store behind a
        // LocalReplayCache, when both were measured.
        let rows = results.floors.iter().flat_map(|f| {
            [f.store.clone(), format!("{}+cache", f.store)].map(move |target| (f, target))
        });
        for (f, target) in rows {
            let find = |target: &str, workload: Workload| {
                results.cells.iter().find(|c| {
                    c.target == target
                        && c.workload == workload
                        && c.concurrency == f.concurrency
                        && c.body_bytes == 1024
                })
            };
            let Some(replay) = find(&target, Workload::Replay).map(|c| c.result.p99_us) else {
                continue;
            };
            let bare = find("bare", Workload::New).map(|c| c.result.p99_us);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.0} | {:.0} | {} | {:.0} | {:.2}x | {} |",
                target,
                f.concurrency,
                f.operation,
                f.p50_us,
                f.p99_us,
                bare.map_or("-".into(), |v| format!("{v:.0}")),
                replay,
                replay / f.p99_us,
                bare.map_or("-".into(), |b| format!("{:.2}x", (replay - b) / f.p99_us)),
            );
        }
    }
}

/// The multi-instance runs.
fn scaling_table(md: &mut String, results: &Results) {
    table(
        md,
        "\n#### Several receiver instances sharing one backend (1 KiB)\n\n\
         | store | instances | workload | conc. | req/s | p50 µs | p99 µs | handler runs | keys run twice |\n|---|---:|---|---:|---:|---:|---:|---:|---:|\n",
        &results.scaling,
        |s| {
            format!(
                "| {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {} |",
                s.store,
                s.instances,
                s.workload.name(),
                s.concurrency,
                s.result.rps,
                s.result.p50_us,
                s.result.p99_us,
                s.handler_runs,
                s.keys_run_twice
            )
        },
    );
}

/// Peak RSS, memory per in-flight request and allocations per request.
fn memory_tables(md: &mut String, results: &Results) {
    let of_kind = |kind: &'static str| results.memory.iter().filter(move |m| m.kind == kind);
    table(
        md,
        "\n#### Peak RSS, new-key workload (16 workers, fixed request count; every response stays cached)\n\n\
         | target | body | requests | RSS before KiB | peak RSS (VmHWM) KiB | (peak − before) / request | live heap growth / request |\n|---|---|---:|---:|---:|---:|---:|\n",
        of_kind("rss"),
        |m| {
            let n = m.requests.max(1) as f64;
            format!(
                "| {} | {} | {} | {} | {} | {:.0} B | {:.0} B |",
                m.target,
                kib(m.body_bytes),
                m.requests,
                m.rss_before_kib,
                m.hwm_kib,
                (m.hwm_kib as f64 - m.rss_before_kib as f64) * 1024.0 / n,
                (m.live_after - m.live_before) as f64 / n
            )
        },
    );
    table(
        md,
        "\n#### Memory per in-flight request (requests parked in the handler, 1 KiB; client and server in one process)\n\n\
         | target | in flight | RSS growth / request (client + server) | live heap growth / request (client + server) | server live heap / request |\n|---|---:|---:|---:|---:|\n",
        of_kind("inflight"),
        |m| {
            let n = m.requests.max(1) as f64;
            format!(
                "| {} | {} | {:.0} B | {:.0} B | {:.0} B |",
                m.target,
                m.requests,
                (m.rss_after_kib as f64 - m.rss_before_kib as f64) * 1024.0 / n,
                (m.live_after - m.live_before) as f64 / n,
                (m.server_live_after - m.server_live_before) as f64 / n
            )
        },
    );
    table(
        md,
        "\n#### Bytes allocated on the server thread per request (memory store, one request at a time)\n\n\
         | workload | body | bytes / request | allocations / request |\n|---|---|---:|---:|\n",
        of_kind("alloc"),
        |m| {
            format!(
                "| {} | {} | {:.0} | {:.1} |",
                if m.target == "bare" {
                    "bare handler"
                } else {
                    m.target.as_str()
                },
                kib(m.body_bytes),
                m.server_bytes_per_request.unwrap_or(0.0),
                m.server_allocs_per_request.unwrap_or(0.0)
            )
        },
    );
}

/// Bar colours, one per concurrency level.
const COLORS: [&str; 5] = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2"];
/// Bar width in the chart, px.
const BAR_W: f64 = 14.0;

/// The chart's bar groups: per body, target and workload, the (concurrency, ratio) bars.
type BarGroup = (String, Vec<(usize, f64)>);

fn chart_groups(results: &Results) -> Vec<BarGroup> {
    let mut groups: Vec<BarGroup> = Vec::new();
    for body in [1024usize, 64 * 1024] {
        for target in crate::setup::TARGETS.into_iter().filter(|t| *t != "bare") {
            for workload in Workload::ALL {
                // One bar per concurrency: the median over the rounds.
                let mut bars: Vec<(usize, Vec<f64>)> = Vec::new();
                for c in results.cells.iter().filter(|c| {
                    c.target == target && c.workload == workload && c.body_bytes == body
                }) {
                    let Some(ratio) = c.ratio_vs_bare else {
                        continue;
                    };
                    match bars.iter_mut().find(|(level, _)| *level == c.concurrency) {
                        Some((_, ratios)) => ratios.push(ratio),
                        None => bars.push((c.concurrency, vec![ratio])),
                    }
                }
                let bars: Vec<(usize, f64)> = bars
                    .into_iter()
                    .map(|(level, mut ratios)| (level, crate::summary::median(&mut ratios)))
                    .collect();
                if !bars.is_empty() {
                    groups.push((
                        format!("{target} {} {}K", workload.name(), body / 1024),
                        bars,
                    ));
                }
            }
        }
    }
    groups
}

/// A grouped bar chart: one group per (store, workload, body), one bar per concurrency level,
/// height = layer/bare throughput ratio, with the 85 % and 95 % targets as dashed lines.
fn svg(results: &Results) -> String {
    let groups = chart_groups(results);
    let mut levels: Vec<usize> = results.cells.iter().map(|c| c.concurrency).collect();
    levels.sort_unstable();
    levels.dedup();
    let group_w = BAR_W * levels.len().max(1) as f64 + 16.0;
    let (left, top, plot_h) = (60.0, 56.0, 300.0);
    // Room on the right and below for the rotated group labels.
    let width = left + group_w * groups.len().max(1) as f64 + 90.0;
    let height = top + plot_h + 150.0;
    let max_ratio = groups
        .iter()
        .flat_map(|(_, bars)| bars.iter().map(|b| b.1))
        .fold(1.2f64, f64::max)
        .min(3.0);
    let y = |ratio: f64| top + plot_h - ratio.min(max_ratio) / max_ratio * plot_h;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{left}" y="20" font-size="14">Throughput with the layer / bare handler (loopback, 2 cores shared by server and load generator)</text>"#
    );
    let mut tick = 0.0;
    while tick <= max_ratio + 1e-9 {
        let ty = y(tick);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{ty:.1}" x2="{:.0}" y2="{ty:.1}" stroke="#ddd"/><text x="{:.0}" y="{:.1}" text-anchor="end">{:.0}%</text>"##,
            width - 90.0,
            left - 6.0,
            ty + 4.0,
            tick * 100.0
        );
        tick += 0.2;
    }
    for (target, label) in [
        (0.85, "85% (new-key target)"),
        (0.95, "95% (replay target)"),
    ] {
        let ty = y(target);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{ty:.1}" x2="{:.0}" y2="{ty:.1}" stroke="#c00" stroke-dasharray="5,4"/><text x="{:.0}" y="{:.1}" fill="#c00" text-anchor="end">{label}</text>"##,
            width - 90.0,
            width - 92.0,
            ty - 3.0
        );
    }
    draw_bars(&mut s, &groups, &levels, &y, (left, top + plot_h));
    let _ = writeln!(
        s,
        r##"<line x1="{left}" y1="{:.1}" x2="{:.0}" y2="{:.1}" stroke="#333"/>"##,
        top + plot_h,
        width - 90.0,
        top + plot_h
    );
    for (i, level) in levels.iter().enumerate() {
        let lx = left + i as f64 * 120.0;
        let ly = 42.0;
        let _ = writeln!(
            s,
            r#"<rect x="{lx:.0}" y="{:.0}" width="12" height="12" fill="{}"/><text x="{:.0}" y="{ly:.0}">{level} concurrent</text>"#,
            ly - 10.0,
            COLORS[i % COLORS.len()],
            lx + 16.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// One group of bars per entry of `groups`, one bar per concurrency level, with its label under
/// the axis; `y` maps a ratio to its height, `(left, base)` is where the axis starts.
fn draw_bars(
    s: &mut String,
    groups: &[BarGroup],
    levels: &[usize],
    y: &dyn Fn(f64) -> f64,
    (left, base): (f64, f64),
) {
    let group_w = BAR_W * levels.len().max(1) as f64 + 16.0;
    for (g, (name, bars)) in groups.iter().enumerate() {
        let gx = left + 8.0 + g as f64 * group_w;
        for (concurrency, ratio) in bars {
            let i = levels.iter().position(|l| l == concurrency).unwrap_or(0);
            let x = gx + i as f64 * BAR_W;
            let top_y = y(*ratio);
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{top_y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{name} c={concurrency}: {:.0}%</title></rect>"#,
                BAR_W - 2.0,
                base - top_y,
                COLORS[i % COLORS.len()],
                ratio * 100.0
            );
        }
        let lx = gx + group_w / 2.0 - 8.0;
        let ly = base + 10.0;
        let _ = writeln!(
            s,
            r#"<text x="{lx:.1}" y="{ly:.1}" transform="rotate(60 {lx:.1} {ly:.1})">{name}</text>"#
        );
    }
}
