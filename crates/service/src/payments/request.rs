//! The body of `POST /v1/payments`: what clients send, and what it means once validated.

use std::collections::BTreeMap;

use iso_currency::Currency;
use serde::{Deserialize, Serialize};

use crate::fields::{Omittable, ValidationError, has_nul, integral_number, metadata_sent_once};
use crate::idempotency::Canonical;

/// The largest amount in any currency, in minor units (99,999,999 cents is just under a million
/// dollars).
pub const MAX_AMOUNT: i64 = 99_999_999;
/// An amount is under a million major units (10^6) in every currency, so that a currency with
/// fewer minor units (JPY has none) cannot be charged a hundred times more than a dollar amount.
const MAX_MAJOR_UNIT_DIGITS: u32 = 6;
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
    #[serde(deserialize_with = "integral_number")]
    pub amount: i64,
    pub currency: String,
    pub source: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default, deserialize_with = "metadata_sent_once")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// `false`: only authorize, to capture (or cancel) later. By default the payment is charged at
    /// once.
    #[serde(default)]
    pub capture: Omittable<bool>,
}

/// A validated payment request in canonical form: currency lower case, metadata always present
/// (sorted). Its JSON is what the fingerprint covers and what is stored for the workers. Its fields
/// are declared in alphabetical order, so that it is fingerprinted as it is, with no JSON value
/// built, and as its JSON value would be (see `Fingerprint::of`; a test holds the two together).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentRequest {
    pub amount: i64,
    /// Left out when `true`, the default, so that a payment charged at once has the fingerprint
    /// it had before authorizations existed, and a retry of an older key still matches it.
    #[serde(default = "at_once", skip_serializing_if = "is_at_once")]
    pub capture: bool,
    pub currency: String,
    pub description: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub source: String,
}

// Its fields are declared sorted and its maps are `BTreeMap`s; the tests below hold it to its
// JSON value's bytes.
impl Canonical for PaymentRequest {}

fn at_once() -> bool {
    true
}

fn is_at_once(capture: &bool) -> bool {
    *capture
}

impl CreatePaymentBody {
    /// Checks every rule and returns the canonical request, or the first rule broken.
    pub fn validate(self) -> Result<PaymentRequest, ValidationError> {
        let fail = |message: String| Err(ValidationError::new(message));
        // Lower or upper case, as openapi.yaml lists the codes; a mix ("Usd") is not one.
        let code = self.currency.to_ascii_uppercase();
        let in_one_case = code == self.currency || code.to_ascii_lowercase() == self.currency;
        let Some(currency) = Currency::from_code(&code).filter(|_| in_one_case) else {
            return fail("currency must be an ISO 4217 code in lower or upper case, such as \"usd\"".into());
        };
        let Some(max_amount) = max_amount(currency) else {
            return fail(format!(
                "currency {} has no minor units (a precious metal, a unit of account or a testing code), so it cannot be charged",
                currency.code()
            ));
        };
        if !(1..=max_amount).contains(&self.amount) {
            return fail(format!(
                "amount must be an integer from 1 to {max_amount} in {} (minor units)",
                currency.code()
            ));
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
        if self.description.as_deref().is_some_and(has_nul) {
            return fail("description may not contain NUL characters".into());
        }
        let metadata = validate_metadata(self.metadata)?;
        Ok(PaymentRequest {
            amount: self.amount,
            capture: self.capture.sent().unwrap_or(true),
            currency: self.currency.to_ascii_lowercase(),
            description: self.description,
            metadata,
            source: self.source,
        })
    }
}

/// Checks the rules of `metadata` (a payment's or a refund's): at most [`MAX_METADATA_KEYS`] keys of
/// 1 to [`MAX_METADATA_KEY_CHARS`] characters, values of at most [`MAX_METADATA_VALUE_CHARS`], no
/// NUL anywhere. None is the same as empty.
pub fn validate_metadata(
    metadata: Option<BTreeMap<String, String>>,
) -> Result<BTreeMap<String, String>, ValidationError> {
    let fail = |message: String| Err(ValidationError::new(message));
    let metadata = metadata.unwrap_or_default();
    if metadata.iter().any(|(key, value)| has_nul(key) || has_nul(value)) {
        return fail("metadata may not contain NUL characters".into());
    }
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
    Ok(metadata)
}

/// The largest amount chargeable in `currency`, in its minor units: under a million major units,
/// and never above [`MAX_AMOUNT`]. `None` when ISO 4217 defines no minor units for it (precious
/// metals, units of account, the testing codes XTS and XXX): there is no amount to charge.
fn max_amount(currency: Currency) -> Option<i64> {
    let exponent = u32::from(currency.exponent()?);
    Some((10_i64.saturating_pow(MAX_MAJOR_UNIT_DIGITS + exponent) - 1).min(MAX_AMOUNT))
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
    use crate::idempotency::Fingerprint;

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

    /// A body with every field, its metadata keys out of order (and not all ASCII), its strings in
    /// need of escapes.
    const FULL: &str = r#"{"source": "tok_visa", "metadata": {"z": "last", "a": "first \"quoted\" \\ back",
        "\u00c9": "accent", "Z": "upper"}, "description": "caf\u00e9\n\u2603\t\u0001 </script>", "currency": "eur",
        "amount": 42}"#;
    /// One with only what is required.
    const PLAIN: &str = r#"{"amount": 1000, "currency": "USD", "source": "tok_visa"}"#;

    #[test]
    fn a_request_is_fingerprinted_as_its_json_value_would_be() {
        for json in [FULL, PLAIN] {
            let request = body(json).validate().unwrap();
            let as_value = request.to_params();
            assert_eq!(serde_json::to_string(&request).unwrap(), serde_json::to_string(&as_value).unwrap());
            assert_eq!(Fingerprint::of(&request), Fingerprint::of(&as_value));
        }
    }

    #[test]
    fn stored_keys_keep_their_fingerprints() {
        // The digests keys were stored with when a request was fingerprinted by its JSON value.
        for (json, stored) in [
            (PLAIN, "db0186b4b555e87e6a639627ba335ea3d344e6d6a97b746774716ab3cd781590"),
            (FULL, "69190ccc2ed3d0536dfc70eca216bf0412c1a262ab27a318ddd07e170fef9358"),
        ] {
            let request = body(json).validate().unwrap();
            assert_eq!(hex::encode(Fingerprint::of(&request).as_bytes()), stored, "{json}");
        }
    }

    #[test]
    fn an_authorization_is_another_request_and_capture_at_once_the_same_as_saying_nothing() {
        let with = |capture: &str| {
            let json = format!(r#"{{"amount": 1000, "currency": "USD", "source": "tok_visa"{capture}}}"#);
            body(&json).validate().unwrap()
        };
        let plain = Fingerprint::of(&with(""));
        assert_eq!(Fingerprint::of(&with(r#", "capture": true"#)), plain);
        let authorize = with(r#", "capture": false"#);
        assert!(!authorize.capture);
        assert_ne!(Fingerprint::of(&authorize), plain);
        assert_eq!(Fingerprint::of(&authorize), Fingerprint::of(&authorize.to_params()), "as its JSON value");
        let json = r#"{"amount": 1000, "currency": "USD", "source": "tok_visa", "capture": null}"#;
        assert!(serde_json::from_str::<CreatePaymentBody>(json).is_err(), "capture is not nullable");
    }

    #[test]
    fn no_metadata_null_metadata_and_empty_metadata_are_the_same_request() {
        let params = |metadata: &str| {
            let json = format!(r#"{{"amount": 1000, "currency": "usd", "source": "tok_visa"{metadata}}}"#);
            body(&json).validate().unwrap().to_params()
        };
        assert_eq!(params(r#", "metadata": null"#), params(""));
        assert_eq!(params(r#", "metadata": {}"#), params(""));
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
            format!(
                r#"{{"amount": 100, "currency": "usd", "source": "tok_visa", "metadata": {{"{}": "v"}}}}"#,
                "k".repeat(41)
            ),
            format!(r#"{{"amount": 100, "currency": "usd", "source": "tok_visa", "metadata": {{"k": "{long}"}}}}"#),
            r#"{"amount": 100, "currency": "usd", "source": "tok_visa", "description": "a\u0000b"}"#.to_string(),
            r#"{"amount": 100, "currency": "usd", "source": "tok_visa", "metadata": {"k": "a\u0000b"}}"#.to_string(),
        ];
        for case in cases {
            assert!(body(&case).validate().is_err(), "{case}");
        }
    }

    #[test]
    fn a_currency_must_be_iso_4217_with_minor_units_and_the_detail_names_it() {
        // Unknown, in mixed case, then without minor units: gold, the testing code, "no currency".
        for currency in ["xyz", "abc", "Usd", "xau", "xts", "xxx"] {
            let case = format!(r#"{{"amount": 100, "currency": "{currency}", "source": "tok_visa"}}"#);
            let error = body(&case).validate().unwrap_err();
            assert!(error.message.starts_with("currency "), "{currency}: {error}");
        }
    }

    #[test]
    fn the_largest_amount_is_under_a_million_major_units_and_never_above_max_amount() {
        for (currency, max) in [("jpy", 999_999), ("usd", MAX_AMOUNT), ("bhd", MAX_AMOUNT), ("clf", MAX_AMOUNT)] {
            let with = |amount: i64| {
                body(&format!(r#"{{"amount": {amount}, "currency": "{currency}", "source": "tok_visa"}}"#))
            };
            assert!(with(max).validate().is_ok(), "{currency} {max}");
            let error = with(max + 1).validate().unwrap_err();
            assert!(
                error.message.starts_with("amount ") && error.message.contains(&max.to_string()),
                "{currency}: {error}"
            );
        }
    }

    #[test]
    fn an_integral_amount_written_with_a_fraction_is_the_same_request() {
        let params = |amount: &str| {
            body(&format!(r#"{{"amount": {amount}, "currency": "usd", "source": "tok_visa"}}"#))
                .validate()
                .unwrap()
                .to_params()
        };
        assert_eq!(params("51803.0"), params("51803"));
        assert_eq!(params("5.1803e4"), params("51803"));
        assert_eq!(params("5180300e-2"), params("51803"));
        assert_eq!(params("0.00051803E+8"), params("51803"));
        // An integer too large for any amount is refused by the range, not mistaken for another.
        assert!(body(r#"{"amount": 1e20, "currency": "usd", "source": "tok_visa"}"#).validate().is_err());
    }

    #[test]
    fn unknown_fields_and_wrong_types_do_not_parse() {
        for case in [
            r#"{"amount": 100, "currency": "usd", "source": "tok_visa", "ammount": 1}"#,
            r#"{"amount": 10.5, "currency": "usd", "source": "tok_visa"}"#,
            r#"{"amount": 0.99999999999999999, "currency": "usd", "source": "tok_visa"}"#,
            r#"{"amount": "100", "currency": "usd", "source": "tok_visa"}"#,
            r#"{"amount": null, "currency": "usd", "source": "tok_visa"}"#,
            r#"{"amount": [1], "currency": "usd", "source": "tok_visa"}"#,
            r#"{"amount": 100, "currency": "usd", "source": "tok_visa", "metadata": {"k": "1", "k": "2"}}"#,
            r#"{"amount": 100, "currency": "usd", "source": "tok_visa", "metadata": {"k": 1}}"#,
        ] {
            assert!(serde_json::from_str::<CreatePaymentBody>(case).is_err(), "{case}");
        }
    }
}
