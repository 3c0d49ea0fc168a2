//! What we ask the gateway to charge and what can come of it: the vocabulary that the client and
//! the reading of the gateway's answers share, and the errors of every gateway call.

use std::collections::BTreeMap;

use serde::Serialize;
use uuid::Uuid;

use crate::idempotency::DriveError;

/// The key we send the gateway for the request behind one of our key rows. Derived from our own
/// row, never the client's header: unique across accounts (two accounts may use the same client
/// key) and the same on every retry, resumption and worker run, so the gateway charges (or
/// refunds) once.
pub fn downstream_key(account_id: Uuid, key_id: Uuid) -> String {
    format!("{DOWNSTREAM_PREFIX}{account_id}:{key_id}")
}

const DOWNSTREAM_PREFIX: &str = "payments:";

/// The account and key row a downstream key names, if it is one of ours: how an event the
/// gateway sends about a request is matched with the request, whatever the gateway calls its
/// object.
pub fn parse_downstream_key(key: &str) -> Option<(Uuid, Uuid)> {
    let (account_id, key_id) = key.strip_prefix(DOWNSTREAM_PREFIX)?.split_once(':')?;
    Some((Uuid::try_parse(account_id).ok()?, Uuid::try_parse(key_id).ok()?))
}

/// A charge request, as the gateway takes it.
#[derive(Debug, Serialize)]
pub struct ChargeRequest<'a> {
    pub amount: i64,
    pub currency: &'a str,
    pub source: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<&'a str>,
    pub metadata: &'a BTreeMap<String, String>,
    /// `false`: authorize only, to capture later. Sent only then, so that a charge at once is the
    /// request it always was.
    #[serde(skip_serializing_if = "is_at_once")]
    pub capture: bool,
}

fn is_at_once(capture: &bool) -> bool {
    *capture
}

/// A charge the gateway made, and where it stands as the gateway tells it: what the payment
/// records, whatever it asked for (a gateway may ignore `capture`, and its dashboard or another
/// system may capture or cancel an authorization while our answer is lost).
#[derive(Debug, Clone)]
pub struct Charge {
    pub id: String,
    pub state: ChargeState,
}

/// Where a charge the gateway made stands (a failed one is a decline, [`GatewayError::Declined`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChargeState {
    /// Authorized only: the money held, to be captured or released.
    Authorized,
    /// Captured, for this much (an authorization captured in part: the rest released).
    Captured { amount: i64 },
    /// Authorized, then cancelled: nothing held.
    Canceled,
}

/// Why a charge or refund was not made, or may not have been.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The card was declined: definitive, nothing was charged.
    #[error("card declined ({code}): {message}")]
    Declined { code: String, message: String },
    /// The gateway knows no payment method by this `source`: definitive, nothing was charged, and
    /// the client's to fix.
    #[error("unknown source: {message}")]
    UnknownSource { message: String },
    /// The gateway refused the request for another reason (a 4xx; for a refund, also a 402):
    /// definitive, nothing was charged or refunded. A refund is refused when it asks for more than
    /// the charge has left (`amount_too_large`), when nothing is left (`charge_already_refunded`),
    /// or when the gateway knows no such charge (`404`).
    #[error("request rejected with {status}: {message}")]
    Rejected { status: u16, message: String },
    /// No definitive answer: a connection error, a 5xx, a 408/409/425/429 (timed out, still
    /// processing this key, throttled), an idempotency conflict at the gateway, or a success we
    /// cannot read or record. The charge or refund may or may not exist.
    #[error("gateway unavailable: {0}")]
    Unavailable(String),
    /// No answer in time. The charge or refund may or may not exist.
    #[error("the gateway did not answer in time")]
    Timeout,
}

impl GatewayError {
    /// Whether it says for certain that nothing was charged (or refunded): a decline, an unknown
    /// source, a refusal. Every other error leaves the outcome unknown.
    pub fn is_definitive(&self) -> bool {
        matches!(
            self,
            GatewayError::Declined { .. } | GatewayError::UnknownSource { .. } | GatewayError::Rejected { .. }
        )
    }
}

/// What a resumed request asked a gateway about (a charge or a refund) was asked of the gateway it
/// records, and another gateway answers at its address now, knowing nothing of it: only the
/// recorded gateway can say whether it was done, and asking another to do it could do it twice.
#[derive(Debug, thiserror::Error)]
#[error(
    "the request was made at the gateway {recorded}, and {answered} answers now, with nothing of ours: only the \
     recorded gateway may be asked again"
)]
pub struct WrongGateway {
    pub recorded: String,
    pub answered: String,
    /// Whether the answer named the gateway that gave it: only then is it known to be another.
    pub named: bool,
}

impl WrongGateway {
    /// `answered`, who answered instead of `recorded`, as the answer names it (`named`) or as
    /// its address.
    pub fn new(recorded: &str, answered: &str, named: bool) -> WrongGateway {
        WrongGateway { recorded: recorded.to_owned(), answered: answered.to_owned(), named }
    }
}

/// To a request, what another gateway's answer leaves: its outcome not known. A gateway that named
/// itself is another than the one that holds what the request made, so this process reaches
/// another: a worker gives the key back for a process that reaches that one
/// ([`DriveError::HeldElsewhere`]). An answer that names none (a proxy's own, say) says no such
/// thing, and is an unknown outcome like any.
impl From<WrongGateway> for DriveError {
    fn from(wrong: WrongGateway) -> DriveError {
        match wrong.named {
            true => DriveError::HeldElsewhere(Box::new(wrong)),
            false => DriveError::OutcomeUnknown(Box::new(wrong)),
        }
    }
}
