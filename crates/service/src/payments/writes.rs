//! What each phase of a payment writes: the SQL of its one statement after the `fence` CTE that
//! moves the key row (see [`crate::idempotency::atomic_phase`]), whole, one literal per phase.
//! Each CTE takes its rows from `fence` or from a CTE that did, so that nothing is written once
//! the lock is lost; each ends in a `SELECT` of the phase's result: the payment as the phase left
//! it. Columns are named, never `*`: a statement stays prepared across a migration that adds a
//! column. The account is a parameter wherever a table is read by it, never joined from another
//! CTE: what a database distributed by account routes by.

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::AstPass;
use diesel::sql_types::{BigInt, Jsonb, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use uuid::Uuid;

use super::model::{ChargeChanges, NewPayment, PaymentStatus};
use crate::audit::AuditRecord;
use crate::db::sql::{Parameters, no_parameter, walk_sql, walk_text};
use crate::gateway::reports::KEEPS_REPORTS;
use crate::idempotency::PhaseWrites;
use crate::webhooks::events::StagedEvent;

/// The columns of [`super::Payment`], as a phase returns them: `{payment.*}` in the SQL below (and
/// in a capture's or a cancel's).
pub(crate) const PAYMENT: &str = "id, account_id, idempotency_key_id, idempotency_key, amount, currency, description, metadata, \
                       status, gateway_charge_id, failure_code, failure_message, created_at, updated_at, gateway, \
                       amount_refunded, amount_refund_pending, capture_method, amount_captured, capture_before, \
                       canceled_at, cancellation_reason";

/// `started`: the pending payment and its audit record; or, when the phase runs again, the
/// payment that an earlier run made (never a second one, and no second record).
pub struct Start<'a> {
    pub payment: NewPayment<'a>,
    pub audit: AuditRecord<'a>,
}

impl PhaseWrites for Start<'_> {
    // Only the key row's own earlier payment is expected: a clash on any other unique key (this
    // client key under another key row) is an error, and nothing commits. The statement's
    // snapshot predates it, so a payment found by the last `SELECT` is an earlier run's.
    fn sql(&self) -> &'static str {
        "created AS (
             INSERT INTO {payments} (id, account_id, idempotency_key_id, idempotency_key, amount, currency,
                                   description, metadata, gateway, capture_method, amount_captured)
             SELECT {payment.id}, {account}, id, {key}, {amount}, {currency}, {description}, {metadata}, {gateway},
                    {capture_method}, CASE WHEN {capture_method} = 'manual' THEN 0 END
             FROM fence
             ON CONFLICT (account_id, idempotency_key_id) DO NOTHING
             RETURNING {payment.*}
         ), audited AS (
             INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                    {audit.data}, {audit.request_id}
             FROM created
         )
         SELECT {payment.*} FROM created
         UNION ALL
         SELECT {payment.*} FROM {payments}
         WHERE account_id = {account} AND idempotency_key_id = (SELECT id FROM fence) AND NOT EXISTS (SELECT FROM created)"
    }
}

impl Parameters for Start<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let new = &self.payment;
        match name {
            "payment.*" => walk_text(PAYMENT, out),
            "payment.id" => out.push_bind_param::<SqlUuid, _>(&new.id),
            "account" => out.push_bind_param::<SqlUuid, _>(&new.account_id),
            "key" => out.push_bind_param::<Text, _>(new.idempotency_key),
            "amount" => out.push_bind_param::<BigInt, _>(&new.amount),
            "currency" => out.push_bind_param::<Text, _>(new.currency),
            "description" => out.push_bind_param::<Nullable<Text>, _>(&new.description),
            "metadata" => out.push_bind_param::<Jsonb, _>(&new.metadata),
            "gateway" => out.push_bind_param::<Text, _>(new.gateway),
            "capture_method" => out.push_bind_param::<Text, _>(&new.capture_method),
            name => self.audit.walk_parameter(name, out),
        }
    }
}

/// A change to the payment, and its audit record: `charge_created`'s outcome, or (staying at
/// `started`) the gateway that answered its charge request when this process's idea of its
/// gateway was out of date.
pub struct ChangePayment<'a> {
    pub payment_id: Uuid,
    pub change: PaymentChange<'a>,
    pub audit: AuditRecord<'a>,
}

/// What [`ChangePayment`] sets.
pub enum PaymentChange<'a> {
    /// The gateway's definitive answer, and the gateway that gave it. An authorization lapses
    /// `authorization_ttl_ms` after it is recorded, by the database's clock; until then it waits
    /// in `open_authorizations`, the lapse worker's queue.
    Outcome {
        changes: ChargeChanges<'a>,
        gateway: &'a str,
        authorization_ttl_ms: i64,
    },
    Gateway(&'a str),
}

/// The requirement of a phase that changes the payment: that it exists.
const PAYMENT_EXISTS: &str = " AND EXISTS (SELECT FROM {payments} WHERE account_id = {account} AND id = {payment.id})";

impl PhaseWrites for ChangePayment<'_> {
    fn sql(&self) -> &'static str {
        match self.change {
            // Where the charge stands at the gateway, whatever was asked: captured (whole or in
            // part), cancelled, or failed. Only an open authorization sets when it lapses and
            // joins the lapse's queue, so a payment's phase pays nothing for them otherwise.
            PaymentChange::Outcome { ref changes, .. } if changes.status != PaymentStatus::RequiresCapture => {
                "changed AS (
                     UPDATE {payments}
                     SET gateway = {gateway}, status = {status}, gateway_charge_id = {charge_id},
                         failure_code = {failure_code}, failure_message = {failure_message}, updated_at = now(),
                         capture_method = {capture_method}, amount_captured = {amount_captured},
                         canceled_at = CASE WHEN {status} = 'canceled' THEN now() END
                     WHERE account_id = {account} AND id = {payment.id} AND EXISTS (SELECT FROM fence)
                     RETURNING {payment.*}
                 ), audited AS (
                     INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
                     SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                            {audit.data}, {audit.request_id}
                     FROM changed
                 )
                 SELECT {payment.*} FROM changed"
            }
            PaymentChange::Outcome { .. } => {
                "changed AS (
                     UPDATE {payments}
                     SET gateway = {gateway}, status = {status}, gateway_charge_id = {charge_id},
                         failure_code = {failure_code}, failure_message = {failure_message}, updated_at = now(),
                         capture_method = {capture_method}, amount_captured = {amount_captured},
                         capture_before = now() + {authorization_ttl_ms} * interval '1 millisecond'
                     WHERE account_id = {account} AND id = {payment.id} AND EXISTS (SELECT FROM fence)
                     RETURNING {payment.*}
                 ), authorized AS (
                     INSERT INTO {open_authorizations} (account_id, payment_id, capture_before)
                     SELECT account_id, id, capture_before FROM changed
                 ), audited AS (
                     INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
                     SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                            {audit.data}, {audit.request_id}
                     FROM changed
                 )
                 SELECT {payment.*} FROM changed"
            }
            PaymentChange::Gateway(_) => {
                "changed AS (
                     UPDATE {payments} SET gateway = {gateway}, updated_at = now()
                     WHERE account_id = {account} AND id = {payment.id} AND EXISTS (SELECT FROM fence)
                     RETURNING {payment.*}
                 ), audited AS (
                     INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
                     SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                            {audit.data}, {audit.request_id}
                     FROM changed
                 )
                 SELECT {payment.*} FROM changed"
            }
        }
    }

    fn requirement(&self) -> &'static str {
        PAYMENT_EXISTS
    }
}

impl Parameters for ChangePayment<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match (name, &self.change) {
            ("payment.*", _) => walk_text(PAYMENT, out),
            ("payment.id", _) => out.push_bind_param::<SqlUuid, _>(&self.payment_id),
            ("account", _) => out.push_bind_param::<SqlUuid, _>(&self.audit.account_id),
            ("gateway", PaymentChange::Outcome { gateway, .. } | PaymentChange::Gateway(gateway)) => {
                out.push_bind_param::<Text, _>(*gateway)
            }
            ("authorization_ttl_ms", PaymentChange::Outcome { authorization_ttl_ms, .. }) => {
                out.push_bind_param::<BigInt, _>(authorization_ttl_ms)
            }
            (name, PaymentChange::Outcome { changes, .. }) if OUTCOME.contains(&name) => {
                walk_outcome(changes, name, out)
            }
            (name, _) if name.starts_with("audit.") => self.audit.walk_parameter(name, out),
            (name, _) => Err(no_parameter(name)),
        }
    }
}

/// The parameters that set the gateway's answer on a payment: [`walk_outcome`]'s.
const OUTCOME: [&str; 6] =
    ["status", "charge_id", "failure_code", "failure_message", "capture_method", "amount_captured"];

/// Binds one of [`OUTCOME`]'s parameters, from what the answer changes.
fn walk_outcome<'b>(changes: &'b ChargeChanges<'_>, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
    match name {
        "status" => out.push_bind_param::<Text, _>(&changes.status),
        "charge_id" => out.push_bind_param::<Nullable<Text>, _>(&changes.gateway_charge_id),
        "failure_code" => out.push_bind_param::<Nullable<Text>, _>(&changes.failure_code),
        "failure_message" => out.push_bind_param::<Nullable<Text>, _>(&changes.failure_message),
        "capture_method" => out.push_bind_param::<Text, _>(&changes.capture_method),
        "amount_captured" => out.push_bind_param::<Nullable<BigInt>, _>(&changes.amount_captured),
        name => Err(no_parameter(name)),
    }
}

/// `charge_created` and `finished` as one phase, for a run that knows the whole answer before the
/// database records it ([`payments_protocol::recording`]): the gateway's answer on the payment (an
/// authorization also in `open_authorizations`, the lapse's queue), the outbox event, and both
/// phases' audit records, in order, after a fence that finishes the key with the response. The
/// times it sets are the run's reading of the database's clock, which the response shows too.
pub struct RecordAndFinish<'a> {
    pub payment_id: Uuid,
    pub account_id: Uuid,
    pub gateway: &'a str,
    pub changes: &'a ChargeChanges<'a>,
    /// When an authorization lapses, and when a charge the gateway had cancelled was; else none.
    pub capture_before: Option<DateTime<Utc>>,
    pub canceled_at: Option<DateTime<Utc>>,
    pub event: &'a StagedEvent,
    /// `charge_created`'s record, then `finished`'s.
    pub recorded: AuditRecord<'a>,
    pub finished: AuditRecord<'a>,
}

/// An authorization's place in the lapse's queue, as [`RecordAndFinish`] writes it.
const AUTHORIZED: &str = ", authorized AS (
     INSERT INTO {open_authorizations} (account_id, payment_id, capture_before)
     SELECT account_id, id, capture_before FROM changed
 )";

impl PhaseWrites for RecordAndFinish<'_> {
    fn sql(&self) -> &'static str {
        "changed AS (
             UPDATE {payments}
             SET gateway = {gateway}, status = {status}, gateway_charge_id = {charge_id},
                 failure_code = {failure_code}, failure_message = {failure_message}, updated_at = now(),
                 capture_method = {capture_method}, amount_captured = {amount_captured},
                 capture_before = {capture_before}, canceled_at = {canceled_at}
             WHERE account_id = {account} AND id = {payment.id} AND EXISTS (SELECT FROM fence)
             RETURNING {payment.*}
         ){authorized}, staged AS (
             INSERT INTO {events} (account_id, id, event_type, body)
             SELECT {event.account}, {event.id}, {event.type}, {event.body} FROM changed
         ), audited AS (
             INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT {recorded.account}, {recorded.action}, {recorded.resource_type}, {recorded.resource_id},
                    {recorded.actor}, {recorded.data}, {recorded.request_id}
             FROM changed
             UNION ALL
             SELECT {finished.account}, {finished.action}, {finished.resource_type}, {finished.resource_id},
                    {finished.actor}, {finished.data}, {finished.request_id}
             FROM changed
         )
         SELECT {payment.*} FROM changed"
    }

    fn requirement(&self) -> &'static str {
        PAYMENT_EXISTS
    }

    fn attention_on_finish(&self) -> &'static str {
        KEEPS_REPORTS
    }
}

impl Parameters for RecordAndFinish<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match name {
            "payment.*" => walk_text(PAYMENT, out),
            "payment.id" => out.push_bind_param::<SqlUuid, _>(&self.payment_id),
            "account" => out.push_bind_param::<SqlUuid, _>(&self.account_id),
            "gateway" => out.push_bind_param::<Text, _>(self.gateway),
            "capture_before" => out.push_bind_param::<Nullable<Timestamptz>, _>(&self.capture_before),
            "canceled_at" => out.push_bind_param::<Nullable<Timestamptz>, _>(&self.canceled_at),
            "authorized" if self.changes.status == PaymentStatus::RequiresCapture => walk_sql(AUTHORIZED, self, out),
            "authorized" => Ok(()),
            name if OUTCOME.contains(&name) => walk_outcome(self.changes, name, out),
            name if name.starts_with("event.") => self.event.walk_parameter(name, out),
            name => match name.split_once('.') {
                Some(("recorded", field)) => self.recorded.walk_field(field, out),
                Some(("finished", field)) => self.finished.walk_field(field, out),
                _ => Err(no_parameter(name)),
            },
        }
    }
}

/// `finished`: the outbox event and the audit record (the fence stores the response). Its result
/// is the payment as it stands. A flag the gateway's report put on the key stays.
pub struct Finish<'a> {
    pub payment_id: Uuid,
    pub event: &'a StagedEvent,
    pub audit: AuditRecord<'a>,
}

impl PhaseWrites for Finish<'_> {
    fn sql(&self) -> &'static str {
        "staged AS (
             INSERT INTO {events} (account_id, id, event_type, body)
             SELECT {event.account}, {event.id}, {event.type}, {event.body} FROM fence
         ), audited AS (
             INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                    {audit.data}, {audit.request_id}
             FROM fence
         )
         SELECT {payment.*} FROM {payments}
         WHERE account_id = {account} AND id = {payment.id} AND EXISTS (SELECT FROM fence)"
    }

    fn requirement(&self) -> &'static str {
        PAYMENT_EXISTS
    }

    fn attention_on_finish(&self) -> &'static str {
        KEEPS_REPORTS
    }
}

impl Parameters for Finish<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match name {
            "payment.*" => walk_text(PAYMENT, out),
            "payment.id" => out.push_bind_param::<SqlUuid, _>(&self.payment_id),
            "account" => out.push_bind_param::<SqlUuid, _>(&self.audit.account_id),
            name if name.starts_with("event.") => self.event.walk_parameter(name, out),
            name => self.audit.walk_parameter(name, out),
        }
    }
}
