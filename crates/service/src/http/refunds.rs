//! The refunds endpoints. Each handler extracts, calls one function, and shapes the answer.

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use tracing::Instrument;
use uuid::Uuid;

use super::error::ApiError;
use super::extract::{Authenticated, FaultRequest, IdempotencyKeyHeader, JsonBody};
use super::payments::{DEFAULT_PAGE, MAX_PAGE, stored_response};
use crate::db;
use crate::payments::Payment;
use crate::refunds::{self, CreateRefundBody, CreateRequest, Refund, RefundList, RefundView};
use crate::request_id::RequestId;
use crate::state::AppState;

/// `POST /v1/refunds`
pub async fn create_refund(
    state: web::Data<AppState>,
    request_id: RequestId,
    Authenticated(account, (key, fault, body)): Authenticated<(
        IdempotencyKeyHeader,
        FaultRequest,
        JsonBody<CreateRefundBody>,
    )>,
) -> Result<HttpResponse, ApiError> {
    let create = CreateRequest::new(account, key.0, body.0.validate()?);
    // As a payment's: a finished key's answer in memory is answered here, with no task.
    if let Some(replayed) = create.answer_from_memory(&state) {
        let replayed = replayed?;
        return Ok(stored_response(replayed.response, replayed.replayed));
    }
    let state = state.into_inner();
    // In a task of its own, as a payment is: a client that hangs up must not cut the request short.
    let create = async move { refunds::create_refund(&state, create, fault.0, &request_id).await };
    let created = tokio::spawn(create.in_current_span()).await??;
    Ok(stored_response(created.response, created.replayed))
}

/// `GET /v1/refunds/{id}`. An id that is not one names no refund.
pub async fn get_refund(
    state: web::Data<AppState>,
    Authenticated(account, id): Authenticated<web::Path<String>>,
) -> Result<HttpResponse, ApiError> {
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::RefundNotFound)?;
    let mut conn = db::connect(&state.db).await?;
    let refund = db::query(Refund::find(&mut conn, account, id)).await?;
    let refund = refund.ok_or(ApiError::RefundNotFound)?;
    Ok(HttpResponse::Ok().json(RefundView::from(&refund)))
}

/// The query of `GET /v1/refunds`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    payment: Uuid,
    limit: Option<i64>,
    starting_after: Option<Uuid>,
}

/// `GET /v1/refunds?payment=ID&limit=N&starting_after=ID`: a payment's refunds, newest first.
pub async fn list_refunds(
    state: web::Data<AppState>,
    Authenticated(account, query): Authenticated<web::Query<ListQuery>>,
) -> Result<HttpResponse, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::InvalidRequest(format!("limit must be from 1 to {MAX_PAGE}.")));
    }
    let mut conn = db::connect(&state.db).await?;
    if db::query(Payment::find(&mut conn, account, query.payment)).await?.is_none() {
        return Err(ApiError::PaymentNotFound);
    }
    let before = match query.starting_after {
        None => None,
        Some(cursor) => match db::query(Refund::position(&mut conn, account, query.payment, cursor)).await? {
            Some(position) => Some(position),
            None => return Err(ApiError::RefundNotFound),
        },
    };
    let mut page = db::query(Refund::list(&mut conn, account, query.payment, before, limit)).await?;
    let has_more = page.len() as i64 > limit;
    page.truncate(limit as usize);
    Ok(HttpResponse::Ok().json(RefundList::new(&page, has_more)))
}
