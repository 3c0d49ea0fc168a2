//! The progress display: a spinner per step and a bar per timed phase, with its live rate, on
//! stderr. When stderr is not a terminal (a pipe, a file, CI) nothing is drawn, and each phase's
//! summary is printed as a plain line instead.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How often a bar's rate is refreshed.
const TICK: Duration = Duration::from_millis(250);

/// Where the bars are drawn.
pub struct Progress {
    bars: MultiProgress,
    visible: bool,
}

/// A step in progress: a spinner, or a bar that fills over a phase's duration.
pub struct Phase<'a> {
    progress: &'a Progress,
    bar: ProgressBar,
    ticker: Option<JoinHandle<()>>,
}

impl Progress {
    pub fn new() -> Progress {
        let visible = std::io::stderr().is_terminal();
        let target = if visible { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
        Progress { bars: MultiProgress::with_draw_target(target), visible }
    }

    /// A step of unknown length (starting the world, waiting for the outbox).
    pub fn step(&self, what: &str) -> Phase<'_> {
        let bar = self.bars.add(ProgressBar::new_spinner());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {prefix:<24} {elapsed:>4} {msg}").expect("valid template"),
        );
        bar.set_prefix(what.to_owned());
        bar.enable_steady_tick(Duration::from_millis(100));
        Phase { progress: self, bar, ticker: None }
    }

    /// A phase that runs for `duration`; with `done`, the bar shows the rate at which it grows.
    pub fn timed(&self, what: &str, duration: Duration, done: Option<Arc<AtomicU64>>) -> Phase<'_> {
        let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        let bar = self.bars.add(ProgressBar::new(millis));
        let template = "  {prefix:<24} [{bar:30}] {elapsed:>4}/{duration:<4} {msg}";
        bar.set_style(ProgressStyle::with_template(template).expect("valid template").progress_chars("=> "));
        bar.set_prefix(what.to_owned());
        let ticker = tokio::spawn({
            let bar = bar.clone();
            async move {
                let start = Instant::now();
                let (mut last_count, mut last_at) = (0, start);
                loop {
                    tokio::time::sleep(TICK).await;
                    bar.set_position(u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX).min(millis));
                    if let Some(done) = &done {
                        let (count, now) = (done.load(Ordering::Relaxed), Instant::now());
                        let rate = (count - last_count) as f64 / (now - last_at).as_secs_f64();
                        bar.set_message(format!("{rate:>9.0}/s  {count} done"));
                        (last_count, last_at) = (count, now);
                    }
                }
            }
        });
        Phase { progress: self, bar, ticker: Some(ticker) }
    }

    /// A phase of `total` items; the caller moves the bar (see [`Phase::bar`]).
    pub fn counted(&self, what: &str, total: u64) -> Phase<'_> {
        let bar = self.bars.add(ProgressBar::new(total));
        let template = "  {prefix:<24} [{bar:30}] {pos}/{len} {elapsed:>4} {msg}";
        bar.set_style(ProgressStyle::with_template(template).expect("valid template").progress_chars("=> "));
        bar.set_prefix(what.to_owned());
        Phase { progress: self, bar, ticker: None }
    }

    /// A line above the bars (or on stderr, when they are not drawn).
    pub fn note(&self, line: &str) {
        match self.visible {
            true => {
                let _ = self.bars.println(line);
            }
            false => eprintln!("{line}"),
        }
    }
}

impl Default for Progress {
    fn default() -> Progress {
        Progress::new()
    }
}

impl Phase<'_> {
    /// The bar, for a task that moves it.
    pub fn bar(&self) -> ProgressBar {
        self.bar.clone()
    }

    /// What the phase is doing now, beside its bar.
    pub fn set_message(&self, message: String) {
        self.bar.set_message(message);
    }

    /// Ends the phase with a summary line.
    pub fn finish(self, summary: &str) {
        self.progress.note(&format!("{:<26} {summary}", self.bar.prefix()));
    }
}

impl Drop for Phase<'_> {
    fn drop(&mut self) {
        if let Some(ticker) = self.ticker.take() {
            ticker.abort();
        }
        self.bar.finish_and_clear();
        self.progress.bars.remove(&self.bar);
    }
}
