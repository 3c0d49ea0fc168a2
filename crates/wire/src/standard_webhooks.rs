//! The signature on every event the service delivers to a merchant's endpoint, as Standard
//! Webhooks (<https://www.standardwebhooks.com>) says, one scheme for the side that signs (the
//! delivery worker), the side that verifies (`payments listen`) and the tests:
//!
//! - `webhook-id`: the event's id, the same on every attempt and to every endpoint, so that a
//!   receiver can de-duplicate;
//! - `webhook-timestamp`: this attempt's time, in unix seconds;
//! - `webhook-signature`: `v1,<base64>`, the HMAC-SHA256 of `<id>.<timestamp>.<raw body>` under the
//!   bytes the secret's base64 (after `whsec_`) decodes to. One entry per secret that signs,
//!   separated by spaces: while a rotated secret still signs, two, the new one first.
//!
//! Verification works on the raw bytes as they arrived, compares in constant time
//! ([`Mac::verify_slice`]), reads every `v1` entry (other versions are skipped) and refuses more
//! than eight, takes the timestamp only as the signer writes it (decimal digits, no sign, no
//! leading zero), and bounds it on both sides of the receiver's clock. The signed id may not
//! contain a `.`: `a.b` with timestamp `c` and `a` with timestamp `b.c`... would sign one text.

use std::fmt;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The header that carries the event's id.
pub const ID_HEADER: &str = "webhook-id";
/// The header that carries the attempt's time, in unix seconds.
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// The header that carries the signatures.
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// What a secret's text begins with.
pub const SECRET_PREFIX: &str = "whsec_";

/// How many random bytes a secret may hold, as Standard Webhooks has it.
pub const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// The most entries a signature header may carry: one per secret that signs, two during a
/// rotation. More is no sender's doing, and each would cost a comparison.
const MAX_SIGNATURES: usize = 8;

/// An endpoint's signing secret: 24 to 64 random bytes, written `whsec_<base64>`. Never printed:
/// its `Debug` says only that it is one.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret(Vec<u8>);

/// Why a secret's text was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("a signing secret begins with `whsec_`")]
    Prefix,
    #[error("a signing secret is `whsec_` followed by base64")]
    Base64,
    #[error("a signing secret holds 24 to 64 bytes")]
    Length,
}

impl SigningSecret {
    /// The secret of `bytes`, drawn from a CSPRNG by whoever makes one.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<SigningSecret, SecretError> {
        match SECRET_BYTES.contains(&bytes.len()) {
            true => Ok(SigningSecret(bytes)),
            false => Err(SecretError::Length),
        }
    }

    /// The secret written `whsec_<base64>`, as the endpoint's creation showed it.
    pub fn parse(text: &str) -> Result<SigningSecret, SecretError> {
        let encoded = text.strip_prefix(SECRET_PREFIX).ok_or(SecretError::Prefix)?;
        let bytes = BASE64.decode(encoded).map_err(|_| SecretError::Base64)?;
        SigningSecret::from_bytes(bytes)
    }

    /// The secret as text, `whsec_<base64>`: what its endpoint's creation answers, once.
    pub fn reveal(&self) -> String {
        format!("{SECRET_PREFIX}{}", BASE64.encode(&self.0))
    }

    /// Its bytes, to store.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningSecret(..)")
    }
}

/// The `webhook-signature` value that signs the event `id`'s `body`, sent at `timestamp`, under
/// each of `secrets`, in their order.
pub fn sign<'a>(secrets: impl IntoIterator<Item = &'a SigningSecret>, id: &str, timestamp: i64, body: &[u8]) -> String {
    let entries = secrets
        .into_iter()
        .map(|secret| format!("v1,{}", BASE64.encode(secret.mac(id, timestamp, body).finalize().into_bytes())));
    entries.collect::<Vec<_>>().join(" ")
}

/// Why a delivery's signature was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the {0} header is missing")]
    Missing(&'static str),
    #[error("the webhook-id header is empty, or holds a `.`")]
    BadId,
    #[error("the webhook-timestamp header is not unix seconds")]
    BadTimestamp,
    #[error("the webhook-timestamp is too far from the receiver's clock")]
    OutsideTolerance,
    #[error("the webhook-signature header is not `v1,<base64>[ v1,<base64>...]`")]
    Malformed,
    #[error("no signature matches the body under any secret")]
    NoMatch,
}

/// A delivery as it arrived: its three headers' values (none for a header that is missing) and
/// its raw body.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    pub id: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
    pub body: &'a [u8],
}

/// Verifies `delivery` under any of `secrets`, at `now` (unix seconds), its timestamp allowed at
/// most `tolerance` away on either side. Returns the event's id.
pub fn verify<'a>(
    delivery: &Delivery<'a>,
    secrets: &[SigningSecret],
    now: i64,
    tolerance: Duration,
) -> Result<&'a str, VerifyError> {
    let id = delivery.id.ok_or(VerifyError::Missing(ID_HEADER))?;
    if id.is_empty() || id.contains('.') {
        return Err(VerifyError::BadId);
    }
    let timestamp = parse_timestamp(delivery.timestamp.ok_or(VerifyError::Missing(TIMESTAMP_HEADER))?)?;
    let tolerance = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    if now.abs_diff(timestamp) > tolerance.unsigned_abs() {
        return Err(VerifyError::OutsideTolerance);
    }
    let header = delivery.signature.ok_or(VerifyError::Missing(SIGNATURE_HEADER))?;
    let mut signatures = Vec::new();
    for (at, entry) in header.split(' ').filter(|entry| !entry.is_empty()).enumerate() {
        if at == MAX_SIGNATURES {
            return Err(VerifyError::Malformed);
        }
        let (version, value) = entry.split_once(',').ok_or(VerifyError::Malformed)?;
        // A `v1` that is not 32 bytes of base64 is no signature at all: it matches nothing.
        if version == "v1" {
            signatures.extend(BASE64.decode(value).ok().filter(|bytes| bytes.len() == 32));
        }
    }
    let matches = |signature: &Vec<u8>| {
        secrets.iter().any(|secret| secret.mac(id, timestamp, delivery.body).verify_slice(signature).is_ok())
    };
    match signatures.iter().any(matches) {
        true => Ok(id),
        false => Err(VerifyError::NoMatch),
    }
}

/// The timestamp as the signer writes it ([`crate::canonical_seconds`]).
fn parse_timestamp(value: &str) -> Result<i64, VerifyError> {
    crate::canonical_seconds(value).ok_or(VerifyError::BadTimestamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000;
    const TOLERANCE: Duration = Duration::from_secs(300);
    const ID: &str = "evt_0192f2c5a8b87f3c9a5e6d4b3a291807";

    fn secret(byte: u8) -> SigningSecret {
        SigningSecret::from_bytes(vec![byte; 32]).unwrap()
    }

    fn delivery<'a>(id: &'a str, timestamp: &'a str, signature: &'a str, body: &'a [u8]) -> Delivery<'a> {
        Delivery { id: Some(id), timestamp: Some(timestamp), signature: Some(signature), body }
    }

    fn check(signature: &str, body: &[u8], secrets: &[SigningSecret]) -> Result<(), VerifyError> {
        verify(&delivery(ID, &NOW.to_string(), signature, body), secrets, NOW, TOLERANCE).map(|_| ())
    }

    /// The specification's own example, from its reference library's tests.
    #[test]
    fn the_standards_test_vector_signs_as_it_says() {
        let secret = SigningSecret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        let body = br#"{"email":"test@example.com","username":"test_user"}"#;
        let signature = sign([&secret], "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk", 1_649_367_553, body);
        assert_eq!(signature, "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=");
    }

    /// The Standard Webhooks project's verifier accepts what we sign, under each secret of a
    /// rotation: a mistake our signer and our verifier share cannot pass. (It reads the clock.)
    #[test]
    fn the_standards_own_verifier_accepts_our_signatures() {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        let (old, new) = (secret(1), secret(2));
        let body = br#"{"id":"evt_1","object":"event"}"#;
        let mut headers = http::HeaderMap::new();
        headers.insert(ID_HEADER, ID.parse().unwrap());
        headers.insert(TIMESTAMP_HEADER, now.to_string().parse().unwrap());
        headers.insert(SIGNATURE_HEADER, sign([&new, &old], ID, now, body).parse().unwrap());
        let verifier = |secret: &SigningSecret| standardwebhooks::Webhook::new(&secret.reveal()).unwrap();
        for secret in [&old, &new] {
            assert!(verifier(secret).verify(body, &headers).is_ok(), "{secret:?}");
        }
        assert!(verifier(&secret(3)).verify(body, &headers).is_err(), "under no other secret");
        assert!(verifier(&new).verify(b"{}", &headers).is_err(), "nor another body");
    }

    #[test]
    fn a_secret_is_whsec_and_the_base64_of_24_to_64_bytes_and_reads_back_as_written() {
        let written = secret(7).reveal();
        assert!(written.starts_with("whsec_"), "{written}");
        assert_eq!(SigningSecret::parse(&written), Ok(secret(7)));
        assert_eq!(SigningSecret::parse(&written[6..]), Err(SecretError::Prefix));
        assert_eq!(SigningSecret::parse("whsec_not base64!"), Err(SecretError::Base64));
        assert_eq!(SigningSecret::from_bytes(vec![0; 23]), Err(SecretError::Length));
        assert_eq!(SigningSecret::from_bytes(vec![0; 65]), Err(SecretError::Length));
        assert!(SigningSecret::from_bytes(vec![0; 24]).is_ok() && SigningSecret::from_bytes(vec![0; 64]).is_ok());
        assert_eq!(format!("{:?}", secret(7)), "SigningSecret(..)");
    }

    #[test]
    fn a_signed_body_verifies_under_its_secret_and_under_no_other() {
        let body = br#"{"id":"evt_1"}"#;
        let signature = sign([&secret(1)], ID, NOW, body);
        assert_eq!(check(&signature, body, &[secret(1)]), Ok(()));
        assert_eq!(check(&signature, body, &[secret(2)]), Err(VerifyError::NoMatch));
        assert_eq!(check(&signature, br#"{"id": "evt_1"}"#, &[secret(1)]), Err(VerifyError::NoMatch));
        let other_id = delivery("evt_2", "1700000000", &signature, body);
        assert_eq!(verify(&other_id, &[secret(1)], NOW, TOLERANCE), Err(VerifyError::NoMatch), "the id is signed");
    }

    #[test]
    fn during_a_rotation_any_entry_under_any_secret_is_enough() {
        let body = b"{}";
        let both = sign([&secret(2), &secret(1)], ID, NOW, body);
        assert_eq!(both.split(' ').count(), 2, "{both}");
        assert_eq!(check(&both, body, &[secret(1)]), Ok(()), "the old secret's");
        assert_eq!(check(&both, body, &[secret(2)]), Ok(()), "the new one's");
        assert_eq!(check(&both, body, &[secret(3), secret(2)]), Ok(()), "any of the receiver's");
    }

    #[test]
    fn the_timestamp_is_bounded_on_both_sides_and_read_only_as_written() {
        let body = b"{}";
        let at = |t: i64| {
            let signature = sign([&secret(1)], ID, t, body);
            verify(&delivery(ID, &t.to_string(), &signature, body), &[secret(1)], NOW, TOLERANCE).map(|_| ())
        };
        assert_eq!((at(NOW - 300), at(NOW + 300)), (Ok(()), Ok(())));
        assert_eq!(at(NOW - 301), Err(VerifyError::OutsideTolerance));
        assert_eq!(at(NOW + 301), Err(VerifyError::OutsideTolerance));
        let signature = sign([&secret(1)], ID, NOW, body);
        for t in
            [format!("+{NOW}"), format!("0{NOW}"), format!(" {NOW}"), format!("{NOW}.0"), String::new(), "-1".into()]
        {
            let refused = verify(&delivery(ID, &t, &signature, body), &[secret(1)], NOW, TOLERANCE);
            assert_eq!(refused, Err(VerifyError::BadTimestamp), "{t:?}");
        }
    }

    #[test]
    fn a_delivery_without_a_whole_signature_is_refused() {
        let body = b"{}";
        let good = sign([&secret(1)], ID, NOW, body);
        let base64 = good.strip_prefix("v1,").unwrap();
        for (signature, error) in [
            (String::new(), VerifyError::NoMatch),
            ("v1".to_owned(), VerifyError::Malformed),
            ("v1,".to_owned(), VerifyError::NoMatch),
            (format!("v1,{}", &base64[..20]), VerifyError::NoMatch),
            (format!("v1a,{base64}"), VerifyError::NoMatch),
            (format!("v2,{base64}"), VerifyError::NoMatch),
        ] {
            assert_eq!(check(&signature, body, &[secret(1)]), Err(error), "{signature:?}");
        }
        assert_eq!(check(&format!("v1a,abc  {good} "), body, &[secret(1)]), Ok(()), "other versions skipped");
        let many = |count: usize| format!("{} {good}", vec!["v1,AAAA"; count].join(" "));
        assert_eq!(check(&many(MAX_SIGNATURES - 1), body, &[secret(1)]), Ok(()), "eight in all");
        assert_eq!(check(&many(MAX_SIGNATURES), body, &[secret(1)]), Err(VerifyError::Malformed), "nine");
        let missing = |delivery: Delivery<'_>| verify(&delivery, &[secret(1)], NOW, TOLERANCE).map(|_| ());
        let whole = delivery(ID, "1700000000", &good, body);
        assert_eq!(missing(Delivery { id: None, ..whole }), Err(VerifyError::Missing(ID_HEADER)));
        assert_eq!(missing(Delivery { timestamp: None, ..whole }), Err(VerifyError::Missing(TIMESTAMP_HEADER)));
        assert_eq!(missing(Delivery { signature: None, ..whole }), Err(VerifyError::Missing(SIGNATURE_HEADER)));
        assert_eq!(missing(Delivery { id: Some("evt.1"), ..whole }), Err(VerifyError::BadId));
        assert_eq!(missing(Delivery { id: Some(""), ..whole }), Err(VerifyError::BadId));
    }
}
