//! The key row's life: claimed, moved from phase to phase under a fenced lock, finished, released.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::clock::since_boot;
use super::{Fingerprint, IdempotencyKey, RecoveryPoint};
use crate::audit::Actor;
use crate::db::schema::idempotency_keys;
use crate::db::{self, StoreError};
use crate::request_id::RequestId;

/// What a driver keeps in hand when it checks that its lease covers something it is about to do.
///
/// The database both sets a lease's end (`now()` plus the lease) and judges it, on its own wall
/// clock; the holder's estimate counts on `CLOCK_BOOTTIME` from before the statement was sent, so
/// it ends first as long as the database's wall clock runs as time does. What it may not do is
/// step forward during a lease (an NTP correction, a failover to a host whose clock is ahead): a
/// step of `s` ends every live lease `s` early, by the database's judgement. The margin absorbs
/// steps up to a second (NTP on a healthy host corrects by milliseconds; ntpd steps only offsets
/// above 128 ms, chrony by default only at boot) and a clock's drift over a lease (at most 500 ppm,
/// 45 ms over the default 90 s). A larger step is not covered: a driver could then call after its
/// key was taken over, and the downstream key is what stands between the payment and a second
/// charge. Keeping the database hosts' clocks synchronised is part of running it.
pub use payments_protocol::LEASE_MARGIN;

/// An endpoint whose requests are made safe to retry by keys: each key is bound to the endpoint
/// it was first used on (on another, it is a mismatch). All the layer needs to know of it.
#[derive(Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub method: &'static str,
    pub path: &'static str,
    /// How metrics name it (`payments`, `refunds`).
    pub label: &'static str,
    /// The recovery points its phases record between [`RecoveryPoint::STARTED`] and
    /// [`RecoveryPoint::FINISHED`].
    pub points: &'static [RecoveryPoint],
    /// The table that holds what its keys make: a row per key, found by `(account_id,
    /// idempotency_key_id)`, with its `id` (an operator's list names what a key made by it) and,
    /// if [`Endpoint::at_gateway`], the `gateway` that holds it.
    pub made_in: &'static str,
    /// Whether what its keys make is held at a gateway too (`made_in` has a `gateway` column): a
    /// worker reads it to know which process may drive an unfinished key. False for an endpoint
    /// of the other shape ([`KnownAnswer`]), which calls no gateway and whose keys its claim
    /// finishes.
    pub at_gateway: bool,
}

impl Endpoint {
    /// The point named `name`, if keys of this endpoint may stand there: how a key row's point is
    /// read back.
    pub fn point(&self, name: &str) -> Option<RecoveryPoint> {
        let ends = [RecoveryPoint::STARTED, RecoveryPoint::FINISHED];
        ends.iter().chain(self.points).copied().find(|point| point.as_str() == name)
    }
}

/// A request about to claim its key.
pub struct NewKey<'a> {
    pub account_id: Uuid,
    pub key: &'a IdempotencyKey,
    pub endpoint: &'static Endpoint,
    pub fingerprint: Fingerprint,
    /// The validated request, stored so that a worker can re-drive it without its client.
    pub params: &'a serde_json::Value,
    /// The request claiming the key: named in the audit record of a claim.
    pub request_id: &'a RequestId,
    /// Who asks: a client, through the API, or a worker of ours (the lapse, cancelling an
    /// authorization under a key of its own). Named in every audit record the run writes.
    pub actor: Actor,
}

/// The answer of a request of the layer's other shape, one that calls no other system: known whole
/// before its key is claimed (what it makes, ids and times included, is decided in the process),
/// so that the claim inserts a new key finished with it, and its first phase writes what it makes
/// in the same statement: claimed, written and finished in one transaction (see
/// [`super::Phases::answer_with_claim`]).
#[derive(Debug, Clone)]
pub struct KnownAnswer {
    pub response: StoredResponse,
    /// What the request makes, if anything, recorded on the key (as [`Transition::Finish`]'s
    /// `made`).
    pub made: Option<Uuid>,
}

/// A final response, stored with its key and replayed byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Proof that this request holds a key, and the token that fences every write it makes.
///
/// The lock is a lease: each statement that takes or renews it sets the row's `locked_until` to
/// the database's `now()` plus the holder's lock timeout, and another driver may take the key over
/// once that has passed. The holder keeps its own estimate of the end ([`KeyLock::time_left`]),
/// counted from *before* the statement was sent: the server's `now()` is later than that, so the
/// estimate ends early, never late, and costs no round trip. It is kept on [`since_boot`], a clock
/// that goes on counting while the process is stopped or the machine suspended.
#[derive(Debug, Clone)]
pub struct KeyLock {
    pub account_id: Uuid,
    pub key_id: Uuid,
    token: Uuid,
    recovery_point: RecoveryPoint,
    resumed: bool,
    lease: Duration,
    /// When the lease ends at the earliest, on [`since_boot`].
    expires: Duration,
    /// What a worker's take changed that it gives back with the key (see [`KeyLock::hand_back`]);
    /// none for a request's claim.
    taken: Option<Taken>,
}

/// What a worker's take of a key changed on its row, besides the lock: its last run, from which
/// its backoff counts, and the nudge that made it due at once.
#[derive(Debug, Clone, Copy)]
pub(super) struct Taken {
    pub last_run_at: DateTime<Utc>,
    pub nudged_at: Option<DateTime<Utc>>,
}

/// How a phase leaves the key row, applied in the phase's own transaction.
#[derive(Debug, Clone)]
pub enum Transition {
    /// Same recovery point; the lease is renewed (a phase that is safe to re-run).
    Stay,
    /// On to the next recovery point.
    Advance(RecoveryPoint),
    /// Done: store the response, release the lock, and record when the key expires: `retention`
    /// (the finishing process's `PAYMENTS_KEY_RETENTION_SECS`) after the database's `now()`.
    /// `made`: what the key's request made (a payment, a refund), recorded on the key row and,
    /// once the reaper deletes that, in `key_resources`: a late retry is answered by it.
    Finish { response: StoredResponse, retention: Duration, made: Option<Uuid> },
}

/// Why a driver let a key go: a short code from a closed set, which the key's owner may see (the
/// key's story), and the full error, for operators only (it may name servers or database errors).
#[derive(Debug, Clone, Copy)]
pub struct Reason<'a> {
    pub code: &'a str,
    pub detail: &'a str,
}

/// A lease as its taker knows it: its token, its length, and when the statement that took it was
/// sent.
pub(super) struct Lease {
    pub token: Uuid,
    pub length: Duration,
    /// On [`since_boot`].
    pub sent: Duration,
}

impl KeyLock {
    pub(super) fn new(
        account_id: Uuid,
        key_id: Uuid,
        recovery_point: RecoveryPoint,
        resumed: bool,
        lease: Lease,
    ) -> Self {
        let Lease { token, length, sent } = lease;
        KeyLock {
            account_id,
            key_id,
            token,
            recovery_point,
            resumed,
            lease: length,
            expires: sent + length,
            taken: None,
        }
    }

    /// The lock of a key a worker took over, and what its take changed.
    pub(super) fn taken_over(self, taken: Taken) -> Self {
        KeyLock { taken: Some(taken), ..self }
    }

    /// What a worker's take of the key changed; none if a request claimed it.
    pub(super) fn taken(&self) -> Option<Taken> {
        self.taken
    }

    /// How long the lease surely lasts still. A driver about to do what it cannot take back (a
    /// gateway call) checks that this covers it: past the lease, another driver may be doing the
    /// same.
    pub fn time_left(&self) -> Duration {
        self.expires.saturating_sub(since_boot())
    }

    /// Whether an earlier run drove this key before (a retry, or a worker taking it over), so
    /// that the gateway may have charged for it already.
    pub fn resumed(&self) -> bool {
        self.resumed
    }

    /// The recovery point this request resumes at, or has reached.
    pub fn recovery_point(&self) -> RecoveryPoint {
        self.recovery_point
    }

    /// The token that fences every write of the lock's holder.
    pub(super) fn token(&self) -> &Uuid {
        &self.token
    }

    /// When the statement that last renewed the lease (the claim, or the last phase) was sent,
    /// on [`since_boot`].
    pub(super) fn renewed_at(&self) -> Duration {
        self.expires.saturating_sub(self.lease)
    }

    /// How long a lease lasts, from each statement that renews it.
    pub(super) fn lease(&self) -> Duration {
        self.lease
    }

    /// Whether the key row still carries our token: asked only when a phase wrote nothing, to
    /// tell a lost lock from a bug.
    pub(super) async fn is_held(&self, conn: &mut AsyncPgConnection) -> Result<bool, diesel::result::Error> {
        use idempotency_keys::dsl as k;
        let ours = idempotency_keys::table
            .filter(k::account_id.eq(self.account_id))
            .filter(k::id.eq(self.key_id))
            .filter(k::lock_token.eq(self.token));
        diesel::select(diesel::dsl::exists(ours)).get_result(conn).await
    }

    /// Records a committed transition, whose transaction was begun at `sent`: it renewed the
    /// lease from then on.
    pub(super) fn advance_to(&mut self, transition: &Transition, sent: Duration) {
        self.expires = sent + self.lease;
        match transition {
            Transition::Stay => {}
            Transition::Advance(point) => self.recovery_point = *point,
            Transition::Finish { .. } => self.recovery_point = RecoveryPoint::FINISHED,
        }
    }

    /// Unlocks the key at its current recovery point, so that a retry can resume at once, and
    /// records who gave it up and why, in one statement. The key's last run ends now, so a
    /// worker's backoff counts from here. Fenced: it does nothing if another request has taken the
    /// key over meanwhile.
    pub async fn release(
        &self,
        conn: &mut AsyncPgConnection,
        actor: Actor,
        reason: Reason<'_>,
        request_id: &RequestId,
    ) -> Result<(), StoreError> {
        let release = diesel::sql_query(
            "WITH released AS (
                 UPDATE idempotency_keys SET locked_until = NULL, lock_token = NULL, last_run_at = now()
                 WHERE account_id = $1 AND id = $2 AND lock_token = $3
                 RETURNING account_id, id, recovery_point
             )
             INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT account_id, 'idempotency_key.released', 'idempotency_key', id, $4,
                    jsonb_build_object('recovery_point', recovery_point, 'reason_code', $7::text,
                                       'reason', $5::text), $6
             FROM released",
        )
        .bind::<SqlUuid, _>(self.account_id)
        .bind::<SqlUuid, _>(self.key_id)
        .bind::<SqlUuid, _>(self.token)
        .bind::<Text, _>(actor.as_str())
        .bind::<Text, _>(reason.detail.chars().take(1000).collect::<String>())
        .bind::<Text, _>(request_id.as_str())
        .bind::<Text, _>(reason.code);
        db::query(release.execute(conn)).await?;
        Ok(())
    }

    /// Unlocks a key a worker took over and could not drive, as its take (`taken`) found it: the
    /// attempt it counted uncounted, its last run and its nudge as they were (a nudge since is
    /// kept), with an audit record of why, in one statement. So a worker that takes a key held
    /// where its process does not reach (see [`super::DriveError::HeldElsewhere`]) neither spends
    /// one of the key's attempts nor delays the process that does reach it. Fenced, as
    /// [`KeyLock::release`].
    pub(super) async fn hand_back(
        &self,
        conn: &mut AsyncPgConnection,
        taken: Taken,
        reason: Reason<'_>,
        request_id: &RequestId,
    ) -> Result<(), StoreError> {
        let hand_back = diesel::sql_query(
            "WITH handed_back AS (
                 UPDATE idempotency_keys
                 SET locked_until = NULL, lock_token = NULL, completer_attempts = greatest(completer_attempts - 1, 0),
                     last_run_at = $4, nudged_at = coalesce(nudged_at, $5)
                 WHERE account_id = $1 AND id = $2 AND lock_token = $3
                 RETURNING account_id, id, recovery_point
             )
             INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT account_id, 'idempotency_key.handed_back', 'idempotency_key', id, 'completer',
                    jsonb_build_object('recovery_point', recovery_point, 'reason_code', $6::text,
                                       'reason', $7::text), $8
             FROM handed_back",
        )
        .bind::<SqlUuid, _>(self.account_id)
        .bind::<SqlUuid, _>(self.key_id)
        .bind::<SqlUuid, _>(self.token)
        .bind::<Timestamptz, _>(taken.last_run_at)
        .bind::<Nullable<Timestamptz>, _>(taken.nudged_at)
        .bind::<Text, _>(reason.code)
        .bind::<Text, _>(reason.detail.chars().take(1000).collect::<String>())
        .bind::<Text, _>(request_id.as_str());
        db::query(hand_back.execute(conn)).await?;
        Ok(())
    }
}

pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
