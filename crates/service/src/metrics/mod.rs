//! What a process counts, served as `GET /metrics` in the Prometheus text format, on a listener
//! of its own (`PAYMENTS_METRICS_BIND`), never on the API's address: the figures are every
//! tenant's volumes.
//!
//! Two kinds of figures:
//! - **events this process saw**, counted as they happen (requests by idempotency outcome,
//!   payments finished, gateway calls, HTTP requests, worker runs): sum them over processes;
//! - **the state of the whole system**, read from PostgreSQL at each scrape ([`database`]:
//!   unfinished keys, keys needing attention, the outbox's backlog) and from this process's pool
//!   ([`pool`]): every process reports the same system-wide truth, so take one process's (or the
//!   maximum), never the sum.
//!
//! Each [`AppState`](crate::state::AppState) has a registry of its own, so that several
//! applications in one process (the tests) count apart. No label ever carries an account, a key or
//! a raw path: label values come from the closed sets below.

mod database;
mod pool;
mod tally;

pub use database::COUNT_CAP;
pub use tally::{AccountRequests, FLUSH_INTERVAL, flush_until_stopped, per_account, reap_request_counts};

use std::time::{Duration, Instant};

use prometheus::proto::MetricFamily;
use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

use uuid::Uuid;

use crate::db::{Pool, StoreError};
use tally::Tally;

/// The media type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Bucket bounds, in seconds, for HTTP requests and gateway calls alike: from a replay answered
/// from memory (well under a millisecond) to a gateway call that runs into its timeout.
const DURATION_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Declares the values of a label: a closed set, each with its text, and all of them in order.
macro_rules! label {
    (
        $(#[$meta:meta])*
        pub enum $name:ident { $( $(#[$variant_meta:meta])* $variant:ident = $text:literal, )+ }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $( $(#[$variant_meta])* $variant, )+ }

        impl $name {
            /// Every value, in the order declared.
            pub const ALL: &'static [$name] = &[$( $name::$variant, )+];

            /// The label's text.
            pub fn as_str(self) -> &'static str {
                match self { $( $name::$variant => $text, )+ }
            }
        }
    };
}

label! {
    /// How an `Idempotency-Key` request was taken in: the claim's verdict.
    pub enum KeyOutcome {
        /// A new key: the request runs from the start.
        Created = "created",
        /// An unfinished key taken up again (a retry after a crash, a timeout or an unknown outcome).
        Resumed = "resumed",
        /// A finished key: its stored answer is sent again.
        Replayed = "replayed",
        /// Another request holds the key (409).
        InFlight = "in_flight",
        /// The key was used with another request (422).
        KeyReused = "key_reused",
        /// The key's record was reaped; its payment remains (410).
        Expired = "expired",
    }
}

label! {
    /// Why a request that held its key answered without finishing (the key waits for a retry or
    /// the completer).
    pub enum Unfinished {
        /// The gateway gave no definitive answer, or could not be asked (503 `gateway-unavailable`).
        UnknownOutcome = "unknown_outcome",
        /// Another driver took the key over meanwhile.
        LockLost = "lock_lost",
        /// The database failed (503).
        Database = "database",
        /// A broken invariant (500).
        Internal = "internal",
    }
}

label! {
    /// What a gateway call was for.
    pub enum GatewayOperation {
        Charge = "charge",
        /// Looking a charge up by its key, before charging a resumed payment.
        Lookup = "lookup",
        Refund = "refund",
        /// Looking a refund up by its key, before refunding again.
        RefundLookup = "refund_lookup",
        /// Reading a refund by its id, to learn whether a pending one has settled.
        RefundRead = "refund_read",
        /// Capturing or cancelling an authorized charge.
        Capture = "capture",
        Cancel = "cancel",
        /// Reading a charge by its id, to learn what an earlier capture or cancel did.
        ChargeRead = "charge_read",
    }
}

label! {
    /// What a gateway call ended with.
    pub enum GatewayOutcome {
        Succeeded = "succeeded",
        /// A refund the gateway has not settled yet.
        Pending = "pending",
        /// A refund that failed (its money not moved).
        Failed = "failed",
        /// A look-up that found nothing under the key, or a read of a refund the gateway does not
        /// know.
        NotFound = "not_found",
        /// The card was declined, or the source is unknown (402 to our client).
        Declined = "declined",
        /// Refused for another definitive reason (502 to our client): for a refund, more than the
        /// charge has left, or an unknown charge.
        Rejected = "rejected",
        /// No definitive answer: a timeout, a connection error, a 5xx, a 409 or 429.
        Indeterminate = "indeterminate",
    }
}

label! {
    /// How a completer run on an abandoned key ended.
    pub enum CompleterOutcome {
        Finished = "finished",
        /// Not yet; tried again after its backoff.
        RetryLater = "retry_later",
        /// Its last attempt failed, or it waited too long for a process that reaches its gateway:
        /// the key now needs a person.
        GaveUp = "gave_up",
        /// Another gateway than this process's holds what it made: handed back untouched, for a
        /// process that reaches that gateway.
        HandedBack = "handed_back",
    }
}

label! {
    /// What became of an event the gateway sent.
    pub enum EventOutcome {
        /// Recorded, and applied: it settled a pending refund, or agreed with what was recorded.
        Applied = "applied",
        /// Received before: nothing changed.
        Duplicate = "duplicate",
        /// Refused: no valid signature, or a timestamp outside the tolerance. Nothing recorded.
        InvalidSignature = "invalid_signature",
        /// Older than what the service knows (a refund settled otherwise since): recorded, ignored.
        Stale = "stale",
        /// Says otherwise than what the service recorded: recorded, the key flagged for a person.
        Disagreement = "disagreement",
        /// About a key still unfinished: recorded, the key made due for the completer at once.
        Nudged = "nudged",
        /// About no request of this service's (another downstream key, an unknown type).
        Unknown = "unknown",
        /// About a request of this service's that the database does not show yet: nothing
        /// recorded, answered 503 so that the gateway sends it again.
        NotSeenYet = "not_seen_yet",
        /// Verified, but not readable (no retry would change that): kept for a person, its key
        /// flagged if it names one of ours.
        Unrecognized = "unrecognized",
    }
}

label! {
    /// The types of the gateway's events, as labelled (`other` for any type the service does not
    /// act on, `unverified` for an event refused before it was read).
    pub enum EventKind {
        ChargeSucceeded = "charge.succeeded",
        ChargeFailed = "charge.failed",
        ChargeCaptured = "charge.captured",
        ChargeCanceled = "charge.canceled",
        RefundSucceeded = "refund.succeeded",
        RefundFailed = "refund.failed",
        Other = "other",
        Unverified = "unverified",
    }
}

impl EventKind {
    /// The kind an event's `type` names: `other` for any the service does not act on.
    pub fn of(type_name: &str) -> EventKind {
        match type_name {
            "charge.succeeded" => EventKind::ChargeSucceeded,
            "charge.failed" => EventKind::ChargeFailed,
            "charge.captured" => EventKind::ChargeCaptured,
            "charge.canceled" => EventKind::ChargeCanceled,
            "refund.succeeded" => EventKind::RefundSucceeded,
            "refund.failed" => EventKind::RefundFailed,
            _ => EventKind::Other,
        }
    }
}

label! {
    /// How a settler run on a refund the gateway had left pending ended.
    pub enum SettlerOutcome {
        /// The gateway said it succeeded: settled so.
        Succeeded = "succeeded",
        /// The gateway said it failed: settled so, its amount refundable again.
        Failed = "failed",
        /// Still pending at the gateway: looked up again after its backoff.
        Pending = "pending",
        /// Its gateway says it has no such refund: something is badly wrong; looked up again.
        NotFound = "not_found",
        /// No readable answer, or one that does not say where the refund stands; looked up again.
        Unanswered = "unanswered",
        /// Another gateway answered at the address: its answer says nothing about the refund.
        WrongGateway = "wrong_gateway",
        /// Settled by another run meanwhile: nothing written.
        SettledMeanwhile = "settled_meanwhile",
        /// Not settled (any of the four above) after the look-ups that make it overdue: a person
        /// should look.
        Overdue = "overdue",
    }
}

label! {
    /// How an event's delivery ended.
    pub enum DeliveryOutcome {
        Delivered = "delivered",
        /// Failed; due again after its backoff.
        Failed = "failed",
        /// Failed for the last time.
        DeadLettered = "dead_lettered",
    }
}

label! {
    /// How an attempt to deliver an event to a merchant's webhook endpoint went.
    pub enum AttemptOutcome {
        Delivered = "delivered",
        /// Failed; due again on the schedule.
        Failed = "failed",
        /// Failed, and the schedule is spent: the delivery failed.
        GaveUp = "gave_up",
        /// The endpoint answered `410 Gone`, and is disabled.
        Gone = "gone",
    }
}

/// A process's counters and histograms, and the registry that serves them.
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    unfinished: IntCounterVec,
    payments: IntCounterVec,
    refunds: IntCounterVec,
    gateway_events: IntCounterVec,
    gateway_requests: IntCounterVec,
    gateway_duration: HistogramVec,
    http_requests: IntCounterVec,
    http_duration: HistogramVec,
    completer_runs: IntCounterVec,
    settler_runs: IntCounterVec,
    reaped: IntCounter,
    deliveries: IntCounterVec,
    webhook_attempts: IntCounterVec,
    webhook_attempt_duration: HistogramVec,
    /// Each account's requests by outcome since the last flush (see [`tally`]).
    tally: Tally,
    /// The system's state as last read from the database, and when. However often `/metrics` is
    /// asked (by whoever reaches the metrics listener), one scrape at a time reads the database, so
    /// scrapes can never hold more than one of the pool's connections; and scrapes that waited
    /// for a read that began after they arrived take its figures instead of reading again.
    state: tokio::sync::Mutex<Option<(Instant, Vec<MetricFamily>)>>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let counter = IntCounterVec::new(Opts::new(name, help), labels).expect("a valid counter");
            registry.register(Box::new(counter.clone())).expect("registered once");
            counter
        };
        let histogram = |name: &str, help: &str, labels: &[&str]| {
            let opts = HistogramOpts::new(name, help).buckets(DURATION_BUCKETS.to_vec());
            let histogram = HistogramVec::new(opts, labels).expect("a valid histogram");
            registry.register(Box::new(histogram.clone())).expect("registered once");
            histogram
        };
        let metrics = Metrics {
            requests: counter(
                "idempotency_requests_total",
                "Requests with an Idempotency-Key, by endpoint and how their key was taken in.",
                &["endpoint", "outcome"],
            ),
            unfinished: counter(
                "idempotency_requests_unfinished_total",
                "Requests that held their key but answered without finishing it, by endpoint and why.",
                &["endpoint", "reason"],
            ),
            payments: counter(
                "payments_total",
                "Payments finished (their final answer stored), by status and failure reason.",
                &["status", "reason"],
            ),
            refunds: counter(
                "refunds_total",
                "Refunds finished (their answer stored), by status then: pending ones settle later.",
                &["status"],
            ),
            gateway_events: counter(
                "gateway_events_total",
                "Events the gateway sent, by type and what became of them.",
                &["type", "outcome"],
            ),
            gateway_requests: counter(
                "gateway_requests_total",
                "Calls to the payment gateway, by operation and outcome.",
                &["operation", "outcome"],
            ),
            gateway_duration: histogram(
                "gateway_request_duration_seconds",
                "How long calls to the payment gateway took.",
                &["operation"],
            ),
            http_requests: counter(
                "http_requests_total",
                "HTTP requests answered, by method, route template and status.",
                &["method", "route", "status"],
            ),
            http_duration: histogram(
                "http_request_duration_seconds",
                "How long HTTP requests took to answer, by method and route template.",
                &["method", "route"],
            ),
            completer_runs: counter(
                "completer_runs_total",
                "Abandoned keys the completer took over, by how the run ended.",
                &["outcome"],
            ),
            settler_runs: counter(
                "settler_runs_total",
                "Look-ups of refunds the gateway had left pending, by how the run ended.",
                &["outcome"],
            ),
            reaped: IntCounter::new("reaper_keys_reaped_total", "Finished keys deleted after their retention.")
                .expect("a valid counter"),
            deliveries: counter(
                "outbox_deliveries_total",
                "Event deliveries to the webhook (or to the log), by outcome.",
                &["outcome"],
            ),
            webhook_attempts: counter(
                "webhook_attempts_total",
                "Attempts to deliver an event to a merchant's webhook endpoint, by outcome.",
                &["outcome"],
            ),
            webhook_attempt_duration: histogram(
                "webhook_attempt_duration_seconds",
                "How long attempts to deliver an event to a merchant's webhook endpoint took.",
                &[],
            ),
            tally: Tally::default(),
            state: tokio::sync::Mutex::default(),
            registry,
        };
        metrics.registry.register(Box::new(metrics.reaped.clone())).expect("registered once");
        // Every series of a closed set is there from the start, at 0: an alert on a rate then
        // sees the first event, and a dashboard shows a zero rather than nothing.
        for &kind in EventKind::ALL {
            for &outcome in EventOutcome::ALL {
                metrics.gateway_events.with_label_values(&[kind.as_str(), outcome.as_str()]);
            }
        }
        for &status in ["pending", "succeeded", "failed"].iter() {
            metrics.refunds.with_label_values(&[status]);
        }
        for &operation in GatewayOperation::ALL {
            for &outcome in GatewayOutcome::ALL {
                metrics.gateway_requests.with_label_values(&[operation.as_str(), outcome.as_str()]);
            }
        }
        for &outcome in CompleterOutcome::ALL {
            metrics.completer_runs.with_label_values(&[outcome.as_str()]);
        }
        for &outcome in SettlerOutcome::ALL {
            metrics.settler_runs.with_label_values(&[outcome.as_str()]);
        }
        for &outcome in DeliveryOutcome::ALL {
            metrics.deliveries.with_label_values(&[outcome.as_str()]);
        }
        for &outcome in AttemptOutcome::ALL {
            metrics.webhook_attempts.with_label_values(&[outcome.as_str()]);
        }
        metrics
    }

    /// Makes the series of an endpoint whose requests take keys, each at 0, as [`Metrics::new`]
    /// does for every closed set: `endpoint` is its label (see
    /// [`Endpoint::label`](crate::idempotency::Endpoint)), and the endpoints are the registry's.
    pub fn count_endpoint(&self, endpoint: &str) {
        for &outcome in KeyOutcome::ALL {
            self.requests.with_label_values(&[endpoint, outcome.as_str()]);
        }
        for &reason in Unfinished::ALL {
            self.unfinished.with_label_values(&[endpoint, reason.as_str()]);
        }
    }

    /// A request of `account_id` to `endpoint` (its label) was taken in: counted here, and in the
    /// account's tally.
    pub fn key(&self, account_id: Uuid, endpoint: &str, outcome: KeyOutcome) {
        self.requests.with_label_values(&[endpoint, outcome.as_str()]).inc();
        self.tally.count(account_id, outcome);
    }

    /// Adds the per-account tallies to the database (`payments stats` reads them there).
    pub async fn flush_tally(&self, pool: &Pool) -> Result<(), StoreError> {
        self.tally.flush(pool).await
    }

    pub fn unfinished(&self, endpoint: &str, reason: Unfinished) {
        self.unfinished.with_label_values(&[endpoint, reason.as_str()]).inc();
    }

    /// A payment's final answer was stored: `reason` is `none` for a success, else why it failed.
    pub fn payment_finished(&self, status: &str, reason: &str) {
        self.payments.with_label_values(&[status, reason]).inc();
    }

    /// An event the gateway sent, of `kind`, came to `outcome`.
    pub fn gateway_event(&self, kind: EventKind, outcome: EventOutcome) {
        self.gateway_events.with_label_values(&[kind.as_str(), outcome.as_str()]).inc();
    }

    /// A refund's answer was stored, with the refund `status` then.
    pub fn refund_finished(&self, status: &str) {
        self.refunds.with_label_values(&[status]).inc();
    }

    pub fn gateway_call(&self, operation: GatewayOperation, outcome: GatewayOutcome, took: Duration) {
        self.gateway_requests.with_label_values(&[operation.as_str(), outcome.as_str()]).inc();
        self.gateway_duration.with_label_values(&[operation.as_str()]).observe(took.as_secs_f64());
    }

    /// An HTTP request answered. `route` is the route's template (`/v1/payments/{id}`), never the
    /// raw path.
    pub fn http_request(&self, method: &str, route: &str, status: &str, took: Duration) {
        self.http_requests.with_label_values(&[method, route, status]).inc();
        self.http_duration.with_label_values(&[method, route]).observe(took.as_secs_f64());
    }

    pub fn completer_run(&self, outcome: CompleterOutcome) {
        self.completer_runs.with_label_values(&[outcome.as_str()]).inc();
    }

    pub fn settler_run(&self, outcome: SettlerOutcome) {
        self.settler_runs.with_label_values(&[outcome.as_str()]).inc();
    }

    pub fn reaped(&self, keys: usize) {
        self.reaped.inc_by(keys as u64);
    }

    pub fn webhook_attempt(&self, outcome: AttemptOutcome, took: Duration) {
        self.webhook_attempts.with_label_values(&[outcome.as_str()]).inc();
        self.webhook_attempt_duration.with_label_values(&[] as &[&str]).observe(took.as_secs_f64());
    }

    pub fn deliveries(&self, outcome: DeliveryOutcome, events: usize) {
        self.deliveries.with_label_values(&[outcome.as_str()]).inc_by(events as u64);
    }

    /// Everything, in the text format: this process's counters, its pool, and the system's state
    /// as the database has it now (left out, and said so in the log, if it cannot be read).
    pub async fn render(&self, pool: &Pool) -> String {
        let mut families = self.registry.gather();
        families.extend(pool::gather(pool));
        let asked = Instant::now();
        let mut state = self.state.lock().await;
        match &*state {
            Some((began, read)) if *began >= asked => families.extend(read.iter().cloned()),
            _ => {
                let began = Instant::now();
                match database::gather(pool).await {
                    Ok(read) => {
                        families.extend(read.iter().cloned());
                        *state = Some((began, read));
                    }
                    Err(error) => {
                        tracing::warn!(%error, "metrics: could not read the system's state from the database")
                    }
                }
            }
        }
        drop(state);
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut text = Vec::new();
        TextEncoder::new().encode(&families, &mut text).expect("the text format encodes any family");
        String::from_utf8(text).expect("the text format is UTF-8")
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
