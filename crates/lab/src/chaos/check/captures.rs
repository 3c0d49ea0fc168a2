//! The authorizations' invariants: what no key can enforce (a capture, a cancel and the lapse,
//! racing for one authorization under keys of their own, and exactly one of them wins, here and
//! at the gateway, for the same amount; or none, when the gateway ended it on its own) and what
//! keys must (every capture's or cancel's answer is its payment, the same bytes every time, and a
//! `200` only for the one that won), then that every authorization ended.

use serde::Deserialize;

use super::stored::{Stored, StoredPayment};
use super::{Invariant, Outside, answers_problem, each_key, name_some};
use crate::chaos::run::KeyRun;

/// The lapse's keys begin so (see `payments_service::authorizations::lapse`).
const LAPSE_KEY: &str = "lapse:";

/// A change the gateway made to an authorization on its own (as its dashboard or another system
/// would), as `GET /_control/authorizations/own-changes/made` lists it.
#[derive(Debug, Clone, Deserialize)]
pub struct OwnChange {
    pub charge: String,
    /// `capture` or `cancel`.
    pub kind: String,
    pub amount_captured: i64,
    /// The event it made (none from a gateway that sends none): caused by no request of ours.
    pub event: Option<String>,
}

/// Each authorization that ended was captured or cancelled by exactly one change (a client's
/// capture or cancel, or the lapse), as its charge at the gateway was, for the amount the gateway
/// captured; and the gateway captured and cancelled as many authorizations as ended so. One the
/// gateway captured or cancelled on its own ended as the gateway did, by no change of ours (each
/// refused), or by one of the gateway's kind that found it done already; never by one of the
/// other kind.
pub fn ended_once(stored: &Stored, outside: &Outside) -> Invariant {
    let mut broken = Vec::new();
    // Those the gateway ended on its own, and of them those a change of ours then found done.
    let (mut captured, mut canceled, mut on_its_own, mut found_done) = (0, 0, 0, 0);
    for payment in stored.authorizations() {
        match payment.status.as_str() {
            "succeeded" => captured += 1,
            "canceled" => canceled += 1,
            _ => continue,
        }
        if own_change(payment, outside).is_some() {
            on_its_own += 1;
            let changes = stored.changes.get(&payment.id).map(Vec::as_slice).unwrap_or_default();
            found_done += u64::from(changes.iter().any(|change| change.status == "succeeded"));
        }
        if let Some(problem) = ended_problem(payment, stored, outside) {
            broken.push(format!("{}: {problem}", payment.id));
        }
    }
    let at_the_gateway = (outside.gateway_captures, outside.gateway_cancels);
    let detail = format!(
        "{captured} captured and {canceled} cancelled, the gateway {} and {} ({on_its_own} on its own, {found_done} of \
         them then by a change of ours finding it done); {} broken",
        at_the_gateway.0,
        at_the_gateway.1,
        broken.len()
    );
    Invariant {
        name: "each authorization captured or cancelled once, by one change, as at the gateway, for its amount",
        held: broken.is_empty() && at_the_gateway == (captured, canceled),
        detail: detail + &name_some(broken.iter()),
    }
}

/// The change the gateway made to `payment`'s authorization on its own, if it made one.
fn own_change<'a>(payment: &StoredPayment, outside: &'a Outside) -> Option<&'a OwnChange> {
    outside.own_changes.get(payment.charge_id.as_ref()?)
}

/// What is wrong with how an authorization ended, if anything.
fn ended_problem(payment: &StoredPayment, stored: &Stored, outside: &Outside) -> Option<String> {
    let changes = stored.changes.get(&payment.id).map(Vec::as_slice).unwrap_or_default();
    let won: Vec<_> = changes.iter().filter(|change| change.status == "succeeded").collect();
    let own = own_change(payment, outside);
    // Ended by the gateway on its own: every change of ours refused (the payment ended as the
    // gateway says), or one of its kind that found it done (as it finds its own whose answer was
    // lost).
    let (kind, winner) = match (won.as_slice(), own) {
        ([], Some(own)) => (own.kind.as_str(), None),
        ([winner], None) => (winner.kind.as_str(), Some(winner)),
        ([winner], Some(own)) if winner.kind == own.kind => (own.kind.as_str(), Some(winner)),
        ([winner], Some(own)) => {
            return Some(format!(
                "the gateway's {} on its own, but our {} by {} won",
                own.kind, winner.kind, winner.key
            ));
        }
        (won, _) => return Some(format!("{} changes succeeded", won.len())),
    };
    match (payment.status.as_str(), kind) {
        ("succeeded", "capture") | ("canceled", "cancel") => {}
        (status, kind) => return Some(format!("{status}, but its {kind} won")),
    }
    if let Some(winner) = winner
        && winner.key.starts_with(LAPSE_KEY) != (payment.cancellation_reason.as_deref() == Some("expired"))
    {
        return Some(format!("cancelled for {:?} by {}", payment.cancellation_reason, winner.key));
    }
    let charge = payment.charge_id.as_ref().and_then(|id| outside.charges.get(id));
    let Some(charge) = charge else { return Some("its charge was not found at the gateway".into()) };
    let at_the_gateway = match charge.status.as_str() {
        "succeeded" => "succeeded",
        "canceled" => "canceled",
        other => return Some(format!("{}, the gateway {other}", payment.status)),
    };
    if at_the_gateway != payment.status {
        return Some(format!("{}, the gateway {at_the_gateway}", payment.status));
    }
    let ours = payment.captured.unwrap_or_default();
    (charge.amount_captured != ours).then(|| format!("captured {ours}, the gateway {}", charge.amount_captured))
}

/// Every answer for a capture's or a cancel's key is about its payment (the payment itself, or a
/// refusal naming it), the same bytes each time; and a key answered `200` made the change that
/// won.
pub fn one_answer(runs: &[&KeyRun], stored: &Stored) -> Invariant {
    let (held, detail) = each_key(runs, |run| {
        let payment = run.request.changes()?;
        if let Some(problem) = answers_problem(run, Some(payment)) {
            return Some(problem);
        }
        let done = run.answers.iter().any(|answer| answer.status.is_success());
        let changes = stored.changes.get(&payment).map(Vec::as_slice).unwrap_or_default();
        let won = changes.iter().any(|change| change.key == run.key && change.status == "succeeded");
        (done != won).then(|| format!("answered 200: {done}, its change won: {won}"))
    });
    Invariant {
        name: "every capture or cancel key's answers: its payment, 200 only for the winner, byte-identical",
        held,
        detail,
    }
}

/// Every authorization ended: captured, cancelled or lapsed, none left open.
pub fn every_one_ended(stored: &Stored) -> Invariant {
    let open: Vec<String> = stored
        .authorizations()
        .filter(|payment| payment.status == "requires_capture")
        .map(|payment| payment.id.to_string())
        .collect();
    let all = stored.authorizations().count();
    let lapsed = stored.authorizations().filter(|payment| payment.cancellation_reason.as_deref() == Some("expired"));
    let detail = format!("{} of {all} ended, {} of them lapsed", all - open.len(), lapsed.count());
    Invariant {
        name: "every authorization ended: captured, cancelled or lapsed",
        held: open.is_empty(),
        detail: detail + &name_some(open.iter()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use payments_client::{Endpoint, NewCancel, NewCapture};

    use super::super::GatewayCharge;
    use super::super::stored::StoredChange;
    use super::super::tests::{PAYMENT, answer};
    use super::*;
    use crate::chaos::run::Request;

    /// An authorization of 1000, captured for 600 by `capture`'s key; `cancel`'s key lost.
    fn stored() -> Stored {
        let payment = StoredPayment {
            id: PAYMENT.parse().unwrap(),
            amount: 1000,
            downstream_key: None,
            status: "succeeded".into(),
            charge_id: Some("ch_1".into()),
            captured: Some(600),
            cancellation_reason: None,
        };
        let change = |key: &str, kind: &str, status: &str| StoredChange {
            key: key.into(),
            kind: kind.into(),
            status: status.into(),
        };
        let mut stored = Stored::default();
        stored.payments.insert("p".into(), vec![payment]);
        let changes = vec![change("capture", "capture", "succeeded"), change("cancel", "cancel", "failed")];
        stored.changes.insert(PAYMENT.parse().unwrap(), changes);
        stored
    }

    fn outside(status: &str, captured: i64) -> Outside {
        let charge =
            GatewayCharge { id: "ch_1".into(), amount_captured: captured, amount_refunded: 0, status: status.into() };
        Outside { gateway_captures: 1, charges: HashMap::from([("ch_1".into(), charge)]), ..Outside::default() }
    }

    fn runs() -> Vec<KeyRun> {
        let payment = PAYMENT.parse().unwrap();
        let captured = format!(r#"{{"id":"{PAYMENT}","object":"payment","status":"succeeded"}}"#);
        let refused = format!(
            r#"{{"type":"x/payment-not-cancelable","payment":{{"id":"{PAYMENT}","object":"payment","status":"succeeded"}}}}"#
        );
        let run = |key: &str, request, answers| KeyRun {
            key: key.into(),
            request,
            crash_point: None,
            abandoned: false,
            answers,
            gave_up: false,
        };
        vec![
            run(
                "capture",
                Request::Capture(NewCapture { payment, amount: Some(600) }),
                vec![
                    answer(Endpoint::Captures, 200, &captured, false),
                    answer(Endpoint::Captures, 200, &captured, true),
                ],
            ),
            run(
                "cancel",
                Request::Cancel(NewCancel { payment, reason: None }),
                vec![answer(Endpoint::Cancels, 400, &refused, false)],
            ),
        ]
    }

    fn broken(runs: &[KeyRun], stored: &Stored, outside: &Outside) -> Vec<&'static str> {
        let runs: Vec<&KeyRun> = runs.iter().collect();
        let verdicts = [ended_once(stored, outside), one_answer(&runs, stored), every_one_ended(stored)];
        verdicts.into_iter().filter(|verdict| !verdict.held).map(|verdict| verdict.name).collect()
    }

    const ONCE: &str =
        "each authorization captured or cancelled once, by one change, as at the gateway, for its amount";
    const ANSWERS: &str = "every capture or cancel key's answers: its payment, 200 only for the winner, byte-identical";

    #[test]
    fn a_clean_race_holds_and_each_breach_is_named() {
        assert_eq!(broken(&runs(), &stored(), &outside("succeeded", 600)), Vec::<&str>::new());

        // The gateway captured another amount, or cancelled what we captured.
        assert_eq!(broken(&runs(), &stored(), &outside("succeeded", 1000)), [ONCE]);
        assert_eq!(broken(&runs(), &stored(), &outside("canceled", 0)), [ONCE]);
        // Two changes won: captured, then cancelled under another key.
        let mut both = stored();
        both.changes.values_mut().flatten().for_each(|change| change.status = "succeeded".into());
        assert_eq!(broken(&runs(), &both, &outside("succeeded", 600)), [ONCE, ANSWERS]);
        // A loser answered 200.
        let mut runs_loser = runs();
        runs_loser[1].answers = runs_loser[0].answers.clone();
        assert_eq!(broken(&runs_loser, &stored(), &outside("succeeded", 600)), [ANSWERS]);
        // An authorization left open.
        let mut open = stored();
        open.payments.values_mut().flatten().for_each(|payment| payment.status = "requires_capture".into());
        open.changes.clear();
        let mut none = outside("requires_capture", 0);
        none.gateway_captures = 0;
        assert_eq!(broken(&[], &open, &none), ["every authorization ended: captured, cancelled or lapsed"]);
    }

    /// `outside`, with the gateway's own `kind` of change to the charge.
    fn on_its_own(mut outside: Outside, kind: &str) -> Outside {
        let (charge, kind) = ("ch_1".to_owned(), kind.to_owned());
        let amount_captured = outside.charges["ch_1"].amount_captured;
        outside.own_changes.insert(charge.clone(), OwnChange { charge, kind, amount_captured, event: None });
        outside
    }

    #[test]
    fn an_authorization_the_gateway_ended_on_its_own_needs_no_change_of_ours_and_never_one_of_the_other_kind() {
        // Captured by the gateway first: our capture, coming later, found it done.
        assert_eq!(broken(&runs(), &stored(), &on_its_own(outside("succeeded", 600), "capture")), Vec::<&str>::new());
        // Every change of ours refused, the payment ended as the gateway says.
        let mut refused = stored();
        refused.changes.values_mut().flatten().for_each(|change| change.status = "failed".into());
        let by_the_gateway = on_its_own(outside("succeeded", 600), "capture");
        assert_eq!(broken(&[], &refused, &by_the_gateway), Vec::<&str>::new());
        // Or before any change of ours was made (it ended when its charge was recorded).
        let mut unchanged = stored();
        unchanged.changes.clear();
        assert_eq!(broken(&[], &unchanged, &by_the_gateway), Vec::<&str>::new());
        // Without the gateway's own change, no change of ours won: broken, as before.
        assert_eq!(broken(&[], &refused, &outside("succeeded", 600)), [ONCE]);
        // Cancelled by the gateway, captured by us: our capture won against it.
        let cancelled = on_its_own(outside("canceled", 0), "cancel");
        assert_eq!(broken(&runs(), &stored(), &cancelled), [ONCE]);
        // Ended by the gateway, and two changes of ours won.
        let mut both = stored();
        both.changes.values_mut().flatten().for_each(|change| change.status = "succeeded".into());
        assert_eq!(broken(&runs(), &both, &by_the_gateway), [ONCE, ANSWERS]);
    }
}
