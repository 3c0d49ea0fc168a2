//! The answers of a capture and a cancel: the payment, or why not, stored for replay.

use serde::Serialize;
use uuid::Uuid;

use crate::idempotency::{self, StoredResponse};
use crate::payments::{Payment, PaymentView};
use crate::problem::{Problem, ProblemType};
use crate::request_id::RequestId;

use super::request::ChangeKind;

/// The answer to a change the gateway did: `200` with the payment as it stands after it.
pub fn done_response(payment: &Payment) -> StoredResponse {
    let body = serde_json::to_vec(&PaymentView::from(payment)).expect("a payment always serialises");
    StoredResponse { status: 200, body }
}

/// The answer to a change the gateway refused for good: a `502` problem that embeds the payment,
/// which is as it was (an authorization still open, unless the gateway said it ended).
pub fn rejected_response(kind: ChangeKind, payment: &Payment, request_id: &RequestId) -> StoredResponse {
    let detail = match kind {
        ChangeKind::Capture => "The payment gateway refused the capture; nothing was captured.",
        ChangeKind::Cancel => "The payment gateway refused the cancel; the authorization stands.",
    };
    let problem = Problem::new(ProblemType::GatewayRejected, detail)
        .of_request(Some(request_id.as_str()))
        .with(PaymentMember { payment: payment.into() });
    StoredResponse { status: problem.status(), body: problem.to_bytes() }
}

/// The answer to a late retry of a capture's or a cancel's key whose record has expired: `410`,
/// naming the payment as it stands; nothing is asked of the gateway again.
pub fn expired_key_response(kind: ChangeKind, payment: &Payment, request_id: &RequestId) -> StoredResponse {
    let verb = match kind {
        ChangeKind::Capture => "capture",
        ChangeKind::Cancel => "cancel",
    };
    let detail = format!(
        "This Idempotency-Key asked to {verb} payment {}, and its stored response has expired. Nothing was \
         changed now; GET /v1/payments/{} shows the payment as it stands.",
        payment.id, payment.id
    );
    let problem = Problem::new(ProblemType::IdempotencyKeyExpired, detail)
        .of_request(Some(request_id.as_str()))
        .with(PaymentMember { payment: payment.into() });
    StoredResponse { status: problem.status(), body: problem.to_bytes() }
}

/// The `payment` member of a problem about a payment.
#[derive(Debug, Serialize)]
struct PaymentMember<'a> {
    payment: PaymentView<'a>,
}

/// Why there was nothing to change, as decided against the payment when the change started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    PaymentNotFound,
    /// Not an authorization still open: captured, cancelled, lapsed, failed, charged at once, or
    /// taken by another capture or cancel.
    NotPossible,
    /// More than was authorized: `capturable`, in its minor units.
    CaptureExceedsAuthorization {
        capturable: i64,
    },
}

impl idempotency::Refusal for Refusal {
    /// The refusal `started` reported, by its code; `capturable` is what the authorization allows.
    fn from_code(code: &str, capturable: Option<i64>) -> Option<Refusal> {
        Some(match code {
            "payment_not_found" => Refusal::PaymentNotFound,
            "payment_not_capturable" | "payment_not_cancelable" => Refusal::NotPossible,
            "capture_exceeds_authorization" => Refusal::CaptureExceedsAuthorization { capturable: capturable? },
            _ => return None,
        })
    }
}

impl Refusal {
    pub fn code(self, kind: ChangeKind) -> &'static str {
        match (self, kind) {
            (Refusal::PaymentNotFound, _) => "payment_not_found",
            (Refusal::NotPossible, ChangeKind::Capture) => "payment_not_capturable",
            (Refusal::NotPossible, ChangeKind::Cancel) => "payment_not_cancelable",
            (Refusal::CaptureExceedsAuthorization { .. }, _) => "capture_exceeds_authorization",
        }
    }

    /// The answer, stored under the key and replayed like any other. `payment` is the payment as
    /// it stands when the refusal is decided, named so the client sees what won.
    pub fn response(
        self,
        kind: ChangeKind,
        payment_id: Uuid,
        payment: Option<&Payment>,
        request_id: &RequestId,
    ) -> StoredResponse {
        let problem = match self {
            Refusal::PaymentNotFound => {
                Problem::new(ProblemType::PaymentNotFound, "There is no payment with this id in your account.")
            }
            Refusal::NotPossible => {
                let (problem_type, verb) = match kind {
                    ChangeKind::Capture => (ProblemType::PaymentNotCapturable, "captured"),
                    ChangeKind::Cancel => (ProblemType::PaymentNotCancelable, "cancelled"),
                };
                let state = payment.map_or("gone", |payment| state_of(payment));
                let detail = format!(
                    "Payment {payment_id} cannot be {verb}: only an authorization still open can, and this one is {state}."
                );
                Problem::new(problem_type, detail)
            }
            Refusal::CaptureExceedsAuthorization { capturable } => {
                let detail = format!(
                    "Payment {payment_id} authorized {capturable} (minor units), less than the amount asked for."
                );
                let problem = Problem::new(ProblemType::CaptureExceedsAuthorization, detail)
                    .of_request(Some(request_id.as_str()))
                    .with(Capturable { capturable });
                return StoredResponse { status: problem.status(), body: problem.to_bytes() };
            }
        };
        let problem = problem.of_request(Some(request_id.as_str()));
        match payment {
            Some(payment) => {
                let problem = problem.with(PaymentMember { payment: payment.into() });
                StoredResponse { status: problem.status(), body: problem.to_bytes() }
            }
            None => StoredResponse { status: problem.status(), body: problem.to_bytes() },
        }
    }
}

/// What became of an authorization, in words, for a refusal's detail.
fn state_of(payment: &Payment) -> &'static str {
    use crate::payments::PaymentStatus::*;
    match payment.status {
        RequiresCapture if payment.capture_before.is_some_and(|lapses| lapses <= chrono::Utc::now()) => {
            "past its capture_before, lapsing"
        }
        RequiresCapture => "being captured or cancelled by another request",
        Succeeded if payment.captured.is_some() => "captured",
        Succeeded => "charged at once (refund it instead)",
        Canceled if payment.cancellation_reason.as_deref() == Some("expired") => "lapsed",
        Canceled => "cancelled",
        Failed => "failed",
        Pending => "not authorized yet",
    }
}

/// The `capturable` member of a `capture-exceeds-authorization` problem.
#[derive(Debug, Serialize)]
struct Capturable {
    capturable: i64,
}
