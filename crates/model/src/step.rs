//! The model's steps: which actions each state offers, and what each does. The faults that may
//! strike between them are [`super::faults`]'s, the refunds' steps [`super::refunds`]'s.

use stateright::Model;

use super::properties;
use super::state::{
    Action, Answer, Charge, Driver, Event, Gateway, KeyRow, Payment, Pc, Point, Refund, RefundPc, Seen, State,
};
use super::{Protocol, Rules, summary};

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            key: None,
            payment: None,
            next_token: 1,
            charges: Vec::new(),
            remembered: Vec::new(),
            drivers: vec![Driver::new(); usize::from(self.attempts) + 1],
            answers: Vec::new(),
            completer_runs: 0,
            faults: 0,
            in_flight: Vec::new(),
            inbox: Vec::new(),
            refunds: [Refund { pc: RefundPc::Idle, at_gateway: None }; 2],
            seen: Seen::default(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let faults_left = self.faults_left(state);
        // The client's next attempt, until an answer settles what the key did: after the last
        // one ended, or while it still runs (the client stopped waiting, or sent it twice), and
        // so to another process.
        let client = &state.drivers[..self.completer()];
        let next = client.iter().position(|driver| driver.pc == Pc::Idle);
        let settled = state.answers.iter().any(|answer| answer.settles());
        if let Some(next) = next
            && !settled
        {
            actions.push(Action::Claim(next));
        }
        // The completer: a key unfinished, not held (or its lease over), not flagged.
        let completer = &state.drivers[self.completer()];
        if self.rules.completer
            && state.completer_runs < self.completer_runs
            && !completer.runs()
            && !completer.paused
            && let Some(key) = &state.key
            && key.point != Point::Finished
            && (key.token.is_none() || key.lease_over)
            && !key.flagged
        {
            actions.push(Action::TakeOver);
        }
        for (d, driver) in state.drivers.iter().enumerate() {
            if driver.runs() {
                self.driver_steps(driver, d, faults_left, actions);
            }
            self.driver_faults(state, driver, d, actions);
        }
        self.lapse_and_forgetting(state, actions);
        if self.events {
            let mut events = state.in_flight.clone();
            events.dedup();
            for event in events {
                actions.push(Action::Deliver(event));
            }
            self.events_sent_again(state, actions);
        }
        // The reaper: a finished key, at any time; even while its client may still retry with it
        // (a retention shorter than the client's retries, which `serve` refuses to be set to):
        // what a late retry is told is the claim's to decide.
        if state.key.as_ref().is_some_and(|key| key.point == Point::Finished) {
            actions.push(Action::Reap);
        }
        if self.refunds {
            self.refund_actions(state, actions);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        let rules = &self.rules;
        match action {
            Action::Claim(d) => {
                let found = match (&state.key, &state.payment) {
                    (Some(key), _) => payments_protocol::Found::Row {
                        same_request: true,
                        finished: key.point == Point::Finished,
                        lease: match (key.token, key.lease_over) {
                            (None, _) => payments_protocol::Lease::Free,
                            (Some(_), false) => payments_protocol::Lease::Live,
                            (Some(_), true) => payments_protocol::Lease::Over,
                        },
                    },
                    (None, Some(_)) => payments_protocol::Found::Expired { same_endpoint: true },
                    (None, None) => payments_protocol::Found::Nothing,
                };
                match (rules.claim)(found) {
                    payments_protocol::Claim::New => {
                        let generation = state.payment.as_ref().map_or(0, |payment| payment.generation + 1);
                        let token = state.take_token();
                        state.key = Some(KeyRow {
                            generation,
                            point: Point::Started,
                            token: Some(token),
                            lease_over: false,
                            answer: None,
                            flagged: false,
                        });
                        state.drivers[d] = Driver { pc: Pc::Claimed, token, ..Driver::new() };
                    }
                    payments_protocol::Claim::Replay => {
                        let answer =
                            state.key.as_ref().and_then(|key| key.answer).map_or(Answer::Unknown, Answer::Payment);
                        state.answer(d, answer);
                    }
                    payments_protocol::Claim::InFlight | payments_protocol::Claim::Mismatch => {
                        state.answer(d, Answer::InFlight)
                    }
                    payments_protocol::Claim::Expired => state.answer(d, Answer::Expired),
                    payments_protocol::Claim::Resume { .. } => state.resume(d)?,
                }
            }
            Action::TakeOver => {
                state.resume(self.completer())?;
                state.completer_runs += 1;
            }
            Action::Start(d) => {
                if !state.fenced(d, rules) {
                    state.answer(d, Answer::InFlight);
                } else {
                    // The payment the key made, or (for a key whose claim ran alone) made now.
                    let generation = state.key.as_ref()?.generation;
                    let made_now = state.payment.as_ref().is_none_or(|payment| payment.generation != generation);
                    if made_now {
                        state.payment = Some(Payment { generation, charge: None, refunded: 0, reserved: 0 });
                    }
                    state.renew(d);
                    state.drivers[d].pc = Pc::Started;
                    state.drivers[d].made_now = made_now;
                }
            }
            Action::LookUp(d) => {
                let generation = state.payment.as_ref()?.generation;
                let found = state.charges.iter().position(|charge| charge.generation == generation);
                let made_now = state.drivers[d].made_now;
                match (rules.after_look_up)(found, made_now, true) {
                    payments_protocol::AfterLookUp::Adopt(charge) => {
                        if state.seen.forgot {
                            state.seen.forgotten_then_found = true;
                        }
                        state.drivers[d].pc = Pc::Answered(charge as u8);
                    }
                    payments_protocol::AfterLookUp::Request => state.drivers[d].pc = Pc::ToCharge,
                    payments_protocol::AfterLookUp::WrongGateway => state.drivers[d].pc = Pc::Unknown,
                }
            }
            Action::Charge(d, gateway) => {
                let generation = state.payment.as_ref()?.generation;
                let charge =
                    |state: &mut State, succeeded| match state.remembered.iter().find(|(g, _)| *g == generation) {
                        Some((_, charge)) => *charge,
                        None => {
                            state.charges.push(Charge { generation, succeeded, refunded: 0 });
                            let charge = (state.charges.len() - 1) as u8;
                            state.remembered.push((generation, charge));
                            if self.events {
                                state.in_flight.push(Event::Charge(charge));
                            }
                            charge
                        }
                    };
                state.drivers[d].in_call = false;
                state.drivers[d].pc = match gateway {
                    Gateway::Answers => Pc::Answered(charge(&mut state, true)),
                    Gateway::Declines => Pc::Answered(charge(&mut state, false)),
                    Gateway::FailsBefore => {
                        state.faults += 1;
                        Pc::Unknown
                    }
                    Gateway::FailsAfter => {
                        state.faults += 1;
                        charge(&mut state, true);
                        Pc::Unknown
                    }
                };
            }
            Action::Record(d) => {
                let Pc::Answered(charge) = state.drivers[d].pc else { return None };
                if !state.fenced(d, rules) {
                    state.answer(d, Answer::InFlight);
                } else {
                    let key = state.key.as_mut()?;
                    if key.point == Point::Finished {
                        state.seen.finished_key_changed = true;
                    }
                    key.point = Point::ChargeCreated;
                    state.payment.as_mut()?.charge = Some(charge);
                    // A run that made the payment records the answer with the key's finish.
                    match payments_protocol::recording(state.drivers[d].made_now) {
                        payments_protocol::Recording::WithFinish => state.finish(d, self.completer())?,
                        payments_protocol::Recording::ThenFinish => {
                            state.renew(d);
                            state.drivers[d].pc = Pc::Recorded;
                        }
                    }
                }
            }
            Action::Finish(d) => {
                if !state.fenced(d, rules) {
                    state.answer(d, Answer::InFlight);
                } else {
                    state.finish(d, self.completer())?;
                }
            }
            Action::Release(d) => return Some(state.released(d, rules)),
            Action::Crash(_)
            | Action::Pause(_)
            | Action::PauseInCall(_)
            | Action::Wake(_)
            | Action::LeaseLapses
            | Action::Forget
            | Action::SendAgain(_) => state.strike(action, self.completer())?,
            Action::Deliver(event) => {
                let at = state.in_flight.iter().position(|e| *e == event)?;
                state.in_flight.remove(at);
                let received = state.inbox.contains(&event);
                if !received {
                    state.inbox.push(event);
                    state.inbox.sort();
                }
                // A duplicate finds its row in the inbox, and changes nothing; with no inbox, it is
                // applied again.
                if received && rules.inbox {
                    return Some(state);
                }
                if received {
                    state.seen.applied_again = true;
                }
                match event {
                    Event::Charge(charge) => state.apply_charge_event(charge),
                    Event::Refund(r, stage) => state.apply_refund_event(r, stage, rules),
                }
            }
            // What the key made stays: its claim finds it (but in a broken variant).
            Action::Reap => state.key = None,
            Action::RefundStart(_)
            | Action::RefundReserve(_)
            | Action::RefundCall(..)
            | Action::RefundRecord(_)
            | Action::GatewaySettles(..)
            | Action::SettlerLooksUp(_) => state.refund_step(action, self.events, rules)?,
        }
        Some(state)
    }

    fn properties(&self) -> Vec<stateright::Property<Self>> {
        properties::all()
    }

    fn format_action(&self, action: &Action) -> String {
        self.describe(action)
    }

    fn format_step(&self, last: &State, action: Action) -> Option<String> {
        self.next_state(last, action).map(|next| summary(&next).replace(" | ", "\n"))
    }
}

impl Protocol {
    /// What running driver `d` does next: its phase, its gateway call (which may fail, a fault
    /// while `faults_left`), or its release.
    fn driver_steps(&self, driver: &Driver, d: usize, faults_left: bool, actions: &mut Vec<Action>) {
        match driver.pc {
            // Its own clock says its lease ran out while it was frozen: it makes no call (but
            // one frozen after its check sends the request it had on its way).
            Pc::Started | Pc::ToCharge if driver.lease_lost && !driver.in_call => actions.push(Action::Release(d)),
            Pc::Claimed => actions.push(Action::Start(d)),
            Pc::Started if (self.rules.first_call)(driver.resumed) == payments_protocol::FirstCall::LookUp => {
                actions.push(Action::LookUp(d))
            }
            Pc::Started | Pc::ToCharge => {
                actions.push(Action::Charge(d, Gateway::Answers));
                actions.push(Action::Charge(d, Gateway::Declines));
                if faults_left {
                    actions.push(Action::Charge(d, Gateway::FailsBefore));
                    actions.push(Action::Charge(d, Gateway::FailsAfter));
                }
            }
            Pc::Answered(_) => actions.push(Action::Record(d)),
            Pc::Recorded => actions.push(Action::Finish(d)),
            Pc::Unknown => actions.push(Action::Release(d)),
            _ => {}
        }
    }
}

impl State {
    /// A charge event, new (or applied again): about a key whose answer is recorded, it is held to
    /// it, and one that disagrees flags the key for a person; the key not yet at that point is only
    /// woken, and its driver records what the gateway did.
    fn apply_charge_event(&mut self, charge: u8) {
        let generation = self.charges[usize::from(charge)].generation;
        let answered = self.key.as_ref().is_none_or(|key| key.point != Point::Started);
        let Some(payment) = &self.payment else { return };
        if payment.generation != generation || !answered {
            return;
        }
        let recorded = payment.charge.filter(|charge| self.charges[usize::from(*charge)].succeeded);
        let read = payments_protocol::read_charge_event(
            recorded.is_some(),
            recorded.map(|charge| charge.to_string()).as_deref(),
            self.charges[usize::from(charge)].succeeded,
            &charge.to_string(),
        );
        if read == payments_protocol::Reading::Disagrees {
            self.seen.disagreed = true;
            if let Some(key) = self.key.as_mut() {
                key.flagged = true;
            }
        }
    }

    fn take_token(&mut self) -> u8 {
        let token = self.next_token;
        self.next_token += 1;
        token
    }

    /// Driver `d` holds the key, taken up again from its recorded point: a finished phase is
    /// never run again.
    fn resume(&mut self, d: usize) -> Option<()> {
        let token = self.take_token();
        let key = self.key.as_mut()?;
        key.token = Some(token);
        key.lease_over = false;
        let pc = match key.point {
            Point::Started => Pc::Claimed,
            Point::ChargeCreated => Pc::Recorded,
            Point::Finished => return None,
        };
        self.drivers[d] = Driver { pc, token, resumed: true, ..Driver::new() };
        self.seen.resumed = true;
        Some(())
    }

    /// Driver `d`'s finish, under its lock: the key finished with the payment's charge as its
    /// answer, and the answer given (the completer gives none).
    fn finish(&mut self, d: usize, completer: usize) -> Option<()> {
        let charge = self.payment.as_ref()?.charge?;
        let key = self.key.as_mut()?;
        if key.point == Point::Finished && key.answer != Some(charge) {
            self.seen.finished_key_changed = true;
        }
        key.point = Point::Finished;
        key.answer = Some(charge);
        key.token = None;
        key.lease_over = false;
        if d == completer {
            self.seen.completer_finished = true;
            self.drivers[d].pc = Pc::Done;
        } else {
            self.answer(d, Answer::Payment(charge));
        }
        Some(())
    }

    /// Driver `d`'s phase committed: its lease is renewed from now, by the database's clock.
    fn renew(&mut self, d: usize) {
        if let Some(key) = self.key.as_mut() {
            key.lease_over = false;
        }
        self.drivers[d].lease_lost = false;
    }

    /// Whether driver `d`'s phase commits: the fence.
    fn fenced(&self, d: usize, rules: &Rules) -> bool {
        let token = self.key.as_ref().and_then(|key| key.token);
        (rules.commits)(token.map(u64::from), u64::from(self.drivers[d].token))
    }

    /// Driver `d` told the client `answer` (the completer tells nobody), and ended.
    fn answer(&mut self, d: usize, answer: Answer) {
        self.drivers[d].pc = Pc::Done;
        if d + 1 < self.drivers.len() {
            self.answers.push(answer);
        }
    }

    /// An unknown outcome: the key let go where it stands (fenced), the client told `503`.
    fn released(mut self, d: usize, rules: &Rules) -> State {
        if self.fenced(d, rules)
            && let Some(key) = self.key.as_mut()
        {
            key.token = None;
            key.lease_over = false;
        }
        self.answer(d, Answer::Unknown);
        self
    }
}
