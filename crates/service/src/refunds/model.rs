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
}
