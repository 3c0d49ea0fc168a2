//! The body of `POST /v1/refunds`: what clients send, and what it means once validated.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::payments::{MAX_AMOUNT, ValidationError, integral_number, validate_metadata};

/// Why a refund is made, as Stripe names the reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundReason {
    Duplicate,
    Fraudulent,
    RequestedByCustomer,
}

impl RefundReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RefundReason::Duplicate => "duplicate",
            RefundReason::Fraudulent => "fraudulent",
            RefundReason::RequestedByCustomer => "requested_by_customer",
        }
    }
}

/// The JSON body as clients send it. Unknown fields are rejected, like a payment's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRefundBody {
    /// The payment's id.
    pub payment: Uuid,
    /// Minor units; all that is still refundable when absent.
    #[serde(default, deserialize_with = "optional_integral_number")]
    pub amount: Option<i64>,
    #[serde(default)]
    pub reason: Option<RefundReason>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// A validated refund request in canonical form (metadata always present, sorted): what the
/// fingerprint covers and what is stored for the workers. The amount stays absent when the client
/// left it out: "all that is still refundable" is decided when the refund starts, under the
/// payment's lock, not here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundRequest {
    pub payment: Uuid,
    pub amount: Option<i64>,
    pub reason: Option<RefundReason>,
    pub metadata: BTreeMap<String, String>,
}

impl CreateRefundBody {
    /// Checks every rule and returns the canonical request, or the first rule broken. Whether the
    /// payment exists and has this much left to refund is for the refund's first phase to decide.
    pub fn validate(self) -> Result<RefundRequest, ValidationError> {
        if let Some(amount) = self.amount
            && !(1..=MAX_AMOUNT).contains(&amount)
        {
            return Err(ValidationError(format!(
                "amount must be an integer from 1 to {MAX_AMOUNT} (minor units of the payment's currency), or left out \
                 to refund all that is left"
            )));
        }
        let metadata = validate_metadata(self.metadata)?;
        Ok(RefundRequest { payment: self.payment, amount: self.amount, reason: self.reason, metadata })
    }
}

impl RefundRequest {
    /// The canonical JSON value: fingerprinted, and stored as the key's request params.
    pub fn to_params(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a refund request always serialises")
    }
}

fn optional_integral_number<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<i64>, D::Error> {
    #[derive(Deserialize)]
    struct Amount(#[serde(deserialize_with = "integral_number")] i64);
    Ok(Option::<Amount>::deserialize(deserializer)?.map(|Amount(amount)| amount))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: &str) -> Result<CreateRefundBody, serde_json::Error> {
        serde_json::from_str(json)
    }

    const PAYMENT: &str = "01a201b1-403b-7713-8cbf-b168bb4bbbf2";

    #[test]
    fn validation_canonicalises_the_request() {
        let request = body(&format!(r#"{{"payment": "{PAYMENT}", "amount": 500.0}}"#)).unwrap().validate().unwrap();
        assert_eq!(
            serde_json::to_string(&request.to_params()).unwrap(),
            format!(r#"{{"amount":500,"metadata":{{}},"payment":"{PAYMENT}","reason":null}}"#)
        );
        let whole = body(&format!(r#"{{"payment": "{PAYMENT}", "reason": "duplicate", "metadata": null}}"#));
        let whole = whole.unwrap().validate().unwrap();
        assert_eq!((whole.amount, whole.reason), (None, Some(RefundReason::Duplicate)));
    }

    #[test]
    fn each_rule_rejects() {
        for case in [
            format!(r#"{{"payment": "{PAYMENT}", "amount": 0}}"#),
            format!(r#"{{"payment": "{PAYMENT}", "amount": 100000000}}"#),
            format!(r#"{{"payment": "{PAYMENT}", "metadata": {{"": "v"}}}}"#),
        ] {
            assert!(body(&case).unwrap().validate().is_err(), "{case}");
        }
        for case in [
            r#"{"amount": 100}"#.to_owned(),
            r#"{"payment": "not-a-uuid"}"#.to_owned(),
            format!(r#"{{"payment": "{PAYMENT}", "amount": 10.5}}"#),
            format!(r#"{{"payment": "{PAYMENT}", "reason": "bored"}}"#),
            format!(r#"{{"payment": "{PAYMENT}", "charge": "ch_1"}}"#),
        ] {
            assert!(body(&case).is_err(), "{case}");
        }
    }
}
