//! The outbox worker: delivers the events of finished payments.

use std::sync::Arc;
use std::time::Duration;

use reqwest::Url;

use super::{Outcome, Worker};
use crate::config::WorkerSettings;
use crate::db;
use crate::outbox::{LeasedEvent, Settlement, lease_due_event, settle};
use crate::startup::AppState;

/// However many attempts an event has had, it is retried at least this often.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// Delivers one due event per run: POSTed to the webhook as JSON, with its id also in the
/// `Idempotency-Key` header so receivers can de-duplicate (delivery is at least once), or, with no
/// webhook configured, logged.
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
            // The delivery is bounded by the webhook timeout and the settlement by the database
            // bound; twice the first plus the second leaves room to spare.
            lease: settings.webhook_timeout * 2 + db::OPERATION_TIMEOUT,
            backoff: settings.webhook_backoff,
            max_attempts: settings.webhook_max_attempts,
        })
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
        let Some(event) = lease_due_event(&mut conn, self.lease).await? else {
            return Ok(Outcome::Idle);
        };
        // No connection is held while the receiver takes its time.
        drop(conn);
        let result = self.deliver(&event).await;
        let attempts = event.attempts.unsigned_abs();
        let settlement = match &result {
            Ok(()) => Settlement::Delivered,
            Err(error) if attempts >= self.max_attempts => {
                tracing::error!(event.id = event.id(), attempts, %error, "event dead-lettered after its last attempt");
                Settlement::DeadLettered { error }
            }
            Err(error) => {
                let retry_in = self.backoff.saturating_mul(1 << attempts.saturating_sub(1).min(20)).min(MAX_BACKOFF);
                tracing::warn!(event.id = event.id(), attempts, %error, ?retry_in, "event delivery failed");
                Settlement::Failed { error, retry_in }
            }
        };
        settle(&mut *db::connect(&self.state.db).await?, &event, settlement).await?;
        Ok(Outcome::Worked)
    }
}
