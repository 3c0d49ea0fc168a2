//! The reaper: deletes finished keys once they expire, and events and the per-account request
//! counts once their retention is over.

use std::sync::Arc;
use std::time::Duration;

use super::{Outcome, Worker};
use crate::config::WorkerSettings;
use crate::db;
use crate::idempotency::reap_finished;
use crate::metrics::reap_request_counts;
use crate::state::AppState;
use crate::webhooks::events::reap_events;

/// Keys deleted per transaction, of each kind (see [`reap_finished`]): small, so a pass never holds
/// many row locks or runs long.
const BATCH: i64 = 500;

/// Deletes keys past the expiry recorded when they finished (whatever this process's retention;
/// that applies only to keys finished before expiries were recorded), a batch per run. Unfinished
/// keys are never deleted: they belong to the completer, or to an operator. Payments keep the
/// client's key, so a retry that arrives after its key expired is answered 410 and charged nothing.
///
/// Deletes as well, a batch per run, the events older than their retention (once fanned out), and
/// the hourly request counts of `payments stats` that are older
/// than their retention: one row per account and hour would otherwise pile up for ever.
pub struct Reaper {
    state: Arc<AppState>,
    event_retention: Duration,
    request_counts_retention: Duration,
}

impl Reaper {
    pub fn new(state: Arc<AppState>, settings: &WorkerSettings) -> Reaper {
        Reaper {
            state,
            event_retention: settings.event_retention,
            request_counts_retention: settings.request_counts_retention,
        }
    }
}

impl Worker for Reaper {
    const NAME: &'static str = "reaper";

    async fn run_once(&self) -> anyhow::Result<Outcome> {
        let mut conn = db::connect(&self.state.db).await?;
        let reaped = reap_finished(&mut conn, self.state.settings.key_retention, BATCH).await?;
        if reaped > 0 {
            self.state.metrics.reaped(reaped);
            tracing::info!(reaped, "reaped finished keys past their expiry");
        }
        let events = reap_events(&mut conn, self.event_retention, BATCH).await?;
        if events > 0 {
            tracing::info!(events, "deleted events past their retention");
        }
        let counts = reap_request_counts(&mut conn, self.request_counts_retention, BATCH).await?;
        if counts > 0 {
            tracing::info!(rows = counts, "deleted per-account request counts past their retention");
        }
        // A full batch of any kind means there may be more.
        let full = [reaped, events, counts].iter().any(|&done| done as i64 >= BATCH);
        Ok(if full { Outcome::Worked } else { Outcome::Idle })
    }
}
