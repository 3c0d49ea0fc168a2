//! What the database holds for the run's keys: their rows, the payments and refunds they made, the
//! payments' refund totals, how many times each phase committed, and the gateway's events about
//! them (the inbox's rows, how often each was applied, the keys they flagged).

use std::collections::HashMap;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use payments_service::gateway::downstream_key;
use uuid::Uuid;

use payments_service::db::schema::{
    audit_records, gateway_events, idempotency_keys, payment_changes, payments, refunds,
};
use payments_service::events::DISAGREEMENT;

/// The audit actions of the two key phases after `started`, of a payment and of a refund: each
/// commits once per payment or refund, or a request that lost its key wrote after another had
/// taken it over.
pub const PAYMENT_PHASES: [&str; 2] = ["payment.charge_recorded", "payment.finished"];
pub const REFUND_PHASES: [&str; 2] = ["refund.outcome_recorded", "refund.finished"];

/// The audit action of a gateway event applied: one per event in the inbox, written with its row.
const EVENT_RECEIVED: &str = "gateway_event.received";

/// The audit action of a key flagged for a person (its `reason_code` says why).
const NEEDS_ATTENTION: &str = "idempotency_key.needs_attention";

/// What the database holds for the run's keys.
#[derive(Debug, Default, Clone)]
pub struct Stored {
    /// Key → (recovery point, needs attention).
    pub keys: HashMap<String, (String, bool)>,
    /// Key → its payments (one, unless something is badly wrong).
    pub payments: HashMap<String, Vec<StoredPayment>>,
    /// Key → its refunds (none for a refusal, one otherwise).
    pub refunds: HashMap<String, Vec<StoredRefund>>,
    /// The refunded payments' running totals, by payment.
    pub totals: HashMap<Uuid, Totals>,
    /// The authorizations' captures and cancels (failed ones and the lapse's too), by payment.
    pub changes: HashMap<Uuid, Vec<StoredChange>>,
    /// Payment or refund → how many times each of its key phases ([`PAYMENT_PHASES`],
    /// [`REFUND_PHASES`]) was recorded for it.
    pub phases: HashMap<Uuid, [u32; 2]>,
    /// The inbox's rows of the gateway's events about the run's keys: (event id, outcome).
    pub inbox: Vec<(String, String)>,
    /// Event id → how many times the trail says it was applied ([`EVENT_RECEIVED`] records).
    pub received: HashMap<String, u32>,
    /// The keys that a gateway event flagged as disagreeing with what they recorded (even if the
    /// flag was cleared since).
    pub disagreements: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct StoredPayment {
    pub id: Uuid,
    pub amount: i64,
    /// The key the gateway knows its charges by (derived from its key row).
    pub downstream_key: Option<String>,
    pub status: String,
    pub charge_id: Option<String>,
    /// Left an authorization by the gateway (asked for `capture: false`, or not): what its capture
    /// took (`0` until then); `None` for a payment charged at once.
    pub captured: Option<i64>,
    pub cancellation_reason: Option<String>,
}

impl StoredPayment {
    /// Whether the gateway holds a charge of it: charged at once, or authorized (and perhaps
    /// captured or cancelled since).
    pub fn charged(&self) -> bool {
        matches!(self.status.as_str(), "succeeded" | "requires_capture" | "canceled")
    }

    pub fn authorized(&self) -> bool {
        self.captured.is_some() && self.charged()
    }
}

/// A capture or a cancel of an authorization, under a client's key or the lapse's.
#[derive(Debug, Clone)]
pub struct StoredChange {
    pub key: String,
    pub kind: String,
    pub status: String,
}

#[derive(Debug, Clone)]
pub struct StoredRefund {
    pub id: Uuid,
    pub account_id: Uuid,
    /// Its key row: with the account, what the downstream key is derived from.
    pub key_id: Uuid,
    pub payment_id: Uuid,
    pub amount: i64,
    pub status: String,
    pub gateway_refund_id: Option<String>,
}

/// A refunded payment's amount and running totals, as the database keeps them.
#[derive(Debug, Clone)]
pub struct Totals {
    /// What it captured: its amount, or what an authorization's capture took.
    pub amount: i64,
    pub refunded: i64,
    pub pending: i64,
    pub charge_id: Option<String>,
}

impl Stored {
    /// Reads the key rows, payments and refunds of `keys` (UUIDv4s: no other account's keys are
    /// among them).
    pub async fn read(database_url: &str, keys: &[String]) -> anyhow::Result<Stored> {
        let mut conn = AsyncPgConnection::establish(database_url).await?;
        let key_rows: Vec<(String, Uuid, Uuid, String, bool)> = idempotency_keys::table
            .filter(idempotency_keys::idempotency_key.eq_any(keys))
            .select((
                idempotency_keys::idempotency_key,
                idempotency_keys::account_id,
                idempotency_keys::id,
                idempotency_keys::recovery_point,
                idempotency_keys::needs_attention_at.is_not_null(),
            ))
            .load(&mut conn)
            .await?;
        let mut accounts: Vec<Uuid> = key_rows.iter().map(|row| row.1).collect();
        accounts.sort_unstable();
        accounts.dedup();
        let mut key_ids: Vec<Uuid> = key_rows.iter().map(|row| row.2).collect();
        type PaymentRow = (String, Uuid, Uuid, Option<Uuid>, i64, String, Option<String>, Option<i64>, Option<String>);
        let payment_rows: Vec<PaymentRow> = payments::table
            .filter(payments::idempotency_key.eq_any(keys))
            .select((
                payments::idempotency_key,
                payments::id,
                payments::account_id,
                payments::idempotency_key_id,
                payments::amount,
                payments::status,
                payments::gateway_charge_id,
                payments::amount_captured,
                payments::cancellation_reason,
            ))
            .load(&mut conn)
            .await?;
        let authorized: Vec<Uuid> = payment_rows.iter().filter(|row| row.7.is_some()).map(|row| row.1).collect();
        let change_rows: Vec<(Uuid, Uuid, Uuid, String, String, String)> = payment_changes::table
            .filter(payment_changes::account_id.eq_any(&accounts))
            .filter(payment_changes::payment_id.eq_any(&authorized))
            .select((
                payment_changes::id,
                payment_changes::idempotency_key_id,
                payment_changes::payment_id,
                payment_changes::idempotency_key,
                payment_changes::kind,
                payment_changes::status,
            ))
            .load(&mut conn)
            .await?;
        // The lapse's keys are none of the run's, but the gateway's events about what they did are.
        key_ids.extend(change_rows.iter().filter(|row| !keys.contains(&row.3)).map(|row| row.1));
        type RefundRow = (String, Uuid, Uuid, Uuid, Uuid, i64, String, Option<String>);
        let refund_rows: Vec<RefundRow> = refunds::table
            .filter(refunds::idempotency_key.eq_any(keys))
            .select((
                refunds::idempotency_key,
                refunds::id,
                refunds::account_id,
                refunds::idempotency_key_id,
                refunds::payment_id,
                refunds::amount,
                refunds::status,
                refunds::gateway_refund_id,
            ))
            .load(&mut conn)
            .await?;
        let refunded: Vec<Uuid> = refund_rows.iter().map(|row| row.4).collect();
        type TotalsRow = (Uuid, i64, Option<i64>, i64, i64, Option<String>);
        let total_rows: Vec<TotalsRow> = payments::table
            .filter(payments::id.eq_any(&refunded))
            .select((
                payments::id,
                payments::amount,
                payments::amount_captured,
                payments::amount_refunded,
                payments::amount_refund_pending,
                payments::gateway_charge_id,
            ))
            .load(&mut conn)
            .await?;
        let made: Vec<Uuid> = payment_rows
            .iter()
            .map(|row| row.1)
            .chain(refund_rows.iter().map(|row| row.1))
            .chain(change_rows.iter().map(|row| row.0))
            .collect();
        let phase_rows: Vec<(Uuid, String, serde_json::Value)> = audit_records::table
            .filter(audit_records::resource_id.eq_any(&made))
            .filter(audit_records::action.eq_any(PAYMENT_PHASES.iter().chain(&REFUND_PHASES)))
            .select((audit_records::resource_id, audit_records::action, audit_records::data))
            .load(&mut conn)
            .await?;
        let inbox: Vec<(String, String)> = gateway_events::table
            .filter(gateway_events::account_id.eq_any(&accounts))
            .filter(gateway_events::idempotency_key_id.eq_any(&key_ids))
            .select((gateway_events::event_id, gateway_events::outcome))
            .load(&mut conn)
            .await?;
        let received: Vec<serde_json::Value> = audit_records::table
            .filter(audit_records::account_id.eq_any(&accounts))
            .filter(audit_records::resource_id.eq_any(&made))
            .filter(audit_records::action.eq(EVENT_RECEIVED))
            .select(audit_records::data)
            .load(&mut conn)
            .await?;
        let flags: Vec<(Uuid, serde_json::Value)> = audit_records::table
            .filter(audit_records::account_id.eq_any(&accounts))
            .filter(audit_records::resource_type.eq("idempotency_key"))
            .filter(audit_records::resource_id.eq_any(&key_ids))
            .filter(audit_records::action.eq(NEEDS_ATTENTION))
            .select((audit_records::resource_id, audit_records::data))
            .load(&mut conn)
            .await?;

        let mut stored = Stored { inbox, ..Stored::default() };
        for (made, action, data) in phase_rows {
            // A key's phases name the recovery point they reach; whatever else writes these
            // actions (a worker settling a refund) is no phase of the key.
            if data["recovery_point"].is_null() {
                continue;
            }
            let phase =
                [PAYMENT_PHASES, REFUND_PHASES].iter().find_map(|phases| phases.iter().position(|p| *p == action));
            stored.phases.entry(made).or_default()[phase.expect("filtered on the phases")] += 1;
        }
        for data in received {
            *stored.received.entry(data["event_id"].as_str().unwrap_or_default().to_owned()).or_default() += 1;
        }
        let flagged: Vec<Uuid> = flags
            .into_iter()
            .filter(|(_, data)| data["reason_code"] == DISAGREEMENT)
            .map(|(key_id, _)| key_id)
            .collect();
        for (key, _, key_id, recovery_point, attention) in key_rows {
            if flagged.contains(&key_id) {
                stored.disagreements.push(key.clone());
            }
            stored.keys.insert(key, (recovery_point, attention));
        }
        for (key, id, account_id, key_id, amount, status, charge_id, captured, cancellation_reason) in payment_rows {
            let downstream_key = key_id.map(|key_id| downstream_key(account_id, key_id));
            let payment =
                StoredPayment { id, amount, downstream_key, status, charge_id, captured, cancellation_reason };
            stored.payments.entry(key).or_default().push(payment);
        }
        for (_, _, payment_id, key, kind, status) in change_rows {
            stored.changes.entry(payment_id).or_default().push(StoredChange { key, kind, status });
        }
        for (key, id, account_id, key_id, payment_id, amount, status, gateway_refund_id) in refund_rows {
            let refund = StoredRefund { id, account_id, key_id, payment_id, amount, status, gateway_refund_id };
            stored.refunds.entry(key).or_default().push(refund);
        }
        for (id, amount, captured, refunded, pending, charge_id) in total_rows {
            // What its refunds may take back: what it captured.
            let amount = captured.unwrap_or(amount);
            stored.totals.insert(id, Totals { amount, refunded, pending, charge_id });
        }
        Ok(stored)
    }

    /// The payments only authorized, whose authorization went through.
    pub fn authorizations(&self) -> impl Iterator<Item = &StoredPayment> {
        self.payments.values().flatten().filter(|payment| payment.authorized())
    }

    pub fn all_refunds(&self) -> impl Iterator<Item = &StoredRefund> {
        self.refunds.values().flatten()
    }

    /// The payments whose request finished (succeeded or failed): each must have had its event.
    pub fn finished_payments(&self) -> impl Iterator<Item = &StoredPayment> {
        self.payments.values().flatten().filter(|payment| payment.status != "pending")
    }
}

/// How many of `keys` the database holds unfinished, or needing attention: one count, polled
/// while the system settles.
pub async fn unsettled(database_url: &str, keys: &[String]) -> anyhow::Result<i64> {
    let mut conn = AsyncPgConnection::establish(database_url).await?;
    let unsettled = idempotency_keys::table
        .filter(idempotency_keys::idempotency_key.eq_any(keys))
        .filter(idempotency_keys::recovery_point.ne("finished").or(idempotency_keys::needs_attention_at.is_not_null()))
        .count()
        .get_result(&mut conn)
        .await?;
    Ok(unsettled)
}

/// How many refunds of `keys` are still pending: one count, polled while they settle.
pub async fn pending_refunds(database_url: &str, keys: &[String]) -> anyhow::Result<i64> {
    let mut conn = AsyncPgConnection::establish(database_url).await?;
    let pending = refunds::table
        .filter(refunds::idempotency_key.eq_any(keys))
        .filter(refunds::status.eq("pending"))
        .count()
        .get_result(&mut conn)
        .await?;
    Ok(pending)
}

/// How many payments of `keys` are authorizations still open: one count, polled while they are
/// captured, cancelled or lapse.
pub async fn open_authorizations(database_url: &str, keys: &[String]) -> anyhow::Result<i64> {
    let mut conn = AsyncPgConnection::establish(database_url).await?;
    let open = payments::table
        .filter(payments::idempotency_key.eq_any(keys))
        .filter(payments::status.eq("requires_capture"))
        .count()
        .get_result(&mut conn)
        .await?;
    Ok(open)
}
