//! Which gateway's answer may settle a payment's charge. The address a process calls may lead to
//! another gateway than the one a payment records (a mock restarted with an empty memory, a proxy
//! pointed elsewhere, a migration from one gateway to another), and a proxy in front of a gateway
//! answers some requests itself. So every answer comes with who gave it ([`Answered`]), and these
//! two rules say what it may settle:
//! - [`adoptable`]: what a look-up by our downstream key found is adopted wherever it is (only one
//!   gateway can hold a charge made under our key), but finding nothing settles it only at the
//!   payment's own gateway ([`WrongGateway`] otherwise: asking another to charge could charge
//!   twice);
//! - [`settles`]: a charge request's definitive answer is recorded with the gateway that gave it;
//!   one that names no gateway, for a payment whose gateway names itself, is a proxy's own (a `403`
//!   or `404`, say) and says nothing of the charge; an unknown outcome from a gateway that names
//!   itself, another than the recorded one, moves the payment there, so that the retry looks it up
//!   where the charge may be.

use std::sync::Arc;

use payments_protocol::{self as protocol, AfterLookUp};

use super::charge::{Charge, GatewayError, WrongGateway};
use super::client::Answered;

/// A look-up's answer: the charge of ours it found, if any.
pub type LookedUp = Answered<Option<Result<Charge, GatewayError>>>;

/// A charge request's answer, or the look-up's finding that is adopted in its place.
pub type ChargeAnswer = Answered<Result<Charge, GatewayError>>;

/// What a look-up by our downstream key, made for a payment `recorded` at a gateway before the
/// charge is asked again, means: a charge to adopt, none (ask for the charge), or the wrong gateway
/// to tell. `made_now`: the payment was made by this run, so charged nowhere yet.
pub fn adoptable(looked_up: LookedUp, recorded: &str, made_now: bool) -> Result<Option<ChargeAnswer>, WrongGateway> {
    let (from_recorded, by, named) =
        (looked_up.is_from(recorded), looked_up.by().to_owned(), looked_up.named.is_some());
    match protocol::after_look_up(looked_up.found(), made_now, from_recorded) {
        AfterLookUp::Adopt(found) => {
            tracing::info!(gateway.account = %found.by(), "adopting what an earlier run's charge request did");
            Ok(Some(found))
        }
        AfterLookUp::Request => Ok(None),
        AfterLookUp::WrongGateway => Err(WrongGateway::new(recorded, &by, named)),
    }
}

/// What a charge's answer settles for a payment at `recorded` (none for a payment made before
/// gateways were recorded).
pub enum Settles {
    /// A definitive answer (the charge, or why nothing was charged), to record with `holder`, the
    /// gateway that holds the charge if there is one.
    Answer { answer: Result<Charge, GatewayError>, holder: Arc<str> },
    /// Nothing: the outcome is unknown. `moved_to`: another gateway, that named itself, answered,
    /// and may hold the charge: record it as the payment's before telling the client.
    Unknown { error: GatewayError, moved_to: Option<Arc<str>> },
}

/// What `answered` settles for a payment `recorded` at a gateway; `adopted`: it is a look-up's
/// finding (a charge of ours, which is ours wherever it is).
pub fn settles(answered: ChargeAnswer, recorded: Option<&str>, adopted: bool) -> Settles {
    let holder = answered.holder(recorded);
    let recorded = recorded.unwrap_or("(none recorded)");
    let said_by_a_gateway = answered.named.is_some() || answered.is_from(recorded);
    let answer = match answered.answer {
        // Only a gateway that names itself moves the payment (see `Answered::is_from`).
        Err(error) if !error.is_definitive() => {
            let moved_to = (answered.named.is_some() && &*holder != recorded).then_some(holder);
            return Settles::Unknown { error, moved_to };
        }
        answer => answer,
    };
    if !said_by_a_gateway && !adopted {
        let proxy = "an answer that names no gateway, for a payment whose gateway names itself";
        return Settles::Unknown { error: GatewayError::Unavailable(proxy.into()), moved_to: None };
    }
    Settles::Answer { answer, holder }
}
