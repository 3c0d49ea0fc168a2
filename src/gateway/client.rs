//! Our client for a Stripe-like payment gateway.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Url;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The key we send the gateway for the request behind one of our key rows. Derived from our own
/// row, never the client's header: unique across accounts (two accounts may use the same client
/// key) and the same on every retry, resumption and worker run, so the gateway charges once.
pub fn downstream_key(account_id: Uuid, key_id: Uuid) -> String {
    format!("payments:{account_id}:{key_id}")
}

/// A charge request, as the gateway takes it.
#[derive(Debug, Serialize)]
pub struct ChargeRequest<'a> {
    pub amount: i64,
    pub currency: &'a str,
    pub source: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<&'a str>,
    pub metadata: &'a BTreeMap<String, String>,
}

/// A charge the gateway made.
#[derive(Debug, Clone, Deserialize)]
pub struct Charge {
    pub id: String,
}

/// Why a charge was not made, or may not have been.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The card was declined: definitive, nothing was charged.
    #[error("card declined ({code}): {message}")]
    Declined { code: String, message: String },
    /// The gateway refused the request for another reason (a 4xx): definitive, nothing charged.
    #[error("charge rejected with {status}: {message}")]
    Rejected { status: u16, message: String },
    /// No definitive answer: a connection error, a 5xx, a 409 (the gateway is still processing
    /// this key) or an unreadable success. The charge may or may not exist.
    #[error("gateway unavailable: {0}")]
    Unavailable(String),
    /// No answer in time. The charge may or may not exist.
    #[error("the gateway did not answer in time")]
    Timeout,
}

impl GatewayError {
    /// Whether the outcome is known (no charge was made), as opposed to indeterminate.
    pub fn is_definitive(&self) -> bool {
        matches!(self, GatewayError::Declined { .. } | GatewayError::Rejected { .. })
    }
}

/// The gateway's error body: `{"error": {"type", "code", "message"}}`.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error: ErrorDetail,
}

/// The answer to a look-up by key: `{"object": "list", "data": [charge, ...]}`.
#[derive(Debug, Deserialize)]
struct ChargeList {
    data: Vec<Charge>,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorDetail {
    code: Option<String>,
    message: Option<String>,
}

/// A client for one gateway. Cheap to clone; clones share one connection pool, so calls reuse
/// keep-alive connections instead of opening one per charge.
#[derive(Debug, Clone)]
pub struct GatewayClient {
    http: reqwest::Client,
    charges_url: Url,
}

impl GatewayClient {
    /// A client for the gateway at `base_url`, giving up on any call after `timeout`.
    pub fn new(base_url: &Url, timeout: Duration) -> anyhow::Result<GatewayClient> {
        let http = reqwest::Client::builder().timeout(timeout).connect_timeout(timeout).build()?;
        Ok(GatewayClient { http, charges_url: base_url.join("v1/charges")? })
    }

    /// The charge made under `idempotency_key`, if any. Charges keep the key they were made with,
    /// so this finds one even after the gateway has forgotten the key itself (and would charge
    /// again if asked to). Any answer but a list is indeterminate.
    #[tracing::instrument(name = "gateway.find_charge", skip_all)]
    pub async fn find_charge(&self, idempotency_key: &str) -> Result<Option<Charge>, GatewayError> {
        let mut url = self.charges_url.clone();
        url.query_pairs_mut().append_pair("idempotency_key", idempotency_key);
        let response = self.http.get(url).send().await.map_err(from_transport)?;
        let status = response.status();
        let body = response.bytes().await.map_err(from_transport)?;
        if !status.is_success() {
            return Err(GatewayError::Unavailable(format!("the charge look-up answered {status}")));
        }
        let list: ChargeList = serde_json::from_slice(&body)
            .map_err(|e| GatewayError::Unavailable(format!("unreadable charge look-up: {e}")))?;
        if list.data.len() > 1 {
            tracing::error!(
                charges = list.data.len(),
                "the gateway holds several charges for one key; adopting the first"
            );
        }
        Ok(list.data.into_iter().next())
    }

    /// Asks the gateway to charge, under `idempotency_key` (see [`downstream_key`]).
    #[tracing::instrument(name = "gateway.charge", skip_all, fields(gateway.status))]
    pub async fn charge(&self, idempotency_key: &str, request: &ChargeRequest<'_>) -> Result<Charge, GatewayError> {
        let response = self
            .http
            .post(self.charges_url.clone())
            .header("Idempotency-Key", idempotency_key)
            .json(request)
            .send()
            .await
            .map_err(from_transport)?;
        let status = response.status().as_u16();
        tracing::Span::current().record("gateway.status", status);
        let body = response.bytes().await.map_err(from_transport)?;
        let error = || serde_json::from_slice::<ErrorBody>(&body).unwrap_or_default().error;
        match status {
            200..=299 => serde_json::from_slice(&body)
                .map_err(|e| GatewayError::Unavailable(format!("unreadable charge in a {status} answer: {e}"))),
            402 => {
                let error = error();
                Err(GatewayError::Declined {
                    code: error.code.unwrap_or_else(|| "card_declined".into()),
                    message: error.message.unwrap_or_else(|| "The card was declined.".into()),
                })
            }
            409 => Err(GatewayError::Unavailable("the gateway is still processing this key (409)".into())),
            400..=499 => Err(GatewayError::Rejected {
                status,
                message: error().message.unwrap_or_else(|| format!("the gateway answered {status}")),
            }),
            _ => Err(GatewayError::Unavailable(format!("the gateway answered {status}"))),
        }
    }
}

fn from_transport(error: reqwest::Error) -> GatewayError {
    if error.is_timeout() { GatewayError::Timeout } else { GatewayError::Unavailable(error.to_string()) }
}
