//! A gateway event as it arrives: `{"id", "object": "event", "type", "created", "data":
//! {"object": <a charge or a refund>}, "request": {"idempotency_key": <our downstream key>}}`.
//! Read only once its signature holds, and only as objects, as it is sent: an array read by
//! position (see [`Object`]) is no event the gateway sent.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer};
use uuid::Uuid;

use crate::fields::Object;
use crate::gateway;
use crate::metrics::EventKind;

/// The event, as far as the service reads it.
#[derive(Debug, Deserialize)]
pub struct GatewayEvent {
    pub id: String,
    #[serde(rename = "type")]
    type_name: String,
    /// Unix seconds, as the gateway stamped the event (see [`unix_seconds`]).
    #[serde(deserialize_with = "unix_seconds")]
    created: i64,
    data: Object<EventData>,
    /// Absent or null for an event no request of ours caused.
    #[serde(default)]
    request: Option<Object<EventRequest>>,
}

#[derive(Debug, Deserialize)]
struct EventData {
    object: Object<EventObject>,
}

/// The charge or refund the event is about, as the gateway shows it.
#[derive(Debug, Deserialize)]
pub struct EventObject {
    pub id: String,
    /// A declined charge's code. Gateways name a failure by either field, or both, as a string or
    /// as a number: each is read, and [`EventObject::failure_code`] takes the first there is.
    #[serde(default)]
    failure_code: Option<Code>,
    /// A failed refund's reason.
    #[serde(default)]
    failure_reason: Option<Code>,
}

/// A code as a gateway writes it: `"card_declined"`, or `51`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Code {
    Text(String),
    Number(serde_json::Number),
}

impl EventObject {
    /// Why the charge was declined, or the refund failed, if the event says.
    pub fn failure_code(&self) -> Option<String> {
        let code = self.failure_code.as_ref().or(self.failure_reason.as_ref())?;
        Some(match code {
            Code::Text(text) => text.clone(),
            Code::Number(number) => number.to_string(),
        })
    }
}

/// A time as gateways write it: Unix seconds, as an integer or with a fraction (dropped), or Unix
/// milliseconds. A count of seconds past the year 9999 ([`CREATED`]) is taken as milliseconds:
/// every time in milliseconds since January 1978 is one, and no event is stamped after 9999 (so
/// a count meant as seconds that large is read as a time in the late 1970s, not refused).
fn unix_seconds<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    let number = serde_json::Number::deserialize(deserializer)?;
    // An f64 beyond i64 saturates, and is then out of range.
    let seconds = number.as_i64().unwrap_or_else(|| number.as_f64().map_or(i64::MAX, |seconds| seconds.floor() as i64));
    Ok(if seconds > *CREATED.end() { seconds / 1000 } else { seconds })
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

/// Why an event that verified cannot be read, and what little of it can be: its type, and the
/// key row its request names, if they are there to be read.
#[derive(Debug, thiserror::Error)]
#[error("{reason}")]
pub struct Unreadable {
    pub reason: String,
    pub kind: EventKind,
    pub caused_by: Option<(Uuid, Uuid)>,
}

impl GatewayEvent {
    /// The event in `body`, checked to be one the service can record (an id and an object id of
    /// a length its columns hold, a time a timestamp holds).
    pub fn parse(body: &[u8]) -> Result<GatewayEvent, Unreadable> {
        let event: GatewayEvent = match serde_json::from_slice(body) {
            Ok(Object(event)) => event,
            Err(e) => return Err(Unreadable::of(body, format!("not a gateway event the service can read: {e}"))),
        };
        let fits = |text: &str| (1..=255).contains(&text.chars().count()) && !text.chars().any(char::is_control);
        if !fits(&event.id) || !fits(&event.object().id) {
            return Err(Unreadable::of(body, "an event or object id that is empty, too long or not text".into()));
        }
        if !CREATED.contains(&event.created) {
            return Err(Unreadable::of(body, "a created time before 1970 or after 9999".into()));
        }
        Ok(event)
    }

    /// What the event says happened: its type, or `other` for any the service does not act on.
    pub fn kind(&self) -> EventKind {
        EventKind::of(&self.type_name)
    }

    pub fn object(&self) -> &EventObject {
        &self.data.0.object.0
    }

    /// When the gateway stamped the event (within [`CREATED`], checked by [`GatewayEvent::parse`]).
    pub fn created(&self) -> DateTime<Utc> {
        DateTime::from_timestamp(self.created, 0).unwrap_or_default()
    }

    /// The key row whose request caused the event, if the request was ours: the account and key
    /// row our downstream key names.
    pub fn caused_by(&self) -> Option<(Uuid, Uuid)> {
        gateway::parse_downstream_key(self.request.as_ref()?.0.idempotency_key.as_deref()?)
    }
}

impl Unreadable {
    /// `reason`, with the type and the key that `body` names, read as loosely as JSON allows.
    fn of(body: &[u8], reason: String) -> Unreadable {
        let value: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let kind = match value["type"].as_str() {
            Some(name) => EventKind::of(name),
            None => EventKind::Other,
        };
        let caused_by = value["request"]["idempotency_key"].as_str().and_then(gateway::parse_downstream_key);
        Unreadable { reason, kind, caused_by }
    }
}
