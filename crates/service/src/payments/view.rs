//! Payments as the API shows them, and the final responses stored for replay.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::model::{CaptureMethod, Failure, Payment, PaymentStatus};
use crate::idempotency::{PhaseError, StoredResponse};
use crate::problem::{Problem, ProblemType};
use crate::request_id::RequestId;

/// A payment in API responses.
#[derive(Debug, Serialize)]
pub struct PaymentView<'a> {
    pub id: Uuid,
    pub object: &'static str,
    pub amount: i64,
    pub currency: &'a str,
    pub status: PaymentStatus,
    pub description: Option<&'a str>,
    pub metadata: &'a serde_json::Value,
    pub gateway_charge_id: Option<&'a str>,
    pub failure_code: Option<&'a str>,
    /// The gateway's own words about a failure (`null` when there are none). Left out altogether
    /// (`None`) where only facts and codes are shown: a key's story.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<Option<&'a str>>,
    /// The sum of its succeeded refunds, and whether that is all it captured.
    pub amount_refunded: i64,
    pub refunded: bool,
    /// Charged at once (`automatic`), or authorized to be captured later (`manual`).
    pub capture_method: CaptureMethod,
    /// What it captured (an `automatic` payment: its amount, once it succeeded), and what a
    /// capture could take now (an authorization still open: its amount).
    pub amount_captured: i64,
    pub amount_capturable: i64,
    /// When an authorization lapses, if it is not captured or cancelled before.
    pub capture_before: Option<DateTime<Utc>>,
    pub canceled_at: Option<DateTime<Utc>>,
    pub cancellation_reason: Option<&'a str>,
    pub created_at: DateTime<Utc>,
}

impl<'a> From<&'a Payment> for PaymentView<'a> {
    fn from(payment: &'a Payment) -> Self {
        PaymentView {
            id: payment.id,
            object: "payment",
            amount: payment.amount,
            currency: &payment.currency,
            status: payment.status,
            description: payment.description.as_deref(),
            metadata: &payment.metadata,
            gateway_charge_id: payment.gateway_charge_id.as_deref(),
            failure_code: payment.failure_code.as_deref(),
            failure_message: Some(payment.failure_message.as_deref()),
            amount_refunded: payment.amount_refunded,
            refunded: payment.amount_captured() > 0 && payment.amount_refunded == payment.amount_captured(),
            capture_method: payment.capture_method,
            amount_captured: payment.amount_captured(),
            amount_capturable: payment.amount_capturable(),
            capture_before: payment.capture_before,
            canceled_at: payment.canceled_at,
            cancellation_reason: payment.cancellation_reason.as_deref(),
            created_at: payment.created_at,
        }
    }
}

impl<'a> PaymentView<'a> {
    /// The payment without the gateway's own words (`failure_message`, which may say anything),
    /// for a view that shows only facts and codes: its `failure_code` is there.
    pub fn facts_only(payment: &'a Payment) -> Self {
        PaymentView { failure_message: None, ..PaymentView::from(payment) }
    }
}

/// A page of payments in API responses.
#[derive(Debug, Serialize)]
pub struct PaymentList<'a> {
    pub object: &'static str,
    pub data: Vec<PaymentView<'a>>,
    pub has_more: bool,
}

impl<'a> PaymentList<'a> {
    pub fn new(payments: &'a [Payment], has_more: bool) -> Self {
        PaymentList { object: "list", data: payments.iter().map(PaymentView::from).collect(), has_more }
    }
}

/// The `payment` member of a problem about a payment.
#[derive(Debug, Serialize)]
struct PaymentMember<'a> {
    payment: PaymentView<'a>,
}

/// The answer to a late retry whose key was reaped, whatever its body: 410, never a second charge.
/// It names the payment the key made (its current state), so the client can fetch it. Made anew
/// for each such retry, never stored: there is no key row left to store it on.
pub fn expired_key_response(payment: &Payment, request_id: &RequestId) -> StoredResponse {
    let detail = format!(
        "This Idempotency-Key made payment {} on {}, and its stored response has expired. Nothing was charged \
         now; GET /v1/payments/{} shows the payment.",
        payment.id,
        payment.created_at.format("%Y-%m-%d %H:%M:%S UTC"),
        payment.id
    );
    let problem = Problem::new(ProblemType::IdempotencyKeyExpired, detail)
        .of_request(Some(request_id.as_str()))
        .with(PaymentMember { payment: payment.into() });
    StoredResponse { status: problem.status(), body: problem.to_bytes() }
}

/// The definitive answer to the request that created `payment`: 201 with the payment; 402 for a
/// decline or a source the gateway does not know, and 502 for any other rejection, each a problem
/// that embeds the failed payment and names the request that finished it (`request_id`; a replay
/// sends the same bytes, so the id stays that request's).
pub fn final_response(payment: &Payment, request_id: &RequestId) -> Result<StoredResponse, PhaseError> {
    let view = PaymentView::from(payment);
    let failure = match payment.status {
        // An authorization is answered as a payment made: 201, to be captured or cancelled.
        PaymentStatus::Succeeded | PaymentStatus::RequiresCapture | PaymentStatus::Canceled => {
            let body = serde_json::to_vec(&view).expect("a payment always serialises");
            return Ok(StoredResponse { status: 201, body });
        }
        PaymentStatus::Pending => {
            return Err(PhaseError::Inconsistent(format!("payment {} is still pending", payment.id)));
        }
        PaymentStatus::Failed => payment.failure().unwrap_or(Failure::Declined),
    };
    let problem = match failure {
        Failure::GatewayRejected => Problem::new(
            ProblemType::GatewayRejected,
            "The payment gateway refused the charge for a reason other than the card; nothing was charged.",
        ),
        Failure::UnknownSource => Problem::new(
            ProblemType::UnknownSource,
            "The payment gateway knows no payment method by this source; nothing was charged. Check the `source` \
             and pay with a new Idempotency-Key.",
        ),
        Failure::Declined => Problem::new(
            ProblemType::CardDeclined,
            format!(
                "{} ({})",
                payment.failure_message.as_deref().unwrap_or("The card was declined."),
                payment.failure_code.as_deref().unwrap_or("card_declined")
            ),
        ),
    };
    let problem = problem.of_request(Some(request_id.as_str())).with(PaymentMember { payment: view });
    Ok(StoredResponse { status: problem.status(), body: problem.to_bytes() })
}
