//! The id of one request, which a client quotes to support: sent back as `Request-Id` on every
//! answer, carried by every log line of the request, written with every audit record it causes,
//! and put in every problem body as `request_id`.

use std::fmt;
use std::sync::Arc;

use uuid::fmt::Simple;

/// The header every answer carries (the name Stripe uses).
pub const REQUEST_ID_HEADER: &str = "Request-Id";

/// The header through which a caller (a proxy, a client tracing its own calls) may choose the id.
pub const INCOMING_REQUEST_ID_HEADER: &str = "X-Request-Id";

/// What a generated id starts with.
const PREFIX: &str = "req_";

/// The longest id taken from a caller.
const MAX_LEN: usize = 128;

/// A request's id: `req_` and 32 hex digits when we make it, or what the caller sent as
/// `X-Request-Id` if that is 1 to 128 letters, digits and `._:+/=-` (anything else is ignored, not
/// refused: the id is a help for tracing, and a bad one must not fail a payment). The database's
/// `request_id` domain holds every audit record to the same rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestId(Arc<str>);

impl RequestId {
    /// A fresh id: a version 4 UUID from the thread's generator (seeded from the system, and
    /// reseeded now and then), not from `Uuid::new_v4`, which without uuid's `fast-rng` feature
    /// asks the kernel for every id (that feature would make the benchmark's load generator
    /// cheaper too, and so skew its comparison). Written into a buffer on the stack, then copied
    /// once into the id.
    pub fn generate() -> RequestId {
        let uuid = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
        let mut id = [0; PREFIX.len() + Simple::LENGTH];
        id[..PREFIX.len()].copy_from_slice(PREFIX.as_bytes());
        uuid.simple().encode_lower(&mut id[PREFIX.len()..]);
        RequestId(str::from_utf8(&id).expect("a prefix and hex digits are ASCII").into())
    }

    /// The caller's id, if it is one we accept.
    pub fn from_caller(value: &[u8]) -> Option<RequestId> {
        let valid = (1..=MAX_LEN).contains(&value.len())
            && value.iter().all(|b| b.is_ascii_alphanumeric() || b"._:+/=-".contains(b));
        // Only ASCII passed the check, so the bytes are UTF-8.
        valid.then(|| RequestId(String::from_utf8_lossy(value).into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl serde::Serialize for RequestId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_id_is_one_a_caller_could_have_sent() {
        let id = RequestId::generate();
        assert!(id.as_str().starts_with("req_") && id.as_str().len() == 36, "{id}");
        let uuid = uuid::Uuid::parse_str(&id.as_str()["req_".len()..]).unwrap();
        assert_eq!((uuid.get_version(), uuid.get_variant()), (Some(uuid::Version::Random), uuid::Variant::RFC4122));
        assert_eq!(RequestId::from_caller(id.as_str().as_bytes()), Some(id.clone()));
        assert_ne!(RequestId::generate(), id, "each id is new");
    }

    #[test]
    fn a_caller_id_is_taken_only_when_it_is_short_plain_ascii() {
        for good in ["a", "4bf92f35-77b3-4da6-a3ce-929d0e0e4736", "trace:1/2+3=4_5.6", &"x".repeat(128)] {
            assert_eq!(RequestId::from_caller(good.as_bytes()).map(|id| id.to_string()), Some(good.to_owned()));
        }
        for bad in ["", "two words", "line\nbreak", "naïve", "<script>", &"x".repeat(129)] {
            assert_eq!(RequestId::from_caller(bad.as_bytes()), None, "{bad:?}");
        }
    }
}
