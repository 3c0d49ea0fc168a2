//! Applying a verified gateway event exactly once, by the database: the event's row in the inbox
//! and what the event changes commit together, or not at all. A delivery that comes again finds
//! the row and changes nothing; two that come at once take turns on the row's unique key, and the
//! second finds the first's.
//!
//! What an event may change, and what it may not: the phases stay the only writers of a key's
//! recovery point, under its fence. So an event about a key still unfinished only records itself
//! and *nudges* the key: the completer takes a nudged key at once, whatever its backoff, and its
//! look-up by our downstream key then settles it, at the same gateway fact the event reported. An
//! event about a finished payment is compared with what the payment recorded; one that disagrees
//! (a charge we stored as declined reported succeeded, another charge id) changes no money and
//! flags the key for a person. A refund event settles a pending refund forward only, as the
//! settler would; about a refund already settled, it agrees, or is stale (older than what we know),
//! or disagrees.

use diesel::prelude::*;
use diesel::sql_types::{Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use payments_protocol::{self as protocol, Reading, RefundStage};
use serde_json::json;
use uuid::Uuid;

use super::event::{GatewayEvent, Unreadable};
use crate::audit::Actor;
use crate::db::{self, StoreError};
use crate::gateway::reports::{self, REPORTED_LIKE, UNREADABLE_EVENT};
use crate::idempotency::RecoveryPoint;
use crate::metrics::{EventKind, EventOutcome};
use crate::refunds::{Refund, SettledBy, Settlement, settle_refund};
use crate::request_id::RequestId;

/// The reason code of a key flagged because its gateway's event disagrees with what it recorded.
pub use crate::gateway::reports::DISAGREEMENT;

/// What the event is about, as the database has it: the payment or refund made under the key
/// row our downstream key names, and whether that key is finished (none once it is reaped).
#[derive(Debug, QueryableByName)]
struct Target {
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = Nullable<Text>)]
    gateway: Option<String>,
    #[diesel(sql_type = Text)]
    status: String,
    /// The gateway's id of the charge or refund, once recorded (a capture's or a cancel's: its
    /// payment's charge).
    #[diesel(sql_type = Nullable<Text>)]
    object_id: Option<String>,
    /// A capture's or a cancel's kind.
    #[diesel(sql_type = Nullable<Text>)]
    change_kind: Option<String>,
    /// The key's recovery point; none once it is reaped (only finished keys are).
    #[diesel(sql_type = Nullable<Text>)]
    key_point: Option<String>,
}

/// How long an event that names a key of ours, with nothing the database shows made under it, is
/// answered [`EventOutcome::NotSeenYet`] (the gateway sends it again) before it is taken for no
/// request of ours. On one PostgreSQL no such event comes: what a key makes commits before the
/// gateway is asked. On Citus, a commit whose last step a crashed worker never answered is
/// reported done, and its rows show only once the coordinator's recovery finishes it, seconds
/// later; an event read in between would otherwise be acknowledged and lost.
pub const UNSEEN_PATIENCE: chrono::TimeDelta = chrono::TimeDelta::minutes(10);

/// How far ahead of this clock an event's `created` may be and still be waited for (see
/// [`UNSEEN_PATIENCE`]): the default tolerance of the signature's own time
/// (`PAYMENTS_GATEWAY_WEBHOOK_TOLERANCE_SECS`, 300 s, Stripe's too). An event is made before it
/// is sent and signed, and a signature from a clock further ahead than that is refused, so no
/// gateway's honest `created` is further ahead; one that is says nothing about how long to wait.
/// Unbounded, an event stamped a year ahead was answered `503 event-not-seen-yet`, and sent
/// again, for a year: beyond this it is taken for no request of ours, as an old one is.
pub const CREATED_AHEAD_TOLERANCE: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

/// Receives `event` (verified), on the webhook request `request_id`: records it once and applies
/// it, in one transaction.
pub async fn receive(
    conn: &mut AsyncPgConnection,
    event: &GatewayEvent,
    request_id: &RequestId,
) -> Result<EventOutcome, StoreError> {
    let Some((account_id, key_id)) = event.caused_by() else { return Ok(EventOutcome::Unknown) };
    if event.kind() == EventKind::Other {
        return Ok(EventOutcome::Unknown);
    }
    db::bounded(conn.transaction::<_, StoreError, _>(async |conn| {
        let Some(target) = target(conn, account_id, key_id).await? else {
            let age = chrono::Utc::now() - event.created();
            let young = (-CREATED_AHEAD_TOLERANCE..UNSEEN_PATIENCE).contains(&age);
            return Ok(if young { EventOutcome::NotSeenYet } else { EventOutcome::Unknown });
        };
        let about_refunds = matches!(event.kind(), EventKind::RefundSucceeded | EventKind::RefundFailed);
        let about_changes = matches!(event.kind(), EventKind::ChargeCaptured | EventKind::ChargeCanceled);
        if about_refunds != (target.kind == "refund") || about_changes != (target.kind == "payment_change") {
            return Ok(EventOutcome::Unknown);
        }
        // The row first: a second delivery waits here for the first to commit, then finds its row.
        let gateway = target.gateway.as_deref().unwrap_or("unrecorded");
        if !record(conn, account_id, gateway, event, key_id).await? {
            return Ok(EventOutcome::Duplicate);
        }
        let (started, finished) = (RecoveryPoint::STARTED.as_str(), RecoveryPoint::FINISHED.as_str());
        let outcome = match target.key_point.as_deref() {
            // Before the gateway's answer is recorded: only the key's driver may record it.
            Some(point) if point == started => nudge(conn, account_id, key_id).await?,
            // The answer is recorded (the key is past `started`), the key not finished yet: held to
            // what was recorded, and the key woken to finish. A refund the gateway left pending is
            // the settler's, later.
            Some(point) if point != finished => {
                nudge(conn, account_id, key_id).await?;
                match (about_changes, about_refunds, target.status.as_str()) {
                    (true, _, _) => compare_change(&target, event),
                    (_, true, "pending") => EventOutcome::Nudged,
                    (_, true, status) => compare_refund(refund_status(status), target.object_id.as_deref(), event),
                    (false, false, _) => compare_charge(&target, event),
                }
            }
            _ if about_changes => compare_change(&target, event),
            _ if about_refunds => settle(conn, account_id, &target, event, request_id).await?,
            _ => compare_charge(&target, event),
        };
        if outcome == EventOutcome::Disagreement {
            let detail = format!(
                "the gateway's event {} ({}) disagrees with what the key recorded",
                event.id,
                event.kind().as_str()
            );
            flag(conn, account_id, key_id, DISAGREEMENT, &detail, request_id).await?;
        }
        diesel::sql_query(
            "WITH outcome AS (
                 UPDATE gateway_events SET outcome = $4
                 WHERE account_id = $1 AND idempotency_key_id = $9 AND event_id = $3
                 RETURNING account_id
             )
             INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT account_id, 'gateway_event.received', $5, $6, 'gateway',
                    jsonb_build_object('event_id', $3::text, 'event_type', $7::text, 'outcome', $4::text), $8
             FROM outcome",
        )
        .bind::<SqlUuid, _>(account_id)
        .bind::<Text, _>(gateway)
        .bind::<Text, _>(&event.id)
        .bind::<Text, _>(outcome.as_str())
        .bind::<Text, _>(&target.kind)
        .bind::<SqlUuid, _>(target.id)
        .bind::<Text, _>(event.kind().as_str())
        .bind::<Text, _>(request_id.as_str())
        .bind::<SqlUuid, _>(key_id)
        .execute(conn)
        .await?;
        Ok(outcome)
    }))
    .await
}

async fn target(conn: &mut AsyncPgConnection, account_id: Uuid, key_id: Uuid) -> QueryResult<Option<Target>> {
    diesel::sql_query(
        "WITH made AS (
             SELECT 'payment' AS kind, id, gateway, status::text, gateway_charge_id::text AS object_id,
                    NULL::text AS change_kind
             FROM payments WHERE account_id = $1 AND idempotency_key_id = $2
             UNION ALL
             SELECT 'refund', id, gateway, status, gateway_refund_id, NULL
             FROM refunds WHERE account_id = $1 AND idempotency_key_id = $2
             UNION ALL
             SELECT 'payment_change', c.id, c.gateway, c.status, p.gateway_charge_id, c.kind
             FROM payment_changes c JOIN payments p ON p.account_id = $1 AND p.id = c.payment_id
             WHERE c.account_id = $1 AND c.idempotency_key_id = $2
         )
         SELECT made.*, (SELECT recovery_point FROM idempotency_keys WHERE account_id = $1 AND id = $2)
                        AS key_point
         FROM made",
    )
    .bind::<SqlUuid, _>(account_id)
    .bind::<SqlUuid, _>(key_id)
    .get_result(conn)
    .await
    .optional()
}

/// The event's row in the inbox, unless it is there already: whether it was new.
async fn record(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    gateway: &str,
    event: &GatewayEvent,
    key_id: Uuid,
) -> QueryResult<bool> {
    let inserted = diesel::sql_query(
        "INSERT INTO gateway_events (account_id, gateway, event_id, event_type, idempotency_key_id, object_id,
                                     created_at, outcome)
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'applied')
         ON CONFLICT (account_id, idempotency_key_id, event_id) DO NOTHING",
    )
    .bind::<SqlUuid, _>(account_id)
    .bind::<Text, _>(gateway)
    .bind::<Text, _>(&event.id)
    .bind::<Text, _>(event.kind().as_str())
    .bind::<SqlUuid, _>(key_id)
    .bind::<Text, _>(&event.object().id)
    .bind::<Timestamptz, _>(event.created())
    .execute(conn)
    .await?;
    Ok(inserted == 1)
}

/// The key is unfinished: the completer takes it at once, and its look-up settles it.
async fn nudge(conn: &mut AsyncPgConnection, account_id: Uuid, key_id: Uuid) -> QueryResult<EventOutcome> {
    diesel::sql_query(
        "UPDATE idempotency_keys SET nudged_at = now() WHERE account_id = $1 AND id = $2 AND finished_at IS NULL",
    )
    .bind::<SqlUuid, _>(account_id)
    .bind::<SqlUuid, _>(key_id)
    .execute(conn)
    .await?;
    Ok(EventOutcome::Nudged)
}

/// A charge event about a payment whose outcome is recorded: it agrees with it, or not (see
/// [`protocol::read_charge_event`]).
fn compare_charge(payment: &Target, event: &GatewayEvent) -> EventOutcome {
    let succeeded = event.kind() == EventKind::ChargeSucceeded;
    // A charge made: captured, or authorized (and then perhaps captured or cancelled since).
    let made = matches!(payment.status.as_str(), "succeeded" | "requires_capture" | "canceled");
    let read = protocol::read_charge_event(made, payment.object_id.as_deref(), succeeded, &event.object().id);
    outcome_of(read)
}

/// A capture or cancel event about a change whose answer is recorded: it agrees if the change
/// was done, is of the kind the event says, and of the same charge (see
/// [`protocol::read_change_event`]).
fn compare_change(change: &Target, event: &GatewayEvent) -> EventOutcome {
    let kind = match event.kind() {
        EventKind::ChargeCaptured => "capture",
        _ => "cancel",
    };
    let read = protocol::read_change_event(
        change.status == "succeeded",
        change.change_kind.as_deref() == Some(kind),
        change.object_id.as_deref() == Some(event.object().id.as_str()),
    );
    outcome_of(read)
}

/// A refund event about a refund whose key is finished: a pending one is settled forward (as the
/// settler would), a settled one agrees, is stale, or disagrees.
async fn settle(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    target: &Target,
    event: &GatewayEvent,
    request_id: &RequestId,
) -> Result<EventOutcome, StoreError> {
    let object = event.object();
    let ours = target.object_id.as_deref().is_none_or(|id| id == object.id);
    if target.status == "pending" && ours {
        let refund = Refund::find(conn, account_id, target.id).await?.ok_or(diesel::result::Error::NotFound)?;
        let settlement = match event.kind() == EventKind::RefundSucceeded {
            true => Settlement::Succeeded,
            false => Settlement::Failed { code: failure_code(object.failure_code().as_deref()) },
        };
        let by = SettledBy { actor: Actor::Gateway, request_id, data: json!({ "event_id": event.id }) };
        let settled = settle_refund(conn, &refund, &settlement, by).await?;
        if settled.is_some() {
            return Ok(EventOutcome::Applied);
        }
        // Settled meanwhile (by the settler): compare with that.
        let now = Refund::find(conn, account_id, target.id).await?.ok_or(diesel::result::Error::NotFound)?;
        return Ok(compare_refund(refund_status(now.status.as_str()), now.gateway_refund_id.as_deref(), event));
    }
    Ok(compare_refund(refund_status(&target.status), target.object_id.as_deref(), event))
}

fn refund_status(status: &str) -> RefundStage {
    match status {
        "succeeded" => RefundStage::Succeeded,
        "failed" => RefundStage::Failed,
        _ => RefundStage::Pending,
    }
}

/// A refund event about a refund we know settled: it agrees, or it is older than what we know
/// (stale: ignored), or it says something we have not seen (see [`protocol::read_refund_event`]).
fn compare_refund(recorded: RefundStage, object_id: Option<&str>, event: &GatewayEvent) -> EventOutcome {
    let reported = match event.kind() {
        EventKind::RefundFailed => RefundStage::Failed,
        _ => RefundStage::Succeeded,
    };
    outcome_of(protocol::read_refund_event(recorded, object_id, reported, &event.object().id))
}

fn outcome_of(read: Reading) -> EventOutcome {
    match read {
        Reading::Agrees => EventOutcome::Applied,
        Reading::Stale => EventOutcome::Stale,
        Reading::Disagrees => EventOutcome::Disagreement,
    }
}

/// Flags the key for a person (unless its gateway reported about it already, or it is reaped),
/// for what its gateway reported (`code`, one of the `GATEWAY_` reason codes, and `detail`), in
/// place of a worker's giving up, which a finish or a hand-back would clear. No money moves.
async fn flag(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    key_id: Uuid,
    code: &str,
    detail: &str,
    request_id: &RequestId,
) -> QueryResult<()> {
    diesel::sql_query(format!(
        "WITH marked AS (
             UPDATE idempotency_keys SET needs_attention_at = now(), attention_reason = $3
             WHERE account_id = $1 AND id = $2
               AND (needs_attention_at IS NULL OR attention_reason NOT LIKE '{REPORTED_LIKE}')
             RETURNING account_id, id
         )
         INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data, request_id)
         SELECT account_id, 'idempotency_key.needs_attention', 'idempotency_key', id, 'gateway',
                jsonb_build_object('reason_code', $4::text, 'reason', $3::text), $5
         FROM marked"
    ))
    .bind::<SqlUuid, _>(account_id)
    .bind::<SqlUuid, _>(key_id)
    .bind::<Text, _>(reports::reason(code, detail))
    .bind::<Text, _>(code)
    .bind::<Text, _>(request_id.as_str())
    .execute(conn)
    .await?;
    tracing::error!(%account_id, %key_id, reason_code = code, %detail, "a gateway event about a key needs attention");
    Ok(())
}

/// The most of an unreadable event's body that is kept: enough for a person to see what came.
const KEPT_BYTES: usize = 16 * 1024;

/// Keeps an event that verified but cannot be read (`why`), raw and bounded, for a person, and
/// flags the key its request names, if that is one of ours, in one transaction: no retry of the
/// gateway's would make it readable, so it is acknowledged rather than refused for ever.
pub async fn keep_unreadable(
    conn: &mut AsyncPgConnection,
    body: &[u8],
    why: &Unreadable,
    request_id: &RequestId,
) -> Result<EventOutcome, StoreError> {
    let (account_id, key_id) = why.caused_by.unzip();
    let kept = &body[..body.len().min(KEPT_BYTES)];
    let body_bytes = i32::try_from(body.len()).unwrap_or(i32::MAX);
    let reason: String = why.reason.chars().take(1000).collect();
    db::bounded(conn.transaction::<_, StoreError, _>(async |conn| {
        // The account and key only if they are ours: the key may be reaped, the account never is.
        let keeps = diesel::sql_query(
            "WITH ours AS (SELECT id FROM accounts WHERE id = $1)
             INSERT INTO unreadable_gateway_events (account_id, idempotency_key_id, body, body_bytes, reason, request_id)
             SELECT (SELECT id FROM ours), CASE WHEN EXISTS (SELECT FROM ours) THEN $2::uuid END, $3, $4, $5, $6",
        )
        .bind::<Nullable<SqlUuid>, _>(account_id)
        .bind::<Nullable<SqlUuid>, _>(key_id)
        .bind::<diesel::sql_types::Bytea, _>(kept)
        .bind::<diesel::sql_types::Integer, _>(body_bytes)
        .bind::<Text, _>(&reason)
        .bind::<Text, _>(request_id.as_str());
        keeps.execute(conn).await?;
        if let (Some(account_id), Some(key_id)) = (account_id, key_id) {
            let detail = format!("the gateway sent an event about it that cannot be read: {reason}");
            flag(conn, account_id, key_id, UNREADABLE_EVENT, &detail, request_id).await?;
        }
        Ok(EventOutcome::Unrecognized)
    }))
    .await
}

/// A failed refund's reason, fit to be recorded.
fn failure_code(reason: Option<&str>) -> String {
    let cleaned: String = reason.unwrap_or("unknown").chars().filter(|c| !c.is_control()).take(100).collect();
    if cleaned.trim().is_empty() { "unknown".into() } else { cleaned }
}
