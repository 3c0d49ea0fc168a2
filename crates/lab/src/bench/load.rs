//! The load generator: `clients` tasks sharing one keep-alive HTTP client, each sending one
//! request after another until the deadline, each keeping its own latency histogram, merged at
//! the end.
//!
//! It is kept light, since on a small machine its CPU competes with the service's: request bodies
//! are serialised once, and answers are read only as far as the checks need.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use bytes::Bytes;
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use reqwest::{StatusCode, Url};
use tokio::task::JoinSet;
use tokio::time::Instant;
use uuid::Uuid;

use payments_client::{RetryPolicy, parse_retry_after};

/// A payment any gateway of ours charges.
pub const PAYMENT: &str = r#"{"amount": 1000, "currency": "usd", "source": "tok_visa"}"#;

/// The same payment, only authorized: what the `capture` scenario captures.
pub const AUTHORIZATION: &str = r#"{"amount": 1000, "currency": "usd", "source": "tok_visa", "capture": false}"#;

/// Requests sent at once with one key in the `duplicates` scenario: enough that most groups race.
pub const GROUP_SIZE: usize = 4;

/// What each request of the `refund` scenario takes back, in minor units: a sliver of a
/// [`PAYMENT`], so that each payment made beforehand takes a thousand of them.
pub const REFUND_AMOUNT: u64 = 1;

/// Latencies above this are recorded as this (a request that slow has failed anyway).
pub const MAX_LATENCY_US: u64 = 60_000_000;

/// A request's timeout: far above any latency a healthy run sees.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What a scenario sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// A new payment per request: a fresh key each time.
    New,
    /// Replays of finished payments, picked at random among keys made beforehand.
    Replay,
    /// Groups of [`GROUP_SIZE`] concurrent requests with one fresh key, then one more with it.
    Duplicates,
    /// A new refund per request, of part of a payment made beforehand: each client task refunds
    /// payments of its own in turn, so that no two requests in flight wait for one payment's lock.
    Refund,
    /// An authorization, then its capture, each with a fresh key: one pair per request counted,
    /// its latency the two together.
    Capture,
}

/// Keys of finished payments, and the body each was answered with: what `replay` replays, and
/// (by the ids in the bodies) what `refund` refunds.
pub type Finished = Arc<Vec<(String, Bytes)>>;

/// What a run found.
pub struct Load {
    pub requests: u64,
    pub elapsed: Duration,
    /// Microseconds from sending a request to having read its answer.
    pub latency_us: Histogram<u64>,
    /// Answers by status code; `transport_error` for requests that got none.
    pub statuses: BTreeMap<String, u64>,
    /// Answers that were not the expected success (an overloaded service's `503`, say).
    pub errors: u64,
    /// Answers that break the idempotency contract: a replay that differs from the stored
    /// answer, a fresh key answered as a replay, two payments for one key.
    pub violations: u64,
    /// `duplicates`: groups sent, each of which must have made exactly one payment.
    pub groups: u64,
}

/// Sends the load: one HTTP client, many tasks.
#[derive(Clone)]
pub struct Driver {
    http: reqwest::Client,
    url: Url,
    refunds_url: Url,
    api_key: Arc<str>,
    body: Bytes,
}

/// One answer.
struct Answer {
    status: Option<StatusCode>,
    /// The wait the service asked for (`Retry-After`), if any.
    retry_after: Option<Duration>,
    replayed: bool,
    body: Bytes,
}

impl Driver {
    /// A driver of `POST <base>/v1/payments` (and `/v1/refunds`) with `api_key`, keeping up to
    /// `clients` connections.
    pub fn new(base: &Url, api_key: &str, clients: usize) -> anyhow::Result<Driver> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(clients)
            .tcp_nodelay(true)
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        let url = base.join("/v1/payments").context("the service's URL")?;
        let refunds_url = base.join("/v1/refunds").context("the service's URL")?;
        let body = Bytes::from_static(PAYMENT.as_bytes());
        Ok(Driver { http, url, refunds_url, api_key: api_key.into(), body })
    }

    /// A payment request.
    async fn post(&self, key: &str) -> Answer {
        self.post_to(&self.url, key, self.body.clone()).await
    }

    async fn post_to(&self, url: &Url, key: &str, body: Bytes) -> Answer {
        let sent = self
            .http
            .post(url.clone())
            .bearer_auth(&*self.api_key)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await;
        let Ok(response) = sent else {
            return Answer { status: None, retry_after: None, replayed: false, body: Bytes::new() };
        };
        let status = response.status();
        let replayed = response.headers().get("Idempotent-Replayed").is_some_and(|value| value == "true");
        let retry_after = response
            .headers()
            .get("Retry-After")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| parse_retry_after(value, SystemTime::now()));
        match response.bytes().await {
            Ok(body) => Answer { status: Some(status), retry_after, replayed, body },
            Err(_) => Answer { status: None, retry_after: None, replayed: false, body: Bytes::new() },
        }
    }

    /// A payment with `key`, sent until it is answered `201` as a client would send it: again with
    /// the same key after an answer that is no outcome (none, `409` in flight, `503`), after the
    /// client's wait ([`RetryPolicy`]: at least the `Retry-After` asked for, and no attempt after its
    /// deadline). On a machine the load itself starves, a payment made
    /// beforehand now and then waits too long for the gateway or a connection, and one such
    /// answer must not end the run.
    async fn paid(&self, key: &str) -> anyhow::Result<Answer> {
        let (policy, started) = (RetryPolicy::default(), Instant::now());
        let mut attempt = 1;
        loop {
            let answer = self.post(key).await;
            let no_outcome =
                matches!(answer.status, None | Some(StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE));
            let wait = (no_outcome && attempt < policy.max_attempts)
                .then(|| policy.next_wait(attempt, started.elapsed(), answer.retry_after, &mut rand::rng()))
                .flatten();
            match (answer.status, wait) {
                (Some(StatusCode::CREATED), _) => return Ok(answer),
                (_, Some(wait)) => tokio::time::sleep(wait).await,
                (status, None) => anyhow::bail!("making a payment to replay: answered {status:?} ({attempt} attempts)"),
            }
            attempt += 1;
        }
    }

    /// Makes `count` finished payments, `clients` at a time, for the `replay` and `refund`
    /// scenarios.
    pub async fn finished_payments(&self, count: usize, clients: usize) -> anyhow::Result<Finished> {
        let next = Arc::new(AtomicU64::new(0));
        let mut tasks = JoinSet::new();
        for _ in 0..clients.min(count) {
            let (driver, next) = (self.clone(), next.clone());
            tasks.spawn(async move {
                let mut made = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < count as u64 {
                    let key = Uuid::new_v4().to_string();
                    let answer = driver.paid(&key).await?;
                    made.push((key, answer.body));
                }
                Ok(made)
            });
        }
        let made: Vec<_> = tasks.join_all().await.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Arc::new(made.into_iter().flatten().collect()))
    }

    /// Runs `scenario` with `clients` requests in flight until `duration` has passed; `sent`
    /// counts requests as they complete, for the progress display.
    pub async fn run(
        &self,
        scenario: Scenario,
        finished: Option<Finished>,
        clients: usize,
        duration: Duration,
        sent: Arc<AtomicU64>,
    ) -> Load {
        let start = Instant::now();
        let deadline = start + duration;
        let mut tasks = JoinSet::new();
        // In `duplicates` every task has a group in flight, so fewer tasks keep as many requests
        // in flight.
        let tasks_needed = match scenario {
            Scenario::Duplicates => clients.div_ceil(GROUP_SIZE),
            _ => clients,
        };
        for task in 0..tasks_needed {
            let (driver, finished, sent) = (self.clone(), finished.clone(), sent.clone());
            tasks.spawn(async move {
                let mut tally = Tally::new();
                let mut rng = SmallRng::from_os_rng();
                let refunds = match scenario {
                    Scenario::Refund => {
                        let finished = finished.as_deref().expect("refund needs finished payments");
                        refund_bodies(finished, task, tasks_needed)
                    }
                    _ => Vec::new(),
                };
                let mut next_refund = (0..refunds.len()).cycle();
                while Instant::now() < deadline {
                    match scenario {
                        Scenario::New => driver.new_payment(&mut tally).await,
                        Scenario::Replay => {
                            let finished = finished.as_ref().expect("replay needs finished payments");
                            let (key, stored) = &finished[rng.random_range(0..finished.len())];
                            driver.replay(&mut tally, key, stored).await
                        }
                        Scenario::Duplicates => driver.duplicate_group(&mut tally).await,
                        Scenario::Refund => match next_refund.next() {
                            Some(index) => driver.refund(&mut tally, refunds[index].clone()).await,
                            None => break,
                        },
                        Scenario::Capture => driver.authorize_and_capture(&mut tally).await,
                    }
                    sent.fetch_add(tally.take_unreported(), Ordering::Relaxed);
                }
                tally
            });
        }
        let mut total = Tally::new();
        for tally in tasks.join_all().await {
            total.merge(tally);
        }
        total.into_load(start.elapsed())
    }

    async fn timed_post(&self, tally: &mut Tally, key: &str) -> Answer {
        let start = Instant::now();
        let answer = self.post(key).await;
        tally.record(start.elapsed(), &answer);
        answer
    }

    async fn new_payment(&self, tally: &mut Tally) {
        let answer = self.timed_post(tally, &Uuid::new_v4().to_string()).await;
        // Any success: the bare reference endpoint answers `200`, the service `201`.
        match (answer.status, answer.replayed) {
            (Some(status), false) if status.is_success() => {}
            (Some(status), true) if status.is_success() => tally.violations += 1,
            _ => tally.errors += 1,
        }
    }

    /// A new refund, with a fresh key: a success, not a replay.
    async fn refund(&self, tally: &mut Tally, body: Bytes) {
        let start = Instant::now();
        let answer = self.post_to(&self.refunds_url, &Uuid::new_v4().to_string(), body).await;
        tally.record(start.elapsed(), &answer);
        match (answer.status, answer.replayed) {
            (Some(StatusCode::CREATED), false) => {}
            (Some(StatusCode::CREATED), true) => tally.violations += 1,
            _ => tally.errors += 1,
        }
    }

    /// An authorization and its capture, each with a fresh key: `201` then `200`, neither a replay.
    async fn authorize_and_capture(&self, tally: &mut Tally) {
        let start = Instant::now();
        let authorized =
            self.post_to(&self.url, &Uuid::new_v4().to_string(), Bytes::from_static(AUTHORIZATION.as_bytes())).await;
        let id = match (authorized.status, authorized.replayed) {
            (Some(StatusCode::CREATED), false) => serde_json::from_slice::<serde_json::Value>(&authorized.body)
                .ok()
                .and_then(|payment| payment["id"].as_str().map(str::to_owned)),
            _ => None,
        };
        let capture_url = id.and_then(|id| self.url.join(&format!("payments/{id}/capture")).ok());
        let Some(capture_url) = capture_url else {
            tally.record(start.elapsed(), &authorized);
            tally.errors += 1;
            return;
        };
        let captured = self.post_to(&capture_url, &Uuid::new_v4().to_string(), Bytes::from_static(b"{}")).await;
        tally.record(start.elapsed(), &captured);
        match (captured.status, captured.replayed) {
            (Some(StatusCode::OK), false) => {}
            (Some(StatusCode::OK), true) => tally.violations += 1,
            _ => tally.errors += 1,
        }
    }

    async fn replay(&self, tally: &mut Tally, key: &str, stored: &Bytes) {
        let answer = self.timed_post(tally, key).await;
        match answer.status {
            Some(StatusCode::CREATED) if answer.replayed && answer.body == *stored => {}
            Some(StatusCode::CREATED) => tally.violations += 1,
            _ => tally.errors += 1,
        }
    }

    /// Sends [`GROUP_SIZE`] requests with one key at once, then one more once all are answered.
    /// Each of the first must be the payment (`201`), a replay of it, or `409` (in flight); the
    /// last must be a replay, byte for byte, of the one payment they made.
    async fn duplicate_group(&self, tally: &mut Tally) {
        let key = Uuid::new_v4().to_string();
        let mut racing = JoinSet::new();
        for _ in 0..GROUP_SIZE {
            let (driver, key) = (self.clone(), key.clone());
            racing.spawn(async move {
                let start = Instant::now();
                let answer = driver.post(&key).await;
                (start.elapsed(), answer)
            });
        }
        let mut created: Vec<Answer> = Vec::new();
        for (latency, answer) in racing.join_all().await {
            tally.record(latency, &answer);
            match answer.status {
                Some(StatusCode::CREATED) => created.push(answer),
                Some(StatusCode::CONFLICT) => {}
                _ => tally.errors += 1,
            }
        }
        tally.groups += 1;
        let last = self.timed_post(tally, &key).await;
        let fresh = created.iter().filter(|answer| !answer.replayed).count();
        let one_body = created.windows(2).all(|pair| pair[0].body == pair[1].body);
        let last_is_a_replay_of_it = match created.first() {
            Some(first) => last.status == Some(StatusCode::CREATED) && last.replayed && last.body == first.body,
            // Nothing was created while they raced (each answer was an error): the last request
            // finishes the payment or replays it.
            None => last.status == Some(StatusCode::CREATED),
        };
        if fresh > 1 || !one_body || !last_is_a_replay_of_it {
            tally.violations += 1;
        }
    }
}

/// The bodies of the refunds task `task` of `tasks` sends, in turn: [`REFUND_AMOUNT`] of each
/// payment in `finished` that is its own (every `tasks`-th, from the `task`-th on).
fn refund_bodies(finished: &[(String, Bytes)], task: usize, tasks: usize) -> Vec<Bytes> {
    let payments = finished.iter().skip(task).step_by(tasks);
    let ids = payments.filter_map(|(_, body)| {
        serde_json::from_slice::<serde_json::Value>(body).ok()?["id"].as_str().map(str::to_owned)
    });
    ids.map(|id| Bytes::from(format!(r#"{{"payment": "{id}", "amount": {REFUND_AMOUNT}}}"#))).collect()
}

/// One task's findings.
struct Tally {
    latency_us: Histogram<u64>,
    statuses: BTreeMap<String, u64>,
    requests: u64,
    unreported: u64,
    errors: u64,
    violations: u64,
    groups: u64,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            latency_us: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds"),
            statuses: BTreeMap::new(),
            requests: 0,
            unreported: 0,
            errors: 0,
            violations: 0,
            groups: 0,
        }
    }

    fn record(&mut self, latency: Duration, answer: &Answer) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.latency_us.saturating_record(micros.clamp(1, MAX_LATENCY_US));
        let status = answer.status.map_or_else(|| "transport_error".to_owned(), |status| status.as_str().to_owned());
        *self.statuses.entry(status).or_default() += 1;
        self.requests += 1;
        self.unreported += 1;
    }

    /// Requests recorded since the last call.
    fn take_unreported(&mut self) -> u64 {
        std::mem::take(&mut self.unreported)
    }

    fn merge(&mut self, other: Tally) {
        self.latency_us.add(&other.latency_us).expect("histograms with the same bounds");
        for (status, count) in other.statuses {
            *self.statuses.entry(status).or_default() += count;
        }
        self.requests += other.requests;
        self.errors += other.errors;
        self.violations += other.violations;
        self.groups += other.groups;
    }

    fn into_load(self, elapsed: Duration) -> Load {
        Load {
            requests: self.requests,
            elapsed,
            latency_us: self.latency_us,
            statuses: self.statuses,
            errors: self.errors,
            violations: self.violations,
            groups: self.groups,
        }
    }
}

#[cfg(test)]
mod tests {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    use super::*;

    #[tokio::test]
    async fn a_payment_made_beforehand_is_sent_again_with_its_key_until_it_is_made() {
        let service = MockServer::start().await;
        let payments = || Mock::given(method("POST")).and(path("/v1/payments"));
        payments().respond_with(ResponseTemplate::new(503)).up_to_n_times(1).expect(1).mount(&service).await;
        payments().respond_with(ResponseTemplate::new(201).set_body_string("{}")).expect(1).mount(&service).await;
        let driver = Driver::new(&Url::parse(&service.uri()).unwrap(), "sk_test", 1).unwrap();

        let made = driver.finished_payments(1, 1).await.unwrap();

        assert_eq!(made.len(), 1);
        let sent = service.received_requests().await.unwrap();
        let keys: Vec<&str> = sent.iter().map(|request| request.headers["Idempotency-Key"].to_str().unwrap()).collect();
        assert_eq!(keys, [made[0].0.as_str(); 2], "one key, twice");
    }

    #[tokio::test]
    async fn a_payment_refused_ends_the_run_at_once() {
        let service = MockServer::start().await;
        Mock::given(method("POST")).respond_with(ResponseTemplate::new(422)).expect(1).mount(&service).await;
        let driver = Driver::new(&Url::parse(&service.uri()).unwrap(), "sk_test", 1).unwrap();

        let refused = driver.finished_payments(1, 1).await.map(drop).unwrap_err();

        assert!(refused.to_string().contains("422"), "{refused}");
    }
}
