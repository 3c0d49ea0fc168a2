//! A gateway event as it arrives: `{"id", "object": "event", "type", "created", "data":
//! {"object": <a charge or a refund>}, "request": {"idempotency_key": <our downstream key>}}`.
//! Read only once its signature holds.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use uuid::Uuid;

use crate::gateway;
use crate::metrics::EventKind;

/// The event, as far as the service reads it.
#[derive(Debug, Deserialize)]
pub struct GatewayEvent {
    pub id: String,
    #[serde(rename = "type")]
    type_name: String,
    /// Unix seconds, as the gateway stamped the event.
    created: i64,
    data: EventData,
    /// Absent or null for an event no request of ours caused.
    #[serde(default)]
    request: Option<EventRequest>,
}

#[derive(Debug, Deserialize)]
struct EventData {
    object: EventObject,
}

/// The charge or refund the event is about, as the gateway shows it.
#[derive(Debug, Deserialize)]
pub struct EventObject {
    pub id: String,
    /// A failed refund's reason (the gateway's `failure_reason`), or a declined charge's code.
    #[serde(default, alias = "failure_reason")]
    pub failure_code: Option<String>,
}

#[derive(Debug, Deserialize)]
struct EventRequest {
    #[serde(default)]
    idempotency_key: Option<String>,
}

/// The `created` times an event may carry, in Unix seconds: 1970 to the end of 9999. Wider ones
/// (chrono reads years to ±262,000) would fail to insert into a `timestamptz` (4713 BC to
/// 294276 AD): the sender's error, answered `400` as any event that does not read is, rather than
/// a `503` that blames our database (the gateway sends it again either way, as it does any event
/// not answered `2xx`).
const CREATED: std::ops::RangeInclusive<i64> = 0..=253_402_300_799;

/// Why an event that verified cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unreadable(String);

impl GatewayEvent {
    /// The event in `body`, checked to be one the service can record (an id and an object id of
    /// a length its columns hold).
    pub fn parse(body: &[u8]) -> Result<GatewayEvent, Unreadable> {
        let event: GatewayEvent =
            serde_json::from_slice(body).map_err(|e| Unreadable(format!("not a gateway event: {e}")))?;
        let fits = |text: &str| (1..=255).contains(&text.chars().count()) && !text.chars().any(char::is_control);
        if !fits(&event.id) || !fits(&event.data.object.id) {
            return Err(Unreadable("an event or object id that is empty, too long or not text".into()));
        }
        if !CREATED.contains(&event.created) {
            return Err(Unreadable("a created time before 1970 or after 9999".into()));
        }
        Ok(event)
    }

    /// What the event says happened: its type, or `other` for any the service does not act on.
    pub fn kind(&self) -> EventKind {
        match self.type_name.as_str() {
            "charge.succeeded" => EventKind::ChargeSucceeded,
            "charge.failed" => EventKind::ChargeFailed,
            "refund.succeeded" => EventKind::RefundSucceeded,
            "refund.failed" => EventKind::RefundFailed,
            _ => EventKind::Other,
        }
    }

    pub fn object(&self) -> &EventObject {
        &self.data.object
    }

    /// When the gateway stamped the event (within [`CREATED`], checked by [`GatewayEvent::parse`]).
    pub fn created(&self) -> DateTime<Utc> {
        DateTime::from_timestamp(self.created, 0).unwrap_or_default()
    }

    /// The key row whose request caused the event, if the request was ours: the account and key
    /// row our downstream key names.
    pub fn caused_by(&self) -> Option<(Uuid, Uuid)> {
        gateway::parse_downstream_key(self.request.as_ref()?.idempotency_key.as_deref()?)
    }
}
