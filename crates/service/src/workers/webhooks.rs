//! The webhooks worker: delivers the fanned-out events to the endpoints that take them, an attempt
//! at a time, each attempt logged, on the retry schedule.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures_util::future::join_all;
use payments_wire::standard_webhooks::SigningSecret;
use reqwest::Url;

use super::{Outcome, Worker};
use crate::config::WorkerSettings;
use crate::db;
use crate::metrics::AttemptOutcome;
use crate::state::AppState;
use crate::webhooks::deliver::{Outgoing, attempt};
use crate::webhooks::deliveries::{AttemptRecord, LOGGED_ANSWER, LeasedDelivery, Next, lease_due, settle};
use crate::webhooks::events::event_id;
use crate::webhooks::network::{Attempted, Sender};
use crate::webhooks::schedule::RetrySchedule;

/// Deliveries leased, and attempted side by side, per run: an endpoint sees at most this many
/// attempts at once from one worker.
const BATCH: i64 = 50;

/// Attempts a batch of due deliveries per run, all at once, with no transaction open and no
/// connection held, then settles each: delivered on a 2xx; else due again on the schedule (not
/// sooner than a `429`'s or `503`'s `Retry-After`), or failed once it is spent; a `410` disables
/// the endpoint at once. Every attempt of a delivery carries the event's id as `webhook-id` and
/// its kept bytes, signed at the attempt's time.
pub struct Webhooks {
    state: Arc<AppState>,
    sender: Sender,
    schedule: RetrySchedule,
    disable_after: Duration,
    timeout: Duration,
    /// Longer than an attempt can take, so a live attempt never loses its lease.
    lease: Duration,
}

impl Webhooks {
    pub fn new(state: Arc<AppState>, settings: &WorkerSettings) -> anyhow::Result<Webhooks> {
        let sender = Sender::new(state.settings.webhook_guard(), settings.webhook_timeout)?;
        Ok(Webhooks {
            state,
            sender,
            schedule: settings.webhook_retry_schedule.clone(),
            disable_after: settings.webhook_disable_after,
            timeout: settings.webhook_timeout,
            // The batch's attempts run side by side, so together they are bounded by the timeout,
            // and the settlements by the database bound; twice the first plus the second leaves
            // room to spare.
            lease: settings.webhook_timeout * 2 + db::OPERATION_TIMEOUT,
        })
    }

    /// One attempt of `delivery`, unless the lease, taken at `leased_at`, could run out before it
    /// ends (the process was paused): then another worker may be attempting it, and this one
    /// sends nothing, and lets the lease run out.
    async fn attempt(&self, delivery: &LeasedDelivery, leased_at: Instant) -> Option<Attempted> {
        if leased_at.elapsed() + self.timeout >= self.lease {
            tracing::warn!(delivery.id = %delivery.id, "the lease could run out during the attempt; not sending");
            return None;
        }
        let failed = |error: &str| Attempted {
            status: None,
            error: Some(error.to_owned()),
            body: Vec::new(),
            duration: Duration::ZERO,
            retry_after: None,
        };
        let Ok(url) = Url::parse(&delivery.url) else { return Some(failed("invalid url")) };
        let secrets: Vec<SigningSecret> = std::iter::once(&delivery.secret)
            .chain(delivery.previous_secret.as_ref())
            .filter_map(|secret| SigningSecret::parse(secret).ok())
            .collect();
        let id = event_id(delivery.event_id);
        let outgoing = Outgoing { url: &url, event_id: &id, body: delivery.body.as_bytes(), secrets: &secrets };
        Some(attempt(&self.sender, outgoing, Utc::now().timestamp()).await)
    }

    /// What becomes of `delivery` after `attempted`.
    fn next(&self, delivery: &LeasedDelivery, attempted: &Attempted) -> Next {
        if attempted.delivered() {
            return Next::Delivered;
        }
        if attempted.status == Some(410) {
            return Next::Gone;
        }
        let asked = match attempted.status {
            Some(429 | 503) => attempted.retry_after,
            _ => None,
        };
        let made = usize::try_from(delivery.attempts).unwrap_or(usize::MAX);
        match self.schedule.next(made, asked, &mut rand::rng()) {
            Some(after) => Next::RetryIn(after),
            None => Next::Failed,
        }
    }
}

impl Worker for Webhooks {
    const NAME: &'static str = "webhooks";

    async fn run_once(&self) -> anyhow::Result<Outcome> {
        let mut conn = db::connect(&self.state.db).await?;
        let leased_at = Instant::now();
        let deliveries = lease_due(&mut conn, self.lease, BATCH).await?;
        if deliveries.is_empty() {
            return Ok(Outcome::Idle);
        }
        // No connection is held while the receivers take their time.
        drop(conn);
        let attempts = join_all(deliveries.iter().map(|delivery| self.attempt(delivery, leased_at))).await;
        let mut conn = db::connect(&self.state.db).await?;
        for (delivery, attempted) in deliveries.iter().zip(attempts) {
            let Some(attempted) = attempted else { continue };
            let next = self.next(delivery, &attempted);
            let body = String::from_utf8_lossy(&attempted.body[..attempted.body.len().min(LOGGED_ANSWER)]);
            // Cut on a character's boundary, within the log's 4 KiB.
            let mut response_body = body.into_owned();
            while response_body.len() > LOGGED_ANSWER {
                response_body.pop();
            }
            let record = AttemptRecord {
                status_code: attempted.status,
                error: attempted.error.as_deref(),
                response_body,
                duration: attempted.duration,
            };
            settle(&mut conn, delivery, &record, next, self.disable_after).await?;
            let outcome = match next {
                Next::Delivered => AttemptOutcome::Delivered,
                Next::RetryIn(_) => AttemptOutcome::Failed,
                Next::Failed => AttemptOutcome::GaveUp,
                Next::Gone => AttemptOutcome::Gone,
            };
            self.state.metrics.webhook_attempt(outcome, attempted.duration);
            match next {
                Next::Delivered => {}
                Next::RetryIn(after) => {
                    tracing::info!(delivery.id = %delivery.id, attempt = delivery.attempts, error = ?attempted.error, ?after, "webhook attempt failed")
                }
                Next::Failed => {
                    tracing::warn!(delivery.id = %delivery.id, attempts = delivery.attempts, error = ?attempted.error, "webhook delivery failed for the last time")
                }
                Next::Gone => {
                    tracing::warn!(endpoint.id = %delivery.endpoint_id, "webhook endpoint answered 410 Gone: disabled")
                }
            }
        }
        Ok(Outcome::Worked)
    }
}
