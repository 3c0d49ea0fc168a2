//! The `refunds` table.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use crate::db::schema::refunds;
use crate::db::text_enum;

text_enum! {
    /// Where a refund stands. `pending` from its first phase until the gateway settles it: its
    /// amount is reserved on the payment all that time. `failed` gives the amount back.
    pub enum RefundStatus {
        Pending = "pending",
        Succeeded = "succeeded",
        Failed = "failed",
    }
}

/// The failure code of a refund that the gateway refused outright (answered 502). Any other
/// failure code is the gateway's own reason for a refund that failed.
pub const GATEWAY_REJECTED: &str = "gateway_rejected";

/// The columns of [`Refund`], as a statement returns them.
pub(super) const REFUND_COLUMNS: &str = "id, account_id, payment_id, idempotency_key_id, idempotency_key, amount, \
                                         currency, reason, metadata, status, gateway, gateway_refund_id, \
                                         failure_code, failure_message, created_at, updated_at";

/// A refund as stored.
#[derive(Debug, Clone, Queryable, QueryableByName, Selectable)]
#[diesel(table_name = refunds, check_for_backend(diesel::pg::Pg))]
pub struct Refund {
    pub id: Uuid,
    pub account_id: Uuid,
    pub payment_id: Uuid,
    pub idempotency_key_id: Uuid,
    pub idempotency_key: String,
    pub amount: i64,
    pub currency: String,
    pub reason: Option<String>,
    pub metadata: serde_json::Value,
    pub status: RefundStatus,
    /// The gateway that holds the payment's charge, and so its refunds.
    pub gateway: String,
    pub gateway_refund_id: Option<String>,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Refund {
    /// The account's refund with this id, if any.
    pub async fn find(conn: &mut AsyncPgConnection, account_id: Uuid, id: Uuid) -> QueryResult<Option<Refund>> {
        refunds::table
            .filter(refunds::account_id.eq(account_id))
            .filter(refunds::id.eq(id))
            .select(Refund::as_select())
            .get_result(conn)
            .await
            .optional()
    }

    /// The refund made under a key row, if it got that far.
    pub async fn find_by_key(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        key_id: Uuid,
    ) -> QueryResult<Option<Refund>> {
        refunds::table
            .filter(refunds::account_id.eq(account_id))
            .filter(refunds::idempotency_key_id.eq(key_id))
            .select(Refund::as_select())
            .get_result(conn)
            .await
            .optional()
    }

    /// The refund the client's `key` made, if any: found even after the key's row is reaped.
    pub async fn find_by_client_key(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        key: &str,
    ) -> QueryResult<Option<Refund>> {
        refunds::table
            .filter(refunds::account_id.eq(account_id))
            .filter(refunds::idempotency_key.eq(key))
            .select(Refund::as_select())
            .get_result(conn)
            .await
            .optional()
    }

    /// Where refund `id` stands in the creation order of the account's `payment`'s refunds, for
    /// paging past it; none if it is not one of them (a cursor is a place in one payment's list).
    pub async fn position(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        payment_id: Uuid,
        id: Uuid,
    ) -> QueryResult<Option<i64>> {
        refunds::table
            .filter(refunds::account_id.eq(account_id))
            .filter(refunds::payment_id.eq(payment_id))
            .filter(refunds::id.eq(id))
            .select(refunds::created_seq)
            .get_result(conn)
            .await
            .optional()
    }

    /// The refunds of the account's `payment`, newest first, made before the one at `before`; one
    /// more than `limit`, to tell whether there are more.
    pub async fn list(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        payment_id: Uuid,
        before: Option<i64>,
        limit: i64,
    ) -> QueryResult<Vec<Refund>> {
        refunds::table
            .filter(refunds::account_id.eq(account_id))
            .filter(refunds::payment_id.eq(payment_id))
            .filter(refunds::created_seq.lt(before.unwrap_or(i64::MAX)))
            .order(refunds::created_seq.desc())
            .limit(limit + 1)
            .select(Refund::as_select())
            .load(conn)
            .await
    }

    /// An operator's correction: the gateway that holds the refunded charge, for what the key row
    /// `key_id` made, if that is a refund still pending and the key needs attention, is `gateway`
    /// (see `payments attention retry --gateway`). The payment is moved with it, so that its next
    /// refunds are asked there too. Recorded with an audit record for each; whether there was a
    /// refund to move.
    pub async fn move_to_gateway(conn: &mut AsyncPgConnection, key_id: Uuid, gateway: &str) -> QueryResult<bool> {
        let moved = diesel::sql_query(
            "WITH moved AS (
                 UPDATE refunds r SET gateway = $2, updated_at = now()
                 FROM refunds was JOIN idempotency_keys k
                      ON k.account_id = was.account_id AND k.id = was.idempotency_key_id
                 WHERE k.id = $1 AND k.needs_attention_at IS NOT NULL AND was.status = 'pending'
                   AND r.account_id = was.account_id AND r.id = was.id
                 RETURNING r.account_id, r.id, r.payment_id, was.gateway AS was
             ),
             payment AS (
                 UPDATE payments p SET gateway = $2, updated_at = now()
                 FROM moved, payments was
                 WHERE p.account_id = moved.account_id AND p.id = moved.payment_id
                   AND was.account_id = p.account_id AND was.id = p.id
                 RETURNING p.account_id, p.id, was.gateway AS was
             )
             INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data)
             SELECT account_id, 'refund.gateway_changed', 'refund', id, 'operator',
                    jsonb_build_object('from', was, 'to', $2::text)
             FROM moved
             UNION ALL
             SELECT account_id, 'payment.gateway_changed', 'payment', id, 'operator',
                    jsonb_build_object('from', was, 'to', $2::text)
             FROM payment",
        )
        .bind::<diesel::sql_types::Uuid, _>(key_id)
        .bind::<diesel::sql_types::Text, _>(gateway)
        .execute(conn)
        .await?;
        Ok(moved > 0)
    }
}
