//! The settler: settles the refunds the gateway left pending, by looking them up.

use std::sync::Arc;

use tracing::Instrument;

use super::{Outcome, Worker};
use crate::config::WorkerSettings;
use crate::db;
use crate::gateway;
use crate::metrics::SettlerOutcome;
use serde_json::json;

use crate::audit::Actor;
use crate::db::wake::Wake;
use crate::refunds::{Backoff, DueRefund, SettledBy, Settlement, lease_due_refund, settle_refund};
use crate::request_id::RequestId;
use crate::state::AppState;

/// Looks one due pending refund up at its gateway per run (see [`crate::refunds::lease_due_refund`]
/// for the lease and the backoff) and settles it once the gateway says it succeeded or failed.
/// Only the refund's own gateway is believed: another gateway's answer, "no such refund", or no
/// readable answer changes nothing, and the refund is looked up again after its backoff. However
/// long it stays pending it is looked up again; after `overdue_attempts` look-ups each run logs
/// an error, for a person to look.
///
/// Gateway events (to come) will settle refunds sooner; this look-up stays as the backstop.
pub struct Settler {
    state: Arc<AppState>,
    backoff: Backoff,
    overdue_attempts: u32,
}

impl Settler {
    pub fn new(state: Arc<AppState>, settings: &WorkerSettings) -> Settler {
        let backoff = Backoff {
            first: settings.settler_backoff,
            max: settings.settler_max_backoff,
            // The lease's statement, bounded by the operation timeout, then the look-up, bounded by
            // the gateway timeout: a refund is never due again before a look-up of it has ended.
            lease: state.settings.gateway_timeout + db::OPERATION_TIMEOUT,
        };
        Settler { state, backoff, overdue_attempts: settings.settler_overdue_attempts }
    }
}

impl Worker for Settler {
    const NAME: &'static str = "settler";

    async fn run_once(&self) -> anyhow::Result<Outcome> {
        // A run is named like a request: its id is in its log lines and its audit record.
        let run = RequestId::generate();
        self.settle_one(&run)
            .instrument(tracing::info_span!("settler.run", request_id = %run, refund.id = tracing::field::Empty))
            .await
    }
}

impl Settler {
    async fn settle_one(&self, run: &RequestId) -> anyhow::Result<Outcome> {
        let mut conn = db::connect(&self.state.db).await?;
        let Some(due) = lease_due_refund(&mut conn, &self.backoff).await? else {
            return Ok(Outcome::Idle);
        };
        // No connection is held while the gateway takes its time.
        drop(conn);
        tracing::Span::current().record("refund.id", due.refund.id.to_string());
        let outcome = match self.look_up(&due).await {
            Ok(settlement) => {
                let mut conn = db::connect(&self.state.db).await?;
                let by = SettledBy { actor: Actor::Settler, request_id: run, data: json!({ "attempt": due.attempts }) };
                match settle_refund(&mut conn, &due.refund, &settlement, by).await? {
                    Some(refund) => {
                        tracing::info!(status = %refund.status, attempt = due.attempts, "settled a pending refund");
                        self.state.wake.wake(Wake::Outbox);
                        match settlement {
                            Settlement::Succeeded => SettlerOutcome::Succeeded,
                            Settlement::Failed { .. } => SettlerOutcome::Failed,
                        }
                    }
                    None => {
                        tracing::info!("the refund was settled meanwhile; nothing to do");
                        SettlerOutcome::SettledMeanwhile
                    }
                }
            }
            Err(outcome) if due.attempts.unsigned_abs() >= self.overdue_attempts => {
                tracing::error!(
                    attempt = due.attempts, gateway = %due.refund.gateway,
                    gateway_refund_id = due.refund.gateway_refund_id, last = outcome.as_str(),
                    "a refund is still not settled after many look-ups: a person should look at it at its gateway"
                );
                SettlerOutcome::Overdue
            }
            Err(outcome) => outcome,
        };
        self.state.metrics.settler_run(outcome);
        Ok(Outcome::Worked)
    }

    /// Asks the refund's gateway where it stands: how it settled, or why it is not settled yet
    /// (each but `pending` logged).
    async fn look_up(&self, due: &DueRefund) -> Result<Settlement, SettlerOutcome> {
        let refund = &due.refund;
        let Some(id) = refund.gateway_refund_id.as_deref() else {
            // A refund is handed to the settler only once the gateway answered it with its id.
            tracing::error!("a pending refund without the gateway's id cannot be looked up");
            return Err(SettlerOutcome::Unanswered);
        };
        let found = match self.state.gateway.get_refund(id).await {
            Ok(answered) if answered.is_from(&refund.gateway) => answered.answer,
            Ok(answered) => {
                tracing::warn!(
                    gateway = %refund.gateway, answered_by = %answered.by(),
                    "another gateway than the refund's answered; its answer says nothing about the refund"
                );
                return Err(SettlerOutcome::WrongGateway);
            }
            Err(error) => {
                tracing::warn!(%error, "no readable answer about a pending refund; it will be looked up again");
                return Err(SettlerOutcome::Unanswered);
            }
        };
        match found.map(|found| found.status) {
            Some(gateway::RefundStatus::Succeeded) => Ok(Settlement::Succeeded),
            Some(gateway::RefundStatus::Failed { code }) => Ok(Settlement::Failed { code }),
            Some(gateway::RefundStatus::Pending) => Err(SettlerOutcome::Pending),
            None => {
                tracing::warn!(gateway_refund_id = id, "the refund's own gateway says it has no such refund");
                Err(SettlerOutcome::NotFound)
            }
        }
    }
}
