//! An endpoint whose `POST`s run under idempotency keys, as the service knows it: what the layer
//! needs of it ([`Endpoint`]), how its request is read and validated, and its phases. An endpoint
//! implements [`Keyed`] in its own module and is listed once, in [`crate::endpoints`]; the router,
//! the completer, the metrics, a key's story and the operator's commands all read that list.

use std::future::Future;
use std::pin::Pin;

use chrono::{DateTime, Utc};
use diesel::QueryResult;
use diesel_async::AsyncPgConnection;
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

    /// The rules the request must keep that this process's settings make (not the database's
    /// rows): checked with [`Keyed::validate`]'s, before the key is claimed, so that a refusal
    /// stores nothing. None by default.
    fn admit(_state: &AppState, _request: &Self::Request) -> Result<(), ValidationError> {
        Ok(())
    }

    /// The phases of one request, from its key's recovery point to `finished`.
    fn phases(state: &AppState, request: Self::Request, fault: Option<Fault>) -> impl Phases + '_;

    /// What a key of this endpoint made, for the key's story: found by the key's row (`key_id`),
    /// or, once that is reaped, by the client's `key`; none if it made nothing (yet).
    fn made<'a>(
        conn: &'a mut AsyncPgConnection,
        account_id: Uuid,
        key_id: Option<Uuid>,
        key: &'a str,
    ) -> impl Future<Output = QueryResult<Option<Resource>>> + Send + 'a;
}

/// What a key made (a payment, a refund, a change of a payment), as its story shows it.
pub struct Resource {
    /// The key row it was made under: the story's id once that row is reaped (none for what was
    /// made before rows were named).
    pub key_id: Option<Uuid>,
    /// What the key's trail is about besides the key: a resource type and id each.
    pub resources: Vec<(&'static str, Uuid)>,
    /// The story's field that shows it (`payment`, `refund`), and what it shows.
    pub shown: (&'static str, serde_json::Value),
    /// When it was made.
    pub created_at: DateTime<Utc>,
}

/// Answers a client's request to `E` through its phases (see [`KeyedRequest::answer`]), in a span
/// that names the endpoint.
pub async fn answer<E: Keyed>(
    state: &AppState,
    create: KeyedRequest<E::Request>,
    fault: Option<Fault>,
    request_id: &RequestId,
) -> Result<Reply, DriveError> {
    let span = tracing::info_span!(
        "keys.answer",
        endpoint = E::ENDPOINT.label,
        account.id = %create.account_id,
        idempotency_key.id = tracing::field::Empty,
        payment.id = tracing::field::Empty,
        refund.id = tracing::field::Empty,
    );
    let answered = create.answer(state.keys(), request_id, |request| E::phases(state, request, fault));
    tracing::Instrument::instrument(answered, span).await
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

/// A look-up of what a key made, boxed: the registry holds one function per endpoint.
pub type Finding<'a> = Pin<Box<dyn Future<Output = QueryResult<Option<Resource>>> + Send + 'a>>;

/// What a key of `E` made (see [`Keyed::made`]), boxed as the registry holds it.
fn made<'a, E: Keyed>(
    conn: &'a mut AsyncPgConnection,
    account_id: Uuid,
    key_id: Option<Uuid>,
    key: &'a str,
) -> Finding<'a> {
    Box::pin(E::made(conn, account_id, key_id, key))
}

/// An endpoint as the registry lists it: the layer's [`Endpoint`], and the functions that serve
/// its requests, made for it by [`Registered::of`].
pub struct Registered {
    pub endpoint: &'static Endpoint,
    /// The route that answers a client's request (the HTTP layer's, for `E`).
    pub route: fn() -> actix_web::Route,
    /// How a worker finishes a request its client abandoned.
    pub complete: for<'a> fn(&'a AppState, Abandoned, &'a RequestId) -> Completion<'a>,
    /// What a key made, for its story.
    pub made: for<'a> fn(&'a mut AsyncPgConnection, Uuid, Option<Uuid>, &'a str) -> Finding<'a>,
}

impl Registered {
    /// The entry of `E`, answered over HTTP by `route`.
    pub const fn of<E: Keyed>(route: fn() -> actix_web::Route) -> Registered {
        Registered { endpoint: E::ENDPOINT, route, complete: complete::<E>, made: made::<E> }
    }

    /// The entry of `keyed` at `path`, if one is registered there.
    pub fn at(keyed: &'static [Registered], path: &str) -> Option<&'static Registered> {
        keyed.iter().find(|entry| entry.endpoint.path == path)
    }
}
