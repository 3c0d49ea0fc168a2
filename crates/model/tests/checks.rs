//! The protocol, checked: the service's rules keep every guarantee in every state the model
//! reaches, every path worth reaching is reached, and every rule broken on purpose is caught.

use payments_model::{ALWAYS, Mutant, Protocol, Rules, SOMETIMES, shortest_counterexample};
use payments_protocol::{Claim, Found, Lease};
use stateright::{Checker, Model};

/// The configurations checked, each with the number of states it reaches: a change to the model
/// shows here, in review.
fn configurations() -> [(&'static str, Protocol, usize); 3] {
    [
        ("2 attempts, 2 faults, events, refunds", Protocol::new(2, 2).with_events().with_refunds(), 60_294),
        ("3 attempts, 2 faults, events, refunds", Protocol::new(3, 2).with_events().with_refunds(), 184_082),
        ("2 attempts, 3 faults, events, refunds", Protocol::new(2, 3).with_events().with_refunds(), 334_226),
    ]
}

/// The configuration the broken rules are checked in.
fn small() -> Protocol {
    Protocol::new(2, 2).with_events().with_refunds()
}

/// Panics with the shortest path to a state where `property` fails.
fn fail_with_counterexample(model: &Protocol, property: &'static str) -> ! {
    let path = shortest_counterexample(model, property).expect("the checker found a failure");
    panic!("{property} fails:\n{}", model.explain(&path));
}

#[test]
fn the_guarantees_hold_in_every_state_and_every_path_is_reached() {
    for (name, model, states) in configurations() {
        let checker = model.clone().checker().spawn_bfs().join();
        let found = checker.discoveries();
        for property in ALWAYS {
            if found.contains_key(property) {
                fail_with_counterexample(&model, property);
            }
        }
        for property in SOMETIMES {
            assert!(found.contains_key(property), "{name}: no run reaches \"{property}\"");
        }
        assert_eq!(checker.unique_state_count(), states, "{name}: the states the model reaches");
    }
}

#[test]
fn every_broken_rule_is_caught() {
    // Each broken rule, the guarantee it breaks and the steps of the shortest path to it.
    let expected = [
        (Mutant::NoLookUpBeforeCharging, "at most one charge per key", 7),
        (Mutant::NoFence, "at most one charge per key", 14),
        (Mutant::RefundCheckedThenReserved, "refunds never exceed what was paid", 7),
        (Mutant::NoCompleter, "no key left unfinished once the faults stop and the workers run", 4),
        (Mutant::ReapedWhileTheClientRetries, "at most one charge per key", 10),
        (Mutant::NoInbox, "every gateway event applied at most once", 5),
    ];
    assert_eq!(expected.len(), Mutant::ALL.len(), "every broken rule is checked");
    for (mutant, property, steps) in expected {
        let model = small().with(mutant);
        let path = shortest_counterexample(&model, property).unwrap_or_else(|| panic!("{mutant:?} survives"));
        let actions = path.clone().into_actions().len();
        assert_eq!(actions, steps, "{mutant:?}: the shortest path to \"{property}\":\n{}", model.explain(&path));
    }
}

#[test]
fn a_change_to_a_shared_rule_changes_what_the_checker_finds() {
    // The model decides with the service's own functions: a claim that takes over a key whose
    // holder's lease is still live (the rule changed in `payments_protocol::claim`, say) lets two
    // drivers charge under one key.
    fn takes_over_a_live_lease(found: Found) -> Claim {
        match found {
            Found::Row { same_request: true, finished: false, lease: Lease::Live } => {
                Claim::Resume { taken_over: true }
            }
            found => payments_protocol::claim(found),
        }
    }
    let property = "at most one charge per key";
    assert!(shortest_counterexample(&small(), property).is_none(), "the service's rule holds");
    let model = Protocol { rules: Rules { claim: takes_over_a_live_lease, ..Rules::service() }, ..small() };
    assert!(shortest_counterexample(&model, property).is_some(), "the changed rule charges twice");
}

#[test]
fn the_guide_shows_the_path_the_checker_prints() {
    let guide = include_str!("../../../docs/model.md");
    let model = small().with(Mutant::NoLookUpBeforeCharging);
    let path = shortest_counterexample(&model, "at most one charge per key").expect("a double charge");
    let printed = model.explain(&path);
    assert!(guide.contains(&printed), "docs/model.md shows the path as the checker prints it:\n{printed}");
}
