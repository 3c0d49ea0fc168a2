//! The race no key can settle: a capture, a cancel and the lapse of one authorization, each a
//! request with a key of its own (the lapse, the worker's), racing for it. Each makes its change in
//! its first phase, by the service's rule ([`payments_protocol::change_stands`]); the one that
//! stands asks the gateway, and records its answer. The gateway may lose an answer (it did the
//! change, and the request does not know), and the request then reads the charge before asking
//! again, as the service does.

use stateright::{Model, Property};

/// The changes: a capture, a client's cancel, the lapse (a cancel by the worker).
pub const CHANGES: [&str; 3] = ["the capture", "the cancel", "the lapse"];

/// The guarantee, and the paths that show it holds for something.
pub const AUTHORIZATION_ALWAYS: [&str; 1] = ["a capture at most once and never after a cancel"];
pub const AUTHORIZATION_SOMETIMES: [&str; 3] =
    ["the capture wins the race", "a cancel wins the race", "a change is refused because another stands"];

/// The race, with the service's rule or a broken one.
#[derive(Clone, Debug)]
pub struct Authorization {
    /// Answers the gateway may lose.
    pub faults: u8,
    /// The broken rule: a handler checks that no other change stands, and the change is inserted
    /// by another statement, after.
    pub checked_in_the_handler: bool,
}

/// Where the charge stands at the gateway, or as the payment records it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Charge {
    Open,
    Captured,
    Canceled,
}

/// Where a change's request stands.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ChangePc {
    Idle,
    /// Checked that no other change stands (the broken rule only), not inserted yet.
    Checked,
    /// It stands: the gateway is to be asked (or, `resumed`, read first).
    Standing {
        resumed: bool,
    },
    /// The gateway answered: done, or refused for good.
    Answered {
        done: bool,
    },
    Done,
    Refused,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct AuthorizationState {
    pub changes: [ChangePc; 3],
    /// The changes that stand in the index.
    pub standing: Vec<usize>,
    pub gateway: Charge,
    pub payment: Charge,
    pub faults: u8,
    /// A change was asked of the gateway after another had ended the authorization there.
    pub asked_after_it_ended: bool,
    /// A change was refused because another stood.
    pub refused_for_another: bool,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum AuthorizationAction {
    /// The change's first phase (with the broken rule: its check).
    Start(usize),
    /// The broken rule's insert, a statement after its check.
    Insert(usize),
    /// The gateway asked (or read, for a request taken up again); `lost`: it did it, and its
    /// answer was lost.
    Call(usize, bool),
    Record(usize),
}

/// What change `c` does to the charge.
fn result_of(c: usize) -> Charge {
    if c == 0 { Charge::Captured } else { Charge::Canceled }
}

impl Model for Authorization {
    type State = AuthorizationState;
    type Action = AuthorizationAction;

    fn init_states(&self) -> Vec<AuthorizationState> {
        vec![AuthorizationState {
            changes: [ChangePc::Idle; 3],
            standing: Vec::new(),
            gateway: Charge::Open,
            payment: Charge::Open,
            faults: 0,
            asked_after_it_ended: false,
            refused_for_another: false,
        }]
    }

    fn actions(&self, state: &AuthorizationState, actions: &mut Vec<AuthorizationAction>) {
        for (c, pc) in state.changes.iter().enumerate() {
            match pc {
                ChangePc::Idle => actions.push(AuthorizationAction::Start(c)),
                ChangePc::Checked => actions.push(AuthorizationAction::Insert(c)),
                ChangePc::Standing { .. } => {
                    actions.push(AuthorizationAction::Call(c, false));
                    if state.faults < self.faults {
                        actions.push(AuthorizationAction::Call(c, true));
                    }
                }
                ChangePc::Answered { .. } => actions.push(AuthorizationAction::Record(c)),
                ChangePc::Done | ChangePc::Refused => {}
            }
        }
    }

    fn next_state(&self, last: &AuthorizationState, action: AuthorizationAction) -> Option<AuthorizationState> {
        let mut state = last.clone();
        match action {
            AuthorizationAction::Start(c) => {
                let open = state.payment == Charge::Open;
                let stands = payments_protocol::change_stands(open, !state.standing.is_empty());
                state.changes[c] = match (stands, self.checked_in_the_handler) {
                    (true, true) => ChangePc::Checked,
                    (true, false) => {
                        state.standing.push(c);
                        ChangePc::Standing { resumed: false }
                    }
                    (false, _) => {
                        state.refused_for_another |= open;
                        ChangePc::Refused
                    }
                };
            }
            AuthorizationAction::Insert(c) => {
                state.standing.push(c);
                state.changes[c] = ChangePc::Standing { resumed: false };
            }
            AuthorizationAction::Call(c, lost) => {
                let ChangePc::Standing { resumed } = state.changes[c] else { return None };
                // Taken up again, the request reads the charge first: what it did is adopted.
                if resumed && state.gateway == result_of(c) {
                    state.changes[c] = ChangePc::Answered { done: true };
                    return Some(state);
                }
                if state.gateway != Charge::Open {
                    state.asked_after_it_ended = true;
                }
                let done = state.gateway == Charge::Open;
                if done {
                    state.gateway = result_of(c);
                }
                state.changes[c] = match lost {
                    true => {
                        state.faults += 1;
                        ChangePc::Standing { resumed: true }
                    }
                    false => ChangePc::Answered { done },
                };
            }
            AuthorizationAction::Record(c) => {
                let ChangePc::Answered { done } = state.changes[c] else { return None };
                if done {
                    state.payment = result_of(c);
                    state.changes[c] = ChangePc::Done;
                } else {
                    // Refused for good: the change fails, and no longer stands.
                    state.standing.retain(|&standing| standing != c);
                    state.changes[c] = ChangePc::Refused;
                }
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(AUTHORIZATION_ALWAYS[0], |_, state: &AuthorizationState| {
                !state.asked_after_it_ended && (state.payment == Charge::Open || state.payment == state.gateway)
            }),
            Property::sometimes(AUTHORIZATION_SOMETIMES[0], |_, state: &AuthorizationState| {
                state.payment == Charge::Captured
            }),
            Property::sometimes(AUTHORIZATION_SOMETIMES[1], |_, state: &AuthorizationState| {
                state.payment == Charge::Canceled
            }),
            Property::sometimes(AUTHORIZATION_SOMETIMES[2], |_, state: &AuthorizationState| state.refused_for_another),
        ]
    }

    fn format_action(&self, action: &AuthorizationAction) -> String {
        match *action {
            AuthorizationAction::Start(c) if self.checked_in_the_handler => {
                format!("{} checks that no other change stands", CHANGES[c])
            }
            AuthorizationAction::Start(c) => format!("{} commits `started`: it stands, or is refused", CHANGES[c]),
            AuthorizationAction::Insert(c) => format!("{} is inserted", CHANGES[c]),
            AuthorizationAction::Call(c, false) => format!("{} asks the gateway (or reads the charge)", CHANGES[c]),
            AuthorizationAction::Call(c, true) => format!("{} asks the gateway, and its answer is lost", CHANGES[c]),
            AuthorizationAction::Record(c) => format!("{} records the gateway's answer", CHANGES[c]),
        }
    }
}
