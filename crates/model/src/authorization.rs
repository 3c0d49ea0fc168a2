//! An authorization's life, and the race no key can settle. A payment made with `capture: false`
//! asks the gateway to authorize it; its answer may be lost, and its retry then looks the charge
//! up. Meanwhile and afterwards the gateway may capture or cancel the authorization on its own, as
//! its dashboard or another system does. A capture (of part of it), a cancel and the lapse, each a
//! request with a key of its own (the lapse, the worker's), race to end it: each makes its change
//! in its first phase, by the service's rule ([`payments_protocol::change_stands`]); the one that
//! stands asks the gateway, and records its answer. The gateway may lose an answer (it did the
//! change, and the request does not know), and the request then reads the charge before asking
//! again, as the service does. A refund then asks for all that was authorized, and gets what the
//! money rule ([`payments_protocol::refund_fits`]) gives of what was captured.
//!
//! The rule the service keeps whatever the gateway did meanwhile: whatever it says the charge is
//! (authorized, captured in whole or in part, cancelled), the payment records exactly that.

use stateright::{Model, Property};

/// The changes: a capture, a client's cancel, the lapse (a cancel by the worker).
pub const CHANGES: [&str; 3] = ["the capture", "the cancel", "the lapse"];

/// What is authorized, and what the client's capture takes of it.
pub const AUTHORIZED: u8 = 2;
pub const CAPTURED_BY_THE_CLIENT: u8 = 1;

/// The guarantees, each in every state reached.
pub const AUTHORIZATION_ALWAYS: [&str; 3] = [
    "a capture at most once and never after a cancel",
    "the payment records what the gateway holds",
    "refunds never exceed what was captured",
];

/// The paths that show the guarantees hold for something.
pub const AUTHORIZATION_SOMETIMES: [&str; 7] = [
    "the capture wins the race",
    "a cancel wins the race",
    "a change is refused because another stands",
    "the gateway captures on its own, and the payment records it",
    "the gateway cancels on its own, and the payment records it",
    "a refund takes back what was captured",
    "a refund of all that was authorized is refused after a partial capture",
];

/// The authorization's life, with the service's rules or a broken one.
#[derive(Clone, Debug)]
pub struct Authorization {
    /// Answers the gateway may lose: the authorization's, or a change's.
    pub faults: u8,
    /// The gateway may capture (all of it) or cancel the authorization on its own.
    pub gateway_acts: bool,
    pub broken: Option<AuthorizationMutant>,
}

/// A rule of the authorization's broken on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthorizationMutant {
    /// A handler checks that no other change stands, and the change is inserted by another
    /// statement, after.
    CheckedInTheHandler,
    /// A look-up that finds the charge captured records what was asked for, an authorization:
    /// the payment succeeded with nothing captured.
    IgnoresWhatTheGatewayDid,
}

impl Authorization {
    /// The authorization with the service's rules, and a gateway that acts on its own.
    pub fn new(faults: u8) -> Authorization {
        Authorization { faults, gateway_acts: true, broken: None }
    }

    pub fn with(self, mutant: AuthorizationMutant) -> Authorization {
        Authorization { broken: Some(mutant), ..self }
    }

    fn is(&self, mutant: AuthorizationMutant) -> bool {
        self.broken == Some(mutant)
    }
}

/// Where the charge stands at the gateway, or as the payment records it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Charge {
    /// Nothing yet: not made at the gateway; no answer recorded on the payment.
    Pending,
    Open,
    /// Captured, for this much.
    Captured(u8),
    Canceled,
}

impl Charge {
    fn captured(self) -> u8 {
        match self {
            Charge::Captured(amount) => amount,
            _ => 0,
        }
    }
}

/// Where the payment's own request stands.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Authorizing {
    /// The gateway is to be asked to authorize.
    Asking,
    /// It authorized, and its answer was lost: the retry is to look the charge up.
    Lost,
    /// The payment records the gateway's answer.
    Done,
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
    /// The gateway answered: done, or refused (the charge ended otherwise), and the charge as it
    /// says it stands.
    Answered {
        done: bool,
        says: Charge,
    },
    Done,
    Refused,
}

/// A refund of the payment, which asks for all that was authorized.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Refunding {
    Idle,
    Done(u8),
    Refused,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct AuthorizationState {
    pub authorizing: Authorizing,
    pub changes: [ChangePc; 3],
    /// The changes that stand in the index.
    pub standing: Vec<usize>,
    pub gateway: Charge,
    pub payment: Charge,
    /// What the gateway did on its own, if it did.
    pub gateway_acted: Option<Charge>,
    pub refund: Refunding,
    /// What the gateway refunded, and what the payment records refunded.
    pub gateway_refunded: u8,
    pub payment_refunded: u8,
    pub faults: u8,
    /// Our changes the gateway did.
    pub done_by_us: u8,
    /// A change was asked of the gateway after one of ours had ended the authorization there.
    pub asked_after_it_ended: bool,
    /// A change was refused because another stood.
    pub refused_for_another: bool,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum AuthorizationAction {
    /// The payment's request asks the gateway to authorize; `lost`: it did, and its answer was
    /// lost.
    Authorize(bool),
    /// The payment's retry looks the charge up, and records it.
    LookUp,
    /// The gateway captures all of it, or cancels it, on its own.
    GatewayActs(Charge),
    /// The change's first phase (with the broken rule: its check).
    Start(usize),
    /// The broken rule's insert, a statement after its check.
    Insert(usize),
    /// The gateway asked (or read, for a request taken up again); `lost`: it answered, and its
    /// answer was lost.
    Call(usize, bool),
    Record(usize),
    /// A refund of all that was authorized: decided, made at the gateway and recorded.
    Refund,
}

/// What change `c` does to the charge.
fn result_of(c: usize) -> Charge {
    if c == 0 { Charge::Captured(CAPTURED_BY_THE_CLIENT) } else { Charge::Canceled }
}

impl Model for Authorization {
    type State = AuthorizationState;
    type Action = AuthorizationAction;

    fn init_states(&self) -> Vec<AuthorizationState> {
        vec![AuthorizationState {
            authorizing: Authorizing::Asking,
            changes: [ChangePc::Idle; 3],
            standing: Vec::new(),
            gateway: Charge::Pending,
            payment: Charge::Pending,
            gateway_acted: None,
            refund: Refunding::Idle,
            gateway_refunded: 0,
            payment_refunded: 0,
            faults: 0,
            done_by_us: 0,
            asked_after_it_ended: false,
            refused_for_another: false,
        }]
    }

    fn actions(&self, state: &AuthorizationState, actions: &mut Vec<AuthorizationAction>) {
        let faults_left = state.faults < self.faults;
        match state.authorizing {
            Authorizing::Asking => {
                actions.push(AuthorizationAction::Authorize(false));
                if faults_left {
                    actions.push(AuthorizationAction::Authorize(true));
                }
            }
            Authorizing::Lost => actions.push(AuthorizationAction::LookUp),
            Authorizing::Done => {}
        }
        if self.gateway_acts && state.gateway == Charge::Open && state.gateway_acted.is_none() {
            actions.push(AuthorizationAction::GatewayActs(Charge::Captured(AUTHORIZED)));
            actions.push(AuthorizationAction::GatewayActs(Charge::Canceled));
        }
        // The changes come once the client knows of the payment (and the lapse's queue has it).
        if state.authorizing != Authorizing::Done {
            return;
        }
        for (c, pc) in state.changes.iter().enumerate() {
            match pc {
                ChangePc::Idle => actions.push(AuthorizationAction::Start(c)),
                ChangePc::Checked => actions.push(AuthorizationAction::Insert(c)),
                ChangePc::Standing { .. } => {
                    actions.push(AuthorizationAction::Call(c, false));
                    if faults_left {
                        actions.push(AuthorizationAction::Call(c, true));
                    }
                }
                ChangePc::Answered { .. } => actions.push(AuthorizationAction::Record(c)),
                ChangePc::Done | ChangePc::Refused => {}
            }
        }
        if matches!(state.payment, Charge::Captured(_)) && state.refund == Refunding::Idle {
            actions.push(AuthorizationAction::Refund);
        }
    }

    fn next_state(&self, last: &AuthorizationState, action: AuthorizationAction) -> Option<AuthorizationState> {
        let mut state = last.clone();
        match action {
            AuthorizationAction::Authorize(lost) => {
                state.gateway = Charge::Open;
                if lost {
                    state.faults += 1;
                    state.authorizing = Authorizing::Lost;
                } else {
                    state.payment = Charge::Open;
                    state.authorizing = Authorizing::Done;
                }
            }
            AuthorizationAction::LookUp => {
                // What the gateway says the charge is, recorded exactly.
                state.payment = match state.gateway {
                    Charge::Captured(_) if self.is(AuthorizationMutant::IgnoresWhatTheGatewayDid) => {
                        Charge::Captured(0)
                    }
                    charge => charge,
                };
                state.authorizing = Authorizing::Done;
            }
            AuthorizationAction::GatewayActs(charge) => {
                state.gateway = charge;
                state.gateway_acted = Some(charge);
            }
            AuthorizationAction::Start(c) => {
                let open = state.payment == Charge::Open;
                let stands = payments_protocol::change_stands(open, !state.standing.is_empty());
                let checked_in_the_handler = self.is(AuthorizationMutant::CheckedInTheHandler);
                state.changes[c] = match (stands, checked_in_the_handler) {
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
                    state.changes[c] = ChangePc::Answered { done: true, says: state.gateway };
                    return Some(state);
                }
                if state.gateway != Charge::Open && state.done_by_us > 0 {
                    state.asked_after_it_ended = true;
                }
                // The gateway does it to an open authorization; an ended one it refuses, saying how
                // it ended.
                let done = state.gateway == Charge::Open;
                if done {
                    state.gateway = result_of(c);
                    state.done_by_us += 1;
                }
                state.changes[c] = match lost {
                    true => {
                        state.faults += 1;
                        ChangePc::Standing { resumed: true }
                    }
                    false => ChangePc::Answered { done, says: state.gateway },
                };
            }
            AuthorizationAction::Record(c) => {
                let ChangePc::Answered { done, says } = state.changes[c] else { return None };
                // The payment records the charge as the gateway says it stands: what the change
                // did, or how the authorization ended otherwise.
                state.payment = says;
                if done {
                    state.changes[c] = ChangePc::Done;
                } else {
                    // Refused for good: the change fails, and no longer stands.
                    state.standing.retain(|&standing| standing != c);
                    state.changes[c] = ChangePc::Refused;
                }
            }
            AuthorizationAction::Refund => {
                let captured = i64::from(state.payment.captured());
                let refundable = captured - i64::from(state.payment_refunded);
                let asked = Some(i64::from(AUTHORIZED));
                state.refund = match payments_protocol::refund_fits(true, refundable, asked) {
                    Ok(amount) => {
                        state.gateway_refunded += amount as u8;
                        state.payment_refunded += amount as u8;
                        Refunding::Done(amount as u8)
                    }
                    Err(_) => Refunding::Refused,
                };
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(AUTHORIZATION_ALWAYS[0], |_, state: &AuthorizationState| {
                !state.asked_after_it_ended && state.done_by_us <= 1
            }),
            Property::always(AUTHORIZATION_ALWAYS[1], |model, state: &AuthorizationState| {
                let recorded_an_end = !matches!(state.payment, Charge::Pending | Charge::Open);
                let holds = !recorded_an_end || state.payment == state.gateway;
                holds && (!model.settled(state) || state.payment == state.gateway)
            }),
            Property::always(AUTHORIZATION_ALWAYS[2], |_, state: &AuthorizationState| {
                state.payment_refunded <= state.payment.captured() && state.gateway_refunded <= state.gateway.captured()
            }),
            Property::sometimes(AUTHORIZATION_SOMETIMES[0], |_, state: &AuthorizationState| {
                state.payment == result_of(0)
            }),
            Property::sometimes(AUTHORIZATION_SOMETIMES[1], |_, state: &AuthorizationState| {
                state.payment == Charge::Canceled && state.gateway_acted.is_none()
            }),
            Property::sometimes(AUTHORIZATION_SOMETIMES[2], |_, state: &AuthorizationState| state.refused_for_another),
            Property::sometimes(AUTHORIZATION_SOMETIMES[3], |_, state: &AuthorizationState| {
                state.gateway_acted == Some(Charge::Captured(AUTHORIZED)) && state.payment == state.gateway
            }),
            Property::sometimes(AUTHORIZATION_SOMETIMES[4], |_, state: &AuthorizationState| {
                state.gateway_acted == Some(Charge::Canceled) && state.payment == Charge::Canceled
            }),
            Property::sometimes(AUTHORIZATION_SOMETIMES[5], |_, state: &AuthorizationState| {
                matches!(state.refund, Refunding::Done(_))
            }),
            Property::sometimes(AUTHORIZATION_SOMETIMES[6], |_, state: &AuthorizationState| {
                state.refund == Refunding::Refused && state.payment == result_of(0)
            }),
        ]
    }

    fn format_action(&self, action: &AuthorizationAction) -> String {
        match *action {
            AuthorizationAction::Authorize(false) => "the payment's request asks the gateway to authorize".to_string(),
            AuthorizationAction::Authorize(true) => {
                "the payment's request asks the gateway to authorize, and its answer is lost".to_string()
            }
            AuthorizationAction::LookUp => "the payment's retry looks the charge up and records it".to_string(),
            AuthorizationAction::GatewayActs(Charge::Canceled) => "the gateway cancels it on its own".to_string(),
            AuthorizationAction::GatewayActs(_) => "the gateway captures it all on its own".to_string(),
            AuthorizationAction::Start(c) if self.is(AuthorizationMutant::CheckedInTheHandler) => {
                format!("{} checks that no other change stands", CHANGES[c])
            }
            AuthorizationAction::Start(c) => format!("{} commits `started`: it stands, or is refused", CHANGES[c]),
            AuthorizationAction::Insert(c) => format!("{} is inserted", CHANGES[c]),
            AuthorizationAction::Call(c, false) => format!("{} asks the gateway (or reads the charge)", CHANGES[c]),
            AuthorizationAction::Call(c, true) => format!("{} asks the gateway, and its answer is lost", CHANGES[c]),
            AuthorizationAction::Record(c) => format!("{} records the gateway's answer", CHANGES[c]),
            AuthorizationAction::Refund => "a refund of all that was authorized".to_string(),
        }
    }
}

impl Authorization {
    /// Whether nothing can happen but a lost answer or the gateway acting on its own.
    fn settled(&self, state: &AuthorizationState) -> bool {
        let mut actions = Vec::new();
        self.actions(state, &mut actions);
        actions.iter().all(|action| {
            matches!(
                action,
                AuthorizationAction::Authorize(true)
                    | AuthorizationAction::Call(_, true)
                    | AuthorizationAction::GatewayActs(_)
            )
        })
    }
}
