//! A reference client for `POST /v1/payments`: the other half of the idempotency contract.
//!
//! What it does, and why:
//! - one idempotency key per payment, made once (a UUIDv4) and sent with every attempt, so a
//!   retry is the same request and the server charges at most once however many arrive;
//! - it retries what may succeed on another try: no answer at all (connection refused or lost, a
//!   timeout), `409` (the key's request is still running), `5xx` (`503` above all: the outcome
//!   is not known yet), and `408` and `429`, which speak of the request's delivery, not of the
//!   request, waiting as [`RetryPolicy`] says and never less than `Retry-After`;
//! - it never retries a definitive answer: `2xx`, `402` (declined), any other `4xx`, and a stored
//!   `5xx` (one marked `Idempotent-Replayed`, or `gateway-rejected`, which is stored), since the
//!   same key gets the same answer again;
//! - given several base URLs, it sends each attempt to the next one, so a retry goes around a
//!   server that has gone down, and each payment starts where the last one did not.
//!
//! `payments pay` is this module on the command line; `payments chaos` drives it under faults.
//!
//! ```no_run
//! use payments::client::{Client, NewPayment, Outcome, RetryPolicy};
//!
//! # async fn pay() -> anyhow::Result<()> {
//! let client = Client::new(&["http://127.0.0.1:8080".parse()?], "sk_test_demo", RetryPolicy::default())?;
//! let payment = NewPayment { amount: 1000, currency: "usd".into(), source: "tok_visa".into(), description: None };
//! // Keep the key with the order: asked again with it, the service answers what it answered.
//! let key = Client::new_key();
//! let finished = client.pay(&key, &payment, |attempt| eprintln!("{attempt}")).await;
//! match finished.outcome {
//!     Outcome::Paid(answer) => println!("paid: {}", String::from_utf8_lossy(&answer.body)),
//!     Outcome::Declined(_) => println!("declined"),
//!     Outcome::Rejected(answer) => println!("refused: {answer}"),
//!     Outcome::GaveUp { .. } => println!("not known yet: ask again later with key {key}"),
//! }
//! # Ok(())
//! # }
//! ```

mod retry;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use reqwest::header::RETRY_AFTER;
use reqwest::{StatusCode, Url};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

pub use retry::{
    DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_BASE_DELAY, DEFAULT_DEADLINE, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_DELAY,
    RetryPolicy, parse_retry_after,
};

/// The header that marks a stored answer replayed for a retry.
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";

/// A payment to make, as `POST /v1/payments` takes it.
#[derive(Debug, Clone, Serialize)]
pub struct NewPayment {
    pub amount: u64,
    pub currency: String,
    pub source: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A client of one deployment, reachable at one or more base URLs.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    endpoints: Vec<Url>,
    api_key: String,
    policy: RetryPolicy,
    /// Where the next payment's first attempt goes (shared by clones).
    next_endpoint: Arc<AtomicUsize>,
}

/// An answer the server gave to one attempt.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
    /// Whether the server marked it as a stored answer replayed.
    pub replayed: bool,
    pub retry_after: Option<Duration>,
    /// The last segment of a problem body's `type` (`gateway-unavailable`), if it is one.
    pub problem: Option<String>,
}

/// An attempt that got no answer. The request may or may not have reached the server; with the
/// same key, trying again is safe either way.
#[derive(Debug, Clone)]
pub enum NoAnswer {
    /// No connection could be made.
    Connect(String),
    /// No answer within the attempt's timeout.
    TimedOut(Duration),
    /// The connection failed after it was made (the server died mid-request, say).
    Lost(String),
}

/// One attempt: where it went, what came back, and what the client does next.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// 1 for the first.
    pub number: u32,
    pub endpoint: Url,
    pub result: Result<Answer, NoAnswer>,
    pub next: Next,
}

/// What follows an attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Next {
    /// It got a definitive answer.
    Done,
    RetryIn(Duration),
    GiveUp(GaveUp),
}

/// Why the client stopped without a definitive answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GaveUp {
    Attempts,
    Deadline,
}

/// How a payment request ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// `2xx`: the payment.
    Paid(Answer),
    /// `402`: declined; the failed payment is in the problem body.
    Declined(Answer),
    /// Any other definitive answer: the request was refused, or the gateway rejected the charge.
    Rejected(Answer),
    /// No definitive answer before the deadline or the last attempt. The payment may still be
    /// made (the server finishes what it started): retry later with the same key.
    GaveUp { why: GaveUp, last: Result<Answer, NoAnswer> },
}

/// A payment request that has ended.
#[derive(Debug, Clone)]
pub struct Finished {
    pub key: String,
    pub attempts: u32,
    pub outcome: Outcome,
}

impl Client {
    /// A client of the deployment at `base_urls` (at least one), paying with `api_key`.
    pub fn new(base_urls: &[Url], api_key: &str, policy: RetryPolicy) -> anyhow::Result<Client> {
        anyhow::ensure!(!base_urls.is_empty(), "a client needs at least one base URL");
        let endpoints = base_urls
            .iter()
            .map(|base| {
                let mut base = base.clone();
                if !base.path().ends_with('/') {
                    base.set_path(&format!("{}/", base.path()));
                }
                base.join("v1/payments")
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Redirects are answers too: a payment is never re-sent somewhere it was not addressed to.
        let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
        Ok(Client { http, endpoints, api_key: api_key.to_owned(), policy, next_endpoint: Arc::default() })
    }

    /// The same client with another policy (sharing its connections).
    pub fn with_policy(&self, policy: RetryPolicy) -> Client {
        Client { policy, ..self.clone() }
    }

    /// A new idempotency key: one per payment, kept for all its retries.
    pub fn new_key() -> String {
        uuid::Uuid::new_v4().to_string()
    }

    /// Pays, retrying with the same `key` until a definitive answer, the deadline or the last
    /// attempt. `observe` sees every attempt as it ends, before the wait that may follow it.
    pub async fn pay(&self, key: &str, payment: &NewPayment, observe: impl FnMut(&Attempt)) -> Finished {
        self.pay_with(key, payment, &[], observe).await
    }

    /// As [`Client::pay`], with extra headers on the first attempt only (such as a test's
    /// fault-injection header, which a retry must not repeat).
    pub async fn pay_with(
        &self,
        key: &str,
        payment: &NewPayment,
        first_attempt_headers: &[(&str, &str)],
        mut observe: impl FnMut(&Attempt),
    ) -> Finished {
        let started = Instant::now();
        let first_endpoint = self.next_endpoint.fetch_add(1, Ordering::Relaxed);
        let mut number = 0;
        loop {
            number += 1;
            let endpoint = &self.endpoints[(first_endpoint + number as usize - 1) % self.endpoints.len()];
            let left = self.policy.deadline.saturating_sub(started.elapsed());
            let headers = if number == 1 { first_attempt_headers } else { &[] };
            let result = self.send(endpoint, key, payment, headers, self.policy.attempt_timeout.min(left)).await;
            let next = match &result {
                Ok(answer) if answer.is_definitive() => Next::Done,
                _ if number >= self.policy.max_attempts => Next::GiveUp(GaveUp::Attempts),
                _ => {
                    let after = result.as_ref().ok().and_then(|answer| answer.retry_after);
                    let wait = self.policy.delay(number, after, &mut rand::rng());
                    // Checked: a server may ask for any wait at all.
                    match started.elapsed().checked_add(wait).is_some_and(|then| then < self.policy.deadline) {
                        true => Next::RetryIn(wait),
                        false => Next::GiveUp(GaveUp::Deadline),
                    }
                }
            };
            let attempt = Attempt { number, endpoint: endpoint.clone(), result, next };
            observe(&attempt);
            let outcome = match (next, attempt.result) {
                (Next::RetryIn(wait), _) => {
                    tokio::time::sleep(wait).await;
                    continue;
                }
                (Next::GiveUp(why), last) => Outcome::GaveUp { why, last },
                (Next::Done, Ok(answer)) => Outcome::of_definitive(answer),
                (Next::Done, Err(_)) => unreachable!("only an answer can be definitive"),
            };
            return Finished { key: key.to_owned(), attempts: number, outcome };
        }
    }

    /// One attempt.
    async fn send(
        &self,
        endpoint: &Url,
        key: &str,
        payment: &NewPayment,
        headers: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Answer, NoAnswer> {
        let mut request = self
            .http
            .post(endpoint.clone())
            .bearer_auth(&self.api_key)
            .header("Idempotency-Key", key)
            .json(payment)
            .timeout(timeout);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let no_answer = |error: reqwest::Error| match () {
            _ if error.is_timeout() => NoAnswer::TimedOut(timeout),
            _ if error.is_connect() => NoAnswer::Connect(root_cause(&error)),
            _ => NoAnswer::Lost(root_cause(&error)),
        };
        let response = request.send().await.map_err(no_answer)?;
        let status = response.status();
        let header = |name| response.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_owned);
        let replayed = header(REPLAYED_HEADER).is_some_and(|value| value == "true");
        let retry_after = header(RETRY_AFTER.as_str()).and_then(|value| parse_retry_after(&value, SystemTime::now()));
        let body = response.bytes().await.map_err(no_answer)?;
        let problem = problem_slug(&body);
        Ok(Answer { status, body, replayed, retry_after, problem })
    }
}

impl Answer {
    /// Whether this is the request's definitive answer, which the same key would only get again.
    /// Not so: `409` (the key's request is still running), `408` and `429` (about the request's
    /// delivery, not the request: a server that stalled mid-read answers `408` when it wakes, having
    /// done nothing), and a `5xx` that was not stored (a stored one is marked replayed, or is a
    /// `gateway-rejected`, which is always stored).
    pub fn is_definitive(&self) -> bool {
        let status = self.status;
        let stored = self.replayed || self.problem.as_deref() == Some("gateway-rejected");
        let about_delivery = [StatusCode::REQUEST_TIMEOUT, StatusCode::TOO_MANY_REQUESTS].contains(&status);
        !(status == StatusCode::CONFLICT || about_delivery || (status.is_server_error() && !stored))
    }
}

impl Outcome {
    /// What a definitive answer means.
    fn of_definitive(answer: Answer) -> Outcome {
        match answer.status {
            status if status.is_success() => Outcome::Paid(answer),
            StatusCode::PAYMENT_REQUIRED => Outcome::Declined(answer),
            _ => Outcome::Rejected(answer),
        }
    }
}

/// The last segment of a problem body's `type`.
fn problem_slug(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Head {
        #[serde(rename = "type")]
        type_uri: String,
    }
    let head: Head = serde_json::from_slice(body).ok()?;
    head.type_uri.rsplit('/').next().map(str::to_owned)
}

/// The innermost cause of an error: "Connection refused (os error 111)" rather than reqwest's
/// "error sending request for url (...)".
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

impl fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoAnswer::Connect(cause) => write!(f, "could not connect ({cause})"),
            NoAnswer::TimedOut(after) => write!(f, "no answer within {:.1} s", after.as_secs_f64()),
            NoAnswer::Lost(cause) => write!(f, "connection lost ({cause})"),
        }
    }
}

impl fmt::Display for Answer {
    /// `503 gateway-unavailable`, `201 Created`, `201 Created (replayed)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reason = self.status.canonical_reason().unwrap_or_default();
        let what = self.problem.as_deref().unwrap_or(reason);
        write!(f, "{} {what}", self.status.as_u16())?;
        if self.replayed {
            f.write_str(" (replayed)")?;
        }
        Ok(())
    }
}

impl fmt::Display for Attempt {
    /// `attempt 2: 503 gateway-unavailable, retrying in 1.3 s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attempt {}: ", self.number)?;
        match &self.result {
            Ok(answer) => write!(f, "{answer}")?,
            Err(no_answer) => write!(f, "{no_answer}")?,
        }
        match self.next {
            Next::Done => Ok(()),
            Next::RetryIn(wait) => write!(f, ", retrying in {:.1} s", wait.as_secs_f64()),
            Next::GiveUp(GaveUp::Attempts) => write!(f, ", giving up: that was the last attempt"),
            Next::GiveUp(GaveUp::Deadline) => write!(f, ", giving up: the deadline would pass before the next"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, problem: Option<&str>, replayed: bool) -> Result<Answer, NoAnswer> {
        Ok(Answer {
            status: StatusCode::from_u16(status).unwrap(),
            body: Bytes::new(),
            replayed,
            retry_after: None,
            problem: problem.map(str::to_owned),
        })
    }

    fn retried(result: Result<Answer, NoAnswer>) -> bool {
        !result.is_ok_and(|answer| answer.is_definitive())
    }

    #[test]
    fn what_may_succeed_next_time_is_retried_and_nothing_else() {
        assert!(retried(Err(NoAnswer::Connect("refused".into()))));
        assert!(retried(Err(NoAnswer::TimedOut(Duration::from_secs(1)))));
        assert!(retried(Err(NoAnswer::Lost("reset".into()))));
        assert!(retried(answer(409, Some("request-in-flight"), false)));
        assert!(retried(answer(503, Some("gateway-unavailable"), false)));
        assert!(retried(answer(500, Some("internal-error"), false)));
        assert!(retried(answer(502, None, false)));
        assert!(retried(answer(408, None, false)));
        assert!(retried(answer(429, None, false)));
        for status in [200, 201, 400, 401, 402, 404, 410, 413, 415, 422] {
            assert!(!retried(answer(status, None, false)), "{status}");
        }
        assert!(!retried(answer(502, Some("gateway-rejected"), false)));
        assert!(!retried(answer(502, None, true)));
    }

    #[test]
    fn an_attempt_reads_as_one_line() {
        let attempt = Attempt {
            number: 2,
            endpoint: "http://127.0.0.1:8080/v1/payments".parse().unwrap(),
            result: answer(503, Some("gateway-unavailable"), false),
            next: Next::RetryIn(Duration::from_millis(1_260)),
        };
        assert_eq!(attempt.to_string(), "attempt 2: 503 gateway-unavailable, retrying in 1.3 s");
    }

    #[test]
    fn problem_types_are_read_by_their_last_segment() {
        let body = br#"{"type":"https://payments.example/problems/card-declined","status":402}"#;
        assert_eq!(problem_slug(body).as_deref(), Some("card-declined"));
        assert_eq!(problem_slug(b"{\"id\":\"pay_1\"}"), None);
        assert_eq!(problem_slug(b"not json"), None);
    }
}
