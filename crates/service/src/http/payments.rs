//! The payments endpoints. Each handler extracts, calls one function, and shapes the answer.

use actix_web::http::StatusCode;
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{HttpResponse, web};
use serde::Deserialize;
use tracing::Instrument;
use uuid::Uuid;

use super::error::ApiError;
use super::extract::{Authenticated, FaultRequest, IdempotencyKeyHeader, JsonBody};
use crate::db;
use crate::idempotency::StoredResponse;
use crate::payments::{self, CreatePaymentBody, CreateRequest, Payment, PaymentList, PaymentView};
use crate::problem::PROBLEM_JSON;
use crate::request_id::RequestId;
use crate::state::AppState;

/// The header that marks a stored answer replayed for a retry, `Idempotent-Replayed: true` (as
/// Stripe sends it), made once instead of parsed again (and, being no standard name, copied into
/// an allocation of its own) for every replay.
const REPLAYED: (HeaderName, HeaderValue) =
    (HeaderName::from_static("idempotent-replayed"), HeaderValue::from_static("true"));

/// Page size bounds of `GET /v1/payments` and `GET /v1/refunds`.
pub(super) const DEFAULT_PAGE: i64 = 10;
pub(super) const MAX_PAGE: i64 = 100;

/// `POST /v1/payments`
pub async fn create_payment(
    state: web::Data<AppState>,
    request_id: RequestId,
    Authenticated(account, (key, fault, body)): Authenticated<(
        IdempotencyKeyHeader,
        FaultRequest,
        JsonBody<CreatePaymentBody>,
    )>,
) -> Result<HttpResponse, ApiError> {
    let create = CreateRequest::new(account, key.0, body.0.validate()?);
    // A finished key's answer held in memory is the whole answer: it needs no database and leaves
    // nothing half-done if the client hangs up, so it needs no task of its own either (README,
    // "A replay's tail").
    if let Some(replayed) = create.answer_from_memory(&state) {
        let replayed = replayed?;
        return Ok(stored_response(replayed.response, replayed.replayed));
    }
    let state = state.into_inner();
    // The protocol runs in a task of its own: a client that hangs up drops this handler, and must
    // not take a half-done request down with it (its key would stay locked until the lock went
    // stale). The task finishes the request either way, and a retry gets the stored answer. It
    // logs in the request's span.
    let create = async move { payments::create_payment(&state, create, fault.0, &request_id).await };
    let created = tokio::spawn(create.in_current_span()).await??;
    Ok(stored_response(created.response, created.replayed))
}

/// `GET /v1/payments/{id}`
pub async fn get_payment(
    state: web::Data<AppState>,
    Authenticated(account, id): Authenticated<web::Path<Uuid>>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connect(&state.db).await?;
    let payment = db::query(Payment::find(&mut conn, account, id.into_inner())).await?;
    let payment = payment.ok_or(ApiError::PaymentNotFound)?;
    Ok(HttpResponse::Ok().json(PaymentView::from(&payment)))
}

/// The query of `GET /v1/payments`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    limit: Option<i64>,
    starting_after: Option<Uuid>,
}

/// `GET /v1/payments?limit=N&starting_after=ID`: newest first, cursor-paginated.
pub async fn list_payments(
    state: web::Data<AppState>,
    Authenticated(account, query): Authenticated<web::Query<ListQuery>>,
) -> Result<HttpResponse, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::InvalidRequest(format!("limit must be from 1 to {MAX_PAGE}.")));
    }
    let mut conn = db::connect(&state.db).await?;
    let before = match query.starting_after {
        None => None,
        Some(cursor) => match db::query(Payment::position(&mut conn, account, cursor)).await? {
            Some(position) => Some(position),
            // The cursor names nothing that exists, as an unknown id does on its own path.
            None => return Err(ApiError::PaymentNotFound),
        },
    };
    let mut page = db::query(Payment::list(&mut conn, account, before, limit)).await?;
    let has_more = page.len() as i64 > limit;
    page.truncate(limit as usize);
    Ok(HttpResponse::Ok().json(PaymentList::new(&page, has_more)))
}

/// A stored answer, exactly as stored.
pub(super) fn stored_response(response: StoredResponse, replayed: bool) -> HttpResponse {
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut builder = HttpResponse::build(status);
    builder.content_type(if status.is_success() { "application/json" } else { PROBLEM_JSON });
    if replayed {
        builder.insert_header(REPLAYED);
    }
    builder.body(response.body)
}
