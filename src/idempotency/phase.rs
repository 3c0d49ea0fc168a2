//! `atomic_phase`: the one way a request changes its key row.

use std::future::Future;

use diesel_async::{AsyncConnection, AsyncPgConnection};

use super::store::{KeyLock, Transition, since_boot};
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

/// An async closure over a connection whose future is `Send` (so a phase can run on any thread).
/// diesel-async asks the same of a transaction's body; this names it for our own signatures.
pub trait PhaseBody<'c, T>:
    AsyncFnOnce(&'c mut AsyncPgConnection) -> Result<(Transition, T), PhaseError>
    + FnOnce(&'c mut AsyncPgConnection) -> <Self as PhaseBody<'c, T>>::Fut
{
    type Fut: Future<Output = Result<(Transition, T), PhaseError>> + Send;
}

impl<'c, T, F, Fut> PhaseBody<'c, T> for F
where
    F: AsyncFnOnce(&'c mut AsyncPgConnection) -> Result<(Transition, T), PhaseError>
        + FnOnce(&'c mut AsyncPgConnection) -> Fut,
    Fut: Future<Output = Result<(Transition, T), PhaseError>> + Send,
{
    type Fut = Fut;
}

/// Runs one atomic phase: `body`'s writes and the key row's [`Transition`] commit in one
/// transaction, or not at all.
///
/// The transition is fenced by the lock token: if the key was taken over since we claimed it,
/// the whole transaction rolls back and the phase fails with [`PhaseError::LockLost`]. A
/// serialization failure or deadlock runs the phase again, up to [`MAX_ATTEMPTS`] times; the body
/// must therefore be a closure that can be cloned (capture by reference).
pub async fn atomic_phase<T, F>(conn: &mut AsyncPgConnection, lock: &mut KeyLock, body: F) -> Result<T, PhaseError>
where
    T: Send,
    F: Clone + Send + for<'c> PhaseBody<'c, T>,
{
    let mut attempt = 1;
    loop {
        let body = body.clone();
        let held: &KeyLock = lock;
        // Before BEGIN: the lease this transaction renews counts from the server's `now()`, later.
        let sent = since_boot();
        let result = db::bounded(conn.transaction(async |conn| {
            let (transition, value) = body(conn).await?;
            if !held.apply(conn, &transition).await? {
                return Err(PhaseError::LockLost);
            }
            Ok((transition, value))
        }))
        .await;
        match result {
            Ok((transition, value)) => {
                lock.advance_to(&transition, sent);
                return Ok(value);
            }
            Err(PhaseError::Store(StoreError::Conflict(error))) if attempt < MAX_ATTEMPTS => {
                tracing::warn!(%error, attempt, "phase conflicted with a concurrent transaction; running it again");
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}
