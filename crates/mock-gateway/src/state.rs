//! The gateway's memory: charges, refunds, the idempotency cache and the counters.
//!
//! Pure bookkeeping, with no I/O and no waiting (the time is passed in), so the rules that matter
//! are unit-tested here: one charge, refund, capture or cancel per key, replay only for the same
//! body, an authorization captured at most once and never once cancelled, never a refund of more
//! than its charge has captured and left, a failed refund gives its amount back, a pending refund
//! settles when its time has come, an authorization the gateway changes on its own is changed
//! when its time has come (under a key of the gateway's own), and every change makes its event.
//!
//! Every change to the books (a charge made, authorized or declined, an authorization captured or
//! cancelled, a refund made, a refund settled) is one
//! [`Change`], carried out by [`Ledger::apply`] alone, which makes the change's event there and
//! then, with the object as it stands at that moment. The ledger only makes events: whoever holds
//! it takes them ([`Ledger::take_events`]) and hands them to the delivery, which sends them.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::http::StatusCode;
use rand::Rng;
use rand::distr::Alphanumeric;
use serde::Serialize;

use super::events::{Event, EventType};
use super::own_changes::{OWN_KEY_PREFIX, OwnChange, OwnChangeMade, OwnChangePlan};
use super::requests::{CancelRequest, CaptureRequest, ChargeRequest, Endpoint, RefundRequest};

/// The token that test clients use to ask for a declined card.
const DECLINED_TOKEN: &str = "tok_chargeDeclined";
/// Tokens that charge like any other, and whose charges get refunds that are `pending` at first
/// and later `succeeded`, or `failed`.
const REFUND_PENDING_TOKEN: &str = "tok_refundPending";
const REFUND_FAILS_TOKEN: &str = "tok_refundFails";
/// How long a pending refund takes to settle: long enough to be seen pending from outside,
/// short enough for a demo. Tests that cannot wait settle them at once (`/_control`).
pub(super) const REFUND_SETTLES_AFTER: Duration = Duration::from_secs(2);
/// Why the refunds of a `tok_refundFails` charge fail: one of Stripe's `failure_reason`s.
const REFUND_FAILURE_REASON: &str = "expired_or_canceled_card";
/// Why a `tok_chargeDeclined` charge failed, as Stripe says it (the 402's `code` and `message` too).
pub(super) const DECLINE_CODE: &str = "card_declined";
pub(super) const DECLINE_MESSAGE: &str = "Your card was declined.";

/// A charge's `status`: captured, declined, authorized only, or an authorization cancelled.
const SUCCEEDED: &str = "succeeded";
const FAILED: &str = "failed";
const REQUIRES_CAPTURE: &str = "requires_capture";
const CANCELED: &str = "canceled";

/// A charge as the API shows it. Field order is the wire order.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Charge {
    id: String,
    object: &'static str,
    amount: u64,
    /// What was captured: all of it for a charge made at once, none while it is only authorized,
    /// what the capture took once it is captured.
    amount_captured: u64,
    /// What its refunds that have not failed take back, pending ones included (as on Stripe).
    amount_refunded: u64,
    captured: bool,
    currency: String,
    description: Option<String>,
    metadata: BTreeMap<String, String>,
    /// Whether all it captured is taken back.
    refunded: bool,
    /// `succeeded`, or `failed` for a declined card: a decline is kept as a charge, as Stripe
    /// keeps it, so that a look-up by key finds it and an event can show it. An authorization is
    /// `requires_capture` until it is captured (`succeeded`) or cancelled (`canceled`).
    status: &'static str,
    /// Why it failed; only on a failed charge.
    #[serde(skip_serializing_if = "Option::is_none")]
    failure_code: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    failure_message: Option<&'static str>,
    idempotency_key: String,
    created: u64,
    /// How its refunds end, chosen by the source it was made with (which a charge does not show).
    #[serde(skip)]
    refunds_end: RefundFate,
    /// An authorization past its time, which can no longer be captured (only cancelled).
    #[serde(skip)]
    expired: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RefundFate {
    /// `succeeded` at once.
    Succeed,
    /// `pending`, then this after [`REFUND_SETTLES_AFTER`].
    Settle(RefundEnd),
}

/// How a pending refund ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RefundEnd {
    Succeeded,
    /// Its amount goes back to the charge.
    Failed,
}

/// A refund as the API shows it. Field order is the wire order.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Refund {
    id: String,
    object: &'static str,
    amount: u64,
    charge: String,
    currency: String,
    metadata: BTreeMap<String, String>,
    reason: Option<String>,
    status: RefundStatus,
    /// Why it failed (Stripe's name); only on a failed refund.
    #[serde(skip_serializing_if = "Option::is_none")]
    failure_reason: Option<&'static str>,
    idempotency_key: String,
    created: u64,
    /// For a pending refund: when it settles, and how.
    #[serde(skip)]
    settles: Option<(Instant, RefundEnd)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum RefundStatus {
    Pending,
    Succeeded,
    Failed,
}

/// Why a refund was not made. Decided against the books, so stored under the key like any answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(super) enum RefundRefusal {
    #[error("No such charge: '{0}'")]
    NoSuchCharge(String),
    #[error("Charge {0} failed: there is nothing to refund.")]
    NotRefundable(String),
    #[error("Charge {0} has already been refunded.")]
    AlreadyRefunded(String),
    #[error("Refund amount ({amount}) is greater than unrefunded amount on charge ({left}).")]
    AmountTooLarge { amount: u64, left: u64 },
}

/// Why a capture or a cancel was not done. Decided against the books, so stored under the key like
/// any answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(super) enum ChangeRefusal {
    #[error("No such charge: '{0}'")]
    NoSuchCharge(String),
    #[error("Charge {0} has already been captured.")]
    AlreadyCaptured(String),
    #[error("Charge {0} has been canceled: it can no longer be captured or canceled.")]
    Canceled(String),
    #[error("Charge {0} failed: there is nothing to capture or cancel.")]
    Failed(String),
    #[error("The authorization of charge {0} has expired: it can no longer be captured.")]
    AuthorizationExpired(String),
    #[error("Capture amount ({amount}) is greater than the amount authorized ({authorized}).")]
    AmountTooLarge { amount: u64, authorized: u64 },
}

impl ChangeRefusal {
    /// The error's `code`, as a processor names it.
    pub(super) fn code(&self) -> &'static str {
        match self {
            ChangeRefusal::NoSuchCharge(_) => "resource_missing",
            ChangeRefusal::AlreadyCaptured(_) => "charge_already_captured",
            ChangeRefusal::Canceled(_) => "charge_canceled",
            ChangeRefusal::Failed(_) => "charge_failed",
            ChangeRefusal::AuthorizationExpired(_) => "authorization_expired",
            ChangeRefusal::AmountTooLarge { .. } => "amount_too_large",
        }
    }
}

/// The card was declined: no money moved. The charge, with this id, is kept, `failed`.
#[derive(Debug, PartialEq)]
pub(super) struct Declined(pub(super) String);

/// A finished response, kept so a retry gets exactly the same bytes.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct StoredResponse {
    pub(super) status: StatusCode,
    pub(super) body: Vec<u8>,
}

/// What a request may do with its idempotency key.
#[derive(Debug, PartialEq)]
pub(super) enum Claim {
    /// The key is new: this request, and only it, may make a charge or a refund.
    Granted,
    /// The key already has an answer for this very body.
    Replay(StoredResponse),
    /// Another request holding the key is still being processed.
    InUse,
    /// The key was used with a different body, or on the other endpoint.
    Mismatch,
}

/// The counters behind `GET /_control/stats`.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub(super) struct Stats {
    /// Succeeded charges created (a declined one is kept as a failed charge, and not counted here).
    charges: u64,
    /// Declines, first-time only (a replayed decline is not a new one).
    declined: u64,
    /// Every `POST /v1/charges` received, replays and faulted ones included.
    requests: u64,
    /// Every look-up of charges by key (`GET /v1/charges?idempotency_key=`) received.
    look_ups: u64,
    /// Requests (charges and refunds) that got a failure injected (`error_before`, `error_after`,
    /// `timeout_after`).
    faults: u64,
    /// Refunds made, whatever their status.
    refunds: u64,
    /// What the refunds that have not failed take back, pending ones included.
    refunded_amount: u64,
    /// Every `POST /v1/refunds` received, replays and faulted ones included.
    refund_requests: u64,
    /// Every look-up of refunds by key (`GET /v1/refunds?idempotency_key=`) received.
    refund_look_ups: u64,
    /// Charges authorized only, to be captured later.
    authorizations: u64,
    /// Authorizations captured, and what they captured.
    captures: u64,
    captured_amount: u64,
    /// Authorizations cancelled.
    cancels: u64,
    /// Every `POST /v1/charges/{id}/capture` and `/cancel` received, replays and faulted ones
    /// included.
    capture_requests: u64,
    cancel_requests: u64,
}

#[derive(Debug)]
struct KeyEntry {
    fingerprint: String,
    /// `None` while the request that claimed the key is being processed.
    response: Option<StoredResponse>,
}

/// A change to the books: see [`Ledger::apply`].
enum Change {
    /// The card was declined: the charge is kept, failed.
    ChargeDeclined(Charge),
    ChargeCreated(Charge),
    ChargeAuthorized(Charge),
    /// The authorized charge at this index in `charges` is captured, for this amount, by the
    /// request with this key.
    ChargeCaptured(usize, u64, String),
    /// The authorized charge at this index in `charges` is cancelled by the request with this key.
    ChargeCanceled(usize, String),
    RefundCreated(Refund),
    /// The pending refund at this index in `refunds` settles as it was meant to.
    RefundSettled(usize),
}

/// All state of one gateway. Callers wrap it in a mutex.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// In creation order, never removed.
    charges: Vec<Charge>,
    /// Where each charge is in `charges`, by id: every refund finds its charge, and a benchmark's
    /// gateway holds tens of thousands, which a scan per refund made cost more CPU than the charge.
    charge_at: HashMap<String, usize>,
    refunds: Vec<Refund>,
    /// Indices in `refunds` of the pending ones, oldest first: all take the same time to settle,
    /// so they settle in this order, and finding none due is one comparison.
    pending: VecDeque<usize>,
    /// The idempotency cache, for charges and refunds alike, which unlike them can be forgotten.
    keys: HashMap<String, KeyEntry>,
    stats: Stats,
    /// Events made and not yet taken, oldest first; `None` for a gateway that sends no events,
    /// which makes none.
    events: Option<Vec<Event>>,
    /// How the gateway changes authorizations on its own; the changes it drew and has not made
    /// yet (when each is due, and where its charge is in `charges`), soonest first; and those it
    /// made.
    own_change_plan: OwnChangePlan,
    own_changes_due: BinaryHeap<Reverse<(Instant, usize, OwnChange)>>,
    own_changes_made: Vec<OwnChangeMade>,
}

impl Ledger {
    /// The books of a gateway that sends events: each change makes its event. (A default ledger
    /// makes none, and spends nothing on them.)
    pub(super) fn making_events() -> Ledger {
        Ledger { events: Some(Vec::new()), ..Ledger::default() }
    }

    /// Counts one request to `endpoint`, whatever becomes of it.
    pub(super) fn count_request(&mut self, endpoint: Endpoint) {
        match endpoint {
            Endpoint::Charges => self.stats.requests += 1,
            Endpoint::Refunds => self.stats.refund_requests += 1,
            Endpoint::Captures => self.stats.capture_requests += 1,
            Endpoint::Cancels => self.stats.cancel_requests += 1,
        }
    }

    /// Counts one request that gets a failure injected.
    pub(super) fn count_fault(&mut self) {
        self.stats.faults += 1;
    }

    /// Counts one look-up by key at `endpoint`.
    pub(super) fn count_look_up(&mut self, endpoint: Endpoint) {
        match endpoint {
            Endpoint::Refunds => self.stats.refund_look_ups += 1,
            _ => self.stats.look_ups += 1,
        }
    }

    /// Decides what a request with this key and body may do. A granted
    /// claim marks the key as in use until [`Ledger::finish`], which is what
    /// guarantees a single charge or refund per key.
    pub(super) fn claim(&mut self, key: &str, fingerprint: &str) -> Claim {
        let Some(entry) = self.keys.get(key) else {
            let entry = KeyEntry { fingerprint: fingerprint.to_owned(), response: None };
            self.keys.insert(key.to_owned(), entry);
            return Claim::Granted;
        };
        match &entry.response {
            _ if entry.fingerprint != fingerprint => Claim::Mismatch,
            None => Claim::InUse,
            Some(response) => Claim::Replay(response.clone()),
        }
    }

    /// Carries out a granted charge request: makes the charge, or declines it.
    pub(super) fn create_charge(&mut self, key: &str, request: &ChargeRequest) -> Result<Charge, Declined> {
        let refunds_end = match request.source.as_str() {
            REFUND_PENDING_TOKEN => RefundFate::Settle(RefundEnd::Succeeded),
            REFUND_FAILS_TOKEN => RefundFate::Settle(RefundEnd::Failed),
            _ => RefundFate::Succeed,
        };
        let mut charge = Charge {
            id: new_id("ch"),
            object: "charge",
            amount: request.amount,
            amount_captured: request.amount,
            amount_refunded: 0,
            captured: true,
            currency: request.currency.to_ascii_lowercase(),
            description: request.description.clone(),
            metadata: request.metadata.clone(),
            refunded: false,
            status: SUCCEEDED,
            failure_code: None,
            failure_message: None,
            idempotency_key: key.to_owned(),
            created: unix_now(),
            refunds_end,
            expired: false,
        };
        if request.source == DECLINED_TOKEN {
            (charge.status, charge.captured, charge.amount_captured) = (FAILED, false, 0);
            charge.failure_code = Some(DECLINE_CODE);
            charge.failure_message = Some(DECLINE_MESSAGE);
            let id = charge.id.clone();
            self.apply(Change::ChargeDeclined(charge));
            return Err(Declined(id));
        }
        if !request.capture {
            (charge.status, charge.captured, charge.amount_captured) = (REQUIRES_CAPTURE, false, 0);
            self.apply(Change::ChargeAuthorized(charge.clone()));
            return Ok(charge);
        }
        self.apply(Change::ChargeCreated(charge.clone()));
        Ok(charge)
    }

    /// Carries out a granted capture: all of the authorization, or part of it (the rest is
    /// released). Only an authorization still open can be captured, once.
    pub(super) fn capture(&mut self, key: &str, request: &CaptureRequest) -> Result<Charge, ChangeRefusal> {
        let at = self.authorization(&request.charge)?;
        let charge = &self.charges[at];
        if charge.expired {
            return Err(ChangeRefusal::AuthorizationExpired(charge.id.clone()));
        }
        let amount = request.amount.unwrap_or(charge.amount);
        if amount > charge.amount {
            return Err(ChangeRefusal::AmountTooLarge { amount, authorized: charge.amount });
        }
        self.apply(Change::ChargeCaptured(at, amount, key.to_owned()));
        Ok(self.charges[at].clone())
    }

    /// Carries out a granted cancel: the authorization's hold released, expired or not.
    pub(super) fn cancel(&mut self, key: &str, request: &CancelRequest) -> Result<Charge, ChangeRefusal> {
        let at = self.authorization(&request.charge)?;
        self.apply(Change::ChargeCanceled(at, key.to_owned()));
        Ok(self.charges[at].clone())
    }

    /// Where an authorization still open is in `charges`; or why the charge is none.
    fn authorization(&self, id: &str) -> Result<usize, ChangeRefusal> {
        let &at = self.charge_at.get(id).ok_or_else(|| ChangeRefusal::NoSuchCharge(id.to_owned()))?;
        let id = id.to_owned();
        match self.charges[at].status {
            REQUIRES_CAPTURE => Ok(at),
            SUCCEEDED => Err(ChangeRefusal::AlreadyCaptured(id)),
            CANCELED => Err(ChangeRefusal::Canceled(id)),
            _ => Err(ChangeRefusal::Failed(id)),
        }
    }

    /// Lets every open authorization run past its time (as days going by would): from now on it
    /// can only be cancelled. Returns how many.
    pub(super) fn expire_authorizations(&mut self) -> usize {
        let open = self.charges.iter_mut().filter(|charge| charge.status == REQUIRES_CAPTURE && !charge.expired);
        open.map(|charge| charge.expired = true).count()
    }

    /// From now on, authorizations are changed on the gateway's own as `plan` says (those drawn
    /// already are still made when due).
    pub(super) fn plan_own_changes(&mut self, plan: OwnChangePlan) {
        self.own_change_plan = plan;
    }

    pub(super) fn own_change_plan(&self) -> OwnChangePlan {
        self.own_change_plan
    }

    /// Draws, for `charge` made at `now`, what the gateway will do to it on its own, if it is an
    /// authorization: a capture or a cancel, due a moment later, or nothing.
    pub(super) fn draw_own_change(&mut self, charge: &Charge, now: Instant) {
        let Some(&at) = self.charge_at.get(&charge.id) else { return };
        let charge = &self.charges[at];
        if charge.status != REQUIRES_CAPTURE {
            return;
        }
        if let Some((after, change)) = self.own_change_plan.draw(charge.amount, &mut rand::rng()) {
            self.own_changes_due.push(Reverse((now + after, at, change)));
        }
    }

    /// When the next change the gateway drew is due, if any: another time the books change by
    /// themselves.
    pub(super) fn next_own_change(&self) -> Option<Instant> {
        self.own_changes_due.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Makes the changes the gateway drew that are due by `now`, under keys of its own; returns
    /// how many it made. One whose authorization was captured or cancelled meanwhile (by the
    /// merchant) is refused, like anyone's, and is not made.
    pub(super) fn make_own_changes_due(&mut self, now: Instant) -> usize {
        let mut made = 0;
        while let Some(&Reverse((due, at, change))) = self.own_changes_due.peek()
            && due <= now
        {
            self.own_changes_due.pop();
            let (key, charge) = (new_id(OWN_KEY_PREFIX), self.charges[at].id.clone());
            let (kind, changed) = match change {
                OwnChange::Capture(amount) => ("capture", self.capture(&key, &CaptureRequest { charge, amount })),
                OwnChange::Cancel => ("cancel", self.cancel(&key, &CancelRequest { charge })),
            };
            let Ok(changed) = changed else { continue };
            // The change just made its event, the last one made.
            let event = self.events.as_ref().and_then(|events| events.last()).map(|event| event.id.clone());
            let amount_captured = changed.amount_captured;
            self.own_changes_made.push(OwnChangeMade {
                charge: changed.id,
                kind,
                amount_captured,
                idempotency_key: key,
                event,
            });
            made += 1;
        }
        made
    }

    /// The changes the gateway made on its own, in the order made.
    pub(super) fn own_changes_made(&self) -> &[OwnChangeMade] {
        &self.own_changes_made
    }

    /// Carries out a granted refund request at `now`: refunds what was asked (by default all the
    /// charge has left), or refuses if the charge has less left. What a charge has left is its
    /// amount less its refunds that have not failed: pending ones count, as they may succeed.
    pub(super) fn create_refund(
        &mut self,
        key: &str,
        request: &RefundRequest,
        now: Instant,
    ) -> Result<Refund, RefundRefusal> {
        let charge = self.charge(&request.charge).ok_or_else(|| RefundRefusal::NoSuchCharge(request.charge.clone()))?;
        if charge.status != SUCCEEDED {
            return Err(RefundRefusal::NotRefundable(charge.id.clone()));
        }
        let left = charge.amount_captured - charge.amount_refunded;
        let amount = request.amount.unwrap_or(left);
        if left == 0 {
            return Err(RefundRefusal::AlreadyRefunded(charge.id.clone()));
        }
        if amount > left {
            return Err(RefundRefusal::AmountTooLarge { amount, left });
        }
        let (status, settles) = match charge.refunds_end {
            RefundFate::Succeed => (RefundStatus::Succeeded, None),
            RefundFate::Settle(end) => (RefundStatus::Pending, Some((now + REFUND_SETTLES_AFTER, end))),
        };
        let refund = Refund {
            id: new_id("re"),
            object: "refund",
            amount,
            charge: charge.id.clone(),
            currency: charge.currency.clone(),
            metadata: request.metadata.clone(),
            reason: request.reason.clone(),
            status,
            failure_reason: None,
            idempotency_key: key.to_owned(),
            created: unix_now(),
            settles,
        };
        self.apply(Change::RefundCreated(refund.clone()));
        Ok(refund)
    }

    /// Settles the pending refunds whose time has come by `now`; returns how many.
    pub(super) fn settle_due(&mut self, now: Instant) -> usize {
        self.settle_while(|refund| refund.settles.is_some_and(|(at, _)| at <= now))
    }

    /// Settles every pending refund now, due or not; returns how many.
    pub(super) fn settle_all(&mut self) -> usize {
        self.settle_while(|_| true)
    }

    /// When the oldest pending refund settles, if any is pending: the next time the books change
    /// by themselves.
    pub(super) fn next_settlement(&self) -> Option<Instant> {
        let &oldest = self.pending.front()?;
        self.refunds[oldest].settles.map(|(at, _)| at)
    }

    fn settle_while(&mut self, due: impl Fn(&Refund) -> bool) -> usize {
        let mut settled = 0;
        while let Some(&index) = self.pending.front()
            && due(&self.refunds[index])
        {
            self.apply(Change::RefundSettled(index));
            settled += 1;
        }
        settled
    }

    /// Carries out a change to the books: every charge and refund is made, and every refund
    /// settled, here and nowhere else, with what follows from it (the charge's refunded amount,
    /// the counters, the event).
    fn apply(&mut self, change: Change) {
        match change {
            Change::ChargeDeclined(charge) => {
                self.stats.declined += 1;
                make_event(&mut self.events, EventType::ChargeFailed, &charge, &charge.idempotency_key);
                self.keep(charge);
            }
            Change::ChargeCreated(charge) => {
                self.stats.charges += 1;
                make_event(&mut self.events, EventType::ChargeSucceeded, &charge, &charge.idempotency_key);
                self.keep(charge);
            }
            // As Stripe, an authorization is a charge that succeeded, not captured.
            Change::ChargeAuthorized(charge) => {
                self.stats.authorizations += 1;
                make_event(&mut self.events, EventType::ChargeSucceeded, &charge, &charge.idempotency_key);
                self.keep(charge);
            }
            Change::ChargeCaptured(at, amount, key) => {
                let charge = &mut self.charges[at];
                (charge.status, charge.captured, charge.amount_captured) = (SUCCEEDED, true, amount);
                self.stats.captures += 1;
                self.stats.captured_amount += amount;
                make_event(&mut self.events, EventType::ChargeCaptured, charge, &key);
            }
            Change::ChargeCanceled(at, key) => {
                let charge = &mut self.charges[at];
                charge.status = CANCELED;
                self.stats.cancels += 1;
                make_event(&mut self.events, EventType::ChargeCanceled, charge, &key);
            }
            Change::RefundCreated(refund) => {
                let charge = self.charge_mut(&refund.charge);
                let charge = charge.expect("a refund is made only for a charge the ledger holds");
                charge.amount_refunded += refund.amount;
                charge.refunded = charge.amount_refunded == charge.amount_captured;
                self.stats.refunds += 1;
                self.stats.refunded_amount += refund.amount;
                match refund.settles {
                    // Its event comes when it settles.
                    Some(_) => self.pending.push_back(self.refunds.len()),
                    None => make_event(&mut self.events, EventType::RefundSucceeded, &refund, &refund.idempotency_key),
                }
                self.refunds.push(refund);
            }
            Change::RefundSettled(index) => {
                self.pending.retain(|&pending| pending != index);
                let refund = &mut self.refunds[index];
                let Some((_, end)) = refund.settles.take() else { return };
                let kind = match end {
                    RefundEnd::Succeeded => {
                        refund.status = RefundStatus::Succeeded;
                        EventType::RefundSucceeded
                    }
                    RefundEnd::Failed => {
                        // A failed refund took nothing back: its charge has it to refund again.
                        refund.status = RefundStatus::Failed;
                        refund.failure_reason = Some(REFUND_FAILURE_REASON);
                        let charge = self.charge_at.get(&refund.charge).map(|&at| &mut self.charges[at]);
                        let charge = charge.expect("a refund's charge is never removed");
                        charge.amount_refunded -= refund.amount;
                        charge.refunded = false;
                        self.stats.refunded_amount -= refund.amount;
                        EventType::RefundFailed
                    }
                };
                let refund = &self.refunds[index];
                make_event(&mut self.events, kind, refund, &refund.idempotency_key);
            }
        }
    }

    /// The events made since the last call, oldest first, for the delivery to send.
    pub(super) fn take_events(&mut self) -> Vec<Event> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Stores the final response of a granted request for later replays.
    pub(super) fn finish(&mut self, key: &str, response: StoredResponse) {
        // The entry is always there: `forget_keys` spares claimed keys.
        if let Some(entry) = self.keys.get_mut(key) {
            entry.response = Some(response);
        }
    }

    /// Forgets every answered idempotency key, as a real processor does after
    /// its retention window; charges and refunds are kept, with their keys. Keys whose request
    /// is still being processed stay claimed, so forgetting never opens a window for a
    /// second charge or refund while the first is being made.
    pub(super) fn forget_keys(&mut self) {
        self.keys.retain(|_, entry| entry.response.is_none());
    }

    pub(super) fn charge(&self, id: &str) -> Option<&Charge> {
        self.charge_at.get(id).map(|&at| &self.charges[at])
    }

    fn charge_mut(&mut self, id: &str) -> Option<&mut Charge> {
        self.charge_at.get(id).map(|&at| &mut self.charges[at])
    }

    /// Keeps a charge made, where [`Ledger::charge`] finds it.
    fn keep(&mut self, charge: Charge) {
        self.charge_at.insert(charge.id.clone(), self.charges.len());
        self.charges.push(charge);
    }

    /// Charges made with this key, oldest first. Normally at most one; more
    /// only if the key was reused after [`Ledger::forget_keys`].
    pub(super) fn charges_with_key(&self, key: &str) -> Vec<Charge> {
        self.charges.iter().filter(|c| c.idempotency_key == key).cloned().collect()
    }

    pub(super) fn refund(&self, id: &str) -> Option<&Refund> {
        self.refunds.iter().find(|r| r.id == id)
    }

    /// Refunds made with this key, oldest first (as [`Ledger::charges_with_key`]).
    pub(super) fn refunds_with_key(&self, key: &str) -> Vec<Refund> {
        self.refunds.iter().filter(|r| r.idempotency_key == key).cloned().collect()
    }

    pub(super) fn stats(&self) -> Stats {
        self.stats
    }
}

/// Makes the event of a change, if the ledger makes events: `object` as it stands now, caused by
/// the request made with `idempotency_key`.
fn make_event(events: &mut Option<Vec<Event>>, kind: EventType, object: &impl Serialize, idempotency_key: &str) {
    if let Some(events) = events {
        events.push(Event::new(new_id("evt"), kind, object, idempotency_key, unix_now()));
    }
}

/// A new object id: `prefix`, an underscore and 24 letters and digits, as Stripe's.
fn new_id(prefix: &str) -> String {
    let suffix: String = rand::rng().sample_iter(Alphanumeric).take(24).map(char::from).collect();
    format!("{prefix}_{suffix}")
}

fn unix_now() -> u64 {
    // A clock before 1970 is not worth failing a charge over.
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::super::requests::Create;
    use super::*;

    fn charge_request(amount: u64, source: &str) -> ChargeRequest {
        serde_json::from_value(serde_json::json!({"amount": amount, "currency": "USD", "source": source}))
            .expect("test body parses")
    }

    fn refund_request(charge: &Charge, amount: Option<u64>) -> RefundRequest {
        serde_json::from_value(serde_json::json!({"charge": charge.id, "amount": amount})).expect("test body parses")
    }

    fn answer() -> StoredResponse {
        let body = b"{}".to_vec();
        StoredResponse { status: StatusCode::OK, body }
    }

    /// A ledger (making events) holding one charge of `amount` made with `source`, under the key
    /// `charge`.
    fn charged(amount: u64, source: &str) -> (Ledger, Charge) {
        let (mut ledger, request) = (Ledger::making_events(), charge_request(amount, source));
        assert_eq!(ledger.claim("charge", &request.fingerprint()), Claim::Granted);
        let charge = ledger.create_charge("charge", &request).expect("charged");
        ledger.finish("charge", answer());
        (ledger, charge)
    }

    /// What the ledger shows of `charge` now: its refunded amount and whether it is all refunded.
    fn refunded(ledger: &Ledger, charge: &Charge) -> (u64, bool) {
        let charge = ledger.charge(&charge.id).expect("the charge is kept");
        (charge.amount_refunded, charge.refunded)
    }

    /// A ledger (making events) holding one authorization of `amount`, under the key `auth`.
    fn authorized(amount: u64) -> (Ledger, Charge) {
        let mut request = charge_request(amount, "tok_visa");
        request.capture = false;
        let mut ledger = Ledger::making_events();
        let charge = ledger.create_charge("auth", &request).expect("authorized");
        (ledger, charge)
    }

    fn capture(charge: &Charge, amount: Option<u64>) -> CaptureRequest {
        CaptureRequest { charge: charge.id.clone(), amount }
    }

    fn cancel(charge: &Charge) -> CancelRequest {
        CancelRequest { charge: charge.id.clone() }
    }

    #[test]
    fn an_authorization_is_captured_once_in_part_and_refunded_only_what_it_captured() {
        let (mut ledger, charge) = authorized(500);
        assert_eq!((charge.status, charge.captured, charge.amount_captured), (REQUIRES_CAPTURE, false, 0));
        assert_eq!((ledger.stats().charges, ledger.stats().authorizations), (0, 1), "authorized, not charged");
        let refund = ledger.create_refund("r", &refund_request(&charge, None), Instant::now());
        assert_eq!(refund.unwrap_err(), RefundRefusal::NotRefundable(charge.id.clone()), "nothing captured yet");

        let too_much = ledger.capture("c", &capture(&charge, Some(501)));
        assert_eq!(too_much.unwrap_err(), ChangeRefusal::AmountTooLarge { amount: 501, authorized: 500 });
        let captured = ledger.capture("c", &capture(&charge, Some(300))).expect("300 of 500");
        assert_eq!((captured.status, captured.captured, captured.amount_captured), (SUCCEEDED, true, 300));
        let stats = ledger.stats();
        assert_eq!((stats.captures, stats.captured_amount), (1, 300));

        let again = ChangeRefusal::AlreadyCaptured(charge.id.clone());
        assert_eq!(ledger.capture("d", &capture(&charge, Some(1))).unwrap_err(), again);
        assert_eq!(
            ledger.cancel("e", &cancel(&charge)).unwrap_err(),
            again,
            "a captured charge is refunded, not cancelled"
        );
        let refund = ledger.create_refund("r", &refund_request(&charge, None), Instant::now()).expect("refunded");
        assert_eq!(refund.amount, 300, "all it captured");
        let more = ledger.create_refund("s", &refund_request(&charge, Some(1)), Instant::now());
        assert_eq!(more.unwrap_err(), RefundRefusal::AlreadyRefunded(charge.id.clone()));
        assert_eq!(refunded(&ledger, &charge), (300, true));
    }

    #[test]
    fn a_cancelled_authorization_is_never_captured_and_only_an_authorization_is_cancelled() {
        let (mut ledger, charge) = authorized(500);
        let canceled = ledger.cancel("c", &cancel(&charge)).expect("cancelled");
        assert_eq!((canceled.status, canceled.amount_captured), (CANCELED, 0));
        let gone = ChangeRefusal::Canceled(charge.id.clone());
        assert_eq!(ledger.capture("d", &capture(&charge, None)).unwrap_err(), gone);
        assert_eq!(ledger.cancel("e", &cancel(&charge)).unwrap_err(), gone);
        let refund = ledger.create_refund("r", &refund_request(&charge, None), Instant::now());
        assert_eq!(refund.unwrap_err(), RefundRefusal::NotRefundable(charge.id.clone()));
        assert_eq!((ledger.stats().cancels, ledger.stats().captures), (1, 0));

        let at_once = ledger.create_charge("f", &charge_request(500, "tok_visa")).expect("charged");
        assert_eq!(
            ledger.capture("g", &capture(&at_once, None)).unwrap_err(),
            ChangeRefusal::AlreadyCaptured(at_once.id)
        );
        let Declined(declined) = ledger.create_charge("h", &charge_request(500, "tok_chargeDeclined")).unwrap_err();
        let failed = ledger.charge(&declined).unwrap().clone();
        assert_eq!(ledger.cancel("i", &cancel(&failed)).unwrap_err(), ChangeRefusal::Failed(declined));
        let unknown = CancelRequest { charge: "ch_nope".into() };
        assert_eq!(ledger.cancel("j", &unknown).unwrap_err(), ChangeRefusal::NoSuchCharge("ch_nope".into()));
    }

    #[test]
    fn an_expired_authorization_can_be_cancelled_but_not_captured() {
        let (mut ledger, charge) = authorized(500);
        assert_eq!(ledger.expire_authorizations(), 1);
        assert_eq!(ledger.expire_authorizations(), 0, "expired once");
        let late = ledger.capture("c", &capture(&charge, None));
        assert_eq!(late.unwrap_err(), ChangeRefusal::AuthorizationExpired(charge.id.clone()));
        assert_eq!(ledger.cancel("d", &cancel(&charge)).expect("cancelled").status, CANCELED);
    }

    #[test]
    fn a_capture_and_a_cancel_make_their_events_under_their_own_keys() {
        let (mut ledger, first) = authorized(500);
        let made = events(&mut ledger);
        assert_eq!(made, [("charge.succeeded".into(), first.id.clone(), "auth".into(), as_shown(&first))]);
        assert_eq!(made[0].3["captured"], false);
        let captured = ledger.capture("c", &capture(&first, Some(200))).unwrap();
        assert_eq!(
            events(&mut ledger),
            [("charge.captured".into(), first.id.clone(), "c".into(), as_shown(&captured))]
        );
        let mut request = charge_request(500, "tok_visa");
        request.capture = false;
        let second = ledger.create_charge("auth2", &request).unwrap();
        ledger.take_events();
        let canceled = ledger.cancel("x", &cancel(&second)).unwrap();
        assert_eq!(
            events(&mut ledger),
            [("charge.canceled".into(), second.id.clone(), "x".into(), as_shown(&canceled))]
        );
        assert!(ledger.capture("y", &capture(&second, None)).is_err());
        assert!(ledger.take_events().is_empty(), "a refusal makes none");
    }

    #[test]
    fn a_key_charges_once_then_replays() {
        let (mut ledger, req) = (Ledger::default(), charge_request(500, "tok_visa"));
        let fp = req.fingerprint();
        assert_eq!(ledger.claim("k", &fp), Claim::Granted);
        assert_eq!(ledger.claim("k", &fp), Claim::InUse);
        assert_eq!(ledger.claim("k", "other"), Claim::Mismatch);
        let charge = ledger.create_charge("k", &req).expect("tok_visa charges");
        assert_eq!((charge.currency.as_str(), charge.id.len()), ("usd", 3 + 24));
        ledger.finish("k", answer());
        assert_eq!(ledger.claim("k", &fp), Claim::Replay(answer()));
        assert_eq!(ledger.charges_with_key("k").len(), 1);
        assert!(ledger.charge(&charge.id).is_some());
    }

    #[test]
    fn a_key_refunds_once_then_replays_and_is_never_a_charge_key() {
        let (mut ledger, charge) = charged(500, "tok_visa");
        let req = refund_request(&charge, Some(100));
        let fp = req.fingerprint();
        assert_eq!(ledger.claim("charge", &fp), Claim::Mismatch, "a charge's key is not a refund's");
        assert_eq!(ledger.claim("r", &fp), Claim::Granted);
        assert_eq!(ledger.claim("r", &fp), Claim::InUse);
        assert_eq!(ledger.claim("r", &refund_request(&charge, Some(101)).fingerprint()), Claim::Mismatch);
        let refund = ledger.create_refund("r", &req, Instant::now()).expect("refunded");
        assert_eq!(
            (refund.id.len(), refund.status, refund.currency.as_str()),
            (3 + 24, RefundStatus::Succeeded, "usd")
        );
        ledger.finish("r", answer());
        assert_eq!(ledger.claim("r", &fp), Claim::Replay(answer()));
        assert_eq!(ledger.refunds_with_key("r").len(), 1);
        assert!(ledger.refund(&refund.id).is_some());
        assert_eq!(refunded(&ledger, &charge), (100, false));
    }

    #[test]
    fn forgetting_keys_keeps_charges_and_refunds_and_spares_claimed_keys() {
        let (mut ledger, req) = (Ledger::default(), charge_request(500, "tok_visa"));
        let fp = req.fingerprint();
        assert_eq!(ledger.claim("k", &fp), Claim::Granted);
        ledger.forget_keys();
        assert_eq!(ledger.claim("k", &fp), Claim::InUse);
        let charge = ledger.create_charge("k", &req).expect("charged");
        ledger.finish("k", answer());
        let refund = refund_request(&charge, Some(5));
        assert_eq!(ledger.claim("r", &refund.fingerprint()), Claim::Granted);
        ledger.create_refund("r", &refund, Instant::now()).expect("refunded");
        ledger.finish("r", answer());
        ledger.forget_keys();
        assert_eq!(ledger.claim("k", &fp), Claim::Granted);
        assert_eq!(ledger.claim("r", &refund.fingerprint()), Claim::Granted);
        assert_eq!(ledger.charges_with_key("k").len(), 1);
        assert_eq!(ledger.refunds_with_key("r").len(), 1);
    }

    #[test]
    fn a_decline_keeps_a_failed_charge_that_cannot_be_refunded() {
        let mut ledger = Ledger::default();
        let Declined(id) = ledger.create_charge("k", &charge_request(1, "tok_chargeDeclined")).unwrap_err();
        let stats = ledger.stats();
        assert_eq!((stats.charges, stats.declined), (0, 1), "a failed charge is no charge made");
        let failed = ledger.charges_with_key("k");
        assert_eq!(failed.iter().map(|charge| &charge.id).collect::<Vec<_>>(), [&id]);
        assert_eq!(
            (failed[0].status, failed[0].failure_code, failed[0].failure_message),
            (FAILED, Some(DECLINE_CODE), Some(DECLINE_MESSAGE))
        );
        let refund = ledger.create_refund("r", &refund_request(&failed[0], None), Instant::now());
        assert_eq!(refund.unwrap_err(), RefundRefusal::NotRefundable(id));
        assert_eq!(ledger.stats().refunds, 0);
    }

    #[test]
    fn refunds_never_take_more_than_the_charge_has_left() {
        let (mut ledger, charge) = charged(500, "tok_visa");
        let now = Instant::now();
        ledger.create_refund("a", &refund_request(&charge, Some(200)), now).expect("200 of 500");
        let too_much = ledger.create_refund("b", &refund_request(&charge, Some(301)), now);
        assert_eq!(too_much.unwrap_err(), RefundRefusal::AmountTooLarge { amount: 301, left: 300 });
        assert_eq!(refunded(&ledger, &charge), (200, false));
        let rest = ledger.create_refund("c", &refund_request(&charge, None), now).expect("all that is left");
        assert_eq!(rest.amount, 300);
        assert_eq!(refunded(&ledger, &charge), (500, true));
        for amount in [Some(1), None] {
            let none_left = ledger.create_refund("d", &refund_request(&charge, amount), now);
            assert_eq!(none_left.unwrap_err(), RefundRefusal::AlreadyRefunded(charge.id.clone()));
        }
        let mut unknown = refund_request(&charge, Some(1));
        unknown.charge = "ch_nope".into();
        assert_eq!(
            ledger.create_refund("e", &unknown, now).unwrap_err(),
            RefundRefusal::NoSuchCharge("ch_nope".into())
        );
        let stats = ledger.stats();
        assert_eq!((stats.refunds, stats.refunded_amount), (2, 500));
        assert!(ledger.refunds_with_key("b").is_empty(), "a refusal makes nothing");
    }

    #[test]
    fn a_pending_refund_succeeds_when_its_time_has_come() {
        let (mut ledger, charge) = charged(500, "tok_refundPending");
        let made = Instant::now();
        let refund = ledger.create_refund("r", &refund_request(&charge, Some(500)), made).expect("refunded");
        assert_eq!(refund.status, RefundStatus::Pending);
        assert_eq!(refunded(&ledger, &charge), (500, true), "a pending refund takes its amount");
        assert_eq!(ledger.settle_due(made + REFUND_SETTLES_AFTER - Duration::from_millis(1)), 0);
        assert_eq!(ledger.refund(&refund.id).unwrap().status, RefundStatus::Pending);
        assert_eq!(ledger.settle_due(made + REFUND_SETTLES_AFTER), 1);
        let settled = ledger.refund(&refund.id).unwrap();
        assert_eq!((settled.status, settled.failure_reason), (RefundStatus::Succeeded, None));
        assert_eq!(refunded(&ledger, &charge), (500, true));
        assert_eq!(ledger.settle_due(made + 2 * REFUND_SETTLES_AFTER), 0, "settled once");
        assert_eq!((ledger.stats().refunds, ledger.stats().refunded_amount), (1, 500));
    }

    #[test]
    fn a_failed_refund_gives_its_amount_back() {
        let (mut ledger, charge) = charged(500, "tok_refundFails");
        let made = Instant::now();
        let refund = ledger.create_refund("r", &refund_request(&charge, None), made).expect("refunded");
        assert_eq!((refund.status, refund.amount), (RefundStatus::Pending, 500));
        let while_pending = ledger.create_refund("s", &refund_request(&charge, Some(1)), made);
        assert_eq!(while_pending.unwrap_err(), RefundRefusal::AlreadyRefunded(charge.id.clone()));

        assert_eq!(ledger.settle_due(made + REFUND_SETTLES_AFTER), 1);
        let failed = ledger.refund(&refund.id).unwrap();
        assert_eq!((failed.status, failed.failure_reason), (RefundStatus::Failed, Some(REFUND_FAILURE_REASON)));
        assert_eq!(refunded(&ledger, &charge), (0, false));
        assert_eq!((ledger.stats().refunds, ledger.stats().refunded_amount), (1, 0));
        ledger.create_refund("t", &refund_request(&charge, Some(500)), made).expect("all of it again");
    }

    #[test]
    fn pending_refunds_can_all_be_settled_at_once() {
        let (mut ledger, charge) = charged(500, "tok_refundPending");
        let now = Instant::now();
        for key in ["a", "b"] {
            ledger.create_refund(key, &refund_request(&charge, Some(100)), now).expect("refunded");
        }
        assert_eq!(ledger.settle_due(now), 0);
        assert_eq!(ledger.settle_all(), 2);
        assert_eq!(ledger.settle_all(), 0);
        assert!(ledger.refunds.iter().all(|refund| refund.status == RefundStatus::Succeeded));
    }

    /// A plan under which every authorization is changed on the gateway's own, within 100 ms.
    fn always_on_its_own() -> OwnChangePlan {
        serde_json::from_str::<super::super::own_changes::OwnChangeSpec>(r#"{"rate": 1.0, "within_ms": 100}"#)
            .unwrap()
            .into_plan()
            .unwrap()
    }

    #[test]
    fn an_authorization_is_changed_on_the_gateways_own_when_its_time_comes_under_a_key_of_its_own() {
        let (mut ledger, charge) = authorized(1000);
        ledger.take_events();
        let made = Instant::now();
        ledger.draw_own_change(&charge, made);
        assert_eq!(ledger.next_own_change(), None, "drawn under the plan of the moment: none");
        ledger.plan_own_changes(always_on_its_own());
        ledger.draw_own_change(&charge, made);
        let due = ledger.next_own_change().expect("drawn");
        assert!(due >= made && due <= made + Duration::from_millis(100), "{due:?}");
        if due > made {
            assert_eq!(ledger.make_own_changes_due(due - Duration::from_millis(1)), 0, "not before its time");
        }
        assert_eq!(ledger.make_own_changes_due(due), 1);
        assert_eq!((ledger.next_own_change(), ledger.make_own_changes_due(due)), (None, 0), "made once");

        let [own] = ledger.own_changes_made().to_vec().try_into().expect("one change");
        let now = ledger.charge(&charge.id).unwrap().clone();
        assert!(own.idempotency_key.starts_with("own_"), "none of the merchant's: {}", own.idempotency_key);
        assert_eq!((own.charge.as_str(), own.amount_captured), (charge.id.as_str(), now.amount_captured));
        let (kind, status, refusal) = match own.kind {
            "capture" => ("charge.captured", SUCCEEDED, ChangeRefusal::AlreadyCaptured(charge.id.clone())),
            _ => ("charge.canceled", CANCELED, ChangeRefusal::Canceled(charge.id.clone())),
        };
        assert_eq!(now.status, status);
        let made = events(&mut ledger);
        assert_eq!(made, [(kind.into(), charge.id.clone(), own.idempotency_key.clone(), as_shown(&now))]);
        let stats = ledger.stats();
        assert_eq!(stats.captures + stats.cancels, 1, "counted as any capture or cancel");
        // The merchant's change comes too late, and is refused.
        assert_eq!(ledger.cancel("ours", &cancel(&charge)).unwrap_err(), refusal);
    }

    #[test]
    fn a_change_the_gateway_drew_is_not_made_once_the_merchant_changed_the_authorization() {
        let (mut ledger, charge) = authorized(1000);
        ledger.plan_own_changes(always_on_its_own());
        let made = Instant::now();
        ledger.draw_own_change(&charge, made);
        ledger.capture("ours", &capture(&charge, None)).expect("captured by the merchant first");
        assert_eq!(ledger.make_own_changes_due(made + Duration::from_millis(100)), 0);
        assert!(ledger.own_changes_made().is_empty());
        assert_eq!(ledger.stats().captures + ledger.stats().cancels, 1);
        // A charge made at once is never changed on the gateway's own.
        let at_once = ledger.create_charge("now", &charge_request(500, "tok_visa")).unwrap();
        ledger.draw_own_change(&at_once, made);
        assert_eq!(ledger.next_own_change(), None);
    }

    /// The events made so far, as sent: (type, the object's id, the request's key, the object).
    fn events(ledger: &mut Ledger) -> Vec<(String, String, String, serde_json::Value)> {
        let events = ledger.take_events();
        let ids: std::collections::HashSet<_> = events.iter().map(|event| event.id.clone()).collect();
        assert_eq!(ids.len(), events.len(), "every event has an id of its own");
        events
            .into_iter()
            .map(|event| {
                let body: serde_json::Value = serde_json::from_slice(&event.body).unwrap();
                assert_eq!((&body["id"], &body["object"]), (&serde_json::json!(event.id), &serde_json::json!("event")));
                assert_eq!(body["type"], serde_json::to_value(event.kind).unwrap());
                assert!(event.id.starts_with("evt_") && event.id.len() == 4 + 24, "{}", event.id);
                let object = body["data"]["object"].clone();
                let text = |value: &serde_json::Value| value.as_str().unwrap().to_owned();
                (text(&body["type"]), text(&object["id"]), text(&body["request"]["idempotency_key"]), object)
            })
            .collect()
    }

    fn as_shown(object: &impl Serialize) -> serde_json::Value {
        serde_json::to_value(object).unwrap()
    }

    #[test]
    fn a_ledger_of_a_gateway_without_events_makes_none() {
        let mut ledger = Ledger::default();
        ledger.create_charge("k", &charge_request(500, "tok_visa")).unwrap();
        ledger.create_charge("d", &charge_request(500, "tok_chargeDeclined")).unwrap_err();
        assert!(ledger.take_events().is_empty());
    }

    #[test]
    fn every_charge_makes_its_event_with_the_charge_as_shown_then() {
        let (mut ledger, charge) = charged(500, "tok_visa");
        let made = events(&mut ledger);
        assert_eq!(made, [("charge.succeeded".into(), charge.id.clone(), "charge".into(), as_shown(&charge))]);
        assert!(ledger.take_events().is_empty(), "taken once");

        let Declined(id) = ledger.create_charge("d", &charge_request(7, "tok_chargeDeclined")).unwrap_err();
        let failed = ledger.charge(&id).unwrap().clone();
        assert_eq!(events(&mut ledger), [("charge.failed".into(), id, "d".into(), as_shown(&failed))]);
        assert_eq!(as_shown(&failed)["status"], "failed");
    }

    #[test]
    fn a_refund_makes_its_event_when_it_ends_and_a_claim_or_a_refusal_makes_none() {
        let (mut ledger, charge) = charged(500, "tok_visa");
        ledger.take_events();
        assert_eq!(ledger.claim("r", "fingerprint"), Claim::Granted);
        let refusal = ledger.create_refund("x", &refund_request(&charge, Some(501)), Instant::now());
        assert!(refusal.is_err());
        assert!(ledger.take_events().is_empty());

        let refund = ledger.create_refund("r", &refund_request(&charge, Some(100)), Instant::now()).unwrap();
        let made = events(&mut ledger);
        assert_eq!(made, [("refund.succeeded".into(), refund.id.clone(), "r".into(), as_shown(&refund))]);
        assert_eq!(made[0].3["charge"], serde_json::json!(charge.id), "the refund, not its charge");
    }

    #[test]
    fn a_pending_refund_makes_its_event_when_it_settles_with_the_settled_refund() {
        for (source, kind, status) in
            [("tok_refundPending", "refund.succeeded", "succeeded"), ("tok_refundFails", "refund.failed", "failed")]
        {
            let (mut ledger, charge) = charged(500, source);
            ledger.take_events();
            let made = Instant::now();
            let refund = ledger.create_refund("r", &refund_request(&charge, None), made).unwrap();
            assert!(ledger.take_events().is_empty(), "no event while it is pending");
            assert_eq!(ledger.next_settlement(), Some(made + REFUND_SETTLES_AFTER));

            ledger.settle_due(made + REFUND_SETTLES_AFTER);
            let settled = ledger.refund(&refund.id).unwrap().clone();
            let sent = events(&mut ledger);
            assert_eq!(sent, [(kind.into(), refund.id.clone(), "r".into(), as_shown(&settled))], "{source}");
            assert_eq!(sent[0].3["status"], status);
            assert_eq!(ledger.next_settlement(), None);
        }
    }

    #[test]
    fn refunds_settled_at_once_make_their_events_in_the_order_made() {
        let (mut ledger, charge) = charged(500, "tok_refundFails");
        ledger.take_events();
        let now = Instant::now();
        let first = ledger.create_refund("a", &refund_request(&charge, Some(100)), now).unwrap();
        let second = ledger.create_refund("b", &refund_request(&charge, Some(200)), now).unwrap();
        assert_eq!(ledger.settle_all(), 2);
        let order: Vec<_> = events(&mut ledger).into_iter().map(|(kind, id, key, _)| (kind, id, key)).collect();
        assert_eq!(
            order,
            [("refund.failed".into(), first.id, "a".into()), ("refund.failed".into(), second.id, "b".into())]
        );
    }
}
