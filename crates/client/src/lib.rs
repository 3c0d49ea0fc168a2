#![doc = include_str!("../README.md")]

mod answer;
pub mod listen;
mod request;
mod retry;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use rand::Rng;
use reqwest::header::RETRY_AFTER;
use reqwest::{StatusCode, Url};
use tokio::time::Instant;

use answer::problem_slug;
pub use answer::{Answer, KeySeen, NoAnswer};
pub use payments_wire::retry_after::parse_retry_after;
pub use request::{Endpoint, IdempotentRequest, NewCancel, NewCapture, NewPayment, NewRefund};
pub use retry::{
    DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_BASE_DELAY, DEFAULT_DEADLINE, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_DELAY,
    MIN_ATTEMPT_TIME, RetryPolicy,
};

/// The header that marks a stored answer replayed for a retry.
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";

/// A client of one deployment, reachable at one or more base URLs.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    /// Each ends with a `/`, so that an endpoint's path joins below it.
    bases: Vec<Url>,
    api_key: String,
    policy: RetryPolicy,
    /// Where the next request's first attempt goes (shared by clones).
    next_base: Arc<AtomicUsize>,
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
    /// The next attempt would start with less than [`MIN_ATTEMPT_TIME`] (or its timeout) left.
    Deadline,
    /// An answer not about the key (a `401`, a proxy's `404`) after the key may have been seen:
    /// it cannot tell whether the payment or refund was made, and asking again would get it again.
    NotAboutTheKey,
}

/// How a request ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// `2xx` with what the key made: the payment, or the refund (succeeded, or pending: the
    /// gateway settles it later, and `GET /v1/refunds/{id}` shows how).
    Succeeded(Answer),
    /// Refused about the key, and nothing made ([`Answer::is_refusal`]): the card was declined
    /// (`402`, the failed payment in the problem body); the refund's payment is not found (`404`),
    /// not refundable, already refunded or has less left than asked (`400`, with `refundable`); or
    /// the refund failed at the gateway (`2xx` with a `failed` refund).
    Declined(Answer),
    /// `410`: the key made a payment or refund, and its record has since expired; nothing was
    /// made now. The problem body names what it made ([`Answer::object_id`]), as it is now.
    Expired(Answer),
    /// Any other definitive answer: the key was used for another request (`422`), the gateway
    /// rejected the charge or refund (`502`), or, before the key could have been seen, the request
    /// was refused (a `4xx`) or reached something other than the service.
    Rejected(Answer),
    /// No definitive answer: the deadline, the last attempt, or an answer not about the key once
    /// the key may have been seen. The payment or refund may have been made, or may still be (the
    /// server finishes what it started): ask again later with the same key.
    GaveUp { why: GaveUp, last: Result<Answer, NoAnswer> },
}

/// A request that has ended.
#[derive(Debug, Clone)]
pub struct Finished {
    pub key: String,
    pub attempts: u32,
    pub outcome: Outcome,
}

impl Client {
    /// A client of the deployment at `base_urls` (at least one), sending `api_key`.
    pub fn new(base_urls: &[Url], api_key: &str, policy: RetryPolicy) -> anyhow::Result<Client> {
        anyhow::ensure!(!base_urls.is_empty(), "a client needs at least one base URL");
        let mut bases = Vec::with_capacity(base_urls.len());
        for base in base_urls {
            let mut base = base.clone();
            if !base.path().ends_with('/') {
                base.set_path(&format!("{}/", base.path()));
            }
            for endpoint in Endpoint::ALL {
                base.join(&endpoint.path().replace("{id}", "0"))?;
            }
            bases.push(base);
        }
        // Redirects are answers too: a request is never re-sent somewhere it was not addressed to.
        let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
        Ok(Client { http, bases, api_key: api_key.to_owned(), policy, next_base: Arc::default() })
    }

    /// The same client with another policy (sharing its connections).
    pub fn with_policy(&self, policy: RetryPolicy) -> Client {
        Client { policy, ..self.clone() }
    }

    /// A new idempotency key: one per request, kept for all its retries.
    pub fn new_key() -> String {
        uuid::Uuid::new_v4().to_string()
    }

    /// Sends `request` to its endpoint, retrying with the same `key` until a definitive answer,
    /// the deadline or the last attempt. `seen` says whether the key may have been sent before:
    /// [`KeySeen::No`] for one made for this request, [`KeySeen::Maybe`] for one an earlier run
    /// used. `observe` sees every attempt as it ends, before the wait that may follow it.
    pub async fn send<R: IdempotentRequest>(
        &self,
        key: &str,
        seen: KeySeen,
        request: &R,
        observe: impl FnMut(&Attempt),
    ) -> Finished {
        self.send_with(key, seen, request, &[], observe).await
    }

    /// As [`Client::send`], with extra headers on the first attempt only (such as a test's
    /// fault-injection header, which a retry must not repeat).
    pub async fn send_with<R: IdempotentRequest>(
        &self,
        key: &str,
        mut seen: KeySeen,
        request: &R,
        first_attempt_headers: &[(&str, &str)],
        mut observe: impl FnMut(&Attempt),
    ) -> Finished {
        let started = Instant::now();
        let first_base = self.next_base.fetch_add(1, Ordering::Relaxed);
        let mut number = 0;
        loop {
            number += 1;
            let base = &self.bases[(first_base + number as usize - 1) % self.bases.len()];
            let endpoint = base.join(&request.path()).expect("every endpoint joins every base, as checked in new");
            let left = self.policy.deadline.saturating_sub(started.elapsed());
            let headers = if number == 1 { first_attempt_headers } else { &[] };
            let timeout = self.policy.attempt_timeout.min(left);
            let result = self.attempt(&endpoint, key, request, headers, timeout).await;
            let next = next(&self.policy, number, started.elapsed(), &result, seen, &mut rand::rng());
            seen = seen.after(&result);
            let attempt = Attempt { number, endpoint, result, next };
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
    async fn attempt<R: IdempotentRequest>(
        &self,
        endpoint: &Url,
        key: &str,
        request: &R,
        headers: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Answer, NoAnswer> {
        let mut sending = self
            .http
            .post(endpoint.clone())
            .bearer_auth(&self.api_key)
            .header("Idempotency-Key", key)
            .json(request)
            .timeout(timeout);
        for (name, value) in headers {
            sending = sending.header(*name, *value);
        }
        let no_answer = |error: reqwest::Error| match () {
            _ if error.is_timeout() => NoAnswer::TimedOut(timeout),
            _ if error.is_connect() => NoAnswer::Connect(root_cause(&error)),
            _ => NoAnswer::Lost(root_cause(&error)),
        };
        let response = sending.send().await.map_err(no_answer)?;
        let status = response.status();
        let header = |name| response.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_owned);
        let replayed = header(REPLAYED_HEADER).is_some_and(|value| value == "true");
        let retry_after = header(RETRY_AFTER.as_str()).and_then(|value| parse_retry_after(&value, SystemTime::now()));
        let body = response.bytes().await.map_err(no_answer)?;
        let problem = problem_slug(&body);
        Ok(Answer { endpoint: R::ENDPOINT, status, body, replayed, retry_after, problem })
    }
}

/// What follows attempt `number`, `elapsed` since the first began, given what it got and whether
/// the key may have been seen before it.
fn next(
    policy: &RetryPolicy,
    number: u32,
    elapsed: Duration,
    result: &Result<Answer, NoAnswer>,
    seen: KeySeen,
    rng: &mut impl Rng,
) -> Next {
    match result {
        Ok(answer) if answer.is_definitive(seen) => return Next::Done,
        Ok(answer) if !answer.is_worth_retrying() => return Next::GiveUp(GaveUp::NotAboutTheKey),
        _ => {}
    }
    if number >= policy.max_attempts {
        return Next::GiveUp(GaveUp::Attempts);
    }
    let retry_after = result.as_ref().ok().and_then(|answer| answer.retry_after);
    match policy.next_wait(number, elapsed, retry_after, rng) {
        Some(wait) => Next::RetryIn(wait),
        None => Next::GiveUp(GaveUp::Deadline),
    }
}

impl Outcome {
    /// What a definitive answer means.
    fn of_definitive(answer: Answer) -> Outcome {
        match () {
            _ if !answer.is_about_the_key() => Outcome::Rejected(answer),
            _ if answer.is_refusal() => Outcome::Declined(answer),
            _ if answer.status.is_success() => Outcome::Succeeded(answer),
            _ if answer.status == StatusCode::GONE => Outcome::Expired(answer),
            _ => Outcome::Rejected(answer),
        }
    }
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
            Next::GiveUp(GaveUp::Deadline) => write!(f, ", giving up: the next would start too close to the deadline"),
            Next::GiveUp(GaveUp::NotAboutTheKey) => {
                // Only an answer gives up so.
                let done = self.result.as_ref().map_or("done it", |answer| answer.endpoint.done());
                write!(f, ", giving up: not an answer about this key, and an earlier attempt may have {done}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAYMENT: &str = r#"{"id":"pay_1","object":"payment","status":"succeeded"}"#;
    const REFUND: &str = r#"{"id":"re_1","object":"refund","status":"pending"}"#;

    fn answer(status: u16, problem: Option<&str>, replayed: bool) -> Result<Answer, NoAnswer> {
        Ok(Answer::for_test(status, problem, replayed, ""))
    }

    /// What follows a first attempt that got `result`, with time and attempts to spare.
    fn after(result: &Result<Answer, NoAnswer>, seen: KeySeen) -> Next {
        next(&RetryPolicy::default(), 1, Duration::ZERO, result, seen, &mut rand::rng())
    }

    fn retried(result: Result<Answer, NoAnswer>) -> bool {
        [KeySeen::No, KeySeen::Maybe].into_iter().all(|seen| matches!(after(&result, seen), Next::RetryIn(_)))
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
        for status in [200, 201, 302, 400, 401, 402, 404, 410, 413, 415, 422] {
            assert!(!retried(answer(status, None, false)), "{status}");
        }
        assert!(!retried(answer(502, Some("gateway-rejected"), false)));
        assert!(!retried(answer(502, None, true)));
    }

    #[test]
    fn once_the_key_may_have_been_seen_only_an_answer_about_it_is_definitive() {
        let about_the_key = [
            Ok(Answer::for_test(201, None, false, PAYMENT)),
            Ok(Answer::for_test(201, None, true, PAYMENT)),
            answer(402, Some("card-declined"), false),
            answer(402, Some("unknown-source"), true),
            answer(410, Some("idempotency-key-expired"), false),
            answer(422, Some("idempotency-key-reused"), false),
            answer(502, Some("gateway-rejected"), false),
            answer(502, Some("internal-error"), true),
            Ok(Answer::for_test(201, None, false, REFUND).from(Endpoint::Refunds)),
            Ok(Answer::for_test(404, Some("payment-not-found"), false, "").from(Endpoint::Refunds)),
            Ok(Answer::for_test(400, Some("payment-not-refundable"), false, "").from(Endpoint::Refunds)),
            Ok(Answer::for_test(400, Some("payment-already-refunded"), false, "").from(Endpoint::Refunds)),
            Ok(Answer::for_test(400, Some("refund-exceeds-payment"), false, "").from(Endpoint::Refunds)),
            Ok(Answer::for_test(410, Some("idempotency-key-expired"), false, "").from(Endpoint::Refunds)),
        ];
        for result in &about_the_key {
            assert_eq!(after(result, KeySeen::Maybe), Next::Done, "{result:?}");
            assert_eq!(after(result, KeySeen::No), Next::Done, "{result:?}");
        }
        let not_about_the_key = [
            // The service's own, about the request or the caller rather than the key.
            answer(401, Some("unauthorized"), false),
            answer(400, Some("invalid-request"), false),
            answer(400, Some("malformed-body"), false),
            answer(400, Some("invalid-idempotency-key"), false),
            answer(413, Some("payload-too-large"), false),
            answer(404, Some("route-not-found"), false),
            // A proxy's, or another server's.
            answer(404, None, false),
            answer(413, None, false),
            answer(302, None, false),
            Ok(Answer::for_test(200, None, false, "<html>welcome</html>")),
            Ok(Answer::for_test(201, None, false, r#"{"id":"pay_1","object":"order"}"#)),
            answer(402, None, false),
            answer(410, None, false),
            answer(422, Some("unprocessable"), false),
            answer(400, Some("idempotency-key-reused"), false),
            // Another endpoint's refusal, or what the other endpoint makes.
            answer(404, Some("payment-not-found"), false),
            answer(400, Some("payment-already-refunded"), false),
            Ok(Answer::for_test(201, None, false, REFUND)),
            Ok(Answer::for_test(201, None, false, PAYMENT).from(Endpoint::Refunds)),
            Ok(Answer::for_test(402, Some("card-declined"), false, "").from(Endpoint::Refunds)),
            Ok(Answer::for_test(404, Some("route-not-found"), false, "").from(Endpoint::Refunds)),
        ];
        for result in &not_about_the_key {
            assert_eq!(after(result, KeySeen::Maybe), Next::GiveUp(GaveUp::NotAboutTheKey), "{result:?}");
            // Before: nothing happened, and the answer stands.
            assert_eq!(after(result, KeySeen::No), Next::Done, "{result:?}");
        }
    }

    #[test]
    fn a_definitive_answer_means_what_its_status_and_type_say() {
        let outcome = |answer: Answer| match Outcome::of_definitive(answer) {
            Outcome::Succeeded(_) => "succeeded",
            Outcome::Declined(_) => "declined",
            Outcome::Expired(_) => "expired",
            Outcome::Rejected(_) => "rejected",
            Outcome::GaveUp { .. } => "gave up",
        };
        assert_eq!(outcome(Answer::for_test(201, None, false, PAYMENT)), "succeeded");
        assert_eq!(outcome(Answer::for_test(200, None, false, "<html>welcome</html>")), "rejected");
        assert_eq!(outcome(Answer::for_test(402, Some("card-declined"), false, "")), "declined");
        assert_eq!(outcome(Answer::for_test(402, None, false, "")), "rejected");
        assert_eq!(outcome(Answer::for_test(410, Some("idempotency-key-expired"), false, "")), "expired");
        assert_eq!(outcome(Answer::for_test(410, None, false, "")), "rejected");
        assert_eq!(outcome(Answer::for_test(422, Some("idempotency-key-reused"), false, "")), "rejected");
        assert_eq!(outcome(Answer::for_test(401, Some("unauthorized"), false, "")), "rejected");

        let refund = |status, problem, body| Answer::for_test(status, problem, false, body).from(Endpoint::Refunds);
        assert_eq!(outcome(refund(201, None, REFUND)), "succeeded", "a pending refund is made");
        let failed = r#"{"id":"re_1","object":"refund","status":"failed"}"#;
        assert_eq!(outcome(refund(201, None, failed)), "declined", "a failed refund refunded nothing");
        for refusal in ["payment-not-refundable", "payment-already-refunded", "refund-exceeds-payment"] {
            assert_eq!(outcome(refund(400, Some(refusal), "")), "declined", "{refusal}");
        }
        assert_eq!(outcome(refund(404, Some("payment-not-found"), "")), "declined");
        assert_eq!(outcome(refund(410, Some("idempotency-key-expired"), "")), "expired");
        assert_eq!(outcome(refund(502, Some("gateway-rejected"), "")), "rejected");
        assert_eq!(outcome(refund(400, Some("invalid-request"), "")), "rejected");
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
        let gave_up = Attempt {
            result: Ok(Answer::for_test(401, Some("unauthorized"), false, "").from(Endpoint::Refunds)),
            next: Next::GiveUp(GaveUp::NotAboutTheKey),
            ..attempt
        };
        assert_eq!(
            gave_up.to_string(),
            "attempt 2: 401 unauthorized, giving up: not an answer about this key, and an earlier attempt may have \
             refunded"
        );
    }
}
