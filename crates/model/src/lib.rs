#![doc = include_str!("../README.md")]

mod authorization;
mod explain;
mod faults;
mod properties;
mod refunds;
mod rules;
mod state;
mod step;

use stateright::Model;

pub use authorization::{
    AUTHORIZATION_ALWAYS, AUTHORIZATION_SOMETIMES, Authorization, AuthorizationAction, AuthorizationMutant,
    AuthorizationState, ChangePc,
};
pub use explain::summary;
pub use properties::{ALWAYS, SOMETIMES};
pub use rules::{Mutant, Rules};
pub use state::{
    Action, Answer, Charge, Driver, Event, Gateway, KeyRow, Payment, Pc, Point, Refund, RefundPc, Seen, State,
};

/// What a run of the model holds to: how many times the client tries, how many faults may
/// strike, and what besides the payment takes part.
#[derive(Clone, Debug)]
pub struct Protocol {
    /// Attempts the client makes with its key (each after the last ended without an answer that
    /// settles it), each by whichever process.
    pub attempts: u8,
    /// Faults, all told: crashes, pauses, gateway failures, the gateway forgetting its keys, an
    /// event sent twice.
    pub faults: u8,
    /// How many times the completer may take the key over.
    pub completer_runs: u8,
    /// The gateway's events (one per charge made, one per refund settled) come to the service, in
    /// any order.
    pub events: bool,
    /// Two refunds, of 1 and of 2, race for the payment of 2 once it succeeded; the gateway
    /// answers each succeeded at once or pending, and settles a pending one later.
    pub refunds: bool,
    /// The decisions, the service's own or a broken variant's.
    pub rules: Rules,
    /// Whether the gateway may forget its keys while a driver is on its way to charge: between its
    /// decision to (a look-up that found nothing, or a payment it made itself) and its request
    /// reaching the gateway. That takes at most a lease, or a freeze after the lease check; a
    /// gateway keeps its keys far longer (Stripe: at least 24 hours), and a charge made meanwhile
    /// under the same downstream key is what it must remember. `false` is that assumption; `true`
    /// drops it, to show that it is needed.
    pub gateway_forgets_quickly: bool,
}

impl Protocol {
    /// The model with the service's rules.
    pub fn new(attempts: u8, faults: u8) -> Protocol {
        // Each run of the completer that fails, fails by a fault: one more than the faults
        // finishes the key.
        Protocol {
            attempts,
            faults,
            completer_runs: faults + 1,
            events: false,
            refunds: false,
            rules: Rules::service(),
            gateway_forgets_quickly: false,
        }
    }

    pub fn with_events(self) -> Protocol {
        Protocol { events: true, ..self }
    }

    pub fn with_refunds(self) -> Protocol {
        Protocol { refunds: true, ..self }
    }

    /// The same model with a broken rule.
    pub fn with(self, mutant: Mutant) -> Protocol {
        Protocol { rules: Rules::broken(mutant), ..self }
    }

    /// Whether the driver's next call is a charge request.
    fn charges_next(&self, driver: &Driver) -> bool {
        match driver.pc {
            Pc::Started => (self.rules.first_call)(driver.resumed) == payments_protocol::FirstCall::Request,
            Pc::ToCharge => true,
            _ => false,
        }
    }

    /// Who drives: the client's attempts, then the completer.
    fn completer(&self) -> usize {
        usize::from(self.attempts)
    }
}

/// The payment's amount, in the model's units; the refunds ask 1 and 2 of it.
pub const AMOUNT: u8 = 2;
pub const REFUNDS_ASK: [u8; 2] = [1, 2];

/// The shortest path to a state where the guarantee `property` fails, if any: the checker
/// searched breadth-first to one more step each time, so that the first path it finds is one of
/// the shortest. (A single search keeps the last failing state it visits, not the first.)
pub fn shortest_counterexample<M>(model: &M, property: &'static str) -> Option<stateright::Path<M::State, M::Action>>
where
    M: Model + Clone + Send + Sync + 'static,
    M::State: Clone + std::fmt::Debug + std::hash::Hash + PartialEq + Send + Sync,
    M::Action: Clone + std::fmt::Debug + PartialEq + Send + Sync,
{
    use stateright::{Checker, HasDiscoveries};
    let holds = model.properties().into_iter().find(|p| p.name == property)?.condition;
    let mut explored = 0;
    for depth in 2.. {
        let checker = model
            .clone()
            .checker()
            .target_max_depth(depth)
            .finish_when(HasDiscoveries::AnyOf([property].into()))
            .spawn_bfs()
            .join();
        if let Some(path) = checker.discovery(property) {
            let steps = path.into_vec();
            let first = steps.iter().position(|(state, _)| !holds(model, state))?;
            let actions: Vec<M::Action> = steps[..first].iter().filter_map(|(_, action)| action.clone()).collect();
            return stateright::Path::from_actions(model, steps[0].0.clone(), &actions);
        }
        // Deeper found nothing new: the whole space is explored.
        if checker.unique_state_count() == explored {
            return None;
        }
        explored = checker.unique_state_count();
    }
    None
}
