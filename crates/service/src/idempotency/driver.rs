//! The driver: how any endpoint's request is taken in under its key and driven through its
//! recovery points. What differs between endpoints is their phases ([`Phases`]); everything else
//! (the replay cache, the claim, what each claim outcome means, the connection a run holds, the
//! lease it must not outlast, the release when it stops short, the metrics) is here, once.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::prelude::QueryableByName;
use diesel_async::AsyncPgConnection;
use uuid::Uuid;

use super::abandoned::Abandoned;
use super::claim::{Claim, claim};
use super::clock::{DatabaseClock, Deadline};
use super::fingerprint::{Canonical, Fingerprint};
use super::phase::{PhaseError, PhaseWrites, atomic_phase};
use super::replays::{Asked, Remembered, ReplayCache};
use super::store::{Endpoint, KeyLock, KnownAnswer, NewKey, Reason, StoredResponse, Taken, Transition};
use super::{IdempotencyKey, RecoveryPoint};
use crate::audit::Actor;
use crate::db::delegate::Routing;
use crate::db::{self, Pool, PooledConnection, StoreError};
use crate::metrics::{KeyOutcome, Metrics, Unfinished};
use crate::request_id::RequestId;

/// What a driver needs of the process it runs in.
#[derive(Clone, Copy)]
pub struct Context<'a> {
    pub db: &'a Pool,
    /// How the claim and the phases reach their rows (delegated to the account's shard on Citus).
    pub routing: &'a Routing,
    pub metrics: &'a Metrics,
    pub replays: &'a ReplayCache,
    /// How long a lease on a key lasts from each statement that takes or renews it.
    pub lock_timeout: Duration,
    /// How long a finished key's answer is kept.
    pub key_retention: Duration,
}

/// Why a request has no final answer: nothing about it was stored as final, and a retry with the
/// same key resumes where it stopped.
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    #[error("the idempotency key was already used with another request")]
    KeyReused,
    #[error("a request with this idempotency key is in progress")]
    InFlight,
    /// The request's foreign side effect may or may not have happened (its answer is unknown, or
    /// the call was not made for fear of that); the key stays at its recovery point.
    #[error("the outcome is not known yet: {0}")]
    OutcomeUnknown(Box<dyn std::error::Error + Send + Sync>),
    /// What the key's request made is held by another system than the one this process reaches
    /// (a gateway other than its own, which named itself): only a process that reaches it may
    /// settle the key. To its client, an unknown outcome; a worker that took the key over hands
    /// it back as it found it (see [`Run::drive`]).
    #[error("the outcome is not known here: {0}")]
    HeldElsewhere(Box<dyn std::error::Error + Send + Sync>),
    #[error(transparent)]
    Phase(#[from] PhaseError),
}

impl From<StoreError> for DriveError {
    fn from(error: StoreError) -> Self {
        DriveError::Phase(error.into())
    }
}

impl DriveError {
    /// Why a request that held its key stopped short of `finished`.
    pub fn unfinished(&self) -> Unfinished {
        match self {
            DriveError::OutcomeUnknown(_) | DriveError::HeldElsewhere(_) => Unfinished::UnknownOutcome,
            DriveError::Phase(PhaseError::LockLost) | DriveError::InFlight => Unfinished::LockLost,
            DriveError::Phase(PhaseError::Store(_)) => Unfinished::Database,
            DriveError::Phase(PhaseError::Inconsistent(_)) | DriveError::KeyReused => Unfinished::Internal,
        }
    }

    /// A state of the key's rows that the protocol never leaves: a bug.
    pub fn inconsistent(what: impl Into<String>) -> DriveError {
        DriveError::Phase(PhaseError::Inconsistent(what.into()))
    }
}

/// The lease could run out before a call that cannot be taken back ends (the process was paused
/// or starved): another driver may take the key over meanwhile, so the call is not made.
#[derive(Debug, thiserror::Error)]
#[error("the lease on the key could run out before the call ends; no call was made")]
pub struct LeaseRunningOut;

/// The phases of one endpoint's requests: all that the driver does not know.
///
/// A key's first phase, `started`, stays at its recovery point (so that it runs again on
/// resumption, and finds what it made before). For a key never seen, it runs with the claim, in
/// its statement ([`Phases::first_phase`]): the key row and what the phase writes commit together.
pub trait Phases: Send {
    /// What the first phase's statement returns.
    type Started: QueryableByName<Pg> + Send + 'static;

    /// The first phase's writes, for the claim to run with it if the claim creates the key (see
    /// [`take_in`]); for the request `new` (so by the API, [`Actor::Api`]). None if the phase
    /// needs what only a call to another system can tell: the claim then runs alone, and
    /// [`Phases::advance`] runs the phase after it, as on a resumed key.
    fn first_phase<'p>(&'p mut self, new: &'p NewKey<'p>) -> Option<impl PhaseWrites + 'p>;

    /// The answer of a request of the layer's other shape, one that calls no other system: known
    /// before the claim (from the request, and what the database holds now), which then inserts a
    /// new key finished with it, the first phase's writes in the same statement, so that the
    /// request is claimed, written and finished in one transaction (Brandur's atomic phase with no
    /// foreign state), and [`Phases::advance`] never runs for it. None (the default): the key is
    /// inserted at `started`, and driven from there.
    fn answer_with_claim(
        &mut self,
        _new: &NewKey<'_>,
    ) -> impl Future<Output = Result<Option<KnownAnswer>, DriveError>> + Send {
        async { Ok(None) }
    }

    /// What the first phase returned when it ran with the claim, which created the key: no earlier
    /// run wrote anything under it. Called before [`Phases::advance`], which goes on from there
    /// instead of running the phase again.
    fn started_with_claim(&mut self, started: Self::Started);

    /// Runs the request from its key's recovery point ([`Run::recovery_point`]) on: at least one
    /// phase, and at most one foreign side effect, committed through [`Run::phase`]. The driver
    /// calls it again until a phase finishes the key.
    fn advance(&mut self, run: &mut Run<'_>) -> impl Future<Output = Result<(), DriveError>> + Send;

    /// The answer to `new`, a late retry whose key's record was reaped after its retention while
    /// what its request made (`made`) remains: it names that, and does nothing again.
    fn expired_answer(
        &mut self,
        new: &NewKey<'_>,
        made: Uuid,
    ) -> impl Future<Output = Result<StoredResponse, DriveError>> + Send;
}

/// What became of a request under its key.
#[derive(Debug)]
pub struct Reply {
    pub response: StoredResponse,
    /// True when the response is the stored answer to an earlier request with the same key.
    pub replayed: bool,
}

/// A request to an idempotent endpoint as its key judges it: the validated request, `R`, with its
/// fingerprint worked out once, for the replay cache and the claim alike. Its stored form (a JSON
/// value) is made only for the claim: a replay from memory has no use for it.
pub struct KeyedRequest<R> {
    pub account_id: Uuid,
    pub key: IdempotencyKey,
    pub endpoint: &'static Endpoint,
    pub request: R,
    fingerprint: Fingerprint,
}

impl<R: Canonical> KeyedRequest<R> {
    pub fn new(account_id: Uuid, key: IdempotencyKey, endpoint: &'static Endpoint, request: R) -> KeyedRequest<R> {
        let fingerprint = Fingerprint::of(&request);
        KeyedRequest { account_id, key, endpoint, request, fingerprint }
    }

    /// The answer if the key is a finished one whose answer this process holds in memory (see
    /// [`from_memory`]). `None`: the request needs [`KeyedRequest::answer`].
    pub fn answer_from_memory(&self, ctx: Context<'_>) -> Option<Result<Reply, DriveError>> {
        let KeyedRequest { account_id, ref key, endpoint, fingerprint, .. } = *self;
        from_memory(ctx, &Asked { account_id, key, endpoint, fingerprint })
    }

    /// Answers the request (see [`answer`]) through the phases `phases` makes of it.
    /// `request_id` names the HTTP request in the audit records it writes and in the problem it
    /// may store.
    pub async fn answer<P: Phases>(
        self,
        ctx: Context<'_>,
        request_id: &RequestId,
        phases: impl FnOnce(R) -> P,
    ) -> Result<Reply, DriveError> {
        self.answer_as(ctx, request_id, Actor::Api, phases).await
    }

    /// [`KeyedRequest::answer`], for a request a worker of ours (`actor`) makes under a key of
    /// its own: the lapse's cancel.
    pub async fn answer_as<P: Phases>(
        self,
        ctx: Context<'_>,
        request_id: &RequestId,
        actor: Actor,
        phases: impl FnOnce(R) -> P,
    ) -> Result<Reply, DriveError> {
        let KeyedRequest { account_id, key, endpoint, request, fingerprint } = self;
        let params = serde_json::to_value(&request)
            .map_err(|error| DriveError::inconsistent(format!("a request that does not serialise: {error}")))?;
        let new = NewKey { account_id, key: &key, endpoint, fingerprint, params: &params, request_id, actor };
        answer(ctx, &new, phases(request)).await
    }
}

/// The answer to `asked` from this process's memory, if its key is a finished one held there: the
/// stored answer for the same request, or a mismatch for another, counted as the claim's would be.
/// Such an answer is the whole request: it needs no database, and leaves nothing half-done if the
/// client hangs up, so it is worked out where the request is, with no task of its own. `None`:
/// the request needs [`answer`].
pub fn from_memory(ctx: Context<'_>, asked: &Asked<'_>) -> Option<Result<Reply, DriveError>> {
    let (metrics, account_id, endpoint) = (ctx.metrics, asked.account_id, asked.endpoint.label);
    Some(match ctx.replays.recall(asked)? {
        Remembered::Replay(response) => {
            metrics.key(account_id, endpoint, KeyOutcome::Replayed);
            Ok(Reply { response, replayed: true })
        }
        Remembered::Mismatch => {
            metrics.key(account_id, endpoint, KeyOutcome::KeyReused);
            Err(DriveError::KeyReused)
        }
    })
}

/// A request from start to end, whatever its endpoint, once [`from_memory`] had no answer for it:
/// taken in under its key, then replayed, answered for its expired key, or driven through `phases`
/// until a phase finishes the key.
pub async fn answer<P: Phases>(ctx: Context<'_>, new: &NewKey<'_>, mut phases: P) -> Result<Reply, DriveError> {
    let run = match take_in(ctx, new, &mut phases).await? {
        TakenIn::Replayed(response) => return Ok(Reply { response, replayed: true }),
        TakenIn::Answered(response) => return Ok(Reply { response, replayed: false }),
        TakenIn::Expired { id } => {
            let response = phases.expired_answer(new, id).await?;
            return Ok(Reply { response, replayed: false });
        }
        TakenIn::Acquired(run) => run,
    };
    let response = run.drive(phases, Some(new)).await?;
    Ok(Reply { response, replayed: false })
}

/// How a request was taken in under its key.
pub enum TakenIn<'a> {
    /// Answered already: the stored answer of an earlier request with the key, replayed.
    Replayed(StoredResponse),
    /// Answered by the claim: a request of the other shape, claimed, written and finished (see
    /// [`Phases::answer_with_claim`]).
    Answered(StoredResponse),
    /// The key's record was reaped after its retention, but what its request made remains (`id`):
    /// whatever the body, the request is a late retry and must do nothing again.
    Expired { id: Uuid },
    /// The request holds the key: drive it.
    Acquired(Box<Run<'a>>),
}

/// Takes a request in under its key by the claim, which runs the first of `phases` with it if the
/// key is new, and counts what became of it. The replay cache is not asked here: [`from_memory`]
/// is, first, and answers most replays without a claim (which finds a finished key too, only by a
/// round trip).
pub async fn take_in<'a, P: Phases>(
    ctx: Context<'a>,
    new: &NewKey<'_>,
    phases: &mut P,
) -> Result<TakenIn<'a>, DriveError> {
    let (metrics, account_id, endpoint) = (ctx.metrics, new.account_id, new.endpoint.label);
    let answer = phases.answer_with_claim(new).await?;
    let mut conn = db::connect(ctx.db).await?;
    // Counted from before the claim, at our retention: no later than the expiry it records.
    let expires = Deadline::after(ctx.key_retention);
    let first = phases.first_phase(new);
    let wrote_with_claim = first.is_some();
    let with_answer = answer.as_ref().map(|answer| (answer, ctx.key_retention));
    let claimed =
        claim::<_, P::Started>(&mut conn, ctx.routing, new, ctx.lock_timeout, first.as_ref(), with_answer).await;
    // The first phase's writes borrow `phases`, which takes what they returned below.
    drop(first);
    if claimed.is_err() {
        // As after a phase that failed (`Run::release`): the connection may be broken, or still
        // busy with a claim that ran out of time, and the next request must not wait behind it.
        db::discard(&mut conn);
    }
    let lock = match claimed? {
        Claim::Mismatch => {
            metrics.key(account_id, endpoint, KeyOutcome::KeyReused);
            return Err(DriveError::KeyReused);
        }
        Claim::Replay { response, expires } => {
            metrics.key(account_id, endpoint, KeyOutcome::Replayed);
            // A key finished before expiries were recorded is never kept in memory.
            if let Some(expires) = expires {
                ctx.replays.remember(new, &response, expires);
            }
            return Ok(TakenIn::Replayed(response));
        }
        Claim::InFlight => {
            metrics.key(account_id, endpoint, KeyOutcome::InFlight);
            return Err(DriveError::InFlight);
        }
        Claim::Expired { id } => {
            metrics.key(account_id, endpoint, KeyOutcome::Expired);
            return Ok(TakenIn::Expired { id });
        }
        Claim::Answered { started } => {
            let response = answer.map(|answer| answer.response).ok_or_else(|| {
                DriveError::inconsistent("a key the claim finished without an answer to finish it with")
            })?;
            if wrote_with_claim && started.is_none() {
                // Its requirement, held before the key was inserted, makes this a bug.
                return Err(DriveError::inconsistent("a key finished by its claim, whose writes wrote nothing"));
            }
            if let Some(started) = started {
                phases.started_with_claim(started);
            }
            metrics.key(account_id, endpoint, KeyOutcome::Created);
            ctx.replays.remember(new, &response, expires);
            return Ok(TakenIn::Answered(response));
        }
        Claim::Acquired { lock, started } => {
            if let Some(started) = started {
                phases.started_with_claim(started);
            }
            lock
        }
    };
    metrics.key(account_id, endpoint, if lock.resumed() { KeyOutcome::Resumed } else { KeyOutcome::Created });
    tracing::Span::current().record("idempotency_key.id", lock.key_id.to_string());
    let key = new.key.clone();
    let run = Run { conn: Some(conn), ..Run::new(ctx, lock, key, new.actor, new.request_id.clone()) };
    Ok(TakenIn::Acquired(Box::new(run)))
}

/// One run of a claimed key, by the API for its client or by a worker: the lock, the connection
/// held across consecutive phases, and who drives it.
pub struct Run<'a> {
    ctx: Context<'a>,
    lock: KeyLock,
    key: IdempotencyKey,
    actor: Actor,
    /// The HTTP request, or the worker's run, that drives the key now.
    request_id: RequestId,
    /// Held across consecutive phases; let go of before a foreign call.
    conn: Option<PooledConnection>,
    /// The response the last phase stored, once one finished the key.
    response: Option<StoredResponse>,
}

impl<'a> Run<'a> {
    fn new(ctx: Context<'a>, lock: KeyLock, key: IdempotencyKey, actor: Actor, request_id: RequestId) -> Self {
        Run { ctx, lock, key, actor, request_id, conn: None, response: None }
    }

    /// A worker's run of a key it took over (see [`super::claim_abandoned`]), with the request
    /// stored on the key read back as `R`. A stored request that does not read as one is a bug: the
    /// key is let go of where it stands, for an operator.
    pub async fn of_abandoned<R: serde::de::DeserializeOwned>(
        ctx: Context<'a>,
        abandoned: Abandoned,
        run: &RequestId,
    ) -> Result<(Run<'a>, R), DriveError> {
        let Abandoned { lock, key, params, .. } = abandoned;
        match serde_json::from_value::<R>(params) {
            Ok(request) => Ok((Run::new(ctx, lock, key, Actor::Completer, run.clone()), request)),
            Err(error) => {
                let error = DriveError::inconsistent(format!("the stored request does not read as one: {error}"));
                let reason = Reason { code: Unfinished::Internal.as_str(), detail: &error.to_string() };
                release(ctx, &lock, Actor::Completer, reason, run).await;
                Err(error)
            }
        }
    }

    /// Drives the key to `finished` through `phases`, and keeps the answer for replays. If it
    /// stops short, the key is unlocked where it stands, so a retry resumes at once (unless another
    /// request took the key over: then it is theirs). A worker's run that finds the key held
    /// elsewhere ([`DriveError::HeldElsewhere`]) hands it back as it took it: the take spent none
    /// of the key's attempts and adds nothing to its backoff, so a process that reaches what the
    /// key made takes it as soon as it would have.
    pub async fn drive(
        mut self,
        mut phases: impl Phases,
        new: Option<&NewKey<'_>>,
    ) -> Result<StoredResponse, DriveError> {
        // Counted from before the key finishes, at our retention: no later than the expiry that
        // the finishing phase records.
        let expires = Deadline::after(self.ctx.key_retention);
        let result = async {
            while self.lock.recovery_point() != RecoveryPoint::FINISHED {
                phases.advance(&mut self).await?;
            }
            self.response.take().ok_or_else(|| DriveError::inconsistent("finished without a response"))
        }
        .await;
        match &result {
            Ok(response) => {
                if let Some(new) = new {
                    self.ctx.replays.remember(new, response, expires);
                }
            }
            Err(error) => {
                // A client's request is counted here; a worker's runs are counted as its own (see
                // the completer).
                if let Some(new) = new {
                    self.ctx.metrics.unfinished(new.endpoint.label, error.unfinished());
                }
                if !matches!(error, DriveError::Phase(PhaseError::LockLost)) {
                    self.release(error).await;
                }
            }
        }
        result
    }

    /// The recovery point the key is at.
    pub fn recovery_point(&self) -> RecoveryPoint {
        self.lock.recovery_point()
    }

    /// The lock this run holds.
    pub fn lock(&self) -> &KeyLock {
        &self.lock
    }

    /// The client's key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// Who drives the key: the API for its client, or a worker.
    pub fn actor(&self) -> Actor {
        self.actor
    }

    /// The request, or the worker's run, that drives the key now: named in every record it writes.
    pub fn request_id(&self) -> &RequestId {
        &self.request_id
    }

    /// The database's clock, from `read`: its `now()` in the statement that last renewed the
    /// lease (the claim, or the last phase), such as the `created_at` of a row that statement
    /// made.
    pub fn database_clock(&self, read: DateTime<Utc>) -> DatabaseClock {
        DatabaseClock::read(read, self.lock.renewed_at())
    }

    /// Runs one atomic phase (see [`atomic_phase`]) on the run's connection.
    pub async fn phase<W, R>(&mut self, transition: Transition, writes: W) -> Result<R, DriveError>
    where
        W: PhaseWrites,
        R: QueryableByName<Pg> + Send + 'static,
    {
        let finished = match &transition {
            Transition::Finish { response, .. } => Some(response.clone()),
            _ => None,
        };
        if self.conn.is_none() {
            self.conn = Some(db::connect(self.ctx.db).await?);
        }
        let conn = self.conn.as_mut().expect("checked out above");
        let result = atomic_phase(conn, self.ctx.routing, &mut self.lock, transition, writes).await?;
        self.response = finished;
        Ok(result)
    }

    /// Runs the phase that finishes the key: the `response` stored (and kept for [`Run::drive`]),
    /// the lock released, the key's expiry recorded, this process's retention from now, and what
    /// the request `made`, if anything (a refusal makes nothing), recorded for after the key.
    pub async fn finish<W, R>(
        &mut self,
        response: StoredResponse,
        made: Option<Uuid>,
        writes: W,
    ) -> Result<R, DriveError>
    where
        W: PhaseWrites,
        R: QueryableByName<Pg> + Send + 'static,
    {
        self.phase(Transition::Finish { response, retention: self.ctx.key_retention, made }, writes).await
    }

    /// The run's connection, checked out on first use after it was let go of: for reads between
    /// phases.
    pub async fn connection(&mut self) -> Result<&mut AsyncPgConnection, StoreError> {
        if self.conn.is_none() {
            self.conn = Some(db::connect(self.ctx.db).await?);
        }
        Ok(self.conn.as_mut().expect("checked out above"))
    }

    /// Lets go of the connection before a foreign call: no pooled connection is held, and no
    /// transaction open, while another system takes its time.
    pub fn let_go_of_connection(&mut self) {
        self.conn = None;
    }

    /// Refuses to start a call bounded by `call` that could still be running when the lease on
    /// the key ends: past the lease, another driver may take the key over and call too. The margin
    /// ([`LEASE_MARGIN`](super::LEASE_MARGIN)) covers a small step of the database's clock.
    pub fn check_lease_outlasts(&self, call: Duration) -> Result<(), DriveError> {
        if !payments_protocol::outlasts(self.lock.time_left(), call) {
            tracing::warn!(lease_left = ?self.lock.time_left(), "the lease could run out during a call; not calling");
            return Err(DriveError::OutcomeUnknown(Box::new(LeaseRunningOut)));
        }
        Ok(())
    }

    /// Unlocks the key where it stands, with why.
    async fn release(&mut self, error: &DriveError) {
        // A connection that just failed may be broken, or still busy with a statement that timed
        // out: the pool drops it, and the release uses a fresh one.
        if let Some(conn) = self.conn.as_mut() {
            db::discard(conn);
        }
        self.conn = None;
        let reason = Reason { code: error.unfinished().as_str(), detail: &error.to_string() };
        match (error, self.lock.taken()) {
            (DriveError::HeldElsewhere(_), Some(taken)) => {
                hand_back(self.ctx, &self.lock, taken, reason, &self.request_id).await;
            }
            _ => release(self.ctx, &self.lock, self.actor, reason, &self.request_id).await,
        }
    }
}

/// Unlocks a key where it stands, so a retry resumes at once (best effort: if even this fails,
/// the lock goes stale after the lock timeout and the key is taken over then).
pub async fn release(ctx: Context<'_>, lock: &KeyLock, actor: Actor, reason: Reason<'_>, request_id: &RequestId) {
    let result = async {
        let mut conn = db::connect(ctx.db).await?;
        lock.release(&mut conn, actor, reason, request_id).await
    }
    .await;
    if let Err(error) = result {
        tracing::warn!(%error, "could not unlock the key; it unlocks when its lock goes stale");
    }
}

/// Unlocks a key a worker took over as its take found it (see [`KeyLock::hand_back`]); best
/// effort, as [`release`].
async fn hand_back(ctx: Context<'_>, lock: &KeyLock, taken: Taken, reason: Reason<'_>, request_id: &RequestId) {
    let result = async {
        let mut conn = db::connect(ctx.db).await?;
        lock.hand_back(&mut conn, taken, reason, request_id).await
    }
    .await;
    if let Err(error) = result {
        tracing::warn!(%error, "could not hand the key back; it unlocks when its lock goes stale");
    }
}
