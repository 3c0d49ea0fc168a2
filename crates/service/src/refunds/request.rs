//! The body of `POST /v1/refunds`: what clients send, and what it means once validated.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::fields::ValidationError;
use crate::fields::{IntegralNumber, Omittable, metadata_sent_once};
use crate::idempotency::Canonical;
use crate::payments::{MAX_AMOUNT, validate_metadata};

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
    /// Minor units; all that is still refundable when left out. Never `null`: an amount lost on
    /// its way refunds nothing, rather than everything left.
    #[serde(default)]
    pub amount: Omittable<IntegralNumber>,
    #[serde(default)]
    pub reason: Option<RefundReason>,
    #[serde(default, deserialize_with = "metadata_sent_once")]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// A validated refund request in canonical form (metadata always present, sorted): what the
/// fingerprint covers and what is stored for the workers. The amount stays absent when the client
/// left it out: "all that is still refundable" is decided when the refund starts, under the
/// payment's lock, not here. Its fields are declared in alphabetical order, so that it is
/// fingerprinted as it is, with no JSON value built, and as its JSON value would be (see
/// `Fingerprint::of`; a test holds the two together).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundRequest {
    pub amount: Option<i64>,
    pub metadata: BTreeMap<String, String>,
    pub payment: Uuid,
    pub reason: Option<RefundReason>,
}

// Its fields are declared sorted and its maps are `BTreeMap`s; the tests below hold it to its
// JSON value's bytes.
impl Canonical for RefundRequest {}

impl CreateRefundBody {
    /// Checks every rule and returns the canonical request, or the first rule broken. Whether the
    /// payment exists and has this much left to refund is for the refund's first phase to decide.
    pub fn validate(self) -> Result<RefundRequest, ValidationError> {
        let amount = self.amount.sent().map(|IntegralNumber(amount)| amount);
        if let Some(amount) = amount
            && !(1..=MAX_AMOUNT).contains(&amount)
        {
            return Err(ValidationError::new(format!(
                "amount must be an integer from 1 to {MAX_AMOUNT} (minor units of the payment's currency), or left out \
                 to refund all that is left"
            )));
        }
        let metadata = validate_metadata(self.metadata)?;
        Ok(RefundRequest { amount, metadata, payment: self.payment, reason: self.reason })
    }
}

impl RefundRequest {
    /// The canonical JSON value: fingerprinted, and stored as the key's request params.
    pub fn to_params(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a refund request always serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::Fingerprint;

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

    /// A body with every field, in another order, its metadata keys out of order; and one with only
    /// the payment (in upper case, which names the same payment).
    const FULL: &str = r#"{"metadata": {"order": "1", "a": "b\u00e9"}, "reason": "requested_by_customer",
        "amount": 500.0, "payment": "01A201B1-403B-7713-8CBF-B168BB4BBBF2"}"#;
    const PLAIN: &str = r#"{"payment": "01a201b1-403b-7713-8cbf-b168bb4bbbf2"}"#;

    #[test]
    fn a_request_is_fingerprinted_as_its_json_value_would_be() {
        for json in [FULL, PLAIN] {
            let request = body(json).unwrap().validate().unwrap();
            let as_value = request.to_params();
            assert_eq!(serde_json::to_string(&request).unwrap(), serde_json::to_string(&as_value).unwrap());
            assert_eq!(Fingerprint::of(&request), Fingerprint::of(&as_value));
        }
    }

    #[test]
    fn stored_keys_keep_their_fingerprints() {
        // The digests keys were stored with when a request was fingerprinted by its JSON value.
        for (json, stored) in [
            (PLAIN, "56ef6471e512a1e15a34951e60abfd0dc0194f36cc52bf95b7e5c463611ad68d"),
            (FULL, "df1185e75c5fa08e49962292860d58ff4082be6d62fa6aff747c8df242db3737"),
        ] {
            let request = body(json).unwrap().validate().unwrap();
            assert_eq!(hex::encode(Fingerprint::of(&request).as_bytes()), stored, "{json}");
        }
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
            format!(r#"{{"payment": "{PAYMENT}", "amount": null}}"#),
            format!(r#"{{"payment": "{PAYMENT}", "amount": 0.99999999999999999}}"#),
            format!(r#"{{"payment": "{PAYMENT}", "metadata": {{"k": "1", "k": "1"}}}}"#),
            format!(r#"{{"payment": "{PAYMENT}", "reason": "bored"}}"#),
            format!(r#"{{"payment": "{PAYMENT}", "charge": "ch_1"}}"#),
        ] {
            assert!(body(&case).is_err(), "{case}");
        }
    }
}
