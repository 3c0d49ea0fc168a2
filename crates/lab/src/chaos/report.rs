//! What a chaos run prints: what it did, then each invariant.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Duration;

use payments_client::KeySeen;

use super::Disturbed;
use super::check::{GatewayEvents, Invariant, Outside, Stored, inbox_outcomes};
use super::gateway::{EventStorm, GatewayStats};
use super::run::{KeyRun, Request};
use crate::relay::Relayed;

/// The row of the Citus workers crashed, shown only when one was.
const NODE_CRASHES: &str = "Citus workers crashed";

/// What the run did.
#[derive(Debug)]
pub struct Did {
    /// Payments' keys.
    payments: usize,
    /// Refunds' keys.
    refunds: usize,
    /// Payments refunded, and those of them with more than one refund at once.
    refunded: usize,
    raced: usize,
    /// What the refunds' keys made: refunds by status now, then refusals by problem type.
    refund_outcomes: Vec<(String, u64)>,
    /// Captures' and cancels' keys, and the authorizations they raced for.
    changes: usize,
    authorizations: usize,
    /// How the authorizations ended: captured, cancelled, lapsed, still open.
    authorization_outcomes: Vec<(&'static str, u64)>,
    /// The run's authorizations the gateway changed on its own: captured whole, captured in part,
    /// cancelled; and those of them it changed before the service recorded the authorization.
    own_changes: [u64; 3],
    changed_before_recorded: u64,
    /// The load's attempts.
    attempts: u64,
    /// The attempts of the final round, which asks every key once more.
    final_attempts: u64,
    abandoned: usize,
    gave_up: usize,
    crash_points: usize,
    aborted: u64,
    kills: BTreeMap<String, u64>,
    pauses: BTreeMap<String, u64>,
    /// On Citus: worker nodes crashed and started again, by node.
    node_crashes: BTreeMap<String, u64>,
    forgotten: u64,
    charge_requests: u64,
    refund_requests: u64,
    /// Capture and cancel requests.
    change_requests: u64,
    faults: u64,
    /// Answers by status, the final replays' included; `None` for attempts that got none.
    answers: BTreeMap<Option<u16>, u64>,
    load: Duration,
    settle: Duration,
}

/// What the gateway's events went through, and what became of them.
#[derive(Debug)]
pub struct EventsDid {
    /// How the gateway misdelivered them during the storm.
    storm: EventStorm,
    /// Why they were not checked, if they were not (then none of the counts is known).
    not_checked: Option<&'static str>,
    /// Events made during the run, those sent, those of them sent twice, and their `POST`s
    /// (every copy's attempts).
    made: u64,
    sent: usize,
    twice: usize,
    deliveries: u64,
    /// Kills, those while the gateway had events on their way, and those events, summed.
    kills: u64,
    kills_amid_events: u64,
    events_at_kills: u64,
    /// What the relay in front of the run's own servers saw of them.
    relayed: Option<Relayed>,
    /// The inbox's rows about the run's keys, by outcome.
    inbox: BTreeMap<String, u64>,
}

pub struct Report {
    pub did: Did,
    pub events: EventsDid,
    pub verdicts: Vec<Invariant>,
}

impl Did {
    #[expect(clippy::too_many_arguments, reason = "each is a different source of the report")]
    pub(super) fn of(
        runs: &[KeyRun],
        stored: &Stored,
        outside: &Outside,
        (attempts, final_attempts): (u64, u64),
        disturbed: &Disturbed,
        before: GatewayStats,
        after: GatewayStats,
        load: Duration,
        settle: Duration,
    ) -> Did {
        let mut answers = BTreeMap::new();
        for answer in runs.iter().flat_map(|run| &run.answers) {
            *answers.entry(Some(answer.status.as_u16())).or_default() += 1;
        }
        let answered: u64 = answers.values().sum();
        answers.insert(None, (attempts + final_attempts).saturating_sub(answered));
        let refunds: Vec<&KeyRun> = runs.iter().filter(|run| run.request.is_refund()).collect();
        let changes = runs.iter().filter(|run| run.request.changes().is_some()).count();
        let ended = |status: &str, reason: Option<&str>| {
            let ended = stored.authorizations().filter(|payment| payment.status == status);
            ended
                .filter(|payment| reason.is_none_or(|reason| payment.cancellation_reason.as_deref() == Some(reason)))
                .count() as u64
        };
        let lapsed = ended("canceled", Some("expired"));
        let authorization_outcomes = vec![
            ("captured", ended("succeeded", None)),
            ("cancelled", ended("canceled", None) - lapsed),
            ("lapsed", lapsed),
            ("still open", ended("requires_capture", None)),
        ];
        let (mut own_changes, mut changed_before_recorded) = ([0; 3], 0);
        for payment in stored.authorizations() {
            let Some(own) = payment.charge_id.as_ref().and_then(|id| outside.own_changes.get(id)) else { continue };
            let kind = match own.kind.as_str() {
                "cancel" => 2,
                _ if own.amount_captured < payment.amount => 1,
                _ => 0,
            };
            own_changes[kind] += 1;
            // A payment changes through a capture, a cancel or the lapse only once it recorded
            // its authorization: with none, the gateway's change came before.
            changed_before_recorded += u64::from(stored.changes.get(&payment.id).is_none_or(Vec::is_empty));
        }
        let mut per_payment: BTreeMap<&str, usize> = BTreeMap::new();
        for run in &refunds {
            if let Request::Refund(refund) = &run.request {
                *per_payment.entry(&refund.payment).or_default() += 1;
            }
        }
        let mut refund_outcomes: Vec<(String, u64)> = ["succeeded", "pending", "failed"]
            .into_iter()
            .map(|status| {
                (status.to_owned(), stored.all_refunds().filter(|refund| refund.status == status).count() as u64)
            })
            .collect();
        // A key that made no refund: its refusal, as its answers name it.
        let mut refusals: BTreeMap<String, u64> = BTreeMap::new();
        for run in refunds.iter().filter(|run| stored.refunds.get(&run.key).is_none_or(Vec::is_empty)) {
            let ending = run.answers.iter().find(|answer| answer.is_definitive(KeySeen::No));
            let problem = ending.and_then(|answer| answer.problem.clone()).unwrap_or_else(|| "no answer".into());
            *refusals.entry(format!("refused {problem}")).or_default() += 1;
        }
        refund_outcomes.extend(refusals);
        Did {
            payments: runs.len() - refunds.len() - changes,
            refunds: refunds.len(),
            changes,
            authorizations: stored.authorizations().count(),
            authorization_outcomes,
            own_changes,
            changed_before_recorded,
            refunded: per_payment.len(),
            raced: per_payment.values().filter(|refunds| **refunds > 1).count(),
            refund_outcomes,
            attempts,
            final_attempts,
            abandoned: runs.iter().filter(|run| run.abandoned).count(),
            gave_up: runs.iter().filter(|run| run.gave_up && !run.abandoned).count(),
            crash_points: runs.iter().filter(|run| run.crash_point.is_some()).count(),
            aborted: disturbed.aborted.load(Ordering::Relaxed),
            kills: disturbed.kills.lock().unwrap_or_else(PoisonError::into_inner).clone(),
            pauses: disturbed.pauses.lock().unwrap_or_else(PoisonError::into_inner).clone(),
            node_crashes: disturbed.node_crashes.lock().unwrap_or_else(PoisonError::into_inner).clone(),
            forgotten: disturbed.forgotten.load(Ordering::Relaxed),
            charge_requests: after.requests - before.requests,
            refund_requests: after.refund_requests - before.refund_requests,
            change_requests: (after.capture_requests + after.cancel_requests)
                - (before.capture_requests + before.cancel_requests),
            faults: after.faults - before.faults,
            answers,
            load,
            settle,
        }
    }
}

impl EventsDid {
    pub(super) fn of(
        storm: EventStorm,
        events: &GatewayEvents,
        disturbed: &Disturbed,
        relayed: Option<Relayed>,
        stored: &Stored,
    ) -> EventsDid {
        let inbox = inbox_outcomes(stored).into_iter().map(|(outcome, n)| (outcome.to_owned(), n)).collect();
        let (made, sent, not_checked) = match events {
            GatewayEvents::Sent { made, sent } => (*made, sent.as_slice(), None),
            GatewayEvents::NotChecked(why) => (0, &[][..], Some(*why)),
        };
        let kills = disturbed.kills.lock().unwrap_or_else(PoisonError::into_inner).values().sum();
        EventsDid {
            storm,
            not_checked,
            made,
            sent: sent.len(),
            twice: sent.iter().filter(|event| event.copies > 1).count(),
            deliveries: sent.iter().map(|event| event.attempts).sum(),
            kills,
            kills_amid_events: disturbed.kills_amid_events.load(Ordering::Relaxed),
            events_at_kills: disturbed.events_at_kills.load(Ordering::Relaxed),
            relayed,
            inbox,
        }
    }

    /// The table's section: what was sent, and how; the kills among them; how the deliveries were
    /// answered; what the inbox holds.
    fn section(&self) -> String {
        let mut out = String::from("the gateway's events\n");
        let mut row = |what: &str, count: String, detail: String| {
            let _ = writeln!(out, "{}", format!("  {what:<26} {count:>8}   {detail}").trim_end());
        };
        if let Some(why) = self.not_checked {
            row("events sent", String::new(), format!("not checked: {why}"));
            return out;
        }
        let storm = &self.storm;
        let mut sent = format!("of {} made; {} of them twice", self.made, self.twice);
        if let Some(relayed) = &self.relayed {
            let _ = write!(sent, ", {} to both servers", relayed.on_every_server);
        }
        let _ = write!(sent, " (storm: {:.0} % twice, {} ms late", storm.duplicate_rate * 100.0, storm.delay_ms);
        sent += if storm.shuffle { ", shuffled)" } else { ")" };
        row("events sent", self.sent.to_string(), sent);
        // None in a run that kills nothing.
        if self.kills > 0 {
            let average = self.events_at_kills as f64 / self.kills_amid_events.max(1) as f64;
            row(
                "kills amid events",
                self.kills_amid_events.to_string(),
                format!("of {} kills, {average:.1} events on their way at each", self.kills),
            );
        }
        let answers = self.relayed.as_ref().map(|relayed| times(&relayed.answers)).unwrap_or_default();
        row("deliveries (POSTs)", self.deliveries.to_string(), answers);
        if let Some(relayed) = &self.relayed {
            let passed_over: BTreeMap<String, u64> =
                relayed.passed_over.iter().map(|(why, n)| ((*why).to_owned(), *n)).collect();
            row("relay passed a server over", passed_over.values().sum::<u64>().to_string(), times(&passed_over));
        }
        row("inbox rows", self.inbox.values().sum::<u64>().to_string(), times(&self.inbox));
        out
    }
}

/// `applied ×3 · nudged ×1`: the counts that are not zero.
fn times(counts: &BTreeMap<String, u64>) -> String {
    let counts: Vec<String> = counts.iter().filter(|(_, n)| **n > 0).map(|(what, n)| format!("{what} ×{n}")).collect();
    counts.join(" · ")
}

impl Report {
    pub fn held(&self) -> bool {
        self.verdicts.iter().all(|verdict| verdict.held)
    }

    pub fn table(&self) -> String {
        let did = &self.did;
        let total = |counts: &BTreeMap<String, u64>| counts.values().sum::<u64>().to_string();
        let by_process = |counts: &BTreeMap<String, u64>| {
            counts.iter().map(|(name, n)| format!("{name} {n}")).collect::<Vec<_>>().join(", ")
        };
        let answers: Vec<String> = did
            .answers
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(status, n)| match status {
                Some(status) => format!("{status} ×{n}"),
                None => format!("none ×{n}"),
            })
            .collect();
        let outcomes: Vec<String> =
            did.refund_outcomes.iter().filter(|(_, n)| *n > 0).map(|(outcome, n)| format!("{outcome} ×{n}")).collect();
        let ended: Vec<String> = did
            .authorization_outcomes
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(outcome, n)| format!("{outcome} ×{n}"))
            .collect();
        let keys = (did.payments + did.refunds + did.changes) as u64;
        let rows = [
            ("payments (keys)", did.payments.to_string(), String::new()),
            (
                "refunds (keys)",
                did.refunds.to_string(),
                format!("of {} payments, {} of them by 2 or 3 refunds at once", did.refunded, did.raced),
            ),
            ("refund outcomes", String::new(), outcomes.join(" · ")),
            (
                "captures and cancels (keys)",
                did.changes.to_string(),
                format!("racing for {} authorizations, and the lapse: {}", did.authorizations, ended.join(" · ")),
            ),
            (
                "gateway changed on its own",
                did.own_changes.iter().sum::<u64>().to_string(),
                format!(
                    "captured ×{} ({} in part) · cancelled ×{}; {} before the service recorded the authorization",
                    did.own_changes[0] + did.own_changes[1],
                    did.own_changes[1],
                    did.own_changes[2],
                    did.changed_before_recorded
                ),
            ),
            ("attempts", did.attempts.to_string(), format!("{} retries", did.attempts.saturating_sub(keys))),
            ("abandoned after one try", did.abandoned.to_string(), "left to the workers".into()),
            ("clients that gave up", did.gave_up.to_string(), "their keys asked again at the end".into()),
            ("crash points sent", did.crash_points.to_string(), format!("{} processes aborted at one", did.aborted)),
            ("kills (SIGKILL)", total(&did.kills), by_process(&did.kills)),
            ("pauses past the lease", total(&did.pauses), by_process(&did.pauses)),
            (NODE_CRASHES, total(&did.node_crashes), by_process(&did.node_crashes)),
            (
                "gateway faults",
                did.faults.to_string(),
                format!(
                    "of {} charge, {} refund and {} capture or cancel requests",
                    did.charge_requests, did.refund_requests, did.change_requests
                ),
            ),
            ("gateway forgot its keys", did.forgotten.to_string(), "times".into()),
            ("final round", did.final_attempts.to_string(), "attempts asking every key once more".into()),
            ("answers", String::new(), answers.join(" · ")),
            (
                "load, settling",
                format!("{:.1} s", did.load.as_secs_f64()),
                format!("{:.1} s", did.settle.as_secs_f64()),
            ),
        ];
        let mut out = String::from("what it did\n");
        // A world on one PostgreSQL has no node to crash: no row for it.
        let rows = rows.into_iter().filter(|(what, _, _)| *what != NODE_CRASHES || !did.node_crashes.is_empty());
        for (what, count, detail) in rows {
            let _ = writeln!(out, "{}", format!("  {what:<26} {count:>8}   {detail}").trim_end());
        }
        let _ = write!(out, "\n{}", self.events.section());
        out.push_str("\ninvariants\n");
        for verdict in &self.verdicts {
            let held = if verdict.held { "held  " } else { "BROKEN" };
            let _ = writeln!(out, "  {held} {:<66} {}", verdict.name, verdict.detail);
        }
        let _ = write!(out, "\n{}", if self.held() { "every invariant held" } else { "AN INVARIANT IS BROKEN" });
        out
    }
}
