//! The `payments` table.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use crate::db::schema::payments;
use crate::db::{Prepare, text_enum};

text_enum! {
    /// Where a payment stands. `pending` until the gateway's definitive answer is recorded.
    pub enum PaymentStatus {
        Pending = "pending",
        Succeeded = "succeeded",
        Failed = "failed",
    }
}

/// The failure code of a payment that the gateway rejected for a reason other than the card
/// (answered 502).
pub const GATEWAY_REJECTED: &str = "gateway_rejected";
/// The failure code of a payment whose `source` the gateway does not know (answered 402, like a
/// decline: the client's to fix). Any other failure code is the gateway's decline code.
pub const UNKNOWN_SOURCE: &str = "unknown_source";

/// A payment as stored.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = payments, check_for_backend(diesel::pg::Pg))]
pub struct Payment {
    pub id: Uuid,
    pub account_id: Uuid,
    pub idempotency_key_id: Option<Uuid>,
    pub idempotency_key: String,
    pub amount: i64,
    pub currency: String,
    pub description: Option<String>,
    pub metadata: serde_json::Value,
    pub status: PaymentStatus,
    pub gateway_charge_id: Option<String>,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The gateway it is charged through ([`crate::gateway::GatewayClient::id`]). None only for
    /// payments made before gateways were recorded, which no driver touches.
    pub gateway: Option<String>,
}

/// A new, pending payment, linked to the key row that creates it.
#[derive(Debug, Insertable)]
#[diesel(table_name = payments, treat_none_as_default_value = false)]
pub struct NewPayment<'a> {
    pub id: Uuid,
    pub account_id: Uuid,
    pub idempotency_key_id: Uuid,
    pub idempotency_key: &'a str,
    pub amount: i64,
    pub currency: &'a str,
    pub description: Option<&'a str>,
    pub metadata: serde_json::Value,
    pub gateway: &'a str,
}

/// The gateway's definitive answer to a charge, as recorded on the payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeOutcome {
    Succeeded { charge_id: String },
    Declined { code: String, message: String },
    UnknownSource { message: String },
    Rejected { message: String },
}

#[derive(AsChangeset)]
#[diesel(table_name = payments, treat_none_as_null = true)]
struct OutcomeChanges<'a> {
    status: PaymentStatus,
    gateway_charge_id: Option<&'a str>,
    failure_code: Option<&'a str>,
    failure_message: Option<&'a str>,
}

/// What the `started` phase found when it went to create its payment.
#[derive(Debug)]
pub enum Insertion {
    /// The payment is new.
    New(Payment),
    /// This key row made it before (the phase is running again after a crash or a retry).
    Existing(Payment),
}

impl NewPayment<'_> {
    /// Inserts the payment unless its key row made one already, which it then returns: never a
    /// unique violation, which is what makes `started` re-runnable. (A payment of the same client
    /// key under another key row cannot exist: while a key's row lives, no other row for the key
    /// can be made, and once it is reaped the claim answers for the payment instead.)
    pub async fn insert(&self, conn: &mut AsyncPgConnection) -> QueryResult<Insertion> {
        let inserted = diesel::insert_into(payments::table)
            .values(self)
            .on_conflict_do_nothing()
            .returning(Payment::as_returning())
            .prepared()
            .get_result(conn)
            .await
            .optional()?;
        if let Some(payment) = inserted {
            return Ok(Insertion::New(payment));
        }
        Ok(Insertion::Existing(Payment::find_by_key(conn, self.account_id, self.idempotency_key_id).await?))
    }
}

impl Payment {
    /// The account's payment with this id, if any.
    pub async fn find(conn: &mut AsyncPgConnection, account_id: Uuid, id: Uuid) -> QueryResult<Option<Payment>> {
        payments::table
            .filter(payments::account_id.eq(account_id))
            .filter(payments::id.eq(id))
            .select(Payment::as_select())
            .get_result(conn)
            .await
            .optional()
    }

    /// The payment created under a key row.
    pub async fn find_by_key(conn: &mut AsyncPgConnection, account_id: Uuid, key_id: Uuid) -> QueryResult<Payment> {
        payments::table
            .filter(payments::account_id.eq(account_id))
            .filter(payments::idempotency_key_id.eq(key_id))
            .select(Payment::as_select())
            .get_result(conn)
            .await
    }

    /// Where the account's payment `id` stands in creation order, for paging past it; none if the
    /// account has no such payment.
    pub async fn position(conn: &mut AsyncPgConnection, account_id: Uuid, id: Uuid) -> QueryResult<Option<i64>> {
        payments::table
            .filter(payments::account_id.eq(account_id))
            .filter(payments::id.eq(id))
            .select(payments::created_seq)
            .get_result(conn)
            .await
            .optional()
    }

    /// The account's payments, newest first, created before the one at `before` (a
    /// [`Payment::position`]). Creation order is the database's own (a sequence), never the ids,
    /// which each process makes with its own clock: with two processes' clocks apart, id order
    /// would put a payment made later behind one made earlier, and a client paging for new
    /// payments would miss it. Fetches one more than `limit` to tell whether there are more.
    pub async fn list(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        before: Option<i64>,
        limit: i64,
    ) -> QueryResult<Vec<Payment>> {
        payments::table
            .filter(payments::account_id.eq(account_id))
            .filter(payments::created_seq.lt(before.unwrap_or(i64::MAX)))
            .order(payments::created_seq.desc())
            .limit(limit + 1)
            .select(Payment::as_select())
            .load(conn)
            .await
    }

    /// Records the gateway a payment is charged through, when another answered its charge.
    pub async fn record_gateway(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        id: Uuid,
        gateway: &str,
    ) -> QueryResult<Payment> {
        diesel::update(payments::table)
            .filter(payments::account_id.eq(account_id))
            .filter(payments::id.eq(id))
            .set((payments::gateway.eq(gateway), payments::updated_at.eq(diesel::dsl::now)))
            .returning(Payment::as_returning())
            .get_result(conn)
            .await
    }

    /// Records the gateway's definitive answer.
    pub async fn record_outcome(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        id: Uuid,
        outcome: &ChargeOutcome,
    ) -> QueryResult<Payment> {
        let changes = match outcome {
            ChargeOutcome::Succeeded { charge_id } => OutcomeChanges {
                status: PaymentStatus::Succeeded,
                gateway_charge_id: Some(charge_id),
                failure_code: None,
                failure_message: None,
            },
            ChargeOutcome::Declined { code, message } => OutcomeChanges {
                status: PaymentStatus::Failed,
                gateway_charge_id: None,
                failure_code: Some(code),
                failure_message: Some(message),
            },
            ChargeOutcome::UnknownSource { message } => OutcomeChanges {
                status: PaymentStatus::Failed,
                gateway_charge_id: None,
                failure_code: Some(UNKNOWN_SOURCE),
                failure_message: Some(message),
            },
            ChargeOutcome::Rejected { message } => OutcomeChanges {
                status: PaymentStatus::Failed,
                gateway_charge_id: None,
                failure_code: Some(GATEWAY_REJECTED),
                failure_message: Some(message),
            },
        };
        diesel::update(payments::table)
            .filter(payments::account_id.eq(account_id))
            .filter(payments::id.eq(id))
            .set((changes, payments::updated_at.eq(diesel::dsl::now)))
            .returning(Payment::as_returning())
            .prepared()
            .get_result(conn)
            .await
    }
}
