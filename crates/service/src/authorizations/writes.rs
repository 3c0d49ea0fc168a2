//! What each phase of a capture or a cancel writes: the SQL of its one statement after the
//! `fence` CTE that moves the key row (see [`crate::idempotency::atomic_phase`]), whole, one
//! literal per phase. Each CTE takes its rows from `fence` or from a CTE that did, so nothing is
//! written once the lock is lost. The account is a parameter wherever a table is read by it.

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::AstPass;
use diesel::row::NamedRow;
use diesel::sql_types::{BigInt, Bool, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use uuid::Uuid;

use crate::audit::AuditRecord;
use crate::db::sql::{Parameters, no_parameter, walk_sql, walk_text};
use crate::gateway::reports::KEEPS_REPORTS;
use crate::idempotency::PhaseWrites;
use crate::payments::Payment;
use crate::payments::writes::PAYMENT;
use crate::webhooks::events::StagedEvent;

/// `started`: the change (a capture or a cancel) of the payment, made if the payment is an
/// authorization still open and no other change stands; or why not; or, when the phase runs
/// again, the change an earlier run made.
///
/// The rule no key can enforce is the database's: a capture, a cancel and the lapse may race for
/// one authorization, under different keys, and the unique index `payment_changes_one_per_payment`
/// lets one change stand per payment. The insert that comes second conflicts with the first
/// change (waiting for its transaction if it has not committed yet) and does nothing, and the
/// request is refused. A change the gateway refused leaves the index, and gives the payment back,
/// unless the gateway said the charge ended otherwise: then the same transaction ends the
/// payment. So the payment is read `FOR SHARE`, which waits for that transaction and reads the
/// payment as it left it: an insert that waited for the refused change finds the payment ended,
/// not the authorization the statement's snapshot still shows.
pub struct Start<'a> {
    pub change_id: Uuid,
    pub account_id: Uuid,
    pub payment_id: Uuid,
    pub kind: &'static str,
    /// A capture's amount; none: all of the authorization.
    pub amount: Option<i64>,
    pub reason: Option<&'static str>,
    pub idempotency_key: &'a str,
    pub audit: AuditRecord<'a>,
}

/// What `started` made (or an earlier run did): the change that stands, and what its gateway call
/// needs. A refusal's row (see [`crate::idempotency::StartedRow`]) carries `refusal` instead:
/// `payment_not_found`, `payment_not_capturable`, `payment_not_cancelable` or
/// `capture_exceeds_authorization`, and what is capturable (`refusal_amount`) when that matters.
#[derive(Debug)]
pub struct Made {
    pub change_id: Uuid,
    /// A capture's amount.
    pub amount: Option<i64>,
    /// The gateway holding the payment's charge: the only one that may change it.
    pub gateway: String,
    pub charge_id: String,
    /// Made by this run: the payment as the change found it, which nothing but this change can
    /// alter while it stands, and the database's `now()` when it was made.
    pub now: Option<(Payment, DateTime<Utc>)>,
}

impl QueryableByName<Pg> for Made {
    fn build<'a>(row: &impl NamedRow<'a, Pg>) -> diesel::deserialize::Result<Self> {
        let now = match NamedRow::get::<Bool, bool>(row, "made_now")? {
            true => Some((
                <Payment as QueryableByName<Pg>>::build(row)?,
                NamedRow::get::<Timestamptz, DateTime<Utc>>(row, "made_at")?,
            )),
            false => None,
        };
        Ok(Made {
            change_id: NamedRow::get::<SqlUuid, Uuid>(row, "change_id")?,
            amount: NamedRow::get::<Nullable<BigInt>, Option<i64>>(row, "change_amount")?,
            gateway: NamedRow::get::<Text, String>(row, "change_gateway")?,
            charge_id: NamedRow::get::<Text, String>(row, "charge_id")?,
            now,
        })
    }
}

impl PhaseWrites for Start<'_> {
    fn sql(&self) -> &'static str {
        "earlier AS (
             SELECT id, amount, gateway, payment_id FROM {payment_changes}
             WHERE account_id = {account} AND idempotency_key_id = (SELECT id FROM fence)
         ), payment AS (
             SELECT {payment.*}
             FROM {payments}
             WHERE account_id = {account} AND id = {payment.id}
               AND EXISTS (SELECT FROM fence) AND NOT EXISTS (SELECT FROM earlier)
             FOR SHARE
         ), decided AS (
             SELECT p.*, CASE WHEN {kind} = 'capture' THEN coalesce({amount}::bigint, p.amount) END AS change_amount,
                    CASE WHEN p.status <> 'requires_capture' OR p.gateway IS NULL OR p.gateway_charge_id IS NULL
                              OR ({kind} = 'capture' AND p.capture_before <= now())
                              THEN {not_possible}
                         WHEN {kind} = 'capture' AND coalesce({amount}::bigint, p.amount) > p.amount
                              THEN 'capture_exceeds_authorization'
                    END AS refusal
             FROM payment p
         ), created AS (
             INSERT INTO {payment_changes} (id, account_id, payment_id, idempotency_key_id, idempotency_key, kind,
                                          amount, cancellation_reason, gateway)
             SELECT {change.id}, {account}, d.id, f.id, {key}, {kind}, d.change_amount, {reason}, d.gateway
             FROM decided d, fence f
             WHERE d.refusal IS NULL
             ON CONFLICT (account_id, payment_id) WHERE status <> 'failed' DO NOTHING
             RETURNING id, amount, gateway, payment_id
         ), audited AS (
             INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                    {audit.data}, {audit.request_id}
             FROM created
         )
         SELECT r.*, m.* FROM (
             SELECT c.id AS change_id, c.amount AS change_amount, c.gateway AS change_gateway,
                    d.gateway_charge_id AS charge_id, NULL::text AS refusal, NULL::bigint AS refusal_amount,
                    true AS made_now
             FROM created c, decided d
             UNION ALL
             SELECT e.id, e.amount, e.gateway, p.gateway_charge_id, NULL, NULL, false
             FROM earlier e JOIN {payments p} ON p.account_id = {account} AND p.id = e.payment_id
             UNION ALL
             SELECT NULL, NULL, NULL, NULL, d.refusal, d.amount, false FROM decided d WHERE d.refusal IS NOT NULL
             UNION ALL
             SELECT NULL, NULL, NULL, NULL, {not_possible}, NULL, false FROM decided d
             WHERE d.refusal IS NULL AND NOT EXISTS (SELECT FROM created)
             UNION ALL
             SELECT NULL, NULL, NULL, NULL, 'payment_not_found', NULL, false FROM fence
             WHERE NOT EXISTS (SELECT FROM earlier) AND NOT EXISTS (SELECT FROM payment)
         ) r LEFT JOIN (SELECT {payment.*}, now() AS made_at FROM decided) m ON r.made_now"
    }
}

impl Parameters for Start<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match name {
            "account" => out.push_bind_param::<SqlUuid, _>(&self.account_id),
            "payment.id" => out.push_bind_param::<SqlUuid, _>(&self.payment_id),
            "change.id" => out.push_bind_param::<SqlUuid, _>(&self.change_id),
            "kind" => out.push_bind_param::<Text, _>(self.kind),
            "amount" => out.push_bind_param::<Nullable<BigInt>, _>(&self.amount),
            "reason" => out.push_bind_param::<Nullable<Text>, _>(&self.reason),
            "key" => out.push_bind_param::<Text, _>(self.idempotency_key),
            "payment.*" => walk_text(PAYMENT, out),
            "not_possible" => walk_text(
                if self.kind == "capture" { "'payment_not_capturable'" } else { "'payment_not_cancelable'" },
                out,
            ),
            name => self.audit.walk_parameter(name, out),
        }
    }
}

/// How an authorization ended, as the gateway says: captured, for this much; or cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentEnd {
    Captured(i64),
    Canceled,
}

/// `capture_created` or `cancel_created`: the gateway's answer recorded on the change, and on the
/// payment if the authorization ended (captured, for how much; or cancelled, and why: the
/// change's reason if it was the change that did it), when it leaves the lapse's queue too. A
/// change the gateway refused for good fails, and gives the payment back, unless the gateway says
/// the authorization ended otherwise. Its result is the payment as it stands after it.
///
/// It locks the payment before the change, as [`Start`] reads them (the payment `FOR SHARE`, then
/// the index of changes): a `started` waiting on this change's row while holding the payment
/// would otherwise wait for a record that waits for it.
pub struct RecordChange<'a> {
    pub account_id: Uuid,
    pub change_id: Uuid,
    pub payment_id: Uuid,
    /// `succeeded` or `failed`.
    pub status: &'static str,
    /// How the authorization ended, if it did.
    pub ends: Option<PaymentEnd>,
    pub failure_code: Option<&'a str>,
    pub failure_message: Option<&'a str>,
    pub audit: AuditRecord<'a>,
}

/// The gateway's answer on the change and the payment, as [`RecordChange`] and
/// [`RecordAndFinish`] write it: the CTEs `payment`, `change`, `changed` and `closed`. A cancel's
/// `canceled_at` is `{canceled_at}`: the database's `now()`, or the time the run answered with.
const RECORDED: &str = "payment AS (
     SELECT id FROM {payments}
     WHERE account_id = {account} AND id = {payment.id} AND EXISTS (SELECT FROM fence)
     FOR UPDATE
 ), change AS (
     UPDATE {payment_changes}
     SET status = {status}, failure_code = {failure_code}, failure_message = {failure_message},
         updated_at = now()
     WHERE account_id = {account} AND id = {change.id} AND status = 'pending' AND EXISTS (SELECT FROM payment)
     RETURNING payment_id, kind AS change_kind, cancellation_reason AS change_reason, status AS change_status
 ), changed AS (
     UPDATE {payments p}
     SET status = {ends},
         amount_captured = coalesce({captured}, p.amount_captured),
         canceled_at = CASE WHEN {ends} = 'canceled' THEN {canceled_at} END,
         cancellation_reason = CASE WHEN {ends} = 'canceled' AND c.change_status = 'succeeded'
                                    THEN c.change_reason END,
         updated_at = now()
     FROM change c
     WHERE p.account_id = {account} AND p.id = c.payment_id AND {ends}::text IS NOT NULL
     RETURNING {payment.*}
 ), closed AS (
     DELETE FROM {open_authorizations o}
     USING change c
     WHERE o.account_id = {account} AND o.payment_id = c.payment_id AND {ends}::text IS NOT NULL
 )";

/// What [`RECORDED`] requires: the change, still pending.
const CHANGE_PENDING: &str = " AND EXISTS (SELECT FROM {payment_changes} WHERE account_id = {account} AND id = {change.id} AND status = 'pending')";

/// The payment as the change leaves it: as `changed` wrote it, or as it stands if the change did
/// not end it.
const PAYMENT_AFTER: &str = "SELECT {payment.*} FROM changed
 UNION ALL
 SELECT {payment.*} FROM {payments}
 WHERE account_id = {account} AND id = {payment.id} AND EXISTS (SELECT FROM change)
   AND NOT EXISTS (SELECT FROM changed)";

impl PhaseWrites for RecordChange<'_> {
    fn sql(&self) -> &'static str {
        "{recorded}, audited AS (
             INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                    {audit.data}, {audit.request_id}
             FROM change
         )
         {payment_after}"
    }

    fn requirement(&self) -> &'static str {
        CHANGE_PENDING
    }
}

impl Parameters for RecordChange<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match name {
            "recorded" => walk_sql(RECORDED, self, out),
            "payment_after" => walk_sql(PAYMENT_AFTER, self, out),
            // Recorded on its own, the change is stamped by the database's clock.
            "canceled_at" => walk_text("now()", out),
            name if name.starts_with("audit.") => self.audit.walk_parameter(name, out),
            name => self.walk_recorded(name, out),
        }
    }
}

impl RecordChange<'_> {
    /// The parameters of [`RECORDED`] and [`PAYMENT_AFTER`] but `canceled_at`.
    fn walk_recorded<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match name {
            "account" => out.push_bind_param::<SqlUuid, _>(&self.account_id),
            "change.id" => out.push_bind_param::<SqlUuid, _>(&self.change_id),
            "payment.id" => out.push_bind_param::<SqlUuid, _>(&self.payment_id),
            "payment.*" => walk_text(PAYMENT, out),
            "status" => out.push_bind_param::<Text, _>(self.status),
            // The payment's status once it ends, or NULL.
            "ends" => match self.ends {
                Some(PaymentEnd::Captured(_)) => out.push_bind_param::<Text, _>("succeeded"),
                Some(PaymentEnd::Canceled) => out.push_bind_param::<Text, _>("canceled"),
                None => out.push_bind_param::<Nullable<Text>, _>(&None::<&str>),
            },
            "captured" => match &self.ends {
                Some(PaymentEnd::Captured(amount)) => out.push_bind_param::<BigInt, _>(amount),
                _ => out.push_bind_param::<Nullable<BigInt>, _>(&None::<i64>),
            },
            "failure_code" => out.push_bind_param::<Nullable<Text>, _>(&self.failure_code),
            "failure_message" => out.push_bind_param::<Nullable<Text>, _>(&self.failure_message),
            name => Err(no_parameter(name)),
        }
    }
}

/// `capture_created` (or `cancel_created`) and `finished` in one statement, for a change this run
/// made: [`RecordChange`]'s writes, the payment's event if its authorization ended, and both
/// records, `*_recorded` then `*_finished`, while the fence stores the response and finishes the
/// key. The run knows the payment as the answer leaves it before the database records it (see
/// [`Made::now`]): a cancel's `canceled_at` is the run's reading of the database's clock, so that
/// the stored answer says what the row says. Its result is the payment as it stands after.
pub struct RecordAndFinish<'a> {
    pub record: RecordChange<'a>,
    /// The payment's `updated_at` as the change found it: if anything changed the payment since,
    /// the answer the run built would not be the row's, and nothing is written.
    pub found_updated_at: DateTime<Utc>,
    pub canceled_at: Option<DateTime<Utc>>,
    pub event: Option<&'a StagedEvent>,
    pub finished: AuditRecord<'a>,
}

/// The payment's event, as [`RecordAndFinish`] stages it.
const STAGED: &str = ", staged AS (
     INSERT INTO {events} (account_id, id, event_type, body)
     SELECT {event.account}, {event.id}, {event.type}, {event.body} FROM change
 )";

impl PhaseWrites for RecordAndFinish<'_> {
    fn sql(&self) -> &'static str {
        "{recorded}{staged}, audited AS (
             INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                    {audit.data}, {audit.request_id}
             FROM change
             UNION ALL
             SELECT {finished.account}, {finished.action}, {finished.resource_type}, {finished.resource_id},
                    {finished.actor}, {finished.data}, {finished.request_id}
             FROM change
         )
         {payment_after}"
    }

    fn requirement(&self) -> &'static str {
        " AND EXISTS (SELECT FROM {payment_changes} WHERE account_id = {account} AND id = {change.id} AND status = 'pending')
          AND EXISTS (SELECT FROM {payments} WHERE account_id = {account} AND id = {payment.id}
                                                 AND updated_at = {found_updated_at})"
    }

    fn attention_on_finish(&self) -> &'static str {
        KEEPS_REPORTS
    }
}

impl Parameters for RecordAndFinish<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match (name, self.event) {
            ("recorded", _) => walk_sql(RECORDED, self, out),
            ("payment_after", _) => walk_sql(PAYMENT_AFTER, self, out),
            ("staged", Some(_)) => walk_sql(STAGED, self, out),
            ("staged", None) => Ok(()),
            ("canceled_at", _) => out.push_bind_param::<Nullable<Timestamptz>, _>(&self.canceled_at),
            ("found_updated_at", _) => out.push_bind_param::<Timestamptz, _>(&self.found_updated_at),
            (name, Some(event)) if name.starts_with("event.") => event.walk_parameter(name, out),
            (name, _) if name.starts_with("audit.") => self.record.audit.walk_parameter(name, out),
            (name, _) => match name.strip_prefix("finished.") {
                Some(field) => self.finished.walk_field(field, out),
                None => self.record.walk_recorded(name, out),
            },
        }
    }
}

/// `finished`: the response stored by the fence, with an audit record, and the payment's event
/// staged if the change was done. Its result is the key row's id.
pub struct Finish<'a> {
    pub event: Option<&'a StagedEvent>,
    pub audit: AuditRecord<'a>,
}

/// The result of [`Finish`]: a phase returns a row, and this one's is the key row's id.
#[derive(Debug, QueryableByName)]
pub struct Finished {
    #[expect(dead_code, reason = "a phase returns a row; nobody needs this one's")]
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
}

impl PhaseWrites for Finish<'_> {
    fn sql(&self) -> &'static str {
        match self.event {
            Some(_) => {
                "staged AS (
                     INSERT INTO {events} (account_id, id, event_type, body)
                     SELECT {event.account}, {event.id}, {event.type}, {event.body} FROM fence
                 ), audited AS (
                     INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
                     SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                            {audit.data}, {audit.request_id}
                     FROM fence
                 )
                 SELECT id FROM fence"
            }
            None => {
                "audited AS (
                     INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
                     SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                            {audit.data}, {audit.request_id}
                     FROM fence
                 )
                 SELECT id FROM fence"
            }
        }
    }

    fn attention_on_finish(&self) -> &'static str {
        KEEPS_REPORTS
    }
}

impl Parameters for Finish<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match (name, self.event) {
            (name, Some(event)) if name.starts_with("event.") => event.walk_parameter(name, out),
            (name, _) => self.audit.walk_parameter(name, out),
        }
    }
}
