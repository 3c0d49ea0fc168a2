//! What an answer says: whether it ends the request, and whether it is about the key at all.
//!
//! The service answers about the key's own request only once it has checked the API key, the
//! headers and the body; whatever it answers before (`401`, `400`), and whatever a proxy or another
//! server answers (`404`, `413`, a redirect), would be the same whether or not the key has made a
//! payment or a refund. Such an answer can be acted on only while no attempt can have reached the
//! service. Which answers are about the key is the same rule for every endpoint; only the object a
//! success carries and the endpoint's refusals differ ([`Endpoint`]).

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use payments_wire::problem::ProblemType;
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::Value;

use super::request::Endpoint;

/// An answer the server gave to one attempt.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The endpoint that was asked.
    pub endpoint: Endpoint,
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

/// Whether a request with the key may have reached the service, so that the payment (or refund) may
/// have been made. It decides what an answer that is not about the key means (see [`Answer::is_definitive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySeen {
    /// No: a key made for this request, whose attempts so far could not connect.
    No,
    /// Perhaps: an attempt went out and its outcome is not known (no answer, or one to retry), or
    /// the key came from elsewhere (an earlier run that gave up).
    Maybe,
}

impl KeySeen {
    /// What is known after an attempt that got `result`: only an attempt that could not connect
    /// surely sent nothing.
    pub(super) fn after(self, result: &Result<Answer, NoAnswer>) -> KeySeen {
        match result {
            Err(NoAnswer::Connect(_)) => self,
            _ => KeySeen::Maybe,
        }
    }
}

impl Answer {
    /// Whether this answer ends the request, given whether the key may have been `seen` before
    /// the attempt: an answer about the key always does, unless it is worth retrying; any other
    /// answer only while the key cannot have been seen (nothing happened, so it is safe to act on).
    pub fn is_definitive(&self, seen: KeySeen) -> bool {
        !self.is_worth_retrying() && (seen == KeySeen::No || self.is_about_the_key())
    }

    /// Whether another try may be answered otherwise: `409` (the key's request is still running),
    /// `408` and `429` (about the request's delivery, not the request: a server that stalled
    /// mid-read answers `408` when it wakes, having done nothing), and a `5xx` that was not stored
    /// (a stored one is marked replayed, or is a `gateway-rejected`, which is always stored).
    pub(super) fn is_worth_retrying(&self) -> bool {
        let status = self.status;
        let stored = self.replayed || self.has_problem(ProblemType::GatewayRejected);
        let about_delivery = [StatusCode::REQUEST_TIMEOUT, StatusCode::TOO_MANY_REQUESTS].contains(&status);
        status == StatusCode::CONFLICT || about_delivery || (status.is_server_error() && !stored)
    }

    /// Whether the service answered this about the key's own request, so that the key gets it
    /// again: what the key made (a `2xx` whose body is the endpoint's object), an answer it stored
    /// (marked replayed), one of the endpoint's refusals (a decline; a refund's payment not found,
    /// not refundable or with too little left), `410` (the key's record is gone), `422` (the key was
    /// used for another request) or `502 gateway-rejected`, each by its problem type. Not so `400`
    /// in general (the service checks the body before it looks at the key), `401`, and anything
    /// from a proxy or another server.
    pub fn is_about_the_key(&self) -> bool {
        (self.status.is_success() && self.object_id().is_some())
            || self.replayed
            || self.endpoint.problems_about_the_key().any(|kind| self.has_problem(kind))
    }

    /// Whether the request was refused or failed, about the key, so that nothing was made: one of
    /// the endpoint's refusals, or a success that carries a failed object (a refund the gateway
    /// failed).
    pub fn is_refusal(&self) -> bool {
        let failed = || self.object().is_some_and(|object| object["status"] == "failed");
        self.endpoint.refusals().iter().any(|kind| self.has_problem(*kind)) || (self.status.is_success() && failed())
    }

    /// The id of the object this answer carries: a `2xx`'s own, or the one a problem embeds (the
    /// failed payment of a `402` or `502`, the failed refund of a `502`, what the key made in a
    /// `410`).
    pub fn object_id(&self) -> Option<String> {
        self.object()?["id"].as_str().map(str::to_owned)
    }

    /// The endpoint's object this answer carries, if any.
    fn object(&self) -> Option<Value> {
        let mut body: Value = serde_json::from_slice(&self.body).ok()?;
        let object = if self.status.is_success() { body } else { body[self.endpoint.object()].take() };
        (object["object"] == self.endpoint.object()).then_some(object)
    }

    /// Whether this is the service's problem `kind`, with its status.
    fn has_problem(&self, kind: ProblemType) -> bool {
        self.status.as_u16() == kind.status() && self.problem.as_deref() == Some(kind.slug())
    }
}

/// The last segment of a problem body's `type`.
pub(super) fn problem_slug(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Head {
        #[serde(rename = "type")]
        type_uri: String,
    }
    let head: Head = serde_json::from_slice(body).ok()?;
    head.type_uri.rsplit('/').next().map(str::to_owned)
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

impl Answer {
    /// An answer as it was read, with no `Retry-After`: for what checks recorded answers (the
    /// chaos checks, tests). A status that is none is 500.
    pub fn of(endpoint: Endpoint, status: u16, problem: Option<&str>, replayed: bool, body: &str) -> Answer {
        Answer {
            endpoint,
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            body: Bytes::from(body.to_owned()),
            replayed,
            retry_after: None,
            problem: problem.map(str::to_owned),
        }
    }
}

#[cfg(test)]
impl Answer {
    /// A payment's answer with no `Retry-After`.
    pub(crate) fn for_test(status: u16, problem: Option<&str>, replayed: bool, body: &str) -> Answer {
        Answer::of(Endpoint::Payments, status, problem, replayed, body)
    }

    /// The same answer, from `endpoint`.
    pub(crate) fn from(self, endpoint: Endpoint) -> Answer {
        Answer { endpoint, ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAYMENT: &str = r#"{"id":"pay_1","object":"payment","status":"succeeded"}"#;

    fn answer(status: u16, problem: Option<&str>, replayed: bool) -> Result<Answer, NoAnswer> {
        Ok(Answer::for_test(status, problem, replayed, ""))
    }

    #[test]
    fn the_key_may_have_been_seen_after_any_attempt_but_one_that_could_not_connect() {
        let never_sent = Err(NoAnswer::Connect("refused".into()));
        assert_eq!(KeySeen::No.after(&never_sent), KeySeen::No);
        assert_eq!(KeySeen::Maybe.after(&never_sent), KeySeen::Maybe);
        let unknown = [
            Err(NoAnswer::TimedOut(Duration::from_secs(1))),
            Err(NoAnswer::Lost("reset".into())),
            answer(503, Some("gateway-unavailable"), false),
            answer(409, Some("request-in-flight"), false),
            answer(408, None, false),
            answer(429, None, false),
            answer(502, None, false),
        ];
        for result in &unknown {
            assert_eq!(KeySeen::No.after(result), KeySeen::Maybe, "{result:?}");
        }
    }

    #[test]
    fn the_object_an_answer_carries_is_named() {
        let expired = r#"{"type":"https://payments.example/problems/idempotency-key-expired","status":410,"payment":{"id":"pay_1","object":"payment"}}"#;
        assert_eq!(
            Answer::for_test(410, Some("idempotency-key-expired"), false, expired).object_id().as_deref(),
            Some("pay_1")
        );
        assert_eq!(Answer::for_test(201, None, false, PAYMENT).object_id().as_deref(), Some("pay_1"));
        assert_eq!(Answer::for_test(201, None, false, r#"{"id":"x"}"#).object_id(), None);
        assert_eq!(Answer::for_test(404, None, false, "Not Found").object_id(), None);
        // A refund's answers carry a refund, never a payment.
        let rejected = r#"{"type":"https://payments.example/problems/gateway-rejected","status":502,"refund":{"id":"re_1","object":"refund","status":"failed"}}"#;
        let rejected = Answer::for_test(502, Some("gateway-rejected"), false, rejected).from(Endpoint::Refunds);
        assert_eq!(rejected.object_id().as_deref(), Some("re_1"));
        assert_eq!(Answer::for_test(201, None, false, PAYMENT).from(Endpoint::Refunds).object_id(), None);
    }

    #[test]
    fn a_refusal_is_the_endpoints_own_or_a_failed_refund() {
        let refund = |status: u16, problem: Option<&str>, body: &str| {
            Answer::for_test(status, problem, false, body).from(Endpoint::Refunds)
        };
        for problem in ["payment-already-refunded", "payment-not-refundable", "refund-exceeds-payment"] {
            assert!(refund(400, Some(problem), "").is_refusal(), "{problem}");
            assert!(refund(400, Some(problem), "").is_about_the_key(), "{problem}");
        }
        assert!(refund(404, Some("payment-not-found"), "").is_refusal());
        assert!(refund(201, None, r#"{"id":"re_1","object":"refund","status":"failed"}"#).is_refusal());
        assert!(!refund(201, None, r#"{"id":"re_1","object":"refund","status":"pending"}"#).is_refusal());
        // Another endpoint's refusal, or the same status without the problem type, is none.
        assert!(!refund(402, Some("card-declined"), "").is_refusal());
        assert!(!refund(402, Some("card-declined"), "").is_about_the_key());
        assert!(!refund(404, None, "Not Found").is_refusal());
        assert!(!Answer::for_test(404, Some("payment-not-found"), false, "").is_about_the_key());
        assert!(Answer::for_test(402, Some("card-declined"), false, "").is_refusal());
    }

    #[test]
    fn problem_types_are_read_by_their_last_segment() {
        let body = br#"{"type":"https://payments.example/problems/card-declined","status":402}"#;
        assert_eq!(problem_slug(body).as_deref(), Some("card-declined"));
        assert_eq!(problem_slug(b"{\"id\":\"pay_1\"}"), None);
        assert_eq!(problem_slug(b"not json"), None);
    }
}
