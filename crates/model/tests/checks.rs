//! The protocol, checked: the service's rules keep every guarantee in every state the model
//! reaches, every path worth reaching is reached, and every rule broken on purpose is caught.

use payments_model::{
    ALWAYS, AUTHORIZATION_ALWAYS, AUTHORIZATION_SOMETIMES, Authorization, AuthorizationMutant, Mutant, Protocol, Rules,
    SOMETIMES, State, shortest_counterexample,
};
use std::collections::{HashSet, VecDeque};

use payments_protocol::{AfterLookUp, Claim, Found, Lease};
use stateright::{Checker, Model};

/// The configurations checked, each with the number of states it reaches: a change to the model
/// shows here, in review. The refunds' interleavings multiply the key's: more attempts and more
/// faults are checked without them, and more faults with them for one attempt.
fn configurations() -> [(&'static str, Protocol, usize); 4] {
    [
        ("2 attempts, 2 faults, events, refunds", small(), 286_463),
        ("3 attempts, 2 faults, events", Protocol::new(3, 2).with_events(), 63_863),
        ("2 attempts, 3 faults, events", Protocol::new(2, 3).with_events(), 134_312),
        ("1 attempt, 3 faults, events, refunds", Protocol::new(1, 3).with_events().with_refunds(), 109_063),
    ]
}

/// The configuration the broken rules are checked in, and `payments model check`'s.
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
        for property in SOMETIMES.into_iter().filter(|property| model.takes_part_in(property)) {
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
        (Mutant::RefundSettledFromAnyStage, "every gateway event applied at most once", 8),
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
    let service = Protocol::new(2, 2).with_events();
    assert!(service.clone().checker().spawn_bfs().join().discovery(property).is_none(), "the service's rule holds");
    let model = Protocol { rules: Rules { after_look_up: never_adopts, ..Rules::service() }, ..service };
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
    let model = Protocol {
        rules: Rules { claim: takes_over_a_live_lease, ..Rules::service() },
        ..Protocol::new(2, 2).with_events()
    };
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
fn without_the_inbox_a_duplicate_event_is_applied_again_and_still_moves_no_money() {
    // The inbox is not what keeps a refund's money from moving twice: a duplicate applied again
    // finds the refund settled, and a settlement moves a refund only out of `pending`.
    let model = Protocol { rules: Rules { inbox: false, ..Rules::service() }, ..Protocol::new(1, 2) }
        .with_events()
        .with_refunds();
    let checker = model.clone().checker().spawn_bfs().join();
    for property in ALWAYS {
        assert!(checker.discovery(property).is_none(), "{property}");
    }
    assert!(reaches(&model, |state| state.seen.applied_again), "no duplicate was applied again");
}

/// Whether some state the model reaches is `goal`.
fn reaches(model: &Protocol, goal: impl Fn(&State) -> bool) -> bool {
    let mut seen: HashSet<State> = model.init_states().into_iter().collect();
    let mut queue: VecDeque<State> = seen.iter().cloned().collect();
    while let Some(state) = queue.pop_front() {
        if goal(&state) {
            return true;
        }
        let mut actions = Vec::new();
        model.actions(&state, &mut actions);
        for action in actions {
            if let Some(next) = model.next_state(&state, action)
                && seen.insert(next.clone())
            {
                queue.push_back(next);
            }
        }
    }
    false
}

#[test]
fn of_a_capture_a_cancel_and_the_lapse_one_wins_whatever_the_gateway_did_meanwhile() {
    let model = Authorization::new(2);
    let checker = model.clone().checker().spawn_bfs().join();
    for property in AUTHORIZATION_ALWAYS {
        assert!(checker.discovery(property).is_none(), "{property}");
    }
    for property in AUTHORIZATION_SOMETIMES {
        assert!(checker.discovery(property).is_some(), "no run reaches \"{property}\"");
    }
    assert_eq!(checker.unique_state_count(), 480, "the states the authorization reaches");

    // Each broken rule, the guarantee it breaks and the steps of the shortest path to it.
    let expected = [
        // The transition checked by one statement and taken by another: two changes stand, and
        // the second asks the gateway after the first ended the authorization.
        (AuthorizationMutant::CheckedInTheHandler, AUTHORIZATION_ALWAYS[0], 7),
        // The gateway captured while the authorization's answer was lost: its look-up records a
        // payment that succeeded with nothing captured, while the gateway holds all of it.
        (AuthorizationMutant::IgnoresWhatTheGatewayDid, AUTHORIZATION_ALWAYS[1], 3),
    ];
    let mut changed = String::new();
    for (mutant, property, steps) in expected {
        let broken = model.clone().with(mutant);
        let path = shortest_counterexample(&broken, property).unwrap_or_else(|| panic!("{mutant:?} survives"));
        let actions = path.into_actions();
        if actions.len() != steps {
            changed += &format!("{mutant:?}: {} steps, not {steps}, to \"{property}\": {actions:?}\n", actions.len());
        }
    }
    assert!(changed.is_empty(), "the shortest paths changed:\n{changed}");
}
