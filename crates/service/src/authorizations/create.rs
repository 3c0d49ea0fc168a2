//! `POST /v1/payments/{id}/capture` and `/cancel`: a change of an authorized payment, driven
//! through its recovery points by the same idempotency driver as a payment and a refund. Only the
//! phases are a change's own.
//!
//! ```text
//!         claim + started            gateway capture or cancel       (no foreign effect)
//!   (new) ─────────► started ──────────────────────────► capture_created ───────────────► finished
//!                    key row locked,          │          or cancel_created:               response stored,
//!                    the change made,         │          the answer recorded on           event staged, unlocked
//!                    if it is the one         │          the change and the payment            ▲
//!                    that stands              └────────────────────────────────────────────────┘
//!                                             a change this run made: recorded and finished at once
//! ```
//!
//! - `started` decides whether the payment is an authorization still open, and makes the change in
//!   the same statement; a unique index lets one change stand per payment, so a capture, a cancel and the lapse racing under different keys cannot both win (see
//!   [`super::writes::Start`]). A refusal (no such payment, not an open authorization or another
//!   change took it, more than was authorized) is stored under the key as its answer.
//! - The gateway call captures or cancels the payment's charge at the payment's own gateway, under
//!   a key derived from our key row. A resumed key reads the charge first and adopts what an
//!   earlier run did; a gateway that says the charge was captured or cancelled already is read too.
//! - `capture_created` / `cancel_created` records the answer: done (the payment captured, for what
//!   the gateway says, or cancelled), or refused for good (the change fails, and the payment is an
//!   open authorization again, unless the gateway says the charge ended otherwise: then the
//!   payment ends as the charge did).
//! - `finished` stores the answer (`200` with the payment, or `502`), stages `payment.captured` or
//!   `payment.canceled` if the authorization ended, and unlocks.
//! - A run that made the change records the answer and finishes in one statement
//!   ([`writes::RecordAndFinish`]), as a payment's does (`payments_protocol::recording`): nothing
//!   but the change alters the payment while the change stands, so `started` returns the payment
//!   as it found it, and the run knows the answer, a cancel's time included, before the database
//!   records it. A run that took up an earlier run's change records, then finishes.

use std::marker::PhantomData;

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use payments_protocol::{self as protocol, FirstCall, Recording};
use serde_json::json;
use uuid::Uuid;

use super::request::{CancelBody, CancellationReason, CaptureBody, ChangeBody, ChangeKind, ChangeRequest};
use super::view::{Refusal, done_response, rejected_response};
use super::writes::{self, Made, PaymentEnd};
use crate::audit::{Actor, AuditRecord};
use crate::db;
use crate::db::schema::payment_changes;
use crate::db::wake::Wake;
use crate::faults::{Fault, FaultPoint, fault_at};
use crate::fields::ValidationError;
use crate::gateway::reports::KEEPS_REPORTS;
use crate::gateway::{self, Authorization, Changed, GatewayError};
use crate::idempotency::{
    DatabaseClock, DriveError, Endpoint, IdempotencyKey, KeyedRequest, NewKey, PhaseWrites, Phases, RecoveryPoint,
    RefusableStart, Reply, Run, Started, StartedRow, Starter, StoredResponse, Transition,
};
use crate::keyed::{Keyed, Resource};
use crate::payments::{Payment, PaymentStatus, PaymentView};
use crate::request_id::RequestId;
use crate::state::AppState;
use crate::webhooks::events::StagedEvent;

/// `capture_created`, `cancel_created`: the gateway's answer to a capture or a cancel is recorded
/// on the change and the payment.
pub const CAPTURE_CREATED: RecoveryPoint = RecoveryPoint::new("capture_created");
pub const CANCEL_CREATED: RecoveryPoint = RecoveryPoint::new("cancel_created");

/// The endpoints: a key is bound to one (used on another, it is a mismatch); the payment, from
/// the path, is part of the request, so the same key on another payment is one too. A key of
/// either makes a change, in `payment_changes`.
pub static CAPTURE: Endpoint = Endpoint {
    method: "POST",
    path: "/v1/payments/{id}/capture",
    label: "captures",
    points: &[CAPTURE_CREATED],
    made_in: "payment_changes",
    at_gateway: true,
};
pub static CANCEL: Endpoint = Endpoint {
    method: "POST",
    path: "/v1/payments/{id}/cancel",
    label: "cancels",
    points: &[CANCEL_CREATED],
    made_in: "payment_changes",
    at_gateway: true,
};

/// `POST /v1/payments/{id}/capture` and `/cancel`, as the registry lists them: `B` is the body,
/// which says which.
pub struct Change<B>(PhantomData<B>);

/// `POST /v1/payments/{id}/capture`.
pub type Capture = Change<CaptureBody>;

/// `POST /v1/payments/{id}/cancel`.
pub type Cancel = Change<CancelBody>;

impl<B: ChangeBody> Keyed for Change<B> {
    const ENDPOINT: &'static Endpoint = B::ENDPOINT;
    type On = Payment;
    type Body = B;
    type Request = ChangeRequest;

    fn validate(body: B, on: Option<Uuid>) -> Result<ChangeRequest, ValidationError> {
        let payment = on.ok_or_else(|| ValidationError::new("the path names no payment"))?;
        body.validate(payment)
    }

    fn phases(state: &AppState, request: ChangeRequest, fault: Option<Fault>) -> impl Phases + '_ {
        ChangePhases::new(state, request, fault)
    }

    /// A change of a payment: the story shows the payment as it stands.
    async fn made(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        key_id: Option<Uuid>,
        key: &str,
    ) -> QueryResult<Option<Resource>> {
        let Some(change) = made_by_key(conn, account_id, key_id, key).await? else { return Ok(None) };
        let Some(payment) = Payment::find(conn, account_id, change.payment_id).await? else { return Ok(None) };
        Ok(Some(Resource {
            key_id: Some(change.key_id),
            resources: vec![("payment_change", change.id)],
            shown: ("payment", json!(PaymentView::facts_only(&payment))),
            created_at: payment.created_at,
        }))
    }
}

/// Cancels the account's authorization `payment_id`, past its `capture_before`, at the gateway too
/// (`cancellation_reason: expired`), as a client's cancel would: under a key of the lapse's own, so
/// that the race with a capture or a cancel is decided by the same rule, and a lapse whose worker
/// died is finished by the completer. Each attempt has a key of its own, which no client can have
/// taken: if another change stands meanwhile, this one is refused, and leaves the payment to it.
#[tracing::instrument(name = "payments.lapse", skip_all, fields(account.id = %account_id, payment.id = %payment_id, idempotency_key.id))]
pub async fn lapse(state: &AppState, account_id: Uuid, payment_id: Uuid, run: &RequestId) -> Result<Reply, DriveError> {
    let key = format!("lapse:{payment_id}:{}", Uuid::new_v4());
    let key = IdempotencyKey::parse(key.as_bytes()).map_err(|error| DriveError::inconsistent(error.to_string()))?;
    let request = ChangeRequest {
        amount: None,
        kind: ChangeKind::Cancel,
        payment: payment_id,
        reason: Some(CancellationReason::Expired),
    };
    let create = KeyedRequest::new(account_id, key, &CANCEL, request);
    create.answer_as(state.keys(), run, Actor::Lapser, |request| ChangePhases::new(state, request, None)).await
}

/// What the gateway did with the change: done, and how the payment ends; or refused for good,
/// and how the payment ends if the gateway says the charge ended otherwise (the payment records
/// what the gateway says, rather than stay an authorization the gateway has closed).
enum Outcome {
    Done(PaymentEnd),
    Refused { code: &'static str, message: String, ends: Option<PaymentEnd> },
}

/// A change's phases, from the key's recovery point to `finished`.
struct ChangePhases<'a> {
    state: &'a AppState,
    request: ChangeRequest,
    fault: Option<Fault>,
    /// What `started` found, when it ran with the claim.
    started: Option<StartedRow<Made>>,
    /// The change's id, the payment, and whether the change was done, as `*_created` left them.
    recorded: Option<(Uuid, Payment, bool)>,
}

impl Phases for ChangePhases<'_> {
    type Started = StartedRow<Made>;

    /// `started`: it needs nothing but the request and the database.
    fn first_phase<'p>(&'p mut self, new: &'p NewKey<'p>) -> Option<impl PhaseWrites + 'p> {
        Some(self.start_writes(Starter::of_new(new)))
    }

    fn started_with_claim(&mut self, started: StartedRow<Made>) {
        self.started = Some(started);
    }

    /// The recovery-point loop's body: each arm runs from the recorded point to the next.
    async fn advance(&mut self, run: &mut Run<'_>) -> Result<(), DriveError> {
        match run.recovery_point() {
            RecoveryPoint::STARTED => {
                let with_claim = self.started.take();
                match run.start(&*self, with_claim).await? {
                    Started::Refused(refusal) => self.refuse(run, refusal).await,
                    Started::Made(mut made) => {
                        // Read now, while the statement that made the change is the last to have
                        // renewed the lease: it was made at that statement's `now()`.
                        let now = made.now.take().map(|(payment, at)| (payment, run.database_clock(at)));
                        fault_at(self.fault, FaultPoint::AfterStarted);
                        let outcome = self.call(run, &made).await?;
                        fault_at(self.fault, FaultPoint::AfterChange);
                        match (protocol::recording(now.is_some()), now) {
                            (Recording::WithFinish, Some((payment, clock))) => {
                                self.record_and_finish(run, &made, payment, outcome, clock).await
                            }
                            _ => self.record(run, &made, outcome).await,
                        }
                    }
                }
            }
            CAPTURE_CREATED | CANCEL_CREATED => {
                fault_at(self.fault, FaultPoint::AfterChangeCreated);
                self.finish(run).await
            }
            point => Err(DriveError::inconsistent(format!("a {} key at {point}", self.request.kind.as_str()))),
        }
    }

    /// A late retry whose key was reaped: `410`, naming the payment the change was of.
    async fn expired_answer(&mut self, new: &NewKey<'_>, made: Uuid) -> Result<StoredResponse, DriveError> {
        let mut conn = db::connect(&self.state.db).await?;
        let payment_id = db::query(
            payment_changes::table
                .filter(payment_changes::account_id.eq(new.account_id))
                .filter(payment_changes::id.eq(made))
                .select(payment_changes::payment_id)
                .get_result::<Uuid>(&mut conn),
        )
        .await?;
        let payment = db::query(Payment::find(&mut conn, new.account_id, payment_id)).await?;
        let payment = payment.ok_or_else(|| DriveError::inconsistent(format!("payment {payment_id} vanished")))?;
        Ok(super::view::expired_key_response(self.kind(), &payment, new.request_id))
    }
}

impl RefusableStart for ChangePhases<'_> {
    type Made = Made;
    type Refusal = Refusal;

    /// What `started` writes: see [`writes::Start`]. On resumption it finds the change an earlier
    /// run made.
    fn start_writes<'w>(&'w self, by: Starter<'w>) -> impl PhaseWrites + 'w {
        let Starter { account_id, key, actor, request_id } = by;
        let change_id = Uuid::now_v7();
        let kind = self.kind().as_str();
        let data = json!({ "recovery_point": RecoveryPoint::STARTED, "kind": kind, "payment": self.request.payment,
                           "amount": self.request.amount });
        writes::Start {
            change_id,
            account_id,
            payment_id: self.request.payment,
            kind,
            amount: self.request.amount,
            reason: self.request.reason.map(|reason| reason.as_str()),
            idempotency_key: key.as_str(),
            audit: audit(account_id, change_id, actor, action(self.kind(), "started"), data, request_id),
        }
    }
}

impl<'a> ChangePhases<'a> {
    fn new(state: &'a AppState, request: ChangeRequest, fault: Option<Fault>) -> Self {
        ChangePhases { state, request, fault, started: None, recorded: None }
    }

    fn kind(&self) -> ChangeKind {
        self.request.kind
    }

    /// Stores a refusal as the key's answer, naming the payment as it stands: nothing was asked of
    /// the gateway.
    async fn refuse(&mut self, run: &mut Run<'_>, refusal: Refusal) -> Result<(), DriveError> {
        let (account_id, request_id) = (run.lock().account_id, run.request_id().clone());
        let payment = db::query(Payment::find(run.connection().await?, account_id, self.request.payment)).await?;
        let response = refusal.response(self.kind(), self.request.payment, payment.as_ref(), &request_id);
        let data = json!({ "recovery_point": RecoveryPoint::FINISHED, "response_status": response.status,
                           "refusal": refusal.code(self.kind()) });
        run.refuse(response, action(self.kind(), "refused"), data, KEEPS_REPORTS).await
    }

    /// The gateway call, the one foreign side effect, at the payment's own gateway, with no
    /// transaction open, and only while the lease outlasts it. A key taken up again reads the
    /// charge first: what an earlier run did is adopted, never done twice.
    async fn call(&mut self, run: &mut Run<'_>, made: &Made) -> Result<Outcome, DriveError> {
        run.let_go_of_connection();
        let (gateway, call) = (&self.state.gateway, self.state.settings.gateway_timeout);
        if protocol::first_call(run.lock().resumed()) == FirstCall::LookUp {
            run.check_lease_outlasts(call)?;
            let read = gateway.get_charge(&made.charge_id).await.map_err(indeterminate)?.ours(&made.gateway)?;
            match read {
                Some(Authorization::Open) => {}
                read => return Ok(self.settled_by(made, read)),
            }
        }
        run.check_lease_outlasts(call)?;
        let key = gateway::downstream_key(run.lock().account_id, run.lock().key_id);
        let answered = match self.kind() {
            ChangeKind::Capture => {
                let request = gateway::CaptureRequest { amount: made.amount.unwrap_or_default() };
                gateway.capture(&key, &made.charge_id, &request).await
            }
            ChangeKind::Cancel => gateway.cancel(&key, &made.charge_id).await,
        };
        match answered.map_err(indeterminate)?.ours(&made.gateway)? {
            Ok(Changed::Now(authorization)) => Ok(self.settled_by(made, Some(authorization))),
            // Captured or cancelled before (by this key, under a key the gateway forgot, or by
            // the other change): the charge says which.
            Ok(Changed::Before) => {
                run.check_lease_outlasts(call)?;
                let read = gateway.get_charge(&made.charge_id).await.map_err(indeterminate)?.ours(&made.gateway)?;
                Ok(self.settled_by(made, read))
            }
            Err(error @ (GatewayError::Rejected { .. } | GatewayError::Declined { .. })) => {
                tracing::error!(%error, "the gateway refused a {}", self.kind().as_str());
                Ok(Outcome::Refused { code: crate::payments::GATEWAY_REJECTED, message: error.to_string(), ends: None })
            }
            Err(error) => Err(indeterminate(error)),
        }
    }

    /// What the charge's state says of this change `made`: done if it is what the change does; refused
    /// for good if the charge ended otherwise (and the payment ends as it did). A charge still open
    /// after the change's answer, or unknown to its own gateway, is refused, the payment left open.
    fn settled_by(&self, made: &Made, charge: Option<Authorization>) -> Outcome {
        let ends = match charge {
            Some(Authorization::Captured { amount }) => Some(PaymentEnd::Captured(amount)),
            Some(Authorization::Canceled) => Some(PaymentEnd::Canceled),
            Some(Authorization::Open | Authorization::Failed) | None => None,
        };
        let refused = |code, message: &str| Outcome::Refused { code, message: message.to_owned(), ends };
        match (self.kind(), charge) {
            // Captured for what this capture asked: its own (or one no gateway could tell from
            // it). Captured for another amount, someone else captured it (the gateway's
            // dashboard, say): refused, the payment recording what the gateway captured.
            (ChangeKind::Capture, Some(Authorization::Captured { amount })) if made.amount == Some(amount) => {
                Outcome::Done(PaymentEnd::Captured(amount))
            }
            (ChangeKind::Cancel, Some(Authorization::Canceled)) => Outcome::Done(PaymentEnd::Canceled),
            (_, Some(Authorization::Captured { .. })) => refused("charge_already_captured", "the charge is captured"),
            (_, Some(Authorization::Canceled)) => refused("charge_canceled", "the charge is cancelled"),
            (_, Some(Authorization::Failed)) => refused("charge_failed", "the charge failed"),
            (_, Some(Authorization::Open) | None) => {
                refused(crate::payments::GATEWAY_REJECTED, "the gateway does not show the change done")
            }
        }
    }

    /// `capture_created` or `cancel_created`: the gateway's answer, recorded on the change and the
    /// payment.
    async fn record(&mut self, run: &mut Run<'_>, made: &Made, outcome: Outcome) -> Result<(), DriveError> {
        let request_id = run.request_id().clone();
        let writes = self.recorded(run, made, &outcome, &request_id);
        let done = writes.status == "succeeded";
        let payment: Payment = run.phase(Transition::Advance(self.created_point()), writes).await?;
        self.recorded = Some((made.change_id, payment, done));
        Ok(())
    }

    /// `capture_created` (or `cancel_created`) and `finished` in one statement (see
    /// [`writes::RecordAndFinish`]), for a change this run made: `payment` as the change found it,
    /// which nothing else alters while the change stands, so the payment as the answer leaves it,
    /// and the response and event with it, are known before the database records them.
    async fn record_and_finish(
        &mut self,
        run: &mut Run<'_>,
        made: &Made,
        payment: Payment,
        outcome: Outcome,
        clock: DatabaseClock,
    ) -> Result<(), DriveError> {
        let request_id = run.request_id().clone();
        let record = self.recorded(run, made, &outcome, &request_id);
        let done = record.status == "succeeded";
        let (now, found_updated_at) = (clock.now(), payment.updated_at);
        let after = match record.ends {
            Some(PaymentEnd::Captured(amount)) => {
                Payment { status: PaymentStatus::Succeeded, captured: Some(amount), canceled_at: None, ..payment }
            }
            Some(PaymentEnd::Canceled) => Payment {
                status: PaymentStatus::Canceled,
                canceled_at: Some(now),
                cancellation_reason: done.then(|| self.request.reason.map(|r| r.as_str().to_owned())).flatten(),
                ..payment
            },
            None => payment,
        };
        let canceled_at = matches!(record.ends, Some(PaymentEnd::Canceled)).then_some(now);
        let (response, event, finished) = self.finishing(run, made.change_id, &after, done, &request_id);
        let writes = writes::RecordAndFinish { record, found_updated_at, canceled_at, event: event.as_ref(), finished };
        #[cfg(debug_assertions)]
        let answered = response.body.clone();
        #[cfg_attr(not(debug_assertions), allow(unused_variables))]
        let stored: Payment = run.finish(response, Some(made.change_id), writes).await?;
        // The answer says what the database recorded: the tests' builds check it.
        #[cfg(debug_assertions)]
        assert_eq!(self.finishing(run, made.change_id, &stored, done, &request_id).0.body, answered, "{}", stored.id);
        if event.is_some() {
            self.state.wake.wake(Wake::Outbox);
        }
        Ok(())
    }

    /// The key's point once the gateway's answer is recorded.
    fn created_point(&self) -> RecoveryPoint {
        match self.kind() {
            ChangeKind::Capture => CAPTURE_CREATED,
            ChangeKind::Cancel => CANCEL_CREATED,
        }
    }

    /// What recording `outcome` writes on the change and the payment, with its audit record.
    fn recorded<'w>(
        &self,
        run: &Run<'_>,
        made: &Made,
        outcome: &'w Outcome,
        request_id: &'w RequestId,
    ) -> writes::RecordChange<'w> {
        let (status, ends, failure_code, failure_message) = match outcome {
            Outcome::Done(ends) => ("succeeded", Some(*ends), None, None),
            Outcome::Refused { code, message, ends } => ("failed", *ends, Some(*code), Some(message.as_str())),
        };
        let captured = match ends {
            Some(PaymentEnd::Captured(amount)) => Some(amount),
            _ => None,
        };
        let account_id = run.lock().account_id;
        let data = json!({ "recovery_point": self.created_point(), "status": status, "captured": captured,
                           "failure_code": failure_code });
        let audit = audit(account_id, made.change_id, run.actor(), action(self.kind(), "recorded"), data, request_id);
        writes::RecordChange {
            account_id,
            change_id: made.change_id,
            payment_id: self.request.payment,
            status,
            ends,
            failure_code,
            failure_message: failure_message.map(|message| crate::fields::truncated(message, 500)),
            audit,
        }
    }

    /// What finishing stores and stages for the change `change_id`, done or not, that left
    /// `payment` as it is: the response, the payment's event if its authorization ended (by this
    /// change, or otherwise, as the gateway said when it refused the change), and the record.
    fn finishing<'w>(
        &self,
        run: &Run<'_>,
        change_id: Uuid,
        payment: &Payment,
        done: bool,
        request_id: &'w RequestId,
    ) -> (StoredResponse, Option<StagedEvent>, AuditRecord<'w>) {
        let account_id = run.lock().account_id;
        let response = match done {
            true => done_response(payment),
            false => rejected_response(self.kind(), payment, request_id),
        };
        let name = match payment.status {
            PaymentStatus::Succeeded => Some("payment.captured"),
            PaymentStatus::Canceled => Some("payment.canceled"),
            _ => None,
        };
        let event = name.map(|name| StagedEvent::new(account_id, name, PaymentView::from(payment)));
        let data = json!({ "recovery_point": RecoveryPoint::FINISHED, "response_status": response.status });
        let audit = audit(account_id, change_id, run.actor(), action(self.kind(), "finished"), data, request_id);
        (response, event, audit)
    }

    /// `finished`: the response stored, the payment's event staged if its authorization ended, and
    /// the key unlocked, together.
    async fn finish(&mut self, run: &mut Run<'_>) -> Result<(), DriveError> {
        let (account_id, key_id, request_id) = (run.lock().account_id, run.lock().key_id, run.request_id().clone());
        // Resumed at `*_created`, the change and the payment are read first: only the lock's
        // holder changes them until the key is finished.
        let (change_id, payment, done) = match self.recorded.take() {
            Some(recorded) => recorded,
            None => {
                let conn = run.connection().await?;
                let (change_id, status): (Uuid, String) = db::query(
                    payment_changes::table
                        .filter(payment_changes::account_id.eq(account_id))
                        .filter(payment_changes::idempotency_key_id.eq(key_id))
                        .select((payment_changes::id, payment_changes::status))
                        .get_result(conn),
                )
                .await?;
                let payment = db::query(Payment::find(conn, account_id, self.request.payment)).await?;
                let payment = payment.ok_or_else(|| DriveError::inconsistent("a change's payment vanished"))?;
                (change_id, payment, status == "succeeded")
            }
        };
        let (response, event, audit) = self.finishing(run, change_id, &payment, done, &request_id);
        let _: writes::Finished =
            run.finish(response, Some(change_id), writes::Finish { event: event.as_ref(), audit }).await?;
        if event.is_some() {
            self.state.wake.wake(Wake::Outbox);
        }
        Ok(())
    }
}

/// The audit action of a change's step: `payment.capture_started`, `payment.cancel_recorded`...
fn action(kind: ChangeKind, step: &str) -> &'static str {
    match (kind, step) {
        (ChangeKind::Capture, "started") => "payment.capture_started",
        (ChangeKind::Capture, "refused") => "payment.capture_refused",
        (ChangeKind::Capture, "recorded") => "payment.capture_recorded",
        (ChangeKind::Capture, _) => "payment.capture_finished",
        (ChangeKind::Cancel, "started") => "payment.cancel_started",
        (ChangeKind::Cancel, "refused") => "payment.cancel_refused",
        (ChangeKind::Cancel, "recorded") => "payment.cancel_recorded",
        (ChangeKind::Cancel, _) => "payment.cancel_finished",
    }
}

fn indeterminate(error: GatewayError) -> DriveError {
    tracing::warn!(%error, "gateway outcome unknown; the change's key stays at started");
    DriveError::OutcomeUnknown(Box::new(error))
}

/// An audit record about the change `change_id` (a refusal's, with no change, is about its key:
/// see [`Run::refuse`]).
fn audit<'a>(
    account_id: Uuid,
    change_id: Uuid,
    actor: Actor,
    action: &'a str,
    data: serde_json::Value,
    request_id: &'a RequestId,
) -> AuditRecord<'a> {
    let request_id = Some(request_id.as_str());
    AuditRecord { account_id, action, resource_type: "payment_change", resource_id: change_id, actor, data, request_id }
}

/// A change a key made: its id, its payment's and its key row's.
#[derive(Debug, Clone, Copy)]
pub struct MadeChange {
    pub id: Uuid,
    pub payment_id: Uuid,
    pub key_id: Uuid,
}

/// The change the account's key made, by its key row (`key_id`) or, once the row is reaped, by
/// the client's key: what a key's story shows for a capture's or a cancel's key.
pub async fn made_by_key(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    key_id: Option<Uuid>,
    key: &str,
) -> QueryResult<Option<MadeChange>> {
    let changes = payment_changes::table.filter(payment_changes::account_id.eq(account_id));
    let columns = (payment_changes::id, payment_changes::payment_id, payment_changes::idempotency_key_id);
    let found: Option<(Uuid, Uuid, Uuid)> = match key_id {
        Some(key_id) => {
            changes.filter(payment_changes::idempotency_key_id.eq(key_id)).select(columns).get_result(conn).await
        }
        None => changes.filter(payment_changes::idempotency_key.eq(key)).select(columns).get_result(conn).await,
    }
    .optional()?;
    Ok(found.map(|(id, payment_id, key_id)| MadeChange { id, payment_id, key_id }))
}
