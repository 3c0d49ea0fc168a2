//! Background workers: whatever crashes, they drive every request back to a coherent, final
//! state by themselves, without its client and without an operator.
//!
//! - The [`Completer`] finishes requests whose clients went away: unfinished keys whose lock is
//!   free or stale, re-driven from their recovery point through the same phases as the API.
//! - The [`Reaper`] deletes finished keys once they expire, and the per-account request counts
//!   once their retention is over.
//! - The [`Outbox`] fans out the events that finished payments and refunds staged (a delivery to
//!   each merchant endpoint that takes one), and delivers them to the operator's sink.
//! - [`Webhooks`] delivers them to the merchants' endpoints, on the retry schedule.
//! - The [`Settler`] settles the refunds the gateway left pending, looking them up with backoff.
//! - The [`Lapser`] cancels authorizations past their `capture_before`, at the gateway too.
//! - The [`Analyzer`] analyzes the tables the request path probes as they grow from empty, so that
//!   the planner picks their indexes from real statistics.
//!
//! Each worker has `run_once`, one unit of work, which tests call to drain it deterministically;
//! [`Workers::run`] loops them until asked to stop. Any number of worker processes may run beside
//! any number of `serve`s: they coordinate only through PostgreSQL row locks (`FOR UPDATE SKIP
//! LOCKED`), so no key, no event and no pending refund is ever handled by two of them at once.

mod analyzer;
mod completer;
mod lapser;
mod outbox;
mod reaper;
mod settler;
mod webhooks;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::{Notify, watch};

pub use analyzer::Analyzer;
pub use completer::Completer;
pub use lapser::Lapser;
pub use outbox::Outbox;
pub use reaper::Reaper;
pub use settler::Settler;
pub use webhooks::Webhooks;

use crate::config::WorkerSettings;
use crate::db::wake::{Wake, Woken};
use crate::state::AppState;

/// What one `run_once` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It did something, and there may be more: run again at once.
    Worked,
    /// Nothing to do: wait an interval before looking again.
    Idle,
}

/// One kind of background work.
pub trait Worker: Send + Sync + 'static {
    /// For logs.
    const NAME: &'static str;

    /// Does one unit of work, if there is any.
    fn run_once(&self) -> impl Future<Output = anyhow::Result<Outcome>> + Send;
}

/// The workers of one process.
pub struct Workers {
    pub completer: Completer,
    pub reaper: Reaper,
    pub outbox: Outbox,
    pub webhooks: Webhooks,
    pub settler: Settler,
    pub lapser: Lapser,
    pub analyzer: Analyzer,
    interval: Duration,
    state: Arc<AppState>,
}

impl Workers {
    pub fn new(state: Arc<AppState>, settings: &WorkerSettings) -> anyhow::Result<Workers> {
        Ok(Workers {
            completer: Completer::new(state.clone(), settings),
            reaper: Reaper::new(state.clone(), settings),
            outbox: Outbox::new(state.clone(), settings)?,
            webhooks: Webhooks::new(state.clone(), settings)?,
            settler: Settler::new(state.clone(), settings),
            lapser: Lapser::new(state.clone(), settings),
            analyzer: Analyzer::new(state.clone()),
            interval: settings.interval,
            state,
        })
    }

    /// Runs every worker until `stop` turns true. A unit of work under way when it does is
    /// finished first, so a request being completed is not left half-done by a clean stop. Each
    /// worker looks for work every interval, and at once when a write anywhere wakes it (see
    /// [`crate::db::wake`]).
    pub async fn run(self, stop: watch::Receiver<bool>) {
        let woken = Woken::default();
        let never = || Arc::new(Notify::new());
        tokio::join!(
            woken.listen(&self.state.db, stop.clone()),
            run_loop(self.completer, self.interval, woken.of(Wake::Completer), stop.clone()),
            run_loop(self.reaper, self.interval, never(), stop.clone()),
            run_loop(self.outbox, self.interval, woken.of(Wake::Outbox), stop.clone()),
            run_loop(self.webhooks, self.interval, woken.of(Wake::Webhooks), stop.clone()),
            run_loop(self.settler, self.interval, woken.of(Wake::Settler), stop.clone()),
            run_loop(self.lapser, self.interval, never(), stop.clone()),
            run_loop(self.analyzer, self.interval, never(), stop),
        );
    }
}

async fn run_loop<W: Worker>(worker: W, interval: Duration, woken: Arc<Notify>, mut stop: watch::Receiver<bool>) {
    tracing::info!(worker = W::NAME, "started");
    while !*stop.borrow() {
        match worker.run_once().await {
            Ok(Outcome::Worked) => continue,
            Ok(Outcome::Idle) => {}
            Err(error) => tracing::warn!(worker = W::NAME, %error, "a run failed; trying again after a pause"),
        }
        // Jitter spreads the polls of many processes instead of letting them run in step.
        let pause = interval.mul_f64(rand::rng().random_range(0.5..1.5));
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = woken.notified() => {}
            _ = stop.changed() => {}
        }
    }
    tracing::info!(worker = W::NAME, "stopped");
}
