//! What makes two requests "the same request" for the purpose of a key.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// SHA-256 over the canonical JSON of a validated request body.
///
/// Canonical means: the validated value (so `"USD"` and `"usd"` agree, and an absent optional
/// field equals its default), object keys sorted, no insignificant white space. Two serialisations
/// of one request therefore have one fingerprint, and any difference in meaning changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

/// A request in canonical form: a JSON value, or a type that serialises as its JSON value would
/// (see [`canonical_json`]). Only such a type can be fingerprinted: a struct whose fields are out
/// of order, or one holding a `HashMap`, would give one request two fingerprints. Each type but
/// `Value` that says it is one has a test beside it holding it to its value's bytes.
pub trait Canonical: Serialize {}

impl Canonical for serde_json::Value {}

impl Fingerprint {
    /// The fingerprint of a request in canonical form.
    pub fn of(canonical: &impl Canonical) -> Fingerprint {
        Fingerprint(Sha256::digest(canonical_json(canonical)).into())
    }

    /// The digest, as stored.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The canonical serialisation: serde_json's map is a `BTreeMap` (the `preserve_order` feature is
/// off), so a value's keys come out sorted, and the compact writer adds no white space. A struct's
/// fields come out in the order they are declared, so a request type fingerprinted as itself
/// declares them sorted, and its maps are `BTreeMap`s: written straight from it, a request needs
/// no JSON value built first, and has the fingerprint its JSON value has, which is what keys
/// stored before were fingerprinted by (a test beside each such type holds the two to the same
/// bytes, and to the digests stored keys have).
fn canonical_json(value: &impl Canonical) -> Vec<u8> {
    serde_json::to_vec(value).expect("a request always serialises")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_sorted_and_white_space_dropped() {
        let value: serde_json::Value = serde_json::from_str(r#"{ "b": 1, "a": { "z": "x", "c": [1, 2] } }"#).unwrap();
        assert_eq!(canonical_json(&value), br#"{"a":{"c":[1,2],"z":"x"},"b":1}"#);
    }

    #[test]
    fn reordered_json_has_the_same_fingerprint_and_other_values_do_not() {
        let one = Fingerprint::of(&json!({"amount": 100, "currency": "usd"}));
        let reordered: serde_json::Value = serde_json::from_str(r#"{"currency":"usd",  "amount":100}"#).unwrap();
        assert_eq!(one, Fingerprint::of(&reordered));
        assert_ne!(one, Fingerprint::of(&json!({"amount": 101, "currency": "usd"})));
    }
}
