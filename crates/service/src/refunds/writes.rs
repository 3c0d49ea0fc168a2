//! What each phase of a refund writes: the SQL of its one statement after the `fence` CTE that
//! moves the key row (see [`crate::idempotency::atomic_phase`]), whole, one literal per phase.
//! Each CTE takes its rows from `fence` or from a CTE that did, so nothing is written once the
//! lock is lost. The account is a parameter wherever a table is read by it, never joined from
//! another CTE: what a database distributed by account routes by.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::AstPass;
use diesel::sql_types::{BigInt, Bool, Jsonb, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use uuid::Uuid;

use super::model::{REFUND_COLUMNS, RefundStatus};
use crate::audit::AuditRecord;
use crate::db::sql::{Parameters, no_parameter, walk_sql, walk_text};
use crate::gateway::reports::KEEPS_REPORTS;
use crate::idempotency::PhaseWrites;
use crate::webhooks::events::StagedEvent;

/// `started`: the money reserved on the payment and the pending refund, with its audit record, or
/// why there is nothing to refund; or, when the phase runs again, the refund an earlier run made.
///
/// The rule that no key can enforce is the database's: the payment's row is locked (`FOR UPDATE`
/// waits for a concurrent refund's transaction and then reads the row as it committed), what is
/// left is decided on that, and the reservation is an update whose result the payment's own
/// `CHECK` holds within its amount. Two refunds racing with different keys take turns on the row,
/// and the second sees what the first reserved.
pub struct Start<'a> {
    pub refund_id: Uuid,
    pub account_id: Uuid,
    pub payment_id: Uuid,
    /// None: all that is left.
    pub amount: Option<i64>,
    pub idempotency_key: &'a str,
    pub reason: Option<&'a str>,
    pub metadata: serde_json::Value,
    pub audit: AuditRecord<'a>,
}

/// What `started` made (or an earlier run did): a pending refund, its amount reserved on the
/// payment, and what its gateway call needs. A refusal's row (see [`crate::idempotency::StartedRow`])
/// carries `refusal` instead: `payment_not_found`, `payment_not_refundable`,
/// `payment_already_refunded` or `refund_exceeds_payment`, and what is refundable
/// (`refusal_amount`) when that matters.
#[derive(Debug, QueryableByName)]
pub struct Reserved {
    #[diesel(sql_type = SqlUuid)]
    pub refund_id: Uuid,
    #[diesel(sql_type = BigInt)]
    pub amount: i64,
    /// The gateway holding the payment's charge: the only one that may refund it.
    #[diesel(sql_type = Text)]
    pub gateway: String,
    #[diesel(sql_type = Text)]
    pub charge_id: String,
    /// The payment's, which the refund's answer shows.
    #[diesel(sql_type = Text)]
    pub currency: String,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
    /// Made by this run's `started`, not found from an earlier run's.
    #[diesel(sql_type = Bool)]
    pub made_now: bool,
}

impl PhaseWrites for Start<'_> {
    // The statement's snapshot predates it, and may predate the payment's `charge_created`: a
    // refund made now takes the charge from the row it decided on (`FOR UPDATE` reads the
    // newest), never from a read of `payments`, which could still see the payment pending and
    // chargeless. A refund found in `earlier` is an earlier run's, whose decision committed
    // after the charge did, so the snapshot holds that charge.
    fn sql(&self) -> &'static str {
        "earlier AS (
             SELECT id, amount, gateway, payment_id, currency, created_at FROM {refunds}
             WHERE account_id = {account} AND idempotency_key_id = (SELECT id FROM fence)
         ), payment AS (
             SELECT account_id, id, status, currency, gateway, gateway_charge_id,
                    coalesce(amount_captured, amount) - amount_refunded - amount_refund_pending AS refundable
             FROM {payments}
             WHERE account_id = {account} AND id = {payment.id}
               AND EXISTS (SELECT FROM fence) AND NOT EXISTS (SELECT FROM earlier)
             FOR UPDATE
         ), decided AS (
             SELECT p.*, coalesce({amount}::bigint, p.refundable) AS amount,
                    CASE WHEN p.status <> 'succeeded' OR p.gateway IS NULL THEN 'payment_not_refundable'
                         WHEN p.refundable = 0 THEN 'payment_already_refunded'
                         WHEN coalesce({amount}::bigint, p.refundable) > p.refundable THEN 'refund_exceeds_payment'
                    END AS refusal
             FROM payment p
         ), reserved AS (
             UPDATE {payments p} SET amount_refund_pending = p.amount_refund_pending + d.amount, updated_at = now()
             FROM decided d
             WHERE p.account_id = {account} AND p.id = d.id AND d.refusal IS NULL
             RETURNING p.id
         ), created AS (
             INSERT INTO {refunds} (id, account_id, payment_id, idempotency_key_id, idempotency_key, amount, currency,
                                  reason, metadata, gateway)
             SELECT {refund.id}, {account}, d.id, f.id, {key}, d.amount, d.currency, {reason}, {metadata}, d.gateway
             FROM decided d, fence f, reserved r
             WHERE d.refusal IS NULL
             RETURNING id, amount, gateway, payment_id, currency, created_at
         ), audited AS (
             INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                    {audit.data}, {audit.request_id}
             FROM created
         )
         SELECT c.id AS refund_id, c.amount, c.gateway, d.gateway_charge_id AS charge_id, c.currency, c.created_at,
                true AS made_now, NULL::text AS refusal, NULL::bigint AS refusal_amount
         FROM created c, decided d
         UNION ALL
         SELECT r.id, r.amount, r.gateway, p.gateway_charge_id, r.currency, r.created_at, false, NULL, NULL
         FROM earlier r JOIN {payments p} ON p.account_id = {account} AND p.id = r.payment_id
         UNION ALL
         SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, d.refusal, d.refundable FROM decided d WHERE d.refusal IS NOT NULL
         UNION ALL
         SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'payment_not_found', NULL FROM fence
         WHERE NOT EXISTS (SELECT FROM earlier) AND NOT EXISTS (SELECT FROM payment)"
    }
}

impl Parameters for Start<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match name {
            "account" => out.push_bind_param::<SqlUuid, _>(&self.account_id),
            "payment.id" => out.push_bind_param::<SqlUuid, _>(&self.payment_id),
            "refund.id" => out.push_bind_param::<SqlUuid, _>(&self.refund_id),
            "amount" => out.push_bind_param::<Nullable<BigInt>, _>(&self.amount),
            "key" => out.push_bind_param::<Text, _>(self.idempotency_key),
            "reason" => out.push_bind_param::<Nullable<Text>, _>(&self.reason),
            "metadata" => out.push_bind_param::<Jsonb, _>(&self.metadata),
            name => self.audit.walk_parameter(name, out),
        }
    }
}

/// `refund_created`: the gateway's answer recorded on the refund, and on the payment's totals: a
/// success moves the amount from pending to refunded, a failure gives it back, and a refund the
/// gateway left pending keeps it reserved.
pub struct RecordRefund<'a> {
    pub account_id: Uuid,
    pub refund_id: Uuid,
    pub status: RefundStatus,
    pub gateway_refund_id: Option<&'a str>,
    pub failure_code: Option<&'a str>,
    pub failure_message: Option<&'a str>,
    pub audit: AuditRecord<'a>,
}

impl PhaseWrites for RecordRefund<'_> {
    fn sql(&self) -> &'static str {
        "refund AS (
             UPDATE {refunds}
             SET status = {status}, gateway_refund_id = {gateway_refund_id}, failure_code = {failure_code},
                 failure_message = {failure_message}, updated_at = now()
             WHERE account_id = {account} AND id = {refund.id} AND status = 'pending' AND EXISTS (SELECT FROM fence)
             RETURNING {refund.*}
         ), {settled_totals}, audited AS (
             INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                    {audit.data}, {audit.request_id}
             FROM refund
         )
         SELECT {refund.*} FROM refund"
    }

    fn requirement(&self) -> &'static str {
        " AND EXISTS (SELECT FROM {refunds} WHERE account_id = {account} AND id = {refund.id} AND status = 'pending')"
    }
}

impl Parameters for RecordRefund<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match name {
            "account" => out.push_bind_param::<SqlUuid, _>(&self.account_id),
            "refund.id" => out.push_bind_param::<SqlUuid, _>(&self.refund_id),
            "refund.*" => walk_text(REFUND_COLUMNS, out),
            "settled_totals" => walk_sql(SETTLED_TOTALS, self, out),
            "status" => out.push_bind_param::<Text, _>(&self.status),
            "gateway_refund_id" => out.push_bind_param::<Nullable<Text>, _>(&self.gateway_refund_id),
            "failure_code" => out.push_bind_param::<Nullable<Text>, _>(&self.failure_code),
            "failure_message" => out.push_bind_param::<Nullable<Text>, _>(&self.failure_message),
            name => self.audit.walk_parameter(name, out),
        }
    }
}

/// `refund_created` and `finished` as one phase, for a run that made the refund
/// ([`payments_protocol::recording`]): the gateway's answer on the refund (and, once settled, on
/// the payment's totals), a refund left pending handed to the settler as [`FinishRefund`] does,
/// the event, and both phases' audit records, in order, after a fence that finishes the key.
pub struct RecordAndFinishRefund<'a> {
    pub record: RecordRefund<'a>,
    /// Milliseconds from now, for a refund left pending.
    pub settle_in_ms: i64,
    pub event: &'a StagedEvent,
    /// `finished`'s record (`refund_created`'s is `record`'s).
    pub finished: AuditRecord<'a>,
}

impl PhaseWrites for RecordAndFinishRefund<'_> {
    fn sql(&self) -> &'static str {
        "refund AS (
             UPDATE {refunds}
             SET status = {status}, gateway_refund_id = {gateway_refund_id}, failure_code = {failure_code},
                 failure_message = {failure_message}, updated_at = now(),
                 settle_at = CASE WHEN {status} = 'pending' THEN {settle_at} END
             WHERE account_id = {account} AND id = {refund.id} AND status = 'pending' AND EXISTS (SELECT FROM fence)
             RETURNING {refund.*}
         ), {settled_totals}, staged AS (
             INSERT INTO {events} (account_id, id, event_type, body)
             SELECT {event.account}, {event.id}, {event.type}, {event.body} FROM refund
         ), audited AS (
             INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                    {audit.data}, {audit.request_id}
             FROM refund
             UNION ALL
             SELECT {finished.account}, {finished.action}, {finished.resource_type}, {finished.resource_id},
                    {finished.actor}, {finished.data}, {finished.request_id}
             FROM refund
         )
         SELECT {refund.*} FROM refund"
    }

    fn requirement(&self) -> &'static str {
        self.record.requirement()
    }

    fn attention_on_finish(&self) -> &'static str {
        KEEPS_REPORTS
    }
}

impl Parameters for RecordAndFinishRefund<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match name {
            "settle_in_ms" => out.push_bind_param::<BigInt, _>(&self.settle_in_ms),
            "settle_at" => walk_sql(SETTLE_AT, self, out),
            "settled_totals" => walk_sql(SETTLED_TOTALS, self, out),
            name if name.starts_with("event.") => self.event.walk_parameter(name, out),
            name => match name.strip_prefix("finished.") {
                Some(field) => self.finished.walk_field(field, out),
                None => self.record.walk_parameter(name, out),
            },
        }
    }
}

/// `{settled_totals}`: the CTE `totals`, the payment of the refund in the CTE `refund` once it
/// settled (its `status` no longer `pending`), with the refund's amount moved out of pending, and
/// into refunded if it succeeded. The one way a refund's money settles, for a phase and for the
/// settler alike.
pub(super) const SETTLED_TOTALS: &str = "totals AS (
             UPDATE {payments p}
             SET amount_refund_pending = p.amount_refund_pending - r.amount,
                 amount_refunded = p.amount_refunded + CASE WHEN r.status = 'succeeded' THEN r.amount ELSE 0 END,
                 updated_at = now()
             FROM refund r
             WHERE p.account_id = {account} AND p.id = r.payment_id AND r.status <> 'pending'
             RETURNING p.id
         )";

/// The result of [`FinishRefund`]: a phase returns a row, and this one's is the key row's id.
#[derive(Debug, QueryableByName)]
pub struct Finished {
    #[expect(dead_code, reason = "a phase returns a row; nobody needs this one's")]
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
}

/// `finished` of a refund: its event staged and its audit record written, and a refund the
/// gateway left pending handed to the settler (due in `settle_in_ms`), which looks it up until it
/// settles. Only now: before its key is finished, a refund is its key's driver's alone. A refund
/// the gateway sent an event about meanwhile (the inbox holds one for the key: it only woke the
/// key, which was not finished) is due at once: the gateway has settled it, and the settler's
/// look-up records that, as the completer's does for a payment's key an event woke. (An event
/// this statement's snapshot misses, committed while it ran, leaves the refund to its first
/// backoff, as without one.)
pub struct FinishRefund<'a> {
    pub account_id: Uuid,
    pub refund_id: Uuid,
    /// Milliseconds from now.
    pub settle_in_ms: i64,
    pub event: &'a StagedEvent,
    pub audit: AuditRecord<'a>,
}

impl PhaseWrites for FinishRefund<'_> {
    fn sql(&self) -> &'static str {
        "settling AS (
             UPDATE {refunds}
             SET settle_at = {settle_at}
             WHERE account_id = {account} AND id = {refund.id} AND status = 'pending' AND EXISTS (SELECT FROM fence)
             RETURNING id
         ), staged AS (
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

    fn attention_on_finish(&self) -> &'static str {
        KEEPS_REPORTS
    }
}

/// `{settle_at}`: when a refund the gateway left pending is first due for the settler, `{settle_in_ms}`
/// from now, or now if the gateway's event about it came already (see [`FinishRefund`]).
const SETTLE_AT: &str = "now() + CASE WHEN EXISTS (SELECT FROM {gateway_events}
                                         WHERE account_id = {account} AND idempotency_key_id = (SELECT id FROM fence))
                           THEN interval '0'
                           ELSE {settle_in_ms} * interval '1 millisecond' END";

impl Parameters for FinishRefund<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match name {
            "settle_at" => walk_sql(SETTLE_AT, self, out),
            "account" => out.push_bind_param::<SqlUuid, _>(&self.account_id),
            "refund.id" => out.push_bind_param::<SqlUuid, _>(&self.refund_id),
            "settle_in_ms" => out.push_bind_param::<BigInt, _>(&self.settle_in_ms),
            name if name.starts_with("event.") => self.event.walk_parameter(name, out),
            name if name.starts_with("audit.") => self.audit.walk_parameter(name, out),
            name => Err(no_parameter(name)),
        }
    }
}

pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
