//! The gateway's events, sent twice, late and out of order while the servers that receive them are
//! killed: every event the gateway sent was acknowledged and has one row in the inbox (but those
//! about a change the gateway made on its own, which no request of the service's caused), each was
//! applied once, and none disagreed with what the service recorded (in a run, every charge and
//! refund the gateway makes is the service's own and every event tells the truth about it, so a
//! disagreement could only be the service's mistake).

use std::collections::{BTreeMap, HashSet};

use serde::Deserialize;

use super::stored::Stored;
use super::{Invariant, Outside, name_some};

/// An event the gateway sent, as `GET /_control/events/sent` lists it.
#[derive(Debug, Clone, Deserialize)]
pub struct SentEvent {
    pub id: String,
    /// Its deliveries: 2 when the gateway sent it twice.
    pub copies: u8,
    /// Every `POST` of it, its copies' and their retries'.
    pub attempts: u64,
    /// The copies that got a `2xx`.
    pub acknowledged: u8,
}

impl SentEvent {
    /// Its copies not acknowledged yet.
    pub fn unacknowledged(&self) -> u8 {
        self.copies.saturating_sub(self.acknowledged)
    }
}

/// What the gateway made and sent during the run, as far as it can be checked.
#[derive(Debug)]
pub enum GatewayEvents {
    /// How many events the gateway made during the run, and each it sent.
    Sent { made: u64, sent: Vec<SentEvent> },
    /// Not checked, and why.
    NotChecked(&'static str),
}

impl Default for GatewayEvents {
    fn default() -> GatewayEvents {
        GatewayEvents::Sent { made: 0, sent: Vec::new() }
    }
}

/// The inbox's rows, by outcome.
pub fn inbox_outcomes(stored: &Stored) -> BTreeMap<&str, u64> {
    let mut outcomes = BTreeMap::new();
    for (_, outcome) in &stored.inbox {
        *outcomes.entry(outcome.as_str()).or_default() += 1;
    }
    outcomes
}

/// Every event the gateway made was sent, every copy of it was acknowledged, and the inbox holds
/// one row for each, and none for an event it did not send: the inbox's event ids are the ids sent.
/// An event about a change the gateway made on its own names a key of the gateway's, none of ours:
/// it is acknowledged, and has no row (the service takes it for no request of its own).
pub fn acknowledged_and_recorded(stored: &Stored, outside: &Outside) -> Invariant {
    let name = "each gateway event sent, acknowledged, and one inbox row";
    let (made, sent) = match &outside.gateway_events {
        GatewayEvents::Sent { made, sent } => (*made, sent),
        GatewayEvents::NotChecked(why) => return Invariant { name, held: true, detail: format!("not checked: {why}") },
    };
    let ids: HashSet<&str> = sent.iter().map(|event| event.id.as_str()).collect();
    let own: HashSet<&str> = outside.own_changes.values().filter_map(|change| change.event.as_deref()).collect();
    let mut rows: HashSet<&str> = HashSet::new();
    let twice: Vec<String> = stored
        .inbox
        .iter()
        .filter(|(id, _)| !rows.insert(id.as_str()))
        .map(|(id, _)| format!("{id}: in the inbox twice"))
        .collect();
    // Made during the run and never sent (held back still when the wait ran out): nothing is
    // known of what receiving them would do.
    let unsent = made.saturating_sub(sent.len() as u64);
    let unsent = (unsent > 0).then(|| format!("{unsent} made, never sent"));
    let unacknowledged = sent
        .iter()
        .filter(|event| event.unacknowledged() > 0)
        .map(|event| format!("{}: {} of {} copies acknowledged", event.id, event.acknowledged, event.copies));
    let missing = sent
        .iter()
        .filter(|event| !rows.contains(event.id.as_str()) && !own.contains(event.id.as_str()))
        .map(|event| format!("{}: not in the inbox", event.id));
    let mut never_sent: Vec<String> =
        rows.iter().filter(|id| !ids.contains(*id)).map(|id| format!("{id}: in the inbox, never sent")).collect();
    never_sent.sort();
    let mut taken_for_ours: Vec<String> = rows
        .iter()
        .filter(|id| own.contains(*id))
        .map(|id| format!("{id}: about the gateway's own change, in the inbox"))
        .collect();
    taken_for_ours.sort();
    let broken: Vec<String> = unsent
        .into_iter()
        .chain(unacknowledged)
        .chain(missing)
        .chain(never_sent)
        .chain(taken_for_ours)
        .chain(twice)
        .collect();
    let acknowledged = sent.iter().filter(|event| event.unacknowledged() == 0).count();
    let own_sent = sent.iter().filter(|event| own.contains(event.id.as_str())).count();
    let detail = format!(
        "{} sent, {acknowledged} acknowledged, {} inbox rows and {own_sent} about the gateway's own changes",
        sent.len(),
        stored.inbox.len()
    );
    Invariant { name, held: broken.is_empty(), detail: detail + &name_some(broken.iter()) }
}

/// Each event in the inbox was applied once: one `gateway_event.received` record each, however
/// many times it was delivered, wherever, and at once.
pub fn applied_once(stored: &Stored) -> Invariant {
    let recorded = |id: &str| stored.received.get(id).copied().unwrap_or_default();
    let mut broken: Vec<String> = stored
        .inbox
        .iter()
        .filter(|(id, _)| recorded(id) != 1)
        .map(|(id, _)| format!("{id}: applied {} times", recorded(id)))
        .collect();
    let rows: HashSet<&str> = stored.inbox.iter().map(|(id, _)| id.as_str()).collect();
    broken.extend(
        stored
            .received
            .keys()
            .filter(|id| !rows.contains(id.as_str()))
            .map(|id| format!("{id}: applied, no inbox row")),
    );
    broken.sort();
    let records: u32 = stored.received.values().sum();
    let detail = format!("{records} records for {} events", stored.inbox.len());
    Invariant {
        name: "each gateway event applied once (one gateway_event.received)",
        held: broken.is_empty(),
        detail: detail + &name_some(broken.iter()),
    }
}

/// No event was found to disagree with what its key recorded: none recorded as a disagreement,
/// no key flagged for one.
pub fn no_disagreement(stored: &Stored) -> Invariant {
    let recorded: Vec<&str> =
        stored.inbox.iter().filter(|(_, outcome)| outcome == "disagreement").map(|(id, _)| id.as_str()).collect();
    let detail = format!("{} in the inbox, {} keys flagged", recorded.len(), stored.disagreements.len());
    Invariant {
        name: "no gateway event disagreed; no key flagged gateway_disagreement",
        held: recorded.is_empty() && stored.disagreements.is_empty(),
        detail: detail + &name_some(recorded.iter().copied().chain(stored.disagreements.iter().map(String::as_str))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::OwnChange;
    use super::super::tests::{PAYMENT, answer, broken, charged, run, stored};
    use super::*;
    use crate::chaos::run::KeyRun;
    use payments_client::Endpoint;

    const ACKNOWLEDGED: &str = "each gateway event sent, acknowledged, and one inbox row";
    const APPLIED_ONCE: &str = "each gateway event applied once (one gateway_event.received)";
    const NO_DISAGREEMENT: &str = "no gateway event disagreed; no key flagged gateway_disagreement";

    fn sent(id: &str, copies: u8, acknowledged: u8) -> SentEvent {
        SentEvent { id: id.into(), copies, attempts: u64::from(copies), acknowledged }
    }

    /// The payments' tests' clean run, with two events about its payment (`evt_1` sent twice,
    /// `evt_2` once), each acknowledged, with its inbox row, applied once.
    fn clean() -> (Vec<KeyRun>, Stored, Outside) {
        let created = format!(r#"{{"id":"{PAYMENT}","object":"payment","status":"succeeded"}}"#);
        let runs = vec![run(vec![answer(Endpoint::Payments, 201, &created, false)])];
        let mut stored = stored(1, "ch_1");
        stored.inbox = vec![("evt_1".into(), "applied".into()), ("evt_2".into(), "nudged".into())];
        stored.received = [("evt_1".into(), 1), ("evt_2".into(), 1)].into();
        let mut outside = charged(1, &stored);
        outside.gateway_events = GatewayEvents::Sent { made: 2, sent: vec![sent("evt_1", 2, 2), sent("evt_2", 1, 1)] };
        (runs, stored, outside)
    }

    /// The invariant `name`'s detail, once it is the only one broken.
    fn only_broken(name: &str, (runs, stored, outside): (Vec<KeyRun>, Stored, Outside)) -> String {
        assert_eq!(broken(&runs, &stored, &outside), [name]);
        let verdicts = super::super::check(&runs, &stored, &outside);
        verdicts.into_iter().find(|verdict| verdict.name == name).unwrap().detail
    }

    #[test]
    fn events_sent_twice_acknowledged_and_applied_once_hold() {
        let (runs, stored, outside) = clean();
        assert_eq!(broken(&runs, &stored, &outside), Vec::<&str>::new());
        let detail = acknowledged_and_recorded(&stored, &outside).detail;
        assert_eq!(detail, "2 sent, 2 acknowledged, 2 inbox rows and 0 about the gateway's own changes");
        assert_eq!(applied_once(&stored).detail, "2 records for 2 events");
        assert_eq!(no_disagreement(&stored).detail, "0 in the inbox, 0 keys flagged");
    }

    #[test]
    fn an_event_not_acknowledged_not_sent_or_not_in_the_inbox_once_is_named() {
        // A copy never acknowledged: the service refused a duplicate, or never answered it.
        let mut case = clean();
        case.2.gateway_events = GatewayEvents::Sent { made: 2, sent: vec![sent("evt_1", 2, 1), sent("evt_2", 1, 1)] };
        assert!(only_broken(ACKNOWLEDGED, case).contains("evt_1: 1 of 2 copies acknowledged"));
        // An event acknowledged without its row: answered 200, rolled back, or lost.
        let mut case = clean();
        case.1.inbox.pop();
        case.1.received.remove("evt_2");
        assert!(only_broken(ACKNOWLEDGED, case).contains("evt_2: not in the inbox"));
        // A row for an event the gateway never sent.
        let mut case = clean();
        case.1.inbox.push(("evt_forged".into(), "applied".into()));
        case.1.received.insert("evt_forged".into(), 1);
        assert!(only_broken(ACKNOWLEDGED, case).contains("evt_forged: in the inbox, never sent"));
        // Two rows for one event (under two keys): the inbox's unique key did not hold it.
        let mut case = clean();
        case.1.inbox.push(("evt_1".into(), "applied".into()));
        assert!(only_broken(ACKNOWLEDGED, case).contains("evt_1: in the inbox twice"));
        // An event about a change the gateway made on its own, taken for one of ours.
        let mut case = clean();
        let change = OwnChange {
            charge: "ch_1".into(),
            kind: "capture".into(),
            amount_captured: 100,
            event: Some("evt_2".into()),
        };
        case.2.own_changes.insert("ch_1".into(), change);
        assert!(only_broken(ACKNOWLEDGED, case).contains("evt_2: about the gateway's own change, in the inbox"));
        // An event made and never sent: the wait for the gateway ran out, and nothing is known.
        let mut case = clean();
        case.2.gateway_events = GatewayEvents::Sent { made: 3, sent: vec![sent("evt_1", 2, 2), sent("evt_2", 1, 1)] };
        assert!(only_broken(ACKNOWLEDGED, case).contains("1 made, never sent"));
    }

    #[test]
    fn an_event_about_a_change_the_gateway_made_on_its_own_is_acknowledged_without_a_row() {
        let (runs, stored, mut outside) = clean();
        let change =
            OwnChange { charge: "ch_1".into(), kind: "cancel".into(), amount_captured: 0, event: Some("evt_3".into()) };
        outside.own_changes.insert("ch_1".into(), change);
        outside.gateway_events =
            GatewayEvents::Sent { made: 3, sent: vec![sent("evt_1", 2, 2), sent("evt_2", 1, 1), sent("evt_3", 1, 1)] };
        assert_eq!(broken(&runs, &stored, &outside), Vec::<&str>::new());
        let detail = acknowledged_and_recorded(&stored, &outside).detail;
        assert_eq!(detail, "3 sent, 3 acknowledged, 2 inbox rows and 1 about the gateway's own changes");
        // Not acknowledged, it is named as any other.
        outside.gateway_events =
            GatewayEvents::Sent { made: 3, sent: vec![sent("evt_1", 2, 2), sent("evt_2", 1, 1), sent("evt_3", 1, 0)] };
        assert!(only_broken(ACKNOWLEDGED, (runs, stored, outside)).contains("evt_3: 0 of 1 copies acknowledged"));
    }

    #[test]
    fn an_event_applied_twice_or_without_its_row_is_named() {
        // A duplicate applied again: the conflict on the inbox's row was not heeded.
        let mut case = clean();
        case.1.received.insert("evt_1".into(), 2);
        assert!(only_broken(APPLIED_ONCE, case).contains("evt_1: applied 2 times"));
        // An inbox row that nothing applied.
        let mut case = clean();
        case.1.received.remove("evt_2");
        assert!(only_broken(APPLIED_ONCE, case).contains("evt_2: applied 0 times"));
        // Applied, with no row to say so (and none for a duplicate to find).
        let mut case = clean();
        case.1.received.insert("evt_3".into(), 1);
        assert!(only_broken(APPLIED_ONCE, case).contains("evt_3: applied, no inbox row"));
    }

    #[test]
    fn a_false_disagreement_is_named() {
        // An event recorded as disagreeing with what its key recorded.
        let mut case = clean();
        case.1.inbox[0].1 = "disagreement".into();
        assert_eq!(only_broken(NO_DISAGREEMENT, case), "1 in the inbox, 0 keys flagged: evt_1");
        // A key flagged for one.
        let mut case = clean();
        case.1.disagreements.push("k".into());
        assert_eq!(only_broken(NO_DISAGREEMENT, case), "0 in the inbox, 1 keys flagged: k");
    }

    #[test]
    fn a_gateway_that_sends_no_events_is_said_to_be_unchecked() {
        let (_, mut stored, mut outside) = clean();
        (stored.inbox, stored.received) = (Vec::new(), Default::default());
        outside.gateway_events = GatewayEvents::NotChecked("it sends none");
        let verdict = acknowledged_and_recorded(&stored, &outside);
        assert!(verdict.held);
        assert_eq!(verdict.detail, "not checked: it sends none");
    }
}
