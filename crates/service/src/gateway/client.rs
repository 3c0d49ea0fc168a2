//! Our client for a Stripe-like payment gateway.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::answers::{
    change_outcome, charge_look_up, charge_outcome, charge_read, recordable, refund_look_up, refund_outcome,
    refund_read,
};
use super::authorization::{Authorization, CancelRequest, CaptureRequest, Changed};
use super::charge::{Charge, ChargeRequest, GatewayError, WrongGateway};
use super::refund::{Refund, RefundRequest, RefundStatus};
use crate::metrics::{GatewayOperation, GatewayOutcome, Metrics};
use crate::runtime::ProcessRuntime;
use reqwest::{RequestBuilder, Url};
use tracing::Instrument;

use payments_wire::IDENTITY_HEADER;

/// The idempotency key of the look-up that asks who answers (see [`GatewayClient::identify`]): no
/// downstream key of ours looks like it, so it finds nothing.
const NOBODYS_KEY: &str = "payments:who-answers";

/// The longest gateway identity a payment can record (the `payments.gateway` column's limit).
const MAX_IDENTITY_CHARS: usize = 500;

/// A gateway's answer, and who gave it, as far as the answer says.
#[derive(Debug)]
pub struct Answered<T> {
    /// The gateway the answer names in [`IDENTITY_HEADER`], if it names one: only such an answer
    /// may teach the process, or a payment, which gateway is behind the address.
    pub named: Option<Arc<str>>,
    /// The address's own identity (its base URL): see [`Answered::is_from`].
    address: Arc<str>,
    pub answer: T,
}

impl<T> Answered<T> {
    /// Whether the answer speaks for `recorded`, the gateway a payment or a refund records: an
    /// answer that names a gateway speaks for that one only; one that names none may come from a
    /// proxy or a load balancer in front of the gateway (its own `404`, `429` or `502`) as well as
    /// from a gateway that never names itself, so it speaks only for the address's identity, what
    /// a payment records when no answer at the address named a gateway.
    pub fn is_from(&self, recorded: &str) -> bool {
        match &self.named {
            Some(named) => **named == *recorded,
            None => recorded == &*self.address,
        }
    }

    /// The answer, if the `recorded` gateway gave it: a charge is changed or refunded, and looked
    /// up, only where it is, and another gateway's answer (even "nothing found") says nothing of it.
    pub fn ours(self, recorded: &str) -> Result<T, WrongGateway> {
        match self.is_from(recorded) {
            true => Ok(self.answer),
            false => Err(WrongGateway::new(recorded, self.by(), self.named.is_some())),
        }
    }

    /// Who gave the answer, for messages: the gateway it names, or the address.
    pub fn by(&self) -> &str {
        self.named.as_deref().unwrap_or(&self.address)
    }

    /// The gateway to record as holding what a definitive answer says: the one it names; if it
    /// names none, the one `recorded` (such an answer teaches nothing), or the address's for a
    /// record with none.
    pub fn holder(&self, recorded: Option<&str>) -> Arc<str> {
        match (&self.named, recorded) {
            (Some(named), _) => named.clone(),
            (None, Some(recorded)) => recorded.into(),
            (None, None) => self.address.clone(),
        }
    }

    /// The same speaker, with another answer.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Answered<U> {
        Answered { named: self.named, address: self.address, answer: f(self.answer) }
    }
}

impl<T> Answered<Option<T>> {
    /// The answer, if it found something.
    pub fn found(self) -> Option<Answered<T>> {
        let Answered { named, address, answer } = self;
        answer.map(|answer| Answered { named, address, answer })
    }
}

/// A client for the gateway at one address. Cheap to clone; clones share one connection pool, so
/// calls reuse keep-alive connections instead of opening one per charge.
///
/// **Which gateway answered** is one rule, applied to every answer the client reads: the identity
/// the answer names in [`IDENTITY_HEADER`], if it names one, and nobody known if it names none
/// (see [`Answered::is_from`]). Only a named answer teaches the process who is behind the address.
/// A named identity is checked before anything is built on it: one that a payment could not
/// record (too long, empty, not visible ASCII) makes the answer unreadable, so indeterminate. The
/// address may lead to another gateway tomorrow (a mock restarted with an empty memory, a proxy
/// pointed elsewhere): every answer comes back with what it says of who gave it ([`Answered`]),
/// and the payment's driver decides what that answer may settle.
#[derive(Debug, Clone)]
pub struct GatewayClient {
    http: reqwest::Client,
    account_url: Url,
    charges_url: Url,
    refunds_url: Url,
    /// The base URL without credentials, query or fragment: the address's identity, which a
    /// payment records when no gateway there has named itself yet (see [`Answered::is_from`]).
    url_identity: Arc<str>,
    /// The identity the last named answer gave (see [`GatewayClient::id`]).
    id: Arc<Mutex<Option<Arc<str>>>>,
    /// Where its calls are counted, once the client belongs to an application.
    metrics: Option<Arc<Metrics>>,
    /// The runtime it was made on (the process's own), where every call runs: see
    /// [`GatewayClient::send`].
    runtime: ProcessRuntime,
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
            refunds_url: base_url.join("v1/refunds")?,
            url_identity: identity.as_str().into(),
            id: Arc::default(),
            metrics: None,
            runtime: ProcessRuntime::current(),
        })
    }

    /// The same client, counting its calls (but the identity look-up) in `metrics`.
    pub fn observed_by(self, metrics: Arc<Metrics>) -> GatewayClient {
        GatewayClient { metrics: Some(metrics), ..self }
    }

    /// Which gateway answers at this address, as far as this process knows: the identity the last
    /// named answer gave. A new payment records it when it starts, before it is charged; the
    /// charge's answer then says who really answered (see [`Answered`]). While no answer has named
    /// a gateway, the gateway is asked (see [`GatewayClient::identify`]), and if no answer names
    /// one, the address's own identity is the answer, learned by nobody: the next payment asks
    /// again.
    pub async fn id(&self) -> Result<Arc<str>, GatewayError> {
        match self.known_id() {
            Some(id) => Ok(id),
            None => self.identify().await,
        }
    }

    /// Which gateway answers at this address as far as this process knows without asking: the
    /// identity the last named answer gave, or none before the first.
    pub fn known_id(&self) -> Option<Arc<str>> {
        self.id.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Asks who answers at this address now: `GET /v1/account`, and, if that answer names no
    /// gateway (a proxy that passes only charges and refunds on answers it with a `404` of its
    /// own), a look-up of charges by a key nobody uses, which every gateway we can reconcile with
    /// serves. Their bodies are not used. A gateway that names itself on neither is taken for one
    /// that never does: the address's identity.
    #[tracing::instrument(name = "gateway.identify", skip_all)]
    async fn identify(&self) -> Result<Arc<str>, GatewayError> {
        for question in [self.account_url.clone(), with_key(&self.charges_url, NOBODYS_KEY)] {
            if let Some(named) = self.send(self.http.get(question)).await?.named {
                return Ok(named);
            }
        }
        Ok(self.url_identity.clone())
    }

    /// What the gateway answering at this address holds under `idempotency_key` for `request`:
    /// the charge's outcome (see [`charge_look_up`] for what counts), or none. Charges keep the
    /// key they were made with, so this finds one even after the gateway has forgotten the key
    /// itself (and would charge again if asked to). An error means no readable answer.
    #[tracing::instrument(name = "gateway.find_charge", skip_all, fields(gateway.status))]
    pub async fn find_charge(
        &self,
        idempotency_key: &str,
        request: &ChargeRequest<'_>,
    ) -> Result<Answered<Option<Result<Charge, GatewayError>>>, GatewayError> {
        let get = self.http.get(with_key(&self.charges_url, idempotency_key));
        let found = self.read(get, |status, body| charge_look_up(status, body, idempotency_key, request));
        self.counted(GatewayOperation::Lookup, found).await
    }

    /// Asks the gateway answering at this address to charge, under `idempotency_key` (see
    /// [`downstream_key`]). The outer error means no readable answer (a timeout, a connection
    /// error, an identity we cannot record); the inner result is what the answer says.
    ///
    /// [`downstream_key`]: super::downstream_key
    #[tracing::instrument(name = "gateway.charge", skip_all, fields(gateway.status))]
    pub async fn charge(
        &self,
        idempotency_key: &str,
        request: &ChargeRequest<'_>,
    ) -> Result<Answered<Result<Charge, GatewayError>>, GatewayError> {
        let post = self.http.post(self.charges_url.clone()).header("Idempotency-Key", idempotency_key).json(request);
        let charged = self.read(post, |status, body| Ok(charge_outcome(status, body, request)));
        self.counted(GatewayOperation::Charge, charged).await
    }

    /// Asks the gateway answering at this address to refund, under `idempotency_key` (see
    /// [`downstream_key`]; a key of its own, never a charge's). The outer error means no readable
    /// answer; the inner result is what the answer says: the refund (which may be
    /// [`Pending`](RefundStatus::Pending)), a definitive refusal ([`GatewayError::Rejected`]:
    /// nothing was refunded), or an unknown outcome ([`GatewayError::Unavailable`],
    /// [`GatewayError::Timeout`]), which never means "not refunded".
    ///
    /// [`downstream_key`]: super::downstream_key
    #[tracing::instrument(name = "gateway.refund", skip_all, fields(gateway.status))]
    pub async fn refund(
        &self,
        idempotency_key: &str,
        request: &RefundRequest<'_>,
    ) -> Result<Answered<Result<Refund, GatewayError>>, GatewayError> {
        let post = self.http.post(self.refunds_url.clone()).header("Idempotency-Key", idempotency_key).json(request);
        let refunded = self.read(post, |status, body| Ok(refund_outcome(status, body)));
        self.counted(GatewayOperation::Refund, refunded).await
    }

    /// What the gateway answering at this address holds under `idempotency_key` for `request`:
    /// the refund as it stands now (made under our key, of our charge and amount; see
    /// [`refund_look_up`] for which stands among several), or none: nothing was refunded under
    /// the key. Refunds keep their key, so this holds after the gateway has forgotten the key. An
    /// inner error means a refund of ours that does not say where it stands (not known); the
    /// outer error, no readable answer.
    #[tracing::instrument(name = "gateway.find_refund", skip_all, fields(gateway.status))]
    pub async fn find_refund(
        &self,
        idempotency_key: &str,
        request: &RefundRequest<'_>,
    ) -> Result<Answered<Option<Result<Refund, GatewayError>>>, GatewayError> {
        let get = self.http.get(with_key(&self.refunds_url, idempotency_key));
        let found = self.read(get, |status, body| refund_look_up(status, body, idempotency_key, request));
        self.counted(GatewayOperation::RefundLookup, found).await
    }

    /// The refund `id` as it stands now at the gateway answering at this address (to learn
    /// whether a pending one has settled), or none if that gateway says it has no such refund
    /// (which, from the gateway that made it, says something is badly wrong; from another, only
    /// that it is another). The error means no readable answer.
    #[tracing::instrument(name = "gateway.get_refund", skip_all, fields(gateway.status))]
    pub async fn get_refund(&self, id: &str) -> Result<Answered<Option<Refund>>, GatewayError> {
        let mut url = self.refunds_url.clone();
        // The URL was joined onto in `new`, so it has a path to add to.
        url.path_segments_mut().expect("an http(s) URL has path segments").push(id);
        let read = self.read(self.http.get(url), |status, body| refund_read(status, body, id));
        self.counted(GatewayOperation::RefundRead, read).await
    }

    /// Asks the gateway answering at this address to capture `amount` of the authorized charge
    /// `charge_id`, under `idempotency_key` (a key of its own). The outer error means no readable
    /// answer; the inner result is what the answer says (see [`change_outcome`]).
    #[tracing::instrument(name = "gateway.capture", skip_all, fields(gateway.status))]
    pub async fn capture(
        &self,
        idempotency_key: &str,
        charge_id: &str,
        request: &CaptureRequest,
    ) -> Result<Answered<Result<Changed, GatewayError>>, GatewayError> {
        let post =
            self.http.post(self.charge_url(charge_id, Some("capture"))).header("Idempotency-Key", idempotency_key);
        let captured = self.read(post.json(request), |status, body| Ok(change_outcome(status, body)));
        self.counted(GatewayOperation::Capture, captured).await
    }

    /// Asks the gateway answering at this address to cancel the authorized charge `charge_id`,
    /// under `idempotency_key`, as [`GatewayClient::capture`] does.
    #[tracing::instrument(name = "gateway.cancel", skip_all, fields(gateway.status))]
    pub async fn cancel(
        &self,
        idempotency_key: &str,
        charge_id: &str,
    ) -> Result<Answered<Result<Changed, GatewayError>>, GatewayError> {
        let post =
            self.http.post(self.charge_url(charge_id, Some("cancel"))).header("Idempotency-Key", idempotency_key);
        let canceled = self.read(post.json(&CancelRequest {}), |status, body| Ok(change_outcome(status, body)));
        self.counted(GatewayOperation::Cancel, canceled).await
    }

    /// The charge `id` as it stands now at the gateway answering at this address, as an
    /// authorization (to learn what a capture or cancel whose answer was lost did), or none if
    /// that gateway has no such charge. The error means no readable answer.
    #[tracing::instrument(name = "gateway.get_charge", skip_all, fields(gateway.status))]
    pub async fn get_charge(&self, id: &str) -> Result<Answered<Option<Authorization>>, GatewayError> {
        let read = self.read(self.http.get(self.charge_url(id, None)), |status, body| charge_read(status, body, id));
        self.counted(GatewayOperation::ChargeRead, read).await
    }

    /// `/v1/charges/{id}`, and what follows it (`capture`, `cancel`).
    fn charge_url(&self, id: &str, then: Option<&str>) -> Url {
        let mut url = self.charges_url.clone();
        // The URL was joined onto in `new`, so it has a path to add to.
        url.path_segments_mut().expect("an http(s) URL has path segments").push(id).extend(then);
        url
    }

    /// Counts a call as `operation`, by what its answer says, and how long it took.
    async fn counted<T: Counted>(
        &self,
        operation: GatewayOperation,
        call: impl Future<Output = Result<Answered<T>, GatewayError>>,
    ) -> Result<Answered<T>, GatewayError> {
        let started = Instant::now();
        let answered = call.await;
        if let Some(metrics) = &self.metrics {
            let outcome = match &answered {
                Ok(answered) => answered.answer.outcome(),
                Err(error) => error.outcome(),
            };
            metrics.gateway_call(operation, outcome, started.elapsed());
        }
        answered
    }

    /// Sends a request and reads its answer with `interpret`, whose error, like the sending's,
    /// means no readable answer.
    async fn read<T>(
        &self,
        request: RequestBuilder,
        interpret: impl FnOnce(u16, &[u8]) -> Result<T, GatewayError>,
    ) -> Result<Answered<T>, GatewayError> {
        let answered = self.send(request).await?;
        let (status, body) = &answered.answer;
        tracing::Span::current().record("gateway.status", status);
        let answer = interpret(*status, body)?;
        Ok(answered.map(|_| answer))
    }

    /// Sends a request, and returns the answer's status and body with what it says of who gave
    /// it; a gateway it names is the one this process takes for the gateway at this address from
    /// now on.
    ///
    /// The call runs on the runtime the client was made on, not on the caller's, so that the
    /// connection it may open outlives an HTTP worker that stops (see `crate::runtime`).
    async fn send(&self, request: RequestBuilder) -> Result<Answered<(u16, bytes::Bytes)>, GatewayError> {
        let client = self.clone();
        let call = async move {
            let response = request.send().await.map_err(from_transport)?;
            let named = client.identity_of(&response)?;
            if let Some(named) = &named {
                client.remember(named.clone());
            }
            let status = response.status().as_u16();
            let answer = (status, response.bytes().await.map_err(from_transport)?);
            Ok(Answered { named, address: client.url_identity.clone(), answer })
        };
        self.runtime
            .run(call.in_current_span())
            .await
            .map_err(|error| GatewayError::Unavailable(format!("the gateway call was cut off: {error}")))?
    }

    /// The gateway an answer names in [`IDENTITY_HEADER`], checked to be something a payment can
    /// record; none if it names none. An answer of any status that names none (a proxy's or a
    /// load balancer's own `404`, `429` or `502` in front of a gateway that names itself, as often
    /// as a gateway that never does) teaches nothing: taken for the URL's and remembered, one such
    /// answer moved payments to a "gateway" that holds nothing, where no look-up could settle them.
    fn identity_of(&self, response: &reqwest::Response) -> Result<Option<Arc<str>>, GatewayError> {
        let Some(named) = response.headers().get(IDENTITY_HEADER) else {
            return Ok(None);
        };
        match named.to_str() {
            Ok(named) if recordable_identity(named) => Ok(Some(named.into())),
            _ => Err(GatewayError::Unavailable(format!(
                "an answer names a gateway identity that cannot be recorded ({} bytes)",
                named.len()
            ))),
        }
    }

    fn remember(&self, id: Arc<str>) {
        *self.id.lock().unwrap_or_else(PoisonError::into_inner) = Some(id);
    }
}

/// Whether `identity` is one a gateway may name itself by, and a payment record: what an answer's
/// [`IDENTITY_HEADER`] is held to, and an operator's correction too.
pub fn recordable_identity(identity: &str) -> bool {
    recordable(identity) && identity.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
}

/// `url` asked for what was made under `idempotency_key`.
fn with_key(url: &Url, idempotency_key: &str) -> Url {
    let mut url = url.clone();
    url.query_pairs_mut().append_pair("idempotency_key", idempotency_key);
    url
}

/// What an answer counts as in the metrics.
trait Counted {
    fn outcome(&self) -> GatewayOutcome;
}

impl Counted for GatewayError {
    fn outcome(&self) -> GatewayOutcome {
        match self {
            GatewayError::Declined { .. } | GatewayError::UnknownSource { .. } => GatewayOutcome::Declined,
            GatewayError::Rejected { .. } => GatewayOutcome::Rejected,
            GatewayError::Unavailable(_) | GatewayError::Timeout => GatewayOutcome::Indeterminate,
        }
    }
}

impl Counted for Charge {
    fn outcome(&self) -> GatewayOutcome {
        GatewayOutcome::Succeeded
    }
}

impl Counted for Changed {
    fn outcome(&self) -> GatewayOutcome {
        match self {
            Changed::Now(authorization) => authorization.outcome(),
            Changed::Before => GatewayOutcome::Rejected,
        }
    }
}

impl Counted for Authorization {
    fn outcome(&self) -> GatewayOutcome {
        match self {
            Authorization::Open => GatewayOutcome::Pending,
            Authorization::Captured { .. } | Authorization::Canceled => GatewayOutcome::Succeeded,
            Authorization::Failed => GatewayOutcome::Failed,
        }
    }
}

impl Counted for Refund {
    fn outcome(&self) -> GatewayOutcome {
        match self.status {
            RefundStatus::Pending => GatewayOutcome::Pending,
            RefundStatus::Succeeded => GatewayOutcome::Succeeded,
            RefundStatus::Failed { .. } => GatewayOutcome::Failed,
        }
    }
}

impl<T: Counted> Counted for Result<T, GatewayError> {
    fn outcome(&self) -> GatewayOutcome {
        match self {
            Ok(made) => made.outcome(),
            Err(error) => error.outcome(),
        }
    }
}

/// A look-up that found nothing.
impl<T: Counted> Counted for Option<T> {
    fn outcome(&self) -> GatewayOutcome {
        self.as_ref().map_or(GatewayOutcome::NotFound, T::outcome)
    }
}

fn from_transport(error: reqwest::Error) -> GatewayError {
    if error.is_timeout() { GatewayError::Timeout } else { GatewayError::Unavailable(error.to_string()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADDRESS: &str = "http://gateway.internal/";

    fn answered(named: Option<&str>) -> Answered<()> {
        Answered { named: named.map(Arc::from), address: ADDRESS.into(), answer: () }
    }

    #[test]
    fn an_answer_speaks_for_the_gateway_it_names_only_and_one_that_names_none_for_the_address_only() {
        let (named, unnamed) = (answered(Some("acct_a")), answered(None));
        assert!(named.is_from("acct_a"));
        assert!(!named.is_from("acct_b"), "another gateway");
        assert!(!unnamed.is_from("acct_a"), "a proxy's own answer says nothing of the gateway behind it");
        // A payment recorded before any gateway at the address named itself.
        assert!(unnamed.is_from(ADDRESS), "a payment recorded when nothing at the address named itself");
        assert!(!named.is_from(ADDRESS), "a gateway that names itself is not one that never did");
    }

    #[test]
    fn only_a_named_answer_changes_what_is_recorded() {
        assert_eq!(&*answered(Some("acct_a")).holder(Some("acct_b")), "acct_a");
        assert_eq!(&*answered(None).holder(Some("acct_b")), "acct_b");
        assert_eq!(&*answered(None).holder(None), ADDRESS);
    }
}
