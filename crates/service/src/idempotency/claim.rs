//! The claim: how a request takes its key, in one statement for a new key or a finished one that
//! has not expired, and two for any other (see [`claim`]).

use std::time::Duration;

use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::row::NamedRow;
use diesel::sql_types::{BigInt, Bool, Bytea, Jsonb, Nullable, SmallInt, Text, Untyped, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::clock::{Deadline, since_boot};
use super::phase::{MAX_ATTEMPTS, PhaseWrites};
use super::store::{KeyLock, KnownAnswer, Lease, NewKey, StoredResponse, millis};
use crate::db::delegate::Routing;
use crate::db::sql::{Parameters, no_parameter, split_result, walk_sql};
use crate::db::{self, StoreError};

/// What the claim found, in the order the protocol checks it; `S`, what the key's first phase
/// returns when it ran with the claim.
#[derive(Debug)]
pub enum Claim<S> {
    /// The key was used with another request body, method or path (422).
    Mismatch,
    /// The key's request finished: replay its stored response. `expires` is when the key expires,
    /// on this process's clock, so that the answer is kept in memory no longer; none for a key
    /// finished before expiries were recorded, which no process keeps in memory.
    Replay { response: StoredResponse, expires: Option<Deadline> },
    /// Another request holds the key and its lock is not stale (409).
    InFlight,
    /// We hold the key: a new one, an unlocked one, or one whose lease ran out. `started` is what
    /// the key's first phase returned if it ran with the claim (a new key's, when it was given).
    Acquired { lock: KeyLock, started: Option<S> },
    /// The claim made the key and finished it with the answer it was given ([`KnownAnswer`]), the
    /// first phase's writes with it: the request is done. `started` is what that phase returned.
    Answered { started: Option<S> },
    /// The key expired (its record past its recorded expiry, or already reaped), but what its
    /// request made on this endpoint remains (`id`: a payment, a refund): whatever the body, the
    /// request is a late retry and must not do it again. (Made on another endpoint, it is a
    /// [`Claim::Mismatch`].)
    Expired { id: Uuid },
}

/// Claims `new.key`, race-free without any check-then-insert. Most keys are new, and most of the
/// rest finished, so the claim first tries a short statement for those two ([`Shape::Short`]):
/// `inserted` and its record, with `first` after them; or `finished`, the answer of a finished key
/// that has not expired. It returns nothing if the key's row is there unfinished or expired, or
/// what a reaped key made is kept, or a concurrent request inserted the key first; then the full
/// claim runs, in one statement:
/// - `existing` reads the key's row, if any (one unique-index probe), and whether it has expired:
///   its recorded expiry has come, by the database's clock;
/// - `expired` looks, only when there is no row or an expired one, for what the key made: on its
///   row (`resource_id`, which the finishing phase wrote), or, once the reaper deleted that, in
///   `key_resources`, where the reaper kept it (and where 000033 put what older keys made). It reads the key's
///   row again for that, rather than take `existing`'s word: on Citus each step of this statement
///   may run on a snapshot of its own, and a step that saw no row could be followed by one that
///   sees the payment a concurrent claim committed with its row, and take the key, in flight, for
///   expired (`410`). Read in one step, the row and what it made are both there or both not yet.
///   An expired key is
///   answered as one since reaped would be, whoever reads it and whatever its own retention: no
///   process replays a key past its expiry, from the database or from memory. (An expired key that
///   made nothing, a refused refund's, is replayed from the database until it is reaped.)
/// - `inserted` creates the row, locked by us, when this statement's snapshot holds neither the
///   key's row nor what a reaped key made. The reaper deletes the one and writes the other in one
///   transaction, so a snapshot holds at least one of them for a key that made something: a key
///   being reaped is never taken for new. If a concurrent request inserted the key first,
///   `ON CONFLICT DO NOTHING` leaves us with no row at all and we run the statement again, which
///   then sees that request's row;
/// - `taken` locks an existing row for us if it is the same request, unfinished, and unlocked or
///   its lease over. Its conditions are re-checked on the row's latest version under the row
///   lock, so of two requests racing for an expired lease exactly one takes it;
/// - a replay never writes: a finished key skips `taken` altogether. It comes with how long the
///   key has left before it expires, by the database's clock, which is as long as a process may
///   keep the answer in memory;
/// - `key_audited` records a claim that took the key: `claimed` (new), `resumed` (unlocked: its
///   last request stopped short and let go) or `taken_over` (its lease had run out: its driver
///   died).
///
/// With `answer`, the answer of a request of the layer's other shape, `inserted` makes the key
/// finished with it (its response, its expiry `retention` from the database's `now()`, what it
/// made), unlocked: with the first phase's writes after it, the request is claimed, written and
/// finished in one transaction ([`Claim::Answered`]). A key that exists is claimed as any other,
/// and its answer is its own.
///
/// With `first`, the key's first phase (see [`super::Phases::first_phase`]) runs in the same
/// statement when the claim creates the key: its writes follow a `fence` that is the row
/// `inserted` made (after the claim's audit record, so the trail reads in order), so the key row,
/// what the phase writes and the records of both commit together, in one round trip, or not at
/// all. Its result comes back with the claim ([`Claim::Acquired`]'s `started`). For a key that
/// exists, `fence` is empty and the phase writes nothing: a resumed key runs it on its own after
/// the claim. The phase's CTEs and result columns must not reuse the claim's names (`existing`,
/// `expired`, `inserted`, `taken`, `key_audited`, `finished`, `claimed`, `fence`; columns
/// `claim_*`).
///
/// Every CTE names the account as a parameter (`account_id = $n`, never from a join), so that a
/// database distributed by account finds each of them on one shard (see docs/performance.md, Spread by
/// account on Citus).
///
/// `lease` is how long our lock lasts unless renewed: this process's lock timeout.
pub async fn claim<W, S>(
    conn: &mut AsyncPgConnection,
    routing: &Routing,
    new: &NewKey<'_>,
    lease: Duration,
    first: Option<&W>,
    answer: Option<(&KnownAnswer, Duration)>,
) -> Result<Claim<S>, StoreError>
where
    W: PhaseWrites,
    S: QueryableByName<Pg> + Send + 'static,
{
    let token = Uuid::new_v4();
    let answer = answer.map(|(answer, retention)| Answer {
        known: answer,
        status: answer.response.status as i16,
        retention_ms: millis(retention),
    });
    let mut query = ClaimQuery {
        new,
        key_id: Uuid::now_v7(),
        token,
        lease_ms: millis(lease),
        first,
        answer: answer.as_ref(),
        shape: Shape::Short,
    };
    // The short statement's finding that the key is neither new nor finished (its row, what it
    // made, or a concurrent insert that won) is not an attempt: the full claim then sees it. One
    // retry of the full claim covers a race it can still lose (a key that made nothing, reaped
    // between the two statements, and inserted again by another request before ours), and a
    // deadlock of the first phase's row locks; one more is a safety margin.
    let mut attempt = 1;
    loop {
        let sent = since_boot();
        let run = async {
            match routing.delegate(new.account_id, &query).await? {
                Some(delegated) => db::first_row(routing.run::<Claimed<S>>(delegated, conn)).await,
                None => db::first_row(query.load::<Claimed<S>>(conn)).await,
            }
        };
        match db::query(run).await {
            Ok(Some(claimed)) => return claimed.into_claim(new, token, lease, sent),
            Ok(None) if query.shape == Shape::Short => {
                query.shape = Shape::Any;
                continue;
            }
            Ok(None) if attempt < MAX_ATTEMPTS => {}
            Ok(None) => {
                return Err(StoreError::Unavailable("the key claim kept racing with concurrent inserts".into()));
            }
            Err(error) if error.is_worth_retrying() && attempt < MAX_ATTEMPTS => {
                tracing::warn!(%error, attempt, "claim conflicted with a concurrent transaction; running it again");
            }
            Err(error) => return Err(error),
        }
        attempt += 1;
    }
}

/// The columns the claim returns: enough to classify, never the stored params.
#[derive(QueryableByName)]
struct ClaimRow {
    #[diesel(sql_type = Bool, column_name = claim_acquired)]
    acquired: bool,
    /// Claimed by inserting it: no earlier run can have reached the gateway.
    #[diesel(sql_type = Bool, column_name = claim_fresh)]
    fresh: bool,
    #[diesel(sql_type = SqlUuid, column_name = claim_key_id)]
    id: Uuid,
    #[diesel(sql_type = Bool, column_name = claim_same_request)]
    same_request: bool,
    #[diesel(sql_type = Text, column_name = claim_recovery_point)]
    recovery_point: String,
    #[diesel(sql_type = Nullable<SmallInt>, column_name = claim_response_status)]
    response_status: Option<i16>,
    #[diesel(sql_type = Nullable<Bytea>, column_name = claim_response_body)]
    response_body: Option<Vec<u8>>,
    /// Set when the key's row is gone but what it made on this endpoint remains.
    #[diesel(sql_type = Nullable<SqlUuid>, column_name = claim_made_id)]
    made_id: Option<Uuid>,
    /// How long a finished key has left before it expires, by the database's clock; none if no
    /// expiry was recorded.
    #[diesel(sql_type = Nullable<BigInt>, column_name = claim_expires_in_ms)]
    expires_in_ms: Option<i64>,
    /// Whether the first phase ran with the claim, and its result's columns follow.
    #[diesel(sql_type = Nullable<Bool>, column_name = claim_started)]
    started: Option<bool>,
}

/// The claim's row, and the result of the first phase if it ran with it.
struct Claimed<S> {
    row: ClaimRow,
    started: Option<S>,
}

impl<S: QueryableByName<Pg>> QueryableByName<Pg> for Claimed<S> {
    fn build<'a>(row: &impl NamedRow<'a, Pg>) -> diesel::deserialize::Result<Self> {
        let claim = ClaimRow::build(row)?;
        let started = match claim.started {
            Some(true) => Some(S::build(row)?),
            _ => None,
        };
        Ok(Claimed { row: claim, started })
    }
}

impl<S> Claimed<S> {
    /// What the claim found, in the order the protocol checks it. `sent`: when the statement was
    /// sent, on [`since_boot`]. A key at a point its endpoint does not declare is a bug, answered
    /// as one (its lease runs out, and nothing was done under it).
    fn into_claim(
        self,
        new: &NewKey<'_>,
        token: Uuid,
        length: Duration,
        sent: Duration,
    ) -> Result<Claim<S>, StoreError> {
        let Claimed { row, started } = self;
        Ok(match row {
            ClaimRow { made_id: Some(id), .. } => Claim::Expired { id },
            ClaimRow { acquired: true, fresh: true, recovery_point, .. } if recovery_point == "finished" => {
                Claim::Answered { started }
            }
            ClaimRow { acquired: true, id, recovery_point, fresh, .. } => {
                let lease = Lease { token, length, sent };
                let Some(point) = new.endpoint.point(&recovery_point) else {
                    return Err(StoreError::Query(diesel::result::Error::QueryBuilderError(
                        format!("a key of {} at {recovery_point:?}, which it does not declare", new.endpoint.path)
                            .into(),
                    )));
                };
                Claim::Acquired { lock: KeyLock::new(new.account_id, id, point, !fresh, lease), started }
            }
            ClaimRow { same_request: false, .. } => Claim::Mismatch,
            ClaimRow { response_status: Some(status), response_body: Some(body), expires_in_ms, .. } => {
                let left = |ms: i64| Duration::from_millis(ms.try_into().unwrap_or(0));
                // Counted from before the claim was sent: it ends no later than the key does.
                let expires = expires_in_ms.map(|ms| Deadline::counted_from(sent, left(ms)));
                Claim::Replay { response: StoredResponse { status: status as u16, body }, expires }
            }
            ClaimRow { .. } => Claim::InFlight,
        })
    }
}

/// The claim statement (see [`claim`]), kept prepared on each connection by its SQL text: one
/// text per shape and endpoint's first phase, and one per shape without.
struct ClaimQuery<'a, W> {
    new: &'a NewKey<'a>,
    key_id: Uuid,
    token: Uuid,
    lease_ms: i64,
    first: Option<&'a W>,
    /// The answer a new key is inserted finished with, for a request of the other shape.
    answer: Option<&'a Answer<'a>>,
    shape: Shape,
}

/// A [`KnownAnswer`] as the claim binds it: its status as stored, and the key's retention in
/// milliseconds.
struct Answer<'a> {
    known: &'a KnownAnswer,
    status: i16,
    retention_ms: i64,
}

/// Which of the claim's two statements runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// Only what a new key and a finished one need ([`SHORT_SQL`]): tried first, as most keys
    /// are one or the other. Its plan has half the nodes of the full claim's, which every
    /// execution initialises whole.
    Short,
    /// The full claim ([`CLAIM_SQL`]): every case the protocol names.
    Any,
}

// Run as often as the claim is, so copied: all it holds are references and ids.
impl<W> Clone for ClaimQuery<'_, W> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<W> Copy for ClaimQuery<'_, W> {}

/// `inserted`, the CTE that creates a new key's row, locked by us, in both of the claim's
/// statements (as `short_claim!` and `full_claim!` make them); `inserted_answered!` makes it
/// finished instead.
macro_rules! inserted {
    () => {
        "inserted AS (
    INSERT INTO {idempotency_keys} (id, account_id, idempotency_key, request_method, request_path,
                                  request_fingerprint, request_params, locked_until, lock_token)
    SELECT {key_id}, {account}, {key}, {method}, {path}, {fingerprint}, {params},
           now() + {lease_ms} * interval '1 millisecond', {token}
    WHERE NOT EXISTS (SELECT FROM {idempotency_keys k} WHERE k.account_id = {account} AND k.idempotency_key = {key})
      AND NOT EXISTS (SELECT FROM {key_resources r} WHERE r.account_id = {account} AND r.idempotency_key = {key})
    ON CONFLICT (account_id, idempotency_key) DO NOTHING
    RETURNING account_id, id, recovery_point
)"
    };
}

/// `inserted` for a request of the other shape: the new key's row finished with the answer the
/// request knows ([`KnownAnswer`]), as the finishing phase would leave it, never locked; and only
/// where the first phase's requirement holds (its writes find what they write to).
macro_rules! inserted_answered {
    () => {
        "inserted AS (
    INSERT INTO {idempotency_keys} (id, account_id, idempotency_key, request_method, request_path,
                                  request_fingerprint, request_params, recovery_point, finished_at,
                                  response_status, response_body, expires_at, resource_id)
    SELECT {key_id}, {account}, {key}, {method}, {path}, {fingerprint}, {params}, 'finished', now(),
           {answer.status}, {answer.body}, now() + {answer.retention_ms} * interval '1 millisecond', {answer.made}
    WHERE NOT EXISTS (SELECT FROM {idempotency_keys k} WHERE k.account_id = {account} AND k.idempotency_key = {key})
      AND NOT EXISTS (SELECT FROM {key_resources r} WHERE r.account_id = {account} AND r.idempotency_key = {key}){answer.requirement}
    ON CONFLICT (account_id, idempotency_key) DO NOTHING
    RETURNING account_id, id, recovery_point
)"
    };
}

/// The short claim's CTEs, with `inserted` as `$inserted` makes it: a new key's row and its
/// record; or a finished key's answer, while it has not expired (`finished`: for a replay, or a
/// `422`); or nothing.
macro_rules! short_claim {
    ($inserted:expr) => {
        concat!(
            "
",
            $inserted,
            ", key_audited AS (
    INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
    SELECT {account}, 'idempotency_key.claimed', 'idempotency_key', n.id, {actor}, jsonb_build_object(), {request_id}
    FROM inserted n
    RETURNING id
), finished AS (
    SELECT k.id, k.request_fingerprint = {fingerprint} AND k.request_method = {method} AND k.request_path = {path}
               AS same_request,
           k.response_status, k.response_body, (extract(epoch FROM k.expires_at - now()) * 1000)::bigint AS expires_in_ms
    FROM {idempotency_keys k}
    WHERE k.account_id = {account} AND k.idempotency_key = {key}
      AND k.recovery_point = 'finished' AND coalesce(k.expires_at > now(), true)
), claimed (claim_acquired, claim_fresh, claim_key_id, claim_same_request, claim_recovery_point,
            claim_response_status, claim_response_body, claim_made_id, claim_expires_in_ms) AS (
    SELECT true, true, id, true, recovery_point, NULL::smallint, NULL::bytea, NULL::uuid, NULL::bigint
    FROM inserted
    UNION ALL
    SELECT false, false, id, same_request, 'finished', response_status, response_body, NULL, expires_in_ms
    FROM finished
)"
        )
    };
}

/// The short claim (see [`Shape::Short`]).
const SHORT_SQL: &str = short_claim!(inserted!());
/// The short claim of a request of the other shape.
const SHORT_ANSWERED_SQL: &str = short_claim!(inserted_answered!());

/// The full claim's CTEs, with `inserted` as `$inserted` makes it, each `{name}` a parameter or a
/// distributed table (see [`crate::db::sql`]).
macro_rules! full_claim {
    ($inserted:expr) => {
        concat!(
            "
existing AS (
    SELECT k.*, coalesce(k.expires_at <= now(), false) AS expired FROM {idempotency_keys k}
    WHERE k.account_id = {account} AND k.idempotency_key = {key}
), expired AS (
    SELECT m.id, m.request_method = {method} AND m.request_path = {path} AS same_endpoint
    FROM (SELECT k.resource_id AS id, k.request_method, k.request_path FROM {idempotency_keys k}
          WHERE k.account_id = {account} AND k.idempotency_key = {key}
          UNION ALL
          SELECT r.resource_id, r.request_method, r.request_path FROM {key_resources r}
          WHERE r.account_id = {account} AND r.idempotency_key = {key}) m
    WHERE m.id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM {idempotency_keys k}
                      WHERE k.account_id = {account} AND k.idempotency_key = {key}
                        AND (k.expires_at IS NULL OR k.expires_at > now()))
    LIMIT 1
), ",
            $inserted,
            ", taken AS (
    UPDATE {idempotency_keys k}
    SET locked_until = now() + {lease_ms} * interval '1 millisecond', lock_token = {token}, last_run_at = now()
    WHERE k.account_id = {account} AND k.idempotency_key = {key}
      AND EXISTS (SELECT FROM existing WHERE recovery_point <> 'finished')
      AND k.request_fingerprint = {fingerprint} AND k.request_method = {method} AND k.request_path = {path}
      AND k.recovery_point <> 'finished'
      AND (k.locked_until IS NULL OR k.locked_until < now())
    RETURNING k.id, k.recovery_point
), key_audited AS (
    INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
    SELECT {account}, 'idempotency_key.claimed', 'idempotency_key', n.id, {actor}, jsonb_build_object(), {request_id}
    FROM inserted n
    UNION ALL
    SELECT {account},
           CASE WHEN e.locked_until IS NULL THEN 'idempotency_key.resumed' ELSE 'idempotency_key.taken_over' END,
           'idempotency_key', t.id, {actor}, jsonb_build_object('recovery_point', t.recovery_point), {request_id}
    FROM taken t, existing e
    RETURNING id
), claimed (claim_acquired, claim_fresh, claim_key_id, claim_same_request, claim_recovery_point,
            claim_response_status, claim_response_body, claim_made_id, claim_expires_in_ms) AS (
    SELECT true, true, id, true, recovery_point, NULL::smallint, NULL::bytea, NULL::uuid, NULL::bigint
    FROM inserted
    UNION ALL
    SELECT true, false, id, true, recovery_point, NULL, NULL, NULL, NULL
    FROM taken
    UNION ALL
    SELECT false, false, e.id,
           e.request_fingerprint = {fingerprint} AND e.request_method = {method} AND e.request_path = {path},
           e.recovery_point, e.response_status, e.response_body, NULL,
           (extract(epoch FROM e.expires_at - now()) * 1000)::bigint
    FROM existing e
    WHERE NOT EXISTS (SELECT FROM taken) AND NOT (e.expired AND EXISTS (SELECT FROM expired))
    UNION ALL
    SELECT false, false, x.id, x.same_endpoint, 'finished', NULL, NULL, CASE WHEN x.same_endpoint THEN x.id END, NULL
    FROM expired x
)"
        )
    };
}

/// The full claim (see [`Shape::Any`]).
const CLAIM_SQL: &str = full_claim!(inserted!());
/// The full claim of a request of the other shape.
const CLAIM_ANSWERED_SQL: &str = full_claim!(inserted_answered!());

impl<W: PhaseWrites> Parameters for ClaimQuery<'_, W> {
    fn walk_parameter<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let new = self.new;
        match name {
            "account" => out.push_bind_param::<SqlUuid, _>(&new.account_id),
            "key" => out.push_bind_param::<Text, _>(new.key.as_str()),
            "key_id" => out.push_bind_param::<SqlUuid, _>(&self.key_id),
            "method" => out.push_bind_param::<Text, _>(new.endpoint.method),
            "path" => out.push_bind_param::<Text, _>(new.endpoint.path),
            "fingerprint" => out.push_bind_param::<Bytea, _>(new.fingerprint.as_bytes()),
            "params" => out.push_bind_param::<Jsonb, _>(new.params),
            "token" => out.push_bind_param::<SqlUuid, _>(&self.token),
            "lease_ms" => out.push_bind_param::<BigInt, _>(&self.lease_ms),
            "request_id" => out.push_bind_param::<Text, _>(new.request_id.as_str()),
            "actor" => out.push_bind_param::<Text, _>(new.actor.as_str()),
            // What the first phase's writes require holds before the key is inserted finished:
            // a key is never finished with an answer whose writes found nothing to write to.
            "answer.requirement" => match self.first {
                Some(first) => walk_sql(first.requirement(), first, out),
                None => Ok(()),
            },
            "answer.status" | "answer.body" | "answer.retention_ms" | "answer.made" => {
                let answer = self.answer.ok_or_else(|| no_parameter(name))?;
                match name {
                    "answer.status" => out.push_bind_param::<SmallInt, _>(&answer.status),
                    "answer.body" => out.push_bind_param::<Bytea, _>(&answer.known.response.body),
                    "answer.retention_ms" => out.push_bind_param::<BigInt, _>(&answer.retention_ms),
                    _ => out.push_bind_param::<Nullable<SqlUuid>, _>(&answer.known.made),
                }
            }
            other => Err(no_parameter(other)),
        }
    }
}

impl<W: PhaseWrites> QueryFragment<Pg> for ClaimQuery<'_, W> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("WITH ");
        let ctes = match (self.shape, self.answer.is_some()) {
            (Shape::Short, false) => SHORT_SQL,
            (Shape::Short, true) => SHORT_ANSWERED_SQL,
            (Shape::Any, false) => CLAIM_SQL,
            (Shape::Any, true) => CLAIM_ANSWERED_SQL,
        };
        walk_sql(ctes, self, out.reborrow())?;
        let Some(first) = self.first else {
            out.push_sql(" SELECT *, NULL::boolean AS claim_started FROM claimed");
            return Ok(());
        };
        let (writes, result) = split_result(first.sql())
            .ok_or_else(|| diesel::result::Error::QueryBuilderError("a phase's SQL without its result".into()))?;
        // The first phase's fence: the row `inserted` made, once the claim's record is written.
        out.push_sql(", fence AS (SELECT account_id, id FROM inserted WHERE EXISTS (SELECT FROM key_audited)");
        walk_sql(first.requirement(), first, out.reborrow())?;
        out.push_sql("), ");
        walk_sql(writes, first, out.reborrow())?;
        out.push_sql(" SELECT c.*, f.* FROM claimed c LEFT JOIN (SELECT true AS claim_started, r.* FROM (");
        walk_sql(result, first, out.reborrow())?;
        out.push_sql(") r) f ON c.claim_fresh");
        Ok(())
    }
}

impl<W> QueryId for ClaimQuery<'_, W> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<W> Query for ClaimQuery<'_, W> {
    type SqlType = Untyped;
}
