//! What a chart holds, read from its SVG text: plotters writes one element a line, each text's
//! content on a line of its own.

use std::path::Path;

pub struct Svg(String);

impl Svg {
    pub fn read(path: &Path) -> Svg {
        Svg(std::fs::read_to_string(path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display())))
    }

    /// The content of every `<text>` element, trimmed: titles, axis labels, legend entries.
    pub fn texts(&self) -> Vec<&str> {
        let texts = self.0.split("<text").skip(1);
        texts.filter_map(|rest| Some(rest.split_once('>')?.1.split_once("</text>")?.0.trim())).collect()
    }

    /// Whether a text starts with `prefix`.
    pub fn has_text(&self, prefix: &str) -> bool {
        self.texts().iter().any(|text| text.starts_with(prefix))
    }

    /// The points of every line drawn in `color` (`#RRGGBB`).
    fn lines(&self, color: &str) -> impl Iterator<Item = Vec<(i32, i32)>> {
        let stroke = format!(r#"stroke="{color}" stroke-width="2" points=""#);
        self.0.lines().filter_map(move |line| {
            let points = line.split_once(&stroke)?.1.split_once('"')?.0;
            let point = |pair: &str| pair.split_once(',').and_then(|(x, y)| Some((x.parse().ok()?, y.parse().ok()?)));
            Some(points.split_whitespace().filter_map(point).collect())
        })
    }

    /// The vertical ticks drawn in `color`: lines of two points at one x.
    pub fn ticks(&self, color: &str) -> usize {
        self.lines(color).filter(|points| points.len() == 2 && points[0].0 == points[1].0).count()
    }

    /// The lines of more than two points drawn in `color`: a series' data, not its legend's sample.
    pub fn series(&self, color: &str) -> usize {
        self.lines(color).filter(|points| points.len() > 2).count()
    }

    /// The bars filled with `color`.
    pub fn bars(&self, color: &str) -> usize {
        let fill = format!(r#"fill="{color}""#);
        self.0.lines().filter(|line| line.starts_with("<rect") && line.contains(&fill)).count()
    }
}
