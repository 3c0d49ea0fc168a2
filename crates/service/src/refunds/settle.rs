//! Settling the refunds the gateway left pending: the settler's statements (the worker is
//! [`crate::workers::Settler`]).
//!
//! A refund's `finished` phase hands a refund the gateway answered `pending` to the settler by
//! setting its `settle_at`. A run leases one due refund ([`lease_due_refund`]): one statement
//! that takes it (`FOR UPDATE SKIP LOCKED`) and pushes its `settle_at` past both its backoff and
//! the longest a look-up can take, so no other run takes it meanwhile, and a run that dies
//! mid-way leaves it to be looked up again later. The look-up itself runs with no transaction
//! open. A refund still pending needs nothing more: it is already due again. One that settled is
//! settled by [`settle_refund`], forward only: one statement that moves it out of `pending`, moves
//! its amount on the payment (out of pending, into refunded if it succeeded), stages its event and
//! writes its audit record, all only if it was still pending.

use std::time::Duration;

use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Integer, Nullable, Text, Untyped, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::json;

use super::create::event_of;
use super::model::{REFUND_COLUMNS, Refund, RefundStatus};
use super::view::RefundView;
use super::writes::{SETTLED_TOTALS, millis};
use crate::audit::{Actor, AuditRecord};
use crate::db::sql::{Parameters, walk_sql, walk_text};
use crate::db::{self, StoreError};
use crate::request_id::RequestId;
use crate::webhooks::events::StagedEvent;

/// When a refund leased for a look-up is due again: its backoff, `first` doubled per earlier
/// look-up up to `max`, but never sooner than `lease`, the longest a look-up can take.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
    pub lease: Duration,
}

/// A pending refund leased for a look-up at its gateway.
#[derive(Debug, QueryableByName)]
pub struct DueRefund {
    #[diesel(embed)]
    pub refund: Refund,
    /// Look-ups of it, this one included.
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
}

/// Leases the refund that has been due longest, if any (see the module's doc), and counts the
/// look-up it is leased for.
pub async fn lease_due_refund(
    conn: &mut AsyncPgConnection,
    backoff: &Backoff,
) -> Result<Option<DueRefund>, StoreError> {
    // Account by account, as on Citus a row lock must stay within one account's shard: the
    // accounts of the refunds due longest, read without locks, then the take in one of them.
    let accounts = diesel::sql_query(format!(
        "SELECT account_id FROM refunds WHERE settle_at <= now() ORDER BY settle_at LIMIT {ACCOUNTS_A_RUN}"
    ));
    for account_id in db::accounts_of(db::query(accounts.load(conn)).await?) {
        // `due` is materialized, taken once (see `outbox::lease_due_events`), and walks the
        // partial index on `settle_at`. Its columns are renamed so that the refund's own are
        // unambiguous. The next look-up's time is worked out there, not in the `SET`: Citus
        // evaluates `now()` in a modification before it sends it, which it cannot do for an
        // expression of a column.
        let lease = diesel::sql_query(format!(
            "WITH due AS MATERIALIZED (
                 SELECT account_id AS due_account_id, id AS due_id,
                        now() + greatest($1, least($2 * power(2, least(settle_attempts, 30)), $3))
                                * interval '1 millisecond' AS next_settle_at
                 FROM refunds
                 WHERE account_id = $4 AND settle_at <= now()
                 ORDER BY settle_at
                 LIMIT 1
                 FOR UPDATE SKIP LOCKED
             )
             UPDATE refunds
             SET settle_attempts = settle_attempts + 1, settle_at = next_settle_at
             FROM due
             WHERE account_id = $4 AND id = due_id
             RETURNING {REFUND_COLUMNS}, settle_attempts AS attempts"
        ))
        .bind::<BigInt, _>(millis(backoff.lease))
        .bind::<BigInt, _>(millis(backoff.first))
        .bind::<BigInt, _>(millis(backoff.max))
        .bind::<SqlUuid, _>(account_id);
        let due: Option<DueRefund> = db::query(db::first_row(lease.load(conn))).await?;
        if due.is_some() {
            return Ok(due);
        }
    }
    Ok(None)
}

/// The due refunds whose accounts one run looks at, those due longest.
const ACCOUNTS_A_RUN: i64 = 8;

/// Where the gateway says a pending refund ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    Succeeded,
    /// With the gateway's failure code.
    Failed {
        code: String,
    },
}

/// Who settles a refund, for its audit record: the settler's run, or a gateway event's request,
/// with what the record adds to the settlement (`{"attempt": 3}`, `{"event_id": "evt_..."}`).
#[derive(Debug)]
pub struct SettledBy<'a> {
    pub actor: Actor,
    pub request_id: &'a RequestId,
    pub data: serde_json::Value,
}

/// Settles `refund` as its gateway said, if it is still pending: the refund, the payment's totals,
/// the refund's event and an audit record of who settled it, in one statement. Returns the settled
/// refund, or none if it was settled meanwhile (and nothing was written).
pub async fn settle_refund(
    conn: &mut AsyncPgConnection,
    refund: &Refund,
    settlement: &Settlement,
    by: SettledBy<'_>,
) -> Result<Option<Refund>, StoreError> {
    let (status, failure_code) = match settlement {
        Settlement::Succeeded => (RefundStatus::Succeeded, None),
        Settlement::Failed { code } => (RefundStatus::Failed, Some(code.as_str())),
    };
    // The event shows the refund as this statement leaves it: after its `finished` phase a refund
    // changes only by being settled, and only while it is pending, which the statement requires.
    let settled = Refund { status, failure_code: failure_code.map(str::to_owned), ..refund.clone() };
    let event = StagedEvent::new(refund.account_id, event_of(status), RefundView::from(&settled));
    let mut data = json!({ "status": status, "failure_code": failure_code,
                           "gateway_refund_id": refund.gateway_refund_id });
    if let (Some(data), Some(more)) = (data.as_object_mut(), by.data.as_object()) {
        data.extend(more.clone());
    }
    let statement = Settle {
        refund,
        status,
        failure_code,
        event,
        audit: AuditRecord {
            account_id: refund.account_id,
            action: "refund.settled",
            resource_type: "refund",
            resource_id: refund.id,
            actor: by.actor,
            data,
            request_id: Some(by.request_id.as_str()),
        },
    };
    db::query(db::first_row(statement.load(conn))).await
}

/// The statement of [`settle_refund`]: each write takes its rows from `refund`, the refund's move
/// out of `pending`, so none is made if another run moved it first.
struct Settle<'a> {
    refund: &'a Refund,
    status: RefundStatus,
    failure_code: Option<&'a str>,
    event: StagedEvent,
    audit: AuditRecord<'a>,
}

impl QueryFragment<Pg> for Settle<'_> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        walk_sql(
            "WITH refund AS (
                 UPDATE refunds SET status = {status}, failure_code = {failure_code}, settle_at = NULL, updated_at = now()
                 WHERE account_id = {account} AND id = {refund.id} AND status = 'pending'
                 RETURNING {refund.*}
             ), {settled_totals}, staged AS (
                 INSERT INTO events (account_id, id, event_type, body)
                 SELECT {event.account}, {event.id}, {event.type}, {event.body} FROM refund
             ), audited AS (
                 INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data, request_id)
                 SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                        {audit.data}, {audit.request_id}
                 FROM refund
             )
             SELECT {refund.*} FROM refund",
            self,
            out,
        )
    }
}

impl Parameters for Settle<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match name {
            "account" => out.push_bind_param::<SqlUuid, _>(&self.refund.account_id),
            "refund.id" => out.push_bind_param::<SqlUuid, _>(&self.refund.id),
            "refund.*" => walk_text(REFUND_COLUMNS, out),
            "settled_totals" => walk_sql(SETTLED_TOTALS, self, out),
            "status" => out.push_bind_param::<Text, _>(&self.status),
            "failure_code" => out.push_bind_param::<Nullable<Text>, _>(&self.failure_code),
            name if name.starts_with("event.") => self.event.walk_parameter(name, out),
            name => self.audit.walk_parameter(name, out),
        }
    }
}

impl QueryId for Settle<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for Settle<'_> {
    type SqlType = Untyped;
}
