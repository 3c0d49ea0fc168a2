//! The payments endpoints. Each handler extracts, calls one function, and shapes the answer.

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use uuid::Uuid;

use super::error::ApiError;
use super::extract::{Authenticated, FaultRequest, IdempotencyKeyHeader, JsonBody, Named, PathId};
use super::{idempotent, page};
use crate::authorizations::{self, ChangeBody};
use crate::db;
use crate::idempotency::KeyedRequest;
use crate::payments::{self, CreatePaymentBody, Payment, PaymentList, PaymentView};
use crate::request_id::RequestId;
use crate::state::AppState;

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
    let request = KeyedRequest::new(account, key.0, &payments::ENDPOINT, body.0.validate()?);
    idempotent::answer(state, request, move |state, request| async move {
        payments::create_payment(&state, request, fault.0, &request_id).await
    })
    .await
}

/// `POST /v1/payments/{id}/capture` and `/cancel`: `B` is the body, [`CaptureBody`] or
/// [`CancelBody`](authorizations::CancelBody), which says which.
pub async fn change_payment<B: ChangeBody>(
    state: web::Data<AppState>,
    request_id: RequestId,
    Authenticated(account, (PathId(id, _), key, fault, body)): Authenticated<(
        PathId<Payment>,
        IdempotencyKeyHeader,
        FaultRequest,
        JsonBody<B>,
    )>,
) -> Result<HttpResponse, ApiError> {
    let request = KeyedRequest::new(account, key.0, B::ENDPOINT, body.0.validate(id)?);
    idempotent::answer(state, request, move |state, request| async move {
        authorizations::change_payment(&state, request, fault.0, &request_id).await
    })
    .await
}

impl Named for Payment {
    fn not_found() -> ApiError {
        ApiError::PaymentNotFound
    }
}

/// `GET /v1/payments/{id}`
pub async fn get_payment(
    state: web::Data<AppState>,
    Authenticated(account, PathId(id, _)): Authenticated<PathId<Payment>>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connect(&state.db).await?;
    let payment = db::query(Payment::find(&mut conn, account, id)).await?;
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
    let limit = page::limit(query.limit)?;
    let mut conn = db::connect(&state.db).await?;
    let before = match query.starting_after {
        None => None,
        Some(cursor) => match db::query(Payment::position(&mut conn, account, cursor)).await? {
            Some(position) => Some(position),
            // The cursor names nothing that exists, as an unknown id does on its own path.
            None => return Err(ApiError::PaymentNotFound),
        },
    };
    let mut fetched = db::query(Payment::list(&mut conn, account, before, limit)).await?;
    let has_more = page::cut(&mut fetched, limit);
    Ok(HttpResponse::Ok().json(PaymentList::new(&fetched, has_more)))
}
