//! The load over time: its throughput and the outbox backlog, sampled every 250 ms while it runs,
//! for the report's largest backlog and for the charts (`--plot`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::database::Probe;

/// How often the load is sampled. Counting a backlog of thousands of events costs PostgreSQL
/// about a millisecond, and that CPU is counted in the service's: four times a second keeps it
/// near 0.1% of a core while still catching the peak.
const INTERVAL: Duration = Duration::from_millis(250);

/// What one run (a scenario or a reference) was seen doing.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Microseconds per request (or pgbench transaction); `None` if not recorded.
    pub latency_us: Option<Histogram<u64>>,
    pub samples: Samples,
}

/// What the samples found, each as (seconds since sampling started, value).
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// Requests completed per second over each interval, at its end.
    pub throughput: Vec<(f64, f64)>,
    /// Events staged and not yet delivered (dead letters aside); none without a database.
    pub backlog: Vec<(f64, f64)>,
}

impl Samples {
    /// The largest backlog seen, if the backlog was sampled.
    pub fn backlog_max(&self) -> Option<u64> {
        self.backlog.iter().map(|(_, events)| *events as u64).max()
    }
}

/// Samples until stopped.
pub struct Sampler {
    stop: watch::Sender<bool>,
    task: JoinHandle<anyhow::Result<Samples>>,
}

impl Sampler {
    /// Samples the rate at which `done` grows, and the outbox backlog if there is a `probe`.
    pub fn start(probe: Option<Arc<Probe>>, done: Arc<AtomicU64>) -> Sampler {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut samples = Samples::default();
            let start = Instant::now();
            let (mut last_count, mut last_at) = (done.load(Ordering::Relaxed), start);
            loop {
                if let Some(probe) = &probe {
                    // Never cut short: an abandoned query would leave the connection unusable.
                    let backlog = probe.outbox_backlog().await?;
                    samples.backlog.push((start.elapsed().as_secs_f64(), backlog as f64));
                }
                tokio::select! {
                    _ = tokio::time::sleep(INTERVAL) => {}
                    // The interval under way when the load ended is left out: it ran partly idle.
                    _ = stopped.changed() => break,
                }
                let (count, at) = (done.load(Ordering::Relaxed), Instant::now());
                let rate = (count - last_count) as f64 / (at - last_at).as_secs_f64();
                samples.throughput.push(((at - start).as_secs_f64(), rate));
                (last_count, last_at) = (count, at);
            }
            Ok(samples)
        });
        Sampler { stop, task }
    }

    pub async fn stop(self) -> anyhow::Result<Samples> {
        let _ = self.stop.send(true);
        self.task.await?
    }
}
