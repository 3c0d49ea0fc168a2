//! The invariants, checked from outside (what the clients were answered, what the gateway
//! charged, what the webhook received) against the database.

use std::collections::{HashMap, HashSet};

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::load::KeyRun;
use crate::client::{Answer, KeySeen};
use crate::db::schema::{audit_records, idempotency_keys, payments};

/// The audit actions of the two phases after `started`: each commits once per payment, or a
/// request that lost its key wrote after another had taken it over.
const PHASES: [&str; 2] = ["payment.charge_recorded", "payment.finished"];

/// How many offending keys an invariant's detail names.
const SHOWN: usize = 3;

/// What the database holds for the run's keys.
#[derive(Debug, Default)]
pub struct Stored {
    /// Key → (recovery point, needs attention).
    keys: HashMap<String, (String, bool)>,
    /// Key → its payments (one, unless something is badly wrong).
    payments: HashMap<String, Vec<StoredPayment>>,
    /// Payment → how many times each of [`PHASES`] was recorded for it.
    phases: HashMap<Uuid, [u32; 2]>,
}

#[derive(Debug, Clone)]
struct StoredPayment {
    id: Uuid,
    status: String,
    charge_id: Option<String>,
}

impl Stored {
    /// Reads the key rows and payments of `keys` (UUIDv4s: no other account's keys are among them).
    pub async fn read(database_url: &str, keys: &[String]) -> anyhow::Result<Stored> {
        let mut conn = AsyncPgConnection::establish(database_url).await?;
        let key_rows: Vec<(String, String, bool)> = idempotency_keys::table
            .filter(idempotency_keys::idempotency_key.eq_any(keys))
            .select((
                idempotency_keys::idempotency_key,
                idempotency_keys::recovery_point,
                idempotency_keys::needs_attention_at.is_not_null(),
            ))
            .load(&mut conn)
            .await?;
        let payment_rows: Vec<(String, Uuid, String, Option<String>)> = payments::table
            .filter(payments::idempotency_key.eq_any(keys))
            .select((payments::idempotency_key, payments::id, payments::status, payments::gateway_charge_id))
            .load(&mut conn)
            .await?;
        let ids: Vec<Uuid> = payment_rows.iter().map(|(_, id, ..)| *id).collect();
        let phase_rows: Vec<(Uuid, String)> = audit_records::table
            .filter(audit_records::resource_id.eq_any(&ids))
            .filter(audit_records::action.eq_any(PHASES))
            .select((audit_records::resource_id, audit_records::action))
            .load(&mut conn)
            .await?;
        let mut stored = Stored::default();
        for (payment, action) in phase_rows {
            let phase = PHASES.iter().position(|phase| *phase == action).expect("filtered on PHASES");
            stored.phases.entry(payment).or_default()[phase] += 1;
        }
        for (key, recovery_point, attention) in key_rows {
            stored.keys.insert(key, (recovery_point, attention));
        }
        for (key, id, status, charge_id) in payment_rows {
            stored.payments.entry(key).or_default().push(StoredPayment { id, status, charge_id });
        }
        Ok(stored)
    }

    fn succeeded(&self) -> impl Iterator<Item = &StoredPayment> {
        self.payments.values().flatten().filter(|payment| payment.status == "succeeded")
    }

    /// The payments whose request finished (succeeded or failed): each must have had its event.
    pub fn finished_payments(&self) -> HashSet<String> {
        let finished = self.payments.values().flatten().filter(|payment| payment.status != "pending");
        finished.map(|payment| payment.id.to_string()).collect()
    }
}

/// How many of `keys` the database holds unfinished, or needing attention: one count, polled
/// while the system settles.
pub async fn unsettled(database_url: &str, keys: &[String]) -> anyhow::Result<i64> {
    let mut conn = AsyncPgConnection::establish(database_url).await?;
    let unsettled = idempotency_keys::table
        .filter(idempotency_keys::idempotency_key.eq_any(keys))
        .filter(idempotency_keys::recovery_point.ne("finished").or(idempotency_keys::needs_attention_at.is_not_null()))
        .count()
        .get_result(&mut conn)
        .await?;
    Ok(unsettled)
}

/// One invariant, and whether it held.
#[derive(Debug)]
pub struct Invariant {
    pub name: &'static str,
    pub held: bool,
    pub detail: String,
}

/// What the run saw from outside, besides the clients' answers.
pub struct Outside {
    /// Charges the gateway made during the run.
    pub gateway_charges: u64,
    /// The payments whose events reached the run's webhook (`None`: not the run's deployment).
    pub events: Option<HashSet<String>>,
}

/// Checks every invariant.
pub fn check(runs: &[KeyRun], stored: &Stored, outside: &Outside) -> Vec<Invariant> {
    vec![
        finished(runs, stored),
        phases_once(stored),
        charges(runs, stored, outside),
        distinct_charges(stored),
        one_payment(runs, stored),
        events(stored, outside),
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
    let payments: Vec<&StoredPayment> = stored.payments.values().flatten().collect();
    let twice: Vec<String> = payments
        .iter()
        .filter(|payment| stored.phases.get(&payment.id).copied().unwrap_or_default() != [1, 1])
        .map(|payment| payment.id.to_string())
        .collect();
    let mut detail = format!("{} of {} payments", payments.len() - twice.len(), payments.len());
    detail += &name_some(twice.iter().map(String::as_str));
    Invariant {
        name: "each payment's charge and finish committed once, by one request",
        held: twice.is_empty(),
        detail,
    }
}

fn charges(runs: &[KeyRun], stored: &Stored, outside: &Outside) -> Invariant {
    let succeeded = stored.succeeded().count() as u64;
    let answered = runs.iter().filter(|run| run.answers.iter().any(|answer| answer.status.is_success())).count() as u64;
    Invariant {
        name: "gateway charges = succeeded payments = successful answers",
        held: outside.gateway_charges == succeeded && succeeded == answered,
        detail: format!("{} = {succeeded} = {answered}", outside.gateway_charges),
    }
}

fn distinct_charges(stored: &Stored) -> Invariant {
    let ids: Vec<Option<&str>> = stored.succeeded().map(|payment| payment.charge_id.as_deref()).collect();
    let distinct: HashSet<&str> = ids.iter().flatten().copied().collect();
    Invariant {
        name: "every succeeded payment has a charge of its own",
        held: distinct.len() == ids.len(),
        detail: format!("{} distinct charge ids for {} payments", distinct.len(), ids.len()),
    }
}

fn one_payment(runs: &[KeyRun], stored: &Stored) -> Invariant {
    let mut broken = Vec::new();
    let mut answers = 0;
    for run in runs {
        answers += run.answers.len();
        if let Some(problem) =
            one_payment_problem(run, stored.payments.get(&run.key).map(Vec::as_slice).unwrap_or_default())
        {
            broken.push(format!("{}: {problem}", run.key));
        }
    }
    let keys = |n: usize| if n == 1 { "1 key".to_owned() } else { format!("{n} keys") };
    let mut detail = format!("{}, {answers} answers; {} broken", keys(runs.len()), keys(broken.len()));
    detail += &name_some(broken.iter().map(String::as_str));
    Invariant {
        name: "every answer for a key is its one payment; replays byte-identical",
        held: broken.is_empty(),
        detail,
    }
}

/// What is wrong with a key's answers, if anything.
fn one_payment_problem(run: &KeyRun, stored: &[StoredPayment]) -> Option<String> {
    let [payment] = stored else { return Some(format!("{} payments stored", stored.len())) };
    let definitive: Vec<&Answer> = run.answers.iter().filter(|answer| bears_payment(answer)).collect();
    let Some(first) = definitive.as_slice().first() else { return Some("no answer with its payment".into()) };
    if let Some(refused) = run.answers.iter().find(|answer| refused(answer)) {
        return Some(format!("answered {refused}"));
    }
    if let Some(other) = definitive.iter().find(|answer| answer.object_id() != Some(payment.id.to_string())) {
        return Some(format!("answered payment {:?}, stored {}", other.object_id(), payment.id));
    }
    if definitive.iter().any(|answer| answer.status != first.status || answer.body != first.body) {
        return Some("answers differ".into());
    }
    None
}

fn events(stored: &Stored, outside: &Outside) -> Invariant {
    let name = "every finished payment's event arrived";
    let Some(events) = &outside.events else {
        return Invariant { name, held: true, detail: "not checked: the deployment's webhook is not the run's".into() };
    };
    let finished = stored.finished_payments();
    let missing: Vec<&String> = finished.iter().filter(|id| !events.contains(*id)).collect();
    let mut detail = format!("{} of {}", finished.len() - missing.len(), finished.len());
    detail += &name_some(missing.iter().map(|id| id.as_str()));
    Invariant { name, held: missing.is_empty(), detail }
}

/// An answer that carries the key's payment: `2xx`, or `402` with the failed payment.
fn bears_payment(answer: &Answer) -> bool {
    answer.status.is_success() || answer.status.as_u16() == 402
}

/// An answer that would end a client's request without its payment, even on a key never sent
/// before (when every answer but a retry's is definitive): a refusal (`4xx`), a stored `5xx`, or a
/// `410`. Every request of the run is well-formed and its keys outlive it, so any is a breach.
fn refused(answer: &Answer) -> bool {
    answer.is_definitive(KeySeen::No) && !bears_payment(answer)
}

/// `: a, b, c and 4 more`, or nothing.
fn name_some<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let items: Vec<&str> = items.collect();
    match items.len() {
        0 => String::new(),
        n if n <= SHOWN => format!(": {}", items.join(", ")),
        n => format!(": {} and {} more", items[..SHOWN].join(", "), n - SHOWN),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use reqwest::StatusCode;

    use super::*;
    use crate::client::{Endpoint, NewPayment};

    const PAYMENT: &str = "0194f5a0-0000-7000-8000-000000000001";

    fn answer(status: u16, body: &str, replayed: bool) -> Answer {
        let status = StatusCode::from_u16(status).unwrap();
        Answer {
            endpoint: Endpoint::Payments,
            status,
            body: Bytes::from(body.to_owned()),
            replayed,
            retry_after: None,
            problem: None,
        }
    }

    fn run(answers: Vec<Answer>) -> KeyRun {
        let payment = NewPayment { amount: 100, currency: "usd".into(), source: "tok_visa".into(), description: None };
        KeyRun { key: "k".into(), payment, crash_point: None, abandoned: false, answers, gave_up: false }
    }

    fn stored(payments: usize, charge: &str) -> Stored {
        let payment =
            StoredPayment { id: PAYMENT.parse().unwrap(), status: "succeeded".into(), charge_id: Some(charge.into()) };
        let mut stored = Stored::default();
        stored.keys.insert("k".into(), ("finished".into(), false));
        stored.phases.insert(PAYMENT.parse().unwrap(), [1, 1]);
        stored.payments.insert("k".into(), vec![payment; payments]);
        stored
    }

    fn broken(runs: &[KeyRun], stored: &Stored, gateway_charges: u64) -> Vec<&'static str> {
        let outside = Outside { gateway_charges, events: Some(stored.finished_payments()) };
        check(runs, stored, &outside).into_iter().filter(|verdict| !verdict.held).map(|verdict| verdict.name).collect()
    }

    #[test]
    fn a_clean_run_holds_and_each_breach_is_named() {
        let created = format!(r#"{{"id":"{PAYMENT}","object":"payment","status":"succeeded"}}"#);
        let clean = run(vec![answer(503, "{}", false), answer(201, &created, false), answer(201, &created, true)]);
        assert!(broken(std::slice::from_ref(&clean), &stored(1, "ch_1"), 1).is_empty());

        // A second charge at the gateway for the one payment.
        assert_eq!(
            broken(std::slice::from_ref(&clean), &stored(1, "ch_1"), 2),
            ["gateway charges = succeeded payments = successful answers"]
        );
        // Two payments for one key, sharing a charge.
        assert!(
            broken(std::slice::from_ref(&clean), &stored(2, "ch_1"), 2)
                .contains(&"every succeeded payment has a charge of its own")
        );
        // A replay that is not the stored answer, byte for byte.
        let reordered = format!(r#"{{"object":"payment","status":"succeeded","id":"{PAYMENT}"}}"#);
        let differs = run(vec![answer(201, &created, false), answer(201, &reordered, true)]);
        assert_eq!(
            broken(&[differs], &stored(1, "ch_1"), 1),
            ["every answer for a key is its one payment; replays byte-identical"]
        );
        // A key refused outright.
        let refused = run(vec![answer(201, &created, false), answer(422, "{}", false)]);
        assert_eq!(
            broken(&[refused], &stored(1, "ch_1"), 1),
            ["every answer for a key is its one payment; replays byte-identical"]
        );
        // A key left unfinished, and an event that never came.
        let mut unfinished = stored(1, "ch_1");
        unfinished.keys.insert("k".into(), ("charge_created".into(), true));
        assert_eq!(broken(std::slice::from_ref(&clean), &unfinished, 1), ["every key finished, none needs attention"]);
        // A phase committed twice: a request wrote after its key was taken over.
        let mut stale = stored(1, "ch_1");
        stale.phases.insert(PAYMENT.parse().unwrap(), [2, 1]);
        assert_eq!(
            broken(std::slice::from_ref(&clean), &stale, 1),
            ["each payment's charge and finish committed once, by one request"]
        );
        let outside = Outside { gateway_charges: 1, events: Some(HashSet::new()) };
        let verdicts = check(&[clean], &stored(1, "ch_1"), &outside);
        assert!(
            verdicts.iter().any(|verdict| verdict.name == "every finished payment's event arrived" && !verdict.held)
        );
    }
}
