//! The `Idempotency-Key` request header.

use std::fmt;

/// The longest key we accept, as Stripe does. The IETF draft sets no limit; ours is documented.
pub const MAX_KEY_LENGTH: usize = 255;

/// A client's idempotency key: 1 to 255 printable ASCII characters (0x20 to 0x7E).
///
/// Accepted bare, as Stripe's clients send it (`Idempotency-Key: abc`), or as an RFC 8941 quoted
/// string, as the IETF draft specifies (`Idempotency-Key: "abc"`); both forms name the same key.
/// HTTP drops white space around a header's value, so a bare key cannot start or end with a space:
/// such a key is sent quoted (`" abc "`). `openapi.yaml` says the same with a pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a header value is not a valid key (every case is a 400 that writes nothing).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the Idempotency-Key header is required")]
    Missing,
    #[error("the Idempotency-Key is empty")]
    Empty,
    #[error("the Idempotency-Key is longer than {MAX_KEY_LENGTH} characters")]
    TooLong,
    #[error("the Idempotency-Key may contain only printable ASCII characters (0x20 to 0x7E)")]
    NotPrintableAscii,
    #[error("a bare Idempotency-Key cannot start or end with a space, which HTTP drops; quote such a key")]
    SurroundingSpace,
    #[error("the Idempotency-Key starts with a quote but is not a valid RFC 8941 string")]
    MalformedQuotedString,
    /// Sent twice: HTTP reads two header lines as one list, which is no single key; taking either
    /// one would let a retry that carries only the other make the payment again.
    #[error("the Idempotency-Key header is sent more than once; send one key")]
    Repeated,
}

impl IdempotencyKey {
    /// Parses a header value, bare or quoted.
    pub fn parse(value: &[u8]) -> Result<IdempotencyKey, KeyError> {
        let key = match value {
            [b'"', ..] => unquote(value)?,
            [b' ', ..] | [.., b' '] => return Err(KeyError::SurroundingSpace),
            _ if value.iter().all(|b| is_printable_ascii(*b)) => {
                String::from_utf8(value.to_vec()).map_err(|_| KeyError::NotPrintableAscii)?
            }
            _ => return Err(KeyError::NotPrintableAscii),
        };
        match key.len() {
            0 => Err(KeyError::Empty),
            n if n > MAX_KEY_LENGTH => Err(KeyError::TooLong),
            _ => Ok(IdempotencyKey(key)),
        }
    }

    /// A key named as it is, unquoted (the `key` of `GET /v1/idempotency_keys`): the same rules
    /// as a header's key, but a quote or a space at either end is part of it.
    pub fn named(key: &str) -> Result<IdempotencyKey, KeyError> {
        match key.len() {
            0 => Err(KeyError::Empty),
            n if n > MAX_KEY_LENGTH => Err(KeyError::TooLong),
            _ if !key.bytes().all(is_printable_ascii) => Err(KeyError::NotPrintableAscii),
            _ => Ok(IdempotencyKey(key.to_owned())),
        }
    }

    /// A key read back from the database, where only valid keys are stored (a `CHECK` holds them
    /// to the same rules). Not parsed again: a stored key may itself start with a quote.
    pub(crate) fn from_stored(key: String) -> IdempotencyKey {
        IdempotencyKey(key)
    }

    /// The key as the client meant it (unquoted).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn is_printable_ascii(byte: u8) -> bool {
    (0x20..=0x7e).contains(&byte)
}

/// RFC 8941 §4.2.5: a string is printable ASCII in double quotes, where only `\"` and `\\` are
/// escapes. Anything after the closing quote (such as parameters) is not a plain string: reject.
fn unquote(value: &[u8]) -> Result<String, KeyError> {
    let mut key = String::with_capacity(value.len());
    let mut bytes = value[1..].iter().copied();
    while let Some(byte) = bytes.next() {
        match byte {
            b'"' if bytes.next().is_none() => return Ok(key),
            b'\\' => match bytes.next() {
                Some(escaped @ (b'"' | b'\\')) => key.push(escaped as char),
                _ => return Err(KeyError::MalformedQuotedString),
            },
            b'"' => return Err(KeyError::MalformedQuotedString),
            b if is_printable_ascii(b) => key.push(b as char),
            _ => return Err(KeyError::NotPrintableAscii),
        }
    }
    Err(KeyError::MalformedQuotedString)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_and_quoted_forms_name_the_same_key() {
        let bare = IdempotencyKey::parse(b"order-42").unwrap();
        let quoted = IdempotencyKey::parse(b"\"order-42\"").unwrap();
        assert_eq!(bare, quoted);
        assert_eq!(bare.as_str(), "order-42");
    }

    #[test]
    fn quoted_strings_unescape_quotes_and_backslashes() {
        let key = IdempotencyKey::parse(br#""a\"b\\c""#).unwrap();
        assert_eq!(key.as_str(), r#"a"b\c"#);
    }

    #[test]
    fn a_bare_key_may_contain_quotes_and_spaces_inside() {
        assert_eq!(IdempotencyKey::parse(b"a \"b\"").unwrap().as_str(), "a \"b\"");
    }

    #[test]
    fn spaces_at_the_ends_of_a_key_need_the_quoted_form() {
        for bare in [&b" k"[..], b"k ", b" "] {
            assert_eq!(IdempotencyKey::parse(bare), Err(KeyError::SurroundingSpace), "{bare:?}");
        }
        assert_eq!(IdempotencyKey::parse(b"\" k \"").unwrap().as_str(), " k ");
    }

    #[test]
    fn invalid_keys_are_rejected_with_their_reason() {
        let cases: [(&[u8], KeyError); 8] = [
            (b"", KeyError::Empty),
            (b"\"\"", KeyError::Empty),
            (&[b'k'; 256], KeyError::TooLong),
            (b"caf\xc3\xa9", KeyError::NotPrintableAscii),
            (b"tab\there", KeyError::NotPrintableAscii),
            (b"\"unterminated", KeyError::MalformedQuotedString),
            (br#""bad\escape""#, KeyError::MalformedQuotedString),
            (b"\"key\";param=1", KeyError::MalformedQuotedString),
        ];
        for (value, expected) in cases {
            assert_eq!(IdempotencyKey::parse(value), Err(expected), "{value:?}");
        }
    }

    #[test]
    fn the_limits_are_inclusive() {
        assert!(IdempotencyKey::parse(b"k").is_ok());
        assert!(IdempotencyKey::parse(&[b'k'; 255]).is_ok());
        assert!(IdempotencyKey::parse(b"!~").is_ok());
        assert!(IdempotencyKey::parse(b"\" ~\"").is_ok());
    }
}
