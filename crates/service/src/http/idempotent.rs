//! What every idempotent `POST` shares (`/v1/payments`, `/v1/refunds`, every endpoint the registry
//! lists, see [`crate::endpoints`]): one handler reads and validates the request, which, as its key
//! judges it, is answered from this process's memory if its key is a finished one held there, and
//! otherwise driven through its endpoint's phases in a task of its own.

use std::future::Future;
use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{FromRequest, HttpResponse, Route, web};
use tracing::Instrument;

use super::error::ApiError;
use super::extract::{Authenticated, FaultRequest, IdempotencyKeyHeader, JsonBody, ResourceId};
use crate::idempotency::{Canonical, DriveError, KeyedRequest, Reply, StoredResponse};
use crate::keyed::{self, Keyed};
use crate::problem::PROBLEM_JSON;
use crate::request_id::RequestId;
use crate::state::AppState;

/// The header that marks a stored answer replayed for a retry, `Idempotent-Replayed: true` (as
/// Stripe sends it), made once instead of parsed again for every replay.
const REPLAYED: (HeaderName, HeaderValue) =
    (HeaderName::from_static("idempotent-replayed"), HeaderValue::from_static("true"));

/// The route of the keyed endpoint `E`: a `POST`, answered by [`create`].
pub fn route<E: Keyed>() -> Route
where
    ResourceId<E::On>: FromRequest<Error = ApiError>,
{
    web::post().to(create::<E>)
}

/// What a `POST` to the keyed endpoint `E` carries, extracted in this order: the path's resource,
/// the key, the fault asked for and the body.
type Posted<E> = (ResourceId<<E as Keyed>::On>, IdempotencyKeyHeader, FaultRequest, JsonBody<<E as Keyed>::Body>);

/// A `POST` to the keyed endpoint `E`: extracted, validated, answered.
async fn create<E: Keyed>(
    state: web::Data<AppState>,
    request_id: RequestId,
    Authenticated(account, (on, key, fault, body)): Authenticated<Posted<E>>,
) -> Result<HttpResponse, ApiError>
where
    ResourceId<E::On>: FromRequest<Error = ApiError>,
{
    let request = E::validate(body.0, on.0)?;
    E::admit(&state, &request)?;
    let request = KeyedRequest::new(account, key.0, E::ENDPOINT, request);
    answer(state, request, move |state, request| async move {
        keyed::answer::<E>(&state, request, fault.0, &request_id).await
    })
    .await
}

/// Answers `request`, by `drive` (the endpoint's driver) unless memory does.
async fn answer<R, F, Fut>(
    state: web::Data<AppState>,
    request: KeyedRequest<R>,
    drive: F,
) -> Result<HttpResponse, ApiError>
where
    R: Canonical,
    F: FnOnce(Arc<AppState>, KeyedRequest<R>) -> Fut,
    Fut: Future<Output = Result<Reply, DriveError>> + Send + 'static,
{
    // A finished key's answer held in memory is the whole answer: it needs no database and leaves
    // nothing half-done if the client hangs up, so it needs no task of its own either.
    if let Some(replayed) = request.answer_from_memory(state.keys()) {
        let replayed = replayed?;
        return Ok(stored_response(replayed.response, replayed.replayed));
    }
    // The protocol runs in a task of its own: a client that hangs up drops this handler, and must
    // not take a half-done request down with it (its key would stay locked until the lock went
    // stale). The task finishes the request either way, and a retry gets the stored answer. It
    // logs in the request's span.
    let driven = drive(state.into_inner(), request);
    let answered = tokio::spawn(driven.in_current_span()).await??;
    Ok(stored_response(answered.response, answered.replayed))
}

/// A stored answer, exactly as stored.
fn stored_response(response: StoredResponse, replayed: bool) -> HttpResponse {
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut builder = HttpResponse::build(status);
    builder.content_type(if status.is_success() { "application/json" } else { PROBLEM_JSON });
    if replayed {
        builder.insert_header(REPLAYED);
    }
    builder.body(response.body)
}
