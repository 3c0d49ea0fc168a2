//! `POST /v1/payments`: one payment request, driven through its recovery points.
//!
//! ```text
//!         claim + started           gateway call                 (no foreign effect)
//!   (new) ─────────► started ────────────────────► charge_created ────────────────► finished
//!                    key row locked,     │         outcome recorded                 response stored,
//!                    payment pending     │         on the payment                   event staged, unlocked
//!                    + audit records     │                                               ▲
//!                                        └───────────────────────────────────────────────┘
//!                                          both at once, for a run that made the payment
//! ```
//!
//! Every arrow is one transaction, and the gateway call between `started` and `charge_created`
//! is the only foreign side effect, made with no transaction open and no connection held. Why the
//! cuts are where they are:
//! - `started` commits the payment before the gateway hears of it, so no charge can exist that
//!   our database does not know about. For a new key it runs in the claim's statement, so the key
//!   row and its payment commit together; a resumed key is claimed first and runs `started` on
//!   its own. It keeps the recovery point where it is, so the phase runs again on resumption and
//!   finds the payment it made (it never makes a second).
//! - The gateway call sends a key derived from our key row, so calling again after a crash, a
//!   timeout or a 5xx returns the first charge instead of making another. A payment an earlier run
//!   made is first looked up by that key, and what is found is adopted, which holds even after the
//!   gateway has forgotten the key. That is what makes `started` safe to resume from when nobody
//!   knows what the gateway did. Two more guards: `started` records the gateway, and only that
//!   gateway may answer that nothing was charged (see [`Driver::charge`]); and no driver makes a
//!   call that could outlast its lease on the key, after which another driver may be calling.
//! - `charge_created` records the gateway's definitive answer: once it commits, the gateway is
//!   never asked again.
//! - `finished` stores the response, stages the outbox event and unlocks, all at once: a request
//!   is either finished with a stored answer and its event, or not finished at all.
//! - Nothing between the two can fail on its own, so a run that made the payment commits them as
//!   one statement ([`protocol::recording`]): it knows the whole answer before the database
//!   records it, its times read off the database's clock from the payment's creation. A run that
//!   took up an earlier run's payment records the answer with the database's clock, then finishes.
//!
//! An indeterminate gateway outcome (a timeout, a connection error, a 5xx, a 409 or 429, anything
//! after which money may have moved without our knowing) commits nothing: the key is unlocked at
//! `started` and the client is told 503, retry with the same key. The same driver
//! serves a client's request and a worker finishing an abandoned one ([`crate::keyed::complete`]).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use diesel::QueryResult;
use diesel_async::AsyncPgConnection;
use payments_protocol::{self as protocol, FirstCall, Recording};
use serde_json::json;
use uuid::Uuid;

use super::model::{CaptureMethod, ChargeChanges, ChargeOutcome, NewPayment, Payment, PaymentStatus};
use super::request::{CreatePaymentBody, PaymentRequest};
use super::view::{PaymentView, expired_key_response, final_response};
use super::writes::{self, PaymentChange};
use crate::audit::{Actor, AuditRecord};
use crate::db;
use crate::db::wake::Wake;
use crate::faults::{Fault, FaultPoint, fault_at};
use crate::fields::ValidationError;
use crate::gateway::{self, Charge, ChargeRequest, ChargeState, GatewayError, Settles};
use crate::idempotency::{
    DatabaseClock, DriveError, Endpoint, IdempotencyKey, NewKey, PhaseWrites, Phases, RecoveryPoint, Run,
    StoredResponse, Transition,
};
use crate::keyed::{Keyed, Resource};
use crate::request_id::RequestId;
use crate::state::AppState;
use crate::webhooks::events::StagedEvent;

/// `charge_created`: the gateway's definitive answer is recorded on the payment.
pub const CHARGE_CREATED: RecoveryPoint = RecoveryPoint::new("charge_created");

/// The endpoint: a payment key is bound to it (used on another, it is a mismatch).
pub static ENDPOINT: Endpoint = Endpoint {
    method: "POST",
    path: "/v1/payments",
    label: "payments",
    points: &[CHARGE_CREATED],
    made_in: "payments",
    at_gateway: true,
};

/// `POST /v1/payments`, as the registry lists it.
pub struct Create;

impl Keyed for Create {
    const ENDPOINT: &'static Endpoint = &ENDPOINT;
    type On = ();
    type Body = CreatePaymentBody;
    type Request = PaymentRequest;

    fn validate(body: CreatePaymentBody, _: Option<Uuid>) -> Result<PaymentRequest, ValidationError> {
        body.validate()
    }

    fn phases(state: &AppState, request: PaymentRequest, fault: Option<Fault>) -> impl Phases + '_ {
        PaymentPhases::new(state, request, fault)
    }

    async fn made(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        key_id: Option<Uuid>,
        key: &str,
    ) -> QueryResult<Option<Resource>> {
        let payment = match key_id {
            Some(key_id) => Payment::find_by_key(conn, account_id, key_id).await?,
            None => Payment::find_by_client_key(conn, account_id, key).await?,
        };
        // As the API shows it, but for the gateway's own words.
        Ok(payment.map(|payment| Resource {
            key_id: payment.idempotency_key_id,
            resources: vec![("payment", payment.id)],
            shown: ("payment", json!(PaymentView::facts_only(&payment))),
            created_at: payment.created_at,
        }))
    }
}

/// Which gateway call gave the definitive answer: the charge request, or (for a payment an
/// earlier run made) the look-up that found what that run did, which is then adopted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum AnsweredBy {
    Charge,
    LookUp,
}

/// The gateway's definitive answer about a payment: what to record in `charge_created`.
struct Charged {
    outcome: ChargeOutcome,
    answered_by: AnsweredBy,
    /// The gateway that gave the answer, which holds the charge: recorded as the payment's.
    gateway: Arc<str>,
}

/// The payment `started` left, and whether this run made it: a payment made by an earlier run
/// may have been charged already, at the gateway it records; one made now, nowhere.
struct Started {
    payment: Payment,
    made_now: bool,
}

/// A payment's phases, from the key's recovery point to `finished`.
struct PaymentPhases<'a> {
    state: &'a AppState,
    request: PaymentRequest,
    fault: Option<Fault>,
    /// The gateway a payment made with the claim records (see [`Phases::first_phase`]).
    gateway: Option<Arc<str>>,
    /// What `started` left, when it ran with the claim.
    started: Option<Started>,
    /// The payment as the last phase left it, which saves the next phase reading it again.
    payment: Option<Payment>,
}

impl Phases for PaymentPhases<'_> {
    type Started = Payment;

    /// `started`, with the gateway this process knows without asking. Before the gateway's first
    /// answer to this process there is none: the claim runs alone, and `started` asks the gateway
    /// who it is (the gateway a payment records is the one it is to be charged through).
    fn first_phase<'p>(&'p mut self, new: &'p NewKey<'p>) -> Option<impl PhaseWrites + 'p> {
        self.gateway = Some(self.state.gateway.known_id()?);
        let gateway = self.gateway.as_deref()?;
        Some(self.start_writes(new.account_id, new.key, gateway, Actor::Api, new.request_id))
    }

    /// The payment made with the claim: by this run, so charged nowhere yet.
    fn started_with_claim(&mut self, payment: Payment) {
        self.started = Some(Started { payment, made_now: true });
    }

    /// The recovery-point loop's body: each arm runs from the recorded point to the next.
    async fn advance(&mut self, run: &mut Run<'_>) -> Result<(), DriveError> {
        match run.recovery_point() {
            RecoveryPoint::STARTED => {
                let started = match self.started.take() {
                    Some(started) => started,
                    None => self.start(run).await?,
                };
                tracing::Span::current().record("payment.id", started.payment.id.to_string());
                // Read now, while the statement that started it is the last to have renewed the
                // lease: a payment it made was made at its `now()`.
                let clock = run.database_clock(started.payment.created_at);
                fault_at(self.fault, FaultPoint::AfterStarted);
                let charged = self.charge(run, &started).await?;
                fault_at(self.fault, FaultPoint::AfterCharge);
                match protocol::recording(started.made_now) {
                    Recording::WithFinish => self.record_and_finish(run, started.payment, charged, clock).await,
                    Recording::ThenFinish => self.record_charge(run, started.payment.id, charged).await,
                }
            }
            CHARGE_CREATED => {
                fault_at(self.fault, FaultPoint::AfterChargeCreated);
                self.finish(run).await
            }
            point => Err(DriveError::inconsistent(format!("a payment's key at {point}"))),
        }
    }

    async fn expired_answer(&mut self, new: &NewKey<'_>, made: Uuid) -> Result<StoredResponse, DriveError> {
        let mut conn = db::connect(&self.state.db).await?;
        let payment = db::query(Payment::find(&mut conn, new.account_id, made)).await?;
        let payment = payment.ok_or_else(|| DriveError::inconsistent(format!("payment {made} vanished")))?;
        Ok(expired_key_response(&payment, new.request_id))
    }
}

impl<'a> PaymentPhases<'a> {
    fn new(state: &'a AppState, request: PaymentRequest, fault: Option<Fault>) -> Self {
        PaymentPhases { state, request, fault, gateway: None, started: None, payment: None }
    }

    /// `started` on its own, after the claim (a resumed key, or a process that has not heard from
    /// its gateway yet). On resumption it finds the payment it made before instead of making
    /// another.
    async fn start(&mut self, run: &mut Run<'_>) -> Result<Started, DriveError> {
        let gateway = self.state.gateway.id().await.map_err(indeterminate)?;
        let (request_id, key) = (run.request_id().clone(), run.key().clone());
        let writes = self.start_writes(run.lock().account_id, &key, &gateway, run.actor(), &request_id);
        let new_id = writes.payment.id;
        let payment: Payment = run.phase(Transition::Stay, writes).await?;
        Ok(Started { made_now: payment.id == new_id, payment })
    }

    /// What `started` writes: the pending payment, with the gateway it is to be charged through,
    /// and its audit record.
    fn start_writes<'w>(
        &'w self,
        account_id: Uuid,
        key: &'w IdempotencyKey,
        gateway: &'w str,
        actor: Actor,
        request_id: &'w RequestId,
    ) -> writes::Start<'w> {
        let new = NewPayment {
            id: Uuid::now_v7(),
            account_id,
            idempotency_key: key.as_str(),
            amount: self.request.amount,
            currency: &self.request.currency,
            description: self.request.description.as_deref(),
            metadata: json!(self.request.metadata),
            gateway,
            capture_method: self.capture_method(),
        };
        let data = json!({ "recovery_point": RecoveryPoint::STARTED, "amount": new.amount, "currency": new.currency,
                           "gateway": new.gateway });
        let audit = audit(account_id, new.id, actor, "payment.created", data, request_id);
        writes::Start { payment: new, audit }
    }

    /// How the request asks to be captured: at once, or authorized to be captured later.
    fn capture_method(&self) -> CaptureMethod {
        if self.request.capture { CaptureMethod::Automatic } else { CaptureMethod::Manual }
    }

    /// The gateway call: the one foreign side effect. No transaction is open and no pooled
    /// connection is held while the gateway takes its time, and no call is made that could
    /// outlast the lease. A resumed key may have been charged by an earlier run: it is looked up
    /// first, and what is found is adopted. Who answered decides what an answer may settle
    /// ([`gateway::adoptable`], [`gateway::settles`]); an unknown outcome from another gateway than
    /// the recorded one moves the payment there first, so that the retry looks it up where the
    /// charge may be.
    async fn charge(&mut self, run: &mut Run<'_>, started: &Started) -> Result<Charged, DriveError> {
        run.let_go_of_connection();
        let &Started { ref payment, made_now } = started;
        let (gateway, call) = (&self.state.gateway, self.state.settings.gateway_timeout);
        let recorded = payment.gateway.as_deref().unwrap_or("(none recorded)");
        let key = gateway::downstream_key(run.lock().account_id, run.lock().key_id);
        let request = ChargeRequest {
            amount: self.request.amount,
            currency: &self.request.currency,
            source: &self.request.source,
            description: self.request.description.as_deref(),
            metadata: &self.request.metadata,
            capture: self.request.capture,
        };
        let found = match protocol::first_call(run.lock().resumed()) {
            FirstCall::Request => None,
            FirstCall::LookUp => {
                run.check_lease_outlasts(call)?;
                let looked_up = gateway.find_charge(&key, &request).await.map_err(indeterminate)?;
                gateway::adoptable(looked_up, recorded, made_now)?
            }
        };
        let (answered, answered_by) = match found {
            Some(found) => (found, AnsweredBy::LookUp),
            None => {
                run.check_lease_outlasts(call)?;
                (gateway.charge(&key, &request).await.map_err(indeterminate)?, AnsweredBy::Charge)
            }
        };
        match gateway::settles(answered, payment.gateway.as_deref(), answered_by == AnsweredBy::LookUp) {
            Settles::Answer { answer, holder } => {
                let outcome = outcome_of(answer, self.request.amount).map_err(indeterminate)?;
                Ok(Charged { outcome, answered_by, gateway: holder })
            }
            Settles::Unknown { error, moved_to } => {
                if let Some(moved_to) = moved_to {
                    self.follow_charge_to(run, payment, &moved_to).await?;
                }
                Err(indeterminate(error))
            }
        }
    }

    /// Another gateway than the payment's answered without a definitive outcome, and holds the
    /// charge if there is one: record it as the payment's gateway, so that the retry reconciles
    /// there.
    async fn follow_charge_to(
        &mut self,
        run: &mut Run<'_>,
        payment: &Payment,
        answered: &str,
    ) -> Result<(), DriveError> {
        let request_id = run.request_id().clone();
        let data = json!({ "from": payment.gateway, "to": answered });
        let audit = audit(payment.account_id, payment.id, run.actor(), "payment.gateway_changed", data, &request_id);
        let writes = writes::ChangePayment { payment_id: payment.id, change: PaymentChange::Gateway(answered), audit };
        let _: Payment = run.phase(Transition::Stay, writes).await?;
        Ok(())
    }

    /// `charge_created`: the gateway's definitive answer, recorded on the payment with the gateway
    /// that gave it.
    async fn record_charge(&mut self, run: &mut Run<'_>, payment_id: Uuid, charged: Charged) -> Result<(), DriveError> {
        let Charged { outcome, answered_by, gateway } = charged;
        let request_id = run.request_id().clone();
        let changes = outcome.changes(self.capture_method(), self.request.amount);
        let audit = charge_recorded(run, payment_id, &changes, answered_by, &gateway, &request_id);
        let authorization_ttl_ms = i64::try_from(self.state.settings.authorization_ttl.as_millis()).unwrap_or(i64::MAX);
        let change = PaymentChange::Outcome { changes, gateway: &gateway, authorization_ttl_ms };
        let writes = writes::ChangePayment { payment_id, change, audit };
        self.payment = Some(run.phase(Transition::Advance(CHARGE_CREATED), writes).await?);
        Ok(())
    }

    /// `charge_created` and `finished` in one statement (see [`writes::RecordAndFinish`]), for a
    /// payment this run made: the payment as the answer leaves it, times and all, is known before
    /// the database records it, and so are its response and event.
    async fn record_and_finish(
        &mut self,
        run: &mut Run<'_>,
        payment: Payment,
        charged: Charged,
        clock: DatabaseClock,
    ) -> Result<(), DriveError> {
        let Charged { outcome, answered_by, gateway } = charged;
        let request_id = run.request_id().clone();
        let changes = outcome.changes(self.capture_method(), self.request.amount);
        let now = clock.now();
        let ttl = chrono::TimeDelta::from_std(self.state.settings.authorization_ttl).unwrap_or(chrono::TimeDelta::MAX);
        let (capture_before, canceled_at) = match changes.status {
            PaymentStatus::RequiresCapture => {
                (Some(now.checked_add_signed(ttl).unwrap_or(DateTime::<Utc>::MAX_UTC)), None)
            }
            PaymentStatus::Canceled => (None, Some(now)),
            _ => (None, None),
        };
        let recorded = Payment {
            gateway: Some(gateway.to_string()),
            status: changes.status,
            gateway_charge_id: changes.gateway_charge_id.map(str::to_owned),
            failure_code: changes.failure_code.map(str::to_owned),
            failure_message: changes.failure_message.map(str::to_owned),
            capture_method: changes.capture_method,
            captured: changes.amount_captured,
            capture_before,
            canceled_at,
            updated_at: now,
            ..payment
        };
        let audit = charge_recorded(run, recorded.id, &changes, answered_by, &gateway, &request_id);
        let (response, event, finished) = finishing(run, &recorded, &request_id)?;
        let writes = writes::RecordAndFinish {
            payment_id: recorded.id,
            account_id: recorded.account_id,
            gateway: &gateway,
            changes: &changes,
            capture_before,
            canceled_at,
            event: &event,
            recorded: audit,
            finished,
        };
        #[cfg(debug_assertions)]
        let answered = response.body.clone();
        let stored: Payment = run.finish(response, Some(recorded.id), writes).await?;
        // The answer says what the database recorded: the tests' builds check it.
        #[cfg(debug_assertions)]
        assert_eq!(final_response(&stored, &request_id)?.body, answered, "payment {} as recorded", stored.id);
        self.finished(&stored);
        Ok(())
    }

    /// `finished`: the response stored, the outbox event staged and the key unlocked, together.
    async fn finish(&mut self, run: &mut Run<'_>) -> Result<(), DriveError> {
        let (account_id, key_id) = (run.lock().account_id, run.lock().key_id);
        let request_id = run.request_id().clone();
        // Resumed at `charge_created`, the payment is read first: at this point only the lock's
        // holder may change it, and the phase below writes nothing if the lock was lost meanwhile.
        let payment = match self.payment.take() {
            Some(payment) => payment,
            None => db::query(Payment::find_by_key(run.connection().await?, account_id, key_id))
                .await?
                .ok_or_else(|| DriveError::inconsistent(format!("key {key_id} is past `started` without a payment")))?,
        };
        let (response, event, audit) = finishing(run, &payment, &request_id)?;
        let writes = writes::Finish { payment_id: payment.id, event: &event, audit };
        let _: Payment = run.finish(response, Some(payment.id), writes).await?;
        self.finished(&payment);
        Ok(())
    }

    /// After a payment's key finished: the outbox woken for its event, and the payment counted.
    fn finished(&self, payment: &Payment) {
        self.state.wake.wake(Wake::Outbox);
        let failure = payment.failure().map_or("none", |failure| failure.as_str());
        self.state.metrics.payment_finished(payment.status.as_str(), failure);
    }
}

/// `charge_created`'s audit record: the gateway's answer, who gave it, and how it was found.
fn charge_recorded<'a>(
    run: &Run<'_>,
    payment_id: Uuid,
    changes: &ChargeChanges<'_>,
    answered_by: AnsweredBy,
    gateway: &str,
    request_id: &'a RequestId,
) -> AuditRecord<'a> {
    let data = json!({ "recovery_point": CHARGE_CREATED, "status": changes.status,
                       "gateway_charge_id": changes.gateway_charge_id, "failure_code": changes.failure_code,
                       "capture_method": changes.capture_method, "amount_captured": changes.amount_captured,
                       "answered_by": answered_by, "gateway": gateway });
    audit(run.lock().account_id, payment_id, run.actor(), "payment.charge_recorded", data, request_id)
}

/// What `finished` writes for `payment` as recorded: the response to store, the outbox event and
/// the audit record. The event says what `charge_created` recorded. An authorization (the one
/// outcome that sets `capture_before`) says it was authorized, whatever became of it since
/// (captured, cancelled or lapsed before the key finished: that change stages its own event); one
/// the gateway captured or cancelled before its answer was recorded says so, as its own capture or
/// cancel would have.
fn finishing<'a>(
    run: &Run<'_>,
    payment: &Payment,
    request_id: &'a RequestId,
) -> Result<(StoredResponse, StagedEvent, AuditRecord<'a>), DriveError> {
    let response = final_response(payment, request_id)?;
    let event = match (payment.status, payment.capture_before.is_some(), payment.capture_method) {
        (PaymentStatus::Failed, _, _) => "payment.failed",
        (_, true, _) => "payment.authorized",
        (PaymentStatus::Succeeded, false, CaptureMethod::Automatic) => "payment.succeeded",
        (PaymentStatus::Succeeded, false, CaptureMethod::Manual) => "payment.captured",
        (PaymentStatus::Canceled, false, _) => "payment.canceled",
        (status @ (PaymentStatus::Pending | PaymentStatus::RequiresCapture), false, _) => {
            return Err(DriveError::inconsistent(format!("payment {} is {status} at `finished`", payment.id)));
        }
    };
    let event = StagedEvent::new(payment.account_id, event, PaymentView::from(payment));
    let data = json!({ "recovery_point": RecoveryPoint::FINISHED, "response_status": response.status });
    let audit = audit(payment.account_id, payment.id, run.actor(), "payment.finished", data, request_id);
    Ok((response, event, audit))
}

/// What a charge's answer means for a payment of `amount`: where the charge stands at the gateway
/// (whatever was asked for), a failure to record, or an error that leaves it unknown.
fn outcome_of(answer: Result<Charge, GatewayError>, amount: i64) -> Result<ChargeOutcome, GatewayError> {
    Ok(match answer {
        Ok(Charge { id, state: ChargeState::Authorized }) => ChargeOutcome::Authorized { charge_id: id },
        Ok(Charge { id, state: ChargeState::Captured { amount: captured } }) if (1..=amount).contains(&captured) => {
            ChargeOutcome::Captured { charge_id: id, amount: captured }
        }
        // Not a charge of this payment's amount: recorded, it would be a lie either way.
        Ok(Charge { state: ChargeState::Captured { amount: captured }, .. }) => {
            return Err(GatewayError::Unavailable(format!("a charge of {amount} that says it captured {captured}")));
        }
        Ok(Charge { id, state: ChargeState::Canceled }) => ChargeOutcome::Canceled { charge_id: id },
        Err(GatewayError::Declined { code, message }) => ChargeOutcome::Declined { code, message },
        Err(GatewayError::UnknownSource { message }) => ChargeOutcome::UnknownSource { message },
        Err(GatewayError::Rejected { status, message }) => {
            tracing::error!(gateway.status = status, %message, "the gateway rejected a charge request");
            ChargeOutcome::Rejected { message }
        }
        Err(error) => return Err(error),
    })
}

fn indeterminate(error: GatewayError) -> DriveError {
    tracing::warn!(%error, "gateway outcome unknown; the key stays at started");
    DriveError::OutcomeUnknown(Box::new(error))
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
