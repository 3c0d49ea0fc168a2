//! The decisions the model runs on: the service's own (`payments-protocol`), or a broken variant's.

use payments_protocol::{AfterLookUp, Claim, FirstCall, Found};

/// The rules, as functions the model calls: the service's, unless a [`Mutant`] broke one.
#[derive(Clone, Debug)]
pub struct Rules {
    /// Which request may take a key.
    pub claim: fn(Found) -> Claim,
    /// Whether a phase commits: the fence.
    pub commits: fn(Option<u64>, u64) -> bool,
    /// What a key taken up again asks the gateway first.
    pub first_call: fn(bool) -> FirstCall,
    /// What a look-up settles (the charge found, by its place in the gateway's list).
    pub after_look_up: fn(Option<usize>, bool, bool) -> AfterLookUp<usize>,
    /// A refund's fit and its reservation in one statement (or in two transactions).
    pub refund_in_one_statement: bool,
    /// The completer finishes keys nobody drives.
    pub completer: bool,
    /// The inbox finds an event that came before by its row, and applies it once.
    pub inbox: bool,
    /// A refund is settled (by its gateway's event, or the settler) only out of `pending`: the
    /// settlement's statement moves it only `WHERE status = 'pending'`, and an event about a refund
    /// settled already is read against what was recorded.
    pub settles_pending_only: bool,
}

impl Rules {
    /// The service's rules.
    pub fn service() -> Rules {
        Rules {
            claim: payments_protocol::claim,
            commits: payments_protocol::commits,
            first_call: payments_protocol::first_call,
            after_look_up: payments_protocol::after_look_up,
            refund_in_one_statement: true,
            completer: true,
            inbox: true,
            settles_pending_only: true,
        }
    }

    /// The service's rules with `mutant`'s broken.
    pub fn broken(mutant: Mutant) -> Rules {
        let rules = Rules::service();
        match mutant {
            Mutant::NoLookUpBeforeCharging => Rules { first_call: |_| FirstCall::Request, ..rules },
            Mutant::NoFence => Rules { commits: |_, _| true, ..rules },
            Mutant::RefundCheckedThenReserved => Rules { refund_in_one_statement: false, ..rules },
            Mutant::NoCompleter => Rules { completer: false, ..rules },
            Mutant::ReapedKeyTakenForNew => Rules {
                claim: |found| match found {
                    Found::Expired { .. } => Claim::New,
                    found => payments_protocol::claim(found),
                },
                ..rules
            },
            Mutant::RefundSettledFromAnyStage => Rules { settles_pending_only: false, ..rules },
        }
    }
}

/// A rule broken on purpose: the checker must find what goes wrong without it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    /// A key taken up again charges without looking up what an earlier run did.
    NoLookUpBeforeCharging,
    /// A phase commits whether or not its driver still holds the key.
    NoFence,
    /// A refund is checked against what is left in one transaction and reserved in another.
    RefundCheckedThenReserved,
    /// Nothing finishes a key its client abandoned.
    NoCompleter,
    /// The claim of a key the reaper deleted cannot tell what the key made, and takes it for a
    /// new one: only the retention stands between a late retry and a second charge, and a
    /// client's retries may outlast it.
    ReapedKeyTakenForNew,
    /// A refund is settled by what its event says, whatever the refund was recorded as: the
    /// settlement not held to `pending`.
    RefundSettledFromAnyStage,
}

impl Mutant {
    pub const ALL: [Mutant; 6] = [
        Mutant::NoLookUpBeforeCharging,
        Mutant::NoFence,
        Mutant::RefundCheckedThenReserved,
        Mutant::NoCompleter,
        Mutant::ReapedKeyTakenForNew,
        Mutant::RefundSettledFromAnyStage,
    ];

    /// Its name on the command line (`payments model check --broken NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Mutant::NoLookUpBeforeCharging => "no-look-up-before-charging",
            Mutant::NoFence => "no-fence",
            Mutant::RefundCheckedThenReserved => "refund-checked-then-reserved",
            Mutant::NoCompleter => "no-completer",
            Mutant::ReapedKeyTakenForNew => "reaped-key-taken-for-new",
            Mutant::RefundSettledFromAnyStage => "refund-settled-from-any-stage",
        }
    }

    /// The broken rule of this name.
    pub fn named(name: &str) -> Option<Mutant> {
        Mutant::ALL.into_iter().find(|mutant| mutant.name() == name)
    }
}
