//! The run over time, for `--plot DIR`: `chaos-timeline.svg` (drawn by
//! [`crate::plot::over_time`]) shows
//!
//! - what was done to the fleet: each kill (marked once the process is started again), each pause
//!   (from SIGSTOP to SIGCONT), each process that aborted at a crash point (when it was found gone
//!   and started again), each time the gateway was made to forget its keys;
//! - the load's attempts per second by answer, as the clients saw them: the status, `replay` for a
//!   stored answer replayed, `no answer` for an attempt that got none (the final round, which asks
//!   every key once more, is left out: its burst would flatten the rest);
//! - the gateway's charge and refund requests per second, and those it failed on purpose;
//! - keys unfinished: the run's keys that the database holds unfinished or needing attention (the
//!   count the settling waits on), each second through the load and the settling;
//!
//! with rules where the load ends and where every key is asked once more.
//!
//! The clients and the disturber record as they go (a lock and a push: nothing a run would
//! notice); the gateway and the database are asked once a second, by [`Timeline::sample`], only
//! when the chart is drawn.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::Context;
use payments_client::{Answer, NoAnswer};
use plotters::style::RGBColor;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::check;
use super::gateway::GatewayControl;
use crate::plot::{self, EventRow, Line, Look, OverTime, PALETTE, Panel, Rule};
use crate::progress::Progress;

const FILE: &str = "chaos-timeline.svg";

/// How often the gateway and the database are asked.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// What the run did and saw, by time since the timeline began.
#[derive(Debug)]
pub struct Timeline {
    start: Instant,
    seen: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    /// Attempts by answer, counted per second.
    attempts: BTreeMap<String, Vec<u64>>,
    keys: Vec<String>,
    kills: Vec<f64>,
    /// From freeze to thaw; the last one open while a process is frozen.
    pauses: Vec<(f64, Option<f64>)>,
    aborted: Vec<f64>,
    forgotten: Vec<f64>,
    rules: Vec<(f64, &'static str)>,
    samples: Vec<Sample>,
}

/// What the gateway and the database said at one moment.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: f64,
    unfinished: i64,
    /// The gateway's counts so far: charge and refund requests, and faults.
    requests: u64,
    faults: u64,
}

impl Default for Timeline {
    fn default() -> Timeline {
        Timeline { start: Instant::now(), seen: Mutex::default() }
    }
}

impl Timeline {
    /// Seconds since the timeline began.
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn seen(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An attempt's answer, or the lack of one.
    pub fn attempt(&self, result: &Result<Answer, NoAnswer>) {
        let answer = match result {
            Ok(answer) if answer.replayed => "replay".to_owned(),
            Ok(answer) => answer.status.as_str().to_owned(),
            Err(_) => "no answer".to_owned(),
        };
        let second = self.now() as usize;
        let mut seen = self.seen();
        let counts = seen.attempts.entry(answer).or_default();
        if counts.len() <= second {
            counts.resize(second + 1, 0);
        }
        counts[second] += 1;
    }

    /// A key the run made.
    pub fn key(&self, key: &str) {
        self.seen().keys.push(key.to_owned());
    }

    /// A process was killed, and has just been started again.
    pub fn killed(&self) {
        let now = self.now();
        self.seen().kills.push(now);
    }

    /// A process is frozen.
    pub fn paused(&self) {
        let now = self.now();
        self.seen().pauses.push((now, None));
    }

    /// The frozen process is thawed.
    pub fn thawed(&self) {
        let now = self.now();
        if let Some((_, thawed @ None)) = self.seen().pauses.last_mut() {
            *thawed = Some(now);
        }
    }

    /// `count` processes that aborted at a crash point were started again.
    pub fn aborted(&self, count: u64) {
        let now = self.now();
        self.seen().aborted.extend((0..count).map(|_| now));
    }

    pub fn forgotten(&self) {
        let now = self.now();
        self.seen().forgotten.push(now);
    }

    /// A moment to mark across the chart.
    pub fn rule(&self, label: &'static str) {
        let now = self.now();
        self.seen().rules.push((now, label));
    }

    /// Asks the gateway and the database once a second, until [`Drawing::finish`] draws the
    /// chart into `dir`.
    pub fn sample(self: &Arc<Self>, gateway: GatewayControl, database_url: String, dir: PathBuf) -> Drawing {
        let (stop, mut stopped) = watch::channel(false);
        let timeline = self.clone();
        let task = tokio::spawn(async move {
            loop {
                let keys = timeline.seen().keys.clone();
                let (unfinished, stats) = (check::unsettled(&database_url, &keys).await?, gateway.stats().await?);
                let sample = Sample {
                    at: timeline.now(),
                    unfinished,
                    requests: stats.requests + stats.refund_requests,
                    faults: stats.faults,
                };
                timeline.seen().samples.push(sample);
                tokio::select! {
                    _ = tokio::time::sleep(SAMPLE_EVERY) => {}
                    _ = stopped.changed() => return Ok(()),
                }
            }
        });
        Drawing { timeline: self.clone(), dir, stop, sampling: task }
    }

    fn chart(&self) -> OverTime {
        let seen = self.seen();
        let row = |name: &str, color: RGBColor, at: &[f64], spans: &[(f64, f64)]| EventRow {
            name: name.to_owned(),
            color,
            at: at.to_vec(),
            spans: spans.to_vec(),
        };
        // A pause still open (the run ended in it) is drawn to now.
        let now = self.now();
        let pauses: Vec<(f64, f64)> = seen.pauses.iter().map(|(from, to)| (*from, to.unwrap_or(now))).collect();
        let events = vec![
            row("killed", PALETTE[3], &seen.kills, &[]),
            row("paused", PALETTE[1], &[], &pauses),
            row("crash-point abort", PALETTE[4], &seen.aborted, &[]),
            row("keys forgotten", PALETTE[7], &seen.forgotten, &[]),
        ];

        let attempts = seen
            .attempts
            .iter()
            .enumerate()
            .map(|(index, (answer, counts))| {
                let points = counts.iter().enumerate().map(|(second, n)| (second as f64 + 0.5, *n as f64)).collect();
                Line { name: answer.clone(), points, look: Look::solid(answer_color(answer, index)) }
            })
            .collect();
        let per_second = |count: fn(&Sample) -> u64| -> Vec<(f64, f64)> {
            let pairs = seen.samples.windows(2);
            pairs.map(|w| (w[1].at, count(&w[1]).saturating_sub(count(&w[0])) as f64 / (w[1].at - w[0].at))).collect()
        };
        let gateway = vec![
            Line {
                name: "charge and refund requests".into(),
                points: per_second(|s| s.requests),
                look: Look::solid(PALETTE[7]),
            },
            Line { name: "failed on purpose".into(), points: per_second(|s| s.faults), look: Look::solid(PALETTE[3]) },
        ];
        let unfinished = vec![Line {
            name: "keys unfinished".into(),
            points: seen.samples.iter().map(|s| (s.at, s.unfinished as f64)).collect(),
            look: Look::solid(PALETTE[0]),
        }];

        let panels = vec![
            Panel { y_label: "attempts per second".into(), log_y: false, lines: attempts },
            Panel { y_label: "at the gateway, per second".into(), log_y: false, lines: gateway },
            Panel { y_label: "keys unfinished".into(), log_y: false, lines: unfinished },
        ];
        let last_attempt = seen.attempts.values().map(|counts| counts.len() as f64).fold(0.0, f64::max);
        let last_sample = seen.samples.last().map_or(0.0, |s| s.at);
        OverTime {
            title: "payments chaos: attempts, faults and keys unfinished over the run".into(),
            x_label: "seconds since the load started".into(),
            x_end: last_attempt.max(last_sample).max(1.0).ceil(),
            events,
            panels,
            rules: seen.rules.iter().map(|(at, label)| Rule { at: *at, label: (*label).to_owned() }).collect(),
        }
    }
}

/// The colour of an answer's line: green for `201`, blue for a replay, orange for `409`, red for
/// `503`, grey for no answer; the others' from the rest of the palette, in their order.
fn answer_color(answer: &str, index: usize) -> RGBColor {
    match answer {
        "201" => PALETTE[2],
        "replay" => PALETTE[0],
        "409" => PALETTE[1],
        "503" => PALETTE[3],
        "no answer" => PALETTE[7],
        _ => [PALETTE[4], PALETTE[5], PALETTE[6], PALETTE[8], PALETTE[9]][index % 5],
    }
}

/// A chart to draw, its samples being taken.
pub struct Drawing {
    timeline: Arc<Timeline>,
    dir: PathBuf,
    stop: watch::Sender<bool>,
    sampling: JoinHandle<anyhow::Result<()>>,
}

impl Drawing {
    /// Stops the sampling and draws the chart; says where, or why it could not (the run's
    /// verdict does not depend on it).
    pub async fn finish(self, progress: &Progress) {
        let Drawing { timeline, dir, stop, sampling } = self;
        let _ = stop.send(true);
        let drawn = match sampling.await {
            Ok(Ok(())) => draw(&timeline, &dir),
            Ok(Err(error)) => Err(error),
            Err(error) => Err(error.into()),
        };
        match drawn {
            Ok(path) => progress.note(&format!("wrote {}", path.display())),
            Err(error) => progress.note(&format!("the timeline could not be drawn: {error:#}")),
        }
    }
}

/// Draws `timeline` into `dir` (made if need be); returns the file written.
fn draw(timeline: &Timeline, dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(FILE);
    plot::over_time(&path, &timeline.chart())?;
    Ok(path)
}
