//! The refunds' invariants: what no key can enforce (a payment's refunds never take more than it
//! has, however many race for it with keys of their own) and what keys must (one refund per key,
//! at the gateway too, and its answer the same bytes every time), then that every refund the
//! gateway left pending settled, and that every refund's event arrived.

use std::collections::HashSet;

use serde::Deserialize;

use super::stored::{Stored, StoredRefund};
use super::{Invariant, Outside, answers_problem, committed_once, each_key, name_some, not_the_runs};
use crate::chaos::run::KeyRun;
use crate::webhook::Events;

/// A charge as the gateway's `GET /v1/charges/{id}` shows it: what it captured (all of it, or
/// what an authorization's capture took), what its refunds that have not failed take
/// back, pending ones included, and its status (`requires_capture` while only authorized,
/// `canceled` once its authorization is, `failed` for a decline).
#[derive(Debug, Clone, Deserialize)]
pub struct GatewayCharge {
    pub id: String,
    pub amount_captured: i64,
    pub amount_refunded: i64,
    pub status: String,
}

pub fn phases_once(stored: &Stored) -> Invariant {
    let refunds: Vec<_> = stored.all_refunds().map(|refund| refund.id).collect();
    let (held, detail) = committed_once(stored, &refunds, "refunds");
    Invariant { name: "each refund's outcome and finish committed once, by one request", held, detail }
}

/// The gateway made as many refunds as we recorded with a refund of its, and as many refund keys
/// were answered with a refund (`201`, whatever its status): none made twice, none lost.
pub fn gateway_refunds(runs: &[&KeyRun], stored: &Stored, outside: &Outside) -> Invariant {
    let reached = stored.all_refunds().filter(|refund| refund.gateway_refund_id.is_some()).count() as u64;
    let answered = runs.iter().filter(|run| run.answers.iter().any(|answer| answer.status.is_success())).count() as u64;
    Invariant {
        name: "gateway refunds = refunds that reached it = refunds answered 201",
        held: outside.gateway_refunds == reached && reached == answered,
        detail: format!("{} = {reached} = {answered}", outside.gateway_refunds),
    }
}

/// Each refund key made at most one refund, and the gateway holds, under the key's downstream
/// key, exactly the refund we recorded (none if it never reached it): a retry, a resumption or a
/// worker that asked again made no second one, even after the gateway forgot its keys.
pub fn one_per_key(runs: &[&KeyRun], stored: &Stored, outside: &Outside) -> Invariant {
    let problem = |run: &&KeyRun| -> Option<String> {
        let refunds = stored.refunds.get(&run.key).map(Vec::as_slice).unwrap_or_default();
        if refunds.len() > 1 {
            return Some(format!("{}: {} refunds stored", run.key, refunds.len()));
        }
        let refund = refunds.first()?;
        let at_gateway = outside.refunds_by_key.get(&refund.id).map(Vec::as_slice).unwrap_or_default();
        let ours: Vec<String> = refund.gateway_refund_id.iter().cloned().collect();
        (at_gateway != ours).then(|| format!("{}: the gateway holds {at_gateway:?}, we recorded {ours:?}", run.key))
    };
    let broken: Vec<String> = runs.iter().filter_map(problem).collect();
    let ids: Vec<&str> = stored.all_refunds().filter_map(|refund| refund.gateway_refund_id.as_deref()).collect();
    let distinct = ids.iter().collect::<HashSet<_>>().len();
    let detail = format!(
        "{} keys, {} refunds, {} at the gateway, {distinct} distinct",
        runs.len(),
        stored.all_refunds().count(),
        ids.len()
    );
    Invariant {
        name: "each refund key made one refund, at the gateway too",
        held: broken.is_empty() && distinct == ids.len(),
        detail: detail + &name_some(broken.iter()),
    }
}

/// The rule that no key can enforce: per payment, what is refunded and what is pending never
/// exceed its amount, in the database (whose running totals are its refunds' sums) and at the
/// gateway, and the gateway's figure is ours (or less, while a refund we hold pending has failed
/// there and is not settled here yet).
pub fn within_the_payment(stored: &Stored, outside: &Outside) -> Invariant {
    let mut broken = Vec::new();
    for (payment, totals) in &stored.totals {
        let refunds: Vec<&StoredRefund> = stored.all_refunds().filter(|refund| refund.payment_id == *payment).collect();
        let sum = |status: &str| -> i64 {
            refunds.iter().filter(|refund| refund.status == status).map(|refund| refund.amount).sum()
        };
        let (succeeded, pending) = (sum("succeeded"), sum("pending"));
        let ours = totals.refunded + totals.pending;
        let charge = totals.charge_id.as_ref().and_then(|id| outside.charges.get(id));
        let problem = match charge {
            _ if ours > totals.amount => Some(format!("{ours} refunded or pending of {} captured", totals.amount)),
            _ if (totals.refunded, totals.pending) != (succeeded, pending) => Some(format!(
                "totals {} + {} pending, its refunds {succeeded} + {pending}",
                totals.refunded, totals.pending
            )),
            None => Some("its charge was not found at the gateway".into()),
            Some(charge) if charge.amount_refunded > charge.amount_captured => {
                Some(format!("the gateway refunded {} of {} captured", charge.amount_refunded, charge.amount_captured))
            }
            Some(charge) if charge.amount_refunded > ours || (pending == 0 && charge.amount_refunded != ours) => {
                Some(format!("the gateway refunded {}, we {ours}", charge.amount_refunded))
            }
            Some(_) => None,
        };
        if let Some(problem) = problem {
            broken.push(format!("{payment}: {problem}"));
        }
    }
    let detail = format!("{} of {} refunded payments", stored.totals.len() - broken.len(), stored.totals.len());
    Invariant {
        name: "per payment, refunded + pending ≤ captured, here and at the gateway",
        held: broken.is_empty(),
        detail: detail + &name_some(broken.iter()),
    }
}

/// Every answer for a refund key is its one refund (`201`, or `502` naming it) or, when it made
/// none, its one refusal, the same bytes each time.
pub fn one_refund_or_refusal(runs: &[&KeyRun], stored: &Stored) -> Invariant {
    let (held, detail) = each_key(runs, |run| match stored.refunds.get(&run.key).map(Vec::as_slice) {
        None | Some([]) => answers_problem(run, None),
        Some([refund]) => answers_problem(run, Some(refund.id)),
        Some(refunds) => Some(format!("{} refunds stored", refunds.len())),
    });
    Invariant { name: "every refund key's answers: one refund or refusal, byte-identical", held, detail }
}

/// Every refund the gateway left pending has settled, succeeded or failed, by the end of the wait
/// after the load.
pub fn settled(runs: &[&KeyRun], stored: &Stored) -> Invariant {
    let left_pending = runs.iter().filter(|run| answered_pending(run)).count();
    let status = |status: &str| stored.all_refunds().filter(|refund| refund.status == status).count();
    let still: Vec<String> =
        stored.all_refunds().filter(|refund| refund.status == "pending").map(|refund| refund.id.to_string()).collect();
    let detail = format!(
        "{left_pending} answered pending; now {} succeeded, {} failed, {} pending",
        status("succeeded"),
        status("failed"),
        still.len()
    );
    Invariant {
        name: "every pending refund settled, succeeded or failed",
        held: still.is_empty(),
        detail: detail + &name_some(still.iter()),
    }
}

/// Whether the refund key was answered with a refund the gateway had left pending.
pub fn answered_pending(run: &KeyRun) -> bool {
    let pending = |body: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|refund| refund["status"] == "pending")
    };
    run.request.is_refund() && run.answers.iter().any(|answer| answer.status.is_success() && pending(&answer.body))
}

pub fn events(stored: &Stored, outside: &Outside) -> Invariant {
    let name = "every refund's event arrived";
    let Some(events) = &outside.events else { return not_the_runs(name) };
    let refunds = stored.all_refunds().count();
    let missing = refund_events_missing(stored, events);
    let detail = format!("{} of {refunds}", refunds - missing.len()) + &name_some(missing.iter());
    Invariant { name, held: missing.is_empty(), detail }
}

/// The refunds whose event for their status now has not arrived: `refund.created` while pending,
/// `refund.succeeded` or `refund.failed` once settled.
pub fn refund_events_missing(stored: &Stored, events: &Events) -> Vec<String> {
    let arrived = |refund: &StoredRefund| {
        let kind = match refund.status.as_str() {
            "pending" => "refund.created",
            "succeeded" => "refund.succeeded",
            _ => "refund.failed",
        };
        events.get(&refund.id.to_string()).is_some_and(|kinds| kinds.contains(kind))
    };
    stored
        .all_refunds()
        .filter(|refund| !arrived(refund))
        .map(|refund| format!("{} ({})", refund.id, refund.status))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use uuid::Uuid;

    use super::super::stored::{StoredPayment, Totals};
    use super::super::tests::{PAYMENT, answer, broken, held_at_the_gateway};
    use super::*;
    use crate::chaos::run::Request;
    use payments_client::{Endpoint, NewPayment, NewRefund};

    fn refund_id() -> Uuid {
        "0194f5a0-0000-7000-8000-000000000101".parse().unwrap()
    }

    fn key_run(key: &str, request: Request, answers: Vec<payments_client::Answer>) -> KeyRun {
        KeyRun { key: key.into(), request, crash_point: None, abandoned: false, answers, gave_up: false }
    }

    /// A payment of 1000 (key `k`), a refund of 400 of it (key `r1`), and a refund of 700 refused
    /// (key `r2`), as the clients saw them.
    fn runs() -> Vec<KeyRun> {
        let payment = format!(r#"{{"id":"{PAYMENT}","object":"payment","status":"succeeded"}}"#);
        let refund = format!(r#"{{"id":"{}","object":"refund","status":"succeeded"}}"#, refund_id());
        let refused = r#"{"type":"https://payments.example/problems/refund-exceeds-payment","refundable":600}"#;
        let new_refund = |amount| Request::Refund(NewRefund { payment: PAYMENT.into(), amount, reason: None });
        let paying = NewPayment {
            amount: 1000,
            currency: "usd".into(),
            source: "tok_visa".into(),
            description: None,
            capture: true,
        };
        vec![
            key_run("k", Request::Payment(paying), vec![answer(Endpoint::Payments, 201, &payment, false)]),
            key_run(
                "r1",
                new_refund(Some(400)),
                vec![
                    answer(Endpoint::Refunds, 503, "{}", false),
                    answer(Endpoint::Refunds, 201, &refund, false),
                    answer(Endpoint::Refunds, 201, &refund, true),
                ],
            ),
            key_run(
                "r2",
                new_refund(Some(700)),
                vec![answer(Endpoint::Refunds, 400, refused, false), answer(Endpoint::Refunds, 400, refused, true)],
            ),
        ]
    }

    fn stored() -> Stored {
        let payment_id: Uuid = PAYMENT.parse().unwrap();
        let mut stored = Stored::default();
        for key in ["k", "r1", "r2"] {
            stored.keys.insert(key.into(), ("finished".into(), false));
        }
        let payment = StoredPayment {
            id: payment_id,
            amount: 1000,
            downstream_key: None,
            status: "succeeded".into(),
            charge_id: Some("ch_1".into()),
            captured: None,
            cancellation_reason: None,
        };
        stored.payments.insert("k".into(), vec![payment]);
        let refund = StoredRefund {
            id: refund_id(),
            account_id: Uuid::nil(),
            key_id: Uuid::nil(),
            payment_id,
            amount: 400,
            status: "succeeded".into(),
            gateway_refund_id: Some("re_1".into()),
        };
        stored.refunds.insert("r1".into(), vec![refund]);
        stored
            .totals
            .insert(payment_id, Totals { amount: 1000, refunded: 400, pending: 0, charge_id: Some("ch_1".into()) });
        stored.phases.insert(payment_id, [1, 1]);
        stored.phases.insert(refund_id(), [1, 1]);
        stored
    }

    /// The payment's charge at the gateway, captured whole, with `refunded` taken back.
    fn charge(refunded: i64) -> GatewayCharge {
        GatewayCharge {
            id: "ch_1".into(),
            amount_captured: 1000,
            amount_refunded: refunded,
            status: "succeeded".into(),
        }
    }

    fn outside() -> Outside {
        let events = [(PAYMENT, "payment.succeeded"), (&refund_id().to_string(), "refund.succeeded")];
        Outside {
            gateway_charges: 1,
            gateway_refunds: 1,
            gateway_authorizations: 0,
            gateway_captures: 0,
            gateway_cancels: 0,
            charges: HashMap::from([("ch_1".into(), charge(400))]),
            charges_by_key: held_at_the_gateway(&stored()),
            own_changes: HashMap::new(),
            refunds_by_key: HashMap::from([(refund_id(), vec!["re_1".into()])]),
            events: Some(events.iter().map(|(id, kind)| (id.to_string(), [kind.to_string()].into())).collect()),
            gateway_events: Default::default(),
        }
    }

    #[test]
    fn a_clean_run_with_refunds_holds_and_each_breach_is_named() {
        assert_eq!(broken(&runs(), &stored(), &outside()), Vec::<&str>::new());

        // A second refund at the gateway for one key, after it forgot the key.
        let mut twice = outside();
        twice.gateway_refunds = 2;
        twice.refunds_by_key.insert(refund_id(), vec!["re_1".into(), "re_2".into()]);
        twice.charges.insert("ch_1".into(), charge(800));
        assert_eq!(
            broken(&runs(), &stored(), &twice),
            [
                "gateway refunds = refunds that reached it = refunds answered 201",
                "each refund key made one refund, at the gateway too",
                "per payment, refunded + pending ≤ captured, here and at the gateway",
            ]
        );
        // Totals that are not the refunds' sums (a reservation never given back, say).
        let mut leaked = stored();
        leaked.totals.values_mut().for_each(|totals| totals.pending = 300);
        assert_eq!(
            broken(&runs(), &leaked, &outside()),
            ["per payment, refunded + pending ≤ captured, here and at the gateway"]
        );
        // A refusal replayed as another.
        let mut runs_differ = runs();
        runs_differ[2].answers[1] = answer(Endpoint::Refunds, 400, r#"{"type":"x/payment-already-refunded"}"#, true);
        assert_eq!(
            broken(&runs_differ, &stored(), &outside()),
            ["every refund key's answers: one refund or refusal, byte-identical"]
        );
        // A refund left pending, whose event says so.
        let mut pending = stored();
        pending.refunds.values_mut().flatten().for_each(|refund| refund.status = "pending".into());
        pending.totals.values_mut().for_each(|totals| (totals.refunded, totals.pending) = (0, 400));
        let mut created = outside();
        created.events.as_mut().unwrap().insert(refund_id().to_string(), ["refund.created".to_owned()].into());
        assert_eq!(broken(&runs(), &pending, &created), ["every pending refund settled, succeeded or failed"]);
        // A refund whose event never came.
        let mut lost = outside();
        lost.events.as_mut().unwrap().remove(&refund_id().to_string());
        assert_eq!(broken(&runs(), &stored(), &lost), ["every refund's event arrived"]);
    }
}
