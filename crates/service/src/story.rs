//! A key's whole story, whichever endpoint it was used on: where the key stands, what it made (as
//! its endpoint finds it: see [`crate::keyed::Keyed::made`]), and every step of its audit trail, for a person (or support) to follow one
//! request through its recovery points.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use diesel_async::AsyncPgConnection;
use serde::Serialize;
use uuid::Uuid;

use crate::audit::{self, AuditEntry};
use crate::db::{self, StoreError};
use crate::idempotency::{IdempotencyKey, KeyRecord, RecoveryPoint};
use crate::keyed::{Registered, Resource};

/// What of an audit record's data the key's owner sees: facts about the request, never an
/// error's text or a gateway's identity, which may name servers or database errors (operators
/// read those in `payments attention list`, the logs, or the audit table).
const SHOWN: [&str; 17] = [
    "recovery_point",
    "reason_code",
    "answered_by",
    "status",
    "gateway_charge_id",
    "gateway_refund_id",
    "failure_code",
    "refusal",
    "payment",
    "event_id",
    "event_type",
    "outcome",
    "response_status",
    "amount",
    "currency",
    "attempt",
    "attempts",
];

/// The most audit records one story holds. A key's trail is short (claimed, three phases, reaped,
/// and two more for each run that stopped short), but a client that retries through a long outage
/// lengthens it without end: a hundred records cover dozens of interrupted runs and keep an answer
/// to a few tens of kilobytes, and `trail_after` reads on from there.
pub const TRAIL_LIMIT: u32 = 100;

/// The actions whose latest record the story's summary reads, wherever they are in the trail.
const SUMMARISED: [&str; 6] = [
    "idempotency_key.claimed",
    "idempotency_key.needs_attention",
    "idempotency_key.reaped",
    "payment.finished",
    "refund.finished",
    "refund.refused",
];

/// The story of one key of an account.
#[derive(Debug, Serialize)]
pub struct KeyStory {
    object: &'static str,
    key: String,
    /// The key row's id, as audit records name it.
    id: Uuid,
    recovery_point: String,
    /// Whether a driver holds the key now, by the database's clock (a lease that ran out holds
    /// nothing: the next request or the completer takes the key over).
    locked: bool,
    locked_until: Option<DateTime<Utc>>,
    completer_attempts: i32,
    needs_attention: bool,
    /// Why the completer gave up, as a code: `unknown_outcome`, `lock_lost`, `database`, `internal`.
    attention_reason: Option<String>,
    needs_attention_at: Option<DateTime<Utc>>,
    created_at: Option<DateTime<Utc>>,
    last_run_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    /// When the finished key expires (answered `410` from then on), as recorded when it finished.
    expires_at: Option<DateTime<Utc>>,
    /// The key's record was deleted after it expired: only what it made and its trail remain.
    reaped: bool,
    /// The HTTP status of the stored answer.
    response_status: Option<i16>,
    /// The payment the key made or changed, as the API shows payments but for the gateway's own
    /// words.
    payment: Option<serde_json::Value>,
    /// The refund the key made, as the API shows refunds.
    refund: Option<serde_json::Value>,
    /// What a key of another endpoint made, in the field its endpoint names (`webhook_endpoint`),
    /// as the API shows it; left out when there is none.
    #[serde(flatten)]
    made: BTreeMap<&'static str, serde_json::Value>,
    /// The audit records about the key and what it made, oldest first: at most [`TRAIL_LIMIT`],
    /// after the first `trail_after`.
    trail: Vec<AuditEntry>,
    /// Whether more records follow: ask again with `trail_after` raised by the records shown.
    trail_has_more: bool,
}

impl KeyStory {
    /// The story of the account's `key`, if the account ever used it (a reaped key's too, as long
    /// as what it made remains), with its trail from after the first `trail_after` records. Another
    /// account's key is none of this account's business: none. What the key made is its endpoint's
    /// to find, as the registry (`keyed`) lists it.
    pub async fn find(
        conn: &mut AsyncPgConnection,
        keyed: &'static [Registered],
        account_id: Uuid,
        key: &IdempotencyKey,
        trail_after: u32,
    ) -> Result<Option<KeyStory>, StoreError> {
        let record = db::query(KeyRecord::find(conn, account_id, key)).await?;
        // The key's endpoint: its row's, or, once that is reaped, the one it finished on.
        let path = match &record {
            Some(record) => Some(record.request_path.clone()),
            None => db::query(KeyRecord::path_of_reaped(conn, account_id, key)).await?,
        };
        let made = match path.and_then(|path| Registered::at(keyed, &path)) {
            Some(entry) => {
                db::query((entry.made)(conn, account_id, record.as_ref().map(|r| r.id), key.as_str())).await?
            }
            None => None,
        };
        // The key row is gone; what it made remembers the row it was made under.
        let made_under = made.as_ref().and_then(|made| made.key_id);
        let Some(key_id) = record.as_ref().map(|record| record.id).or(made_under) else { return Ok(None) };
        let mut resources = vec![("idempotency_key", key_id)];
        resources.extend(made.iter().flat_map(|made| made.resources.iter().copied()));
        // One more than shown, to know whether more follow.
        let (skip, limit) = (i64::from(trail_after), i64::from(TRAIL_LIMIT) + 1);
        let mut trail = db::query(audit::trail(conn, account_id, &resources, skip, limit)).await?;
        let trail_has_more = trail.len() > TRAIL_LIMIT as usize;
        trail.truncate(TRAIL_LIMIT as usize);
        let summary = db::query(audit::latest(conn, account_id, &resources, &SUMMARISED)).await?;
        let story = KeyStory::new(key, key_id, record, made, &summary);
        Ok(Some(KeyStory { trail: trail.into_iter().map(facts_only).collect(), trail_has_more, ..story }))
    }

    /// The story, but for its trail: what the record says, or (once it is reaped) what the
    /// `summary` of the trail does, the latest record of each of [`SUMMARISED`].
    fn new(
        key: &IdempotencyKey,
        id: Uuid,
        record: Option<KeyRecord>,
        made: Option<Resource>,
        summary: &[AuditEntry],
    ) -> KeyStory {
        let latest = |action: &str| summary.iter().find(|entry| entry.action == action);
        let gave_up = latest("idempotency_key.needs_attention");
        let attention_code = gave_up.and_then(|entry| entry.data["reason_code"].as_str()).map(str::to_owned);
        let at = |action: &str| latest(action).map(|entry| entry.created_at);
        let story = KeyStory {
            object: "idempotency_key",
            key: key.as_str().to_owned(),
            id,
            recovery_point: RecoveryPoint::FINISHED.as_str().to_owned(),
            locked: false,
            locked_until: None,
            completer_attempts: 0,
            needs_attention: false,
            attention_reason: None,
            needs_attention_at: None,
            created_at: None,
            last_run_at: None,
            finished_at: None,
            expires_at: None,
            reaped: false,
            response_status: None,
            payment: None,
            refund: None,
            made: BTreeMap::new(),
            trail: Vec::new(),
            trail_has_more: false,
        };
        let story = match record {
            Some(record) => KeyStory {
                recovery_point: record.recovery_point,
                locked: record.locked,
                locked_until: record.locked_until,
                completer_attempts: record.completer_attempts,
                needs_attention: record.needs_attention_at.is_some(),
                attention_reason: record.needs_attention_at.and(attention_code),
                needs_attention_at: record.needs_attention_at,
                created_at: Some(record.created_at),
                last_run_at: Some(record.last_run_at),
                finished_at: record.finished_at,
                expires_at: record.expires_at,
                response_status: record.response_status,
                ..story
            },
            // Reaped: only finished keys are, and what the row said is in the trail (its summary).
            None => {
                let status = latest("idempotency_key.reaped").and_then(|entry| entry.data["response_status"].as_i64());
                KeyStory {
                    reaped: true,
                    created_at: at("idempotency_key.claimed").or(made.as_ref().map(|made| made.created_at)),
                    finished_at: at("payment.finished").or(at("refund.finished")).or(at("refund.refused")),
                    response_status: status.and_then(|status| i16::try_from(status).ok()),
                    ..story
                }
            }
        };
        // Shown in the field the endpoint names.
        let (mut payment, mut refund, mut other) = (None, None, BTreeMap::new());
        match made.map(|made| made.shown) {
            Some(("payment", shown)) => payment = Some(shown),
            Some(("refund", shown)) => refund = Some(shown),
            Some((field, shown)) => drop(other.insert(field, shown)),
            None => {}
        }
        KeyStory { payment, refund, made: other, ..story }
    }
}

/// An audit record as the key's owner sees it: only the facts in [`SHOWN`].
fn facts_only(mut entry: AuditEntry) -> AuditEntry {
    if let Some(data) = entry.data.as_object_mut() {
        data.retain(|field, _| SHOWN.contains(&field.as_str()));
    }
    entry
}
