#![doc = include_str!("../README.md")]

use std::time::Duration;

/// How a key's lock stands, as the claim reads its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lease {
    /// Nobody holds it: its last request stopped short and let go.
    Free,
    /// Another request holds it, and its lease has not run out.
    Live,
    /// Held, but its lease ran out: its driver died or froze.
    Over,
}

/// What the claim finds under a client's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Found {
    /// No row, and nothing made under the key.
    Nothing,
    /// No row (reaped) or an expired one, but what the key made remains.
    Expired { same_endpoint: bool },
    /// The key's row, for the same request (body, method, path) or another.
    Row { same_request: bool, finished: bool, lease: Lease },
}

/// What the claim does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Claim {
    /// A new key: its row made, locked by this request.
    New,
    /// Its request finished: the stored answer, replayed.
    Replay,
    /// Another request holds it (`409`).
    InFlight,
    /// The key was used for another request (`422`).
    Mismatch,
    /// Taken up again where it stopped, by this request (an unlocked key, or one whose lease ran
    /// out: taken over).
    Resume { taken_over: bool },
    /// Past its expiry, what it made is named, never made again (`410`).
    Expired,
}

/// The claim's rule, which its one statement (`idempotency/claim.rs`) states in SQL: a request
/// takes a key that is new, or unfinished and not held; a finished key is replayed, a held one is
/// in flight, another request's is a mismatch, and an expired key is answered by what it made.
pub fn claim(found: Found) -> Claim {
    match found {
        Found::Nothing => Claim::New,
        Found::Expired { same_endpoint: true } => Claim::Expired,
        Found::Expired { same_endpoint: false } | Found::Row { same_request: false, .. } => Claim::Mismatch,
        Found::Row { finished: true, .. } => Claim::Replay,
        Found::Row { lease: Lease::Live, .. } => Claim::InFlight,
        Found::Row { lease: Lease::Free, .. } => Claim::Resume { taken_over: false },
        Found::Row { lease: Lease::Over, .. } => Claim::Resume { taken_over: true },
    }
}

/// The fence's rule, which every phase's statement states in SQL (`lock_token = {key.token}`): a
/// phase commits only while the key's row carries the lock token its driver claimed it with.
pub fn commits(row_token: Option<u64>, driver_token: u64) -> bool {
    row_token == Some(driver_token)
}

/// The margin kept, before a call that cannot be taken back, between the lease left and the
/// call's longest time: it covers a small step of the database's clock.
pub const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// Whether a driver may make a gateway call that takes at most `call`, with `left` of its lease:
/// only if the lease surely outlasts it, since another driver may take the key over once it
/// runs out.
pub fn outlasts(left: Duration, call: Duration) -> bool {
    left >= call + LEASE_MARGIN
}

/// What a driver asks the gateway first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FirstCall {
    /// Whether an earlier run already did it, by the downstream key.
    LookUp,
    /// To do it.
    Request,
}

/// A key taken up again (`resumed`) may have reached the gateway already, so it is looked up by
/// its downstream key first; this holds after the gateway has forgotten the key, when asking it to
/// charge again would charge twice. A key this request made was never sent anywhere.
pub fn first_call(resumed: bool) -> FirstCall {
    #[cfg(feature = "test-switches")]
    if test_switches::is_off(test_switches::LOOK_UP_BEFORE_CHARGING) {
        return FirstCall::Request;
    }
    match resumed {
        true => FirstCall::LookUp,
        false => FirstCall::Request,
    }
}

/// How a driver records the gateway's definitive answer about a payment or a refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Recording {
    /// With the key's finish, in one statement: nothing happens between the two that could fail
    /// alone, and the driver knows the whole answer before the database records it.
    WithFinish,
    /// On its own (`charge_created`), then the finish as a statement of its own.
    ThenFinish,
}

/// A run that made the payment or the refund (`made_now`) knows everything its answer shows before
/// the database records it, times included: it reads the database's clock from what it made (its
/// creation, by the database's `now()`, and the time since on the run's own clock), for when an
/// authorization lapses or a charge was cancelled. It records the answer and finishes at once. A
/// run that took up what an earlier run made records the answer, with the database's own clock,
/// and finishes after.
pub fn recording(made_now: bool) -> Recording {
    match made_now {
        true => Recording::WithFinish,
        false => Recording::ThenFinish,
    }
}

/// What a look-up by the downstream key settles.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AfterLookUp<T> {
    /// What an earlier run made, found: adopted, wherever it is.
    Adopt(T),
    /// Nothing made: ask the gateway to do it.
    Request,
    /// Nothing found, but by another gateway than the one the record names, which knows nothing
    /// of what was done before it came: not settled, never asked to do it (it could do it twice).
    WrongGateway,
}

/// The look-up's rule: what it finds is adopted; that it found nothing settles the request only
/// when the gateway it was asked of is the record's (`from_recorded`), or when this run made the
/// record (`made_now`: nothing was ever sent).
pub fn after_look_up<T>(found: Option<T>, made_now: bool, from_recorded: bool) -> AfterLookUp<T> {
    match found {
        Some(found) => AfterLookUp::Adopt(found),
        None if made_now || from_recorded => AfterLookUp::Request,
        None => AfterLookUp::WrongGateway,
    }
}

/// The rule of a capture's, a cancel's or the lapse's first phase, which its one statement
/// (`authorizations/writes.rs`) states in SQL with a unique index: a change of an authorization stands
/// only on one still open, and only if no other change of it stands (a change the gateway refused
/// for good no longer does). Of changes racing under different keys, one stands: the others are
/// refused, and never reach the gateway.
pub fn change_stands(open: bool, another_stands: bool) -> bool {
    open && !another_stands
}

/// Why a refund is refused, decided against the payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    PaymentNotRefundable,
    PaymentAlreadyRefunded,
    RefundExceedsPayment,
}

/// The refund's rule, which its `started` statement (`refunds/writes.rs`) states in SQL, deciding
/// on the payment's row under its lock and reserving in the same statement: a succeeded payment
/// with `refundable` left (its amount less what is refunded and what pending refunds reserve)
/// gives `asked`, or all that is left; what does not fit is refused. Two refunds racing take
/// turns on the row, and the second decides on what the first reserved.
pub fn refund_fits(succeeded: bool, refundable: i64, asked: Option<i64>) -> Result<i64, Refusal> {
    let amount = asked.unwrap_or(refundable);
    if !succeeded {
        Err(Refusal::PaymentNotRefundable)
    } else if refundable == 0 {
        Err(Refusal::PaymentAlreadyRefunded)
    } else if amount > refundable {
        Err(Refusal::RefundExceedsPayment)
    } else {
        Ok(amount)
    }
}

/// A capture or cancel event about a change whose answer is recorded: it agrees with a change
/// recorded as done (`done`), of the kind the event says (`same_kind`), of the same charge
/// (`same_charge`); anything else says otherwise than we recorded.
pub fn read_change_event(done: bool, same_kind: bool, same_charge: bool) -> Reading {
    if done && same_kind && same_charge { Reading::Agrees } else { Reading::Disagrees }
}

/// Where a refund stands, in the order a gateway moves one: `pending`, then `succeeded`, then
/// `failed` (a refund that succeeded can still fail later, when the money cannot reach the card;
/// none comes back from `failed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RefundStage {
    Pending,
    Succeeded,
    Failed,
}

/// What a gateway's event about a settled record means for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reading {
    /// It says what was recorded.
    Agrees,
    /// It is older than what was recorded: ignored.
    Stale,
    /// It says otherwise: a person must look; no money moves.
    Disagrees,
}

/// A charge event about a payment whose outcome is recorded (`made`: the charge `charge` was made,
/// captured or only authorized; or it failed): a success agrees with the same charge made, a
/// failure with a failure.
pub fn read_charge_event(made: bool, charge: Option<&str>, event_succeeded: bool, event_charge: &str) -> Reading {
    let agrees = match event_succeeded {
        true => made && charge == Some(event_charge),
        false => !made,
    };
    if agrees { Reading::Agrees } else { Reading::Disagrees }
}

/// A refund event about a refund recorded at `recorded` (with the gateway's id `recorded_id`):
/// about another refund, a disagreement; else "older" follows the order a gateway moves a refund,
/// never the gateway's clock against ours, so a `succeeded` about one known `failed` is stale,
/// and a `failed` about one known `succeeded` is news that contradicts us.
pub fn read_refund_event(recorded: RefundStage, recorded_id: Option<&str>, reported: RefundStage, id: &str) -> Reading {
    if recorded_id != Some(id) {
        return Reading::Disagrees;
    }
    match reported.cmp(&recorded) {
        std::cmp::Ordering::Equal => Reading::Agrees,
        std::cmp::Ordering::Less => Reading::Stale,
        std::cmp::Ordering::Greater => Reading::Disagrees,
    }
}

/// Rules a test may switch off in a process it starts, to show what goes wrong without one. Only
/// with the `test-switches` feature, which only the integration tests turn on (a dev-dependency's
/// feature): `cargo build`, `cargo install` and the container image compile none of it, so no
/// setting of a production build can reach a switch.
#[cfg(feature = "test-switches")]
#[doc(hidden)]
pub mod test_switches {
    use std::sync::OnceLock;

    /// The environment variable naming the rules switched off, comma-separated.
    pub const VARIABLE: &str = "PAYMENTS_TEST_RULES_OFF";

    /// [`super::first_call`]'s look-up of a key taken up again: off, a resumed key asks the
    /// gateway to charge at once.
    pub const LOOK_UP_BEFORE_CHARGING: &str = "look-up-before-charging";

    /// Whether `rule` is switched off in this process (read once).
    pub fn is_off(rule: &str) -> bool {
        static OFF: OnceLock<Vec<String>> = OnceLock::new();
        let off = OFF.get_or_init(|| {
            let off: Vec<String> = std::env::var(VARIABLE)
                .unwrap_or_default()
                .split(',')
                .filter(|rule| !rule.is_empty())
                .map(str::to_owned)
                .collect();
            if !off.is_empty() {
                eprintln!("{VARIABLE}: the protocol's rules switched off for a test: {}", off.join(", "));
            }
            off
        });
        off.iter().any(|off| off == rule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_event_agrees_only_with_the_same_change_done() {
        assert_eq!(read_change_event(true, true, true), Reading::Agrees);
        assert_eq!(read_change_event(false, true, true), Reading::Disagrees, "recorded as refused");
        assert_eq!(read_change_event(true, false, true), Reading::Disagrees, "a capture said of a cancel");
        assert_eq!(read_change_event(true, true, false), Reading::Disagrees, "another charge");
    }

    #[test]
    fn one_change_of_an_open_authorization_stands() {
        assert!(change_stands(true, false));
        assert!(!change_stands(true, true), "another stands");
        assert!(!change_stands(false, false), "the authorization ended");
    }

    #[test]
    fn a_key_is_taken_only_when_it_is_new_or_unfinished_and_not_held() {
        let row = |finished, lease| Found::Row { same_request: true, finished, lease };
        assert_eq!(claim(Found::Nothing), Claim::New);
        assert_eq!(claim(row(true, Lease::Free)), Claim::Replay);
        assert_eq!(claim(row(false, Lease::Live)), Claim::InFlight);
        assert_eq!(claim(row(false, Lease::Free)), Claim::Resume { taken_over: false });
        assert_eq!(claim(row(false, Lease::Over)), Claim::Resume { taken_over: true });
        assert_eq!(claim(Found::Row { same_request: false, finished: true, lease: Lease::Free }), Claim::Mismatch);
        assert_eq!(claim(Found::Expired { same_endpoint: true }), Claim::Expired);
        assert_eq!(claim(Found::Expired { same_endpoint: false }), Claim::Mismatch);
    }

    #[test]
    fn a_call_is_made_only_while_the_lease_outlasts_it_by_the_margin() {
        let call = Duration::from_secs(10);
        assert!(outlasts(call + LEASE_MARGIN, call), "just inside the margin");
        assert!(!outlasts(call + LEASE_MARGIN - Duration::from_nanos(1), call), "just outside the margin");
        assert!(!outlasts(call, call), "the call alone");
    }

    #[test]
    fn nothing_found_settles_only_at_the_recorded_gateway_or_for_a_record_made_now() {
        assert_eq!(after_look_up(Some(7), false, false), AfterLookUp::Adopt(7));
        assert_eq!(after_look_up::<i32>(None, true, false), AfterLookUp::Request);
        assert_eq!(after_look_up::<i32>(None, false, true), AfterLookUp::Request);
        assert_eq!(after_look_up::<i32>(None, false, false), AfterLookUp::WrongGateway);
        assert_eq!(first_call(true), FirstCall::LookUp);
        assert_eq!(first_call(false), FirstCall::Request);
    }

    #[test]
    fn a_refund_takes_what_is_asked_or_all_that_is_left_and_never_more() {
        assert_eq!(refund_fits(true, 5, Some(3)), Ok(3));
        assert_eq!(refund_fits(true, 5, None), Ok(5));
        assert_eq!(refund_fits(true, 5, Some(6)), Err(Refusal::RefundExceedsPayment));
        assert_eq!(refund_fits(true, 0, None), Err(Refusal::PaymentAlreadyRefunded));
        assert_eq!(refund_fits(false, 5, Some(1)), Err(Refusal::PaymentNotRefundable));
    }

    #[test]
    fn an_event_is_read_against_what_was_recorded() {
        assert_eq!(read_charge_event(true, Some("ch_1"), true, "ch_1"), Reading::Agrees);
        assert_eq!(read_charge_event(true, Some("ch_1"), true, "ch_2"), Reading::Disagrees);
        assert_eq!(read_charge_event(false, None, true, "ch_1"), Reading::Disagrees, "recorded declined");
        assert_eq!(read_charge_event(false, None, false, "ch_1"), Reading::Agrees);
        assert_eq!(read_charge_event(true, Some("ch_1"), false, "ch_1"), Reading::Disagrees);
        use RefundStage::*;
        assert_eq!(read_refund_event(Succeeded, Some("re_1"), Succeeded, "re_1"), Reading::Agrees);
        assert_eq!(read_refund_event(Failed, Some("re_1"), Succeeded, "re_1"), Reading::Stale);
        assert_eq!(read_refund_event(Succeeded, Some("re_1"), Failed, "re_1"), Reading::Disagrees);
        assert_eq!(read_refund_event(Succeeded, Some("re_1"), Succeeded, "re_2"), Reading::Disagrees);
    }
}
