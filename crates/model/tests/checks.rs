//! The protocol, checked: the service's rules keep every guarantee in every state the model
//! reaches, every path worth reaching is reached, and every rule broken on purpose is caught.

use payments_model::{
    ALWAYS, AUTHORIZATION_ALWAYS, AUTHORIZATION_SOMETIMES, Authorization, Mutant, Protocol, Rules, SOMETIMES,
    shortest_counterexample,
};
use payments_protocol::{AfterLookUp, Claim, Found, Lease};
use stateright::{Checker, Model};

/// The configurations checked, each with the number of states it reaches: a change to the model
/// shows here, in review.
fn configurations() -> [(&'static str, Protocol, usize); 3] {
    [
        ("2 attempts, 2 faults, events, refunds", Protocol::new(2, 2).with_events().with_refunds(), 115_650),
        ("3 attempts, 2 faults, events, refunds", Protocol::new(3, 2).with_events().with_refunds(), 380_324),
        ("2 attempts, 3 faults, events, refunds", Protocol::new(2, 3).with_events().with_refunds(), 690_573),
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
    let mut counts = String::new();
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
        if checker.unique_state_count() != states {
            counts += &format!("{name}: {} states, not {states}\n", checker.unique_state_count());
        }
    }
    assert!(counts.is_empty(), "the states the model reaches changed:\n{counts}");
}

#[test]
fn every_broken_rule_is_caught() {
    // Each broken rule, the guarantee it breaks and the steps of the shortest path to it.
    let expected = [
        (Mutant::NoLookUpBeforeCharging, "at most one charge per key", 8),
        (Mutant::NoFence, "at most one charge per key", 11),
        (Mutant::RefundCheckedThenReserved, "refunds never exceed what was paid", 8),
        (Mutant::NoCompleter, "no key left unfinished once the faults stop and the workers run", 4),
        (Mutant::ReapedKeyTakenForNew, "at most one charge per key", 12),
        (Mutant::NoInbox, "every gateway event applied at most once", 6),
    ];
    assert_eq!(expected.len(), Mutant::ALL.len(), "every broken rule is checked");
    let mut changed = String::new();
    for (mutant, property, steps) in expected {
        let model = small().with(mutant);
        let path = shortest_counterexample(&model, property).unwrap_or_else(|| panic!("{mutant:?} survives"));
        let actions = path.clone().into_actions().len();
        if actions != steps {
            changed +=
                &format!("{mutant:?}: {actions} steps, not {steps}, to \"{property}\":\n{}", model.explain(&path));
        }
    }
    assert!(changed.is_empty(), "the shortest paths changed:\n{changed}");
}

#[test]
fn a_change_to_a_shared_rule_changes_what_the_checker_finds() {
    // The model decides with the service's own functions: a look-up whose find is not adopted
    // (the rule changed in `payments_protocol::after_look_up`, say) asks the gateway to charge
    // again, which, once it forgot the key, it does.
    fn never_adopts(found: Option<usize>, made_now: bool, from_recorded: bool) -> AfterLookUp<usize> {
        match payments_protocol::after_look_up(found, made_now, from_recorded) {
            AfterLookUp::Adopt(_) => AfterLookUp::Request,
            settled => settled,
        }
    }
    let property = "at most one charge per key";
    assert!(shortest_counterexample(&small(), property).is_none(), "the service's rule holds");
    let model = Protocol { rules: Rules { after_look_up: never_adopts, ..Rules::service() }, ..small() };
    assert!(shortest_counterexample(&model, property).is_some(), "the changed rule charges twice");
}

#[test]
fn taking_over_a_live_lease_breaks_nothing_the_fence_and_the_downstream_key_keep() {
    // The lease decides who drives, not what is safe: a claim that took over a key whose
    // holder's lease is still live would have two drivers at once, and the fence and the
    // downstream key would still keep every guarantee (the holder's phases fenced out, both
    // charge requests under one key). The lease is what keeps them from both working at all.
    fn takes_over_a_live_lease(found: Found) -> Claim {
        match found {
            Found::Row { same_request: true, finished: false, lease: Lease::Live } => {
                Claim::Resume { taken_over: true }
            }
            found => payments_protocol::claim(found),
        }
    }
    let model = Protocol { rules: Rules { claim: takes_over_a_live_lease, ..Rules::service() }, ..small() };
    let checker = model.checker().spawn_bfs().join();
    for property in ALWAYS {
        assert!(checker.discovery(property).is_none(), "{property}");
    }
}

#[test]
fn the_downstream_key_must_outlast_a_driver_on_its_way_to_charge() {
    // A driver decides to charge (its look-up found nothing) and its request reaches the gateway
    // within a lease, or a freeze after its lease check; a charge made meanwhile under the same
    // downstream key is all that stops a second one. Were the gateway to forget its keys that
    // soon, the service's rules would charge twice.
    let property = "at most one charge per key";
    let model = Protocol { gateway_forgets_quickly: true, ..small() };
    let path = shortest_counterexample(&model, property).expect("a double charge");
    let explained = model.explain(&path);
    assert!(explained.contains("the gateway forgets its idempotency keys"), "{explained}");
}

#[test]
fn the_guide_shows_the_path_the_checker_prints() {
    let guide = include_str!("../../../docs/model.md");
    let model = small().with(Mutant::NoLookUpBeforeCharging);
    let path = shortest_counterexample(&model, "at most one charge per key").expect("a double charge");
    let printed = model.explain(&path);
    assert!(guide.contains(&printed), "docs/model.md shows the path as the checker prints it:\n{printed}");
}

#[test]
fn of_a_capture_a_cancel_and_the_lapse_one_wins_and_a_check_in_the_handler_is_caught() {
    let model = Authorization { faults: 2, checked_in_the_handler: false };
    let checker = model.clone().checker().spawn_bfs().join();
    for property in AUTHORIZATION_ALWAYS {
        assert!(checker.discovery(property).is_none(), "{property}");
    }
    for property in AUTHORIZATION_SOMETIMES {
        assert!(checker.discovery(property).is_some(), "no run reaches \"{property}\"");
    }
    assert_eq!(checker.unique_state_count(), 91, "the states the race reaches");

    // The transition checked by one statement and taken by another: two changes stand, and the
    // second asks the gateway after the first ended the authorization.
    let broken = Authorization { checked_in_the_handler: true, ..model };
    let property = AUTHORIZATION_ALWAYS[0];
    let path = shortest_counterexample(&broken, property).expect("the broken rule is caught");
    assert_eq!(path.into_actions().len(), 6, "the shortest path to \"{property}\"");
}
