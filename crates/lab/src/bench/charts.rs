//! What `--plot DIR` draws (with [`crate::plot`]), from what each run was seen doing:
//!
//! - `bench-latency.svg`: the latency distribution of each scenario and of each reference, as
//!   percentile curves; a reference is dashed, in the colour of the scenario it is the floor of
//!   (pgbench's `new_payment.sql` of `new`, and so on), the bare endpoint grey;
//! - `bench-throughput.svg`: throughput over each run (the references' too: pgbench's
//!   transactions per second, as it reports them each second), and the outbox backlog over each
//!   scenario.

use std::path::{Path, PathBuf};

use anyhow::Context;
use plotters::style::RGBColor;

use super::load::Scenario;
use super::reference::Script;
use super::sampler::{Samples, Seen};
use crate::plot::{self, Distribution, Line, Look, OverTime, PALETTE, Panel};

const LATENCY: &str = "bench-latency.svg";
const THROUGHPUT: &str = "bench-throughput.svg";

/// Everything the charts show.
#[derive(Default)]
pub struct Charts {
    pub scenarios: Vec<(Scenario, Seen)>,
    /// By script.
    pub pgbench: Vec<(Script, Seen)>,
    pub bare_endpoint: Option<Seen>,
}

impl Charts {
    /// Writes the charts into `dir` (made if need be), titled with the run's `settings`; returns
    /// the files written.
    pub fn write(&self, dir: &Path, settings: &str) -> anyhow::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let runs = self.runs();

        let latency = dir.join(LATENCY);
        let distributions: Vec<Distribution> = runs
            .iter()
            .filter_map(|run| {
                let latency_us = run.seen.latency_us.as_ref()?;
                Some(Distribution { name: run.name.clone(), latency_us, look: run.look })
            })
            .collect();
        plot::percentiles(&latency, &format!("payments bench: latency by percentile ({settings})"), &distributions)?;

        let throughput = dir.join(THROUGHPUT);
        let lines = |of: fn(&Samples) -> &Vec<(f64, f64)>| -> Vec<Line> {
            let with_points = runs.iter().filter(|run| !of(&run.seen.samples).is_empty());
            with_points
                .map(|run| Line { name: run.name.clone(), points: of(&run.seen.samples).clone(), look: run.look })
                .collect()
        };
        let mut panels = vec![Panel {
            y_label: "requests (transactions) per second".into(),
            log_y: true,
            lines: lines(|s| &s.throughput),
        }];
        let backlog = lines(|s| &s.backlog);
        if !backlog.is_empty() {
            panels.push(Panel { y_label: "outbox backlog (events)".into(), log_y: false, lines: backlog });
        }
        let x_end = runs
            .iter()
            .flat_map(|run| run.seen.samples.throughput.iter().chain(&run.seen.samples.backlog))
            .map(|(t, _)| *t)
            .fold(1.0, f64::max);
        let chart = OverTime {
            title: format!("payments bench: throughput and outbox backlog over each run ({settings})"),
            x_label: "seconds since the run started".into(),
            x_end: x_end.ceil(),
            events: Vec::new(),
            panels,
            rules: Vec::new(),
        };
        plot::over_time(&throughput, &chart)?;
        Ok(vec![latency, throughput])
    }

    /// Every run, named and styled, scenarios first.
    fn runs(&self) -> Vec<Run<'_>> {
        let scenarios = self.scenarios.iter().map(|(scenario, seen)| Run {
            name: format!("{scenario:?}").to_lowercase(),
            look: Look::solid(color(*scenario)),
            seen,
        });
        let pgbench = self.pgbench.iter().map(|(script, seen)| Run {
            name: format!("pgbench {}", script.name),
            look: Look::dashed(color(script.reference_of)),
            seen,
        });
        let bare = self.bare_endpoint.iter().map(|seen| Run {
            name: "bare endpoint".into(),
            look: Look::dashed(BARE_ENDPOINT),
            seen,
        });
        scenarios.chain(pgbench).chain(bare).collect()
    }
}

struct Run<'a> {
    name: String,
    look: Look,
    seen: &'a Seen,
}

const BARE_ENDPOINT: RGBColor = PALETTE[7];

fn color(scenario: Scenario) -> RGBColor {
    match scenario {
        Scenario::New => PALETTE[0],
        Scenario::Replay => PALETTE[2],
        Scenario::Duplicates => PALETTE[4],
        Scenario::Refund => PALETTE[1],
        Scenario::Capture => PALETTE[3],
    }
}
