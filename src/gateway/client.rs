//! Our client for a Stripe-like payment gateway.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
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

/// A charge the gateway made, and that succeeded.
#[derive(Debug, Clone)]
pub struct Charge {
    pub id: String,
}

/// A charge as the gateway describes it, in a charge's answer or a look-up.
#[derive(Debug, Deserialize)]
struct ChargeObject {
    id: String,
    /// What the charge was made with: a look-up's charge is ours only if all three are.
    idempotency_key: Option<String>,
    amount: Option<i64>,
    currency: Option<String>,
    /// `succeeded`, `failed` (declined) or `pending`. Absent in the shortest answers, where the
    /// 200 itself says it succeeded.
    status: Option<String>,
    failure_code: Option<String>,
    failure_message: Option<String>,
}

/// What a payment records of a gateway's answer, and how long each may be (the `payments`
/// columns' limits). Longer text is cut and control characters dropped, so that a definitive
/// answer is always recorded; a charge id is never cut (it would name another charge).
const MAX_CHARGE_ID_CHARS: usize = 255;
const MAX_CODE_CHARS: usize = 100;
const MAX_MESSAGE_CHARS: usize = 500;

impl ChargeObject {
    /// What the charge means for the payment: a success it can record, a decline, or (pending,
    /// unknown, or an id it cannot store) an outcome not known yet.
    fn outcome(self) -> Result<Charge, GatewayError> {
        let length = self.id.chars().count();
        if !(1..=MAX_CHARGE_ID_CHARS).contains(&length) || self.id.chars().any(char::is_control) {
            // Money may have moved: indeterminate, never a failure. A key that keeps getting this
            // ends on the operator's list.
            return Err(GatewayError::Unavailable(format!(
                "a charge id the payment cannot record ({length} characters)"
            )));
        }
        match self.status.as_deref() {
            None | Some("succeeded") => Ok(Charge { id: self.id }),
            Some("failed") => {
                let detail = ErrorDetail { kind: None, code: self.failure_code, message: self.failure_message };
                Err(GatewayError::Declined {
                    code: detail.code("card_declined"),
                    message: detail.message(|| "The card was declined.".into()),
                })
            }
            Some(status) => Err(GatewayError::Unavailable(format!("the charge is {status}"))),
        }
    }
}

/// Why a charge was not made, or may not have been.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The card was declined: definitive, nothing was charged.
    #[error("card declined ({code}): {message}")]
    Declined { code: String, message: String },
    /// The gateway knows no payment method by this `source`: definitive, nothing was charged, and
    /// the client's to fix.
    #[error("unknown source: {message}")]
    UnknownSource { message: String },
    /// The gateway refused the request for another reason (a 4xx): definitive, nothing charged.
    #[error("charge rejected with {status}: {message}")]
    Rejected { status: u16, message: String },
    /// No definitive answer: a connection error, a 5xx, a 408/409/425/429 (timed out, still
    /// processing this key, throttled), an idempotency conflict at the gateway, or a success we
    /// cannot read or record. The charge may or may not exist.
    #[error("gateway unavailable: {0}")]
    Unavailable(String),
    /// No answer in time. The charge may or may not exist.
    #[error("the gateway did not answer in time")]
    Timeout,
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
    data: Vec<ChargeObject>,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorDetail {
    #[serde(rename = "type")]
    kind: Option<String>,
    code: Option<String>,
    message: Option<String>,
}

impl ErrorDetail {
    fn code(&self, default: &str) -> String {
        clean(self.code.as_deref(), MAX_CODE_CHARS).unwrap_or_else(|| default.to_owned())
    }

    fn message(&self, default: impl FnOnce() -> String) -> String {
        clean(self.message.as_deref(), MAX_MESSAGE_CHARS).unwrap_or_else(default)
    }
}

/// Text from the gateway, without control characters, cut to `max_chars`; none if nothing is left.
fn clean(text: Option<&str>, max_chars: usize) -> Option<String> {
    let cleaned: String = text?.chars().filter(|c| !c.is_control()).take(max_chars).collect();
    Some(cleaned.trim().to_owned()).filter(|text| !text.is_empty())
}

/// A client for one gateway. Cheap to clone; clones share one connection pool, so calls reuse
/// keep-alive connections instead of opening one per charge.
#[derive(Debug, Clone)]
pub struct GatewayClient {
    http: reqwest::Client,
    base_url: Url,
    account_url: Url,
    charges_url: Url,
    /// The gateway's identity, once asked (see [`GatewayClient::id`]).
    id: Arc<Mutex<Option<Arc<str>>>>,
}

/// The answer to `GET /v1/account`.
#[derive(Debug, Deserialize)]
struct AccountObject {
    id: String,
}

impl GatewayClient {
    /// A client for the gateway at `base_url`, giving up on any call after `timeout`.
    pub fn new(base_url: &Url, timeout: Duration) -> anyhow::Result<GatewayClient> {
        // Never follow a redirect: reqwest would turn a POST into a GET without its body, and a
        // 3xx is then an answer we cannot read (indeterminate) rather than a charge made elsewhere.
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(GatewayClient {
            http,
            base_url: base_url.clone(),
            account_url: base_url.join("v1/account")?,
            charges_url: base_url.join("v1/charges")?,
            id: Arc::default(),
        })
    }

    /// Which gateway this is, as the gateway itself says (`GET /v1/account`: the account our
    /// credentials are of, or for the mock, the instance, new each time it starts); for a gateway
    /// that has no such endpoint (404), its base URL in canonical form. A payment records it when
    /// it starts, and only a client of the same gateway may look its charge up or charge it:
    /// another gateway would find nothing and charge a second time. Asked once, then remembered;
    /// see [`GatewayClient::fresh_id`].
    pub async fn id(&self) -> Result<Arc<str>, GatewayError> {
        let known = self.id.lock().unwrap_or_else(PoisonError::into_inner).clone();
        match known {
            Some(id) => Ok(id),
            None => self.fresh_id().await,
        }
    }

    /// The gateway's identity, asked now: before a resumed payment's look-up, so that a gateway
    /// replaced at the same address since (a mock restarted with an empty memory) is not asked
    /// about a charge it never saw.
    #[tracing::instrument(name = "gateway.account", skip_all)]
    pub async fn fresh_id(&self) -> Result<Arc<str>, GatewayError> {
        let response = self.http.get(self.account_url.clone()).send().await.map_err(from_transport)?;
        let status = response.status();
        let body = response.bytes().await.map_err(from_transport)?;
        let id: Arc<str> = match status.as_u16() {
            200 => {
                let account: AccountObject = serde_json::from_slice(&body)
                    .map_err(|e| GatewayError::Unavailable(format!("unreadable account: {e}")))?;
                let length = account.id.chars().count();
                if !(1..=MAX_CHARGE_ID_CHARS).contains(&length) || account.id.chars().any(char::is_control) {
                    return Err(GatewayError::Unavailable(format!("an account id we cannot record ({length} chars)")));
                }
                account.id.into()
            }
            404 => self.base_url.as_str().into(),
            _ => return Err(GatewayError::Unavailable(format!("the account look-up answered {status}"))),
        };
        *self.id.lock().unwrap_or_else(PoisonError::into_inner) = Some(id.clone());
        Ok(id)
    }

    /// The charge made under `idempotency_key` for `expected`, if any, classified like a charge's
    /// own answer (a failed charge is a decline). Charges keep the key they were made with, so
    /// this finds one even after the gateway has forgotten the key itself (and would charge again
    /// if asked to).
    ///
    /// Only a charge that carries our key, amount and currency is ours; a success among them wins
    /// over a failure. An answer that is not a list, or a list with charges but none of them ours,
    /// is indeterminate: never adopted, and never taken for "nothing was charged".
    #[tracing::instrument(name = "gateway.find_charge", skip_all)]
    pub async fn find_charge(
        &self,
        idempotency_key: &str,
        expected: &ChargeRequest<'_>,
    ) -> Result<Option<Charge>, GatewayError> {
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
        if list.data.is_empty() {
            return Ok(None);
        }
        let found = list.data.len();
        let ours = |charge: &ChargeObject| {
            charge.idempotency_key.as_deref() == Some(idempotency_key)
                && charge.amount == Some(expected.amount)
                && charge.currency.as_deref().is_some_and(|c| c.eq_ignore_ascii_case(expected.currency))
        };
        let outcomes: Vec<_> = list.data.into_iter().filter(ours).map(ChargeObject::outcome).collect();
        if outcomes.len() != found {
            tracing::error!(found, ours = outcomes.len(), "the look-up by key found charges that are not ours");
        }
        // A success wins; then anything not known yet (a pending charge may still succeed); a
        // decline only when every charge of ours failed.
        let rank = |outcome: &Result<Charge, GatewayError>| match outcome {
            Ok(_) => 0,
            Err(GatewayError::Declined { .. }) => 2,
            Err(_) => 1,
        };
        match outcomes.into_iter().min_by_key(rank) {
            Some(outcome) => outcome.map(Some),
            None => Err(GatewayError::Unavailable(format!(
                "the look-up by key found {found} charge(s), none with our key, amount and currency"
            ))),
        }
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
            200..=299 => serde_json::from_slice::<ChargeObject>(&body)
                .map_err(|e| GatewayError::Unavailable(format!("unreadable charge in a {status} answer: {e}")))?
                .outcome(),
            402 => {
                let error = error();
                let message = error.message(|| "The card was declined.".into());
                Err(GatewayError::Declined { code: error.code("card_declined"), message })
            }
            // Still processing this key, timed out, or throttling us: the outcome is not known.
            408 | 409 | 425 | 429 => Err(GatewayError::Unavailable(format!("the gateway answered {status}"))),
            400..=499 => {
                let error = error();
                let message = error.message(|| format!("the gateway answered {status}"));
                match (error.kind.as_deref(), error.code.as_deref()) {
                    // The gateway holds another request under this key: an earlier attempt of ours
                    // may have charged. Never "nothing was charged".
                    (Some("idempotency_error"), _) => Err(GatewayError::Unavailable(format!(
                        "the gateway reports an idempotency conflict for this key: {message}"
                    ))),
                    // The one resource a charge request names is its source (Stripe's answer to
                    // an unknown token).
                    (_, Some("resource_missing")) => Err(GatewayError::UnknownSource { message }),
                    _ => Err(GatewayError::Rejected { status, message }),
                }
            }
            _ => Err(GatewayError::Unavailable(format!("the gateway answered {status}"))),
        }
    }
}

fn from_transport(error: reqwest::Error) -> GatewayError {
    if error.is_timeout() { GatewayError::Timeout } else { GatewayError::Unavailable(error.to_string()) }
}
