//! Every error the gateway answers with, each sent as
//! `{"error": {"type": ..., "code": ..., "message": ...}}` like Stripe's
//! (`code` only where there is one).

use actix_web::http::header::ContentType;
use actix_web::http::{Method, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use super::event_plan::InvalidEventPlan;
use super::faults::{Fault, InvalidFaultSpec};
use super::own_changes::InvalidOwnChangePlan;
use super::requests::InvalidRequest;
use super::state::{ChangeRefusal, DECLINE_CODE, DECLINE_MESSAGE, RefundRefusal, StoredResponse};

/// Longest idempotency key accepted, as on Stripe.
pub(super) const MAX_KEY_LEN: usize = 255;

#[derive(Debug, thiserror::Error)]
pub(super) enum ApiError {
    /// A body or query string actix could not parse, with actix's status.
    #[error("{1}")]
    Unparsable(StatusCode, String),
    #[error("An Idempotency-Key header of 1 to {MAX_KEY_LEN} characters is required.")]
    MissingKey,
    #[error(transparent)]
    InvalidRequest(#[from] InvalidRequest),
    #[error(transparent)]
    InvalidFaults(#[from] InvalidFaultSpec),
    #[error(transparent)]
    InvalidEventPlan(#[from] InvalidEventPlan),
    #[error(transparent)]
    InvalidOwnChanges(#[from] InvalidOwnChangePlan),
    #[error("No such charge: '{0}'")]
    NoSuchCharge(String),
    #[error("No such refund: '{0}'")]
    NoSuchRefund(String),
    /// A refund the charge cannot give (stored under the key, like any answer).
    #[error(transparent)]
    RefundRefused(#[from] RefundRefusal),
    /// A capture or cancel the charge cannot take (stored under the key, like any answer).
    #[error(transparent)]
    ChangeRefused(#[from] ChangeRefusal),
    #[error("Unrecognized request URL ({0} {1}).")]
    NoRoute(Method, String),
    #[error("{0} is not allowed on {1}.")]
    WrongMethod(Method, String),
    /// The card was declined; the failed charge has this id.
    #[error("{DECLINE_MESSAGE}")]
    CardDeclined(String),
    #[error("A request with this idempotency key is still being processed; retry later.")]
    KeyInUse,
    #[error(
        "Keys for idempotent requests can only be used with the same parameters \
         they were first used with."
    )]
    KeyReused,
    #[error("injected fault: {}", .0.name())]
    Injected(Fault),
    /// The task processing a request died; a bug in the mock.
    #[error("The request could not be processed.")]
    Internal,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    r#type: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<&'a str>,
    /// The request parameter the error is about, as Stripe names it.
    #[serde(skip_serializing_if = "Option::is_none")]
    param: Option<&'a str>,
    message: String,
    /// The failed charge a decline made, as Stripe names it.
    #[serde(skip_serializing_if = "Option::is_none")]
    charge: Option<&'a str>,
}

impl ApiError {
    /// The error's `type` and `code`.
    fn kind(&self) -> (&'static str, Option<&'static str>) {
        const INVALID: &str = "invalid_request_error";
        match self {
            Self::Unparsable(..) | Self::InvalidFaults(_) | Self::InvalidEventPlan(_) | Self::InvalidOwnChanges(_) => {
                (INVALID, None)
            }
            Self::NoRoute(..) | Self::WrongMethod(..) => (INVALID, None),
            Self::MissingKey => (INVALID, Some("parameter_missing")),
            Self::InvalidRequest(InvalidRequest::NoSuchToken(_)) => (INVALID, Some("resource_missing")),
            Self::InvalidRequest(_) => (INVALID, Some("parameter_invalid")),
            Self::NoSuchCharge(_) | Self::NoSuchRefund(_) => (INVALID, Some("resource_missing")),
            Self::RefundRefused(RefundRefusal::NoSuchCharge(_)) => (INVALID, Some("resource_missing")),
            Self::RefundRefused(RefundRefusal::NotRefundable(_)) => (INVALID, Some("charge_not_refundable")),
            Self::RefundRefused(RefundRefusal::AlreadyRefunded(_)) => (INVALID, Some("charge_already_refunded")),
            Self::RefundRefused(RefundRefusal::AmountTooLarge { .. }) => (INVALID, Some("amount_too_large")),
            Self::ChangeRefused(refusal) => (INVALID, Some(refusal.code())),
            Self::CardDeclined(_) => ("card_error", Some(DECLINE_CODE)),
            Self::KeyInUse => ("idempotency_error", Some("idempotency_key_in_use")),
            Self::KeyReused => ("idempotency_error", None),
            Self::Injected(_) | Self::Internal => ("api_error", None),
        }
    }

    fn body(&self) -> Vec<u8> {
        let (r#type, code) = self.kind();
        let param = match self {
            Self::InvalidRequest(invalid) => Some(invalid.param()),
            Self::RefundRefused(
                RefundRefusal::NoSuchCharge(_) | RefundRefusal::NotRefundable(_) | RefundRefusal::AlreadyRefunded(_),
            ) => Some("charge"),
            Self::RefundRefused(RefundRefusal::AmountTooLarge { .. }) => Some("amount"),
            Self::ChangeRefused(ChangeRefusal::AmountTooLarge { .. }) => Some("amount"),
            _ => None,
        };
        let charge = match self {
            Self::CardDeclined(charge) => Some(charge.as_str()),
            _ => None,
        };
        let message = self.to_string();
        let body = ErrorBody { error: ErrorDetail { r#type, code, param, message, charge } };
        serde_json::to_vec(&body).expect("an error body always serializes")
    }

    /// This error as a response to keep for idempotent replays.
    pub(super) fn stored(&self) -> StoredResponse {
        StoredResponse { status: self.status_code(), body: self.body() }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::Unparsable(status, _) => *status,
            Self::MissingKey | Self::InvalidRequest(_) | Self::InvalidFaults(_) => StatusCode::BAD_REQUEST,
            Self::InvalidEventPlan(_) | Self::InvalidOwnChanges(_) => StatusCode::BAD_REQUEST,
            Self::KeyReused => StatusCode::BAD_REQUEST,
            Self::RefundRefused(RefundRefusal::NoSuchCharge(_)) => StatusCode::NOT_FOUND,
            Self::RefundRefused(_) => StatusCode::BAD_REQUEST,
            Self::ChangeRefused(ChangeRefusal::NoSuchCharge(_)) => StatusCode::NOT_FOUND,
            Self::ChangeRefused(_) => StatusCode::BAD_REQUEST,
            Self::NoSuchCharge(_) | Self::NoSuchRefund(_) | Self::NoRoute(..) => StatusCode::NOT_FOUND,
            Self::WrongMethod(..) => StatusCode::METHOD_NOT_ALLOWED,
            Self::CardDeclined(_) => StatusCode::PAYMENT_REQUIRED,
            Self::KeyInUse => StatusCode::CONFLICT,
            Self::Injected(_) | Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status_code()).content_type(ContentType::json()).body(self.body())
    }
}
