//! Charts, as SVG files drawn with `plotters`: what `payments bench --plot` and `payments chaos
//! --plot` write. Two kinds, each fed plain data by its caller:
//!
//! - [`percentiles`]: latency distributions as HdrHistogram plots them, one curve per run. The x
//!   axis is the percentile `p` placed at `1/(1-p)` on a log scale, labelled 50 %, 90 %, 99 %,
//!   99.9 %, ..., so that each further nine of the tail gets as much room as the one before; the y
//!   axis is the latency at that percentile, on a log scale too, so that a run of a millisecond
//!   and one of a hundred read side by side.
//! - [`over_time`]: panels of lines over one time axis, under an optional strip of events (a tick
//!   per instant, a bar per span) and with vertical rules across all of it (the end of a load, say).
//!
//! Text is left to the SVG viewer's fonts (no font is read here): the sizes plotters estimates
//! for layout are rough, so labels are kept short.

use std::path::Path;

use anyhow::Context;
use hdrhistogram::Histogram;
use plotters::coord::Shift;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

/// Ten colours that stay apart from one another (Tableau 10), for callers to pick from.
pub const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

const WIDTH: u32 = 960;
const PERCENTILES_HEIGHT: u32 = 560;
/// What a legend takes per line.
const LEGEND_LINE: u32 = 19;

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Chart<'a, X, Y> = ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>;
const FONT: &str = "sans-serif";
const LINE_WIDTH: u32 = 2;
/// A dashed line's dashes and the gaps between them, in pixels.
const DASH: u32 = 7;
const GAP: u32 = 5;

/// How a line is drawn: a reference is drawn dashed in the colour of what it is the reference of.
#[derive(Debug, Clone, Copy)]
pub struct Look {
    pub color: RGBColor,
    pub dashed: bool,
}

impl Look {
    pub fn solid(color: RGBColor) -> Look {
        Look { color, dashed: false }
    }

    pub fn dashed(color: RGBColor) -> Look {
        Look { color, dashed: true }
    }
}

/// One run's latencies, in microseconds.
pub struct Distribution<'a> {
    pub name: String,
    pub latency_us: &'a Histogram<u64>,
    pub look: Look,
}

/// Writes the latency distributions as percentile curves to `path`; empty ones are left out.
pub fn percentiles(path: &Path, title: &str, distributions: &[Distribution<'_>]) -> anyhow::Result<()> {
    let curves: Vec<Line> = distributions
        .iter()
        .filter(|d| !d.latency_us.is_empty())
        .map(|d| {
            let h = d.latency_us;
            let name = format!(
                "{}: p50 {}, p99 {}, max {}",
                d.name,
                ms(h.value_at_quantile(0.5) as f64 / 1000.0),
                ms(h.value_at_quantile(0.99) as f64 / 1000.0),
                ms(h.max() as f64 / 1000.0)
            );
            Line { name, points: percentile_curve(h), look: d.look }
        })
        .collect();
    let points = || curves.iter().flat_map(|curve| &curve.points);
    let x_most = points().map(|(x, _)| *x).fold(100.0, f64::max);
    let x_end = 10f64.powf(x_most.log10().ceil());
    let (y_least, y_most) = points().fold((f64::MAX, f64::MIN), |(lo, hi), (_, y)| (lo.min(*y), hi.max(*y)));
    anyhow::ensure!(y_least <= y_most, "no latencies to plot");
    let (y_start, y_end) = (y_least / 1.5, y_most * 1.5);

    // The legend goes below the plot, a line per curve.
    let height = PERCENTILES_HEIGHT + 16 + LEGEND_LINE * curves.len() as u32;
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(PERCENTILES_HEIGHT);
    let mut chart = ChartBuilder::on(&top)
        .caption(title, (FONT, 20))
        .margin(16)
        .margin_right(32)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(
            (1.0..x_end).log_scale().with_key_points(percentile_ticks(x_end)),
            (y_start..y_end).log_scale().with_key_points(one_two_five(y_start, y_end)),
        )?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency")
        .x_label_formatter(&|x| percent(*x))
        .y_label_formatter(&|y| ms(*y))
        .label_style((FONT, 13))
        .draw()?;
    for curve in &curves {
        draw_line(&mut chart, curve)?;
    }
    legend(&bottom.margin(0, 0, 16 + Y_LABELS, 0), &curves)?;
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The points HdrHistogram's percentile distribution gives (five per halving of the distance
/// to 100 %), as (`1/(1-p)`, latency in ms), closed by the maximum at `1/(1-p)` = the number of
/// values, where the last of them lies (the iteration may step past it).
fn percentile_curve(latency_us: &Histogram<u64>) -> Vec<(f64, f64)> {
    let last = (latency_us.len() as f64).max(1.0);
    let mut points: Vec<(f64, f64)> = latency_us
        .iter_quantiles(5)
        .map(|v| (1.0 / (1.0 - v.quantile_iterated_to()), v.value_iterated_to() as f64 / 1000.0))
        .take_while(|(x, _)| *x < last)
        .collect();
    points.push((last, latency_us.max() as f64 / 1000.0));
    points
}

/// A line of a chart.
pub struct Line {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub look: Look,
}

/// A panel of lines over the shared time axis.
pub struct Panel {
    /// What its y axis counts, with the unit.
    pub y_label: String,
    /// A log scale, for lines an order of magnitude or more apart.
    pub log_y: bool,
    pub lines: Vec<Line>,
}

/// A row of the events strip: what happened at an instant (`at`), or over a span.
pub struct EventRow {
    pub name: String,
    pub color: RGBColor,
    pub at: Vec<f64>,
    pub spans: Vec<(f64, f64)>,
}

/// A vertical line across the chart at `at`, labelled.
pub struct Rule {
    pub at: f64,
    pub label: String,
}

/// Panels over one time axis, in seconds from 0 to `x_end`.
pub struct OverTime {
    pub title: String,
    pub x_label: String,
    pub x_end: f64,
    /// Drawn above the panels; none, no strip.
    pub events: Vec<EventRow>,
    pub panels: Vec<Panel>,
    pub rules: Vec<Rule>,
}

const PANEL_HEIGHT: i32 = 230;
const EVENT_ROW_HEIGHT: i32 = 26;
const TITLE_HEIGHT: i32 = 36;
/// What a panel's axis labels take below it (the last one's, with the axis name, more).
const X_LABELS: u32 = 28;
const Y_LABELS: u32 = 72;
/// What the events' names take left of the strip (and so the panels' y labels, to line up).
const EVENT_NAMES: u32 = 130;
/// The room right of a panel for its legend.
const LEGEND_BESIDE: u32 = 200;

/// Writes `chart` to `path`.
pub fn over_time(path: &Path, chart: &OverTime) -> anyhow::Result<()> {
    let strip = match chart.events.len() as i32 {
        0 => 0,
        rows => rows * EVENT_ROW_HEIGHT + 40,
    };
    let height = TITLE_HEIGHT + strip + chart.panels.len() as i32 * PANEL_HEIGHT + 20;
    let root = SVGBackend::new(path, (WIDTH, height as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(&chart.title, (FONT, 20))?;
    let mut breaks: Vec<i32> = Vec::new();
    let mut at = strip;
    if strip > 0 {
        breaks.push(at);
    }
    for _ in 1..chart.panels.len() {
        at += PANEL_HEIGHT;
        breaks.push(at);
    }
    let mut areas = root.split_by_breakpoints(Vec::<i32>::new(), breaks).into_iter();
    if strip > 0 {
        let area = areas.next().context("the events strip's area")?;
        events(&area, chart)?;
    }
    let last = chart.panels.len().saturating_sub(1);
    let left = if strip > 0 { EVENT_NAMES } else { Y_LABELS };
    for (index, (panel, area)) in chart.panels.iter().zip(areas).enumerate() {
        let x_label = (index == last).then_some(chart.x_label.as_str());
        lines_panel(&area, panel, chart, x_label, index == 0 && strip == 0, left)?;
    }
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The events strip: a row per kind of event, the first on top, each ten units high (plotters
/// takes ticks of one's choosing on an integer axis only).
fn events(area: &Area<'_>, chart: &OverTime) -> anyhow::Result<()> {
    let rows = chart.events.len() as i32;
    let names: Vec<&str> = chart.events.iter().map(|row| row.name.as_str()).collect();
    let mut strip = ChartBuilder::on(area)
        .margin_left(16)
        .margin_right(LEGEND_BESIDE + 16)
        .margin_top(8)
        .x_label_area_size(20)
        .y_label_area_size(EVENT_NAMES)
        .build_cartesian_2d(
            0.0..chart.x_end,
            (-5..rows * 10 - 5).with_key_points((0..rows).map(|row| row * 10).collect()),
        )?;
    strip
        .configure_mesh()
        .disable_x_mesh()
        .y_label_formatter(&|y| {
            names.get((rows - 1 - *y / 10) as usize).map_or_else(String::new, |name| (*name).to_owned())
        })
        .x_label_formatter(&|_| String::new())
        .label_style((FONT, 13))
        .draw()?;
    for (row, event) in chart.events.iter().enumerate() {
        // The first row on top.
        let y = (rows - 1 - row as i32) * 10;
        let bar = event.color.mix(0.45).filled();
        strip.draw_series(event.spans.iter().map(|(from, to)| Rectangle::new([(*from, y - 3), (*to, y + 3)], bar)))?;
        let tick = event.color.stroke_width(LINE_WIDTH);
        strip.draw_series(event.at.iter().map(|t| PathElement::new(vec![(*t, y - 4), (*t, y + 4)], tick)))?;
    }
    rules(&mut strip, chart, -5, rows * 10 - 5, true)?;
    Ok(())
}

fn lines_panel(
    area: &Area<'_>,
    panel: &Panel,
    chart: &OverTime,
    x_label: Option<&str>,
    label_rules: bool,
    left: u32,
) -> anyhow::Result<()> {
    let (area, legend_area) = area.split_horizontally(WIDTH - LEGEND_BESIDE);
    legend(&legend_area.margin(8, 0, 0, 0), &panel.lines)?;
    let mut builder = ChartBuilder::on(&area);
    builder.margin_left(16).margin_right(16).margin_top(8).y_label_area_size(left);
    builder.x_label_area_size(if x_label.is_some() { X_LABELS + 20 } else { X_LABELS });
    let ys = || panel.lines.iter().flat_map(|line| &line.points).map(|(_, y)| *y);
    match panel.log_y {
        true => {
            let least = ys().filter(|y| *y > 0.0).fold(f64::MAX, f64::min);
            let most = ys().fold(0.0, f64::max);
            let (start, end) = if least <= most { (least / 1.5, most * 1.5) } else { (1.0, 10.0) };
            let y = (start..end).log_scale().with_key_points(one_two_five(start, end));
            let mut plot = builder.build_cartesian_2d(0.0..chart.x_end, y)?;
            fill_panel(&mut plot, panel, chart, x_label, label_rules, (start, end), &|y| short(*y))
        }
        false => {
            let most = ys().fold(0.0, f64::max);
            let end = if most > 0.0 { most * 1.1 } else { 1.0 };
            let decimals = if end >= 10.0 { 0 } else { 1 };
            let mut plot = builder.build_cartesian_2d(0.0..chart.x_end, 0.0..end)?;
            fill_panel(&mut plot, panel, chart, x_label, label_rules, (0.0, end), &|y| format!("{y:.decimals$}"))
        }
    }
}

/// Draws a panel's mesh, rules and lines on `plot`, whose y axis runs over `y_range`; a value
/// below it (a zero on a log axis) is drawn at its bottom.
fn fill_panel<Y>(
    plot: &mut Chart<'_, RangedCoordf64, Y>,
    panel: &Panel,
    chart: &OverTime,
    x_label: Option<&str>,
    label_rules: bool,
    (y_start, y_end): (f64, f64),
    y_format: &dyn Fn(&f64) -> String,
) -> anyhow::Result<()>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let x_format = |x: &f64| short(*x);
    let mut mesh = plot.configure_mesh();
    mesh.y_desc(panel.y_label.as_str())
        .label_style((FONT, 13))
        .max_light_lines(0)
        .x_label_formatter(&x_format)
        .y_label_formatter(&y_format);
    if let Some(x_label) = x_label {
        mesh.x_desc(x_label);
    }
    mesh.draw()?;
    rules(plot, chart, y_start, y_end, label_rules)?;
    for line in &panel.lines {
        let points = line.points.iter().map(|(x, y)| (*x, y.max(y_start))).collect();
        draw_line(plot, &Line { name: line.name.clone(), points, look: line.look })?;
    }
    Ok(())
}

/// The vertical rules, from `y_start` to `y_end`, labelled at the top if `labelled` (each label a
/// line lower than the one before, so that rules close together stay readable).
fn rules<Y: Ranged>(
    chart: &mut Chart<'_, RangedCoordf64, Y>,
    over_time: &OverTime,
    y_start: Y::ValueType,
    y_end: Y::ValueType,
    labelled: bool,
) -> anyhow::Result<()>
where
    Y::ValueType: Clone + 'static,
{
    let style = BLACK.mix(0.6).stroke_width(1);
    for (index, rule) in over_time.rules.iter().enumerate() {
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(rule.at, y_start.clone()), (rule.at, y_end.clone())],
            style,
        )))?;
        if labelled {
            let font = (FONT, 12).into_font().color(&BLACK);
            let text = EmptyElement::at((rule.at, y_end.clone()))
                + Text::new(rule.label.clone(), (4, 2 + 14 * index as i32), font);
            chart.draw_series(std::iter::once(text))?;
        }
    }
    Ok(())
}

fn draw_line<X, Y>(chart: &mut Chart<'_, X, Y>, line: &Line) -> anyhow::Result<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let style = line.look.color.stroke_width(LINE_WIDTH);
    let points = line.points.iter().copied();
    match line.look.dashed {
        true => chart.draw_series(DashedLineSeries::new(points, DASH, GAP, style))?,
        false => chart.draw_series(LineSeries::new(points, style))?,
    };
    Ok(())
}

/// The legend of `lines`, in an area of its own: plotters draws a legend within the plotting area
/// of a chart, so it gets a chart of its own, of the lines' names and looks alone.
fn legend(area: &Area<'_>, lines: &[Line]) -> anyhow::Result<()> {
    let mut chart = ChartBuilder::on(area).build_cartesian_2d(0.0..1.0, 0.0..1.0)?;
    for line in lines {
        let style = line.look.color.stroke_width(LINE_WIDTH);
        let dashed = line.look.dashed;
        let no_points = std::iter::empty::<(f64, f64)>();
        chart.draw_series(LineSeries::new(no_points, style))?.label(line.name.as_str()).legend(move |(x, y)| {
            match dashed {
                true => DashedPathElement::new(vec![(x, y), (x + 24, y)], DASH, GAP, style).into_dyn(),
                false => PathElement::new(vec![(x, y), (x + 24, y)], style).into_dyn(),
            }
        });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE)
        .border_style(WHITE)
        .label_font((FONT, 13))
        .draw()?;
    Ok(())
}

/// Ticks at 0 %, 50 %, 90 %, 99 %, ... up to `x_end` (a power of ten), as `1/(1-p)`.
fn percentile_ticks(x_end: f64) -> Vec<f64> {
    let mut ticks = vec![1.0, 2.0];
    let mut x = 10.0;
    while x <= x_end * 1.0001 {
        ticks.push(x);
        x *= 10.0;
    }
    ticks
}

/// The percentile at `1/(1-p)` = `x`, with as many decimals as its nines need.
fn percent(x: f64) -> String {
    let p = 100.0 * (1.0 - 1.0 / x);
    let decimals = (x.log10().round() as i32 - 2).max(0) as usize;
    format!("{p:.decimals$}%")
}

/// 1, 2, 5, 10, 20, 50, ... within `start..end`.
fn one_two_five(start: f64, end: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    let mut decade = 10f64.powf(start.log10().floor());
    while decade <= end {
        ticks.extend([1.0, 2.0, 5.0].map(|m| m * decade).into_iter().filter(|t| (start..=end).contains(t)));
        decade *= 10.0;
    }
    ticks
}

/// A number on an axis: whole if it is, else with one decimal.
fn short(value: f64) -> String {
    match value.fract() {
        0.0 => format!("{value:.0}"),
        _ => format!("{value:.1}"),
    }
}

/// Milliseconds, as few digits as they need.
fn ms(value: f64) -> String {
    match value {
        v if v >= 10.0 => format!("{v:.0} ms"),
        v if v >= 1.0 => format!("{v:.1} ms"),
        v if v >= 0.1 => format!("{v:.2} ms"),
        v => format!("{v:.3} ms"),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use hdrhistogram::Histogram;

    use super::*;
    use crate::Scratch;

    /// A histogram of `1..=n` µs, each once.
    fn uniform(n: u64) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, 60_000_000, 3).unwrap();
        for us in 1..=n {
            h.record(us).unwrap();
        }
        h
    }

    /// The text of every `<text>` element, trimmed.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|rest| Some(rest.split_once('>')?.1.split_once("</text>")?.0.trim().to_owned()))
            .collect()
    }

    /// The lines drawn in `color`, as (those of more than ten points, the others: dashes, ticks,
    /// legend samples).
    fn lines_of(svg: &str, color: &str) -> (usize, usize) {
        let stroke = format!(r#"stroke="{color}" stroke-width="2" points=""#);
        let points = svg.lines().filter_map(|line| Some(line.split_once(&stroke)?.1.split_whitespace().count() - 1));
        points.fold((0, 0), |(long, short), n| if n > 10 { (long + 1, short) } else { (long, short + 1) })
    }

    fn written(dir: &Scratch, name: &str) -> (PathBuf, impl FnOnce() -> String) {
        let path = dir.path().join(name);
        let read = {
            let path = path.clone();
            move || std::fs::read_to_string(&path).unwrap()
        };
        (path, read)
    }

    #[test]
    fn a_percentile_curve_runs_from_the_median_side_to_the_maximum_at_one_over_the_tail() {
        let curve = percentile_curve(&uniform(10_000));
        assert!(curve.windows(2).all(|pair| pair[0].0 < pair[1].0 && pair[0].1 <= pair[1].1), "{curve:?}");
        // 90 % of the values are at most 9 ms; HDR buckets hold three significant digits.
        let (_, at_90) = curve.iter().find(|(x, _)| (*x - 10.0).abs() < 1e-9).expect("a point at 90 %");
        assert!((at_90 - 9.0).abs() < 0.01, "{at_90}");
        // The highest value HDR holds as 10,000 µs: 10,007.
        assert_eq!(curve.last().copied(), Some((10_000.0, 10.007)));
    }

    #[test]
    fn percentiles_are_labelled_by_their_nines_and_latencies_in_readable_units() {
        assert_eq!([1.0, 2.0, 10.0, 100.0, 1e3, 1e5].map(percent), ["0%", "50%", "90%", "99%", "99.9%", "99.999%"]);
        assert_eq!(percentile_ticks(1e4), [1.0, 2.0, 10.0, 100.0, 1e3, 1e4]);
        assert_eq!(one_two_five(0.3, 30.0), [0.5, 1.0, 2.0, 5.0, 10.0, 20.0]);
        assert_eq!([0.0421, 0.42, 4.2, 42.0].map(ms), ["0.042 ms", "0.42 ms", "4.2 ms", "42 ms"]);
    }

    #[test]
    fn the_percentile_chart_holds_a_curve_and_a_legend_entry_per_distribution() {
        let dir = Scratch::create("payments-plot-latency-").unwrap();
        let (path, read) = written(&dir, "latency.svg");
        let (fast, slow, empty) = (uniform(1_000), uniform(50_000), uniform(0));
        let distributions = [
            Distribution { name: "fast".into(), latency_us: &fast, look: Look::solid(PALETTE[0]) },
            Distribution { name: "slow reference".into(), latency_us: &slow, look: Look::dashed(PALETTE[0]) },
            Distribution { name: "empty".into(), latency_us: &empty, look: Look::solid(PALETTE[1]) },
        ];
        percentiles(&path, "latency by percentile", &distributions).unwrap();
        let svg = read();
        let texts = texts(&svg);
        assert!(texts.contains(&"latency by percentile".to_owned()), "{texts:?}");
        assert!(texts.contains(&"fast: p50 0.50 ms, p99 0.99 ms, max 1.0 ms".to_owned()), "{texts:?}");
        assert!(texts.iter().any(|text| text.starts_with("slow reference: p50 25 ms")), "{texts:?}");
        assert!(!texts.iter().any(|text| text.starts_with("empty")), "an empty distribution is left out: {texts:?}");
        for label in ["50%", "90%", "99%", "99.9%", "99.99%", "99.999%", "percentile", "latency"] {
            assert!(texts.contains(&label.to_owned()), "{label}: {texts:?}");
        }
        // The solid curve is one line of many points in the first colour; the dashed one, many
        // short ones.
        let (long, short) = lines_of(&svg, "#1F77B4");
        assert_eq!(long, 1, "{svg}");
        assert!(short > 10, "{short} dashes");
    }

    #[test]
    fn the_chart_over_time_holds_its_events_panels_lines_and_rules() {
        let dir = Scratch::create("payments-plot-timeline-").unwrap();
        let (path, read) = written(&dir, "timeline.svg");
        let ramp = |slope: f64| (0..=20).map(|s| (s as f64, slope * s as f64)).collect::<Vec<_>>();
        let chart = OverTime {
            title: "a run".into(),
            x_label: "seconds".into(),
            x_end: 20.0,
            events: vec![
                EventRow { name: "kills".into(), color: PALETTE[3], at: vec![2.0, 7.5], spans: vec![] },
                EventRow { name: "pauses".into(), color: PALETTE[1], at: vec![], spans: vec![(4.0, 9.0)] },
            ],
            panels: vec![
                Panel {
                    y_label: "attempts/s".into(),
                    log_y: false,
                    lines: vec![
                        Line { name: "201".into(), points: ramp(3.0), look: Look::solid(PALETTE[2]) },
                        Line { name: "503".into(), points: ramp(1.0), look: Look::solid(PALETTE[3]) },
                    ],
                },
                Panel {
                    y_label: "keys unfinished".into(),
                    log_y: true,
                    lines: vec![Line { name: "keys".into(), points: ramp(0.5), look: Look::dashed(PALETTE[0]) }],
                },
            ],
            rules: vec![Rule { at: 15.0, label: "load ends".into() }],
        };
        over_time(&path, &chart).unwrap();
        let svg = read();
        let texts = texts(&svg);
        for text in
            ["a run", "seconds", "kills", "pauses", "attempts/s", "201", "503", "keys unfinished", "keys", "load ends"]
        {
            assert!(texts.contains(&text.to_owned()), "{text}: {texts:?}");
        }
        // A tick per kill (and the legend's sample of the 503 line, of the same colour), and the
        // pause's bar.
        assert_eq!(lines_of(&svg, "#D62728"), (1, 2 + 1));
        assert_eq!(
            svg.lines().filter(|line| line.starts_with("<rect") && line.contains(r##"fill="#FF7F0E""##)).count(),
            1
        );
    }
}
