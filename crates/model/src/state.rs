//! What the model's states are made of: the database's rows, the gateway's, the drivers and what
//! the client was told.

use payments_protocol::RefundStage;

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
    /// What its refunds took back (`amount_refunded`).
    pub refunded: u8,
    /// What its pending refunds reserve (`amount_refund_pending`).
    pub reserved: u8,
}

/// A charge the gateway made, under the downstream key of a row.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Charge {
    pub generation: u8,
    /// Succeeded, or declined.
    pub succeeded: bool,
    /// What the gateway's refunds of it hold: pending or succeeded (a failed one gave it back).
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
    pub(crate) fn new() -> Driver {
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

    pub(crate) fn runs(&self) -> bool {
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
    pub(crate) fn settles(self) -> bool {
        matches!(self, Answer::Payment(_) | Answer::Expired)
    }
}

/// An event the gateway sent: about a charge it made, or about where it settled a refund.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Event {
    Charge(u8),
    Refund(usize, RefundStage),
}

/// Where a refund request, with a key of its own, stands. Each asks for its amount
/// ([`crate::REFUNDS_ASK`]), which it carries once it fits.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum RefundPc {
    Idle,
    /// Decided that it fits, not reserved yet (only in a broken variant).
    Checked(u8),
    /// `started`: reserved, pending; the gateway is to be asked.
    Reserved(u8),
    /// The gateway made it, and answered where it stands: succeeded, or pending.
    Answered(u8, RefundStage),
    /// Its answer recorded and its key finished: succeeded, or pending until the gateway's event
    /// or the settler's look-up settles it (forward only), or failed.
    Recorded(u8, RefundStage),
    Refused,
}

/// A refund: the request's progress, and the refund the gateway holds for it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Refund {
    pub pc: RefundPc,
    /// Where the gateway has it, once made: pending, succeeded or failed.
    pub at_gateway: Option<RefundStage>,
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
    /// Events on their way, in no order; and the inbox's rows, the events received (each once,
    /// by its unique key, unless a broken variant has none).
    pub in_flight: Vec<Event>,
    pub inbox: Vec<Event>,
    pub refunds: [Refund; 2],
    /// What the run did, for the paths that must be reached.
    pub seen: Seen,
}

/// What a run did that a state alone does not show: each is a path that must be reached, or a
/// guarantee's witness (a phase on a finished key, an event that disagrees).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Seen {
    /// A phase committed on a finished key.
    pub finished_key_changed: bool,
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
    /// A refund the gateway left pending was settled by its event.
    pub settled_by_event: bool,
    /// An event that came again was applied again (only with no inbox).
    pub applied_again: bool,
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
    /// A refund's `started` (the money rule), its reservation (a broken variant's second
    /// transaction), its gateway call (answered succeeded at once, or pending), and its record.
    RefundStart(usize),
    RefundReserve(usize),
    RefundCall(usize, RefundStage),
    RefundRecord(usize),
    /// The gateway settles a refund it left pending: succeeded, or failed (its money given back).
    GatewaySettles(usize, RefundStage),
    /// The settler looks a recorded pending refund up, and settles it as the gateway has it.
    SettlerLooksUp(usize),
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
