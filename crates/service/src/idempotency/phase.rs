//! `atomic_phase`: the one way a request changes its key row, one statement per phase.

use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Bytea, Nullable, SmallInt, Text, Untyped, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::clock::since_boot;
use super::store::{KeyLock, Transition, millis};
use crate::db::delegate::Routing;
use crate::db::sql::{Parameters, no_parameter, walk_sql};
use crate::db::{self, StoreError};

/// How often a phase runs before a serialization failure or deadlock is given up on. Such
/// conflicts are rare (phases lock the key row first-come-first-served) and the transaction
/// rolled back, so running it again is always safe.
pub const MAX_ATTEMPTS: u32 = 3;

/// Why a phase did not commit.
#[derive(Debug, thiserror::Error)]
pub enum PhaseError {
    /// Our lock went stale and another request took the key over; nothing was written.
    #[error("another request took over this idempotency key")]
    LockLost,
    /// The key's rows contradict each other: a bug, never the client's doing.
    #[error("inconsistent state: {0}")]
    Inconsistent(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<diesel::result::Error> for PhaseError {
    fn from(error: diesel::result::Error) -> Self {
        PhaseError::Store(error.into())
    }
}

/// Runs one atomic phase: the phase's `writes` and the key row's [`Transition`] in one statement,
/// which PostgreSQL runs as one transaction (one round trip, one commit), or not at all.
///
/// The statement is `WITH fence AS (<the transition>), <writes>`. The fence moves the key row only
/// while it still carries our lock token and the writes' [`PhaseWrites::walk_requirement`] holds,
/// and returns it (`account_id`, `id`), or nothing. `writes` are further CTEs that each take their
/// rows from `fence` (or from a CTE that did), so that they write nothing without it, then a
/// final `SELECT` returning one row: the phase's result, `R`. (Every CTE of a statement runs to
/// its end whatever the others do, so a write that found nothing could not undo the fence: what a
/// write needs to find, the fence requires.) No row back means nothing was written: the lock was
/// lost ([`PhaseError::LockLost`]), or, if we still hold it, the requirement failed, which is a
/// bug. A serialization failure, a deadlock or a check failed on a row changed meanwhile (see
/// [`StoreError::is_worth_retrying`]) runs the phase again, up to [`MAX_ATTEMPTS`] times.
pub async fn atomic_phase<W, R>(
    conn: &mut AsyncPgConnection,
    routing: &Routing,
    lock: &mut KeyLock,
    transition: Transition,
    writes: W,
) -> Result<R, PhaseError>
where
    W: PhaseWrites,
    R: QueryableByName<Pg> + Send + 'static,
{
    let mut attempt = 1;
    loop {
        // Before the statement: the lease it renews counts from the server's `now()`, later.
        let sent = since_boot();
        let statement = PhaseStatement { fence: Fence::new(lock, &transition, &writes), writes: &writes };
        let run = async {
            match routing.delegate(lock.account_id, &statement).await? {
                Some(delegated) => db::first_row(routing.run::<R>(delegated, conn)).await,
                None => db::first_row(statement.load::<R>(conn)).await,
            }
        };
        match db::query(run).await {
            Ok(Some(result)) => {
                lock.advance_to(&transition, sent);
                return Ok(result);
            }
            Ok(None) => {
                return Err(match db::query(lock.is_held(conn)).await? {
                    false => PhaseError::LockLost,
                    true => PhaseError::Inconsistent("a phase did not find what it writes to".into()),
                });
            }
            Err(error) if error.is_worth_retrying() && attempt < MAX_ATTEMPTS => {
                tracing::warn!(%error, attempt, "phase conflicted with a concurrent transaction; running it again");
                attempt += 1;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// What a phase writes besides the key row: one SQL literal with named placeholders (see
/// [`crate::db::sql`]), its values bound by the phase's [`Parameters`].
pub trait PhaseWrites: Parameters + Send + Sync {
    /// The phase's SQL after the `fence` CTE: its own CTEs (`name AS (...)`, each taking its rows
    /// from `fence` or from a CTE that did, so that nothing is written once the lock is lost),
    /// then the `SELECT` of its result: one row, or none when `fence` has none. The claim runs a
    /// key's first phase in its own statement, after a fence of its own (see [`super::claim`]).
    fn sql(&self) -> &'static str;

    /// What the fence requires besides our lock, as SQL (` AND <condition>`): that the rows the
    /// writes change exist. None by default.
    fn requirement(&self) -> &'static str {
        ""
    }

    /// What finishing the key does to a flag a person was to look at (`SET` items for
    /// `needs_attention_at` and `attention_reason`). By default it clears it: a worker's giving up
    /// on a key is moot once its client's retry finished it after all. An endpoint whose keys are
    /// flagged for what a finish does not settle says so in its finishing phase.
    fn attention_on_finish(&self) -> &'static str {
        CLEARS_ATTENTION
    }
}

/// See [`PhaseWrites::attention_on_finish`].
pub const CLEARS_ATTENTION: &str = "needs_attention_at = NULL, attention_reason = NULL";

/// A phase's one statement: see [`atomic_phase`]. Kept prepared on each connection by its SQL
/// text: one text per phase.
struct PhaseStatement<'a, W> {
    fence: Fence<'a, W>,
    writes: &'a W,
}

impl<W: PhaseWrites> QueryFragment<Pg> for PhaseStatement<'_, W> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("WITH ");
        walk_sql(self.fence.sql(), &self.fence, out.reborrow())?;
        out.push_sql(", ");
        walk_sql(self.writes.sql(), self.writes, out)
    }
}

impl<W> QueryId for PhaseStatement<'_, W> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<W> Query for PhaseStatement<'_, W> {
    type SqlType = Untyped;
}

/// The key row's transitions, as the `fence` CTE of a phase's statement: each moves the row only
/// while it still carries our lock token (and the writes' requirement holds), returning its
/// `account_id` and `id`, or nothing once the lock went stale and another request took the key
/// over. Staying or advancing renews the lease; finishing stores the response, sets the key's one
/// expiry (which every process and the reaper go by), unlocks it, and records what the key made
/// (`resource_id`: the claim answers a late retry of an expired key by it, and the reaper keeps it
/// in `key_resources` when it deletes the row; see [`super::claim`]).
const STAY: &str = "fence AS (
    UPDATE {idempotency_keys} SET locked_until = now() + {lease_ms} * interval '1 millisecond'
    WHERE account_id = {key.account} AND id = {key.id} AND lock_token = {key.token}{requirement}
    RETURNING account_id, id
)";
const ADVANCE: &str = "fence AS (
    UPDATE {idempotency_keys}
    SET recovery_point = {recovery_point}, locked_until = now() + {lease_ms} * interval '1 millisecond'
    WHERE account_id = {key.account} AND id = {key.id} AND lock_token = {key.token}{requirement}
    RETURNING account_id, id
)";
const FINISH: &str = "fence AS (
    UPDATE {idempotency_keys}
    SET recovery_point = 'finished', finished_at = now(), response_status = {status}, response_body = {body},
        expires_at = now() + {retention_ms} * interval '1 millisecond', locked_until = NULL, lock_token = NULL,
        resource_id = {made}, {attention}
    WHERE account_id = {key.account} AND id = {key.id} AND lock_token = {key.token}{requirement}
    RETURNING account_id, id
)";

/// The fence of a phase: the key row's `transition`, under our lock, with the writes' requirement.
struct Fence<'a, W> {
    lock: &'a KeyLock,
    transition: &'a Transition,
    /// The phase's writes, whose requirement the fence adds to its own.
    writes: &'a W,
    lease_ms: i64,
    /// The response's status, as stored, and how long the key is kept after it finishes, in
    /// milliseconds (with [`Transition::Finish`]).
    status: i16,
    retention_ms: i64,
}

impl<'a, W> Fence<'a, W> {
    fn new(lock: &'a KeyLock, transition: &'a Transition, writes: &'a W) -> Self {
        let (status, retention_ms) = match transition {
            Transition::Finish { response, retention, .. } => (response.status as i16, millis(*retention)),
            _ => (0, 0),
        };
        Fence { lock, transition, writes, lease_ms: millis(lock.lease()), status, retention_ms }
    }

    fn sql(&self) -> &'static str {
        match self.transition {
            Transition::Stay => STAY,
            Transition::Advance(_) => ADVANCE,
            Transition::Finish { .. } => FINISH,
        }
    }
}

impl<W: PhaseWrites> Parameters for Fence<'_, W> {
    fn walk_parameter<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let lock = self.lock;
        match (name, self.transition) {
            ("key.account", _) => out.push_bind_param::<SqlUuid, _>(&lock.account_id),
            ("key.id", _) => out.push_bind_param::<SqlUuid, _>(&lock.key_id),
            ("key.token", _) => out.push_bind_param::<SqlUuid, _>(lock.token()),
            ("lease_ms", _) => out.push_bind_param::<BigInt, _>(&self.lease_ms),
            ("recovery_point", Transition::Advance(point)) => out.push_bind_param::<Text, _>(point),
            ("status", _) => out.push_bind_param::<SmallInt, _>(&self.status),
            ("body", Transition::Finish { response, .. }) => out.push_bind_param::<Bytea, _>(&response.body),
            ("retention_ms", _) => out.push_bind_param::<BigInt, _>(&self.retention_ms),
            ("made", Transition::Finish { made, .. }) => out.push_bind_param::<Nullable<SqlUuid>, _>(made),
            ("requirement", _) => walk_sql(self.writes.requirement(), self.writes, out),
            ("attention", _) => {
                out.push_sql(self.writes.attention_on_finish());
                Ok(())
            }
            (name, _) => Err(no_parameter(name)),
        }
    }
}
