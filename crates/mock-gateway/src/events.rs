//! The gateway's events: what it tells the merchant about a change to its books, as the ledger
//! makes them.
//!
//! An event is made once, with an id of its own, and its body written out then, at the moment of
//! the change: every delivery of it (each retry, each copy) sends those same bytes, so the
//! object it carries is the charge or refund as the gateway's `GET` showed it at that moment,
//! whatever became of it since.

use std::time::Instant;

use bytes::Bytes;
use serde::Serialize;

/// What happened. As Stripe names its events, for the changes this gateway reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(super) enum EventType {
    /// A charge was made.
    #[serde(rename = "charge.succeeded")]
    ChargeSucceeded,
    /// A charge was declined: its charge exists, `failed`.
    #[serde(rename = "charge.failed")]
    ChargeFailed,
    /// An authorized charge was captured.
    #[serde(rename = "charge.captured")]
    ChargeCaptured,
    /// An authorized charge was cancelled: its hold released, nothing captured.
    #[serde(rename = "charge.canceled")]
    ChargeCanceled,
    /// A refund succeeded: at once, or when it settled.
    #[serde(rename = "refund.succeeded")]
    RefundSucceeded,
    /// A pending refund settled as failed: its amount is the charge's to refund again.
    #[serde(rename = "refund.failed")]
    RefundFailed,
}

/// One event, as made.
#[derive(Debug, Clone)]
pub(super) struct Event {
    /// `evt_…`: what a receiver deduplicates by.
    pub(super) id: String,
    pub(super) kind: EventType,
    /// When it was made: a delay counts from here.
    pub(super) made_at: Instant,
    /// What every delivery sends, byte for byte.
    pub(super) body: Bytes,
}

/// An event on the wire. Field order is the wire order.
#[derive(Serialize)]
struct Body<'a, T> {
    id: &'a str,
    object: &'static str,
    #[serde(rename = "type")]
    kind: EventType,
    /// Unix seconds.
    created: u64,
    data: Data<'a, T>,
    request: Request<'a>,
}

#[derive(Serialize)]
struct Data<'a, T> {
    object: &'a T,
}

/// The request that caused the event.
#[derive(Serialize)]
struct Request<'a> {
    /// Its `Idempotency-Key`: the receiver's own downstream key, so that it can tell which of its
    /// requests an event is about even before it has recorded the charge's or refund's id.
    idempotency_key: &'a str,
}

impl Event {
    /// The event `id` of `kind` about `object` (a charge or a refund, as the API shows it), caused
    /// by the request made with `idempotency_key`, made at `created` (unix seconds).
    pub(super) fn new(
        id: String,
        kind: EventType,
        object: &impl Serialize,
        idempotency_key: &str,
        created: u64,
    ) -> Event {
        let body = Body {
            id: &id,
            object: "event",
            kind,
            created,
            data: Data { object },
            request: Request { idempotency_key },
        };
        let body = serde_json::to_vec(&body).expect("an event always serializes").into();
        Event { id, kind, made_at: Instant::now(), body }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn an_event_carries_its_object_and_the_key_of_the_request_that_caused_it() {
        let object = json!({"id": "ch_1", "object": "charge", "status": "succeeded"});
        let event = Event::new("evt_1".into(), EventType::ChargeSucceeded, &object, "payments:a:b", 1_700_000_000);
        let body: Value = serde_json::from_slice(&event.body).unwrap();
        assert_eq!(
            body,
            json!({"id": "evt_1", "object": "event", "type": "charge.succeeded", "created": 1_700_000_000,
                "data": {"object": object}, "request": {"idempotency_key": "payments:a:b"}})
        );
        // In the wire order, the id first.
        assert!(std::str::from_utf8(&event.body).unwrap().starts_with(r#"{"id":"evt_1","object":"event","type""#));
    }

    #[test]
    fn the_types_are_named_as_on_the_wire() {
        let kinds = [
            EventType::ChargeSucceeded,
            EventType::ChargeFailed,
            EventType::ChargeCaptured,
            EventType::ChargeCanceled,
            EventType::RefundSucceeded,
            EventType::RefundFailed,
        ];
        let names = kinds.map(|kind| serde_json::to_value(kind).unwrap());
        let wire = [
            "charge.succeeded",
            "charge.failed",
            "charge.captured",
            "charge.canceled",
            "refund.succeeded",
            "refund.failed",
        ];
        assert_eq!(names, wire.map(|name| json!(name)));
    }
}
