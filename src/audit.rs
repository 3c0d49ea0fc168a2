//! The audit trail: one row for each thing that happened to a resource, committed in the same
//! transaction as the change itself, so the trail can never disagree with the data.

use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::AstPass;
use diesel::sql_types::{Jsonb, Text, Uuid as SqlUuid};
use uuid::Uuid;

use crate::db::{WrittenAfter, text_enum};

text_enum! {
    /// Who made a change: the API on a client's request, or a background worker.
    pub enum Actor {
        Api = "api",
        Completer = "completer",
        Reaper = "reaper",
        Outbox = "outbox",
        Operator = "operator",
    }
}

/// An audit record about to be written.
#[derive(Debug)]
pub struct AuditRecord<'a> {
    pub account_id: Uuid,
    pub action: &'a str,
    pub resource_type: &'a str,
    pub resource_id: Uuid,
    pub actor: Actor,
    pub data: serde_json::Value,
}

impl WrittenAfter for AuditRecord<'_> {
    /// The CTE `audited`.
    fn walk_written_after<'b>(&'b self, source: &'static str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql(
            "audited AS (INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data) SELECT ",
        );
        out.push_bind_param::<SqlUuid, _>(&self.account_id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(self.action)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(self.resource_type)?;
        out.push_sql(", ");
        out.push_bind_param::<SqlUuid, _>(&self.resource_id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&self.actor)?;
        out.push_sql(", ");
        out.push_bind_param::<Jsonb, _>(&self.data)?;
        out.push_sql(" FROM ");
        out.push_sql(source);
        out.push_sql(")");
        Ok(())
    }
}
