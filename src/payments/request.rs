//! The body of `POST /v1/payments`: what clients send, and what it means once validated.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The largest amount, in minor units (99,999,999 cents is just under a million dollars).
pub const MAX_AMOUNT: i64 = 99_999_999;
pub const MAX_DESCRIPTION_CHARS: usize = 500;
pub const MAX_METADATA_KEYS: usize = 20;
pub const MAX_METADATA_KEY_CHARS: usize = 40;
pub const MAX_METADATA_VALUE_CHARS: usize = 500;
pub const MAX_SOURCE_CHARS: usize = 255;

/// The JSON body as clients send it. Unknown fields are rejected, so that a typo
/// (`"ammount"`) is a 400 instead of a silently different payment.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreatePaymentBody {
    pub amount: i64,
    pub currency: String,
    pub source: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// A validated payment request in canonical form: currency lower case, metadata always present
/// (sorted). Its JSON is what the fingerprint covers and what is stored for the workers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentRequest {
    pub amount: i64,
    pub currency: String,
    pub description: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub source: String,
}

/// A body that parsed as JSON but breaks a rule; the message says which, for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ValidationError(pub String);

impl CreatePaymentBody {
    /// Checks every rule and returns the canonical request, or the first rule broken.
    pub fn validate(self) -> Result<PaymentRequest, ValidationError> {
        let fail = |message: String| Err(ValidationError(message));
        if !(1..=MAX_AMOUNT).contains(&self.amount) {
            return fail(format!("amount must be an integer from 1 to {MAX_AMOUNT} (minor units)"));
        }
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_alphabetic()) {
            return fail("currency must be a three-letter ISO 4217 code, such as \"usd\"".into());
        }
        let source_ok = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if self.source.is_empty() || self.source.len() > MAX_SOURCE_CHARS || !source_ok(&self.source) {
            return fail(format!(
                "source must be a payment token of 1 to {MAX_SOURCE_CHARS} letters, digits and underscores, such as \"tok_visa\""
            ));
        }
        if self.description.as_ref().is_some_and(|d| d.chars().count() > MAX_DESCRIPTION_CHARS) {
            return fail(format!("description must be at most {MAX_DESCRIPTION_CHARS} characters"));
        }
        // PostgreSQL text cannot hold NUL; anything else (new lines included) is the client's to use.
        let has_nul = |text: &str| text.contains('\0');
        if self.description.as_deref().is_some_and(has_nul)
            || self.metadata.iter().flatten().any(|(key, value)| has_nul(key) || has_nul(value))
        {
            return fail("description and metadata may not contain NUL characters".into());
        }
        let metadata = self.metadata.unwrap_or_default();
        if metadata.len() > MAX_METADATA_KEYS {
            return fail(format!("metadata may have at most {MAX_METADATA_KEYS} keys"));
        }
        for (key, value) in &metadata {
            if key.is_empty() || key.chars().count() > MAX_METADATA_KEY_CHARS {
                return fail(format!("metadata keys must be 1 to {MAX_METADATA_KEY_CHARS} characters"));
            }
            if value.chars().count() > MAX_METADATA_VALUE_CHARS {
                return fail(format!("metadata values must be at most {MAX_METADATA_VALUE_CHARS} characters"));
            }
        }
        Ok(PaymentRequest {
            amount: self.amount,
            currency: self.currency.to_ascii_lowercase(),
            description: self.description,
            metadata,
            source: self.source,
        })
    }
}

impl PaymentRequest {
    /// The canonical JSON value: fingerprinted, and stored as the key's request params.
    pub fn to_params(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a payment request always serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: &str) -> CreatePaymentBody {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn validation_canonicalises_the_request() {
        let request = body(r#"{"amount": 1000, "currency": "USD", "source": "tok_visa"}"#).validate().unwrap();
        assert_eq!(request.currency, "usd");
        assert_eq!(
            serde_json::to_string(&request.to_params()).unwrap(),
            r#"{"amount":1000,"currency":"usd","description":null,"metadata":{},"source":"tok_visa"}"#
        );
    }

    #[test]
    fn each_rule_rejects_with_a_message() {
        let long = "x".repeat(501);
        let many: String = (0..21).map(|i| format!(r#""k{i}": "v""#)).collect::<Vec<_>>().join(",");
        let cases = [
            r#"{"amount": 0, "currency": "usd", "source": "tok_visa"}"#.to_string(),
            r#"{"amount": 100000000, "currency": "usd", "source": "tok_visa"}"#.to_string(),
            r#"{"amount": 100, "currency": "us", "source": "tok_visa"}"#.to_string(),
            r#"{"amount": 100, "currency": "u$d", "source": "tok_visa"}"#.to_string(),
            r#"{"amount": 100, "currency": "usd", "source": ""}"#.to_string(),
            r#"{"amount": 100, "currency": "usd", "source": "tok visa"}"#.to_string(),
            format!(r#"{{"amount": 100, "currency": "usd", "source": "tok_visa", "description": "{long}"}}"#),
            format!(r#"{{"amount": 100, "currency": "usd", "source": "tok_visa", "metadata": {{{many}}}}}"#),
            r#"{"amount": 100, "currency": "usd", "source": "tok_visa", "metadata": {"": "v"}}"#.to_string(),
            r#"{"amount": 100, "currency": "usd", "source": "tok_visa", "description": "a\u0000b"}"#.to_string(),
            r#"{"amount": 100, "currency": "usd", "source": "tok_visa", "metadata": {"k": "a\u0000b"}}"#.to_string(),
        ];
        for case in cases {
            assert!(body(&case).validate().is_err(), "{case}");
        }
    }

    #[test]
    fn unknown_fields_and_wrong_types_do_not_parse() {
        for case in [
            r#"{"amount": 100, "currency": "usd", "source": "tok_visa", "ammount": 1}"#,
            r#"{"amount": 10.5, "currency": "usd", "source": "tok_visa"}"#,
            r#"{"amount": "100", "currency": "usd", "source": "tok_visa"}"#,
            r#"{"amount": 100, "currency": "usd", "source": "tok_visa", "metadata": {"k": 1}}"#,
        ] {
            assert!(serde_json::from_str::<CreatePaymentBody>(case).is_err(), "{case}");
        }
    }
}
