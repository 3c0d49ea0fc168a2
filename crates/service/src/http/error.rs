//! Every error the API answers, and the one place where each becomes an HTTP response.
//!
//! Handlers return `Result<_, ApiError>`; the concerns' own errors (`DriveError`, `StoreError`,
//! `KeyError`, actix's extractor errors) convert into it. Database outages are 503 (fail closed);
//! anything unexpected, a permission the database refuses included, is an opaque 500 whose cause
//! is logged here, once, and never sent.

use actix_web::error::{JsonPayloadError, PathError, QueryPayloadError};
use actix_web::http::StatusCode;
use actix_web::http::header::{ALLOW, RETRY_AFTER, WWW_AUTHENTICATE};
use actix_web::{HttpResponse, ResponseError};

use crate::db::StoreError;
use crate::fields::{Rule, ValidationError};
use crate::idempotency::{DriveError, KeyError, PhaseError};
use crate::problem::{PROBLEM_JSON, Problem, ProblemType};
use crate::request_id::RequestId;

/// Seconds a client should wait before retrying a request that is in flight: requests finish in
/// milliseconds unless their gateway call is slow.
const RETRY_IN_FLIGHT_SECS: u32 = 1;
/// After an indeterminate gateway outcome: give the gateway a moment to recover.
const RETRY_GATEWAY_SECS: u32 = 2;
/// While the database is unreachable.
const RETRY_DATABASE_SECS: u32 = 5;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("Send your API key as `Authorization: Bearer <key>`.")]
    Unauthorized,
    #[error("{0}.")]
    IdempotencyKey(#[from] KeyError),
    /// Not JSON, or not the expected fields and types.
    #[error("{0}")]
    MalformedBody(String),
    /// Well-formed, but a value breaks a rule (or a query parameter or header is invalid).
    #[error("{0}")]
    InvalidRequest(String),
    /// A gateway event whose signature does not hold.
    #[error("The event's Gateway-Signature does not hold: {0}. Nothing was recorded.")]
    InvalidSignature(crate::gateway::signature::SignatureError),
    #[error("The request body is larger than {limit} bytes.")]
    PayloadTooLarge { limit: usize },
    #[error("Send the body as JSON, with `Content-Type: application/json`.")]
    UnsupportedMediaType,
    #[error("There is no payment with this id in your account.")]
    PaymentNotFound,
    #[error("There is no refund with this id in your account.")]
    RefundNotFound,
    #[error("There is no event with this id in your account: it never was, or its retention is over.")]
    EventNotFound,
    #[error("There is no webhook endpoint with this id in your account.")]
    WebhookEndpointNotFound,
    /// A webhook endpoint's URL that is no URL we can send to.
    #[error("{0}")]
    InvalidWebhookUrl(String),
    /// A webhook endpoint's URL at an address the service never sends to.
    #[error("{0}")]
    WebhookUrlNotAllowed(String),
    /// An event type that no event has, or a pattern that matches none.
    #[error("No event has this type. The types are {}; or a prefix of them with `*`, as `payment.*`.", crate::webhooks::events::EVENT_TYPES.join(", "))]
    UnknownEventType,
    #[error("Your account has used no request with this idempotency key, or its record and its payment are gone.")]
    IdempotencyKeyNotFound,
    #[error("There is no endpoint at this path; the API is described at /openapi.yaml.")]
    RouteNotFound,
    /// A path without the version whose versioned twin is an endpoint: named, since `/payments`
    /// is the path a reader tries first.
    #[error("There is no endpoint at this path: the API's paths begin with its version. Did you mean {0}?")]
    Unversioned(String),
    #[error("This endpoint does not support this method; it supports {allowed}.")]
    MethodNotAllowed { allowed: String },
    #[error(
        "This Idempotency-Key was already used with a different request (body, method or path). \
         Use a new key for a new request."
    )]
    KeyReused,
    #[error("A request with this Idempotency-Key is still in progress. Retry with the same key shortly.")]
    InFlight,
    #[error(
        "The request's outcome is not known yet: the payment gateway gave no definitive answer, or could not be \
         asked in time. The request may still complete (a background worker finishes it if you do not come \
         back): retry with the same Idempotency-Key to learn its outcome; it resumes where it stopped and moves \
         money at most once. Do not send it again with a new key."
    )]
    GatewayUnavailable,
    #[error(
        "The database is unreachable. A payment or refund may still complete if it got far enough before the \
         outage: retry it with the same Idempotency-Key to learn its outcome, and do not send it again with a new \
         key."
    )]
    DatabaseUnavailable,
    /// A row the request needs stayed locked by other work (a stuck holder): nothing changed.
    #[error(
        "A payment or refund this request needs is locked by other work that has not let go in time, so the \
         request changed nothing. Retry with the same Idempotency-Key shortly: a holder that never lets go is \
         ended by the database within seconds."
    )]
    RecordLocked,
    /// A phase kept colliding with concurrent transactions and was rolled back each time.
    #[error(
        "The request kept colliding with concurrent work. It may still complete: retry with the same \
         Idempotency-Key to learn its outcome. Do not send it again with a new key."
    )]
    TransactionConflict,
    /// A gateway event names a request of ours this process cannot see yet (see
    /// [`crate::events::receive`]): nothing recorded, so that the gateway sends it again.
    #[error(
        "The event names a request of this service's that the database does not show yet. Nothing was \
         recorded: send the event again."
    )]
    EventNotSeenYet,
    /// The cause is logged, never sent.
    #[error(
        "Something went wrong on our side. A payment or refund may still complete: retry it with the same \
         Idempotency-Key to learn its outcome, and do not send it again with a new key."
    )]
    Internal(String),
}

impl ApiError {
    fn problem_type(&self) -> ProblemType {
        match self {
            ApiError::Unauthorized => ProblemType::Unauthorized,
            ApiError::IdempotencyKey(KeyError::Missing) => ProblemType::MissingIdempotencyKey,
            ApiError::IdempotencyKey(_) => ProblemType::InvalidIdempotencyKey,
            ApiError::MalformedBody(_) => ProblemType::MalformedBody,
            ApiError::InvalidRequest(_) => ProblemType::InvalidRequest,
            ApiError::InvalidSignature(_) => ProblemType::InvalidSignature,
            ApiError::PayloadTooLarge { .. } => ProblemType::PayloadTooLarge,
            ApiError::UnsupportedMediaType => ProblemType::UnsupportedMediaType,
            ApiError::PaymentNotFound => ProblemType::PaymentNotFound,
            ApiError::RefundNotFound => ProblemType::RefundNotFound,
            ApiError::EventNotFound => ProblemType::EventNotFound,
            ApiError::WebhookEndpointNotFound => ProblemType::WebhookEndpointNotFound,
            ApiError::InvalidWebhookUrl(_) => ProblemType::InvalidWebhookUrl,
            ApiError::WebhookUrlNotAllowed(_) => ProblemType::WebhookUrlNotAllowed,
            ApiError::UnknownEventType => ProblemType::UnknownEventType,
            ApiError::IdempotencyKeyNotFound => ProblemType::IdempotencyKeyNotFound,
            ApiError::RouteNotFound | ApiError::Unversioned(_) => ProblemType::RouteNotFound,
            ApiError::MethodNotAllowed { .. } => ProblemType::MethodNotAllowed,
            ApiError::KeyReused => ProblemType::IdempotencyKeyReused,
            ApiError::InFlight => ProblemType::RequestInFlight,
            ApiError::GatewayUnavailable => ProblemType::GatewayUnavailable,
            ApiError::DatabaseUnavailable => ProblemType::DatabaseUnavailable,
            ApiError::RecordLocked => ProblemType::RecordLocked,
            ApiError::TransactionConflict => ProblemType::TransactionConflict,
            ApiError::EventNotSeenYet => ProblemType::EventNotSeenYet,
            ApiError::Internal(_) => ProblemType::Internal,
        }
    }

    fn retry_after_secs(&self) -> Option<u32> {
        match self {
            ApiError::InFlight => Some(RETRY_IN_FLIGHT_SECS),
            ApiError::GatewayUnavailable => Some(RETRY_GATEWAY_SECS),
            ApiError::DatabaseUnavailable => Some(RETRY_DATABASE_SECS),
            ApiError::TransactionConflict | ApiError::RecordLocked | ApiError::EventNotSeenYet => {
                Some(RETRY_IN_FLIGHT_SECS)
            }
            _ => None,
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.problem_type().status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The answer without the request's id: every error becomes a response through here, and
    /// the request middleware renders it again with the id (see [`ApiError::response`]).
    fn error_response(&self) -> HttpResponse {
        if let ApiError::Internal(cause) = self {
            tracing::error!(%cause, "internal error");
        }
        self.response(None)
    }
}

impl ApiError {
    /// The answer to the request `request_id`: a problem body, with `Retry-After` where a retry
    /// is the way on, and the headers its status calls for.
    pub fn response(&self, request_id: Option<&RequestId>) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        response.content_type(PROBLEM_JSON);
        if let Some(seconds) = self.retry_after_secs() {
            response.insert_header((RETRY_AFTER, seconds));
        }
        match self {
            ApiError::Unauthorized => drop(response.insert_header((WWW_AUTHENTICATE, "Bearer"))),
            ApiError::MethodNotAllowed { allowed } => drop(response.insert_header((ALLOW, allowed.as_str()))),
            _ => {}
        }
        response.body(
            Problem::new(self.problem_type(), self.to_string())
                .of_request(request_id.map(RequestId::as_str))
                .to_bytes(),
        )
    }
}

impl From<DriveError> for ApiError {
    fn from(error: DriveError) -> Self {
        match error {
            DriveError::KeyReused => ApiError::KeyReused,
            // Losing the lock means another request is driving the key now: for this client,
            // that is the same as finding it in flight.
            DriveError::InFlight | DriveError::Phase(PhaseError::LockLost) => ApiError::InFlight,
            // The gateway was not asked, or gave no definitive answer, or the request waits for a
            // process that reaches its gateway: either way its outcome is not known yet.
            DriveError::OutcomeUnknown(_) | DriveError::HeldElsewhere(_) => ApiError::GatewayUnavailable,
            DriveError::Phase(PhaseError::Store(error)) => error.into(),
            DriveError::Phase(error @ PhaseError::Inconsistent(_)) => ApiError::Internal(error.to_string()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Unavailable(cause) => {
                tracing::warn!(%cause, "database unavailable; failing closed");
                ApiError::DatabaseUnavailable
            }
            StoreError::Locked(cause) => {
                tracing::warn!(%cause, "a record stayed locked; failing closed");
                ApiError::RecordLocked
            }
            // Already retried by the phase runner; still transient, so never a 500.
            StoreError::Conflict(_) => ApiError::TransactionConflict,
            StoreError::Refused(cause) => ApiError::Internal(format!(
                "the database refused this process's role a permission ({cause}): grant it, or run the service as \
                 the role that owns the tables (see docs/operating.md, \"The database role\")"
            )),
            StoreError::Query(error) => ApiError::Internal(error.to_string()),
        }
    }
}

impl From<diesel::result::Error> for ApiError {
    fn from(error: diesel::result::Error) -> Self {
        StoreError::from(error).into()
    }
}

impl From<ValidationError> for ApiError {
    fn from(ValidationError { rule, message }: ValidationError) -> Self {
        match rule {
            Rule::Request => ApiError::InvalidRequest(message),
            Rule::WebhookUrl => ApiError::InvalidWebhookUrl(message),
            Rule::WebhookUrlNotAllowed => ApiError::WebhookUrlNotAllowed(message),
            Rule::EventType => ApiError::UnknownEventType,
        }
    }
}

impl From<tokio::task::JoinError> for ApiError {
    fn from(error: tokio::task::JoinError) -> Self {
        ApiError::Internal(format!("the request's task failed: {error}"))
    }
}

impl From<JsonPayloadError> for ApiError {
    fn from(error: JsonPayloadError) -> Self {
        match error {
            JsonPayloadError::Overflow { limit } | JsonPayloadError::OverflowKnownLength { limit, .. } => {
                ApiError::PayloadTooLarge { limit }
            }
            JsonPayloadError::ContentType => ApiError::UnsupportedMediaType,
            JsonPayloadError::Deserialize(error) => ApiError::MalformedBody(format!("The body is not valid: {error}.")),
            other => ApiError::MalformedBody(format!("The body could not be read: {other}.")),
        }
    }
}

impl From<QueryPayloadError> for ApiError {
    fn from(error: QueryPayloadError) -> Self {
        ApiError::InvalidRequest(format!("The query string is not valid: {error}."))
    }
}

impl From<PathError> for ApiError {
    /// A path segment that does not parse names nothing that exists: no endpoint. (A route about a
    /// resource reads its id with `PathId`, whose not-found names that resource.)
    fn from(_: PathError) -> Self {
        ApiError::RouteNotFound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One of each error, the two that no request can cause on purpose included.
    fn every_error() -> Vec<ApiError> {
        vec![
            ApiError::Unauthorized,
            ApiError::IdempotencyKey(KeyError::Missing),
            ApiError::IdempotencyKey(KeyError::Empty),
            ApiError::MalformedBody("bad".into()),
            ApiError::InvalidRequest("bad".into()),
            ApiError::InvalidSignature(crate::gateway::signature::SignatureError::NoMatch),
            ApiError::PayloadTooLarge { limit: 1 },
            ApiError::UnsupportedMediaType,
            ApiError::PaymentNotFound,
            ApiError::RefundNotFound,
            ApiError::EventNotFound,
            ApiError::UnknownEventType,
            ApiError::WebhookEndpointNotFound,
            ApiError::InvalidWebhookUrl("bad".into()),
            ApiError::WebhookUrlNotAllowed("bad".into()),
            ApiError::IdempotencyKeyNotFound,
            ApiError::RouteNotFound,
            ApiError::Unversioned("/v1/payments".into()),
            ApiError::MethodNotAllowed { allowed: "GET".into() },
            ApiError::KeyReused,
            ApiError::InFlight,
            ApiError::GatewayUnavailable,
            ApiError::DatabaseUnavailable,
            ApiError::TransactionConflict,
            ApiError::Internal("a cause that is never sent".into()),
        ]
    }

    #[actix_web::test]
    async fn every_error_renders_as_a_problem_naming_its_request() {
        let id = RequestId::generate();
        for error in every_error() {
            let response = error.response(Some(&id));
            let body = actix_web::body::to_bytes(response.into_body()).await.unwrap();
            let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(problem["request_id"], id.as_str(), "{error:?}");
            assert_eq!(problem["type"], error.problem_type().uri());
            assert!(!problem.to_string().contains("never sent"));
        }
    }
}
