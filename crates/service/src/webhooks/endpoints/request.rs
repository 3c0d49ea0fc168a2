//! The bodies of `POST /v1/webhook_endpoints` (create) and `POST /v1/webhook_endpoints/{id}`
//! (update): what clients send, and what it means once validated. The fields' rules are the same
//! in both.

use serde::{Deserialize, Serialize};

use crate::fields::{Omittable, Rule, ValidationError, has_nul};
use crate::idempotency::Canonical;
use crate::webhooks::events::EVENT_TYPES;
use crate::webhooks::network::Guard;

/// The longest URL an endpoint may have.
pub const MAX_URL: usize = 2048;
/// The longest description, in characters.
pub const MAX_DESCRIPTION: usize = 500;
/// What `enabled_events` holds to take every event.
pub const EVERY_EVENT: &str = "*";

/// The body of a create, as clients send it. Unknown fields are refused, `secret` among them: the
/// service makes every secret itself.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateEndpointBody {
    pub url: String,
    pub enabled_events: Vec<String>,
    #[serde(default)]
    pub description: Omittable<String>,
}

/// A validated create in canonical form (the events sorted, each once): what the key's fingerprint
/// covers. Its fields are declared in alphabetical order (see `Fingerprint::of`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointRequest {
    pub description: Option<String>,
    pub enabled_events: Vec<String>,
    pub url: String,
}

impl Canonical for EndpointRequest {}

impl CreateEndpointBody {
    /// Checks every rule that needs nothing but the body, and returns the canonical request. Where
    /// the URL's address may be sent to is the process's to say (see [`check_address`]).
    pub fn validate(self) -> Result<EndpointRequest, ValidationError> {
        Ok(EndpointRequest {
            description: self.description.sent().map(validate_description).transpose()?,
            enabled_events: validate_events(self.enabled_events)?,
            url: validate_url(&self.url)?,
        })
    }
}

/// What an update may change: any of these, the others left as they are.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateEndpointBody {
    #[serde(default)]
    pub url: Omittable<String>,
    #[serde(default)]
    pub enabled_events: Omittable<Vec<String>>,
    /// `null` clears it.
    #[serde(default, deserialize_with = "sent_or_null")]
    pub description: Option<Option<String>>,
    #[serde(default)]
    pub status: Omittable<EndpointStatus>,
}

/// Whether an endpoint is sent events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndpointStatus {
    Enabled,
    Disabled,
}

impl EndpointStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointStatus::Enabled => "enabled",
            EndpointStatus::Disabled => "disabled",
        }
    }
}

/// A validated update: each field to change, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointChanges {
    pub url: Option<String>,
    pub enabled_events: Option<Vec<String>>,
    pub description: Option<Option<String>>,
    pub status: Option<EndpointStatus>,
}

impl UpdateEndpointBody {
    /// Checks every rule that needs nothing but the body (the same as a create's), and returns
    /// the changes.
    pub fn validate(self) -> Result<EndpointChanges, ValidationError> {
        Ok(EndpointChanges {
            url: self.url.sent().map(|url| validate_url(&url)).transpose()?,
            enabled_events: self.enabled_events.sent().map(validate_events).transpose()?,
            description: self.description.map(|sent| sent.map(validate_description).transpose()).transpose()?,
            status: self.status.sent(),
        })
    }
}

/// A field that may be left out, or sent `null` to clear it: `Some(None)` for `null`.
fn sent_or_null<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(deserializer).map(Some)
}

/// An `http` or `https` URL with a host and no user info, at most [`MAX_URL`] long, as the URL
/// parser writes it.
fn validate_url(url: &str) -> Result<String, ValidationError> {
    let invalid = |why: &str| Err(ValidationError::of(Rule::WebhookUrl, format!("url {why}.")));
    if url.len() > MAX_URL {
        return invalid(&format!("is longer than {MAX_URL} characters"));
    }
    let Ok(parsed) = reqwest::Url::parse(url) else {
        return invalid("is not a URL, such as https://shop.example/webhooks");
    };
    if !matches!(parsed.scheme(), "http" | "https") {
        return invalid("must be http or https");
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return invalid("must name a host");
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return invalid("must carry no user name or password: sign deliveries with the endpoint's secret instead");
    }
    let written = parsed.to_string();
    if written.len() > MAX_URL {
        return invalid(&format!("is longer than {MAX_URL} characters"));
    }
    Ok(written)
}

/// Refuses `url` (valid, as [`validate_url`] wrote it) if its host is a literal address that
/// `guard` does not permit; a name is judged at every attempt, by what it resolves to then.
pub fn check_address(guard: &Guard, url: &str) -> Result<(), ValidationError> {
    let permitted = reqwest::Url::parse(url).is_ok_and(|url| guard.permits_url(&url));
    match permitted {
        true => Ok(()),
        false => Err(ValidationError::of(
            Rule::WebhookUrlNotAllowed,
            "url is an address the service never sends to (loopback, private, link-local or another internal \
             network).",
        )),
    }
}

/// A non-empty list of the types events have, or `*` alone; sorted, each once.
fn validate_events(events: Vec<String>) -> Result<Vec<String>, ValidationError> {
    if events.is_empty() {
        return Err(ValidationError::new("enabled_events must name at least one event type, or be [\"*\"]."));
    }
    if events.iter().any(|event| event == EVERY_EVENT) {
        return match events.iter().all(|event| event == EVERY_EVENT) {
            true => Ok(vec![EVERY_EVENT.to_owned()]),
            false => Err(ValidationError::new("enabled_events: \"*\" takes every event, and stands alone.")),
        };
    }
    if let Some(unknown) = events.iter().find(|event| !EVENT_TYPES.contains(&event.as_str())) {
        let shown: String = unknown.chars().take(100).collect();
        return Err(ValidationError::of(
            Rule::EventType,
            format!("No event has the type {shown:?}. The types are {}.", EVENT_TYPES.join(", ")),
        ));
    }
    let mut events = events;
    events.sort();
    events.dedup();
    Ok(events)
}

fn validate_description(description: String) -> Result<String, ValidationError> {
    if has_nul(&description) {
        return Err(ValidationError::new("description may not contain NUL characters."));
    }
    match description.chars().count() <= MAX_DESCRIPTION {
        true => Ok(description),
        false => Err(ValidationError::new(format!("description must be at most {MAX_DESCRIPTION} characters."))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_http_or_https_with_a_host_and_no_user_info() {
        assert_eq!(validate_url("https://shop.example/hooks").unwrap(), "https://shop.example/hooks");
        assert_eq!(validate_url("HTTP://Shop.Example").unwrap(), "http://shop.example/");
        for bad in [
            "ftp://shop.example/",
            "shop.example/hooks",
            "https://user:pw@shop.example/",
            "https://user@x/",
            "mailto:a@b",
        ] {
            assert_eq!(validate_url(bad).unwrap_err().rule, Rule::WebhookUrl, "{bad}");
        }
        let long = format!("https://shop.example/{}", "a".repeat(MAX_URL));
        assert_eq!(validate_url(&long).unwrap_err().rule, Rule::WebhookUrl);
    }

    #[test]
    fn enabled_events_are_known_types_each_once_or_every_event() {
        let events = |list: &[&str]| validate_events(list.iter().map(|event| event.to_string()).collect());
        assert_eq!(
            events(&["refund.failed", "payment.succeeded", "refund.failed"]).unwrap(),
            ["payment.succeeded", "refund.failed"]
        );
        assert_eq!(events(&["*", "*"]).unwrap(), ["*"]);
        assert_eq!(events(&["payment.paid"]).unwrap_err().rule, Rule::EventType);
        assert_eq!(events(&["payment.*"]).unwrap_err().rule, Rule::EventType);
        assert_eq!(events(&[]).unwrap_err().rule, Rule::Request);
        assert_eq!(events(&["*", "payment.failed"]).unwrap_err().rule, Rule::Request);
    }
}
