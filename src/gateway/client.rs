//! Our client for a Stripe-like payment gateway.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use reqwest::{RequestBuilder, Url};
use serde::Deserialize;

use super::answers::{charge_outcome, look_up_outcome, recordable};
use super::charge::{Charge, ChargeRequest, GatewayError};
use crate::metrics::{GatewayOperation, GatewayOutcome, Metrics};

/// The header in which a gateway that knows who it is names itself on every answer (the mock
/// does). An answer from another gateway than the one a payment is charged through is never
/// taken for that gateway's.
pub const IDENTITY_HEADER: &str = "Gateway-Account";

/// The longest gateway identity a payment can record (the `payments.gateway` column's limit).
const MAX_IDENTITY_CHARS: usize = 500;

/// The answer to `GET /v1/account`.
#[derive(Debug, Deserialize)]
struct AccountObject {
    id: String,
}

/// A client for one gateway. Cheap to clone; clones share one connection pool, so calls reuse
/// keep-alive connections instead of opening one per charge.
#[derive(Debug, Clone)]
pub struct GatewayClient {
    http: reqwest::Client,
    account_url: Url,
    charges_url: Url,
    /// The base URL without credentials, query or fragment: the identity of a gateway that does
    /// not name one itself.
    url_identity: Arc<str>,
    /// The gateway's identity as last learnt (see [`GatewayClient::id`]).
    id: Arc<Mutex<Option<Arc<str>>>>,
    /// Where look-ups and charges are counted, once the client belongs to an application.
    metrics: Option<Arc<Metrics>>,
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
        let mut identity = base_url.clone();
        let _ = identity.set_username("");
        let _ = identity.set_password(None);
        identity.set_query(None);
        identity.set_fragment(None);
        anyhow::ensure!(
            identity.as_str().chars().count() <= MAX_IDENTITY_CHARS,
            "the gateway's URL is longer than {MAX_IDENTITY_CHARS} characters"
        );
        Ok(GatewayClient {
            http,
            account_url: base_url.join("v1/account")?,
            charges_url: base_url.join("v1/charges")?,
            url_identity: identity.as_str().into(),
            id: Arc::default(),
            metrics: None,
        })
    }

    /// The same client, counting its look-ups and charges in `metrics`.
    pub fn observed_by(self, metrics: Arc<Metrics>) -> GatewayClient {
        GatewayClient { metrics: Some(metrics), ..self }
    }

    /// Which gateway this is, as the gateway itself says (`GET /v1/account`: the account our
    /// credentials are of; for the mock, the instance, new each time it starts since its memory
    /// is new too); for a gateway without that endpoint (404), its base URL. A payment records it
    /// when it starts, and only this gateway may be asked about that payment: another would find
    /// nothing and charge a second time. Asked once, then remembered, and learnt anew whenever
    /// another identity answers (see [`IDENTITY_HEADER`]) or [`GatewayClient::fresh_id`] asks.
    pub async fn id(&self) -> Result<Arc<str>, GatewayError> {
        let known = self.id.lock().unwrap_or_else(PoisonError::into_inner).clone();
        match known {
            Some(id) => Ok(id),
            None => self.fresh_id().await,
        }
    }

    /// The gateway's identity, asked now.
    #[tracing::instrument(name = "gateway.account", skip_all)]
    pub async fn fresh_id(&self) -> Result<Arc<str>, GatewayError> {
        let response = self.http.get(self.account_url.clone()).send().await.map_err(from_transport)?;
        let status = response.status();
        let body = response.bytes().await.map_err(from_transport)?;
        let id: Arc<str> = match status.as_u16() {
            200 => {
                let account: AccountObject = serde_json::from_slice(&body)
                    .map_err(|e| GatewayError::Unavailable(format!("unreadable account: {e}")))?;
                if !recordable(&account.id) {
                    return Err(GatewayError::Unavailable("an account id we cannot record".into()));
                }
                account.id.into()
            }
            404 => self.url_identity.clone(),
            _ => return Err(GatewayError::Unavailable(format!("the account look-up answered {status}"))),
        };
        self.remember(id.clone());
        Ok(id)
    }

    fn remember(&self, id: Arc<str>) {
        *self.id.lock().unwrap_or_else(PoisonError::into_inner) = Some(id);
    }

    /// The charge made under `idempotency_key` for `request` at the gateway `at`, if any (see
    /// [`look_up_outcome`] for what counts). Charges keep the key they were made with, so this
    /// finds one even after the gateway has forgotten the key itself (and would charge again if
    /// asked to).
    #[tracing::instrument(name = "gateway.find_charge", skip_all)]
    pub async fn find_charge(
        &self,
        at: &str,
        idempotency_key: &str,
        request: &ChargeRequest<'_>,
    ) -> Result<Option<Charge>, GatewayError> {
        let mut url = self.charges_url.clone();
        url.query_pairs_mut().append_pair("idempotency_key", idempotency_key);
        let started = Instant::now();
        let found = async {
            let (status, body) = self.send(at, self.http.get(url)).await?;
            look_up_outcome(status, &body, idempotency_key, request)
        }
        .await;
        let outcome = match &found {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(None),
            Err(error) => Err(Some(error)),
        };
        self.count(GatewayOperation::Lookup, outcome, started);
        found
    }

    /// Asks the gateway `at` to charge, under `idempotency_key` (see [`downstream_key`]).
    #[tracing::instrument(name = "gateway.charge", skip_all, fields(gateway.status))]
    pub async fn charge(
        &self,
        at: &str,
        idempotency_key: &str,
        request: &ChargeRequest<'_>,
    ) -> Result<Charge, GatewayError> {
        let post = self.http.post(self.charges_url.clone()).header("Idempotency-Key", idempotency_key).json(request);
        let started = Instant::now();
        let charged = async {
            let (status, body) = self.send(at, post).await?;
            tracing::Span::current().record("gateway.status", status);
            charge_outcome(status, &body)
        }
        .await;
        self.count(GatewayOperation::Charge, charged.as_ref().map(|_| ()).map_err(Some), started);
        charged
    }

    /// Counts a call that began at `started` and succeeded (`Ok`), found nothing (`Err(None)`), or
    /// failed.
    fn count(&self, operation: GatewayOperation, result: Result<(), Option<&GatewayError>>, started: Instant) {
        let Some(metrics) = &self.metrics else { return };
        let outcome = match result {
            Ok(()) => GatewayOutcome::Succeeded,
            Err(None) => GatewayOutcome::NotFound,
            Err(Some(GatewayError::Declined { .. } | GatewayError::UnknownSource { .. })) => GatewayOutcome::Declined,
            Err(Some(GatewayError::Rejected { .. })) => GatewayOutcome::Rejected,
            Err(Some(GatewayError::Unavailable(_) | GatewayError::Timeout | GatewayError::OtherGateway { .. })) => {
                GatewayOutcome::Indeterminate
            }
        };
        metrics.gateway_call(operation, outcome, started.elapsed());
    }

    /// Sends a request meant for the gateway `at`, and returns the answer's status and body, if it
    /// is that gateway's: an answer that names another identity is not read (and that identity is
    /// remembered as this gateway's from now on).
    async fn send(&self, at: &str, request: RequestBuilder) -> Result<(u16, bytes::Bytes), GatewayError> {
        let response = request.send().await.map_err(from_transport)?;
        let answered = response.headers().get(IDENTITY_HEADER).and_then(|value| value.to_str().ok());
        if let Some(answered) = answered.filter(|answered| *answered != at) {
            if recordable(answered) {
                self.remember(answered.into());
            }
            return Err(GatewayError::OtherGateway { answered: answered.to_owned() });
        }
        let status = response.status().as_u16();
        Ok((status, response.bytes().await.map_err(from_transport)?))
    }
}

fn from_transport(error: reqwest::Error) -> GatewayError {
    if error.is_timeout() { GatewayError::Timeout } else { GatewayError::Unavailable(error.to_string()) }
}
