//! The model's steps in words: what each action does, and where a path leaves the system.

use std::fmt::Write;

use stateright::Path;

use payments_protocol::RefundStage;

use super::state::{Action, Answer, Event, Gateway, Pc, Point, RefundPc, State};
use super::{Protocol, REFUNDS_ASK};

/// Who driver `d` of `drivers` is: one of the client's attempts, or the completer (the last).
fn who(drivers: usize, d: usize) -> String {
    match d + 1 == drivers {
        true => "the completer".to_string(),
        false => format!("attempt {}", d + 1),
    }
}

impl Protocol {
    /// An action, in words.
    pub fn describe(&self, action: &Action) -> String {
        let who = |d: &usize| who(self.completer() + 1, *d);
        let refund = |r: &usize| format!("refund {} (of {})", r + 1, REFUNDS_ASK[*r]);
        match action {
            Action::Claim(d) => format!("{} claims the key", who(d)),
            Action::TakeOver => "the completer takes the key over".to_string(),
            Action::Start(d) => format!("{} commits `started`", who(d)),
            Action::LookUp(d) => format!("{} looks the downstream key up at the gateway", who(d)),
            Action::Charge(d, gateway) => format!(
                "{} asks the gateway to charge: {}",
                who(d),
                match gateway {
                    Gateway::Answers => "it charges (or answers what it remembers)",
                    Gateway::Declines => "it declines (or answers what it remembers)",
                    Gateway::FailsBefore => "it fails before charging",
                    Gateway::FailsAfter => "it charges, then fails or times out",
                }
            ),
            Action::Record(d) => {
                format!("{} commits `charge_created` (with `finished`, answering, if it made the payment)", who(d))
            }
            Action::Finish(d) => format!("{} commits `finished` and answers", who(d)),
            Action::Release(d) => format!(
                "{} lets the key go where it stands and answers 503: the outcome unknown, or its lease over",
                who(d)
            ),
            Action::Crash(d) => format!("{}'s process dies", who(d)),
            Action::Pause(d) => format!("{}'s process freezes", who(d)),
            Action::PauseInCall(d) => {
                format!("{}'s process freezes with its charge request on its way, after its lease check", who(d))
            }
            Action::Wake(d) => format!("{}'s process thaws", who(d)),
            Action::LeaseLapses => "the frozen or dead holder's lease runs out".to_string(),
            Action::Forget => "the gateway forgets its idempotency keys".to_string(),
            Action::Deliver(event) => format!("{} reaches the service", about(event)),
            Action::SendAgain(event) => format!("the gateway sends {} again", about(event)),
            Action::Reap => "the reaper deletes the finished key's row".to_string(),
            Action::RefundStart(r) => format!("{} commits `started`: the money rule", refund(r)),
            Action::RefundReserve(r) => format!("{} reserves its amount", refund(r)),
            Action::RefundCall(r, RefundStage::Pending) => {
                format!("{} is made at the gateway, which answers pending", refund(r))
            }
            Action::RefundCall(r, _) => format!("{} is made at the gateway, which answers succeeded", refund(r)),
            Action::RefundRecord(r) => format!("{} records the gateway's answer and finishes", refund(r)),
            Action::GatewaySettles(r, stage) => format!("the gateway settles {}: {}", refund(r), stage_name(*stage)),
            Action::SettlerLooksUp(r) => {
                format!("the settler looks {} up and settles it as the gateway has it", refund(r))
            }
        }
    }

    /// A path, one numbered step per line, each with where it leaves the system.
    pub fn explain(&self, path: &Path<State, Action>) -> String {
        let mut out = String::new();
        let steps = path.clone().into_vec();
        let _ = writeln!(out, "    start: {}", summary(&steps[0].0));
        for (n, (_, action)) in steps.iter().enumerate() {
            let Some(action) = action else { continue };
            let _ = writeln!(out, "{:>3}. {}", n + 1, self.describe(action));
            let _ = writeln!(out, "       {}", summary(&steps[n + 1].0));
        }
        out
    }
}

/// Where the system stands, on one line.
pub fn summary(state: &State) -> String {
    let key = match &state.key {
        None if state.payment.is_some() => "reaped".to_string(),
        None => "none".to_string(),
        Some(key) => {
            let point = match key.point {
                Point::Started => "started",
                Point::ChargeCreated => "charge_created",
                Point::Finished => "finished",
            };
            let mut key_text = point.to_string();
            if key.generation > 0 {
                let _ = write!(key_text, " (made again: row {})", key.generation);
            }
            match (key.token, key.lease_over) {
                (Some(token), false) => {
                    let _ = write!(key_text, ", locked by {token}");
                }
                (Some(token), true) => {
                    let _ = write!(key_text, ", locked by {token} (lease over)");
                }
                (None, _) => {}
            }
            if key.flagged {
                key_text.push_str(", flagged");
            }
            key_text
        }
    };
    let payment = match &state.payment {
        None => "-".to_string(),
        Some(payment) => {
            let mut text = match payment.charge {
                Some(charge) => format!("charge #{charge}"),
                None => "no charge yet".to_string(),
            };
            if payment.refunded + payment.reserved > 0 {
                let _ = write!(text, ", refunded {} + reserved {}", payment.refunded, payment.reserved);
            }
            text
        }
    };
    let charges = match state.charges.is_empty() {
        true => "none".to_string(),
        false => state
            .charges
            .iter()
            .enumerate()
            .map(|(n, charge)| {
                let outcome = if charge.succeeded { "succeeded" } else { "declined" };
                match charge.refunded {
                    0 => format!("#{n} {outcome}"),
                    refunded => format!("#{n} {outcome}, refunded {refunded}"),
                }
            })
            .collect::<Vec<_>>()
            .join(", "),
    };
    let told = match state.answers.is_empty() {
        true => "nothing".to_string(),
        false => state.answers.iter().map(|answer| told(*answer)).collect::<Vec<_>>().join(", "),
    };
    let mut line = format!("key: {key} | payment: {payment} | gateway charges: {charges} | client told: {told}");
    let running: Vec<_> = state
        .drivers
        .iter()
        .enumerate()
        .filter(|(_, driver)| !matches!(driver.pc, Pc::Idle | Pc::Done | Pc::Dead) || driver.paused)
        .map(|(d, driver)| {
            let frozen = if driver.paused { ", frozen" } else { "" };
            format!("{} at {:?}{frozen}", who(state.drivers.len(), d), driver.pc)
        })
        .collect();
    if !running.is_empty() {
        let _ = write!(line, " | drivers: {}", running.join(", "));
    }
    if state.refunds.iter().any(|refund| refund.pc != RefundPc::Idle) {
        let refunds: Vec<String> = state.refunds.iter().map(refund_text).collect();
        let _ = write!(line, " | refunds: {}", refunds.join("; "));
    }
    line
}

/// What an event is about.
fn about(event: &Event) -> String {
    match event {
        Event::Charge(charge) => format!("the event about charge #{charge}"),
        Event::Refund(r, stage) => format!("the event about refund {}, {}", r + 1, stage_name(*stage)),
    }
}

fn stage_name(stage: RefundStage) -> &'static str {
    match stage {
        RefundStage::Pending => "pending",
        RefundStage::Succeeded => "succeeded",
        RefundStage::Failed => "failed",
    }
}

/// A refund, on the summary's line.
fn refund_text(refund: &super::state::Refund) -> String {
    let at_gateway = |text: String| match refund.at_gateway {
        Some(stage) => format!("{text} (gateway: {})", stage_name(stage)),
        None => text,
    };
    match refund.pc {
        RefundPc::Idle => "not asked".to_string(),
        RefundPc::Checked(amount) => format!("{amount} fits"),
        RefundPc::Reserved(amount) => format!("{amount} reserved"),
        RefundPc::Answered(amount, stage) => at_gateway(format!("{amount} answered {}", stage_name(stage))),
        RefundPc::Recorded(amount, stage) => at_gateway(format!("{amount} recorded {}", stage_name(stage))),
        RefundPc::Refused => "refused".to_string(),
    }
}

fn told(answer: Answer) -> String {
    match answer {
        Answer::Payment(charge) => format!("payment with #{charge}"),
        Answer::InFlight => "409".to_string(),
        Answer::Unknown => "503".to_string(),
        Answer::Nothing => "no answer".to_string(),
        Answer::Expired => "410".to_string(),
    }
}
