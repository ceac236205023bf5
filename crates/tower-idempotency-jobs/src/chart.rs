//! A job table's activity over the last hour ([`Activity`],
//! [`Driver::activity`](crate::Driver::activity)): per minute, the jobs received, done and
//! failed, and the age of the oldest pending job at the minute's end; and the two charts both
//! halves' pages draw of it ([`charts`]), as inline SVG.
//!
//! Read from the rows as they are now, in three bounded statements: the jobs enqueued in the
//! window, by minute (the pending ones through the due index, the finished ones through the
//! half's index on `(state, finished_at)`); the jobs finished in the window, by minute and
//! state, each group with its oldest enqueue time (that index again); and the oldest pending
//! job ([`Driver::oldest_pending`](crate::Driver::oldest_pending)). A job was pending at a
//! minute's end when it was enqueued before the end and is pending still or finished in a later
//! minute; so the oldest of them is the older of the oldest pending now and the oldest of those
//! that finished in a later minute, and the minutes' oldest enqueue times give every minute's
//! lag without reading a job twice. A job an operator retried reads as pending since it was
//! enqueued and counts where it finished last; a purged one is not counted.

use maud::{html, Markup, PreEscaped};
use plotters::prelude::*;
use serde::Serialize;

use crate::{Dialect, Prepared, Table};

/// The minutes an [`Activity`] covers, the current one last.
pub const MINUTES: usize = 60;

/// One minute, in milliseconds.
pub const MINUTE_MS: i64 = 60_000;

/// A job table's activity per minute over the last hour.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Activity {
    /// The start of the first minute, unix ms (a whole minute).
    pub start_ms: i64,
    /// When it was read, unix ms: inside the last minute.
    pub now_ms: i64,
    /// [`MINUTES`] minutes, oldest first; the last is the current one, up to `now_ms`.
    pub minutes: Vec<Minute>,
}

/// One minute of an [`Activity`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Minute {
    /// Jobs enqueued in the minute (an inbox's received events).
    pub received: u64,
    /// Jobs that finished done in the minute.
    pub done: u64,
    /// Jobs that finished failed in the minute.
    pub failed: u64,
    /// The age in seconds of the oldest job pending at the minute's end (the current minute's:
    /// now); `None` when none was.
    pub oldest_pending_secs: Option<u64>,
}

impl Activity {
    /// The jobs received, done and failed over the window.
    pub fn totals(&self) -> (u64, u64, u64) {
        self.minutes.iter().fold((0, 0, 0), |(r, d, f), minute| {
            (r + minute.received, d + minute.done, f + minute.failed)
        })
    }
}

/// The start of the window that ends with the minute of `now_ms`: [`MINUTES`] whole minutes.
pub fn window_start(now_ms: i64) -> i64 {
    (now_ms.div_euclid(MINUTE_MS) - (MINUTES as i64 - 1)) * MINUTE_MS
}

/// The activity statements of one job table; `$1` is the window's start.
#[derive(Debug)]
pub(crate) struct ChartStatements {
    /// `(minute offset, count)`: the jobs enqueued since `$1`, by minute.
    pub(crate) received: Prepared,
    /// `(minute offset, state, count, oldest enqueue)`: the jobs finished since `$1`, by
    /// minute and state.
    pub(crate) finished: Prepared,
}

impl ChartStatements {
    pub(crate) fn new(table: &Table, dialect: Dialect) -> Self {
        let sql = |text: String| Prepared::new(text, dialect.placeholders);
        let t = &table.name;
        let created = format!("{q}{}{q}", table.created, q = dialect.quote);
        // The offset of a time's minute from the window's start, in integer arithmetic that
        // every database answers as a big integer (`/` is a decimal division on MySQL).
        let minute = |column: &str| format!("({column} - $1) - (({column} - $1) % {MINUTE_MS})");
        // Pending jobs through the due index, finished ones through `(state, finished_at)`.
        let finished = "state IN (1, 2, 3) AND finished_at >= $1";
        Self {
            received: sql(format!(
                "SELECT job_minute, count(*) FROM (\
                 SELECT {m} AS job_minute FROM {t} WHERE state = 0 AND {created} >= $1 \
                 UNION ALL \
                 SELECT {m} AS job_minute FROM {t} WHERE {finished} AND {created} >= $1\
                 ) AS r GROUP BY job_minute",
                m = minute(&created),
            )),
            finished: sql(format!(
                "SELECT {} AS job_minute, state, count(*), min({created}) FROM {t} \
                 WHERE {finished} GROUP BY job_minute, state",
                minute("finished_at"),
            )),
        }
    }
}

/// A row of the activity's first statement: a minute's offset from the window's start (ms)
/// and the jobs enqueued in it.
pub type ReceivedRow = (i64, i64);
/// A row of the activity's second statement: a minute's offset from the window's start (ms),
/// a state, the jobs that finished in that state in the minute, and their oldest enqueue time.
pub type FinishedRow = (i64, i16, i64, i64);

/// The activity of the window ending at `now_ms` from its statements' rows and the enqueue
/// time of the oldest job pending now (for a driver's calls).
pub fn assemble(
    now_ms: i64,
    received: Vec<ReceivedRow>,
    finished: Vec<FinishedRow>,
    oldest_pending: Option<i64>,
) -> Activity {
    let start_ms = window_start(now_ms);
    let mut minutes = vec![Minute::default(); MINUTES];
    let index = |offset: i64| usize::try_from(offset / MINUTE_MS).ok();
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    for (offset, n) in received {
        if let Some(minute) = index(offset).and_then(|i| minutes.get_mut(i)) {
            minute.received += count(n);
        }
    }
    // The oldest enqueue time of the jobs finished in each minute; one slot past the window
    // for those a clock ahead of this one finished.
    let mut oldest_finished = vec![None::<i64>; MINUTES + 1];
    for (offset, state, n, oldest) in finished {
        let Some(i) = index(offset) else { continue };
        if let Some(minute) = minutes.get_mut(i) {
            match crate::JobState::from_code(state) {
                crate::JobState::Done => minute.done += count(n),
                crate::JobState::Failed => minute.failed += count(n),
                _ => {}
            }
        }
        let slot = &mut oldest_finished[i.min(MINUTES)];
        *slot = Some(slot.map_or(oldest, |at| at.min(oldest)));
    }
    // Pending at the end of minute `i`: enqueued before it, and pending now or finished in a
    // later minute. Walked from the last minute back, carrying the later minutes' oldest.
    let mut later = oldest_finished[MINUTES];
    for i in (0..MINUTES).rev() {
        let end = start_ms + (i as i64 + 1) * MINUTE_MS;
        let oldest = [oldest_pending, later]
            .into_iter()
            .flatten()
            .filter(|&at| at < end)
            .min();
        let measured = end.min(now_ms);
        minutes[i].oldest_pending_secs =
            oldest.map(|at| u64::try_from(measured.saturating_sub(at) / 1000).unwrap_or(0));
        later = [later, oldest_finished[i]].into_iter().flatten().min();
    }
    Activity {
        start_ms,
        now_ms,
        minutes,
    }
}

/// The charts' drawn size in SVG units; the page scales them to its width.
const SIZE: (u32, u32) = (560, 200);

/// One series of a chart: its name, colour and values per minute.
struct Series {
    name: &'static str,
    color: RGBColor,
    values: Vec<u64>,
}

impl Series {
    fn total(&self) -> u64 {
        self.values.iter().sum()
    }

    fn peak(&self) -> u64 {
        self.values.iter().copied().max().unwrap_or(0)
    }

    fn hex(&self) -> String {
        let RGBColor(r, g, b) = self.color;
        format!("#{r:02x}{g:02x}{b:02x}")
    }
}

/// The two charts of `activity` for a page whose jobs are `noun` (plural: `events`,
/// `messages`) and whose done jobs are `done` (`processed`, `delivered`), under the heading
/// `Activity, last hour`, side by side (wrapping on a narrow page):
///
/// - `#chart-counts`: the jobs `received`, `done` and `failed` per minute;
/// - `#chart-lag`: the age in seconds of the oldest pending job at each minute's end
///   (series `oldest`; 0 where none was pending).
///
/// Each is a `figure` holding an `<svg>` with a `<title>`, and a caption that is its legend:
/// each series' colour, name and total (the lag's: `oldest pending now: 12 s`). The figure's
/// `data-series` names its series (`received,processed,failed`), `data-totals` and
/// `data-peaks` give each one's total and largest minute (`received=3 processed=2 failed=1`),
/// for a test or a reader without the picture.
pub fn charts(activity: &Activity, noun: &str, done: &'static str) -> Markup {
    let column = |f: fn(&Minute) -> u64| activity.minutes.iter().map(f).collect::<Vec<_>>();
    let counts = [
        Series {
            name: "received",
            color: RGBColor(0x1f, 0x5f, 0xbf),
            values: column(|m| m.received),
        },
        Series {
            name: done,
            color: RGBColor(0x1a, 0x7f, 0x37),
            values: column(|m| m.done),
        },
        Series {
            name: "failed",
            color: RGBColor(0xb4, 0x23, 0x18),
            values: column(|m| m.failed),
        },
    ];
    let lag = [Series {
        name: "oldest",
        color: RGBColor(0x8a, 0x4b, 0x08),
        values: column(|m| m.oldest_pending_secs.unwrap_or(0)),
    }];
    let now_lag = activity
        .minutes
        .last()
        .and_then(|m| m.oldest_pending_secs)
        .map_or_else(
            || "pending now: none".to_owned(),
            |secs| format!("pending now: {secs} s"),
        );
    let singular = noun.strip_suffix('s').unwrap_or(noun);
    let lag_title = format!("Age of the oldest pending {singular} at each minute's end, last hour");
    let mut letters = noun.chars();
    let capital: String = letters
        .next()
        .into_iter()
        .flat_map(char::to_uppercase)
        .collect();
    html! {
        h2 #activity-heading { "Activity, last hour" }
        div.charts {
            (figure(Chart {
                id: "chart-counts",
                title: &format!("{capital}{} per minute, last hour", letters.as_str()),
                y: "per minute",
                series: &counts,
                legend: counts.iter().map(|s| (s, s.total().to_string())).collect(),
            }))
            (figure(Chart {
                id: "chart-lag",
                title: &lag_title,
                y: "seconds",
                series: &lag,
                legend: vec![(&lag[0], now_lag)],
            }))
        }
    }
}

/// One chart as [`figure`] draws it.
struct Chart<'a> {
    id: &'a str,
    title: &'a str,
    /// The vertical axis' description.
    y: &'a str,
    series: &'a [Series],
    /// Each series with what its legend says of it.
    legend: Vec<(&'a Series, String)>,
}

/// One chart in its `figure`, its caption the legend.
fn figure(chart: Chart<'_>) -> Markup {
    let each =
        |f: &dyn Fn(&Series) -> String| chart.series.iter().map(f).collect::<Vec<_>>().join(" ");
    let names: Vec<&str> = chart.series.iter().map(|s| s.name).collect();
    html! {
        figure.chart id=(chart.id) data-series=(names.join(","))
            data-totals=(each(&|s| format!("{}={}", s.name, s.total())))
            data-peaks=(each(&|s| format!("{}={}", s.name, s.peak()))) {
            (PreEscaped(draw(chart.title, chart.y, chart.series)))
            figcaption {
                (chart.title) ": "
                @for (series, says) in &chart.legend {
                    span.series data-series=(series.name) {
                        span.swatch style=(format!("background:{}", series.hex())) {}
                        (series.name) " " strong { (says) }
                    }
                }
            }
        }
    }
}

/// The SVG of `series` over the window's minutes, its first element a `<title>` of `title`.
///
/// Drawn by plotters' SVG backend, without a font feature: it lays text out by an estimate
/// and leaves the font to the browser, so the server needs no font files.
fn draw(title: &str, y: &str, series: &[Series]) -> String {
    let mut svg = String::new();
    let peak = series.iter().map(Series::peak).max().unwrap_or(0);
    // Room above the peak; at least 0..4, so that a quiet hour has an axis of whole numbers.
    let top = (peak + peak / 10 + 1).max(4);
    // Plotters draws a font size at 1/1.24² of the size asked.
    let font = ("sans-serif", 15);
    let last = MINUTES as i32 - 1;
    let drawn = (|| -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d(-last..0i32, 0..top)?;
        chart
            .configure_mesh()
            .x_labels(7)
            .y_labels(5)
            .x_desc("minutes ago")
            .y_desc(y)
            .x_label_formatter(&|x| (-x).to_string())
            .light_line_style(WHITE)
            .label_style(font)
            .axis_desc_style(font)
            .draw()?;
        // Each line narrower than the one before, so that one drawn over another leaves it seen.
        for (s, width) in series.iter().zip([4, 3, 2]) {
            let points = s
                .values
                .iter()
                .enumerate()
                .map(|(i, &v)| (i as i32 - last, v));
            chart.draw_series(LineSeries::new(points, s.color.stroke_width(width)))?;
        }
        root.present()?;
        Ok(())
    })();
    if drawn.is_err() {
        svg.clear();
    }
    with_title(&svg, title)
}

/// `svg` with `role="img"` and a `<title>` of `title` (escaped) as its first element; an empty
/// `<svg>` with its title when plotters drew nothing.
fn with_title(svg: &str, title: &str) -> String {
    let title = html! { title { (title) } }.into_string();
    let open = svg
        .find("<svg")
        .and_then(|at| svg[at..].find('>').map(|end| at + end));
    match open {
        Some(end) => format!("{} role=\"img\">{title}{}", &svg[..end], &svg[end + 1..]),
        None => format!(
            "<svg viewBox=\"0 0 {} {}\" xmlns=\"http://www.w3.org/2000/svg\" \
             role=\"img\">{title}</svg>",
            SIZE.0, SIZE.1
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inside a minute, so that the window's start is a whole minute before.
    const NOW: i64 = 30_000_000 * MINUTE_MS + 30_000;

    fn minute(i: i64) -> i64 {
        window_start(NOW) + i * MINUTE_MS
    }

    #[test]
    fn the_window_is_sixty_whole_minutes_to_the_current_one() {
        assert_eq!(window_start(NOW), (30_000_000 - 59) * MINUTE_MS);
        assert_eq!(window_start(30_000_000 * MINUTE_MS), window_start(NOW));
    }

    #[test]
    fn minutes_count_and_the_lag_is_the_oldest_pending_at_each_end() {
        let activity = assemble(
            NOW,
            vec![(0, 2), (59 * MINUTE_MS, 1), (60 * MINUTE_MS, 7)],
            vec![
                (5 * MINUTE_MS, 1, 3, minute(0) + 10),
                (10 * MINUTE_MS, 2, 1, minute(3)),
                (10 * MINUTE_MS, 3, 1, minute(4)),
            ],
            Some(minute(20) + 5_000),
        );
        assert_eq!(activity.start_ms, minute(0));
        assert_eq!(activity.minutes.len(), MINUTES);
        let m = &activity.minutes;
        assert_eq!((m[0].received, m[59].received), (2, 1));
        assert_eq!((m[5].done, m[10].failed, m[10].done), (3, 1, 0));
        assert_eq!(activity.totals(), (3, 3, 1));
        let lag: Vec<Option<u64>> = m.iter().map(|m| m.oldest_pending_secs).collect();
        let expected: Vec<Option<u64>> = (0..MINUTES as u64)
            .map(|i| match i {
                // The job enqueued at the window's start (+10 ms), done in minute 5.
                0..5 => Some((i + 1) * 60 - 1),
                // Then the one enqueued at minute 3's start, failed in minute 10.
                5..10 => Some((i - 2) * 60),
                10..20 => None,
                // Then the one pending now, enqueued 5 s into minute 20.
                20..59 => Some((i - 19) * 60 - 5),
                // The current minute's, measured now.
                _ => Some(39 * 60 + 25),
            })
            .collect();
        assert_eq!(lag, expected);
    }

    #[test]
    fn the_charts_carry_their_series_titles_and_totals() {
        let mut activity = assemble(NOW, vec![(0, 8), (MINUTE_MS, 2)], Vec::new(), None);
        activity.minutes[1].done = 4;
        activity.minutes[2].failed = 1;
        activity.minutes[3].oldest_pending_secs = Some(90);
        let html = charts(&activity, "<b>events</b>", "processed").into_string();
        assert_eq!(html.matches("<svg").count(), 2, "{html}");
        assert!(!html.contains("<b>"), "the noun is escaped: {html}");
        assert!(
            html.contains("<title>&lt;b&gt;events&lt;/b&gt; per minute"),
            "{html}"
        );
        assert!(
            html.contains(r#"data-totals="received=10 processed=4 failed=1""#),
            "{html}"
        );
        assert!(html.contains(r#"data-peaks="oldest=90""#), "{html}");
        assert!(
            html.contains("<strong>10</strong>"),
            "the legend's total: {html}"
        );
        // Scaled: the received series' line starts at 8 (below the top, 9), falls to 2, then to
        // the axis, and stays there.
        let received = html
            .split("<polyline")
            .find(|line| line.contains("stroke=\"#1F5FBF\""))
            .expect("the received series' line");
        let ys: Vec<i64> = received
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .split_whitespace()
            .map(|point| point.split(',').nth(1).unwrap().parse().unwrap())
            .collect();
        assert_eq!(ys.len(), MINUTES, "{received}");
        let axis = ys[2];
        assert!(ys[2..].iter().all(|&y| y == axis), "{ys:?}");
        assert!(ys[0] < ys[1] && ys[1] < axis, "{ys:?}");
        // 8 is 4 times 2 above the axis.
        assert!(((axis - ys[0]) - 4 * (axis - ys[1])).abs() <= 3, "{ys:?}");
    }

    #[test]
    fn an_undrawn_chart_is_an_empty_svg_with_its_title() {
        let svg = with_title("", "a <title>");
        assert!(svg.starts_with("<svg viewBox=\"0 0 560 200\""), "{svg}");
        assert!(
            svg.contains("<title>a &lt;title&gt;</title></svg>"),
            "{svg}"
        );
        let drawn = with_title("<svg width=\"1\"><rect/></svg>", "t");
        assert_eq!(
            drawn,
            "<svg width=\"1\" role=\"img\"><title>t</title><rect/></svg>"
        );
    }
}
