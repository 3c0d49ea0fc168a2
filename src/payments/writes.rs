//! What each phase of a payment writes, as the CTEs of its one statement: they follow the `fence`
//! CTE that moves the key row (see [`crate::idempotency::atomic_phase`]), and each reads its
//! rows from `fence` or from a CTE that did, so that nothing is written once the lock is lost.
//! Each ends in a `SELECT` of the phase's result: the payment as the phase left it.

use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, QueryFragment};
use diesel::sql_types::{BigInt, Jsonb, Nullable, Text, Uuid as SqlUuid};
use uuid::Uuid;

use super::model::{ChargeChanges, NewPayment};
use crate::audit::AuditRecord;
use crate::db::WrittenAfter;
use crate::outbox::StagedEvent;

/// `started`: the pending payment and its audit record; or, when the phase runs again, the
/// payment that an earlier run made (never a second one, and no second record).
pub struct Start<'a> {
    pub payment: &'a NewPayment<'a>,
    pub audit: AuditRecord<'a>,
}

impl QueryFragment<Pg> for Start<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let new = self.payment;
        out.push_sql(
            "created AS (INSERT INTO payments (id, account_id, idempotency_key_id, idempotency_key, amount, currency, \
             description, metadata, gateway) SELECT ",
        );
        out.push_bind_param::<SqlUuid, _>(&new.id)?;
        out.push_sql(", account_id, id, ");
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
        out.push_sql(" FROM fence ON CONFLICT DO NOTHING RETURNING *), ");
        self.audit.walk_written_after("created", out.reborrow())?;
        // The statement's snapshot predates it: a payment found here is an earlier run's.
        out.push_sql(
            " SELECT * FROM created UNION ALL SELECT p.* FROM payments p, fence f \
             WHERE p.account_id = f.account_id AND p.idempotency_key_id = f.id AND NOT EXISTS (SELECT FROM created)",
        );
        Ok(())
    }
}

/// `charge_created`: the gateway's definitive answer on the payment, and its audit record.
pub struct RecordCharge<'a> {
    pub payment_id: Uuid,
    pub changes: ChargeChanges<'a>,
    pub audit: AuditRecord<'a>,
}

impl QueryFragment<Pg> for RecordCharge<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let changes = &self.changes;
        out.push_sql("recorded AS (UPDATE payments p SET status = ");
        out.push_bind_param::<Text, _>(&changes.status)?;
        out.push_sql(", gateway_charge_id = ");
        out.push_bind_param::<Nullable<Text>, _>(&changes.gateway_charge_id)?;
        out.push_sql(", failure_code = ");
        out.push_bind_param::<Nullable<Text>, _>(&changes.failure_code)?;
        out.push_sql(", failure_message = ");
        out.push_bind_param::<Nullable<Text>, _>(&changes.failure_message)?;
        out.push_sql(", updated_at = now() FROM fence f WHERE p.account_id = f.account_id AND p.id = ");
        out.push_bind_param::<SqlUuid, _>(&self.payment_id)?;
        out.push_sql(" RETURNING p.*), ");
        self.audit.walk_written_after("recorded", out.reborrow())?;
        out.push_sql(" SELECT * FROM recorded");
        Ok(())
    }
}

/// A `started` payment moved to the gateway that answered its charge request (this process's
/// idea of its gateway was out of date), and its audit record.
pub struct MoveGateway<'a> {
    pub payment_id: Uuid,
    pub gateway: &'a str,
    pub audit: AuditRecord<'a>,
}

impl QueryFragment<Pg> for MoveGateway<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("moved AS (UPDATE payments p SET gateway = ");
        out.push_bind_param::<Text, _>(self.gateway)?;
        out.push_sql(", updated_at = now() FROM fence f WHERE p.account_id = f.account_id AND p.id = ");
        out.push_bind_param::<SqlUuid, _>(&self.payment_id)?;
        out.push_sql(" RETURNING p.*), ");
        self.audit.walk_written_after("moved", out.reborrow())?;
        out.push_sql(" SELECT * FROM moved");
        Ok(())
    }
}

/// `finished`: the outbox event and the audit record (the fence stores the response). Its result
/// is the payment as it stands.
pub struct Finish<'a> {
    pub payment_id: Uuid,
    pub event: &'a StagedEvent,
    pub audit: AuditRecord<'a>,
}

impl QueryFragment<Pg> for Finish<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.event.walk_written_after("fence", out.reborrow())?;
        out.push_sql(", ");
        self.audit.walk_written_after("fence", out.reborrow())?;
        out.push_sql(" SELECT p.* FROM payments p, fence f WHERE p.account_id = f.account_id AND p.id = ");
        out.push_bind_param::<SqlUuid, _>(&self.payment_id)?;
        Ok(())
    }
}
