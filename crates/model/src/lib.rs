#![doc = include_str!("../README.md")]

mod authorization;
mod explain;
mod properties;
mod rules;

use stateright::Model;

pub use authorization::{
    AUTHORIZATION_ALWAYS, AUTHORIZATION_SOMETIMES, Authorization, AuthorizationAction, AuthorizationState, ChangePc,
};
pub use explain::summary;
pub use properties::{ALWAYS, SOMETIMES};
pub use rules::{Mutant, Rules};

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
    /// The gateway's events (one per charge made) come to the service, in any order.
    pub events: bool,
    /// Two refunds, of 1 and of 2, race for the payment of 2 once it succeeded.
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
const REFUNDS_ASK: [u8; 2] = [1, 2];

/// Where a key stands.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Point {
    Started,
    ChargeCreated,
    Finished,
}

/// The key's row. `generation` names the row: a key's row made again (after it was reaped) is
/// another row, with another downstream key.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct KeyRow {
    pub generation: u8,
    pub point: Point,
    /// The token of the lock on it, if held.
    pub token: Option<u8>,
    /// The lock's lease ran out (its driver died or froze).
    pub lease_over: bool,
    /// The stored answer: the charge the payment was made with.
    pub answer: Option<u8>,
    /// Flagged for a person (an event that disagrees).
    pub flagged: bool,
}

/// The payment the key's row made, which stays when the row is reaped.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Payment {
    pub generation: u8,
    /// The charge recorded on it (`charge_created`), succeeded or declined.
    pub charge: Option<u8>,
    pub refunded: u8,
    /// What pending refunds reserve.
    pub reserved: u8,
}

/// A charge the gateway made, under the downstream key of a row.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Charge {
    pub generation: u8,
    /// Succeeded, or declined.
    pub succeeded: bool,
    pub refunded: u8,
}

/// Where a driver (a client's attempt, or the completer's run) stands in the key's phases.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Pc {
    /// Not begun.
    Idle,
    /// Holds the key: its `started` runs on its own (a key taken up again, or one claimed by a
    /// process that does not know its gateway yet, whose claim runs alone).
    Claimed,
    /// `started` done: the gateway is to be asked.
    Started,
    /// The look-up found nothing: the gateway is to be asked to charge.
    ToCharge,
    /// The gateway answered with this charge.
    Answered(u8),
    /// The gateway's answer is not known: the key is to be let go.
    Unknown,
    /// `charge_created` done.
    Recorded,
    /// Ended: answered, or given up on.
    Done,
    /// Its process died.
    Dead,
}

/// A driver: one of the client's attempts, or the completer's run.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Driver {
    pub pc: Pc,
    pub token: u8,
    /// It took the key up again rather than making it: an earlier run may have charged.
    pub resumed: bool,
    /// Frozen (paused past its lease, perhaps).
    pub paused: bool,
    /// Its lease ran out while it was frozen: its own clock says so when it wakes.
    pub lease_lost: bool,
    /// Its `started` made the payment: nothing was ever sent for it.
    pub made_now: bool,
    /// Frozen with its charge request on its way, after its lease check: it sends it when it
    /// thaws, whatever became of its lease.
    pub in_call: bool,
}

impl Driver {
    fn new() -> Driver {
        Driver {
            pc: Pc::Idle,
            token: 0,
            resumed: false,
            paused: false,
            lease_lost: false,
            made_now: false,
            in_call: false,
        }
    }

    fn runs(&self) -> bool {
        !self.paused && !matches!(self.pc, Pc::Idle | Pc::Done | Pc::Dead)
    }
}

/// What the client was told.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Answer {
    /// `201` or `402`: the payment, with the charge it was made with, succeeded or declined (a
    /// replay too).
    Payment(u8),
    /// `409`: another request holds the key, or took it over.
    InFlight,
    /// `503`: not known yet; retry with the key.
    Unknown,
    /// No answer at all: the process died.
    Nothing,
    /// `410`: the key expired; the payment it made is named.
    Expired,
}

impl Answer {
    /// Whether the client stops: the answer settles what the key did.
    fn settles(self) -> bool {
        matches!(self, Answer::Payment(_) | Answer::Expired)
    }
}

/// An event the gateway sent about a charge.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Event {
    pub charge: u8,
}

/// A refund request, of `ask`, with a key of its own.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum RefundPc {
    Idle,
    /// Decided that it fits, not reserved yet (only in a broken variant).
    Checked(u8),
    /// Reserved, pending: the gateway is to be asked.
    Pending(u8),
    /// Refunded at the gateway: to be recorded.
    Refunded(u8),
    Succeeded,
    Refused,
}

/// The whole system: the database, the gateway, the drivers and what the client was told.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    pub key: Option<KeyRow>,
    pub payment: Option<Payment>,
    pub next_token: u8,
    pub charges: Vec<Charge>,
    /// The downstream keys (rows' generations) the gateway remembers, with the charge each made.
    pub remembered: Vec<(u8, u8)>,
    pub drivers: Vec<Driver>,
    pub answers: Vec<Answer>,
    pub completer_runs: u8,
    pub faults: u8,
    /// Events on their way, in no order; and those applied (the inbox), each once.
    pub in_flight: Vec<Event>,
    pub inbox: Vec<Event>,
    pub refunds: [RefundPc; 2],
    /// What the run did, for the properties that watch for it.
    pub seen: Seen,
}

/// What a run did that a state alone does not show.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Seen {
    /// A phase committed on a finished key.
    pub finished_key_changed: bool,
    /// An event was applied a second time.
    pub event_applied_twice: bool,
    /// An event disagreed with what its key recorded.
    pub disagreed: bool,
    /// A key was taken up again.
    pub resumed: bool,
    /// The completer finished a key.
    pub completer_finished: bool,
    /// A refund was refused for lack of money.
    pub refund_refused: bool,
    /// The gateway forgot its keys, and a look-up then found a charge and adopted it.
    pub forgotten_then_found: bool,
    pub forgot: bool,
}

/// One atomic step: a database transaction, a gateway call, or a fault.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Action {
    /// A client's attempt takes its key (the claim; the payment is made by `started`, in the
    /// same statement for a process that knows its gateway, which is one of the interleavings
    /// this one allows).
    Claim(usize),
    /// The completer takes the unfinished, unheld key over.
    TakeOver,
    /// `started`: the payment made, or found if an earlier run made it.
    Start(usize),
    /// The gateway is asked for what was charged under the downstream key.
    LookUp(usize),
    /// The gateway is asked to charge: it answers, fails before charging, or charges and fails.
    Charge(usize, Gateway),
    /// `charge_created`: the gateway's answer recorded.
    Record(usize),
    /// `finished`: the answer stored, the key let go.
    Finish(usize),
    /// An unknown outcome (or a lease run out before a call): the key let go where it stands, the
    /// client told `503`.
    Release(usize),
    /// A driver's process dies.
    Crash(usize),
    /// A driver's process freezes, and later thaws.
    Pause(usize),
    /// A driver's process freezes with its charge request on its way: after its lease check, before
    /// the gateway has it.
    PauseInCall(usize),
    Wake(usize),
    /// Time passes: the lease of a dead or frozen driver runs out.
    LeaseLapses,
    /// The gateway forgets the keys it answered (charges keep theirs).
    Forget,
    /// An event comes to the service; or is sent once more.
    Deliver(Event),
    SendAgain(Event),
    /// The reaper deletes the finished key's row.
    Reap,
    /// A refund's `started` (the money rule), its gateway call, and its record.
    RefundStart(usize),
    RefundReserve(usize),
    RefundCall(usize),
    RefundRecord(usize),
}

/// What the gateway does with a charge request.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Gateway {
    /// Charges (or answers the charge it remembers for the key).
    Answers,
    /// Declines the card (or answers the charge it remembers for the key).
    Declines,
    /// Fails before charging: a `500`, nothing done.
    FailsBefore,
    /// Charges, then fails or times out: done, and the answer lost.
    FailsAfter,
}

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
            refunds: [RefundPc::Idle; 2],
            seen: Seen::default(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let faults_left = state.faults < self.faults;
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
            if driver.paused {
                actions.push(Action::Wake(d));
                continue;
            }
            if !driver.runs() {
                continue;
            }
            let charges_next = self.charges_next(driver);
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
            if faults_left {
                actions.push(Action::Crash(d));
                actions.push(Action::Pause(d));
                if charges_next && !driver.lease_lost {
                    actions.push(Action::PauseInCall(d));
                }
            }
        }
        // A dead or frozen driver's lease runs out, in time.
        if let Some(key) = &state.key
            && let Some(token) = key.token
            && !key.lease_over
            && state.drivers.iter().any(|driver| driver.token == token && (driver.pc == Pc::Dead || driver.paused))
        {
            actions.push(Action::LeaseLapses);
        }
        // The gateway forgets its keys, but (unless told otherwise) not while a driver is on its
        // way to charge: it keeps them far longer than that takes.
        let on_its_way = state.drivers.iter().any(|driver| {
            !matches!(driver.pc, Pc::Dead | Pc::Done)
                && (driver.in_call || (!driver.lease_lost && self.charges_next(driver)))
        });
        if faults_left && !state.remembered.is_empty() && (self.gateway_forgets_quickly || !on_its_way) {
            actions.push(Action::Forget);
        }
        if self.events {
            let mut events = state.in_flight.clone();
            events.dedup();
            for event in events {
                actions.push(Action::Deliver(event));
            }
            if faults_left {
                for event in state.inbox.iter().filter(|event| !state.in_flight.contains(event)) {
                    actions.push(Action::SendAgain(*event));
                }
            }
        }
        // The reaper: a finished key, at any time; even while its client may still retry with it
        // (a retention shorter than the client's retries, which `serve` refuses to be set to):
        // what a late retry is told is the claim's to decide.
        if state.key.as_ref().is_some_and(|key| key.point == Point::Finished) {
            actions.push(Action::Reap);
        }
        if self.refunds && state.payment.as_ref().is_some_and(|payment| payment.charge.is_some()) {
            for (r, refund) in state.refunds.iter().enumerate() {
                match refund {
                    RefundPc::Idle => actions.push(Action::RefundStart(r)),
                    RefundPc::Checked(_) => actions.push(Action::RefundReserve(r)),
                    RefundPc::Pending(_) => actions.push(Action::RefundCall(r)),
                    RefundPc::Refunded(_) => actions.push(Action::RefundRecord(r)),
                    RefundPc::Succeeded | RefundPc::Refused => {}
                }
            }
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
                                state.in_flight.push(Event { charge });
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
                    state.renew(d);
                    state.drivers[d].pc = Pc::Recorded;
                }
            }
            Action::Finish(d) => {
                if !state.fenced(d, rules) {
                    state.answer(d, Answer::InFlight);
                } else {
                    let charge = state.payment.as_ref()?.charge?;
                    let key = state.key.as_mut()?;
                    if key.point == Point::Finished && key.answer != Some(charge) {
                        state.seen.finished_key_changed = true;
                    }
                    key.point = Point::Finished;
                    key.answer = Some(charge);
                    key.token = None;
                    key.lease_over = false;
                    if d == self.completer() {
                        state.seen.completer_finished = true;
                        state.drivers[d].pc = Pc::Done;
                    } else {
                        state.answer(d, Answer::Payment(charge));
                    }
                }
            }
            Action::Release(d) => return Some(state.released(d, rules)),
            Action::Crash(d) => {
                state.faults += 1;
                state.drivers[d].pc = Pc::Dead;
                if d < self.completer() {
                    state.answers.push(Answer::Nothing);
                }
            }
            Action::Pause(d) => {
                state.faults += 1;
                state.drivers[d].paused = true;
            }
            Action::PauseInCall(d) => {
                state.faults += 1;
                state.drivers[d].paused = true;
                state.drivers[d].in_call = true;
            }
            Action::Wake(d) => state.drivers[d].paused = false,
            Action::LeaseLapses => {
                let key = state.key.as_mut()?;
                key.lease_over = true;
                let token = key.token;
                for driver in &mut state.drivers {
                    if Some(driver.token) == token && driver.paused {
                        driver.lease_lost = true;
                    }
                }
            }
            Action::Forget => {
                state.faults += 1;
                state.remembered.clear();
                state.seen.forgot = true;
            }
            Action::Deliver(event) => {
                let at = state.in_flight.iter().position(|e| *e == event)?;
                state.in_flight.remove(at);
                if state.inbox.contains(&event) {
                    // A duplicate: the inbox row is there, nothing changes.
                    if !rules.inbox {
                        state.seen.event_applied_twice = true;
                    }
                } else {
                    state.inbox.push(event);
                    state.inbox.sort();
                    // About a key whose answer is recorded: held to it (the key not yet
                    // finished is only woken, and its driver records what the gateway did).
                    let generation = state.charges[usize::from(event.charge)].generation;
                    let answered = state.key.as_ref().is_none_or(|key| key.point != Point::Started);
                    if let Some(payment) = &state.payment
                        && payment.generation == generation
                        && answered
                    {
                        let recorded = payment.charge.filter(|charge| state.charges[usize::from(*charge)].succeeded);
                        let read = payments_protocol::read_charge_event(
                            recorded.is_some(),
                            recorded.map(|charge| charge.to_string()).as_deref(),
                            state.charges[usize::from(event.charge)].succeeded,
                            &event.charge.to_string(),
                        );
                        if read == payments_protocol::Reading::Disagrees {
                            state.seen.disagreed = true;
                            if let Some(key) = state.key.as_mut() {
                                key.flagged = true;
                            }
                        }
                    }
                }
            }
            Action::SendAgain(event) => {
                state.faults += 1;
                state.in_flight.push(event);
                state.in_flight.sort();
            }
            // What the key made stays: its claim finds it (but in a broken variant).
            Action::Reap => state.key = None,
            Action::RefundStart(r) => {
                let payment = state.payment.as_mut()?;
                let refundable = i64::from(AMOUNT) - i64::from(payment.refunded) - i64::from(payment.reserved);
                let succeeded = payment.charge.is_some_and(|charge| state.charges[usize::from(charge)].succeeded);
                let fits = payments_protocol::refund_fits(succeeded, refundable, Some(i64::from(REFUNDS_ASK[r])));
                state.refunds[r] = match (fits, rules.refund_in_one_statement) {
                    (Ok(amount), true) => {
                        payment.reserved += amount as u8;
                        RefundPc::Pending(amount as u8)
                    }
                    (Ok(amount), false) => RefundPc::Checked(amount as u8),
                    (Err(refusal), _) => {
                        if refusal != payments_protocol::Refusal::PaymentNotRefundable {
                            state.seen.refund_refused = true;
                        }
                        RefundPc::Refused
                    }
                };
            }
            Action::RefundReserve(r) => {
                let RefundPc::Checked(amount) = state.refunds[r] else { return None };
                state.payment.as_mut()?.reserved += amount;
                state.refunds[r] = RefundPc::Pending(amount);
            }
            Action::RefundCall(r) => {
                let RefundPc::Pending(amount) = state.refunds[r] else { return None };
                let charge = state.payment.as_ref()?.charge?;
                state.charges[usize::from(charge)].refunded += amount;
                state.refunds[r] = RefundPc::Refunded(amount);
            }
            Action::RefundRecord(r) => {
                let RefundPc::Refunded(amount) = state.refunds[r] else { return None };
                let payment = state.payment.as_mut()?;
                // (A payment made again, under a reaped key in a broken variant, reserved nothing.)
                payment.reserved = payment.reserved.saturating_sub(amount);
                payment.refunded += amount;
                state.refunds[r] = RefundPc::Succeeded;
            }
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

impl State {
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
