//! RFC 9457 problem details: the body of every error this service answers, stored ones included.

use serde::Serialize;

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Where the problem types live. `.example` marks it as a placeholder for your own documentation;
/// the types themselves are listed, with their meaning, in `openapi.yaml`.
const TYPE_BASE: &str = "https://payments.example/problems/";

/// Every kind of problem: each has its own `type` URI, so clients branch on `type`, not on prose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemType {
    Unauthorized,
    MissingIdempotencyKey,
    InvalidIdempotencyKey,
    MalformedBody,
    InvalidRequest,
    InvalidSignature,
    PayloadTooLarge,
    UnsupportedMediaType,
    PaymentNotFound,
    RefundNotFound,
    EventNotFound,
    UnknownEventType,
    WebhookEndpointNotFound,
    InvalidWebhookUrl,
    WebhookUrlNotAllowed,
    PaymentNotRefundable,
    PaymentAlreadyRefunded,
    RefundExceedsPayment,
    PaymentNotCapturable,
    PaymentNotCancelable,
    CaptureExceedsAuthorization,
    IdempotencyKeyNotFound,
    RouteNotFound,
    MethodNotAllowed,
    IdempotencyKeyReused,
    IdempotencyKeyExpired,
    RequestInFlight,
    CardDeclined,
    UnknownSource,
    GatewayRejected,
    GatewayUnavailable,
    DatabaseUnavailable,
    RecordLocked,
    TransactionConflict,
    EventNotSeenYet,
    Internal,
}

impl ProblemType {
    /// Every problem type, so that a test can hold `openapi.yaml` to the full list.
    pub const ALL: [ProblemType; 36] = [
        ProblemType::Unauthorized,
        ProblemType::MissingIdempotencyKey,
        ProblemType::InvalidIdempotencyKey,
        ProblemType::MalformedBody,
        ProblemType::InvalidRequest,
        ProblemType::InvalidSignature,
        ProblemType::PayloadTooLarge,
        ProblemType::UnsupportedMediaType,
        ProblemType::PaymentNotFound,
        ProblemType::RefundNotFound,
        ProblemType::EventNotFound,
        ProblemType::UnknownEventType,
        ProblemType::WebhookEndpointNotFound,
        ProblemType::InvalidWebhookUrl,
        ProblemType::WebhookUrlNotAllowed,
        ProblemType::PaymentNotRefundable,
        ProblemType::PaymentAlreadyRefunded,
        ProblemType::RefundExceedsPayment,
        ProblemType::PaymentNotCapturable,
        ProblemType::PaymentNotCancelable,
        ProblemType::CaptureExceedsAuthorization,
        ProblemType::IdempotencyKeyNotFound,
        ProblemType::RouteNotFound,
        ProblemType::MethodNotAllowed,
        ProblemType::IdempotencyKeyReused,
        ProblemType::IdempotencyKeyExpired,
        ProblemType::RequestInFlight,
        ProblemType::CardDeclined,
        ProblemType::UnknownSource,
        ProblemType::GatewayRejected,
        ProblemType::GatewayUnavailable,
        ProblemType::DatabaseUnavailable,
        ProblemType::RecordLocked,
        ProblemType::TransactionConflict,
        ProblemType::EventNotSeenYet,
        ProblemType::Internal,
    ];

    /// The type's slug, title and HTTP status, in one table.
    fn parts(self) -> (&'static str, &'static str, u16) {
        use ProblemType::*;
        match self {
            Unauthorized => ("unauthorized", "Missing or invalid API key", 401),
            MissingIdempotencyKey => ("missing-idempotency-key", "Idempotency-Key header is missing", 400),
            InvalidIdempotencyKey => ("invalid-idempotency-key", "Idempotency-Key header is invalid", 400),
            MalformedBody => ("malformed-body", "The body is not well-formed JSON of the expected shape", 400),
            InvalidRequest => ("invalid-request", "The request breaks a rule", 400),
            InvalidSignature => ("invalid-signature", "The event's signature does not hold", 400),
            PayloadTooLarge => ("payload-too-large", "The request body is too large", 413),
            UnsupportedMediaType => ("unsupported-media-type", "The request body must be JSON", 415),
            PaymentNotFound => ("payment-not-found", "No such payment", 404),
            RefundNotFound => ("refund-not-found", "No such refund", 404),
            EventNotFound => ("event-not-found", "No such event", 404),
            UnknownEventType => ("unknown-event-type", "No event has this type", 400),
            WebhookEndpointNotFound => ("webhook-endpoint-not-found", "No such webhook endpoint", 404),
            InvalidWebhookUrl => ("invalid-webhook-url", "The webhook endpoint's URL is invalid", 400),
            WebhookUrlNotAllowed => {
                ("webhook-url-not-allowed", "The webhook endpoint's URL is an address the service never sends to", 400)
            }
            PaymentNotRefundable => ("payment-not-refundable", "The payment cannot be refunded", 400),
            PaymentAlreadyRefunded => ("payment-already-refunded", "The payment has nothing left to refund", 400),
            RefundExceedsPayment => ("refund-exceeds-payment", "The refund is more than the payment has left", 400),
            PaymentNotCapturable => ("payment-not-capturable", "The payment cannot be captured", 400),
            PaymentNotCancelable => ("payment-not-cancelable", "The payment cannot be canceled", 400),
            CaptureExceedsAuthorization => {
                ("capture-exceeds-authorization", "The capture is more than the payment authorized", 400)
            }
            IdempotencyKeyNotFound => ("idempotency-key-not-found", "No such idempotency key", 404),
            RouteNotFound => ("route-not-found", "No such endpoint", 404),
            MethodNotAllowed => ("method-not-allowed", "Method not allowed on this endpoint", 405),
            IdempotencyKeyReused => {
                ("idempotency-key-reused", "Idempotency-Key was already used with another request", 422)
            }
            IdempotencyKeyExpired => (
                "idempotency-key-expired",
                "Idempotency-Key was already used, and its stored response has expired",
                410,
            ),
            RequestInFlight => ("request-in-flight", "A request with this Idempotency-Key is in progress", 409),
            CardDeclined => ("card-declined", "The card was declined", 402),
            UnknownSource => ("unknown-source", "The payment gateway knows no payment method by this source", 402),
            GatewayRejected => ("gateway-rejected", "The payment gateway rejected the request", 502),
            GatewayUnavailable => ("gateway-unavailable", "The request's outcome is not known yet", 503),
            DatabaseUnavailable => ("database-unavailable", "The service is temporarily unavailable", 503),
            RecordLocked => ("record-locked", "A record the request needs is locked", 503),
            TransactionConflict => ("transaction-conflict", "The request collided with concurrent work", 503),
            EventNotSeenYet => ("event-not-seen-yet", "The event names a request not seen yet", 503),
            Internal => ("internal-error", "Internal server error", 500),
        }
    }

    /// The last segment of the `type` URI (`card-declined`).
    pub fn slug(self) -> &'static str {
        self.parts().0
    }

    /// The `type` URI.
    pub fn uri(self) -> String {
        format!("{TYPE_BASE}{}", self.parts().0)
    }

    pub fn title(self) -> &'static str {
        self.parts().1
    }

    pub fn status(self) -> u16 {
        self.parts().2
    }
}

/// A problem details body: the standard four members, then `request_id` (the request that got
/// this answer, to quote to support), then extension members `X` (such as the failed `payment` of
/// a 402).
#[derive(Debug, Serialize)]
pub struct Problem<X = ()> {
    #[serde(rename = "type")]
    type_uri: String,
    title: &'static str,
    status: u16,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<String>,
    #[serde(flatten)]
    extensions: X,
}

impl Problem {
    pub fn new(kind: ProblemType, detail: impl Into<String>) -> Problem {
        Problem {
            type_uri: kind.uri(),
            title: kind.title(),
            status: kind.status(),
            detail: detail.into(),
            request_id: None,
            extensions: (),
        }
    }

    /// The same problem, with extension members.
    pub fn with<X: Serialize>(self, extensions: X) -> Problem<X> {
        let Problem { type_uri, title, status, detail, request_id, .. } = self;
        Problem { type_uri, title, status, detail, request_id, extensions }
    }

    /// The same problem, as the answer to the request `id`.
    pub fn of_request(self, id: Option<&str>) -> Problem {
        Problem { request_id: id.map(str::to_owned), ..self }
    }
}

impl<X: Serialize> Problem<X> {
    pub fn status(&self) -> u16 {
        self.status
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a problem always serialises")
    }
}
