//! The key row's life: claimed, moved from phase to phase under a fenced lock, finished, released.

use std::time::Duration;

use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Bool, Bytea, Jsonb, Nullable, SmallInt, Text, Untyped, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::clock::{Deadline, since_boot};
use super::{Fingerprint, IdempotencyKey, RecoveryPoint};
use crate::audit::Actor;
use crate::db::schema::idempotency_keys;
use crate::db::{self, StoreError};
use crate::metrics::KeyEndpoint;
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
pub const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// An endpoint whose requests are made safe to retry by keys: each key is bound to the endpoint
/// it was first used on (on another, it is a mismatch).
#[derive(Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub method: &'static str,
    pub path: &'static str,
    /// How metrics name it.
    pub label: KeyEndpoint,
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
}

/// What the claim found, in the order the protocol checks it.
#[derive(Debug)]
pub enum Claim {
    /// The key was used with another request body, method or path (422).
    Mismatch,
    /// The key's request finished: replay its stored response. `expires` is when the key expires,
    /// on this process's clock, so that the answer is kept in memory no longer; none for a key
    /// finished before expiries were recorded, which no process keeps in memory.
    Replay { response: StoredResponse, expires: Option<Deadline> },
    /// Another request holds the key and its lock is not stale (409).
    InFlight,
    /// We hold the key: a new one, an unlocked one, or one whose lease ran out.
    Acquired(KeyLock),
    /// The key expired (its record past its recorded expiry, or already reaped), but what its
    /// request made on this endpoint remains (`id`: a payment, a refund): whatever the body, the
    /// request is a late retry and must not do it again. (Made on another endpoint, it is a
    /// [`Claim::Mismatch`].)
    Expired { id: Uuid },
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
    Finish { response: StoredResponse, retention: Duration },
}

/// Claims `new.key` in one statement, which is race-free without any check-then-insert:
/// - `existing` reads the key's row, if any (one unique-index probe), and whether it has expired:
///   its recorded expiry has come, by the database's clock;
/// - `expired` looks, only when there is no row or an expired one, for what the key made (the view
///   `made_by_keys`: a probe of each endpoint's table by its unique client key). An expired key is
///   answered as one since reaped would be, whoever reads it and whatever its own retention: no
///   process replays a key past its expiry, from the database or from memory. (An expired key that
///   made nothing, a refused refund's, is replayed from the database until it is reaped.)
/// - `inserted` creates the row, locked by us, when there was neither. If a concurrent request
///   inserted it first, `ON CONFLICT DO NOTHING` leaves us with no row at all and we run the
///   statement again, which then sees that request's row;
/// - `taken` locks an existing row for us if it is the same request, unfinished, and unlocked or
///   its lease over. Its conditions are re-checked on the row's latest version under the row
///   lock, so of two requests racing for an expired lease exactly one takes it;
/// - a replay never writes: a finished key skips `taken` altogether. It comes with how long the
///   key has left before it expires, by the database's clock, which is as long as a process may
///   keep the answer in memory;
/// - `audited` records a claim that took the key: `claimed` (new), `resumed` (unlocked: its last
///   request stopped short and let go) or `taken_over` (its lease had run out: its driver died).
///
/// `lease` is how long our lock lasts unless renewed: this process's lock timeout.
pub async fn claim(conn: &mut AsyncPgConnection, new: &NewKey<'_>, lease: Duration) -> Result<Claim, StoreError> {
    let token = Uuid::new_v4();
    let query = ClaimQuery { new, key_id: Uuid::now_v7(), token, lease_ms: millis(lease) };
    // One retry covers the one race (both inserting a new key); two more are a safety margin. (An
    // expired key without its payment would also return nothing, but the finishing phase requires
    // the payment, and payments are never deleted.)
    for _ in 0..3 {
        let sent = since_boot();
        let Some(row) = db::query(async { query.get_result::<ClaimRow>(conn).await.optional() }).await? else {
            continue;
        };
        return Ok(match row {
            ClaimRow { made_id: Some(id), .. } => Claim::Expired { id },
            ClaimRow { claimed: true, id, recovery_point, fresh, .. } => {
                let lease = Lease { token, length: lease, sent };
                Claim::Acquired(KeyLock::new(new.account_id, id, recovery_point, !fresh, lease))
            }
            ClaimRow { same_request: false, .. } => Claim::Mismatch,
            ClaimRow { response_status: Some(status), response_body: Some(body), expires_in_ms, .. } => {
                let left = |ms: i64| Duration::from_millis(ms.try_into().unwrap_or(0));
                // Counted from before the claim was sent: it ends no later than the key does.
                let expires = expires_in_ms.map(|ms| Deadline::counted_from(sent, left(ms)));
                Claim::Replay { response: StoredResponse { status: status as u16, body }, expires }
            }
            ClaimRow { .. } => Claim::InFlight,
        });
    }
    Err(StoreError::Unavailable("the key claim kept racing with concurrent inserts".into()))
}

/// The reason code of a key whose gateway reported something other than what the key recorded.
/// A worker's giving up is made moot when the key is finished after all (its client retried);
/// this is about the outcome itself, so finishing the key keeps it flagged for a person.
pub const GATEWAY_DISAGREEMENT: &str = "gateway_disagreement";

/// The attention reason stored on such a key: the code first, which is how its finish tells it
/// from a worker's giving up, then what the gateway said.
pub fn disagreement_reason(detail: &str) -> String {
    format!("{GATEWAY_DISAGREEMENT}: {detail}")
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
        KeyLock { account_id, key_id, token, recovery_point, resumed, lease: length, expires: sent + length }
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
            Transition::Finish { .. } => self.recovery_point = RecoveryPoint::Finished,
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
}

pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The columns the claim returns: enough to classify, never the stored params.
#[derive(QueryableByName)]
struct ClaimRow {
    #[diesel(sql_type = Bool)]
    claimed: bool,
    /// Claimed by inserting it: no earlier run can have reached the gateway.
    #[diesel(sql_type = Bool)]
    fresh: bool,
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = Bool)]
    same_request: bool,
    #[diesel(sql_type = Text)]
    recovery_point: RecoveryPoint,
    #[diesel(sql_type = Nullable<SmallInt>)]
    response_status: Option<i16>,
    #[diesel(sql_type = Nullable<Bytea>)]
    response_body: Option<Vec<u8>>,
    /// Set when the key's row is gone but what it made on this endpoint remains.
    #[diesel(sql_type = Nullable<SqlUuid>)]
    made_id: Option<Uuid>,
    /// How long a finished key has left before it expires, by the database's clock; none if no
    /// expiry was recorded.
    #[diesel(sql_type = Nullable<BigInt>)]
    expires_in_ms: Option<i64>,
}

/// The claim statement. A type of its own (rather than `sql_query`) so that diesel prepares it
/// once per connection: its SQL never changes, and its static query id says so.
#[derive(Clone, Copy)]
struct ClaimQuery<'a> {
    new: &'a NewKey<'a>,
    key_id: Uuid,
    token: Uuid,
    lease_ms: i64,
}

/// Everything after the parameters, which are bound once, by name, in the `input` row.
const CLAIM_SQL: &str = "
), existing AS (
    SELECT k.*, coalesce(k.expires_at <= now(), false) AS expired FROM idempotency_keys k, input i
    WHERE k.account_id = i.account_id AND k.idempotency_key = i.idempotency_key
), expired AS (
    SELECT m.id, m.request_method = i.method AND m.request_path = i.path AS same_endpoint
    FROM made_by_keys m, input i
    WHERE (NOT EXISTS (SELECT FROM existing) OR EXISTS (SELECT FROM existing WHERE expired))
      AND m.account_id = i.account_id AND m.idempotency_key = i.idempotency_key
), inserted AS (
    INSERT INTO idempotency_keys (id, account_id, idempotency_key, request_method, request_path,
                                  request_fingerprint, request_params, locked_until, lock_token)
    SELECT i.key_id, i.account_id, i.idempotency_key, i.method, i.path,
           i.fingerprint, i.params, now() + i.lease_ms * interval '1 millisecond', i.token
    FROM input i
    WHERE NOT EXISTS (SELECT FROM existing) AND NOT EXISTS (SELECT FROM expired)
    ON CONFLICT (account_id, idempotency_key) DO NOTHING
    RETURNING *
), taken AS (
    UPDATE idempotency_keys k
    SET locked_until = now() + i.lease_ms * interval '1 millisecond', lock_token = i.token, last_run_at = now()
    FROM input i
    WHERE EXISTS (SELECT FROM existing WHERE recovery_point <> 'finished')
      AND k.account_id = i.account_id AND k.idempotency_key = i.idempotency_key
      AND k.request_fingerprint = i.fingerprint
      AND k.request_method = i.method AND k.request_path = i.path
      AND k.recovery_point <> 'finished'
      AND (k.locked_until IS NULL OR k.locked_until < now())
    RETURNING k.*
), audited AS (
    INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data, request_id)
    SELECT n.account_id, 'idempotency_key.claimed', 'idempotency_key', n.id, 'api', '{}', i.request_id
    FROM inserted n, input i
    UNION ALL
    SELECT t.account_id,
           CASE WHEN e.locked_until IS NULL THEN 'idempotency_key.resumed' ELSE 'idempotency_key.taken_over' END,
           'idempotency_key', t.id, 'api', jsonb_build_object('recovery_point', t.recovery_point), i.request_id
    FROM taken t, existing e, input i
)
SELECT true AS claimed, true AS fresh, id, true AS same_request, recovery_point, response_status, response_body,
       NULL::uuid AS made_id, NULL::bigint AS expires_in_ms
FROM inserted
UNION ALL
SELECT true, false, id, true, recovery_point, response_status, response_body, NULL, NULL
FROM taken
UNION ALL
SELECT false, false, e.id,
       e.request_fingerprint = i.fingerprint AND e.request_method = i.method AND e.request_path = i.path,
       e.recovery_point, e.response_status, e.response_body, NULL,
       (extract(epoch FROM e.expires_at - now()) * 1000)::bigint
FROM existing e, input i
WHERE NOT EXISTS (SELECT FROM taken) AND NOT (e.expired AND EXISTS (SELECT FROM expired))
UNION ALL
SELECT false, false, x.id, x.same_endpoint, 'finished', NULL, NULL, CASE WHEN x.same_endpoint THEN x.id END, NULL
FROM expired x";

impl QueryFragment<Pg> for ClaimQuery<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let new = self.new;
        out.push_sql(
            "WITH input (account_id, idempotency_key, key_id, method, path, fingerprint, params, \
             token, lease_ms, request_id) AS (VALUES (",
        );
        out.push_bind_param::<SqlUuid, _>(&new.account_id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(new.key.as_str())?;
        out.push_sql(", ");
        out.push_bind_param::<SqlUuid, _>(&self.key_id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(new.endpoint.method)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(new.endpoint.path)?;
        out.push_sql(", ");
        out.push_bind_param::<Bytea, _>(new.fingerprint.as_bytes())?;
        out.push_sql(", ");
        out.push_bind_param::<Jsonb, _>(new.params)?;
        out.push_sql(", ");
        out.push_bind_param::<SqlUuid, _>(&self.token)?;
        out.push_sql(", ");
        out.push_bind_param::<BigInt, _>(&self.lease_ms)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(new.request_id.as_str())?;
        out.push_sql(")");
        out.push_sql(CLAIM_SQL);
        Ok(())
    }
}

impl QueryId for ClaimQuery<'_> {
    type QueryId = ClaimQuery<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl Query for ClaimQuery<'_> {
    type SqlType = Untyped;
}
