//! `POST /v1/refunds`: one refund request, driven through its recovery points by the same
//! idempotency driver as a payment. Only the phases are a refund's own.
//!
//! ```text
//!         claim + started            gateway refund                (no foreign effect)
//!   (new) ─────────► started ───────────────────────► refund_created ────────────────► finished
//!                    key row locked,                  answer recorded:                 response stored,
//!                    amount reserved                  succeeded, pending,              event staged, unlocked
//!                    on the payment,                  or failed (given back)
//!                    refund pending
//! ```
//!
//! - `started` decides, under the payment's row lock, whether there is anything to refund, and
//!   reserves the amount in the same transaction that records the pending refund: two refunds with
//!   different keys cannot both take the same money (see [`super::writes::Start`]). For a new key
//!   it runs in the claim's statement, as a payment's does; a resumed key runs it after the
//!   claim. A refusal
//!   (no such payment, not refundable, nothing left, too much) is stored under the key as its
//!   answer, by a `finished` phase that follows at once.
//! - The gateway call refunds the payment's charge at the payment's own gateway, under a key
//!   derived from our key row. A resumed key looks its refund up by that key first and adopts what
//!   it finds, exactly as a payment does, so a lost answer never makes a second refund. Only the
//!   charge's gateway can refund it: an answer from another gateway is never taken for its.
//! - `refund_created` records the answer. A success moves the amount from pending to refunded; a
//!   refusal or a failure gives it back; a refund the gateway left pending keeps it reserved, and
//!   a worker looks it up until it settles.
//! - `finished` stores the answer, stages the refund's event and unlocks.

use diesel::QueryResult;
use diesel_async::AsyncPgConnection;
use payments_protocol::{self as protocol, FirstCall, Recording};
use serde_json::json;
use uuid::Uuid;

use super::model::{GATEWAY_REJECTED, Refund, RefundStatus};
use super::request::{CreateRefundBody, RefundRequest};
use super::view::{RefundView, Refusal, expired_key_response, final_response};
use super::writes::{self, Reserved};
use crate::audit::{Actor, AuditRecord};
use crate::db;
use crate::db::wake::Wake;
use crate::faults::{Fault, FaultPoint, fault_at};
use crate::fields::ValidationError;
use crate::gateway::reports::KEEPS_REPORTS;
use crate::gateway::{self, GatewayError};
use crate::idempotency::{
    DriveError, Endpoint, NewKey, PhaseWrites, Phases, RecoveryPoint, RefusableStart, Run, Started, StartedRow,
    Starter, StoredResponse, Transition,
};
use crate::keyed::{Keyed, Resource};
use crate::request_id::RequestId;
use crate::state::AppState;
use crate::webhooks::events::StagedEvent;

/// `refund_created`: the gateway's answer is recorded on the refund (which may still be pending
/// there).
pub const REFUND_CREATED: RecoveryPoint = RecoveryPoint::new("refund_created");

/// The endpoint: a refund key is bound to it (used on another, it is a mismatch).
pub static ENDPOINT: Endpoint = Endpoint {
    method: "POST",
    path: "/v1/refunds",
    label: "refunds",
    points: &[REFUND_CREATED],
    made_in: "refunds",
    at_gateway: true,
};

/// `POST /v1/refunds`, as the registry lists it.
pub struct Create;

impl Keyed for Create {
    const ENDPOINT: &'static Endpoint = &ENDPOINT;
    type On = ();
    type Body = CreateRefundBody;
    type Request = RefundRequest;

    fn validate(body: CreateRefundBody, _: Option<Uuid>) -> Result<RefundRequest, ValidationError> {
        body.validate()
    }

    fn phases(state: &AppState, request: RefundRequest, fault: Option<Fault>) -> impl Phases + '_ {
        RefundPhases::new(state, request, fault)
    }

    async fn made(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        key_id: Option<Uuid>,
        key: &str,
    ) -> QueryResult<Option<Resource>> {
        let refund = match key_id {
            Some(key_id) => Refund::find_by_key(conn, account_id, key_id).await?,
            None => Refund::find_by_client_key(conn, account_id, key).await?,
        };
        Ok(refund.map(|refund| Resource {
            key_id: Some(refund.idempotency_key_id),
            resources: vec![("refund", refund.id)],
            shown: ("refund", json!(RefundView::from(&refund))),
            created_at: refund.created_at,
        }))
    }
}

/// How long after the gateway answered `pending` a refund is first looked up again: a refund that
/// settles within seconds (the mock gateway's take 2) is then found settled at the first look-up,
/// and the settler's backoff takes over for the slower ones.
pub const FIRST_SETTLE_DELAY: std::time::Duration = std::time::Duration::from_secs(3);

/// Which gateway call gave the answer recorded: the refund request, or (for a resumed key) the
/// look-up that found what an earlier run's request did.
#[derive(Debug, Clone, Copy, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum AnsweredBy {
    Refund,
    LookUp,
}

/// A refund's phases, from the key's recovery point to `finished`.
struct RefundPhases<'a> {
    state: &'a AppState,
    request: RefundRequest,
    fault: Option<Fault>,
    /// What `started` found, when it ran with the claim.
    started: Option<StartedRow<Reserved>>,
    /// The refund as the last phase left it, which saves the next phase reading it again.
    refund: Option<Refund>,
}

impl Phases for RefundPhases<'_> {
    type Started = StartedRow<Reserved>;

    /// `started`: it needs nothing but the request and the database.
    fn first_phase<'p>(&'p mut self, new: &'p NewKey<'p>) -> Option<impl PhaseWrites + 'p> {
        Some(self.start_writes(Starter::of_new(new)))
    }

    fn started_with_claim(&mut self, started: StartedRow<Reserved>) {
        self.started = Some(started);
    }

    /// The recovery-point loop's body: each arm runs from the recorded point to the next.
    async fn advance(&mut self, run: &mut Run<'_>) -> Result<(), DriveError> {
        match run.recovery_point() {
            RecoveryPoint::STARTED => {
                let with_claim = self.started.take();
                match run.start(&*self, with_claim).await? {
                    Started::Refused(refusal) => self.refuse(run, refusal).await,
                    Started::Made(reserved) => {
                        tracing::Span::current().record("refund.id", reserved.refund_id.to_string());
                        fault_at(self.fault, FaultPoint::AfterStarted);
                        let (answer, answered_by) = self.refund(run, &reserved).await?;
                        fault_at(self.fault, FaultPoint::AfterRefund);
                        let outcome = RefundOutcome::of(answer)?;
                        match protocol::recording(reserved.made_now) {
                            Recording::WithFinish => self.record_and_finish(run, &reserved, outcome, answered_by).await,
                            Recording::ThenFinish => self.record_refund(run, &reserved, outcome, answered_by).await,
                        }
                    }
                }
            }
            REFUND_CREATED => {
                fault_at(self.fault, FaultPoint::AfterRefundCreated);
                self.finish(run).await
            }
            point => Err(DriveError::inconsistent(format!("a refund's key at {point}"))),
        }
    }

    async fn expired_answer(&mut self, new: &NewKey<'_>, made: Uuid) -> Result<StoredResponse, DriveError> {
        let mut conn = db::connect(&self.state.db).await?;
        let refund = db::query(Refund::find(&mut conn, new.account_id, made)).await?;
        let refund = refund.ok_or_else(|| DriveError::inconsistent(format!("refund {made} vanished")))?;
        Ok(expired_key_response(&refund, new.request_id))
    }
}

impl RefusableStart for RefundPhases<'_> {
    type Made = Reserved;
    type Refusal = Refusal;

    /// What `started` writes: see [`writes::Start`]. On resumption it finds the refund an earlier
    /// run made instead of reserving again.
    fn start_writes<'w>(&'w self, by: Starter<'w>) -> impl PhaseWrites + 'w {
        let Starter { account_id, key, actor, request_id } = by;
        let refund_id = Uuid::now_v7();
        let data = json!({ "recovery_point": RecoveryPoint::STARTED, "payment": self.request.payment,
                           "amount": self.request.amount });
        writes::Start {
            refund_id,
            account_id,
            payment_id: self.request.payment,
            amount: self.request.amount,
            idempotency_key: key.as_str(),
            reason: self.request.reason.map(|reason| reason.as_str()),
            metadata: json!(self.request.metadata),
            audit: audit(account_id, refund_id, actor, "refund.created", data, request_id),
        }
    }
}

impl<'a> RefundPhases<'a> {
    fn new(state: &'a AppState, request: RefundRequest, fault: Option<Fault>) -> Self {
        RefundPhases { state, request, fault, started: None, refund: None }
    }

    /// Stores a refusal as the key's answer: there is no refund, and nothing was asked of the
    /// gateway.
    async fn refuse(&mut self, run: &mut Run<'_>, refusal: Refusal) -> Result<(), DriveError> {
        let response = refusal.response(self.request.payment, run.request_id());
        let data = json!({ "recovery_point": RecoveryPoint::FINISHED, "response_status": response.status,
                           "refusal": refusal.code(), "payment": self.request.payment });
        run.refuse(response, "refund.refused", data, KEEPS_REPORTS).await
    }

    /// The gateway call, the one foreign side effect, at the payment's own gateway, with no
    /// transaction open and no pooled connection held, and only while the lease outlasts it.
    async fn refund(
        &mut self,
        run: &mut Run<'_>,
        reserved: &Reserved,
    ) -> Result<(Result<gateway::Refund, GatewayError>, AnsweredBy), DriveError> {
        run.let_go_of_connection();
        let (gateway, call) = (&self.state.gateway, self.state.settings.gateway_timeout);
        let key = gateway::downstream_key(run.lock().account_id, run.lock().key_id);
        let request = gateway::RefundRequest {
            charge: &reserved.charge_id,
            amount: reserved.amount,
            reason: self.request.reason.map(|reason| reason.as_str()),
            metadata: &self.request.metadata,
        };
        // An earlier run may have asked and lost the answer: find what it did, and adopt it.
        if protocol::first_call(run.lock().resumed()) == FirstCall::LookUp {
            run.check_lease_outlasts(call)?;
            let found = gateway.find_refund(&key, &request).await.map_err(indeterminate)?;
            // Only the charge's own gateway's answer is one (see `Answered::ours`).
            if let Some(answer) = found.ours(&reserved.gateway)? {
                tracing::info!("adopting what an earlier run's refund request did");
                return Ok((answer, AnsweredBy::LookUp));
            }
        }
        run.check_lease_outlasts(call)?;
        let answered = gateway.refund(&key, &request).await.map_err(indeterminate)?;
        let answer = answered.ours(&reserved.gateway)?;
        Ok((answer, AnsweredBy::Refund))
    }

    /// `refund_created`: the gateway's answer, recorded on the refund and the payment's totals.
    async fn record_refund(
        &mut self,
        run: &mut Run<'_>,
        reserved: &Reserved,
        outcome: RefundOutcome,
        answered_by: AnsweredBy,
    ) -> Result<(), DriveError> {
        let request_id = run.request_id().clone();
        let writes = outcome.writes(run, reserved.refund_id, answered_by, &request_id);
        self.refund = Some(run.phase(Transition::Advance(REFUND_CREATED), writes).await?);
        Ok(())
    }

    /// `refund_created` and `finished` in one statement (see [`writes::RecordAndFinishRefund`]),
    /// for a refund this run made: the refund as the answer leaves it is known before the database
    /// records it, and so are its response and event.
    async fn record_and_finish(
        &mut self,
        run: &mut Run<'_>,
        reserved: &Reserved,
        outcome: RefundOutcome,
        answered_by: AnsweredBy,
    ) -> Result<(), DriveError> {
        let request_id = run.request_id().clone();
        let record = outcome.writes(run, reserved.refund_id, answered_by, &request_id);
        let refund = Refund {
            id: reserved.refund_id,
            account_id: record.account_id,
            payment_id: self.request.payment,
            idempotency_key_id: run.lock().key_id,
            idempotency_key: run.key().as_str().to_owned(),
            amount: reserved.amount,
            currency: reserved.currency.clone(),
            reason: self.request.reason.map(|reason| reason.as_str().to_owned()),
            metadata: json!(self.request.metadata),
            status: outcome.status,
            gateway: reserved.gateway.clone(),
            gateway_refund_id: outcome.gateway_refund_id.clone(),
            failure_code: outcome.failure_code.clone(),
            failure_message: record.failure_message.map(str::to_owned),
            created_at: reserved.created_at,
            updated_at: reserved.created_at,
        };
        let (response, event, finished) = finishing(run, &refund, &request_id);
        let writes = writes::RecordAndFinishRefund {
            record,
            settle_in_ms: writes::millis(FIRST_SETTLE_DELAY),
            event: &event,
            finished,
        };
        #[cfg(debug_assertions)]
        let answered = response.body.clone();
        let stored: Refund = run.finish(response, Some(refund.id), writes).await?;
        // The answer says what the database recorded: the tests' builds check it.
        #[cfg(debug_assertions)]
        assert_eq!(final_response(&stored, &request_id).body, answered, "refund {} as recorded", stored.id);
        self.finished(&stored);
        Ok(())
    }

    /// `finished`: the response stored, the refund's event staged (and a pending refund handed to
    /// the settler) and the key unlocked, together.
    async fn finish(&mut self, run: &mut Run<'_>) -> Result<(), DriveError> {
        let (account_id, key_id, request_id) = (run.lock().account_id, run.lock().key_id, run.request_id().clone());
        // Resumed at `refund_created`, the refund is read first: only the lock's holder changes it
        // until it is finished, and the phase below writes nothing if the lock was lost meanwhile.
        let refund = match self.refund.take() {
            Some(refund) => refund,
            None => db::query(Refund::find_by_key(run.connection().await?, account_id, key_id))
                .await?
                .ok_or_else(|| DriveError::inconsistent(format!("key {key_id} is past `started` without a refund")))?,
        };
        let (response, event, audit) = finishing(run, &refund, &request_id);
        let writes = writes::FinishRefund {
            account_id,
            refund_id: refund.id,
            settle_in_ms: writes::millis(FIRST_SETTLE_DELAY),
            event: &event,
            audit,
        };
        let _: writes::Finished = run.finish(response, Some(refund.id), writes).await?;
        self.finished(&refund);
        Ok(())
    }

    /// After a refund's key finished: the outbox woken for its event, a pending refund's settler
    /// too (at once if its gateway's event came already, else after its first delay), and the
    /// refund counted.
    fn finished(&self, refund: &Refund) {
        self.state.wake.wake(Wake::Outbox);
        if refund.status == RefundStatus::Pending {
            self.state.wake.wake(Wake::Settler);
            self.state.wake.wake_after(Wake::Settler, FIRST_SETTLE_DELAY);
        }
        self.state.metrics.refund_finished(refund.status.as_str());
    }
}

/// The gateway's answer about a refund, as `refund_created` records it.
struct RefundOutcome {
    status: RefundStatus,
    gateway_refund_id: Option<String>,
    failure_code: Option<String>,
    failure_message: Option<String>,
}

impl RefundOutcome {
    /// What an answer records: where the refund stands, or its refusal (a failure); an answer
    /// that leaves it unknown records nothing.
    fn of(answer: Result<gateway::Refund, GatewayError>) -> Result<RefundOutcome, DriveError> {
        let recorded = |status, id, code, message| RefundOutcome {
            status,
            gateway_refund_id: id,
            failure_code: code,
            failure_message: message,
        };
        Ok(match answer {
            Ok(refund) => match refund.status {
                gateway::RefundStatus::Succeeded => recorded(RefundStatus::Succeeded, Some(refund.id), None, None),
                gateway::RefundStatus::Pending => recorded(RefundStatus::Pending, Some(refund.id), None, None),
                gateway::RefundStatus::Failed { code } => {
                    recorded(RefundStatus::Failed, Some(refund.id), Some(code), None)
                }
            },
            Err(
                error @ (GatewayError::Rejected { .. }
                | GatewayError::Declined { .. }
                | GatewayError::UnknownSource { .. }),
            ) => {
                tracing::error!(%error, "the gateway refused a refund");
                recorded(RefundStatus::Failed, None, Some(GATEWAY_REJECTED.to_owned()), Some(error.to_string()))
            }
            Err(error) => return Err(indeterminate(error)),
        })
    }

    /// `refund_created`'s writes, with its audit record.
    fn writes<'a>(
        &'a self,
        run: &Run<'_>,
        refund_id: Uuid,
        answered_by: AnsweredBy,
        request_id: &'a RequestId,
    ) -> writes::RecordRefund<'a> {
        let account_id = run.lock().account_id;
        let data = json!({ "recovery_point": REFUND_CREATED, "status": self.status,
                           "gateway_refund_id": self.gateway_refund_id, "failure_code": self.failure_code,
                           "answered_by": answered_by });
        writes::RecordRefund {
            account_id,
            refund_id,
            status: self.status,
            gateway_refund_id: self.gateway_refund_id.as_deref(),
            failure_code: self.failure_code.as_deref(),
            failure_message: self.failure_message.as_deref().map(|message| crate::fields::truncated(message, 500)),
            audit: audit(account_id, refund_id, run.actor(), "refund.outcome_recorded", data, request_id),
        }
    }
}

/// What `finished` writes for `refund` as recorded: the response to store, the event and the
/// audit record.
fn finishing<'a>(
    run: &Run<'_>,
    refund: &Refund,
    request_id: &'a RequestId,
) -> (StoredResponse, StagedEvent, AuditRecord<'a>) {
    let response = final_response(refund, request_id);
    let event = StagedEvent::new(refund.account_id, event_of(refund.status), RefundView::from(refund));
    let data = json!({ "recovery_point": RecoveryPoint::FINISHED, "response_status": response.status });
    let audit = audit(refund.account_id, refund.id, run.actor(), "refund.finished", data, request_id);
    (response, event, audit)
}

/// The event that announces a refund in `status`.
pub(super) fn event_of(status: RefundStatus) -> &'static str {
    match status {
        RefundStatus::Pending => "refund.created",
        RefundStatus::Succeeded => "refund.succeeded",
        RefundStatus::Failed => "refund.failed",
    }
}

fn indeterminate(error: GatewayError) -> DriveError {
    tracing::warn!(%error, "gateway outcome unknown; the refund's key stays at started");
    DriveError::OutcomeUnknown(Box::new(error))
}

fn audit<'a>(
    account_id: Uuid,
    refund_id: Uuid,
    actor: Actor,
    action: &'a str,
    data: serde_json::Value,
    request_id: &'a RequestId,
) -> AuditRecord<'a> {
    let request_id = Some(request_id.as_str());
    AuditRecord { account_id, action, resource_type: "refund", resource_id: refund_id, actor, data, request_id }
}
