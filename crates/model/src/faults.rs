//! The faults: what may strike between the protocol's steps, each counted against the run's bound
//! ([`Protocol::faults`]). A process dies, or freezes (perhaps with its charge request on its way,
//! after its lease check) and later thaws; the lease of a holder dead or frozen runs out, which is
//! the only way time passes; the gateway forgets its keys; an event is sent again. (The gateway
//! failing before a charge, or after it, is one of its answers to the charge: see [`Gateway`].)
//!
//! [`Gateway`]: super::state::Gateway

use super::Protocol;
use super::state::{Action, Answer, Driver, Pc, State};

impl Protocol {
    /// Whether another fault may strike: the run has not had [`Protocol::faults`] yet.
    pub(crate) fn faults_left(&self, state: &State) -> bool {
        state.faults < self.faults
    }

    /// What may strike driver `d`: a frozen one thaws; a running one dies, freezes, or freezes
    /// with its charge request on its way.
    pub(crate) fn driver_faults(&self, state: &State, driver: &Driver, d: usize, actions: &mut Vec<Action>) {
        if driver.paused {
            actions.push(Action::Wake(d));
            return;
        }
        if driver.runs() && self.faults_left(state) {
            actions.push(Action::Crash(d));
            actions.push(Action::Pause(d));
            if self.charges_next(driver) && !driver.lease_lost {
                actions.push(Action::PauseInCall(d));
            }
        }
    }

    /// A dead or frozen holder's lease runs out, in time; and the gateway forgets its keys, but
    /// (unless told otherwise) not while a driver is on its way to charge: it keeps them far
    /// longer than that takes.
    pub(crate) fn lapse_and_forgetting(&self, state: &State, actions: &mut Vec<Action>) {
        if let Some(key) = &state.key
            && let Some(token) = key.token
            && !key.lease_over
            && state.drivers.iter().any(|driver| driver.token == token && (driver.pc == Pc::Dead || driver.paused))
        {
            actions.push(Action::LeaseLapses);
        }
        let on_its_way = state.drivers.iter().any(|driver| {
            !matches!(driver.pc, Pc::Dead | Pc::Done)
                && (driver.in_call || (!driver.lease_lost && self.charges_next(driver)))
        });
        if self.faults_left(state) && !state.remembered.is_empty() && (self.gateway_forgets_quickly || !on_its_way) {
            actions.push(Action::Forget);
        }
    }

    /// An event the service received, and the gateway has no longer on its way, is sent again.
    pub(crate) fn events_sent_again(&self, state: &State, actions: &mut Vec<Action>) {
        if self.faults_left(state) {
            for event in state.inbox.iter().filter(|event| !state.in_flight.contains(event)) {
                actions.push(Action::SendAgain(*event));
            }
        }
    }
}

impl State {
    /// What a fault does (and a thaw, and a lease running out). The completer is driver
    /// `completer`: its death leaves no client without an answer.
    pub(crate) fn strike(&mut self, action: Action, completer: usize) -> Option<()> {
        match action {
            Action::Crash(d) => {
                self.faults += 1;
                self.drivers[d].pc = Pc::Dead;
                if d < completer {
                    self.answers.push(Answer::Nothing);
                }
            }
            Action::Pause(d) => {
                self.faults += 1;
                self.drivers[d].paused = true;
            }
            Action::PauseInCall(d) => {
                self.faults += 1;
                self.drivers[d].paused = true;
                self.drivers[d].in_call = true;
            }
            Action::Wake(d) => self.drivers[d].paused = false,
            Action::LeaseLapses => {
                let key = self.key.as_mut()?;
                key.lease_over = true;
                let token = key.token;
                for driver in &mut self.drivers {
                    if Some(driver.token) == token && driver.paused {
                        driver.lease_lost = true;
                    }
                }
            }
            Action::Forget => {
                self.faults += 1;
                self.remembered.clear();
                self.seen.forgot = true;
            }
            Action::SendAgain(event) => {
                self.faults += 1;
                self.in_flight.push(event);
                self.in_flight.sort();
            }
            _ => return None,
        }
        Some(())
    }
}
