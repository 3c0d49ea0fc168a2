//! The refunds: two racing for one payment, each decided and reserved by the money rule in one
//! statement ([`payments_protocol::refund_fits`]), made at the gateway, which answers it succeeded
//! at once or pending, and recorded. The gateway settles a pending refund later, succeeded or
//! failed (its money given back), and sends an event about it; the service settles it forward
//! only, out of `pending`, by that event or by the settler's look-up, whichever comes first, and
//! reads any other event about it against what it recorded ([`payments_protocol::read_refund_event`]).

use payments_protocol::{Reading, RefundStage, Refusal};

use super::state::{Action, Event, RefundPc, State};
use super::{AMOUNT, Protocol, REFUNDS_ASK, Rules};

/// The gateway's id of every refund, as the model names it: each refund is read against its own.
const REFUND_ID: &str = "re";

/// The refund the gateway may leave pending (refund 2, of 2); it answers the other succeeded at
/// once. One refund walks every path of a pending one (its event, the settler, a failure that
/// gives the money back); the other's would only repeat them, at ten times the states.
pub const LEFT_PENDING: usize = 1;

/// A refund's amount, once it fits.
fn amount(pc: RefundPc) -> Option<u8> {
    match pc {
        RefundPc::Checked(amount)
        | RefundPc::Reserved(amount)
        | RefundPc::Answered(amount, _)
        | RefundPc::Recorded(amount, _) => Some(amount),
        RefundPc::Idle | RefundPc::Refused => None,
    }
}

impl Protocol {
    /// What the refunds, the gateway's refunds and the settler may do.
    pub(crate) fn refund_actions(&self, state: &State, actions: &mut Vec<Action>) {
        // A refund names a payment its client was answered: its key finished (or reaped since).
        let answered = state.key.as_ref().is_none_or(|key| key.point == super::state::Point::Finished);
        let charged = answered && state.payment.as_ref().is_some_and(|payment| payment.charge.is_some());
        for (r, refund) in state.refunds.iter().enumerate() {
            match refund.pc {
                RefundPc::Idle if charged => actions.push(Action::RefundStart(r)),
                RefundPc::Checked(_) => actions.push(Action::RefundReserve(r)),
                RefundPc::Reserved(_) => {
                    actions.push(Action::RefundCall(r, RefundStage::Succeeded));
                    if r == LEFT_PENDING {
                        actions.push(Action::RefundCall(r, RefundStage::Pending));
                    }
                }
                RefundPc::Answered(..) => actions.push(Action::RefundRecord(r)),
                RefundPc::Recorded(_, RefundStage::Pending)
                    if refund.at_gateway.is_some_and(|stage| stage != RefundStage::Pending) =>
                {
                    actions.push(Action::SettlerLooksUp(r))
                }
                _ => {}
            }
            if refund.at_gateway == Some(RefundStage::Pending) {
                actions.push(Action::GatewaySettles(r, RefundStage::Succeeded));
                actions.push(Action::GatewaySettles(r, RefundStage::Failed));
            }
        }
    }
}

impl State {
    /// A refund's step, the gateway's settling one, or the settler's look-up.
    pub(crate) fn refund_step(&mut self, action: Action, events: bool, rules: &Rules) -> Option<()> {
        match action {
            Action::RefundStart(r) => {
                let payment = self.payment.as_mut()?;
                let refundable = i64::from(AMOUNT) - i64::from(payment.refunded) - i64::from(payment.reserved);
                let succeeded = payment.charge.is_some_and(|charge| self.charges[usize::from(charge)].succeeded);
                let fits = payments_protocol::refund_fits(succeeded, refundable, Some(i64::from(REFUNDS_ASK[r])));
                self.refunds[r].pc = match (fits, rules.refund_in_one_statement) {
                    (Ok(amount), true) => {
                        payment.reserved += amount as u8;
                        RefundPc::Reserved(amount as u8)
                    }
                    (Ok(amount), false) => RefundPc::Checked(amount as u8),
                    (Err(refusal), _) => {
                        if refusal != Refusal::PaymentNotRefundable {
                            self.seen.refund_refused = true;
                        }
                        RefundPc::Refused
                    }
                };
            }
            Action::RefundReserve(r) => {
                let RefundPc::Checked(amount) = self.refunds[r].pc else { return None };
                self.payment.as_mut()?.reserved += amount;
                self.refunds[r].pc = RefundPc::Reserved(amount);
            }
            Action::RefundCall(r, stage) => {
                let RefundPc::Reserved(amount) = self.refunds[r].pc else { return None };
                let charge = self.payment.as_ref()?.charge?;
                self.charges[usize::from(charge)].refunded += amount;
                self.refunds[r] =
                    super::state::Refund { pc: RefundPc::Answered(amount, stage), at_gateway: Some(stage) };
                if events && stage != RefundStage::Pending {
                    self.in_flight.push(Event::Refund(r, stage));
                    self.in_flight.sort();
                }
            }
            Action::RefundRecord(r) => {
                let RefundPc::Answered(amount, stage) = self.refunds[r].pc else { return None };
                self.refunds[r].pc = RefundPc::Recorded(amount, RefundStage::Pending);
                if stage != RefundStage::Pending {
                    self.settle(r, stage);
                }
            }
            Action::GatewaySettles(r, stage) => {
                let amount = amount(self.refunds[r].pc)?;
                if stage == RefundStage::Failed {
                    let charge = self.payment.as_ref()?.charge?;
                    self.charges[usize::from(charge)].refunded -= amount;
                }
                self.refunds[r].at_gateway = Some(stage);
                if events {
                    self.in_flight.push(Event::Refund(r, stage));
                    self.in_flight.sort();
                }
            }
            Action::SettlerLooksUp(r) => {
                let stage = self.refunds[r].at_gateway?;
                self.settle(r, stage);
            }
            _ => return None,
        }
        Some(())
    }

    /// A refund event, new (or applied again): a refund recorded `pending` is settled forward by
    /// it; one recorded settled reads it against what was recorded (or, with the broken rule,
    /// is settled again); one whose answer is not recorded yet is only woken.
    pub(crate) fn apply_refund_event(&mut self, r: usize, reported: RefundStage, rules: &Rules) {
        let RefundPc::Recorded(_, recorded) = self.refunds[r].pc else { return };
        if recorded == RefundStage::Pending || !rules.settles_pending_only {
            self.seen.settled_by_event |= recorded == RefundStage::Pending;
            self.settle(r, reported);
            return;
        }
        let read = payments_protocol::read_refund_event(recorded, Some(REFUND_ID), reported, REFUND_ID);
        if read == Reading::Disagrees {
            self.seen.disagreed = true;
        }
    }

    /// The settlement's statement: refund `r` recorded at `stage`, its amount moved out of what is
    /// reserved, and into what is refunded if it succeeded. The service's statement moves a
    /// refund only out of `pending`; its callers here keep to that, but for the broken rule.
    fn settle(&mut self, r: usize, stage: RefundStage) {
        let Some(amount) = amount(self.refunds[r].pc) else { return };
        self.refunds[r].pc = RefundPc::Recorded(amount, stage);
        if let Some(payment) = self.payment.as_mut() {
            // (A payment made again, under a reaped key in a broken variant, reserved nothing.)
            payment.reserved = payment.reserved.saturating_sub(amount);
            if stage == RefundStage::Succeeded {
                payment.refunded += amount;
            }
        }
    }
}
