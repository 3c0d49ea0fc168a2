//! One attempt to deliver an event to an endpoint: the event's bytes as they were kept (the same
//! on every attempt and to every endpoint), under the event's id, signed at this attempt's time
//! under every secret that signs now, sent by the [`Sender`] and its network rules.

use reqwest::Url;

use payments_wire::standard_webhooks::{ID_HEADER, SIGNATURE_HEADER, SigningSecret, TIMESTAMP_HEADER, sign};

use super::network::{Attempted, Sender};

/// What an attempt sends.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub url: &'a Url,
    /// `webhook-id`: the event's id.
    pub event_id: &'a str,
    /// The event's JSON, exactly as kept.
    pub body: &'a [u8],
    /// Every secret that signs now, the newest first.
    pub secrets: &'a [SigningSecret],
}

/// Sends `outgoing`, signed at `timestamp` (unix seconds, this attempt's).
pub async fn attempt(sender: &Sender, outgoing: Outgoing<'_>, timestamp: i64) -> Attempted {
    let signature = sign(outgoing.secrets, outgoing.event_id, timestamp, outgoing.body);
    let headers = [
        (ID_HEADER, outgoing.event_id.to_owned()),
        (TIMESTAMP_HEADER, timestamp.to_string()),
        (SIGNATURE_HEADER, signature),
    ];
    sender.post(outgoing.url, &headers, outgoing.body.to_vec()).await
}
