//! `POST /v1/payments`: one payment request, driven through its recovery points.
//!
//! ```text
//!            claim                 gateway call                 (no foreign effect)
//!   (new) ─────────► started ────────────────────► charge_created ────────────────► finished
//!                    payment pending               outcome recorded                 response stored,
//!                    + audit record                on the payment                   event staged, unlocked
//! ```
//!
//! Every arrow is one transaction, and the gateway call between `started` and `charge_created`
//! is the only foreign side effect, made with no transaction open and no connection held. Why the
//! cuts are where they are:
//! - `started` commits the payment before the gateway hears of it, so no charge can exist that
//!   our database does not know about. It keeps the recovery point where it is, so the phase runs
//!   again on resumption and finds the payment it made (it never makes a second).
//! - The gateway call sends a key derived from our key row, so calling again after a crash, a
//!   timeout or a 5xx returns the first charge instead of making another. A resumed key first looks
//!   its charge up by that key and adopts it if one exists, which holds even after the gateway has
//!   forgotten the key. That is what makes `started` safe to resume from when nobody knows what
//!   the gateway did. Two more guards keep every call about one payment at one gateway and with one
//!   driver: `started` records the gateway, and no driver calls any other; and no driver makes a
//!   call that could outlast its lease on the key, after which another driver may be calling.
//! - `charge_created` records the gateway's definitive answer: once it commits, the gateway is
//!   never asked again.
//! - `finished` stores the response, stages the outbox event and unlocks, all at once: a request
//!   is either finished with a stored answer and its event, or not finished at all.
//!
//! An indeterminate gateway outcome (a timeout, a connection error, a 5xx, a 409 or 429, anything
//! after which money may have moved without our knowing) commits nothing: the key is unlocked at
//! `started` and the client is told 503, retry with the same key. The same driver
//! serves a client's request and a worker finishing an abandoned one ([`complete_abandoned`]).

use std::sync::Arc;

use serde_json::json;
use uuid::Uuid;

use super::model::{ChargeOutcome, NewPayment, Payment, PaymentStatus};
use super::request::PaymentRequest;
use super::view::{PaymentView, expired_key_response, final_response};
use super::writes::{self, PaymentChange};
use crate::audit::{Actor, AuditRecord};
use crate::db::{self, PooledConnection, StoreError};
use crate::faults::{Fault, FaultPoint, fault_at};
use crate::gateway::{self, ChargeRequest, GatewayError};
use crate::idempotency::{
    Abandoned, Claim, Fingerprint, IdempotencyKey, KeyLock, LEASE_MARGIN, NewKey, PhaseError, Reason, RecoveryPoint,
    Remembered, StoredResponse, Transition, atomic_phase, claim,
};
use crate::metrics::{KeyOutcome, Unfinished};
use crate::outbox::StagedEvent;
use crate::request_id::RequestId;
use crate::state::AppState;

/// The method and path a payment key is bound to: a key used on another endpoint is a mismatch.
const METHOD: &str = "POST";
const PATH: &str = "/v1/payments";

/// The answer to a create request.
#[derive(Debug)]
pub struct Created {
    pub response: StoredResponse,
    /// True when the response is the stored answer to an earlier request with the same key.
    pub replayed: bool,
}

/// Why a create request has no final answer (nothing about it was stored as final).
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("the idempotency key was already used with another request")]
    KeyReused,
    #[error("a request with this idempotency key is in progress")]
    InFlight,
    #[error("the gateway's answer is unknown: {0}")]
    GatewayIndeterminate(GatewayError),
    /// The payment started at another gateway than this process's: only that gateway can say
    /// whether it was charged, and any other would charge it again.
    #[error(
        "the payment is charged through the gateway at {recorded}, and this process uses {ours}: only a process \
         with that gateway may look its charge up or charge it"
    )]
    WrongGateway { recorded: String, ours: String },
    /// The lease on the key could run out before a gateway call ends (the process was paused or
    /// starved): another driver may take the key over meanwhile, so no call is made.
    #[error("the lease on the key could run out before a gateway call ends; no call was made")]
    LeaseRunningOut,
    #[error(transparent)]
    Phase(#[from] PhaseError),
}

impl From<StoreError> for CreateError {
    fn from(error: StoreError) -> Self {
        CreateError::Phase(error.into())
    }
}

impl CreateError {
    /// Why a request that held its key stopped short of `finished`.
    pub fn unfinished(&self) -> Unfinished {
        match self {
            CreateError::GatewayIndeterminate(_) | CreateError::WrongGateway { .. } | CreateError::LeaseRunningOut => {
                Unfinished::UnknownOutcome
            }
            CreateError::Phase(PhaseError::LockLost) | CreateError::InFlight => Unfinished::LockLost,
            CreateError::Phase(PhaseError::Store(_)) => Unfinished::Database,
            CreateError::Phase(PhaseError::Inconsistent(_)) | CreateError::KeyReused => Unfinished::Internal,
        }
    }
}

/// Creates a payment, or answers for the one this key already made. `request_id` names the HTTP
/// request in the audit records it writes and in the problem it may store.
#[tracing::instrument(name = "payments.create", skip_all, fields(account.id = %account_id, idempotency_key.id, payment.id))]
pub async fn create_payment(
    state: &AppState,
    account_id: Uuid,
    key: IdempotencyKey,
    request: PaymentRequest,
    fault: Option<Fault>,
    request_id: &RequestId,
) -> Result<Created, CreateError> {
    let metrics = &state.metrics;
    let params = request.to_params();
    let new_key = NewKey {
        account_id,
        key: &key,
        method: METHOD,
        path: PATH,
        fingerprint: Fingerprint::of(&params),
        params: &params,
        request_id,
    };
    // A finished key's answer may be in memory: answered from there, with no database at all.
    match state.replays.recall(&new_key) {
        Some(Remembered::Replay(response)) => {
            metrics.key(account_id, KeyOutcome::Replayed);
            return Ok(Created { response, replayed: true });
        }
        Some(Remembered::Mismatch) => {
            metrics.key(account_id, KeyOutcome::KeyReused);
            return Err(CreateError::KeyReused);
        }
        None => {}
    }
    let mut conn = db::connect(&state.db).await?;
    let lock = match claim(&mut conn, &new_key, state.settings.lock_timeout).await? {
        Claim::Mismatch => {
            metrics.key(account_id, KeyOutcome::KeyReused);
            return Err(CreateError::KeyReused);
        }
        Claim::Replay { response, expires } => {
            metrics.key(account_id, KeyOutcome::Replayed);
            if let Some(expires) = expires {
                state.replays.remember(&new_key, &response, expires);
            }
            return Ok(Created { response, replayed: true });
        }
        Claim::InFlight => {
            metrics.key(account_id, KeyOutcome::InFlight);
            return Err(CreateError::InFlight);
        }
        Claim::Expired { payment_id } => {
            metrics.key(account_id, KeyOutcome::Expired);
            let payment = db::query(Payment::find(&mut conn, account_id, payment_id)).await?;
            let payment = payment.ok_or_else(|| PhaseError::Inconsistent(format!("payment {payment_id} vanished")))?;
            return Ok(Created { response: expired_key_response(&payment, request_id), replayed: false });
        }
        Claim::Acquired(lock) => lock,
    };
    metrics.key(account_id, if lock.resumed() { KeyOutcome::Resumed } else { KeyOutcome::Created });
    tracing::Span::current().record("idempotency_key.id", lock.key_id.to_string());
    let driver = Driver::new(state, lock, key.clone(), request, Actor::Api, request_id.clone());
    let driver = Driver { conn: Some(conn), fault, ..driver };
    // Counted from before the key finishes, at our retention: no later than the expiry recorded.
    let expires = crate::idempotency::Deadline::after(state.settings.key_retention);
    let response = driver.run().await.inspect_err(|error| metrics.unfinished(error.unfinished()))?;
    state.replays.remember(&new_key, &response, expires);
    Ok(Created { response, replayed: false })
}

/// Finishes a request that a worker took over from its vanished client: the same phases, from
/// the key's recovery point, with the request stored on the key. `run` names the worker's run in
/// the audit records it writes and in the problem it may store.
#[tracing::instrument(name = "payments.complete", skip_all, fields(idempotency_key.id = %abandoned.lock.key_id, attempt = abandoned.attempts, payment.id))]
pub async fn complete_abandoned(
    state: &AppState,
    abandoned: Abandoned,
    run: &RequestId,
) -> Result<StoredResponse, CreateError> {
    let Abandoned { lock, key, params, .. } = abandoned;
    match serde_json::from_value::<PaymentRequest>(params) {
        Ok(request) => Driver::new(state, lock, key, request, Actor::Completer, run.clone()).run().await,
        Err(error) => {
            let error = PhaseError::Inconsistent(format!("the stored request does not read as a payment: {error}"));
            let reason = Reason { code: Unfinished::Internal.as_str(), detail: &error.to_string() };
            release(state, &lock, Actor::Completer, reason, run).await;
            Err(error.into())
        }
    }
}

/// Which gateway call gave the definitive answer: the charge request, or (for a resumed key) the
/// look-up that found what an earlier run did, which is then adopted.
#[derive(Debug, Clone, Copy, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum AnsweredBy {
    Charge,
    LookUp,
}

/// Drives one claimed key from its recovery point to `finished`.
struct Driver<'a> {
    state: &'a AppState,
    lock: KeyLock,
    key: IdempotencyKey,
    request: PaymentRequest,
    /// Who drives the request: the API for its client, or a worker.
    actor: Actor,
    /// The HTTP request, or the worker's run, that drives the key now.
    request_id: RequestId,
    /// Held across consecutive database phases, returned to the pool before the gateway call.
    conn: Option<PooledConnection>,
    fault: Option<Fault>,
    /// The payment as the last phase left it, which saves the next phase reading it again.
    payment: Option<Payment>,
    response: Option<StoredResponse>,
}

impl<'a> Driver<'a> {
    fn new(
        state: &'a AppState,
        lock: KeyLock,
        key: IdempotencyKey,
        request: PaymentRequest,
        actor: Actor,
        request_id: RequestId,
    ) -> Self {
        Driver { state, lock, key, request, actor, request_id, conn: None, fault: None, payment: None, response: None }
    }

    /// Runs the protocol. If it stops short of `finished`, the key is unlocked where it stands, so
    /// a retry resumes at once (unless another request took the key over: then it is theirs).
    async fn run(mut self) -> Result<StoredResponse, CreateError> {
        let result = self.drive().await;
        if let Err(error) = &result
            && !matches!(error, CreateError::Phase(PhaseError::LockLost))
        {
            self.release(error).await;
        }
        result
    }

    /// The recovery-point loop: each arm runs from the recorded point to the next.
    async fn drive(&mut self) -> Result<StoredResponse, CreateError> {
        loop {
            match self.lock.recovery_point() {
                RecoveryPoint::Started => {
                    let payment = self.start().await?;
                    fault_at(self.fault, FaultPoint::AfterStarted);
                    let (outcome, answered_by) = self.charge(&payment).await?;
                    fault_at(self.fault, FaultPoint::AfterCharge);
                    self.record_charge(payment.id, outcome, answered_by).await?;
                }
                RecoveryPoint::ChargeCreated => {
                    fault_at(self.fault, FaultPoint::AfterChargeCreated);
                    self.finish().await?;
                }
                RecoveryPoint::Finished => {
                    return self
                        .response
                        .take()
                        .ok_or_else(|| PhaseError::Inconsistent("finished without a response".into()).into());
                }
            }
        }
    }

    /// `started`: the pending payment, with the gateway it is charged through, and its audit
    /// record. On resumption it finds the payment it made before instead of making another.
    async fn start(&mut self) -> Result<Payment, CreateError> {
        let gateway = self.state.gateway.id().await.map_err(indeterminate)?;
        let new = NewPayment {
            id: Uuid::now_v7(),
            account_id: self.lock.account_id,
            idempotency_key: self.key.as_str(),
            amount: self.request.amount,
            currency: &self.request.currency,
            description: self.request.description.as_deref(),
            metadata: json!(self.request.metadata),
            gateway: &gateway,
        };
        let data = json!({ "recovery_point": RecoveryPoint::Started, "amount": new.amount, "currency": new.currency,
                           "gateway": new.gateway });
        let audit = audit(new.account_id, new.id, self.actor, "payment.created", data, &self.request_id);
        let writes = writes::Start { payment: &new, audit };
        let conn = connection(&mut self.conn, self.state).await?;
        let payment: Payment = atomic_phase(conn, &mut self.lock, Transition::Stay, writes).await?;
        tracing::Span::current().record("payment.id", payment.id.to_string());
        Ok(payment)
    }

    /// The gateway call: the one foreign side effect. No transaction is open and no pooled
    /// connection is held while the gateway takes its time. Only at the payment's own gateway, and
    /// only while the lease surely outlasts the call.
    async fn charge(&mut self, payment: &Payment) -> Result<(ChargeOutcome, AnsweredBy), CreateError> {
        self.conn = None;
        let gateway = &self.state.gateway;
        let at = self.payments_gateway(payment).await?;
        let key = gateway::downstream_key(self.lock.account_id, self.lock.key_id);
        let request = ChargeRequest {
            amount: self.request.amount,
            currency: &self.request.currency,
            source: &self.request.source,
            description: self.request.description.as_deref(),
            metadata: &self.request.metadata,
        };
        // An earlier run may have charged and lost the answer: reconcile first, and adopt what it
        // did (a success or a decline). The look-up finds it even where the gateway has forgotten
        // the key (and would charge again if asked).
        let found = match self.lock.resumed() {
            true => {
                self.check_lease_outlasts_a_call()?;
                gateway.find_charge(&at, &key, &request).await
            }
            false => Ok(None),
        };
        let (answer, answered_by) = match found {
            Ok(Some(charge)) => {
                tracing::info!(gateway.charge_id = %charge.id, "adopting the charge an earlier run made");
                (Ok(charge), AnsweredBy::LookUp)
            }
            Ok(None) => {
                self.check_lease_outlasts_a_call()?;
                let answer = gateway.charge(&at, &key, &request).await;
                if let Err(GatewayError::OtherGateway { answered }) = &answer {
                    self.follow_charge_to(payment, answered).await?;
                }
                (answer, AnsweredBy::Charge)
            }
            Err(error) => (Err(error), AnsweredBy::LookUp),
        };
        let outcome = match answer {
            Ok(charge) => ChargeOutcome::Succeeded { charge_id: charge.id },
            Err(GatewayError::Declined { code, message }) => ChargeOutcome::Declined { code, message },
            Err(GatewayError::UnknownSource { message }) => ChargeOutcome::UnknownSource { message },
            Err(GatewayError::Rejected { status, message }) => {
                tracing::error!(gateway.status = status, %message, "the gateway rejected a charge request");
                ChargeOutcome::Rejected { message }
            }
            Err(error) => return Err(indeterminate(error)),
        };
        Ok((outcome, answered_by))
    }

    /// The gateway the payment is charged through, if it is this process's: only there may it be
    /// looked up or charged. A resumed payment may have been charged already, so the gateway is
    /// asked who it is now (this process's idea of it may be out of date): a gateway that replaced
    /// the payment's at its address would find nothing, and must not even be asked.
    async fn payments_gateway(&self, payment: &Payment) -> Result<Arc<str>, CreateError> {
        let gateway = &self.state.gateway;
        let recorded = payment.gateway.as_deref();
        let ours = match self.lock.resumed() {
            true => gateway.fresh_id().await,
            false => gateway.id().await,
        };
        let ours = ours.map_err(indeterminate)?;
        match recorded {
            Some(recorded) if recorded == &*ours => Ok(ours),
            _ => {
                let recorded = recorded.unwrap_or("(none recorded)").to_owned();
                Err(CreateError::WrongGateway { recorded, ours: ours.to_string() })
            }
        }
    }

    /// Another gateway than the payment's answered its charge request (this process's idea of
    /// the gateway was out of date: it was replaced at its address). That gateway is where a
    /// charge may now exist, and the payment's own was never asked to charge (a fresh key's
    /// gateway is asked nothing else; a resumed key's just found no charge there): record it as
    /// the payment's gateway, so that the retry reconciles there.
    async fn follow_charge_to(&mut self, payment: &Payment, answered: &str) -> Result<(), CreateError> {
        let data = json!({ "from": payment.gateway, "to": answered });
        let audit =
            audit(payment.account_id, payment.id, self.actor, "payment.gateway_changed", data, &self.request_id);
        let writes = writes::ChangePayment { payment_id: payment.id, change: PaymentChange::Gateway(answered), audit };
        let conn = connection(&mut self.conn, self.state).await?;
        let _: Payment = atomic_phase(conn, &mut self.lock, Transition::Stay, writes).await?;
        Ok(())
    }

    /// Refuses to start a gateway call that could still be running when the lease on the key ends
    /// (the call is bounded by the gateway timeout): past the lease, another driver may take the
    /// key over and call too. The margin covers the database's clock running ahead of ours.
    fn check_lease_outlasts_a_call(&self) -> Result<(), CreateError> {
        if self.lock.time_left() < self.state.settings.gateway_timeout + LEASE_MARGIN {
            tracing::warn!(lease_left = ?self.lock.time_left(), "the lease could run out during a gateway call; not calling");
            return Err(CreateError::LeaseRunningOut);
        }
        Ok(())
    }

    /// `charge_created`: the gateway's definitive answer, recorded on the payment.
    async fn record_charge(
        &mut self,
        payment_id: Uuid,
        outcome: ChargeOutcome,
        answered_by: AnsweredBy,
    ) -> Result<(), CreateError> {
        let changes = outcome.changes();
        let data = json!({ "recovery_point": RecoveryPoint::ChargeCreated, "status": changes.status,
                           "gateway_charge_id": changes.gateway_charge_id, "failure_code": changes.failure_code,
                           "answered_by": answered_by });
        let account_id = self.lock.account_id;
        let audit = audit(account_id, payment_id, self.actor, "payment.charge_recorded", data, &self.request_id);
        let writes = writes::ChangePayment { payment_id, change: PaymentChange::Outcome(changes), audit };
        let transition = Transition::Advance(RecoveryPoint::ChargeCreated);
        let conn = connection(&mut self.conn, self.state).await?;
        self.payment = Some(atomic_phase(conn, &mut self.lock, transition, writes).await?);
        Ok(())
    }

    /// `finished`: the response stored, the outbox event staged and the key unlocked, together.
    async fn finish(&mut self) -> Result<(), CreateError> {
        let (account_id, key_id) = (self.lock.account_id, self.lock.key_id);
        let conn = connection(&mut self.conn, self.state).await?;
        // Resumed at `charge_created`, the payment is read first: at this point only the lock's
        // holder may change it, and the phase below writes nothing if the lock was lost meanwhile.
        let payment = match self.payment.take() {
            Some(payment) => payment,
            None => db::query(Payment::find_by_key(conn, account_id, key_id))
                .await?
                .ok_or_else(|| PhaseError::Inconsistent(format!("key {key_id} is past `started` without a payment")))?,
        };
        let response = final_response(&payment, &self.request_id)?;
        let event = match payment.status {
            PaymentStatus::Succeeded => "payment.succeeded",
            _ => "payment.failed",
        };
        let event = StagedEvent::new(account_id, event, PaymentView::from(&payment));
        let data = json!({ "recovery_point": RecoveryPoint::Finished, "response_status": response.status });
        let audit = audit(account_id, payment.id, self.actor, "payment.finished", data, &self.request_id);
        let writes = writes::Finish { payment_id: payment.id, event: &event, audit };
        let transition =
            Transition::Finish { response: response.clone(), retention: self.state.settings.key_retention };
        let _: Payment = atomic_phase(conn, &mut self.lock, transition, writes).await?;
        let failure = payment.failure().map_or("none", |failure| failure.as_str());
        self.state.metrics.payment_finished(payment.status.as_str(), failure);
        self.response = Some(response);
        Ok(())
    }

    /// Unlocks the key where it stands.
    async fn release(&mut self, error: &CreateError) {
        // A connection that just failed may be broken, or still busy with a statement that timed
        // out: the pool drops it, and the release uses a fresh one.
        if let Some(conn) = self.conn.as_mut() {
            db::discard(conn);
        }
        self.conn = None;
        let reason = Reason { code: error.unfinished().as_str(), detail: &error.to_string() };
        release(self.state, &self.lock, self.actor, reason, &self.request_id).await;
    }
}

/// Unlocks a key where it stands, so a retry resumes at once (best effort: if even this fails,
/// the lock goes stale after the lock timeout and the key is taken over then).
async fn release(state: &AppState, lock: &KeyLock, actor: Actor, reason: Reason<'_>, request_id: &RequestId) {
    let result = async {
        let mut conn = db::connect(&state.db).await?;
        lock.release(&mut conn, actor, reason, request_id).await
    }
    .await;
    if let Err(error) = result {
        tracing::warn!(%error, "could not unlock the key; it unlocks when its lock goes stale");
    }
}

fn indeterminate(error: GatewayError) -> CreateError {
    tracing::warn!(%error, "gateway outcome unknown; the key stays at started");
    CreateError::GatewayIndeterminate(error)
}

/// The driver's connection, checked out on first use after the last release.
async fn connection<'c>(
    slot: &'c mut Option<PooledConnection>,
    state: &AppState,
) -> Result<&'c mut diesel_async::AsyncPgConnection, StoreError> {
    if slot.is_none() {
        *slot = Some(db::connect(&state.db).await?);
    }
    Ok(slot.as_mut().expect("checked out above"))
}

fn audit<'a>(
    account_id: Uuid,
    payment_id: Uuid,
    actor: Actor,
    action: &'a str,
    data: serde_json::Value,
    request_id: &'a RequestId,
) -> AuditRecord<'a> {
    let request_id = Some(request_id.as_str());
    AuditRecord { account_id, action, resource_type: "payment", resource_id: payment_id, actor, data, request_id }
}
