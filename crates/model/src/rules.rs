//! The decisions the model runs on: the service's own (`payments-protocol`), or a broken variant's.

use payments_protocol::{Claim, FirstCall, Found};

/// The rules, as functions the model calls: the service's, unless a [`Mutant`] broke one.
#[derive(Clone, Debug)]
pub struct Rules {
    /// Which request may take a key.
    pub claim: fn(Found) -> Claim,
    /// Whether a phase commits: the fence.
    pub commits: fn(Option<u64>, u64) -> bool,
    /// What a key taken up again asks the gateway first.
    pub first_call: fn(bool) -> FirstCall,
    /// A refund's fit and its reservation in one statement (or in two transactions).
    pub refund_in_one_statement: bool,
    /// The completer finishes keys nobody drives.
    pub completer: bool,
    /// The reaper may delete a finished key while its client may still retry.
    pub reaps_while_client_retries: bool,
    /// The inbox applies an event once, by its row.
    pub inbox: bool,
}

impl Rules {
    /// The service's rules.
    pub fn service() -> Rules {
        Rules {
            claim: payments_protocol::claim,
            commits: payments_protocol::commits,
            first_call: payments_protocol::first_call,
            refund_in_one_statement: true,
            completer: true,
            reaps_while_client_retries: false,
            inbox: true,
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
            Mutant::ReapedWhileTheClientRetries => Rules {
                reaps_while_client_retries: true,
                // The claim cannot tell what a reaped key made: to it, the key is new.
                claim: |found| match found {
                    Found::Expired { .. } => Claim::New,
                    found => payments_protocol::claim(found),
                },
                ..rules
            },
            Mutant::NoInbox => Rules { inbox: false, ..rules },
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
    /// The reaper deletes a finished key while its client may still retry with it, and the
    /// claim cannot tell what a reaped key made (the key's retention shorter than its client's
    /// retry window).
    ReapedWhileTheClientRetries,
    /// An event applied each time it comes, with no inbox row to find.
    NoInbox,
}

impl Mutant {
    pub const ALL: [Mutant; 6] = [
        Mutant::NoLookUpBeforeCharging,
        Mutant::NoFence,
        Mutant::RefundCheckedThenReserved,
        Mutant::NoCompleter,
        Mutant::ReapedWhileTheClientRetries,
        Mutant::NoInbox,
    ];

    /// Its name on the command line (`payments model check --broken NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Mutant::NoLookUpBeforeCharging => "no-look-up-before-charging",
            Mutant::NoFence => "no-fence",
            Mutant::RefundCheckedThenReserved => "refund-checked-then-reserved",
            Mutant::NoCompleter => "no-completer",
            Mutant::ReapedWhileTheClientRetries => "reaped-while-the-client-retries",
            Mutant::NoInbox => "no-inbox",
        }
    }

    /// The broken rule of this name.
    pub fn named(name: &str) -> Option<Mutant> {
        Mutant::ALL.into_iter().find(|mutant| mutant.name() == name)
    }
}
