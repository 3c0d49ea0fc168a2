//! The signature on the gateway's events, one scheme for the side that signs (the mock gateway)
//! and the side that verifies (`POST /webhooks/gateway`):
//!
//! `Gateway-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>...]`, each `v1` the HMAC-SHA256, under
//! one of the gateway's secrets, of the bytes `<t>.<raw body>`. There is a `v1` per secret in use,
//! so that a secret can be rolled: the receiver accepts the event if any `v1` matches any of its
//! secrets. Other schemes (`v0=...`) are ignored, as Stripe's libraries do.
//!
//! Verification works on the raw bytes as they arrived, before anything parses them (a body
//! parsed and written out again is other bytes), compares in constant time ([`Mac::verify_slice`]),
//! reads every `v1` (not just the last) and refuses more than eight of them (each entry counted,
//! whether it decodes or not), needs a whole 32-byte signature (a `v1` with no hex, or a prefix of
//! one, matches nothing), takes `t` only as the signer writes it (decimal digits, no sign, no
//! leading zero), and bounds `t` on both sides of the receiver's clock.

use std::fmt;
use std::time::Duration;

use hmac::digest::{CtOutput, Output};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The most `v1` signatures a header may carry: one per secret in use, and a rotation has two.
/// More is no gateway's doing, and each would cost a comparison.
const MAX_SIGNATURES: usize = 8;

/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "Gateway-Signature";

/// A webhook secret. Never printed: its `Debug` says only that it is one.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret(Vec<u8>);

impl WebhookSecret {
    pub fn new(secret: impl Into<Vec<u8>>) -> WebhookSecret {
        WebhookSecret(secret.into())
    }

    fn mac(&self, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(..)")
    }
}

/// The header value that signs `body`, sent at `timestamp`, under each of `secrets`.
pub fn sign(secrets: &[WebhookSecret], timestamp: i64, body: &[u8]) -> String {
    let mut header = format!("t={timestamp}");
    for secret in secrets {
        header.push_str(",v1=");
        header.push_str(&hex::encode(secret.mac(timestamp, body).finalize().into_bytes()));
    }
    header
}

/// Why an event's signature was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the Gateway-Signature header is missing")]
    Missing,
    #[error("the Gateway-Signature header is not `t=<unix seconds>,v1=<hex>[,v1=<hex>...]`")]
    Malformed,
    #[error("the Gateway-Signature header is sent more than once (every `v1` belongs in one header)")]
    SentTwice,
    #[error("the signature's timestamp is too far from the receiver's clock")]
    OutsideTolerance,
    #[error("no signature matches the body under any secret")]
    NoMatch,
}

/// Verifies `header` (the raw header value, if any) for `body` under any of `secrets`, at `now`
/// (unix seconds), with `t` allowed at most `tolerance` away on either side. Returns `t`.
pub fn verify(
    header: Option<&[u8]>,
    body: &[u8],
    secrets: &[WebhookSecret],
    now: i64,
    tolerance: Duration,
) -> Result<i64, SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let header = std::str::from_utf8(header).map_err(|_| SignatureError::Malformed)?;
    let mut timestamp = None;
    let mut v1_entries = 0;
    let mut signatures = Vec::new();
    for item in header.split(',') {
        let (scheme, value) = item.trim().split_once('=').ok_or(SignatureError::Malformed)?;
        match scheme {
            "t" if timestamp.is_none() => timestamp = Some(parse_timestamp(value)?),
            "t" => return Err(SignatureError::Malformed),
            // Every `v1` entry counts toward the bound, whether it decodes or not: a header of
            // hundreds of them is no gateway's doing, whatever they hold.
            "v1" if v1_entries < MAX_SIGNATURES => {
                v1_entries += 1;
                // A `v1` that is not 32 bytes of hex is no signature at all: it matches nothing.
                signatures.extend(hex::decode(value).ok().filter(|bytes| bytes.len() == 32));
            }
            "v1" => return Err(SignatureError::Malformed),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
    let tolerance = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    if now.abs_diff(timestamp) > tolerance.unsigned_abs() {
        return Err(SignatureError::OutsideTolerance);
    }
    // One tag per secret, however many signatures the header carries; each compared in constant
    // time.
    let tags: Vec<CtOutput<Hmac<Sha256>>> =
        secrets.iter().map(|secret| secret.mac(timestamp, body).finalize()).collect();
    let matches = |signature: &Vec<u8>| match Output::<Hmac<Sha256>>::try_from(signature.as_slice()) {
        Ok(signature) => {
            let signature = CtOutput::new(signature);
            tags.contains(&signature)
        }
        Err(_) => false,
    };
    match signatures.iter().any(matches) {
        true => Ok(timestamp),
        false => Err(SignatureError::NoMatch),
    }
}

/// `t` as the signer writes it ([`crate::canonical_seconds`]).
fn parse_timestamp(value: &str) -> Result<i64, SignatureError> {
    crate::canonical_seconds(value).ok_or(SignatureError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000;
    const TOLERANCE: Duration = Duration::from_secs(300);

    fn secret(text: &str) -> WebhookSecret {
        WebhookSecret::new(text)
    }

    fn check(header: &str, body: &[u8], secrets: &[WebhookSecret]) -> Result<i64, SignatureError> {
        verify(Some(header.as_bytes()), body, secrets, NOW, TOLERANCE)
    }

    #[test]
    fn a_signed_body_verifies_under_its_secret_and_under_no_other() {
        let body = br#"{"id":"evt_1"}"#;
        let header = sign(&[secret("whsec_a")], NOW, body);
        assert_eq!(check(&header, body, &[secret("whsec_a")]), Ok(NOW));
        assert_eq!(check(&header, body, &[secret("whsec_b")]), Err(SignatureError::NoMatch));
        assert_eq!(check(&header, br#"{"id":"evt_2"}"#, &[secret("whsec_a")]), Err(SignatureError::NoMatch));
        assert_eq!(check(&header, br#"{"id": "evt_1"}"#, &[secret("whsec_a")]), Err(SignatureError::NoMatch));
    }

    #[test]
    fn during_rotation_any_signature_under_any_secret_is_enough() {
        let body = b"{}";
        let both = sign(&[secret("old"), secret("new")], NOW, body);
        assert_eq!(check(&both, body, &[secret("new")]), Ok(NOW), "the last v1");
        assert_eq!(check(&both, body, &[secret("old")]), Ok(NOW), "the first v1");
        assert_eq!(check(&both, body, &[secret("other"), secret("new")]), Ok(NOW), "any secret");
    }

    #[test]
    fn the_timestamp_is_bounded_on_both_sides() {
        let body = b"{}";
        let at = |t: i64| sign(&[secret("s")], t, body);
        assert!(check(&at(NOW - 300), body, &[secret("s")]).is_ok());
        assert!(check(&at(NOW + 300), body, &[secret("s")]).is_ok());
        assert_eq!(check(&at(NOW - 301), body, &[secret("s")]), Err(SignatureError::OutsideTolerance));
        assert_eq!(check(&at(NOW + 301), body, &[secret("s")]), Err(SignatureError::OutsideTolerance));
    }

    #[test]
    fn a_header_that_is_not_a_whole_signature_is_refused() {
        let body = b"{}";
        let good = sign(&[secret("s")], NOW, body);
        let hex = good.split("v1=").nth(1).unwrap();
        assert_eq!(verify(None, body, &[secret("s")], NOW, TOLERANCE), Err(SignatureError::Missing));
        for (header, error) in [
            (format!("t={NOW},v1="), SignatureError::NoMatch),
            (format!("t={NOW},v1"), SignatureError::Malformed),
            (format!("t={NOW},v1={}", &hex[..32]), SignatureError::NoMatch),
            (format!("t={NOW},v1={hex}zz"), SignatureError::NoMatch),
            (format!("t={NOW},v0={hex}"), SignatureError::NoMatch),
            (format!("v1={hex}"), SignatureError::Malformed),
            (format!("t=soon,v1={hex}"), SignatureError::Malformed),
            (format!("t={NOW},t={NOW},v1={hex}"), SignatureError::Malformed),
            (String::new(), SignatureError::Malformed),
        ] {
            assert_eq!(check(&header, body, &[secret("s")]), Err(error), "{header}");
        }
        assert!(check(&format!(" t={NOW} , v0=ab, v1={hex} "), body, &[secret("s")]).is_ok(), "spaces and v0 ignored");
        let many = format!("t={NOW}{}", format!(",v1={hex}").repeat(MAX_SIGNATURES + 1));
        assert_eq!(check(&many, body, &[secret("s")]), Err(SignatureError::Malformed), "too many signatures");
    }

    #[test]
    fn every_v1_entry_counts_toward_the_bound_whether_it_decodes_or_not() {
        let body = b"{}";
        let good = sign(&[secret("s")], NOW, body);
        let hex = good.split("v1=").nth(1).unwrap();
        let padded = |junk: usize| format!("t={NOW}{},v1={hex}", ",v1=zz".repeat(junk));
        assert_eq!(check(&padded(MAX_SIGNATURES - 1), body, &[secret("s")]), Ok(NOW), "eight in all");
        assert_eq!(check(&padded(MAX_SIGNATURES), body, &[secret("s")]), Err(SignatureError::Malformed), "nine");
        assert_eq!(check(&padded(500), body, &[secret("s")]), Err(SignatureError::Malformed), "501");
        let empty = format!("t={NOW}{},v1={hex}", ",v1=".repeat(MAX_SIGNATURES));
        assert_eq!(check(&empty, body, &[secret("s")]), Err(SignatureError::Malformed), "empty ones too");
    }

    #[test]
    fn only_the_timestamp_as_the_signer_writes_it_verifies() {
        let body = b"{}";
        let good = sign(&[secret("s")], NOW, body);
        let hex = good.split("v1=").nth(1).unwrap();
        assert_eq!(check(&format!("t={NOW},v1={hex}"), body, &[secret("s")]), Ok(NOW));
        for t in [format!("+{NOW}"), format!("0{NOW}"), format!("00{NOW}"), format!(" {NOW}"), format!("{NOW}.0")] {
            assert_eq!(
                check(&format!("t={t},v1={hex}"), body, &[secret("s")]),
                Err(SignatureError::Malformed),
                "t={t}"
            );
        }
        // Zero is written `0`, and a negative time is none the signer writes.
        let zero = sign(&[secret("s")], 0, body);
        assert_eq!(verify(Some(zero.as_bytes()), body, &[secret("s")], 0, TOLERANCE), Ok(0));
        let signed_as_zero = zero.replacen("t=0", "t=00", 1);
        let malformed = Err(SignatureError::Malformed);
        assert_eq!(verify(Some(signed_as_zero.as_bytes()), body, &[secret("s")], 0, TOLERANCE), malformed);
        let negative = sign(&[secret("s")], -1, body);
        assert_eq!(verify(Some(negative.as_bytes()), body, &[secret("s")], 0, TOLERANCE), malformed);
        for t in ["", "-0", "99999999999999999999"] {
            assert_eq!(check(&format!("t={t},v1={hex}"), body, &[secret("s")]), malformed, "t={t}");
        }
    }

    #[test]
    fn a_secret_is_never_printed() {
        assert_eq!(format!("{:?}", secret("whsec_very_secret")), "WebhookSecret(..)");
    }
}
