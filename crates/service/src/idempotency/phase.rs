//! `atomic_phase`: the one way a request changes its key row, one statement per phase.

use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Bytea, SmallInt, Text, Untyped, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::clock::since_boot;
use super::store::{GATEWAY_REPORTED_LIKE, KeyLock, Transition, millis};
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
/// bug. A serialization failure or deadlock runs the phase again, up to [`MAX_ATTEMPTS`] times.
pub async fn atomic_phase<W, R>(
    conn: &mut AsyncPgConnection,
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
        match db::query(async { statement.get_result::<R>(conn).await.optional() }).await {
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
            Err(StoreError::Conflict(error)) if attempt < MAX_ATTEMPTS => {
                tracing::warn!(%error, attempt, "phase conflicted with a concurrent transaction; running it again");
                attempt += 1;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// What a phase writes besides the key row: the CTEs of its statement after `fence`, and its
/// final `SELECT` (see [`atomic_phase`]). Kept apart, so that a key's first phase can also run in
/// the claim's statement, after a fence of its own (see [`super::claim`]).
pub trait PhaseWrites: Send + Sync {
    /// The CTEs after `fence`, as `name AS (...)`, separated by commas.
    fn walk_writes<'b>(&'b self, out: AstPass<'_, 'b, Pg>) -> QueryResult<()>;

    /// The phase's result: a `SELECT` of one row, or of none when `fence` has none.
    fn walk_result<'b>(&'b self, out: AstPass<'_, 'b, Pg>) -> QueryResult<()>;

    /// What the fence requires besides our lock, as ` AND <condition>`: that the rows the writes
    /// change exist. None by default.
    fn walk_requirement<'b>(&'b self, out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let _ = out;
        Ok(())
    }
}

/// A phase's one statement: see [`atomic_phase`]. Kept prepared on each connection when its parts
/// are safe to (ours are: one SQL text per phase), keyed by its SQL text.
struct PhaseStatement<'a, W> {
    fence: Fence<'a, W>,
    writes: &'a W,
}

impl<W: PhaseWrites> QueryFragment<Pg> for PhaseStatement<'_, W> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("WITH ");
        self.fence.walk_ast(out.reborrow())?;
        out.push_sql(", ");
        self.writes.walk_writes(out.reborrow())?;
        out.push_sql(" ");
        self.writes.walk_result(out.reborrow())
    }
}

impl<W> QueryId for PhaseStatement<'_, W> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<W> Query for PhaseStatement<'_, W> {
    type SqlType = Untyped;
}

/// The key row's `transition` as the `fence` CTE of a phase's statement: an `UPDATE` of the row
/// only while it still carries the lock's token (and the writes' requirement holds), returning its
/// `account_id` and `id`, or nothing once the lock went stale and another request took the key over.
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
            Transition::Finish { response, retention } => (response.status as i16, millis(*retention)),
            _ => (0, 0),
        };
        Fence { lock, transition, writes, lease_ms: millis(lock.lease()), status, retention_ms }
    }
}

impl<W: PhaseWrites> QueryFragment<Pg> for Fence<'_, W> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let lock = self.lock;
        out.push_sql("fence AS (UPDATE idempotency_keys SET ");
        match self.transition {
            Transition::Stay => {}
            Transition::Advance(point) => {
                out.push_sql("recovery_point = ");
                out.push_bind_param::<Text, _>(point)?;
                out.push_sql(", ");
            }
            Transition::Finish { response, .. } => {
                out.push_sql("recovery_point = 'finished', finished_at = now(), response_status = ");
                out.push_bind_param::<SmallInt, _>(&self.status)?;
                out.push_sql(", response_body = ");
                out.push_bind_param::<Bytea, _>(&response.body)?;
                // The key's one expiry, which every process and the reaper go by.
                out.push_sql(", expires_at = now() + ");
                out.push_bind_param::<BigInt, _>(&self.retention_ms)?;
                out.push_sql(" * interval '1 millisecond'");
                // Unlocked; and a key a worker gave up on may still be finished by its client's
                // retry, which makes the giving up moot. What the gateway reported (a
                // disagreement, an event it could not read) is not.
                out.push_sql(&format!(
                    ", locked_until = NULL, lock_token = NULL, \
                     needs_attention_at = CASE WHEN attention_reason LIKE '{GATEWAY_REPORTED_LIKE}' THEN needs_attention_at END, \
                     attention_reason = CASE WHEN attention_reason LIKE '{GATEWAY_REPORTED_LIKE}' THEN attention_reason END"
                ));
            }
        }
        if !matches!(self.transition, Transition::Finish { .. }) {
            out.push_sql("locked_until = now() + ");
            out.push_bind_param::<BigInt, _>(&self.lease_ms)?;
            out.push_sql(" * interval '1 millisecond'");
        }
        out.push_sql(" WHERE account_id = ");
        out.push_bind_param::<SqlUuid, _>(&lock.account_id)?;
        out.push_sql(" AND id = ");
        out.push_bind_param::<SqlUuid, _>(&lock.key_id)?;
        out.push_sql(" AND lock_token = ");
        out.push_bind_param::<SqlUuid, _>(lock.token())?;
        self.writes.walk_requirement(out.reborrow())?;
        out.push_sql(" RETURNING account_id, id)");
        Ok(())
    }
}
