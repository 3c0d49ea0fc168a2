//! What the gateway is asked to do under an idempotency key: the bodies of `POST /v1/charges`
//! and `POST /v1/refunds`, and the captures and cancels of a charge (`POST /v1/charges/{id}/capture`
//! and `/cancel`), checked and fingerprinted before anything is recorded.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The endpoints that do something under an idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    Charges,
    Refunds,
    Captures,
    Cancels,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Endpoint::Charges => "/v1/charges",
            Endpoint::Refunds => "/v1/refunds",
            Endpoint::Captures => "/v1/charges/{id}/capture",
            Endpoint::Cancels => "/v1/charges/{id}/cancel",
        }
    }
}

/// The body of `POST /v1/charges`.
///
/// It also serializes: re-serializing the parsed body gives the canonical
/// form that is fingerprinted (fixed field order, sorted metadata), so two
/// bodies that differ only in key order or whitespace count as the same.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ChargeRequest {
    pub(super) amount: u64,
    pub(super) currency: String,
    pub(super) source: String,
    #[serde(default)]
    pub(super) description: Option<String>,
    #[serde(default)]
    pub(super) metadata: BTreeMap<String, String>,
    /// Whether the money moves now (the default), or is only authorized, to be captured (or
    /// cancelled) later.
    #[serde(default = "at_once")]
    pub(super) capture: bool,
}

fn at_once() -> bool {
    true
}

/// The body of `POST /v1/refunds`, serialized for its fingerprint like a charge's.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RefundRequest {
    /// The charge to refund.
    pub(super) charge: String,
    /// How much, in the charge's minor units; by default all that the charge has left.
    #[serde(default)]
    pub(super) amount: Option<u64>,
    #[serde(default)]
    pub(super) reason: Option<String>,
    #[serde(default)]
    pub(super) metadata: BTreeMap<String, String>,
}

/// A capture of an authorized charge: the charge (from the path) and how much of it, by default
/// all; what is not captured is released. Serialized with the charge for its fingerprint, so one
/// key cannot capture two charges.
#[derive(Debug, Clone, Serialize)]
pub(super) struct CaptureRequest {
    pub(super) charge: String,
    pub(super) amount: Option<u64>,
}

/// The body of `POST /v1/charges/{id}/capture`, which may be left out.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CaptureBody {
    #[serde(default)]
    pub(super) amount: Option<u64>,
}

/// A cancel of an authorized charge (from the path): its hold released, nothing captured.
#[derive(Debug, Clone, Serialize)]
pub(super) struct CancelRequest {
    pub(super) charge: String,
}

/// The body of `POST /v1/charges/{id}/cancel`: nothing, or an empty object.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CancelBody {}

/// The reasons Stripe takes for a refund.
const REFUND_REASONS: [&str; 3] = ["duplicate", "fraudulent", "requested_by_customer"];

/// Why a request was refused before anything was recorded (not stored under its key).
#[derive(Debug, thiserror::Error)]
pub(super) enum InvalidRequest {
    #[error("Invalid amount: must be a positive integer.")]
    Amount,
    #[error("Invalid currency: {0:?} is not a three-letter currency code.")]
    Currency(String),
    #[error("No such token: '{0}'")]
    NoSuchToken(String),
    #[error("Invalid reason: must be one of duplicate, fraudulent or requested_by_customer.")]
    Reason,
}

impl InvalidRequest {
    /// The request parameter the error is about, as Stripe names it.
    pub(super) fn param(&self) -> &'static str {
        match self {
            InvalidRequest::Amount => "amount",
            InvalidRequest::Currency(_) => "currency",
            InvalidRequest::NoSuchToken(_) => "source",
            InvalidRequest::Reason => "reason",
        }
    }
}

/// A body that makes something under an idempotency key.
pub(super) trait Create: Serialize {
    const ENDPOINT: Endpoint;

    /// Checks what serde cannot: values that parse but make no sense.
    fn validate(&self) -> Result<(), InvalidRequest>;

    /// SHA-256 of the endpoint and the canonical JSON of this body, in hex: a key used on one
    /// endpoint never matches a body sent to the other.
    fn fingerprint(&self) -> String {
        let canonical = serde_json::to_vec(self).expect("a request body always serializes");
        let digest = Sha256::new().chain_update(Self::ENDPOINT.path()).chain_update([0]).chain_update(canonical);
        hex::encode(digest.finalize())
    }
}

impl Create for ChargeRequest {
    const ENDPOINT: Endpoint = Endpoint::Charges;

    fn validate(&self) -> Result<(), InvalidRequest> {
        if self.amount == 0 {
            return Err(InvalidRequest::Amount);
        }
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(InvalidRequest::Currency(self.currency.clone()));
        }
        if !self.source.starts_with("tok_") {
            return Err(InvalidRequest::NoSuchToken(self.source.clone()));
        }
        Ok(())
    }
}

impl Create for CaptureRequest {
    const ENDPOINT: Endpoint = Endpoint::Captures;

    /// Whether the charge can be captured, and for as much, is the ledger's to say (and stored).
    fn validate(&self) -> Result<(), InvalidRequest> {
        match self.amount {
            Some(0) => Err(InvalidRequest::Amount),
            _ => Ok(()),
        }
    }
}

impl Create for CancelRequest {
    const ENDPOINT: Endpoint = Endpoint::Cancels;

    fn validate(&self) -> Result<(), InvalidRequest> {
        Ok(())
    }
}

impl Create for RefundRequest {
    const ENDPOINT: Endpoint = Endpoint::Refunds;

    /// Whether the charge exists and has enough left is the ledger's to say (and stored).
    fn validate(&self) -> Result<(), InvalidRequest> {
        if self.amount == Some(0) {
            return Err(InvalidRequest::Amount);
        }
        if self.reason.as_deref().is_some_and(|reason| !REFUND_REASONS.contains(&reason)) {
            return Err(InvalidRequest::Reason);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &str = r#"{"amount": 500, "currency": "USD", "source": "tok_visa"}"#;

    fn charge(json: &str) -> ChargeRequest {
        serde_json::from_str(json).expect("test body parses")
    }

    fn refund(json: &str) -> RefundRequest {
        serde_json::from_str(json).expect("test body parses")
    }

    #[test]
    fn validation_rejects_nonsense() {
        let bad = [
            r#"{"amount": 0, "currency": "usd", "source": "tok_visa"}"#,
            r#"{"amount": 1, "currency": "us", "source": "tok_visa"}"#,
            r#"{"amount": 1, "currency": "u$d", "source": "tok_visa"}"#,
            r#"{"amount": 1, "currency": "usd", "source": "card_123"}"#,
        ];
        for body in bad {
            assert!(charge(body).validate().is_err(), "{body}");
        }
        assert!(charge(BODY).validate().is_ok());
        for body in [r#"{"charge": "ch_1", "amount": 0}"#, r#"{"charge": "ch_1", "reason": "bored"}"#] {
            assert!(refund(body).validate().is_err(), "{body}");
        }
        let good = r#"{"charge": "ch_1", "amount": 5, "reason": "duplicate", "metadata": {"a": "b"}}"#;
        assert!(refund(good).validate().is_ok());
        assert!(refund(r#"{"charge": "ch_1"}"#).validate().is_ok(), "the amount is optional");
    }

    #[test]
    fn fingerprint_ignores_key_order_but_not_values() {
        let fingerprint = charge(BODY).fingerprint();
        let reordered = r#"{"source": "tok_visa", "currency": "USD", "amount": 500}"#;
        let other = r#"{"amount": 501, "currency": "USD", "source": "tok_visa"}"#;
        assert_eq!(charge(reordered).fingerprint(), fingerprint);
        assert_ne!(charge(other).fingerprint(), fingerprint);
        let refund_fingerprint = refund(r#"{"charge": "ch_1", "amount": 5}"#).fingerprint();
        assert_eq!(refund(r#"{"amount": 5, "charge": "ch_1"}"#).fingerprint(), refund_fingerprint);
        assert_ne!(refund(r#"{"charge": "ch_1", "amount": 6}"#).fingerprint(), refund_fingerprint);
        assert_ne!(refund(r#"{"charge": "ch_1"}"#).fingerprint(), refund_fingerprint, "all left is not 5");
        let authorize = r#"{"amount": 500, "currency": "USD", "source": "tok_visa", "capture": false}"#;
        assert_ne!(charge(authorize).fingerprint(), fingerprint, "an authorization is not a charge");
        let explicit = r#"{"amount": 500, "currency": "USD", "source": "tok_visa", "capture": true}"#;
        assert_eq!(charge(explicit).fingerprint(), fingerprint, "capture at once is the default");
    }

    #[test]
    fn a_capture_or_cancel_is_of_one_charge() {
        let capture = |charge: &str, amount| CaptureRequest { charge: charge.into(), amount }.fingerprint();
        assert_eq!(capture("ch_1", Some(5)), capture("ch_1", Some(5)));
        assert_ne!(capture("ch_1", Some(5)), capture("ch_2", Some(5)), "another charge");
        assert_ne!(capture("ch_1", Some(5)), capture("ch_1", None), "all of it is not 5");
        let cancel = CancelRequest { charge: "ch_1".into() }.fingerprint();
        assert_ne!(cancel, capture("ch_1", None), "a cancel is not a capture");
        assert!(CaptureRequest { charge: "ch_1".into(), amount: Some(0) }.validate().is_err());
    }
}
