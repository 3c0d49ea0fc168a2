//! The gateway's memory: charges, the idempotency cache and the counters.
//!
//! Pure bookkeeping, with no I/O and no waiting, so the rules that matter
//! (one charge per key, replay only for the same body) are unit-tested here.

use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use actix_web::http::StatusCode;
use rand::Rng;
use rand::distr::Alphanumeric;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The token that test clients use to ask for a declined card.
const DECLINED_TOKEN: &str = "tok_chargeDeclined";

/// The body of `POST /v1/charges`.
///
/// It also serializes: re-serializing the parsed body gives the canonical
/// form that is fingerprinted (fixed field order, sorted metadata), so two
/// bodies that differ only in key order or whitespace count as the same.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ChargeRequest {
    amount: u64,
    currency: String,
    source: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
}

/// Why a charge request was refused before anything was recorded.
#[derive(Debug, thiserror::Error)]
pub(super) enum InvalidCharge {
    #[error("Invalid amount: must be a positive integer.")]
    Amount,
    #[error("Invalid currency: {0:?} is not a three-letter currency code.")]
    Currency(String),
    #[error("No such token: '{0}'")]
    NoSuchToken(String),
}

impl ChargeRequest {
    /// Checks what serde cannot: values that parse but make no sense.
    pub(super) fn validate(&self) -> Result<(), InvalidCharge> {
        if self.amount == 0 {
            return Err(InvalidCharge::Amount);
        }
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(InvalidCharge::Currency(self.currency.clone()));
        }
        if !self.source.starts_with("tok_") {
            return Err(InvalidCharge::NoSuchToken(self.source.clone()));
        }
        Ok(())
    }

    /// SHA-256 of the canonical JSON of this request, in hex.
    pub(super) fn fingerprint(&self) -> String {
        let canonical = serde_json::to_vec(self).expect("a charge request always serializes");
        hex::encode(Sha256::digest(canonical))
    }
}

/// A charge as the API shows it. Field order is the wire order.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Charge {
    id: String,
    object: &'static str,
    amount: u64,
    currency: String,
    description: Option<String>,
    metadata: BTreeMap<String, String>,
    status: &'static str,
    idempotency_key: String,
    created: u64,
}

/// A finished response, kept so a retry gets exactly the same bytes.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct StoredResponse {
    pub(super) status: StatusCode,
    pub(super) body: Vec<u8>,
}

/// What a charge request may do with its idempotency key.
#[derive(Debug, PartialEq)]
pub(super) enum Claim {
    /// The key is new: this request, and only it, may charge.
    Granted,
    /// The key already has an answer for this very body.
    Replay(StoredResponse),
    /// Another request holding the key is still being processed.
    InUse,
    /// The key was used with a different body.
    Mismatch,
}

/// What processing a granted request came to.
#[derive(Debug)]
pub(super) enum Outcome {
    Charged(Charge),
    Declined,
}

/// The counters behind `GET /_control/stats`.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub(super) struct Stats {
    /// Succeeded charges created.
    charges: u64,
    /// Declines, first-time only (a replayed decline is not a new one).
    declined: u64,
    /// Every `POST /v1/charges` received, replays and faulted ones included.
    requests: u64,
    /// Every look-up by key (`GET /v1/charges?idempotency_key=`) received.
    look_ups: u64,
    /// Charge requests that got a failure injected (`error_before`, `error_after`, `timeout_after`).
    faults: u64,
}

#[derive(Debug)]
struct KeyEntry {
    fingerprint: String,
    /// `None` while the request that claimed the key is being processed.
    response: Option<StoredResponse>,
}

/// All state of one gateway. Callers wrap it in a mutex.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// In creation order; a mock holds few charges, so look-ups just scan.
    charges: Vec<Charge>,
    /// The idempotency cache, which unlike `charges` can be forgotten.
    keys: HashMap<String, KeyEntry>,
    stats: Stats,
}

impl Ledger {
    /// Counts one `POST /v1/charges`, whatever becomes of it.
    pub(super) fn count_request(&mut self) {
        self.stats.requests += 1;
    }

    /// Counts one charge request that gets a failure injected.
    pub(super) fn count_fault(&mut self) {
        self.stats.faults += 1;
    }

    /// Counts one look-up by key.
    pub(super) fn count_look_up(&mut self) {
        self.stats.look_ups += 1;
    }

    /// Decides what a request with this key and body may do. A granted
    /// claim marks the key as in use until [`Ledger::finish`], which is what
    /// guarantees a single charge per key.
    pub(super) fn claim(&mut self, key: &str, fingerprint: &str) -> Claim {
        let Some(entry) = self.keys.get(key) else {
            let entry = KeyEntry { fingerprint: fingerprint.to_owned(), response: None };
            self.keys.insert(key.to_owned(), entry);
            return Claim::Granted;
        };
        match &entry.response {
            _ if entry.fingerprint != fingerprint => Claim::Mismatch,
            None => Claim::InUse,
            Some(response) => Claim::Replay(response.clone()),
        }
    }

    /// Carries out a granted request: creates the charge, or records a decline.
    pub(super) fn settle(&mut self, key: &str, request: &ChargeRequest) -> Outcome {
        if request.source == DECLINED_TOKEN {
            self.stats.declined += 1;
            return Outcome::Declined;
        }
        let charge = Charge {
            id: new_charge_id(),
            object: "charge",
            amount: request.amount,
            currency: request.currency.to_ascii_lowercase(),
            description: request.description.clone(),
            metadata: request.metadata.clone(),
            status: "succeeded",
            idempotency_key: key.to_owned(),
            created: unix_now(),
        };
        self.charges.push(charge.clone());
        self.stats.charges += 1;
        Outcome::Charged(charge)
    }

    /// Stores the final response of a granted request for later replays.
    pub(super) fn finish(&mut self, key: &str, response: StoredResponse) {
        // The entry is always there: `forget_keys` spares claimed keys.
        if let Some(entry) = self.keys.get_mut(key) {
            entry.response = Some(response);
        }
    }

    /// Forgets every answered idempotency key, as a real processor does after
    /// its retention window; charges are kept. Keys whose request is still
    /// being processed stay claimed, so forgetting never opens a window for a
    /// second charge while the first is being made.
    pub(super) fn forget_keys(&mut self) {
        self.keys.retain(|_, entry| entry.response.is_none());
    }

    pub(super) fn charge(&self, id: &str) -> Option<&Charge> {
        self.charges.iter().find(|c| c.id == id)
    }

    /// Charges made with this key, oldest first. Normally at most one; more
    /// only if the key was reused after [`Ledger::forget_keys`].
    pub(super) fn charges_with_key(&self, key: &str) -> Vec<Charge> {
        let made_with_key = |c: &&Charge| c.idempotency_key == key;
        self.charges.iter().filter(made_with_key).cloned().collect()
    }

    pub(super) fn stats(&self) -> Stats {
        self.stats
    }
}

fn new_charge_id() -> String {
    let suffix: String = rand::rng().sample_iter(Alphanumeric).take(24).map(char::from).collect();
    format!("ch_{suffix}")
}

fn unix_now() -> u64 {
    // A clock before 1970 is not worth failing a charge over.
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &str = r#"{"amount": 500, "currency": "USD", "source": "tok_visa"}"#;

    fn request(json: &str) -> ChargeRequest {
        serde_json::from_str(json).expect("test body parses")
    }

    fn answer() -> StoredResponse {
        let body = b"{}".to_vec();
        StoredResponse { status: StatusCode::OK, body }
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
            assert!(request(body).validate().is_err(), "{body}");
        }
        assert!(request(BODY).validate().is_ok());
    }

    #[test]
    fn fingerprint_ignores_key_order_but_not_values() {
        let fingerprint = request(BODY).fingerprint();
        let reordered = r#"{"source": "tok_visa", "currency": "USD", "amount": 500}"#;
        let other = r#"{"amount": 501, "currency": "USD", "source": "tok_visa"}"#;
        assert_eq!(request(reordered).fingerprint(), fingerprint);
        assert_ne!(request(other).fingerprint(), fingerprint);
    }

    #[test]
    fn a_key_charges_once_then_replays() {
        let (mut ledger, req) = (Ledger::default(), request(BODY));
        let fp = req.fingerprint();
        assert_eq!(ledger.claim("k", &fp), Claim::Granted);
        assert_eq!(ledger.claim("k", &fp), Claim::InUse);
        assert_eq!(ledger.claim("k", "other"), Claim::Mismatch);
        let Outcome::Charged(charge) = ledger.settle("k", &req) else {
            panic!("tok_visa charges");
        };
        assert_eq!((charge.currency.as_str(), charge.id.len()), ("usd", 3 + 24));
        ledger.finish("k", answer());
        assert_eq!(ledger.claim("k", &fp), Claim::Replay(answer()));
        assert_eq!(ledger.charges_with_key("k").len(), 1);
        assert!(ledger.charge(&charge.id).is_some());
    }

    #[test]
    fn forgetting_keys_keeps_charges_and_spares_claimed_keys() {
        let (mut ledger, req) = (Ledger::default(), request(BODY));
        let fp = req.fingerprint();
        assert_eq!(ledger.claim("k", &fp), Claim::Granted);
        ledger.forget_keys();
        assert_eq!(ledger.claim("k", &fp), Claim::InUse);
        ledger.settle("k", &req);
        ledger.finish("k", answer());
        ledger.forget_keys();
        assert_eq!(ledger.claim("k", &fp), Claim::Granted);
        assert_eq!(ledger.charges_with_key("k").len(), 1);
    }

    #[test]
    fn declines_count_but_create_nothing() {
        let mut ledger = Ledger::default();
        let req = request(r#"{"amount": 1, "currency": "eur", "source": "tok_chargeDeclined"}"#);
        assert!(matches!(ledger.settle("k", &req), Outcome::Declined));
        let stats = ledger.stats();
        assert_eq!((stats.charges, stats.declined), (0, 1));
        assert!(ledger.charges_with_key("k").is_empty());
    }
}
