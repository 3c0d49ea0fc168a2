//! An endpoint whose `POST`s run under idempotency keys, as the service knows it: what the layer
//! needs of it ([`Endpoint`]), how its request is read and validated, and its phases. An endpoint
//! implements [`Keyed`] in its own module and is listed once, in [`crate::endpoints`]; the router,
//! the completer, the metrics and the operator's commands all read that list.

use std::future::Future;
use std::pin::Pin;

use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::faults::Fault;
use crate::fields::ValidationError;
use crate::idempotency::{
    Abandoned, Canonical, DriveError, Endpoint, KeyedRequest, Phases, Reply, Run, StoredResponse,
};
use crate::request_id::RequestId;
use crate::state::AppState;

/// An endpoint whose requests are made safe to retry by keys.
pub trait Keyed: 'static {
    /// Its method, path, metric label, recovery points and table.
    const ENDPOINT: &'static Endpoint;
    /// The resource its path names by id, which the request acts on (a capture's payment), or `()`
    /// for a path that names none.
    type On: 'static;
    /// Its JSON body.
    type Body: DeserializeOwned + 'static;
    /// The request as validated: what the key's fingerprint is of, stored on the key so that a
    /// worker can drive it without its client.
    type Request: Canonical + DeserializeOwned + Send + 'static;

    /// The request, or the rule `body` breaks; `on` is the id the path names, if it names one.
    fn validate(body: Self::Body, on: Option<Uuid>) -> Result<Self::Request, ValidationError>;

    /// The phases of one request, from its key's recovery point to `finished`.
    fn phases(state: &AppState, request: Self::Request, fault: Option<Fault>) -> impl Phases + '_;

    /// Answers a client's request through [`Keyed::phases`] (see [`KeyedRequest::answer`]), in a
    /// span of the endpoint's own.
    fn answer<'a>(
        state: &'a AppState,
        create: KeyedRequest<Self::Request>,
        fault: Option<Fault>,
        request_id: &'a RequestId,
    ) -> impl Future<Output = Result<Reply, DriveError>> + Send + 'a;
}

/// A future of the completer's, boxed: the registry holds one function per endpoint.
pub type Completion<'a> = Pin<Box<dyn Future<Output = Result<StoredResponse, DriveError>> + Send + 'a>>;

/// Finishes a request of `E` that a worker took over from its vanished client: the request stored
/// on the key, driven through `E`'s phases from where the key stands. The same for every endpoint.
pub fn complete<'a, E: Keyed>(state: &'a AppState, abandoned: Abandoned, run: &'a RequestId) -> Completion<'a> {
    let span = tracing::info_span!(
        "keys.complete",
        endpoint = E::ENDPOINT.label,
        idempotency_key.id = %abandoned.lock.key_id,
        attempt = abandoned.attempts,
        payment.id = tracing::field::Empty,
        refund.id = tracing::field::Empty,
    );
    Box::pin(tracing::Instrument::instrument(
        async move {
            let (run, request) = Run::of_abandoned::<E::Request>(state.keys(), abandoned, run).await?;
            run.drive(E::phases(state, request, None), None).await
        },
        span,
    ))
}

/// An endpoint as the registry lists it: the layer's [`Endpoint`], and the functions that serve
/// its requests, made for it by [`Registered::of`].
pub struct Registered {
    pub endpoint: &'static Endpoint,
    /// The route that answers a client's request (the HTTP layer's, for `E`).
    pub route: fn() -> actix_web::Route,
    /// How a worker finishes a request its client abandoned.
    pub complete: for<'a> fn(&'a AppState, Abandoned, &'a RequestId) -> Completion<'a>,
}

impl Registered {
    /// The entry of `E`, answered over HTTP by `route`.
    pub const fn of<E: Keyed>(route: fn() -> actix_web::Route) -> Registered {
        Registered { endpoint: E::ENDPOINT, route, complete: complete::<E> }
    }
}
