//! Idempotency keys: how `POST /v1/payments` is made safe to retry.
//!
//! A client sends a key with every request and retries with the same key until it gets a
//! definitive answer. The key's row records the request (its fingerprint and validated params),
//! how far it has got (the [`RecoveryPoint`]), who drives it (a lock with a fencing token), and in
//! the end its response. The protocol:
//!
//! 1. [`claim`] the key, in one statement for a new key or a finished one that has not expired
//!    (two for any other: the short one, for those two, finds nothing): a different request with
//!    the key is refused (422), a
//!    finished one replays its stored response, a live lock means the request is in flight (409),
//!    and otherwise the caller holds the lock and resumes at the key's recovery point. A key never
//!    seen runs its first phase in the same statement ([`Phases::first_phase`]): the key row and
//!    what `started` writes commit together, or not at all. A request that calls no other system
//!    (the layer's other shape) knows its answer before it claims ([`KnownAnswer`]): its claim
//!    inserts the key finished, with what its first phase writes, in one transaction.
//! 2. Work in [`atomic_phase`]s. Each is one statement, so one transaction and one round trip,
//!    whose writes commit together with the key row's new state, and only while the caller still
//!    holds the lock. Between two phases
//!    there is at most one foreign side effect (the gateway call), never inside one.
//! 3. Finish: the last phase stores the response, records when the key expires (the finishing
//!    process's retention after the database's `now()`), and releases the lock, in the same
//!    transaction. That expiry is the one every process goes by: the claim answers a key past it
//!    as expired, no process keeps its answer in memory past it, and the reaper deletes by it.
//!
//! Invariants: a finished phase is never repeated (each resumes at the recorded point, and a phase
//! that stays at its point is written to find its own earlier work); a request that loses its
//! lock stops without writing; nothing is stored for a rejected or indeterminate request, so its
//! retry runs again. The payment's phases themselves are in [`crate::payments::create`].

mod abandoned;
mod claim;
mod clock;
mod driver;
mod fingerprint;
mod key;
mod phase;
mod reap;
mod recovery_point;
mod replays;
mod start;
mod store;
mod story;

pub use abandoned::{
    Abandoned, NeedsAttention, STRANDED_AFTER, account_needing_attention, claim_abandoned, give_up_on_stranded,
    mark_needs_attention, needing_attention, retry_needing_attention,
};
pub use claim::{Claim, claim};
pub use clock::{DatabaseClock, Deadline};
pub use driver::{
    Context, DriveError, KeyedRequest, LeaseRunningOut, Phases, Reply, Run, TakenIn, answer, from_memory, release,
    take_in,
};
pub use fingerprint::{Canonical, Fingerprint};
pub use key::{IdempotencyKey, KeyError};
pub use phase::{MAX_ATTEMPTS as MAX_PHASE_ATTEMPTS, PhaseError, PhaseWrites, atomic_phase};
pub use reap::reap_finished;
pub use recovery_point::RecoveryPoint;
pub use replays::{Asked, Remembered, ReplayCache};
pub use start::{RefusableStart, Refusal, Started, StartedRow, Starter};
pub use store::{Endpoint, KeyLock, KnownAnswer, LEASE_MARGIN, NewKey, Reason, StoredResponse, Transition};
pub use story::KeyRecord;
