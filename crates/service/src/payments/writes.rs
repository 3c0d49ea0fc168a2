//! What each phase of a payment writes, as the CTEs of its one statement: they follow the `fence`
//! CTE that moves the key row (see [`crate::idempotency::atomic_phase`]), and each takes its rows
//! from `fence` or from a CTE that did, so that nothing is written once the lock is lost. Each
//! ends in a `SELECT` of the phase's result: the payment as the phase left it. Columns are named,
//! never `*`: a statement stays prepared across a migration that adds a column.

use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::AstPass;
use diesel::sql_types::{BigInt, Jsonb, Nullable, Text, Uuid as SqlUuid};
use uuid::Uuid;

use super::model::{ChargeChanges, NewPayment};
use crate::audit::AuditRecord;
use crate::db::WrittenAfter;
use crate::idempotency::PhaseWrites;
use crate::outbox::StagedEvent;

/// The columns of [`super::Payment`], as a phase returns them.
const PAYMENT: &str = "id, account_id, idempotency_key_id, idempotency_key, amount, currency, description, metadata, \
                       status, gateway_charge_id, failure_code, failure_message, created_at, updated_at, gateway, \
                       amount_refunded, amount_refund_pending";

/// `started`: the pending payment and its audit record; or, when the phase runs again, the
/// payment that an earlier run made (never a second one, and no second record).
pub struct Start<'a> {
    pub payment: NewPayment<'a>,
    pub audit: AuditRecord<'a>,
}

impl PhaseWrites for Start<'_> {
    fn walk_writes<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let new = &self.payment;
        out.push_sql(
            "created AS (INSERT INTO payments (id, account_id, idempotency_key_id, idempotency_key, amount, currency, \
             description, metadata, gateway) SELECT ",
        );
        out.push_bind_param::<SqlUuid, _>(&new.id)?;
        out.push_sql(", ");
        out.push_bind_param::<SqlUuid, _>(&new.account_id)?;
        out.push_sql(", id, ");
        out.push_bind_param::<Text, _>(new.idempotency_key)?;
        out.push_sql(", ");
        out.push_bind_param::<BigInt, _>(&new.amount)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(new.currency)?;
        out.push_sql(", ");
        out.push_bind_param::<Nullable<Text>, _>(&new.description)?;
        out.push_sql(", ");
        out.push_bind_param::<Jsonb, _>(&new.metadata)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(new.gateway)?;
        // Only the key row's own earlier payment is expected; a clash on any other unique key
        // (this client key under another key row) is an error, and nothing commits.
        out.push_sql(" FROM fence ON CONFLICT (account_id, idempotency_key_id) DO NOTHING RETURNING ");
        out.push_sql(PAYMENT);
        out.push_sql("), ");
        self.audit.walk_written_after("created", out.reborrow())
    }

    fn walk_result<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let new = &self.payment;
        // The statement's snapshot predates it: a payment found here is an earlier run's.
        out.push_sql("SELECT ");
        out.push_sql(PAYMENT);
        out.push_sql(" FROM created UNION ALL SELECT ");
        out.push_sql(PAYMENT);
        out.push_sql(" FROM payments WHERE account_id = ");
        out.push_bind_param::<SqlUuid, _>(&new.account_id)?;
        out.push_sql(" AND idempotency_key_id = (SELECT id FROM fence) AND NOT EXISTS (SELECT FROM created)");
        Ok(())
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
    /// The gateway's definitive answer, and the gateway that gave it.
    Outcome {
        changes: ChargeChanges<'a>,
        gateway: &'a str,
    },
    Gateway(&'a str),
}

impl PhaseWrites for ChangePayment<'_> {
    fn walk_writes<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("changed AS (UPDATE payments SET ");
        match &self.change {
            PaymentChange::Outcome { changes, gateway } => {
                out.push_sql("gateway = ");
                out.push_bind_param::<Text, _>(*gateway)?;
                out.push_sql(", status = ");
                out.push_bind_param::<Text, _>(&changes.status)?;
                out.push_sql(", gateway_charge_id = ");
                out.push_bind_param::<Nullable<Text>, _>(&changes.gateway_charge_id)?;
                out.push_sql(", failure_code = ");
                out.push_bind_param::<Nullable<Text>, _>(&changes.failure_code)?;
                out.push_sql(", failure_message = ");
                out.push_bind_param::<Nullable<Text>, _>(&changes.failure_message)?;
            }
            PaymentChange::Gateway(gateway) => {
                out.push_sql("gateway = ");
                out.push_bind_param::<Text, _>(*gateway)?;
            }
        }
        out.push_sql(", updated_at = now()");
        walk_this_payment(&self.audit.account_id, &self.payment_id, out.reborrow())?;
        out.push_sql(" AND EXISTS (SELECT FROM fence) RETURNING ");
        out.push_sql(PAYMENT);
        out.push_sql("), ");
        self.audit.walk_written_after("changed", out.reborrow())
    }

    fn walk_result<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("SELECT ");
        out.push_sql(PAYMENT);
        out.push_sql(" FROM changed");
        Ok(())
    }

    fn walk_requirement<'b>(&'b self, out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        walk_payment_exists(&self.audit.account_id, &self.payment_id, out)
    }
}

/// `finished`: the outbox event and the audit record (the fence stores the response). Its result
/// is the payment as it stands.
pub struct Finish<'a> {
    pub payment_id: Uuid,
    pub event: &'a StagedEvent,
    pub audit: AuditRecord<'a>,
}

impl PhaseWrites for Finish<'_> {
    fn walk_writes<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.event.walk_written_after("fence", out.reborrow())?;
        out.push_sql(", ");
        self.audit.walk_written_after("fence", out.reborrow())
    }

    fn walk_result<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("SELECT ");
        out.push_sql(PAYMENT);
        out.push_sql(" FROM payments");
        walk_this_payment(&self.audit.account_id, &self.payment_id, out.reborrow())?;
        out.push_sql(" AND EXISTS (SELECT FROM fence)");
        Ok(())
    }

    fn walk_requirement<'b>(&'b self, out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        walk_payment_exists(&self.audit.account_id, &self.payment_id, out)
    }
}

/// ` WHERE account_id = $a AND id = $p`: the one payment a phase changes.
fn walk_this_payment<'b>(account_id: &'b Uuid, payment_id: &'b Uuid, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
    out.push_sql(" WHERE account_id = ");
    out.push_bind_param::<SqlUuid, _>(account_id)?;
    out.push_sql(" AND id = ");
    out.push_bind_param::<SqlUuid, _>(payment_id)?;
    Ok(())
}

/// The fence's requirement of a phase that changes a payment: that the payment exists.
fn walk_payment_exists<'b>(
    account_id: &'b Uuid,
    payment_id: &'b Uuid,
    mut out: AstPass<'_, 'b, Pg>,
) -> QueryResult<()> {
    out.push_sql(" AND EXISTS (SELECT FROM payments");
    walk_this_payment(account_id, payment_id, out.reborrow())?;
    out.push_sql(")");
    Ok(())
}
