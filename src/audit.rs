//! The audit trail: one row for each thing that happened to a resource, committed in the same
//! transaction as the change itself, so the trail can never disagree with the data.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use crate::db::schema::audit_records;
use crate::db::{Prepare, text_enum};

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
#[derive(Debug, Insertable)]
#[diesel(table_name = audit_records)]
pub struct AuditRecord<'a> {
    pub account_id: Uuid,
    pub action: &'a str,
    pub resource_type: &'a str,
    pub resource_id: Uuid,
    pub actor: Actor,
    pub data: serde_json::Value,
}

impl AuditRecord<'_> {
    /// Writes the record (inside the caller's transaction).
    pub async fn insert(&self, conn: &mut AsyncPgConnection) -> QueryResult<()> {
        diesel::insert_into(audit_records::table).values(self).prepared().execute(conn).await.map(drop)
    }
}
