//! What each phase of a refund writes, as the CTEs of its one statement after the `fence` CTE
//! that moves the key row (see [`crate::idempotency::atomic_phase`]): each takes its rows from
//! `fence` or from a CTE that did, so nothing is written once the lock is lost.

use std::time::Duration;

use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::AstPass;
use diesel::sql_types::{BigInt, Jsonb, Nullable, Text, Uuid as SqlUuid};
use uuid::Uuid;

use super::model::{REFUND_COLUMNS, RefundStatus};
use crate::audit::AuditRecord;
use crate::db::WrittenAfter;
use crate::idempotency::PhaseWrites;
use crate::outbox::StagedEvent;

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

/// What `started` found: the refund (made now or by an earlier run) with what the gateway call
/// needs, or a refusal (`refusal`, and what is `refundable` when that matters).
#[derive(Debug, QueryableByName)]
pub struct Started {
    #[diesel(sql_type = Nullable<SqlUuid>)]
    pub refund_id: Option<Uuid>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub amount: Option<i64>,
    /// The gateway holding the payment's charge.
    #[diesel(sql_type = Nullable<Text>)]
    pub gateway: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub charge_id: Option<String>,
    /// `payment_not_found`, `payment_not_refundable`, `payment_already_refunded` or
    /// `refund_exceeds_payment`.
    #[diesel(sql_type = Nullable<Text>)]
    pub refusal: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub refundable: Option<i64>,
}

impl PhaseWrites for Start<'_> {
    fn walk_writes<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("earlier AS (SELECT id, amount, gateway, payment_id FROM refunds WHERE account_id = ");
        out.push_bind_param::<SqlUuid, _>(&self.account_id)?;
        out.push_sql(
            " AND idempotency_key_id = (SELECT id FROM fence)), payment AS (SELECT account_id, id, status, currency, \
             gateway, gateway_charge_id, amount - amount_refunded - amount_refund_pending AS refundable FROM payments \
             WHERE account_id = ",
        );
        out.push_bind_param::<SqlUuid, _>(&self.account_id)?;
        out.push_sql(" AND id = ");
        out.push_bind_param::<SqlUuid, _>(&self.payment_id)?;
        out.push_sql(
            " AND EXISTS (SELECT FROM fence) AND NOT EXISTS (SELECT FROM earlier) FOR UPDATE), decided AS (SELECT p.*, \
             coalesce(",
        );
        out.push_bind_param::<Nullable<BigInt>, _>(&self.amount)?;
        out.push_sql(
            "::bigint, p.refundable) AS amount, CASE WHEN p.status <> 'succeeded' OR p.gateway IS NULL THEN \
             'payment_not_refundable' WHEN p.refundable = 0 THEN 'payment_already_refunded' WHEN coalesce(",
        );
        out.push_bind_param::<Nullable<BigInt>, _>(&self.amount)?;
        out.push_sql(
            "::bigint, p.refundable) > p.refundable THEN 'refund_exceeds_payment' END AS refusal FROM payment p), \
             reserved AS (UPDATE payments p SET amount_refund_pending = p.amount_refund_pending + d.amount, \
             updated_at = now() FROM decided d WHERE p.account_id = ",
        );
        // The account as a parameter wherever a table is read by it, never joined from another
        // CTE: what a database distributed by account routes by (see README, on Citus).
        out.push_bind_param::<SqlUuid, _>(&self.account_id)?;
        out.push_sql(
            " AND p.id = d.id AND d.refusal IS NULL RETURNING p.id), created AS (INSERT INTO refunds (id, account_id, \
             payment_id, idempotency_key_id, idempotency_key, amount, currency, reason, metadata, gateway) SELECT ",
        );
        out.push_bind_param::<SqlUuid, _>(&self.refund_id)?;
        out.push_sql(", ");
        out.push_bind_param::<SqlUuid, _>(&self.account_id)?;
        out.push_sql(", d.id, f.id, ");
        out.push_bind_param::<Text, _>(self.idempotency_key)?;
        out.push_sql(", d.amount, d.currency, ");
        out.push_bind_param::<Nullable<Text>, _>(&self.reason)?;
        out.push_sql(", ");
        out.push_bind_param::<Jsonb, _>(&self.metadata)?;
        out.push_sql(
            ", d.gateway FROM decided d, fence f, reserved r WHERE d.refusal IS NULL RETURNING id, amount, gateway, \
             payment_id), ",
        );
        self.audit.walk_written_after("created", out.reborrow())
    }

    fn walk_result<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        // The statement's snapshot predates it, and may predate the payment's `charge_created`: a
        // refund made now takes the charge from the row it decided on (`FOR UPDATE` reads the
        // newest), never from a read of `payments`, which could still see the payment pending and
        // chargeless. A refund found in `earlier` is an earlier run's, whose decision committed
        // after the charge did, so the snapshot holds that charge.
        out.push_sql(
            "SELECT c.id AS refund_id, c.amount, c.gateway, d.gateway_charge_id AS charge_id, NULL::text AS \
             refusal, NULL::bigint AS refundable FROM created c, decided d UNION ALL SELECT r.id, r.amount, \
             r.gateway, p.gateway_charge_id, NULL, NULL FROM earlier r JOIN payments p ON p.account_id = ",
        );
        out.push_bind_param::<SqlUuid, _>(&self.account_id)?;
        out.push_sql(
            " AND p.id = r.payment_id UNION ALL SELECT NULL, NULL, NULL, NULL, d.refusal, d.refundable FROM decided d \
             WHERE d.refusal IS NOT NULL UNION ALL SELECT NULL, NULL, NULL, NULL, 'payment_not_found', NULL FROM fence WHERE NOT EXISTS (SELECT FROM earlier) AND NOT EXISTS (SELECT FROM \
             payment)",
        );
        Ok(())
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
    fn walk_writes<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("changed AS (UPDATE refunds SET status = ");
        out.push_bind_param::<Text, _>(&self.status)?;
        out.push_sql(", gateway_refund_id = ");
        out.push_bind_param::<Nullable<Text>, _>(&self.gateway_refund_id)?;
        out.push_sql(", failure_code = ");
        out.push_bind_param::<Nullable<Text>, _>(&self.failure_code)?;
        out.push_sql(", failure_message = ");
        out.push_bind_param::<Nullable<Text>, _>(&self.failure_message)?;
        out.push_sql(", updated_at = now()");
        walk_this_pending_refund(&self.account_id, &self.refund_id, out.reborrow())?;
        out.push_sql(" AND EXISTS (SELECT FROM fence) RETURNING ");
        out.push_sql(REFUND_COLUMNS);
        out.push_sql("), ");
        walk_settled_totals(&self.account_id, "changed", out.reborrow())?;
        out.push_sql(", ");
        self.audit.walk_written_after("changed", out.reborrow())
    }

    fn walk_result<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("SELECT ");
        out.push_sql(REFUND_COLUMNS);
        out.push_sql(" FROM changed");
        Ok(())
    }

    fn walk_requirement<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql(" AND EXISTS (SELECT FROM refunds");
        walk_this_pending_refund(&self.account_id, &self.refund_id, out.reborrow())?;
        out.push_sql(")");
        Ok(())
    }
}

/// The CTE `totals`: the payment of each refund in `source` (of the account `account_id`) that
/// settled (its `status` no longer `pending`), with the refund's amount moved out of pending, into
/// refunded if it succeeded.
pub(super) fn walk_settled_totals<'b>(
    account_id: &'b Uuid,
    source: &'static str,
    mut out: AstPass<'_, 'b, Pg>,
) -> QueryResult<()> {
    out.push_sql(
        "totals AS (UPDATE payments p SET amount_refund_pending = p.amount_refund_pending - r.amount, \
         amount_refunded = p.amount_refunded + CASE WHEN r.status = 'succeeded' THEN r.amount ELSE 0 END, \
         updated_at = now() FROM ",
    );
    out.push_sql(source);
    out.push_sql(" r WHERE p.account_id = ");
    out.push_bind_param::<SqlUuid, _>(account_id)?;
    out.push_sql(" AND p.id = r.payment_id AND r.status <> 'pending' RETURNING p.id)");
    Ok(())
}

/// `finished` of a refusal: the response stored by the fence, with an audit record (and, inside a
/// [`FinishRefund`], the refund's event). Its result is the key row's id.
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
    fn walk_writes<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        if let Some(event) = self.event {
            event.walk_written_after("fence", out.reborrow())?;
            out.push_sql(", ");
        }
        self.audit.walk_written_after("fence", out.reborrow())
    }

    fn walk_result<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("SELECT id FROM fence");
        Ok(())
    }
}

/// `finished` of a refund: [`Finish`], and a refund the gateway left pending handed to the settler
/// (due in `settle_in_ms`), which looks it up until it settles. Only now: before its key is
/// finished, a refund is its key's driver's alone. A refund the gateway sent an event about
/// meanwhile (the inbox holds one for the key: it only woke the key, which was not finished) is
/// due at once: the gateway has settled it, and the settler's look-up records that, as the
/// completer's does for a payment's key an event woke. (An event this statement's snapshot
/// misses, committed while it ran, leaves the refund to its first backoff, as without one.)
pub struct FinishRefund<'a> {
    pub account_id: Uuid,
    pub refund_id: Uuid,
    /// Milliseconds from now.
    pub settle_in_ms: i64,
    pub finish: Finish<'a>,
}

impl PhaseWrites for FinishRefund<'_> {
    fn walk_writes<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql(
            "settling AS (UPDATE refunds SET settle_at = now() + CASE WHEN EXISTS (SELECT FROM gateway_events WHERE \
             account_id = ",
        );
        out.push_bind_param::<SqlUuid, _>(&self.account_id)?;
        out.push_sql(" AND idempotency_key_id = (SELECT id FROM fence)) THEN interval '0' ELSE ");
        out.push_bind_param::<BigInt, _>(&self.settle_in_ms)?;
        out.push_sql(" * interval '1 millisecond' END");
        walk_this_pending_refund(&self.account_id, &self.refund_id, out.reborrow())?;
        out.push_sql(" AND EXISTS (SELECT FROM fence) RETURNING id), ");
        self.finish.walk_writes(out)
    }

    fn walk_result<'b>(&'b self, out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.finish.walk_result(out)
    }
}

pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// ` WHERE account_id = $a AND id = $r AND status = 'pending'`: the one refund a phase (or the
/// settler) settles.
pub(super) fn walk_this_pending_refund<'b>(
    account_id: &'b Uuid,
    refund_id: &'b Uuid,
    mut out: AstPass<'_, 'b, Pg>,
) -> QueryResult<()> {
    out.push_sql(" WHERE account_id = ");
    out.push_bind_param::<SqlUuid, _>(account_id)?;
    out.push_sql(" AND id = ");
    out.push_bind_param::<SqlUuid, _>(refund_id)?;
    out.push_sql(" AND status = 'pending'");
    Ok(())
}
