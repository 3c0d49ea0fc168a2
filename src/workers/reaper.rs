//! The reaper: deletes finished keys once they expire.

use std::sync::Arc;

use super::{Outcome, Worker};
use crate::db;
use crate::idempotency::reap_finished;
use crate::state::AppState;

/// Keys deleted per transaction, of each kind (see [`reap_finished`]): small, so a pass never holds
/// many row locks or runs long.
const BATCH: i64 = 500;

/// Deletes keys past the expiry recorded when they finished (whatever this process's retention;
/// that applies only to keys finished before expiries were recorded), a batch per run. Unfinished
/// keys are never deleted: they belong to the completer, or to an operator. Payments keep the
/// client's key, so a retry that arrives after its key expired is answered 410 and charged nothing.
pub struct Reaper {
    state: Arc<AppState>,
}

impl Reaper {
    pub fn new(state: Arc<AppState>) -> Reaper {
        Reaper { state }
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
        // A full batch (of either kind) means there may be more.
        Ok(if reaped as i64 >= BATCH { Outcome::Worked } else { Outcome::Idle })
    }
}
