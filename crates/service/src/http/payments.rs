//! The payments endpoints that read (`POST`s are the registry's: see [`super::idempotent`]). Each
//! handler extracts, calls one function, and shapes the answer.

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use uuid::Uuid;

use super::error::ApiError;
use super::extract::{Authenticated, Named, PathId};
use super::page;
use crate::db;
use crate::payments::{Payment, PaymentList, PaymentView};
use crate::state::AppState;

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
