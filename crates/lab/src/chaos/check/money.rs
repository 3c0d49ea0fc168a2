//! The rule that the gateway's own changes put to the test: every payment ends recording exactly
//! the money its gateway holds for it, whatever it asked for and whatever the gateway did
//! meanwhile (captured or cancelled its authorization on its own, before the payment recorded it
//! or after), or is flagged for a person.

use super::stored::{Stored, StoredPayment};
use super::{GatewayCharge, Invariant, Outside, name_some};

/// Each payment records what the gateway holds under its downstream key: `succeeded`, for what
/// its one charge holding money captured; `canceled`, its charge released; `requires_capture`, its
/// charge still authorized; `failed`, no charge holding money. A payment whose key is flagged for
/// a person (it needs attention, or a gateway event disagreed with it) may record otherwise.
pub fn as_the_gateway_holds(stored: &Stored, outside: &Outside) -> Invariant {
    let (mut broken, mut flagged) = (Vec::new(), 0);
    let mut ended = std::collections::BTreeMap::<&str, u64>::new();
    for (key, payments) in &stored.payments {
        let for_a_person =
            stored.keys.get(key).is_some_and(|(_, attention)| *attention) || stored.disagreements.contains(key);
        for payment in payments {
            match problem(payment, outside) {
                None => *ended.entry(payment.status.as_str()).or_default() += 1,
                Some(_) if for_a_person => flagged += 1,
                Some(problem) => broken.push(format!("{}: {problem}", payment.id)),
            }
        }
    }
    let ended: Vec<String> = ended.iter().map(|(status, n)| format!("{status} ×{n}")).collect();
    let detail = format!(
        "as at the gateway: {}; {flagged} flagged for a person, {} broken",
        if ended.is_empty() { "none".to_owned() } else { ended.join(" · ") },
        broken.len()
    );
    Invariant {
        name: "every payment records the money its gateway holds, or is flagged for a person",
        held: broken.is_empty(),
        detail: detail + &name_some(broken.iter()),
    }
}

/// How what `payment` records differs from what its gateway holds for it, if it does.
fn problem(payment: &StoredPayment, outside: &Outside) -> Option<String> {
    let charges = outside.charges_by_key.get(&payment.id).map(Vec::as_slice).unwrap_or_default();
    let mut holding = charges.iter().filter(|charge| holds_money(charge));
    let status = payment.status.as_str();
    let ours = match status {
        "failed" => {
            return holding.next().map(|charge| format!("failed, the gateway holds {} ({})", charge.id, charge.status));
        }
        "pending" => return Some("still pending".into()),
        _ => charges.iter().find(|charge| Some(&charge.id) == payment.charge_id.as_ref()),
    };
    let Some(ours) = ours else {
        return Some(format!("{status}, its charge {:?} not at the gateway under its key", payment.charge_id));
    };
    if let Some(other) = holding.find(|charge| charge.id != ours.id) {
        return Some(format!("{status}, the gateway holds another charge too: {} ({})", other.id, other.status));
    }
    let captured = match status {
        "succeeded" => payment.captured.unwrap_or(payment.amount),
        _ => 0,
    };
    match (status, ours.status.as_str()) {
        ("succeeded", "succeeded") if ours.amount_captured == captured => None,
        ("canceled", "canceled") | ("requires_capture", "requires_capture") => None,
        (status, at) => Some(format!("{status}, {captured} captured; the gateway {at}, {}", ours.amount_captured)),
    }
}

/// Whether the gateway holds money by `charge`: captured, or authorized and not released.
fn holds_money(charge: &GatewayCharge) -> bool {
    matches!(charge.status.as_str(), "succeeded" | "requires_capture")
}

#[cfg(test)]
mod tests {
    use super::super::tests::{PAYMENT, answer, broken, charged, run, stored};
    use super::*;
    use crate::chaos::run::KeyRun;
    use payments_client::Endpoint;

    const AS_HELD: &str = "every payment records the money its gateway holds, or is flagged for a person";

    /// The payments' tests' clean run: a payment of 100 charged at once, as the gateway holds it.
    fn clean() -> (Vec<KeyRun>, Stored, Outside) {
        let created = format!(r#"{{"id":"{PAYMENT}","object":"payment","status":"succeeded"}}"#);
        let runs = vec![run(vec![answer(Endpoint::Payments, 201, &created, false)])];
        let stored = stored(1, "ch_1");
        let outside = charged(1, &stored);
        (runs, stored, outside)
    }

    /// The gateway's charges under the payment's key become `charges`.
    fn at_the_gateway(outside: &mut Outside, charges: &[(&str, &str, i64)]) {
        let charges = charges.iter().map(|&(id, status, amount_captured)| GatewayCharge {
            id: id.into(),
            amount_captured,
            amount_refunded: 0,
            status: status.into(),
        });
        outside.charges_by_key.insert(PAYMENT.parse().unwrap(), charges.collect());
    }

    fn detail(stored: &Stored, outside: &Outside) -> String {
        as_the_gateway_holds(stored, outside).detail
    }

    #[test]
    fn a_payment_recording_what_the_gateway_holds_holds_and_each_difference_is_named() {
        let (runs, stored, outside) = clean();
        assert_eq!(broken(&runs, &stored, &outside), Vec::<&str>::new());
        assert_eq!(detail(&stored, &outside), "as at the gateway: succeeded ×1; 0 flagged for a person, 0 broken");

        // The gateway captured part of it (an authorization captured in part behind our back),
        // and we record all of it.
        let mut part = charged(1, &stored);
        at_the_gateway(&mut part, &[("ch_1", "succeeded", 60)]);
        assert_eq!(broken(&runs, &stored, &part), [AS_HELD]);
        assert!(detail(&stored, &part).ends_with(": succeeded, 100 captured; the gateway succeeded, 60"));
        // Cancelled at the gateway (its dashboard), succeeded here.
        let mut released = charged(1, &stored);
        at_the_gateway(&mut released, &[("ch_1", "canceled", 0)]);
        assert_eq!(broken(&runs, &stored, &released), [AS_HELD]);
        // Failed here, while the gateway holds an authorization made under its key.
        let mut failed = stored.clone();
        failed.payments.values_mut().flatten().for_each(|payment| payment.status = "failed".into());
        let mut held = charged(1, &stored);
        at_the_gateway(&mut held, &[("ch_2", "requires_capture", 0)]);
        assert!(broken(&runs, &failed, &held).contains(&AS_HELD));
        assert!(detail(&failed, &held).ends_with(": failed, the gateway holds ch_2 (requires_capture)"));
        // ... which is right when the gateway holds nothing: a decline, or an authorization cancelled.
        at_the_gateway(&mut held, &[("ch_2", "failed", 0), ("ch_3", "canceled", 0)]);
        assert_eq!(detail(&failed, &held), "as at the gateway: failed ×1; 0 flagged for a person, 0 broken");
        // A second charge holding money under the one key.
        let mut twice = charged(1, &stored);
        at_the_gateway(&mut twice, &[("ch_1", "succeeded", 100), ("ch_2", "succeeded", 100)]);
        assert_eq!(broken(&runs, &stored, &twice), [AS_HELD]);
        // Still an authorization here, cancelled at the gateway.
        let mut open = stored.clone();
        open.payments.values_mut().flatten().for_each(|payment| {
            (payment.status, payment.captured) = ("requires_capture".into(), Some(0));
        });
        let mut canceled = charged(1, &open);
        at_the_gateway(&mut canceled, &[("ch_1", "canceled", 0)]);
        assert!(broken(&runs, &open, &canceled).contains(&AS_HELD));

        // A difference flagged for a person (a gateway event disagreed) is theirs: it holds here,
        // and the disagreement's own invariant names it.
        let mut flagged = stored.clone();
        flagged.disagreements.push("k".into());
        let verdict = as_the_gateway_holds(&flagged, &part);
        assert!(verdict.held);
        assert_eq!(verdict.detail, "as at the gateway: none; 1 flagged for a person, 0 broken");
    }
}
