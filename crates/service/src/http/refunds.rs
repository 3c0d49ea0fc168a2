//! The refunds endpoints that read (`POST /v1/refunds` is the registry's: see
//! [`super::idempotent`]). Each handler extracts, calls one function, and shapes the answer.

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use uuid::Uuid;

use super::error::ApiError;
use super::extract::{Authenticated, Named, PathId};
use super::page;
use crate::db;
use crate::payments::Payment;
use crate::refunds::{Refund, RefundList, RefundView};
use crate::state::AppState;

impl Named for Refund {
    fn not_found() -> ApiError {
        ApiError::RefundNotFound
    }
}

/// `GET /v1/refunds/{id}`
pub async fn get_refund(
    state: web::Data<AppState>,
    Authenticated(account, PathId(id, _)): Authenticated<PathId<Refund>>,
) -> Result<HttpResponse, ApiError> {
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
    let limit = page::limit(query.limit)?;
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
    let mut fetched = db::query(Refund::list(&mut conn, account, query.payment, before, limit)).await?;
    let has_more = page::cut(&mut fetched, limit);
    Ok(HttpResponse::Ok().json(RefundList::new(&fetched, has_more)))
}
