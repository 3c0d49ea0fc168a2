//! How the fields of a request body read, the same in every body (a payment's, a refund's): a
//! body that is an object, a field that may be left out but never sent `null`, an amount of minor
//! units, metadata.
//!
//! Where money moves, a body fails closed: a field the client meant to send and lost (a failed
//! parse, a dropped form field) often reaches us as `null`, since many serialisers write an unset
//! field so (Python's `None`, Jackson's default, Go's nil pointers). So `null` is a value only
//! where openapi.yaml says a field is nullable, and those fields alone are `Option`s; every other
//! optional field is an [`Omittable`], whose `null` is a 400. A test holds the bodies to the spec.

use std::collections::BTreeMap;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserializer, Error as _, MapAccess, Unexpected, Visitor};

/// A `T` read from a JSON object, and from nothing else. serde's derived structs take an array
/// too, read by position: `[500, "usd", "tok_visa"]` was a payment and `[]` a capture of all of an
/// authorization. A body is an object (openapi.yaml says so), so every body the service reads is
/// read as an `Object` (see `http::extract::JsonBody`, and a gateway event's parts).
#[derive(Debug)]
pub struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = T;
            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }
        deserializer.deserialize_map(ObjectVisitor(PhantomData)).map(Object)
    }
}

/// A field a client may leave out, but not send as `null`: left out, it is [`Omittable::Absent`]
/// (declare it `#[serde(default)]`); sent, it is read as a `T`, and `null` is refused whatever `T`
/// makes of it. For a field whose `null` openapi.yaml allows, use `Option<T>`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Omittable<T> {
    #[default]
    Absent,
    Sent(T),
}

impl<T> Omittable<T> {
    /// The value, if the field was sent.
    pub fn sent(self) -> Option<T> {
        match self {
            Omittable::Absent => None,
            Omittable::Sent(value) => Some(value),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Omittable<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Option::<T>::deserialize(deserializer)? {
            Some(value) => Ok(Omittable::Sent(value)),
            None => Err(D::Error::invalid_type(Unexpected::Other("null"), &"a value, or the field left out")),
        }
    }
}

/// An amount of minor units as a client writes it: see [`integral_number`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct IntegralNumber(#[serde(deserialize_with = "integral_number")] pub i64);

/// Metadata as sent (a payment's or a refund's), each key once: a key sent twice is refused, as a
/// field sent twice is, never silently kept as its last value, which would make two different
/// bodies one request.
pub fn metadata_sent_once<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct SentOnce(BTreeMap<String, String>);
    impl<'de> Deserialize<'de> for SentOnce {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_map(SentOnceVisitor)
        }
    }
    struct SentOnceVisitor;
    impl<'de> Visitor<'de> for SentOnceVisitor {
        type Value = SentOnce;
        fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
            formatter.write_str("an object of strings")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SentOnce, A::Error> {
            let mut metadata = BTreeMap::new();
            while let Some((key, value)) = map.next_entry::<String, String>()? {
                if metadata.contains_key(&key) {
                    return Err(A::Error::custom(format_args!("the metadata key {key:?} is sent twice")));
                }
                metadata.insert(key, value);
            }
            Ok(SentOnce(metadata))
        }
    }
    Ok(Option::<SentOnce>::deserialize(deserializer)?.map(|SentOnce(metadata)| metadata))
}

/// JSON has one kind of number, and JSON Schema counts `51803.0` as an integer, so an integral
/// number is accepted however it is written; `10.5` is not an amount of minor units. A number
/// too large for `i64` saturates, and is then refused by the amount's range. The number is read
/// as written, not through an `f64`, which would round `0.99999999999999999` to 1 and charge it.
pub fn integral_number<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    let written = Box::<serde_json::value::RawValue>::deserialize(deserializer)?;
    let literal = written.get();
    // The error names what was sent by its kind, never by its text, which may be kilobytes long.
    if !literal.starts_with(['-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9']) {
        return Err(D::Error::invalid_type(Unexpected::Other("a value that is not a number"), &"an integer"));
    }
    integer_written(literal)
        .ok_or_else(|| D::Error::invalid_value(Unexpected::Other("a number with a fraction"), &"an integer"))
}

/// The integer a JSON number literal writes, if it writes one (saturated to `i64`): `51803`,
/// `51803.0`, `5.1803e4`, `-0` do; `10.5` and `0.99999999999999999` do not.
fn integer_written(literal: &str) -> Option<i64> {
    let (negative, unsigned) = match literal.strip_prefix('-') {
        Some(unsigned) => (true, unsigned),
        None => (false, literal),
    };
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        // An exponent beyond any `i64` is as good as a huge one of its sign.
        Some((mantissa, exponent)) => {
            let huge = if exponent.starts_with('-') { -(1 << 40) } else { 1 << 40 };
            (mantissa, exponent.parse::<i64>().unwrap_or(huge).clamp(-(1 << 40), 1 << 40))
        }
        None => (unsigned, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    // The number is `digits` × 10^`scale`.
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    let significant = digits.trim_end_matches('0');
    if significant.is_empty() {
        return Some(0);
    }
    let scale = exponent - fraction.len() as i64 + (digits.len() - significant.len()) as i64;
    if scale < 0 {
        return None;
    }
    let magnitude = match significant.len() as i64 + scale {
        // 19 digits or fewer with room for the zeros: within i128, and saturated below.
        length if length <= 19 => significant.parse::<i128>().ok()? * 10_i128.pow(scale as u32),
        _ => i128::MAX,
    };
    let value = if negative { -magnitude } else { magnitude };
    Some(i64::try_from(value).unwrap_or(if negative { i64::MIN } else { i64::MAX }))
}

/// `text`, cut to at most `max_chars` characters (a gateway's words, bounded as a column is).
pub fn truncated(text: &str, max_chars: usize) -> &str {
    text.char_indices().nth(max_chars).map_or(text, |(end, _)| &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        #[serde(default)]
        amount: Omittable<IntegralNumber>,
        #[serde(default)]
        note: Option<String>,
    }

    fn body(json: &str) -> Result<Body, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn a_body_is_an_object_and_never_an_array_read_by_position() {
        let object = |json: &str| serde_json::from_str::<Object<Body>>(json).map(|Object(body)| body);
        assert_eq!(object(r#"{"amount": 5, "note": "x"}"#).unwrap().amount, Omittable::Sent(IntegralNumber(5)));
        assert!(object(r#"{"amount": 5, "other": 1}"#).is_err(), "its own rules still hold");
        assert!(body("[5]").is_ok(), "what a derived struct alone takes");
        for json in ["[]", "[5]", r#"[5, "x"]"#, "5", r#""x""#, "null", "true"] {
            let error = object(json).unwrap_err().to_string();
            assert!(error.contains("expected a JSON object"), "{json}: {error}");
        }
    }

    #[test]
    fn an_omittable_field_may_be_left_out_but_not_sent_null() {
        assert_eq!(body("{}").unwrap().amount, Omittable::Absent);
        assert_eq!(body(r#"{"amount": 5}"#).unwrap().amount, Omittable::Sent(IntegralNumber(5)));
        let error = body(r#"{"amount": null}"#).unwrap_err().to_string();
        assert!(error.starts_with("invalid type: null, expected a value, or the field left out"), "{error}");
        // A nullable field (an `Option`) takes `null` as left out.
        assert_eq!(body(r#"{"note": null}"#).unwrap().note, None);
    }

    #[test]
    fn a_number_is_an_integer_only_as_written_never_as_an_f64_rounds_it() {
        let written = [
            ("0", Some(0)),
            ("-0", Some(0)),
            ("-0.0e5", Some(0)),
            ("1", Some(1)),
            ("1.0", Some(1)),
            ("1e3", Some(1000)),
            ("1.5e1", Some(15)),
            ("100e-2", Some(1)),
            ("-42", Some(-42)),
            ("9223372036854775807", Some(i64::MAX)),
            ("9223372036854775808", Some(i64::MAX)),
            ("-9223372036854775809", Some(i64::MIN)),
            ("1e20", Some(i64::MAX)),
            ("1e400", Some(i64::MAX)),
            ("-1e99999999999999999999", Some(i64::MIN)),
            ("0e99999999999999999999", Some(0)),
            ("10.5", None),
            ("0.99999999999999999", None),
            ("99999998.999999999", None),
            ("100.00000000000000001", None),
            ("1e-99999999999999999999", None),
            ("150e-3", None),
        ];
        for (literal, integer) in written {
            assert_eq!(integer_written(literal), integer, "{literal}");
        }
    }
}

/// Whether `text` holds a NUL character, which JSON may carry and PostgreSQL's text may not: a
/// field that would hold one is refused, never stored cut or failed on.
pub fn has_nul(text: &str) -> bool {
    text.contains('\0')
}

/// A body that parsed as JSON but breaks a rule; the message says which, for the client, and the
/// rule's kind which problem it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ValidationError {
    pub rule: Rule,
    pub message: String,
}

/// The kinds of rule a body may break, each its own problem type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Any rule of a request's fields (`invalid-request`).
    Request,
    /// A webhook endpoint's `url` is not an `http` or `https` URL we can send to.
    WebhookUrl,
    /// A webhook endpoint's `url` is an address the service never sends to.
    WebhookUrlNotAllowed,
    /// An event type that no event has.
    EventType,
}

impl ValidationError {
    /// A broken rule of a request's fields.
    pub fn new(message: impl Into<String>) -> ValidationError {
        ValidationError { rule: Rule::Request, message: message.into() }
    }

    /// A broken rule of kind `rule`.
    pub fn of(rule: Rule, message: impl Into<String>) -> ValidationError {
        ValidationError { rule, message: message.into() }
    }
}
