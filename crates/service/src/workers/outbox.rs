//! The outbox worker: hands the kept events over to the operator's sink (the fan-out), and
//! delivers them there.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use reqwest::Url;

use super::{Outcome, Worker};
use crate::config::WorkerSettings;
use crate::db;
use crate::db::wake::Wake;
use crate::metrics::DeliveryOutcome;
use crate::outbox::{LeasedEvent, Settlement, lease_due_events, settle_delivered, settle_failed};
use crate::state::AppState;
use crate::webhooks::deliveries::fan_out;

/// However many attempts an event has had, it is retried at least this often.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// Events leased, and delivered side by side, per run: with a receiver that answers in a few
/// milliseconds one worker delivers thousands a second, two statements per batch; and a receiver
/// sees at most this many deliveries at once from one worker.
const BATCH: i64 = 50;

/// Delivers a batch of due events per run, all at once: each POSTed to the webhook as JSON, with
/// its id also in the `Idempotency-Key` header so receivers can de-duplicate (delivery is at
/// least once, and in no particular order), or, with no webhook configured, logged.
pub struct Outbox {
    state: Arc<AppState>,
    http: reqwest::Client,
    webhook: Option<Url>,
    /// Longer than a delivery can take, so a live delivery never loses its lease.
    lease: Duration,
    backoff: Duration,
    max_attempts: u32,
}

impl Outbox {
    pub fn new(state: Arc<AppState>, settings: &WorkerSettings) -> anyhow::Result<Outbox> {
        // Never follow a redirect: reqwest would turn the POST into a GET without the event, and a
        // 2xx to that would count as delivered. A 3xx is a failed delivery, retried like any other.
        let http = reqwest::Client::builder()
            .timeout(settings.webhook_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Outbox {
            state,
            http,
            webhook: settings.webhook_url.clone(),
            // The batch's deliveries run side by side, so together they are bounded by the webhook
            // timeout, and the settlement by the database bound; twice the first plus the second
            // leaves room to spare.
            lease: settings.webhook_timeout * 2 + db::OPERATION_TIMEOUT,
            backoff: settings.webhook_backoff,
            max_attempts: settings.webhook_max_attempts,
        })
    }

    /// What becomes of an event whose delivery failed: tried again after its backoff, or, after
    /// its last attempt, dead-lettered.
    fn settlement<'a>(&self, event: &LeasedEvent, error: &'a str) -> Settlement<'a> {
        let attempts = event.attempts.unsigned_abs();
        if attempts >= self.max_attempts {
            tracing::error!(event.id = event.id(), attempts, %error, "event dead-lettered after its last attempt");
            return Settlement::DeadLettered { error };
        }
        let retry_in = self.backoff.saturating_mul(1 << attempts.saturating_sub(1).min(20)).min(MAX_BACKOFF);
        tracing::warn!(event.id = event.id(), attempts, %error, ?retry_in, "event delivery failed");
        Settlement::Failed { error, retry_in }
    }

    async fn deliver(&self, event: &LeasedEvent) -> Result<(), String> {
        let Some(webhook) = &self.webhook else {
            tracing::info!(event.id = event.id(), event = %event.event, "event (no PAYMENTS_WEBHOOK_URL set, so logged)");
            return Ok(());
        };
        let response = self
            .http
            .post(webhook.clone())
            .header("Idempotency-Key", event.id())
            .json(&event.event)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        match response.status() {
            status if status.is_success() => Ok(()),
            status => Err(format!("the webhook answered {status}")),
        }
    }
}

impl Worker for Outbox {
    const NAME: &'static str = "outbox";

    async fn run_once(&self) -> anyhow::Result<Outcome> {
        let mut conn = db::connect(&self.state.db).await?;
        let fanned = fan_out(&mut conn, BATCH).await?;
        if fanned.deliveries > 0 {
            self.state.wake.wake(Wake::Webhooks);
        }
        let events = lease_due_events(&mut conn, self.lease, BATCH).await?;
        if events.is_empty() {
            return Ok(if fanned.events > 0 { Outcome::Worked } else { Outcome::Idle });
        }
        // No connection is held while the receiver takes its time.
        drop(conn);
        let results = join_all(events.iter().map(|event| self.deliver(event))).await;
        let mut delivered = Vec::new();
        let mut failed = Vec::new();
        for (event, result) in events.iter().zip(results) {
            match result {
                Ok(()) => delivered.push(event),
                Err(error) => failed.push((event, error)),
            }
        }
        let metrics = &self.state.metrics;
        let mut conn = db::connect(&self.state.db).await?;
        settle_delivered(&mut conn, &delivered).await?;
        metrics.deliveries(DeliveryOutcome::Delivered, delivered.len());
        for (event, error) in failed {
            let settlement = self.settlement(event, &error);
            let outcome = match settlement {
                Settlement::Failed { .. } => DeliveryOutcome::Failed,
                Settlement::DeadLettered { .. } => DeliveryOutcome::DeadLettered,
            };
            settle_failed(&mut conn, event, settlement).await?;
            metrics.deliveries(outcome, 1);
        }
        Ok(Outcome::Worked)
    }
}
