//! What the client sends: a request to one of the service's idempotent endpoints, and what it
//! knows of that endpoint's answers. The retry loop and the classification of answers are the
//! same for every endpoint; only what this module says differs between them.

use serde::Serialize;

use payments_wire::problem::ProblemType;

/// The service's endpoints that take an `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/payments`.
    Payments,
    /// `POST /v1/refunds`.
    Refunds,
    /// `POST /v1/payments/{id}/capture`.
    Captures,
    /// `POST /v1/payments/{id}/cancel`.
    Cancels,
}

/// The problems every endpoint answers only about the key's own request: the key made something
/// earlier and its record is gone (`410`), the key was used for another request (`422`), the
/// gateway refused what the key asked for (`502`, always stored).
const ABOUT_ANY_KEY: [ProblemType; 3] =
    [ProblemType::IdempotencyKeyExpired, ProblemType::IdempotencyKeyReused, ProblemType::GatewayRejected];

impl Endpoint {
    pub const ALL: [Endpoint; 4] = [Endpoint::Payments, Endpoint::Refunds, Endpoint::Captures, Endpoint::Cancels];

    /// Its path, relative to the service's base URL (`{id}`: the payment a capture or a cancel is
    /// of).
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Payments => "v1/payments",
            Endpoint::Refunds => "v1/refunds",
            Endpoint::Captures => "v1/payments/{id}/capture",
            Endpoint::Cancels => "v1/payments/{id}/cancel",
        }
    }

    /// What a success carries (its `object`), and the member of a problem that embeds it: a
    /// `payment`, a `refund`.
    pub fn object(self) -> &'static str {
        match self {
            Endpoint::Payments | Endpoint::Captures | Endpoint::Cancels => "payment",
            Endpoint::Refunds => "refund",
        }
    }

    /// What a request to it does, said of one that did: `paid`, `refunded`.
    pub fn done(self) -> &'static str {
        match self {
            Endpoint::Payments => "paid",
            Endpoint::Refunds => "refunded",
            Endpoint::Captures => "captured",
            Endpoint::Cancels => "canceled",
        }
    }

    /// The business refusals of this endpoint: decided about the key's own request, once the
    /// service has checked the API key, the headers and the body, and stored under the key. A
    /// payment's card is declined (`402`); a refund's payment is not found (`404`), not
    /// refundable, already refunded, or has less left than asked (`400`). Each is known by its
    /// problem type, never by its status alone: a proxy's `404` is no refusal.
    pub fn refusals(self) -> &'static [ProblemType] {
        match self {
            Endpoint::Payments => &[ProblemType::CardDeclined, ProblemType::UnknownSource],
            Endpoint::Refunds => &[
                ProblemType::PaymentNotFound,
                ProblemType::PaymentNotRefundable,
                ProblemType::PaymentAlreadyRefunded,
                ProblemType::RefundExceedsPayment,
            ],
            Endpoint::Captures => &[
                ProblemType::PaymentNotFound,
                ProblemType::PaymentNotCapturable,
                ProblemType::CaptureExceedsAuthorization,
            ],
            Endpoint::Cancels => &[ProblemType::PaymentNotFound, ProblemType::PaymentNotCancelable],
        }
    }

    /// Every problem this endpoint answers only about the key's own request.
    pub fn problems_about_the_key(self) -> impl Iterator<Item = ProblemType> {
        self.refusals().iter().copied().chain(ABOUT_ANY_KEY)
    }
}

/// A request to an idempotent endpoint, as its JSON body.
pub trait IdempotentRequest: Serialize + Sync {
    const ENDPOINT: Endpoint;

    /// Where it is sent, relative to the service's base URL.
    fn path(&self) -> String {
        Self::ENDPOINT.path().to_owned()
    }
}

/// A payment to make, as `POST /v1/payments` takes it.
#[derive(Debug, Clone, Serialize)]
pub struct NewPayment {
    pub amount: u64,
    pub currency: String,
    pub source: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `false`: only authorize, to capture or cancel later. Sent only then.
    #[serde(skip_serializing_if = "is_at_once")]
    pub capture: bool,
}

fn is_at_once(capture: &bool) -> bool {
    *capture
}

impl IdempotentRequest for NewPayment {
    const ENDPOINT: Endpoint = Endpoint::Payments;
}

/// A refund to make, as `POST /v1/refunds` takes it.
#[derive(Debug, Clone, Serialize)]
pub struct NewRefund {
    /// The payment's id.
    pub payment: String,
    /// In the payment's minor units; all it has left when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount: Option<u64>,
    /// `duplicate`, `fraudulent` or `requested_by_customer`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl IdempotentRequest for NewRefund {
    const ENDPOINT: Endpoint = Endpoint::Refunds;
}

/// A capture of an authorized payment, as `POST /v1/payments/{id}/capture` takes it.
#[derive(Debug, Clone, Serialize)]
pub struct NewCapture {
    /// The payment's id: in the path, not the body.
    #[serde(skip)]
    pub payment: uuid::Uuid,
    /// In the payment's minor units; all of the authorization when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount: Option<u64>,
}

impl IdempotentRequest for NewCapture {
    const ENDPOINT: Endpoint = Endpoint::Captures;

    fn path(&self) -> String {
        format!("v1/payments/{}/capture", self.payment)
    }
}

/// A cancel of an authorized payment, as `POST /v1/payments/{id}/cancel` takes it.
#[derive(Debug, Clone, Serialize)]
pub struct NewCancel {
    /// The payment's id: in the path, not the body.
    #[serde(skip)]
    pub payment: uuid::Uuid,
    /// `duplicate`, `fraudulent`, `requested_by_customer` or `abandoned`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl IdempotentRequest for NewCancel {
    const ENDPOINT: Endpoint = Endpoint::Cancels;

    fn path(&self) -> String {
        format!("v1/payments/{}/cancel", self.payment)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refund_leaves_out_what_it_does_not_say() {
        let whole = NewRefund { payment: "pay_1".into(), amount: None, reason: None };
        assert_eq!(serde_json::to_string(&whole).unwrap(), r#"{"payment":"pay_1"}"#);
        let part = NewRefund { payment: "pay_1".into(), amount: Some(300), reason: Some("duplicate".into()) };
        assert_eq!(serde_json::to_string(&part).unwrap(), r#"{"payment":"pay_1","amount":300,"reason":"duplicate"}"#);
    }
}
