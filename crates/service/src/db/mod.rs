//! Our own store, as the request path and the workers use it: the connection pool and the errors
//! it can fail with, statements written whole and how they run on Citus, the workers' wake-ups;
//! and the schema those statements run against, migrated and spread over Citus.
//!
//! Every request path checks connections out of one bb8 pool. The pool is tuned to fail closed:
//! a checkout waits at most [`CHECKOUT_TIMEOUT`], so a request that cannot reach the database
//! answers 503 promptly instead of queueing behind a dead server, and new connections are made
//! again as soon as the database is back.
//!
//! All of it works on a database named by its URL, whoever started it: an operator, or this
//! binary (`crate::postgres`, which uses this module and is never used by it).

pub mod delegate;
pub mod distribute;
pub mod migrate;
pub mod nodes;
pub mod ownership;
pub mod schema;
pub mod sql;
pub mod statistics;
pub mod tables;
mod text_enum;
pub mod wake;

pub(crate) use text_enum::text_enum;

use std::future::Future;
use std::time::Duration;

use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, PoolError, PoolableConnection, RecyclingMethod,
};
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};

use crate::runtime::ProcessRuntime;

/// The connection pool shared by every request and worker of a process.
pub type Pool = bb8::Pool<AsyncDieselConnectionManager<AsyncPgConnection>>;

/// A connection checked out of the [`Pool`]; it goes back when dropped.
pub type PooledConnection = bb8::PooledConnection<'static, AsyncDieselConnectionManager<AsyncPgConnection>>;

/// How long a request waits for a connection. Short, so that an unreachable database turns into a
/// 503 within about two seconds (the contract's fail-closed promise) rather than a hung request.
pub const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(1);

/// The server-side limit on any one statement. Every statement on the request path reads and
/// writes a few rows through unique indexes, so anything slower than this is a stuck lock or an
/// overloaded server, and the request is better off failing (and being retried) than waiting.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(2);

/// The server-side limit on waiting for a row lock. Every transaction of ours holds its locks for
/// milliseconds, so a wait this long is for a holder that is stuck (a frozen process, see
/// [`IDLE_IN_TRANSACTION_TIMEOUT`]): the statement gives up, and the request answers that a record
/// it needs is locked ([`StoreError::Locked`]) rather than that the database is unreachable.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(1);

/// The server-side limit on a transaction left open with no statement running. A live process of
/// ours never leaves one open longer than [`OPERATION_TIMEOUT`] (it drops the connection, and the
/// server rolls back); a frozen one (stopped, paused by its host, or on a host that died without
/// closing its sockets) would hold its row locks until TCP keepalive notices, about two hours. The
/// server ends such a session instead, rolling its transaction back and letting go of its locks.
pub const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(5);

/// The client-side limit on one unit of database work (a look-up, the claim, a phase). The server's statement timeout cannot help when the server, or the network to it,
/// stops answering altogether; this does, so that such a request fails closed too.
pub const OPERATION_TIMEOUT: Duration = Duration::from_millis(2500);

/// Builds the pool without connecting: the first checkout connects, and a database that is down
/// at start-up is reported by `/readyz` and by 503s instead of preventing the process from starting.
pub fn pool(database_url: &str, max_size: u32) -> Pool {
    let url = database_url.to_owned();
    pool_connecting(database_url, max_size, ProcessRuntime::current(), move || {
        let url = url.clone();
        Box::pin(async move { establish(&url).await })
    })
}

/// A pool like [`pool`]'s to the server `config` names (on Citus, one node: see
/// [`delegate::Routing`]), its connections opened on `runtime`, the process's, wherever the pool
/// is first needed.
pub fn pool_to(config: tokio_postgres::Config, max_size: u32, runtime: ProcessRuntime) -> Pool {
    let name = format!("{:?}:{:?}", config.get_hosts(), config.get_ports());
    pool_connecting(&name, max_size, runtime, move || {
        let config = config.clone();
        Box::pin(async move { establish_to(&config).await })
    })
}

/// A pool whose connections `connect` opens on `runtime`; `name` says what they connect to.
fn pool_connecting<F>(name: &str, max_size: u32, runtime: ProcessRuntime, connect: F) -> Pool
where
    F: Fn() -> futures_util::future::BoxFuture<'static, diesel::ConnectionResult<AsyncPgConnection>>
        + Send
        + Sync
        + 'static,
{
    let mut config = ManagerConfig::default();
    // The default (`Verified`) runs `SELECT 1` on every checkout: a round trip per phase. Checking
    // only whether the connection's socket has closed costs nothing and still keeps connections
    // that died while idle (a database restart) out of requests.
    config.recycling_method = RecyclingMethod::CustomFunction(Box::new(|conn: &mut AsyncPgConnection| {
        let broken = conn.is_broken();
        Box::pin(async move {
            match broken {
                false => Ok(()),
                true => Err(DieselError::DatabaseError(
                    DatabaseErrorKind::ClosedConnection,
                    Box::new("the connection is closed".to_owned()),
                )),
            }
        })
    }));
    // Opened on the process's runtime, whichever task checks one out (see `crate::runtime`): a
    // connection an HTTP worker opened would die with that worker.
    let reaper_runtime = runtime.clone();
    config.custom_setup = Box::new(move |_| {
        let (runtime, opening) = (runtime.clone(), connect());
        Box::pin(async move {
            runtime.run(opening).await.unwrap_or_else(|error| {
                Err(diesel::ConnectionError::BadConnection(format!("the connection was not opened: {error}")))
            })
        })
    });
    let manager = AsyncDieselConnectionManager::new_with_config(name, config);
    let builder = bb8::Pool::builder().max_size(max_size).connection_timeout(CHECKOUT_TIMEOUT);
    // Its reaper too, which the pool starts as it is built.
    reaper_runtime.make(|| builder.build_unchecked(manager))
}

/// Opens one connection with the session settings every connection of ours carries.
pub async fn establish(database_url: &str) -> diesel::ConnectionResult<AsyncPgConnection> {
    set_up_session(AsyncPgConnection::establish(database_url).await?).await
}

/// [`establish`], to the server `config` names.
pub async fn establish_to(config: &tokio_postgres::Config) -> diesel::ConnectionResult<AsyncPgConnection> {
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|error| diesel::ConnectionError::BadConnection(error.to_string()))?;
    set_up_session(AsyncPgConnection::try_from_client_and_connection(client, connection).await?).await
}

async fn set_up_session(mut conn: AsyncPgConnection) -> diesel::ConnectionResult<AsyncPgConnection> {
    let setup = format!(
        "SET application_name = 'payments'; SET statement_timeout = {}; SET lock_timeout = {}; \
         SET idle_in_transaction_session_timeout = {}",
        STATEMENT_TIMEOUT.as_millis(),
        LOCK_TIMEOUT.as_millis(),
        IDLE_IN_TRANSACTION_TIMEOUT.as_millis()
    );
    conn.batch_execute(&setup).await.map_err(|e| diesel::ConnectionError::BadConnection(e.to_string()))?;
    Ok(conn)
}

/// Checks a connection out of the pool, within [`CHECKOUT_TIMEOUT`].
pub async fn connect(pool: &Pool) -> Result<PooledConnection, StoreError> {
    Ok(pool.get_owned().await?)
}

/// Runs one unit of database work within [`OPERATION_TIMEOUT`]. Dropping a transaction's future
/// leaves its connection marked broken, so the pool discards it and the server rolls back; a
/// single statement's does not (see [`discard`]).
pub async fn bounded<T, E: From<StoreError>>(work: impl Future<Output = Result<T, E>>) -> Result<T, E> {
    match tokio::time::timeout(OPERATION_TIMEOUT, work).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::Unavailable(format!("no answer within {OPERATION_TIMEOUT:?}")).into()),
    }
}

/// The first row of a statement that writes, taken once PostgreSQL has sent the whole result. A
/// statement run alone commits as it ends, and a commit that fails (a deferred check; on Citus, a
/// worker that cannot prepare its part) says so after the rows: `get_result` returns at the first
/// row and drops what follows, the error with it, so a statement the database rolled back would
/// pass for done, and the gateway be asked for a key that never was.
pub async fn first_row<R>(rows: impl Future<Output = diesel::QueryResult<Vec<R>>>) -> diesel::QueryResult<Option<R>> {
    Ok(rows.await?.into_iter().next())
}

/// One statement (or a few), within [`OPERATION_TIMEOUT`].
pub async fn query<T>(work: impl Future<Output = diesel::QueryResult<T>>) -> Result<T, StoreError> {
    bounded(async { Ok(work.await?) }).await
}

/// Marks a connection as broken, so that the pool drops it instead of handing it to the next
/// request: for one on which a statement failed as unavailable (the server ended it, or it timed
/// out and may still be running). The pool would only notice a closed connection once its socket
/// reports so, which may come too late, and never one still busy with a statement.
pub fn discard(conn: &mut AsyncPgConnection) {
    use diesel_async::TransactionManager;
    diesel_async::AnsiTransactionManager::transaction_manager_status_mut(conn).set_in_error();
}

/// Why a database operation failed, sorted by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached, the connection broke, or the server cannot serve right
    /// now (shutting down, restarting, out of resources, a statement cancelled by its timeout, a
    /// read-only standby after a failover): fail closed with a 503.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// A row the work needs stayed locked by another transaction for [`LOCK_TIMEOUT`]: the work
    /// rolled back, the database is fine, and the holder is stuck (it is ended within
    /// [`IDLE_IN_TRANSACTION_TIMEOUT`] if it is idle in its transaction).
    #[error("a row it needs is locked by another transaction: {0}")]
    Locked(String),
    /// A conflict between concurrent transactions (serialization failure or deadlock): the
    /// transaction rolled back and may simply run again.
    #[error("transaction conflict: {0}")]
    Conflict(DieselError),
    /// The database refused this process's role a permission (SQLSTATE 42501: `permission denied
    /// for table ...`; on Citus, `must be owner of table ...`, see [`ownership`]). No outage: it
    /// holds until someone changes the role's grants, so it is an opaque 500 whose cause, logged,
    /// says so, never a 503 that calls the database unreachable.
    #[error("the database refused this process's role a permission: {0}")]
    Refused(String),
    /// Anything else: a bug or a broken invariant, answered with an opaque 500.
    #[error(transparent)]
    Query(DieselError),
}

impl From<DieselError> for StoreError {
    fn from(error: DieselError) -> Self {
        match &error {
            DieselError::DatabaseError(DatabaseErrorKind::SerializationFailure, _) => StoreError::Conflict(error),
            // diesel reports a deadlock (SQLSTATE 40P01) only as `Unknown` with the server's
            // message; our clusters run with English messages, so the message identifies it.
            DieselError::DatabaseError(DatabaseErrorKind::Unknown, info)
                if info.message().starts_with("deadlock detected") =>
            {
                StoreError::Conflict(error)
            }
            // So is a lock wait that ran out (SQLSTATE 55P03).
            DieselError::DatabaseError(DatabaseErrorKind::Unknown, info)
                if info.message().starts_with("canceling statement due to lock timeout") =>
            {
                StoreError::Locked(info.message().to_owned())
            }
            DieselError::DatabaseError(DatabaseErrorKind::Unknown, info) if is_refused_permission(info.message()) => {
                StoreError::Refused(info.message().to_owned())
            }
            // diesel names the errors our statements can cause (constraint violations: bugs, or
            // races we handle); what it does not name is the server failing to serve. Either way
            // nothing committed, so failing closed and letting the client retry is safe.
            DieselError::DatabaseError(
                DatabaseErrorKind::ClosedConnection
                | DatabaseErrorKind::UnableToSendCommand
                | DatabaseErrorKind::ReadOnlyTransaction
                | DatabaseErrorKind::Unknown,
                info,
            ) => StoreError::Unavailable(info.message().to_owned()),
            DieselError::BrokenTransactionManager => StoreError::Unavailable(error.to_string()),
            _ => StoreError::Query(error),
        }
    }
}

/// Whether the server's `message` refuses a permission (SQLSTATE 42501, which diesel does not
/// name): PostgreSQL words each such refusal one of these two ways, in the English messages our
/// clusters run with (as [`StoreError`]'s deadlock and lock timeout are told by their messages).
fn is_refused_permission(message: &str) -> bool {
    message.starts_with("permission denied") || message.starts_with("must be owner of")
}

/// A row's account: what a worker reads first, without locks, so as to take its items one
/// account at a time. On Citus each account's rows are on one shard, and a row lock
/// (`FOR UPDATE SKIP LOCKED`) is refused in a statement that spans shards.
#[derive(diesel::QueryableByName)]
pub struct AccountRow {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub account_id: uuid::Uuid,
}

/// The accounts of `rows`, each once, in the rows' order: the first rows a worker's scan found
/// (a scan that walks an index and stops, never one that groups a whole backlog).
pub fn accounts_of(rows: Vec<AccountRow>) -> Vec<uuid::Uuid> {
    let mut accounts: Vec<uuid::Uuid> = Vec::with_capacity(rows.len());
    for AccountRow { account_id } in rows {
        if !accounts.contains(&account_id) {
            accounts.push(account_id);
        }
    }
    accounts
}

impl StoreError {
    /// Whether the statement may succeed if it runs again, on a fresh snapshot: a conflict
    /// between concurrent transactions; or a `CHECK` that failed on a row another transaction
    /// changed since this statement's snapshot. In READ COMMITTED, PostgreSQL builds the new row
    /// from the version its snapshot saw and checks it before it finds that version changed (and
    /// only then builds it again from the newest): a refund racing its payment's capture checks
    /// `amount_refund_pending` against the captured amount from before the capture. Run again,
    /// the statement sees the newest row from the start; a check that still fails is a real
    /// violation, reported as one.
    pub fn is_worth_retrying(&self) -> bool {
        matches!(
            self,
            StoreError::Conflict(_)
                | StoreError::Query(DieselError::DatabaseError(DatabaseErrorKind::CheckViolation, _))
        )
    }
}

impl From<bb8::RunError<PoolError>> for StoreError {
    fn from(error: bb8::RunError<PoolError>) -> Self {
        StoreError::Unavailable(error.to_string())
    }
}
