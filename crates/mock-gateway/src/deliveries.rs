//! Sending the events: each one `POST`ed to the webhook, signed, and retried with backoff until
//! the receiver acknowledges it with a 2xx, in tasks of their own: a request's answer never waits
//! for its event.
//!
//! The handlers hand each event the ledger made to the [`Outbox`] as the ledger is unlocked (so
//! they queue in the order of the changes); one task takes them from the queue in that order and
//! starts each one's delivery (or two, duplicated by the [`EventPlan`]) after its delay, if any.
//! The next event waits until the one before has been answered, or for [`IN_ORDER_WAIT`] at most,
//! so that a receiver that answers gets the events in the order made, unless the plan shuffles
//! them, and a receiver that hangs does not stop them. Every delivery is then retried in its own
//! task until acknowledged, for as long as the gateway runs: events are kept in memory, like
//! everything else the gateway knows.
//!
//! Each attempt is signed anew ([`signature::sign`]), at the time of the attempt, over the exact
//! bytes sent, which are the same for every attempt and every copy of an event.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use payments_wire::signature::{self, SIGNATURE_HEADER, WebhookSecret};
use rand::Rng;
use rand::distr::Alphanumeric;
use reqwest::Url;
use reqwest::header::CONTENT_TYPE;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::event_plan::{self, EventPlan};
use super::events::{Event, EventType};

/// Timeout of one attempt: a receiver that is up answers in milliseconds (it verifies the event
/// and records it in one short transaction); one that has not answered in this long is taken as
/// down, and the delivery is tried again later.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the next event waits for the first attempts of the one before to be answered: a
/// receiver that answers gets the events one after another, in order; one that hangs holds the
/// queue up for at most this long per event, while the hung attempt goes on in its own task.
const IN_ORDER_WAIT: Duration = Duration::from_secs(1);
/// With `shuffle`, the events made within this long of a batch's first go out together, shuffled:
/// long enough that a burst of requests lands in one batch, short enough for a demo.
const SHUFFLE_WINDOW: Duration = Duration::from_secs(1);
/// The first wait before an unacknowledged delivery is tried again: a receiver being restarted (a
/// killed `serve` coming back) is usually up again within a second or two.
pub const DEFAULT_FIRST_RETRY: Duration = Duration::from_millis(500);
/// The longest wait between two attempts of a delivery: the waits double from the first up to
/// this, and stay there until a 2xx. A receiver that is down for long gets each pending event
/// twice a minute (nothing to speak of), and all of them within half a minute of coming back.
pub const DEFAULT_MAX_RETRY: Duration = Duration::from_secs(30);

/// Where and how the gateway sends its events: `POST` to `url`, signed under every one of its
/// secrets (one `v1` each, as while a secret is rolled), retried until acknowledged.
#[derive(Debug, Clone)]
pub struct Webhook {
    url: Url,
    /// Never shown: [`WebhookSecret`]'s `Debug` says only that it is one.
    secrets: Vec<WebhookSecret>,
    first_retry: Duration,
    max_retry: Duration,
    attempt_timeout: Duration,
}

impl Webhook {
    /// Events to `url`, signed under each of `secrets`, each attempt given
    /// [`DEFAULT_ATTEMPT_TIMEOUT`], retried after [`DEFAULT_FIRST_RETRY`], doubling up to
    /// [`DEFAULT_MAX_RETRY`]. With no secret, the events carry a timestamp and no signature, which
    /// any receiver refuses.
    pub fn new(url: Url, secrets: Vec<WebhookSecret>) -> Webhook {
        Webhook {
            url,
            secrets,
            first_retry: DEFAULT_FIRST_RETRY,
            max_retry: DEFAULT_MAX_RETRY,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
        }
    }

    /// Retries after `first`, doubling up to `max` (`max` is at least `first`).
    pub fn retry(self, first: Duration, max: Duration) -> Webhook {
        Webhook { first_retry: first, max_retry: max.max(first), ..self }
    }

    /// Gives each attempt `timeout` to be answered.
    pub fn attempt_timeout(self, timeout: Duration) -> Webhook {
        Webhook { attempt_timeout: timeout, ..self }
    }

    /// How many secrets each event is signed under.
    pub fn secrets(&self) -> usize {
        self.secrets.len()
    }

    /// Where the events go, fit to be shown: without the password a URL may hold.
    pub fn shown_url(&self) -> Url {
        let mut url = self.url.clone();
        if url.password().is_some() {
            let _ = url.set_password(Some("..."));
        }
        url
    }
}

/// A new secret for a gateway and a service that make their own (`serve`'s in-process mock):
/// `whsec_` and 32 letters and digits, 190 random bits.
pub fn new_webhook_secret() -> String {
    let random: String = rand::rng().sample_iter(Alphanumeric).take(32).map(char::from).collect();
    format!("whsec_{random}")
}

/// The events on their way out, and what became of them: what the handlers hand the ledger's
/// events to, and what `/_control/events` and the stats read.
pub(super) struct Outbox {
    /// To the task that sends them; `None` when the gateway has no webhook (the events are then
    /// dropped as they are made).
    queue: Option<mpsc::UnboundedSender<Event>>,
    shared: Arc<Shared>,
}

/// What the outbox and the delivery tasks share.
#[derive(Default)]
struct Shared {
    plan: Mutex<EventPlan>,
    log: Mutex<EventLog>,
    /// Whether the last attempt failed: the logs say it once when deliveries start failing and
    /// once when they are acknowledged again, never at every attempt of every event.
    failing: AtomicBool,
}

/// The counters behind the `events…` fields of `GET /_control/stats`.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub(super) struct EventStats {
    /// Events made: one per change to the books, while the gateway has a webhook.
    events: u64,
    /// Distinct events of which at least one attempt was made (an event waiting out its delay,
    /// or its shuffled batch, is made but not sent).
    events_sent: u64,
    /// Attempts: every `POST`, of every copy, first ones and retries.
    event_attempts: u64,
    /// Distinct events that got a 2xx (to any copy).
    events_acknowledged: u64,
}

/// An event sent, as `GET /_control/events/sent` lists it.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Sent {
    id: String,
    #[serde(rename = "type")]
    kind: EventType,
    /// Its deliveries: 2 when it was duplicated, else 1.
    copies: u8,
    /// Attempts so far, of all its copies.
    attempts: u64,
    /// Copies that got a 2xx so far.
    acknowledged: u8,
}

#[derive(Debug, Default)]
struct EventLog {
    stats: EventStats,
    /// Every event handed to its deliveries, by id.
    dispatched: HashMap<String, Sent>,
    /// The ids of the events sent, in the order of their first attempts.
    sent: Vec<String>,
}

impl EventLog {
    fn dispatched(&mut self, event: &Event, copies: u8) {
        let sent = Sent { id: event.id.clone(), kind: event.kind, copies, attempts: 0, acknowledged: 0 };
        self.dispatched.insert(event.id.clone(), sent);
    }

    fn attempted(&mut self, id: &str) {
        self.stats.event_attempts += 1;
        let Some(sent) = self.dispatched.get_mut(id) else { return };
        if sent.attempts == 0 {
            self.stats.events_sent += 1;
            self.sent.push(id.to_owned());
        }
        sent.attempts += 1;
    }

    fn acknowledged(&mut self, id: &str) {
        let Some(sent) = self.dispatched.get_mut(id) else { return };
        if sent.acknowledged == 0 {
            self.stats.events_acknowledged += 1;
        }
        sent.acknowledged += 1;
    }
}

impl Outbox {
    /// An outbox for `webhook`, and the task that sends its events, to be spawned; with no
    /// webhook, an outbox that drops them.
    pub(super) fn new(webhook: Option<Webhook>) -> reqwest::Result<(Outbox, Option<impl Future<Output = ()> + Send>)> {
        let shared = Arc::new(Shared::default());
        let Some(webhook) = webhook else {
            return Ok((Outbox { queue: None, shared }, None));
        };
        let http = reqwest::Client::builder()
            .timeout(webhook.attempt_timeout)
            // A receiver that redirects has not acknowledged anything: tried again, as any non-2xx.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent("payments-mock-gateway")
            .build()?;
        let (queue, events) = mpsc::unbounded_channel();
        let courier = Arc::new(Courier { webhook, http, shared: shared.clone() });
        Ok((Outbox { queue: Some(queue), shared }, Some(courier.run(events))))
    }

    /// Whether the events are sent anywhere (if not, the ledger need not make them).
    pub(super) fn sends(&self) -> bool {
        self.queue.is_some()
    }

    /// Queues an event for sending (never blocks: called with the ledger locked).
    pub(super) fn post(&self, event: Event) {
        let Some(queue) = &self.queue else { return };
        lock(&self.shared.log).stats.events += 1;
        // Fails only once the sending task has ended, with the gateway.
        let _ = queue.send(event);
    }

    pub(super) fn plan(&self) -> EventPlan {
        *lock(&self.shared.plan)
    }

    /// Applies to the events made from now on (and to those still queued).
    pub(super) fn set_plan(&self, plan: EventPlan) {
        *lock(&self.shared.plan) = plan;
    }

    pub(super) fn stats(&self) -> EventStats {
        lock(&self.shared.log).stats
    }

    /// Every event sent, in the order of their first attempts.
    pub(super) fn sent(&self) -> Vec<Sent> {
        let log = lock(&self.shared.log);
        log.sent.iter().filter_map(|id| log.dispatched.get(id)).cloned().collect()
    }
}

/// The task that sends the events, and what each delivery needs.
struct Courier {
    webhook: Webhook,
    http: reqwest::Client,
    shared: Arc<Shared>,
}

impl Courier {
    /// Takes the events from the queue, in the order made, and starts their deliveries, until the
    /// gateway stops (dropping this future ends every delivery too).
    async fn run(self: Arc<Courier>, mut queue: mpsc::UnboundedReceiver<Event>) {
        let mut deliveries = JoinSet::new();
        while let Some(first) = queue.recv().await {
            let plan = *lock(&self.shared.plan);
            let mut batch = vec![first];
            if plan.shuffle {
                let closes = Instant::from_std(batch[0].made_at + SHUFFLE_WINDOW);
                while let Ok(Some(event)) = tokio::time::timeout_at(closes, queue.recv()).await {
                    batch.push(event);
                }
                event_plan::shuffle(&mut batch, &mut rand::rng());
            }
            for event in batch {
                tokio::time::sleep_until(Instant::from_std(event.made_at + plan.delay)).await;
                let copies = plan.copies(&mut rand::rng());
                lock(&self.shared.log).dispatched(&event, copies);
                let event = Arc::new(event);
                let mut answered = Vec::with_capacity(usize::from(copies));
                for _ in 0..copies {
                    let (first_answered, answer) = oneshot::channel();
                    deliveries.spawn(self.clone().deliver(event.clone(), first_answered));
                    answered.push(answer);
                }
                let _ = tokio::time::timeout(IN_ORDER_WAIT, join_all(answered)).await;
                while deliveries.try_join_next().is_some() {}
            }
        }
    }

    /// One delivery of `event`: attempts until one is acknowledged, waiting longer after each
    /// failure, up to the maximum. Says when its first attempt has been answered (or failed).
    async fn deliver(self: Arc<Courier>, event: Arc<Event>, first_answered: oneshot::Sender<()>) {
        let mut first_answered = Some(first_answered);
        let mut waits = backoff(self.webhook.first_retry, self.webhook.max_retry);
        loop {
            let acknowledged = self.attempt(&event).await;
            if let Some(answered) = first_answered.take() {
                let _ = answered.send(());
            }
            if acknowledged {
                return;
            }
            tokio::time::sleep(waits.next().expect("the waits never end")).await;
        }
    }

    /// One `POST` of `event`, signed now. Whether the receiver acknowledged it.
    async fn attempt(&self, event: &Event) -> bool {
        lock(&self.shared.log).attempted(&event.id);
        let header = signature::sign(&self.webhook.secrets, unix_now(), &event.body);
        let answer = self
            .http
            .post(self.webhook.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, header)
            .body(event.body.clone())
            .send()
            .await;
        let failure = match answer {
            Ok(response) if response.status().is_success() => None,
            Ok(response) => Some(format!("the receiver answered {}", response.status())),
            Err(error) if error.is_timeout() => {
                Some(format!("no answer within {} ms", self.webhook.attempt_timeout.as_millis()))
            }
            Err(error) => Some(error.without_url().to_string()),
        };
        match failure {
            None => {
                lock(&self.shared.log).acknowledged(&event.id);
                if self.shared.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("the gateway's events are acknowledged again");
                }
                true
            }
            Some(failure) => {
                tracing::debug!(event.id = %event.id, %failure, "an event was not acknowledged; it will be sent again");
                if !self.shared.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        url = %self.webhook.shown_url(),
                        %failure,
                        max_wait_s = self.webhook.max_retry.as_secs(),
                        "the gateway's events are not acknowledged: each is sent again, with backoff, until it is"
                    );
                }
                false
            }
        }
    }
}

/// The waits between the attempts of a delivery: `first`, doubling, then `max` for ever.
fn backoff(first: Duration, max: Duration) -> impl Iterator<Item = Duration> {
    std::iter::successors(Some(first.min(max)), move |wait| Some(wait.saturating_mul(2).min(max)))
}

/// Unix seconds now: the `t` of a signature.
fn unix_now() -> i64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX)
}

/// Locks without giving up on poisoning: every critical section leaves its state consistent.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_waits_double_from_half_a_second_to_half_a_minute_and_stay_there() {
        let seconds: Vec<f64> =
            backoff(DEFAULT_FIRST_RETRY, DEFAULT_MAX_RETRY).take(9).map(|wait| wait.as_secs_f64()).collect();
        assert_eq!(seconds, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]);
    }

    #[test]
    fn a_url_is_shown_without_its_password() {
        let webhook = Webhook::new("http://user:hunter2@example.com/hook".parse().unwrap(), Vec::new());
        assert_eq!(webhook.shown_url().as_str(), "http://user:...@example.com/hook");
        assert!(!format!("{webhook:?}").contains("whsec"), "and a secret never");
    }

    #[test]
    fn a_made_secret_is_long_and_new_each_time() {
        let (first, second) = (new_webhook_secret(), new_webhook_secret());
        assert!(first.starts_with("whsec_") && first.len() == 38, "{first}");
        assert!(first[6..].chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(first, second);
    }
}
