//! The `payments` table.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use crate::db::schema::payments;
use crate::db::text_enum;

text_enum! {
    /// Where a payment stands. `pending` until the gateway's definitive answer is recorded; a
    /// payment only authorized is `requires_capture` until a capture (`succeeded`) or a cancel or
    /// its lapse (`canceled`) ends the authorization.
    pub enum PaymentStatus {
        Pending = "pending",
        RequiresCapture = "requires_capture",
        Succeeded = "succeeded",
        Canceled = "canceled",
        Failed = "failed",
    }
}

text_enum! {
    /// Whether the payment is charged at once (`automatic`) or only authorized, to be captured
    /// later (`manual`).
    pub enum CaptureMethod {
        Automatic = "automatic",
        Manual = "manual",
    }
}

/// The failure code of a payment that the gateway rejected for a reason other than the card
/// (answered 502).
pub const GATEWAY_REJECTED: &str = "gateway_rejected";
/// The failure code of a payment whose `source` the gateway does not know (answered 402, like a
/// decline: the client's to fix). Any other failure code is the gateway's decline code.
pub const UNKNOWN_SOURCE: &str = "unknown_source";

/// A payment as stored.
#[derive(Debug, Clone, Queryable, QueryableByName, Selectable)]
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
    /// The sum of its succeeded refunds.
    pub amount_refunded: i64,
    /// The sum of its refunds still pending: reserved, not refundable again until they settle.
    pub amount_refund_pending: i64,
    pub capture_method: CaptureMethod,
    /// What a `manual` payment's capture took (0 until then); none for an `automatic` one, which
    /// captured its amount when it succeeded (see [`Payment::amount_captured`]).
    #[diesel(column_name = amount_captured)]
    pub captured: Option<i64>,
    /// When its authorization lapses (a `manual` payment's, once authorized).
    pub capture_before: Option<DateTime<Utc>>,
    pub canceled_at: Option<DateTime<Utc>>,
    pub cancellation_reason: Option<String>,
}

/// A new, pending payment, linked to the key row that creates it.
#[derive(Debug)]
pub struct NewPayment<'a> {
    pub id: Uuid,
    pub account_id: Uuid,
    pub idempotency_key: &'a str,
    pub amount: i64,
    pub currency: &'a str,
    pub description: Option<&'a str>,
    pub metadata: serde_json::Value,
    pub gateway: &'a str,
    pub capture_method: CaptureMethod,
}

/// The gateway's definitive answer to a charge, as recorded on the payment: where the charge
/// stands at the gateway, whatever was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeOutcome {
    /// Captured, for `amount` (all of it, or an authorization captured in part).
    Captured {
        charge_id: String,
        amount: i64,
    },
    /// Authorized only: the money held, to be captured or released.
    Authorized {
        charge_id: String,
    },
    /// Authorized, then cancelled at the gateway (its dashboard, or its own lapse of the
    /// authorization) before its answer reached us: nothing held.
    Canceled {
        charge_id: String,
    },
    Declined {
        code: String,
        message: String,
    },
    UnknownSource {
        message: String,
    },
    Rejected {
        message: String,
    },
}

/// What recording a [`ChargeOutcome`] changes on the payment.
#[derive(Debug)]
pub struct ChargeChanges<'a> {
    pub status: PaymentStatus,
    pub gateway_charge_id: Option<&'a str>,
    pub failure_code: Option<&'a str>,
    pub failure_message: Option<&'a str>,
    /// How the gateway took the money: `automatic` only for a charge captured whole at once; a
    /// charge the gateway left an authorization (open, captured in part, or cancelled) is
    /// `manual`, whatever was asked, so that the payment shows what is held and what was taken.
    pub capture_method: CaptureMethod,
    /// What it captured: none for an `automatic` payment (its amount, once it succeeded).
    pub amount_captured: Option<i64>,
}

impl ChargeOutcome {
    /// The payment's columns once this outcome is recorded, for a payment of `amount` that asked
    /// to be captured the `asked` way.
    pub fn changes(&self, asked: CaptureMethod, amount: i64) -> ChargeChanges<'_> {
        let made = |status, charge_id, capture_method, amount_captured| ChargeChanges {
            status,
            gateway_charge_id: Some(charge_id),
            failure_code: None,
            failure_message: None,
            capture_method,
            amount_captured,
        };
        let failed = |code, message| ChargeChanges {
            status: PaymentStatus::Failed,
            gateway_charge_id: None,
            failure_code: Some(code),
            failure_message: Some(message),
            capture_method: asked,
            amount_captured: (asked == CaptureMethod::Manual).then_some(0),
        };
        match self {
            // All of it at once, as asked: the one charge that is no authorization.
            ChargeOutcome::Captured { charge_id, amount: captured }
                if asked == CaptureMethod::Automatic && *captured == amount =>
            {
                made(PaymentStatus::Succeeded, charge_id, CaptureMethod::Automatic, None)
            }
            ChargeOutcome::Captured { charge_id, amount: captured } => {
                made(PaymentStatus::Succeeded, charge_id, CaptureMethod::Manual, Some(*captured))
            }
            ChargeOutcome::Authorized { charge_id } => {
                made(PaymentStatus::RequiresCapture, charge_id, CaptureMethod::Manual, Some(0))
            }
            ChargeOutcome::Canceled { charge_id } => {
                made(PaymentStatus::Canceled, charge_id, CaptureMethod::Manual, Some(0))
            }
            ChargeOutcome::Declined { code, message } => failed(code, message),
            ChargeOutcome::UnknownSource { message } => failed(UNKNOWN_SOURCE, message),
            ChargeOutcome::Rejected { message } => failed(GATEWAY_REJECTED, message),
        }
    }
}

/// Why a failed payment failed, as its answer and the metrics tell failures apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The card was declined (402).
    Declined,
    /// The gateway knows no payment method by the `source` (402).
    UnknownSource,
    /// The gateway refused the charge for a reason other than the card (502).
    GatewayRejected,
}

impl Failure {
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Declined => "card_declined",
            Failure::UnknownSource => "unknown_source",
            Failure::GatewayRejected => "gateway_rejected",
        }
    }
}

impl Payment {
    /// Why the payment failed; none unless it did. Any failure code but ours is the gateway's
    /// decline code.
    pub fn failure(&self) -> Option<Failure> {
        match (self.status, self.failure_code.as_deref()) {
            (PaymentStatus::Failed, Some(GATEWAY_REJECTED)) => Some(Failure::GatewayRejected),
            (PaymentStatus::Failed, Some(UNKNOWN_SOURCE)) => Some(Failure::UnknownSource),
            (PaymentStatus::Failed, _) => Some(Failure::Declined),
            _ => None,
        }
    }

    /// What it captured: a `manual` payment's capture, or all of an `automatic` one that
    /// succeeded. What refunds may take back, at most.
    pub fn amount_captured(&self) -> i64 {
        match (self.captured, self.status) {
            (Some(captured), _) => captured,
            (None, PaymentStatus::Succeeded) => self.amount,
            (None, _) => 0,
        }
    }

    /// What a capture could take now: all of an authorization still open, else nothing.
    pub fn amount_capturable(&self) -> i64 {
        match self.status {
            PaymentStatus::RequiresCapture => self.amount,
            _ => 0,
        }
    }

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

    /// The payment created under a key row, if it got that far.
    pub async fn find_by_key(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        key_id: Uuid,
    ) -> QueryResult<Option<Payment>> {
        payments::table
            .filter(payments::account_id.eq(account_id))
            .filter(payments::idempotency_key_id.eq(key_id))
            .select(Payment::as_select())
            .get_result(conn)
            .await
            .optional()
    }

    /// The payment the client's `key` made, if any: found even after the key's row is reaped.
    pub async fn find_by_client_key(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        key: &str,
    ) -> QueryResult<Option<Payment>> {
        payments::table
            .filter(payments::account_id.eq(account_id))
            .filter(payments::idempotency_key.eq(key))
            .select(Payment::as_select())
            .get_result(conn)
            .await
            .optional()
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
}
