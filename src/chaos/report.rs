//! What a chaos run prints: what it did, then each invariant.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::check::Invariant;
use super::load::KeyRun;
use super::{Disturbed, GatewayStats};

/// What the run did.
#[derive(Debug)]
pub struct Did {
    keys: usize,
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
    forgotten: u64,
    charge_requests: u64,
    faults: u64,
    /// Answers by status, the final replays' included; `None` for attempts that got none.
    answers: BTreeMap<Option<u16>, u64>,
    load: Duration,
    settle: Duration,
}

pub struct Report {
    pub did: Did,
    pub verdicts: Vec<Invariant>,
}

impl Did {
    pub(super) fn of(
        runs: &[KeyRun],
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
        Did {
            keys: runs.len(),
            attempts,
            final_attempts,
            abandoned: runs.iter().filter(|run| run.abandoned).count(),
            gave_up: runs.iter().filter(|run| run.gave_up && !run.abandoned).count(),
            crash_points: runs.iter().filter(|run| run.crash_point.is_some()).count(),
            aborted: disturbed.aborted.load(Ordering::Relaxed),
            kills: disturbed.kills.lock().unwrap_or_else(PoisonError::into_inner).clone(),
            pauses: disturbed.pauses.lock().unwrap_or_else(PoisonError::into_inner).clone(),
            forgotten: disturbed.forgotten.load(Ordering::Relaxed),
            charge_requests: after.requests - before.requests,
            faults: after.faults - before.faults,
            answers,
            load,
            settle,
        }
    }
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
        let rows = [
            ("payments (keys)", did.keys.to_string(), String::new()),
            ("attempts", did.attempts.to_string(), format!("{} retries", did.attempts.saturating_sub(did.keys as u64))),
            ("abandoned after one try", did.abandoned.to_string(), "left to the workers".into()),
            ("clients that gave up", did.gave_up.to_string(), "their keys asked again at the end".into()),
            ("crash points sent", did.crash_points.to_string(), format!("{} processes aborted at one", did.aborted)),
            ("kills (SIGKILL)", total(&did.kills), by_process(&did.kills)),
            ("pauses past the lease", total(&did.pauses), by_process(&did.pauses)),
            ("gateway faults", did.faults.to_string(), format!("of {} charge requests", did.charge_requests)),
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
        for (what, count, detail) in rows {
            let _ = writeln!(out, "{}", format!("  {what:<26} {count:>8}   {detail}").trim_end());
        }
        out.push_str("\ninvariants\n");
        for verdict in &self.verdicts {
            let held = if verdict.held { "held  " } else { "BROKEN" };
            let _ = writeln!(out, "  {held} {:<66} {}", verdict.name, verdict.detail);
        }
        let _ = write!(out, "\n{}", if self.held() { "every invariant held" } else { "AN INVARIANT IS BROKEN" });
        out
    }
}
