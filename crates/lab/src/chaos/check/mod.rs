//! The invariants, checked from outside (what the clients were answered, what the gateway
//! charged, refunded and sent, what the webhook received) against the database. The payments' are
//! here, the refunds' in [`refunds`], the authorizations' in [`captures`], the gateway's events'
//! in [`events`], and that every payment records the money its gateway holds in [`money`].

mod captures;
mod events;
mod money;
mod refunds;
mod stored;

use std::collections::{HashMap, HashSet};

use payments_client::{Answer, KeySeen};
use uuid::Uuid;

use super::run::KeyRun;
use crate::webhook::Events;
pub use captures::OwnChange;
pub use events::{GatewayEvents, SentEvent, inbox_outcomes};
pub use refunds::{GatewayCharge, refund_events_missing};
pub use stored::{Stored, open_authorizations, pending_refunds, unsettled};

/// How many offending keys an invariant's detail names.
const SHOWN: usize = 3;

/// One invariant, and whether it held.
#[derive(Debug)]
pub struct Invariant {
    pub name: &'static str,
    pub held: bool,
    pub detail: String,
}

/// What the run saw from outside, besides the clients' answers.
#[derive(Debug, Default)]
pub struct Outside {
    /// Charges the gateway made during the run: at once, and only authorized.
    pub gateway_charges: u64,
    pub gateway_authorizations: u64,
    /// Authorizations the gateway captured, and cancelled, during the run.
    pub gateway_captures: u64,
    pub gateway_cancels: u64,
    /// Refunds the gateway made during the run, whatever their status.
    pub gateway_refunds: u64,
    /// The refunded payments' and the authorizations' charges as the gateway shows them now, by
    /// charge id.
    pub charges: HashMap<String, GatewayCharge>,
    /// Every payment's charges as the gateway shows them now: those it made under the payment's
    /// downstream key, by payment id.
    pub charges_by_key: HashMap<Uuid, Vec<GatewayCharge>>,
    /// The changes the gateway made to authorizations on its own, by charge id.
    pub own_changes: HashMap<String, OwnChange>,
    /// The gateway's refunds made with each refund's downstream key, by our refund's id.
    pub refunds_by_key: HashMap<Uuid, Vec<String>>,
    /// The events that reached the run's webhook (`None`: not the run's deployment).
    pub events: Option<Events>,
    /// The events the gateway sent during the run.
    pub gateway_events: GatewayEvents,
}

/// Checks every invariant.
pub fn check(runs: &[KeyRun], stored: &Stored, outside: &Outside) -> Vec<Invariant> {
    let (refund_runs, others): (Vec<&KeyRun>, Vec<&KeyRun>) = runs.iter().partition(|run| run.request.is_refund());
    let (change_runs, payment_runs): (Vec<&KeyRun>, Vec<&KeyRun>) =
        others.into_iter().partition(|run| run.request.changes().is_some());
    vec![
        finished(runs, stored),
        phases_once(stored),
        refunds::phases_once(stored),
        charges(&payment_runs, stored, outside),
        refunds::gateway_refunds(&refund_runs, stored, outside),
        distinct_charges(stored),
        refunds::one_per_key(&refund_runs, stored, outside),
        refunds::within_the_payment(stored, outside),
        captures::ended_once(stored, outside),
        captures::one_answer(&change_runs, stored),
        captures::every_one_ended(stored),
        money::as_the_gateway_holds(stored, outside),
        one_payment(&payment_runs, stored),
        refunds::one_refund_or_refusal(&refund_runs, stored),
        events(stored, outside),
        refunds::settled(&refund_runs, stored),
        refunds::events(stored, outside),
        events::acknowledged_and_recorded(stored, outside),
        events::applied_once(stored),
        events::no_disagreement(stored),
    ]
}

fn finished(runs: &[KeyRun], stored: &Stored) -> Invariant {
    let state = |run: &KeyRun| stored.keys.get(&run.key);
    let unfinished: Vec<&KeyRun> =
        runs.iter().filter(|run| state(run).is_none_or(|(point, _)| point != "finished")).collect();
    let attention: Vec<&KeyRun> =
        runs.iter().filter(|run| state(run).is_some_and(|(_, attention)| *attention)).collect();
    let mut detail =
        format!("{} of {} finished, {} need attention", runs.len() - unfinished.len(), runs.len(), attention.len());
    detail += &name_some(unfinished.iter().chain(&attention).map(|run| run.key.as_str()));
    Invariant {
        name: "every key finished, none needs attention",
        held: unfinished.is_empty() && attention.is_empty(),
        detail,
    }
}

fn phases_once(stored: &Stored) -> Invariant {
    let payments: Vec<Uuid> = stored.payments.values().flatten().map(|payment| payment.id).collect();
    let (held, detail) = committed_once(stored, &payments, "payments");
    Invariant { name: "each payment's charge and finish committed once, by one request", held, detail }
}

/// Whether each of `made` (payments or refunds) had each of its key phases after `started`
/// committed exactly once, and the detail that says so.
fn committed_once(stored: &Stored, made: &[Uuid], what: &str) -> (bool, String) {
    let twice: Vec<String> = made
        .iter()
        .filter(|id| stored.phases.get(id).copied().unwrap_or_default() != [1, 1])
        .map(Uuid::to_string)
        .collect();
    let detail = format!("{} of {} {what}", made.len() - twice.len(), made.len()) + &name_some(twice.iter());
    (twice.is_empty(), detail)
}

/// Charges made at once and authorizations alike: the gateway's, ours, and the keys answered
/// with one.
fn charges(runs: &[&KeyRun], stored: &Stored, outside: &Outside) -> Invariant {
    let charged = stored.payments.values().flatten().filter(|payment| payment.charged()).count() as u64;
    let answered = runs.iter().filter(|run| run.answers.iter().any(|answer| answer.status.is_success())).count() as u64;
    let at_the_gateway = outside.gateway_charges + outside.gateway_authorizations;
    Invariant {
        name: "gateway charges = succeeded payments = successful answers",
        held: at_the_gateway == charged && charged == answered,
        detail: format!("{at_the_gateway} = {charged} = {answered}"),
    }
}

fn distinct_charges(stored: &Stored) -> Invariant {
    let charged = stored.payments.values().flatten().filter(|payment| payment.charged());
    let ids: Vec<Option<&str>> = charged.map(|payment| payment.charge_id.as_deref()).collect();
    let distinct: HashSet<&str> = ids.iter().flatten().copied().collect();
    Invariant {
        name: "every succeeded payment has a charge of its own",
        held: distinct.len() == ids.len(),
        detail: format!("{} distinct charge ids for {} payments", distinct.len(), ids.len()),
    }
}

fn one_payment(runs: &[&KeyRun], stored: &Stored) -> Invariant {
    let (held, detail) = each_key(runs, |run| {
        let stored = stored.payments.get(&run.key).map(Vec::as_slice).unwrap_or_default();
        let [payment] = stored else { return Some(format!("{} payments stored", stored.len())) };
        answers_problem(run, Some(payment.id))
    });
    Invariant { name: "every answer for a key is its one payment; replays byte-identical", held, detail }
}

/// Whether `problem` finds nothing wrong with any of `runs`, and the detail that says so.
fn each_key(runs: &[&KeyRun], problem: impl Fn(&KeyRun) -> Option<String>) -> (bool, String) {
    let broken: Vec<String> =
        runs.iter().filter_map(|run| problem(run).map(|problem| format!("{}: {problem}", run.key))).collect();
    let answers: usize = runs.iter().map(|run| run.answers.len()).sum();
    let keys = |n: usize| if n == 1 { "1 key".to_owned() } else { format!("{n} keys") };
    let detail = format!("{}, {answers} answers; {} broken", keys(runs.len()), keys(broken.len()));
    (broken.is_empty(), detail + &name_some(broken.iter()))
}

/// What is wrong with a key's answers, if anything, given what the key `made` (its payment or
/// refund; `None` for a refund that was refused). Every request of the run is well-formed and its
/// keys outlive it, so each answer that would end a request, even on a key never sent before (when
/// every answer but a retry's is definitive), must be about what the key made (or, when it made
/// nothing, a refusal), and all of them the same bytes.
fn answers_problem(run: &KeyRun, made: Option<Uuid>) -> Option<String> {
    let ending: Vec<&Answer> = run.answers.iter().filter(|answer| answer.is_definitive(KeySeen::No)).collect();
    let Some(first) = ending.first() else { return Some("no answer ended a request".into()) };
    let stray = match made {
        Some(id) => ending.iter().find(|answer| answer.object_id() != Some(id.to_string())),
        None => ending.iter().find(|answer| !answer.is_refusal()),
    };
    if let Some(stray) = stray {
        let made = made.map_or_else(|| "nothing".to_owned(), |id| id.to_string());
        return Some(format!("answered {stray} about {:?}, made {made}", stray.object_id()));
    }
    if ending.iter().any(|answer| answer.status != first.status || answer.body != first.body) {
        return Some("answers differ".into());
    }
    None
}

fn events(stored: &Stored, outside: &Outside) -> Invariant {
    let name = "every finished payment's event arrived";
    let Some(events) = &outside.events else { return not_the_runs(name) };
    let finished: Vec<String> = stored.finished_payments().map(|payment| payment.id.to_string()).collect();
    let missing = payment_events_missing(stored, events);
    let detail = format!("{} of {}", finished.len() - missing.len(), finished.len()) + &name_some(missing.iter());
    Invariant { name, held: missing.is_empty(), detail }
}

/// The finished payments no event has arrived about.
pub fn payment_events_missing(stored: &Stored, events: &Events) -> Vec<String> {
    let ids = stored.finished_payments().map(|payment| payment.id.to_string());
    ids.filter(|id| !events.contains_key(id)).collect()
}

/// An invariant about events, not checked in a deployment whose webhook is not the run's.
fn not_the_runs(name: &'static str) -> Invariant {
    Invariant { name, held: true, detail: "not checked: the deployment's webhook is not the run's".into() }
}

/// `: a, b, c and 4 more`, or nothing.
fn name_some(items: impl Iterator<Item = impl AsRef<str>>) -> String {
    let items: Vec<String> = items.map(|item| item.as_ref().to_owned()).collect();
    match items.len() {
        0 => String::new(),
        n if n <= SHOWN => format!(": {}", items.join(", ")),
        n => format!(": {} and {} more", items[..SHOWN].join(", "), n - SHOWN),
    }
}

#[cfg(test)]
mod tests {
    use super::stored::StoredPayment;
    use super::*;
    use crate::chaos::run::Request;
    use payments_client::{Endpoint, NewPayment};

    pub(super) const PAYMENT: &str = "0194f5a0-0000-7000-8000-000000000001";

    /// An answer from `endpoint`; a problem is known by its `type`'s last segment.
    pub(super) fn answer(endpoint: Endpoint, status: u16, body: &str, replayed: bool) -> Answer {
        let problem = serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .and_then(|body| body["type"].as_str().and_then(|uri| uri.rsplit('/').next()).map(str::to_owned));
        Answer::of(endpoint, status, problem.as_deref(), replayed, body)
    }

    pub(super) fn run(answers: Vec<Answer>) -> KeyRun {
        let payment = NewPayment {
            amount: 100,
            currency: "usd".into(),
            source: "tok_visa".into(),
            description: None,
            capture: true,
        };
        let request = Request::Payment(payment);
        KeyRun { key: "k".into(), request, crash_point: None, abandoned: false, answers, gave_up: false }
    }

    pub(super) fn stored(payments: usize, charge: &str) -> Stored {
        let payment = StoredPayment {
            id: PAYMENT.parse().unwrap(),
            amount: 100,
            downstream_key: None,
            status: "succeeded".into(),
            charge_id: Some(charge.into()),
            captured: None,
            cancellation_reason: None,
        };
        let mut stored = Stored::default();
        stored.keys.insert("k".into(), ("finished".into(), false));
        stored.phases.insert(PAYMENT.parse().unwrap(), [1, 1]);
        stored.payments.insert("k".into(), vec![payment; payments]);
        stored
    }

    pub(super) fn broken(runs: &[KeyRun], stored: &Stored, outside: &Outside) -> Vec<&'static str> {
        check(runs, stored, outside).into_iter().filter(|verdict| !verdict.held).map(|verdict| verdict.name).collect()
    }

    pub(super) fn charged(gateway_charges: u64, stored: &Stored) -> Outside {
        let events = stored.payments.values().flatten().map(|payment| (payment.id.to_string(), Default::default()));
        let charges_by_key = held_at_the_gateway(stored);
        Outside { gateway_charges, events: Some(events.collect()), charges_by_key, ..Outside::default() }
    }

    /// The gateway's charges under each of `stored`'s payments' keys, as each payment records
    /// them.
    pub(super) fn held_at_the_gateway(stored: &Stored) -> HashMap<Uuid, Vec<GatewayCharge>> {
        let charges = stored.payments.values().flatten().filter_map(|payment| {
            let captured = match payment.status.as_str() {
                "succeeded" => payment.captured.unwrap_or(payment.amount),
                _ => 0,
            };
            let id = payment.charge_id.clone()?;
            let charge =
                GatewayCharge { id, amount_captured: captured, amount_refunded: 0, status: payment.status.clone() };
            Some((payment.id, vec![charge]))
        });
        charges.collect()
    }

    #[test]
    fn a_clean_run_holds_and_each_breach_is_named() {
        let created = format!(r#"{{"id":"{PAYMENT}","object":"payment","status":"succeeded"}}"#);
        let paid = |status, body: &str, replayed| answer(Endpoint::Payments, status, body, replayed);
        let clean = run(vec![paid(503, "{}", false), paid(201, &created, false), paid(201, &created, true)]);
        assert!(broken(std::slice::from_ref(&clean), &stored(1, "ch_1"), &charged(1, &stored(1, "ch_1"))).is_empty());

        // A second charge at the gateway for the one payment.
        assert_eq!(
            broken(std::slice::from_ref(&clean), &stored(1, "ch_1"), &charged(2, &stored(1, "ch_1"))),
            ["gateway charges = succeeded payments = successful answers"]
        );
        // Two payments for one key, sharing a charge.
        assert!(
            broken(std::slice::from_ref(&clean), &stored(2, "ch_1"), &charged(2, &stored(2, "ch_1")))
                .contains(&"every succeeded payment has a charge of its own")
        );
        // A replay that is not the stored answer, byte for byte.
        let reordered = format!(r#"{{"object":"payment","status":"succeeded","id":"{PAYMENT}"}}"#);
        let differs = run(vec![paid(201, &created, false), paid(201, &reordered, true)]);
        assert_eq!(
            broken(&[differs], &stored(1, "ch_1"), &charged(1, &stored(1, "ch_1"))),
            ["every answer for a key is its one payment; replays byte-identical"]
        );
        // A key refused outright.
        let refused = run(vec![paid(201, &created, false), paid(422, "{}", false)]);
        assert_eq!(
            broken(&[refused], &stored(1, "ch_1"), &charged(1, &stored(1, "ch_1"))),
            ["every answer for a key is its one payment; replays byte-identical"]
        );
        // A key left unfinished.
        let mut unfinished = stored(1, "ch_1");
        unfinished.keys.insert("k".into(), ("charge_created".into(), true));
        assert_eq!(
            broken(std::slice::from_ref(&clean), &unfinished, &charged(1, &unfinished)),
            ["every key finished, none needs attention"]
        );
        // A phase committed twice: a request wrote after its key was taken over.
        let mut stale = stored(1, "ch_1");
        stale.phases.insert(PAYMENT.parse().unwrap(), [2, 1]);
        assert_eq!(
            broken(std::slice::from_ref(&clean), &stale, &charged(1, &stale)),
            ["each payment's charge and finish committed once, by one request"]
        );
        // An event that never came.
        let outside = Outside { events: Some(Events::new()), ..charged(1, &stored(1, "ch_1")) };
        assert_eq!(broken(&[clean], &stored(1, "ch_1"), &outside), ["every finished payment's event arrived"]);
    }
}
