//! What must hold in every state the model reaches, named as the guide names the guarantees; and
//! the paths it must be able to reach, so that no guarantee holds only because nothing happens.

use stateright::{Model, Property};

use payments_protocol::RefundStage;

use super::state::{Action, Answer, Charge, Gateway, Point, RefundPc, State};
use super::{AMOUNT, Protocol};

/// The guarantees: each holds in every state reached.
pub const ALWAYS: [&str; 7] = [
    "at most one charge per key",
    "refunds never exceed what was paid",
    "every gateway event applied at most once",
    "a finished key never changes",
    "no key left unfinished once the faults stop and the workers run",
    "the client's answer is what happened",
    "no gateway event disagrees with what its key recorded",
];

/// The paths: each is reached by some run.
pub const SOMETIMES: [&str; 9] = [
    "a key is taken up again",
    "the completer finishes a key its client abandoned",
    "a refund is refused for lack of money",
    "after the gateway forgot its keys, a look-up finds the charge",
    "the client is told the payment succeeded",
    "the client is told the card was declined",
    "a late retry of a reaped key is told what the key made",
    "a refund the gateway left pending is settled by its event",
    "a refund that failed at the gateway gives its money back",
];

impl Protocol {
    /// Whether a path can happen in this model at all: a refund's, only with refunds (and an
    /// event's, with events); a late retry, only with a second attempt.
    pub fn takes_part_in(&self, path: &str) -> bool {
        match path {
            path if path == SOMETIMES[6] => self.attempts > 1,
            path if path == SOMETIMES[7] => self.refunds && self.events,
            path if path == SOMETIMES[2] || path == SOMETIMES[8] => self.refunds,
            _ => true,
        }
    }
}

pub fn all() -> Vec<Property<Protocol>> {
    vec![
        Property::always(ALWAYS[0], |_, state: &State| state.charges.len() <= 1),
        Property::always(ALWAYS[1], |_, state: &State| {
            let here = state.payment.as_ref().is_none_or(|payment| payment.refunded + payment.reserved <= AMOUNT);
            let there = state.charges.iter().all(|charge| charge.refunded <= AMOUNT);
            here && there
        }),
        Property::always(ALWAYS[2], |_, state: &State| each_refunds_money_moved_once(state)),
        Property::always(ALWAYS[3], |_, state: &State| !state.seen.finished_key_changed),
        Property::always(ALWAYS[4], |model, state: &State| !settled(model, state) || finished(state)),
        Property::always(ALWAYS[5], |_, state: &State| answers_are_what_happened(state)),
        Property::always(ALWAYS[6], |_, state: &State| !state.seen.disagreed),
        Property::sometimes(SOMETIMES[0], |_, state: &State| state.seen.resumed),
        Property::sometimes(SOMETIMES[1], |_, state: &State| state.seen.completer_finished),
        Property::sometimes(SOMETIMES[2], |_, state: &State| state.seen.refund_refused),
        Property::sometimes(SOMETIMES[3], |_, state: &State| state.seen.forgotten_then_found),
        Property::sometimes(SOMETIMES[4], |_, state: &State| told(state).any(|charge| charge.succeeded)),
        Property::sometimes(SOMETIMES[5], |_, state: &State| told(state).any(|charge| !charge.succeeded)),
        Property::sometimes(SOMETIMES[6], |_, state: &State| state.answers.contains(&Answer::Expired)),
        Property::sometimes(SOMETIMES[7], |_, state: &State| state.seen.settled_by_event),
        Property::sometimes(SOMETIMES[8], |_, state: &State| {
            state.refunds.iter().any(|refund| matches!(refund.pc, RefundPc::Recorded(_, RefundStage::Failed)))
        }),
    ]
}

/// Whether the system has settled: nothing can happen but another fault. (The faults are
/// bounded, so every run settles.)
fn settled(model: &Protocol, state: &State) -> bool {
    let mut actions = Vec::new();
    model.actions(state, &mut actions);
    actions.iter().all(|action| {
        matches!(
            action,
            Action::Crash(_)
                | Action::Pause(_)
                | Action::PauseInCall(_)
                | Action::Forget
                | Action::SendAgain(_)
                | Action::Charge(_, Gateway::FailsBefore | Gateway::FailsAfter)
        )
    })
}

/// The key finished (or finished and reaped), and every refund ended: refused, or settled.
fn finished(state: &State) -> bool {
    let key = state.key.as_ref().is_none_or(|key| key.point == Point::Finished);
    let refunds = state.refunds.iter().all(|refund| match refund.pc {
        RefundPc::Idle | RefundPc::Refused => true,
        RefundPc::Recorded(_, stage) => stage != RefundStage::Pending,
        _ => false,
    });
    state.payment.is_some() && key && refunds
}

/// Each refund's money moved once, and as the gateway moved it, however often and in whatever
/// order its events came: what the payment records refunded is the amount of the refunds recorded
/// succeeded, what it reserves the amount of those still pending, and each refund recorded as
/// settled is settled so at the gateway.
fn each_refunds_money_moved_once(state: &State) -> bool {
    let Some(payment) = &state.payment else { return true };
    let (mut refunded, mut reserved) = (0, 0);
    for refund in &state.refunds {
        match refund.pc {
            RefundPc::Reserved(amount) | RefundPc::Answered(amount, _) => reserved += amount,
            RefundPc::Recorded(amount, RefundStage::Pending) => reserved += amount,
            RefundPc::Recorded(amount, stage) => {
                if refund.at_gateway != Some(stage) {
                    return false;
                }
                if stage == RefundStage::Succeeded {
                    refunded += amount;
                }
            }
            RefundPc::Idle | RefundPc::Checked(_) | RefundPc::Refused => {}
        }
    }
    payment.refunded == refunded && payment.reserved == reserved
}

/// Every payment the client was told of is the one the key made, charged at the gateway, and
/// every answer that names one names the same.
fn answers_are_what_happened(state: &State) -> bool {
    let mut told = state.answers.iter().filter_map(|answer| match answer {
        Answer::Payment(charge) => Some(*charge),
        _ => None,
    });
    let Some(first) = told.next() else { return true };
    let recorded = state.payment.as_ref().and_then(|payment| payment.charge);
    told.all(|charge| charge == first) && recorded == Some(first) && usize::from(first) < state.charges.len()
}

/// The charges the client was told of.
fn told(state: &State) -> impl Iterator<Item = &Charge> {
    state.answers.iter().filter_map(|answer| match answer {
        Answer::Payment(charge) => state.charges.get(usize::from(*charge)),
        _ => None,
    })
}
