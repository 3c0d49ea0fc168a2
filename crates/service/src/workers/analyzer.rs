//! The analyzer: keeps the planner's statistics of the probed tables up with their growth while
//! they are young (see [`crate::db::statistics`]).

use std::sync::Arc;

use super::{Outcome, Worker};
use crate::db::{self, statistics};
use crate::state::AppState;

/// Analyzes each table the request path probes once it has rows enough to tell the planner
/// something and statistics taken from none: right after a fresh database's first rows, so that
/// no connection keeps a plan made from an empty table's statistics for long.
pub struct Analyzer {
    state: Arc<AppState>,
}

impl Analyzer {
    pub fn new(state: Arc<AppState>) -> Analyzer {
        Analyzer { state }
    }
}

impl Worker for Analyzer {
    const NAME: &'static str = "analyzer";

    async fn run_once(&self) -> anyhow::Result<Outcome> {
        let mut conn = db::connect(&self.state.db).await?;
        let analyzed = statistics::analyze_grown_tables(&mut conn).await?;
        if !analyzed.is_empty() {
            tracing::info!(tables = ?analyzed, "analyzed tables that have grown since their statistics were taken");
        }
        // A table analyzed now is done with: nothing more to do at once.
        Ok(Outcome::Idle)
    }
}
