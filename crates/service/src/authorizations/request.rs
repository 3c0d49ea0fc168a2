//! The bodies of `POST /v1/payments/{id}/capture` and `/cancel`: what clients send, and what it
//! means once validated.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::fields::ValidationError;
use crate::fields::{IntegralNumber, Omittable};
use crate::idempotency::{Canonical, Endpoint};
use crate::payments::MAX_AMOUNT;

/// What a change does to an authorization: capture it (all or part; the rest is released), or
/// cancel it (release all of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Capture,
    Cancel,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Capture => "capture",
            ChangeKind::Cancel => "cancel",
        }
    }
}

/// A capture's body: how much to capture (all of the authorization when left out; never `null`,
/// so an amount lost on its way captures nothing rather than everything).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureBody {
    #[serde(default)]
    pub amount: Omittable<IntegralNumber>,
}

/// Why a payment is cancelled, as Stripe names the reasons a client may give. (`expired`, an
/// authorization that lapsed, is the lapse's own.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancellationReason {
    Duplicate,
    Fraudulent,
    RequestedByCustomer,
    Abandoned,
    Expired,
}

impl CancellationReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CancellationReason::Duplicate => "duplicate",
            CancellationReason::Fraudulent => "fraudulent",
            CancellationReason::RequestedByCustomer => "requested_by_customer",
            CancellationReason::Abandoned => "abandoned",
            CancellationReason::Expired => "expired",
        }
    }
}

/// A cancel's body: why, if the client says (`null`, the same as nothing).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    #[serde(default)]
    pub reason: Option<ClientReason>,
}

/// The reasons a client may give for a cancel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientReason {
    Duplicate,
    Fraudulent,
    RequestedByCustomer,
    Abandoned,
}

/// A validated capture or cancel in canonical form: what the fingerprint covers (the payment, from
/// the path, with it: the same key on another payment is another request) and what is stored for
/// the workers. A capture's amount stays absent when the client left it out: "all of it" is decided
/// when the capture starts, against the payment. Its fields are declared in alphabetical order, so
/// that it is fingerprinted as it is, and as its JSON value would be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeRequest {
    pub amount: Option<i64>,
    pub kind: ChangeKind,
    pub payment: Uuid,
    pub reason: Option<CancellationReason>,
}

impl Canonical for ChangeRequest {}

/// A capture's or a cancel's body: the endpoint it is sent to, and the request it makes of a
/// payment.
pub trait ChangeBody: serde::de::DeserializeOwned + 'static {
    const ENDPOINT: &'static Endpoint;

    fn validate(self, payment: Uuid) -> Result<ChangeRequest, ValidationError>;
}

impl ChangeBody for CaptureBody {
    const ENDPOINT: &'static Endpoint = &super::CAPTURE;

    /// The capture of `payment`, or the rule its amount breaks. Whether the payment is an
    /// authorization with this much in it is for the capture's first phase to decide.
    fn validate(self, payment: Uuid) -> Result<ChangeRequest, ValidationError> {
        let amount = self.amount.sent().map(|IntegralNumber(amount)| amount);
        if let Some(amount) = amount
            && !(1..=MAX_AMOUNT).contains(&amount)
        {
            return Err(ValidationError::new(format!(
                "amount must be an integer from 1 to {MAX_AMOUNT} (minor units of the payment's currency), or left out \
                 to capture all of the authorization"
            )));
        }
        Ok(ChangeRequest { amount, kind: ChangeKind::Capture, payment, reason: None })
    }
}

impl ChangeBody for CancelBody {
    const ENDPOINT: &'static Endpoint = &super::CANCEL;

    /// The cancel of `payment`.
    fn validate(self, payment: Uuid) -> Result<ChangeRequest, ValidationError> {
        let reason = self.reason.map(|reason| match reason {
            ClientReason::Duplicate => CancellationReason::Duplicate,
            ClientReason::Fraudulent => CancellationReason::Fraudulent,
            ClientReason::RequestedByCustomer => CancellationReason::RequestedByCustomer,
            ClientReason::Abandoned => CancellationReason::Abandoned,
        });
        Ok(ChangeRequest { amount: None, kind: ChangeKind::Cancel, payment, reason })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::Fingerprint;

    #[test]
    fn the_payment_and_the_amount_are_the_request() {
        let (one, two) = (Uuid::now_v7(), Uuid::now_v7());
        let capture =
            |payment, json: &str| serde_json::from_str::<CaptureBody>(json).unwrap().validate(payment).unwrap();
        let all = capture(one, "{}");
        assert_eq!(Fingerprint::of(&all), Fingerprint::of(&serde_json::to_value(&all).unwrap()), "as its JSON value");
        assert_ne!(Fingerprint::of(&all), Fingerprint::of(&capture(two, "{}")), "another payment");
        assert_ne!(Fingerprint::of(&all), Fingerprint::of(&capture(one, r#"{"amount": 5}"#)), "another amount");
        let cancel = serde_json::from_str::<CancelBody>("{}").unwrap().validate(one).unwrap();
        assert_ne!(Fingerprint::of(&all), Fingerprint::of(&cancel), "a cancel is not a capture");
        assert!(serde_json::from_str::<CaptureBody>(r#"{"amount": null}"#).is_err(), "never null");
        assert!(serde_json::from_str::<CaptureBody>(r#"{"amount_to_capture": 5}"#).is_err(), "no unknown field");
        assert!(serde_json::from_str::<CaptureBody>(r#"{"amount": 0}"#).unwrap().validate(one).is_err());
        assert!(serde_json::from_str::<CancelBody>(r#"{"reason": "expired"}"#).is_err(), "the lapse's own");
    }
}
