//! The events an account's changes announce, kept. Each is written in the transaction of the
//! change it announces (a phase's `staged` part, see [`StagedEvent`]), so it exists if and only if
//! that change committed; `GET /v1/events` reads it back; the fan-out hands it to delivery once,
//! after it commits; the reaper deletes it after its retention.
//!
//! An event's JSON is fixed when it is staged, its id and time included, and stored whole: every
//! read of it, and every delivery, is that JSON.

use std::time::Duration;

use chrono::Utc;
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::AstPass;
use diesel::sql_types::{BigInt, Jsonb, Text, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use crate::db::schema::events;
use crate::db::sql::{Parameters, no_parameter};
use crate::db::{self, StoreError};

/// Every type of event the service stages.
pub const EVENT_TYPES: [&str; 8] = [
    "payment.succeeded",
    "payment.failed",
    "payment.authorized",
    "payment.captured",
    "payment.canceled",
    "refund.created",
    "refund.succeeded",
    "refund.failed",
];

/// What an event's id begins with where the API shows it: `evt_` and the id's 32 hex digits.
pub const EVENT_ID_PREFIX: &str = "evt_";

/// The event id `id` as the API shows it, and every delivery's `webhook-id`.
pub fn event_id(id: Uuid) -> String {
    format!("{EVENT_ID_PREFIX}{}", id.simple())
}

/// An event about to be staged. Its id and body are fixed here, once, so that every read and
/// every delivery of it carries the same bytes, and receivers can de-duplicate on its id.
#[derive(Debug)]
pub struct StagedEvent {
    account_id: Uuid,
    id: Uuid,
    event_type: &'static str,
    body: serde_json::Value,
}

impl StagedEvent {
    /// An event of type `event_type` (one of [`EVENT_TYPES`]) about `object`, as the API shows it.
    pub fn new(account_id: Uuid, event_type: &'static str, object: impl Serialize) -> StagedEvent {
        debug_assert!(EVENT_TYPES.contains(&event_type), "an event type no one can subscribe to: {event_type}");
        let id = Uuid::now_v7();
        let body = json!({
            "id": event_id(id),
            "object": "event",
            "type": event_type,
            "created": Utc::now().timestamp(),
            "data": { "object": object },
        });
        StagedEvent { account_id, id, event_type, body }
    }
}

/// An event staged by a statement: `{event.account}`, `{event.id}`, `{event.type}` and
/// `{event.body}`, the row of `events` it writes (`INSERT INTO {events} (account_id, id,
/// event_type, body)`).
impl Parameters for StagedEvent {
    fn walk_parameter<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match name {
            "event.account" => out.push_bind_param::<SqlUuid, _>(&self.account_id),
            "event.id" => out.push_bind_param::<SqlUuid, _>(&self.id),
            "event.type" => out.push_bind_param::<Text, _>(self.event_type),
            "event.body" => out.push_bind_param::<Jsonb, _>(&self.body),
            name => Err(no_parameter(name)),
        }
    }
}

/// Which events a list shows: all, one type (`payment.succeeded`), or the types that begin with a
/// prefix (`payment.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TypeFilter {
    All,
    Exactly(&'static str),
    Prefix(&'static str),
}

impl TypeFilter {
    /// The filter `text` asks for; none if it names no type the service stages.
    pub fn parse(text: Option<&str>) -> Option<TypeFilter> {
        let Some(text) = text else { return Some(TypeFilter::All) };
        if text == "*" {
            return Some(TypeFilter::All);
        }
        if let Some(prefix) = text.strip_suffix('*').filter(|prefix| prefix.ends_with('.')) {
            let known = EVENT_TYPES.iter().find(|event_type| event_type.starts_with(prefix))?;
            return Some(TypeFilter::Prefix(&known[..prefix.len()]));
        }
        EVENT_TYPES.iter().find(|event_type| **event_type == text).map(|event_type| TypeFilter::Exactly(event_type))
    }

    /// The `LIKE` pattern of the types it admits.
    fn pattern(&self) -> String {
        match self {
            TypeFilter::All => "%".to_owned(),
            TypeFilter::Exactly(event_type) => (*event_type).to_owned(),
            TypeFilter::Prefix(prefix) => format!("{prefix}%"),
        }
    }
}

/// A kept event: its JSON, as staged, in the very bytes every delivery of it carries (PostgreSQL's
/// text of the stored `jsonb`, the same on every read).
#[derive(Debug, Queryable)]
pub struct Event {
    pub body: String,
}

/// An event's JSON as text: what [`Event`] reads.
fn body_text() -> diesel::expression::SqlLiteral<Text> {
    diesel::dsl::sql::<Text>("body::text")
}

impl Event {
    /// The account's event `id`, if it is kept.
    pub async fn find(conn: &mut AsyncPgConnection, account_id: Uuid, id: Uuid) -> QueryResult<Option<Event>> {
        events::table
            .filter(events::account_id.eq(account_id))
            .filter(events::id.eq(id))
            .select((body_text(),))
            .get_result(conn)
            .await
            .optional()
    }

    /// Where the account's event `id` stands in the order events were written, for paging past
    /// it; none if it is not kept.
    pub async fn position(conn: &mut AsyncPgConnection, account_id: Uuid, id: Uuid) -> QueryResult<Option<i64>> {
        events::table
            .filter(events::account_id.eq(account_id))
            .filter(events::id.eq(id))
            .select(events::created_seq)
            .get_result(conn)
            .await
            .optional()
    }

    /// The account's events that `filter` admits, newest first, written before the one at
    /// `before` (an [`Event::position`]), one more than `limit` to tell whether more follow. The
    /// order is the database's own (a sequence), for the reason payments' is (see
    /// `Payment::list`).
    pub async fn list(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        filter: &TypeFilter,
        before: Option<i64>,
        limit: i64,
    ) -> QueryResult<Vec<Event>> {
        events::table
            .filter(events::account_id.eq(account_id))
            .filter(events::created_seq.lt(before.unwrap_or(i64::MAX)))
            .filter(events::event_type.like(filter.pattern()))
            .order(events::created_seq.desc())
            .limit(limit + 1)
            .select((body_text(),))
            .load(conn)
            .await
    }
}

/// Deletes up to `batch` events older than `retention` that have been fanned out; returns how
/// many. Account by account, as on Citus a row lock must stay within one shard: the accounts with
/// such events first (found through the block range index on `created_at`), then each account's.
/// An event not yet fanned out is kept whatever its age: it has still to reach its endpoints.
pub async fn reap_events(conn: &mut AsyncPgConnection, retention: Duration, batch: i64) -> Result<usize, StoreError> {
    let retention_secs = i64::try_from(retention.as_secs()).unwrap_or(i64::MAX);
    let accounts = diesel::sql_query(format!("SELECT account_id FROM events WHERE {PAST_RETENTION} LIMIT $2"))
        .bind::<BigInt, _>(retention_secs)
        .bind::<BigInt, _>(batch);
    let mut reaped = 0;
    for account_id in db::accounts_of(db::query(accounts.load(conn)).await?) {
        let left = batch - i64::try_from(reaped).unwrap_or(i64::MAX);
        if left <= 0 {
            break;
        }
        // Its deliveries and their attempts go with it.
        let reap = diesel::sql_query(format!(
            "WITH reaped AS (
                 DELETE FROM events
                 WHERE account_id = $3 AND id IN (
                     SELECT id FROM events WHERE account_id = $3 AND {PAST_RETENTION} LIMIT $2 FOR UPDATE SKIP LOCKED
                 )
                 RETURNING id
             ), deliveries AS (
                 DELETE FROM webhook_deliveries WHERE account_id = $3 AND event_id IN (SELECT id FROM reaped)
             ), attempts AS (
                 DELETE FROM webhook_attempts WHERE account_id = $3 AND event_id IN (SELECT id FROM reaped)
             )
             SELECT count(*) AS reaped FROM reaped"
        ))
        .bind::<BigInt, _>(retention_secs)
        .bind::<BigInt, _>(left)
        .bind::<SqlUuid, _>(account_id);
        reaped += db::query(reap.get_result::<Reaped>(conn)).await?.reaped as usize;
    }
    Ok(reaped)
}

#[derive(QueryableByName)]
struct Reaped {
    #[diesel(sql_type = BigInt)]
    reaped: i64,
}

/// An event past its retention (`$1` seconds), and fanned out.
const PAST_RETENTION: &str = "created_at < now() - $1 * interval '1 second' AND fanned_out_at IS NOT NULL";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_type_filter_is_a_type_the_service_stages_or_a_prefix_of_one() {
        assert_eq!(TypeFilter::parse(None), Some(TypeFilter::All));
        assert_eq!(TypeFilter::parse(Some("*")), Some(TypeFilter::All));
        assert_eq!(TypeFilter::parse(Some("refund.failed")), Some(TypeFilter::Exactly("refund.failed")));
        assert_eq!(TypeFilter::parse(Some("payment.*")), Some(TypeFilter::Prefix("payment.")));
        for unknown in ["payment", "payment.", "payment.paid", "pay*", "paym.*", "%", "payment.%", "", ".*"] {
            assert_eq!(TypeFilter::parse(Some(unknown)), None, "{unknown}");
        }
    }

    #[test]
    fn an_event_is_its_contract_json_with_its_id_shown_with_its_prefix() {
        let event = StagedEvent::new(Uuid::nil(), "payment.succeeded", json!({"id": "p"}));
        assert_eq!(event.body["id"], event_id(event.id));
        assert!(event.body["id"].as_str().unwrap().starts_with("evt_"));
        assert_eq!(event.body["id"].as_str().unwrap().len(), 4 + 32);
        assert_eq!(event.body["object"], "event");
        assert_eq!(event.body["type"], "payment.succeeded");
        assert!(event.body["created"].as_i64().unwrap() > 1_700_000_000);
        assert_eq!(event.body["data"]["object"]["id"], "p");
    }
}
