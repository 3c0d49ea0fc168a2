//! Refunds as the API shows them, and the final responses stored for replay.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::model::{GATEWAY_REJECTED, Refund, RefundStatus};
use crate::idempotency::{self, StoredResponse};
use crate::problem::{Problem, ProblemType};
use crate::request_id::RequestId;

/// A refund in API responses.
#[derive(Debug, Serialize)]
pub struct RefundView<'a> {
    pub id: Uuid,
    pub object: &'static str,
    pub payment: Uuid,
    pub amount: i64,
    pub currency: &'a str,
    pub status: RefundStatus,
    pub reason: Option<&'a str>,
    pub metadata: &'a serde_json::Value,
    pub gateway_refund_id: Option<&'a str>,
    pub failure_code: Option<&'a str>,
    pub created_at: DateTime<Utc>,
}

impl<'a> From<&'a Refund> for RefundView<'a> {
    fn from(refund: &'a Refund) -> Self {
        RefundView {
            id: refund.id,
            object: "refund",
            payment: refund.payment_id,
            amount: refund.amount,
            currency: &refund.currency,
            status: refund.status,
            reason: refund.reason.as_deref(),
            metadata: &refund.metadata,
            gateway_refund_id: refund.gateway_refund_id.as_deref(),
            failure_code: refund.failure_code.as_deref(),
            created_at: refund.created_at,
        }
    }
}

/// A page of refunds in API responses.
#[derive(Debug, Serialize)]
pub struct RefundList<'a> {
    pub object: &'static str,
    pub data: Vec<RefundView<'a>>,
    pub has_more: bool,
}

impl<'a> RefundList<'a> {
    pub fn new(refunds: &'a [Refund], has_more: bool) -> Self {
        RefundList { object: "list", data: refunds.iter().map(RefundView::from).collect(), has_more }
    }
}

/// The `refund` member of a problem about a refund.
#[derive(Debug, Serialize)]
struct RefundMember<'a> {
    refund: RefundView<'a>,
}

/// The definitive answer to the request that created `refund`: 201 with the refund (succeeded,
/// pending, or failed at the gateway), or, when the gateway refused it outright, a 502 problem
/// that embeds the failed refund. `request_id` names the request that finished it.
pub fn final_response(refund: &Refund, request_id: &RequestId) -> StoredResponse {
    let view = RefundView::from(refund);
    if refund.failure_code.as_deref() != Some(GATEWAY_REJECTED) {
        let body = serde_json::to_vec(&view).expect("a refund always serialises");
        return StoredResponse { status: 201, body };
    }
    let problem = Problem::new(
        ProblemType::GatewayRejected,
        "The payment gateway refused the refund; nothing was refunded, and the amount is refundable again.",
    )
    .of_request(Some(request_id.as_str()))
    .with(RefundMember { refund: view });
    StoredResponse { status: problem.status(), body: problem.to_bytes() }
}

/// Why there was nothing to refund, as decided against the payment when the refund started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    PaymentNotFound,
    PaymentNotRefundable,
    PaymentAlreadyRefunded,
    /// More than the payment has left: `refundable`, in its minor units.
    RefundExceedsPayment {
        refundable: i64,
    },
}

impl idempotency::Refusal for Refusal {
    /// The refusal `started` reported, by its code; `refundable` is what is left to refund.
    fn from_code(code: &str, refundable: Option<i64>) -> Option<Refusal> {
        Some(match code {
            "payment_not_found" => Refusal::PaymentNotFound,
            "payment_not_refundable" => Refusal::PaymentNotRefundable,
            "payment_already_refunded" => Refusal::PaymentAlreadyRefunded,
            "refund_exceeds_payment" => Refusal::RefundExceedsPayment { refundable: refundable? },
            _ => return None,
        })
    }
}

impl Refusal {
    pub fn code(self) -> &'static str {
        match self {
            Refusal::PaymentNotFound => "payment_not_found",
            Refusal::PaymentNotRefundable => "payment_not_refundable",
            Refusal::PaymentAlreadyRefunded => "payment_already_refunded",
            Refusal::RefundExceedsPayment { .. } => "refund_exceeds_payment",
        }
    }

    /// The answer, stored under the key and replayed like any other.
    pub fn response(self, payment_id: Uuid, request_id: &RequestId) -> StoredResponse {
        let problem = match self {
            Refusal::PaymentNotFound => {
                Problem::new(ProblemType::PaymentNotFound, "There is no payment with this id in your account.")
            }
            Refusal::PaymentNotRefundable => Problem::new(
                ProblemType::PaymentNotRefundable,
                format!("Payment {payment_id} did not succeed, so there is nothing to refund."),
            ),
            Refusal::PaymentAlreadyRefunded => Problem::new(
                ProblemType::PaymentAlreadyRefunded,
                format!("Payment {payment_id} has nothing left to refund: it is refunded, or its refunds are pending."),
            ),
            Refusal::RefundExceedsPayment { refundable } => {
                let detail = format!(
                    "Payment {payment_id} has {refundable} (minor units) left to refund, less than the amount asked for."
                );
                let problem =
                    Problem::new(ProblemType::RefundExceedsPayment, detail).of_request(Some(request_id.as_str()));
                let problem = problem.with(Refundable { refundable });
                return StoredResponse { status: problem.status(), body: problem.to_bytes() };
            }
        };
        let problem = problem.of_request(Some(request_id.as_str()));
        StoredResponse { status: problem.status(), body: problem.to_bytes() }
    }
}

/// The `refundable` member of a `refund-exceeds-payment` problem.
#[derive(Debug, Serialize)]
struct Refundable {
    refundable: i64,
}

/// The answer to a late retry whose key was reaped, whatever its body: 410, never a second
/// refund. It names the refund the key made, as it stands now.
pub fn expired_key_response(refund: &Refund, request_id: &RequestId) -> StoredResponse {
    let detail = format!(
        "This Idempotency-Key made refund {} on {}, and its stored response has expired. Nothing was refunded now; \
         GET /v1/refunds/{} shows the refund.",
        refund.id,
        refund.created_at.format("%Y-%m-%d %H:%M:%S UTC"),
        refund.id
    );
    let problem = Problem::new(ProblemType::IdempotencyKeyExpired, detail)
        .of_request(Some(request_id.as_str()))
        .with(RefundMember { refund: refund.into() });
    StoredResponse { status: problem.status(), body: problem.to_bytes() }
}
