//! The audit trail: one row for each thing that happened to a resource, committed in the same
//! transaction as the change itself, so the trail can never disagree with the data.

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::AstPass;
use diesel::sql_types::{Array, BigInt, Jsonb, Nullable, Text, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use uuid::Uuid;

use crate::db::schema::audit_records;
use crate::db::sql::{Parameters, no_parameter};
use crate::db::text_enum;

text_enum! {
    /// Who made a change: the API on a client's request, or a background worker.
    pub enum Actor {
        Api = "api",
        Completer = "completer",
        Reaper = "reaper",
        Outbox = "outbox",
        /// The worker that settles refunds the gateway left pending.
        Settler = "settler",
        /// The worker that cancels authorizations once they lapse.
        Lapser = "lapser",
        /// The gateway, by an event it sent (`POST /webhooks/gateway`).
        Gateway = "gateway",
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
    /// The [`RequestId`](crate::request_id::RequestId) of the request that caused it (or of the
    /// worker run that took the request over).
    pub request_id: Option<&'a str>,
}

/// A record written by a statement: `{audit.account}`, `{audit.action}`, `{audit.resource_type}`,
/// `{audit.resource_id}`, `{audit.actor}`, `{audit.data}` and `{audit.request_id}`, the row of
/// `audit_records` it writes.
impl Parameters for AuditRecord<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match name.strip_prefix("audit.") {
            Some(field) => self.walk_field(field, out),
            None => Err(no_parameter(name)),
        }
    }
}

impl AuditRecord<'_> {
    /// Binds the record's `field` (`account`, `action`, ...): for a statement that writes more
    /// than one record, each under a name of its own.
    pub fn walk_field<'b>(&'b self, field: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match field {
            "account" => out.push_bind_param::<SqlUuid, _>(&self.account_id),
            "action" => out.push_bind_param::<Text, _>(self.action),
            "resource_type" => out.push_bind_param::<Text, _>(self.resource_type),
            "resource_id" => out.push_bind_param::<SqlUuid, _>(&self.resource_id),
            "actor" => out.push_bind_param::<Text, _>(&self.actor),
            "data" => out.push_bind_param::<Jsonb, _>(&self.data),
            "request_id" => out.push_bind_param::<Nullable<Text>, _>(&self.request_id),
            field => Err(no_parameter(field)),
        }
    }
}

/// An audit record as read back: what happened, when, by whom, on which request.
#[derive(Debug, QueryableByName, Serialize)]
#[diesel(table_name = audit_records, check_for_backend(diesel::pg::Pg))]
pub struct AuditEntry {
    #[serde(rename = "at")]
    pub created_at: DateTime<Utc>,
    pub action: String,
    pub actor: String,
    pub request_id: Option<String>,
    pub data: serde_json::Value,
}

/// A stretch of what the account's audit trail holds about the resources `(type, id)`, in the
/// order it happened: by the time each was written (`clock_timestamp()`, not its transaction's
/// start), then as numbered. Not by number alone: on Citus, records written on the account's
/// node and through the coordinator are numbered from ranges of their own (see
/// [`crate::db::delegate`]). At most `limit` records, after the first `skip`.
pub async fn trail(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    resources: &[(&str, Uuid)],
    skip: i64,
    limit: i64,
) -> QueryResult<Vec<AuditEntry>> {
    let (types, ids): (Vec<&str>, Vec<Uuid>) = resources.iter().copied().unzip();
    diesel::sql_query(
        "SELECT created_at, action, actor, request_id, data FROM audit_records
         WHERE account_id = $1 AND (resource_type, resource_id) IN (SELECT * FROM unnest($2::text[], $3::uuid[]))
         ORDER BY created_at, id
         OFFSET $4 LIMIT $5",
    )
    .bind::<SqlUuid, _>(account_id)
    .bind::<Array<Text>, _>(types)
    .bind::<Array<SqlUuid>, _>(ids)
    .bind::<BigInt, _>(skip)
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}

/// The latest record of each of `actions` about the resources `(type, id)`, wherever it is in
/// the trail (in the trail's order: see [`trail`]).
pub async fn latest(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    resources: &[(&str, Uuid)],
    actions: &[&str],
) -> QueryResult<Vec<AuditEntry>> {
    let (types, ids): (Vec<&str>, Vec<Uuid>) = resources.iter().copied().unzip();
    diesel::sql_query(
        "SELECT DISTINCT ON (action) created_at, action, actor, request_id, data FROM audit_records
         WHERE account_id = $1 AND (resource_type, resource_id) IN (SELECT * FROM unnest($2::text[], $3::uuid[]))
           AND action = ANY ($4)
         ORDER BY action, created_at DESC, id DESC",
    )
    .bind::<SqlUuid, _>(account_id)
    .bind::<Array<Text>, _>(types)
    .bind::<Array<SqlUuid>, _>(ids)
    .bind::<Array<Text>, _>(actions)
    .load(conn)
    .await
}
