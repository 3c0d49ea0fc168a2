//! The idempotency keys endpoint: one key's whole story.

use actix_web::{HttpResponse, web};
use serde::Deserialize;

use super::error::ApiError;
use super::extract::Authenticated;
use crate::db;
use crate::idempotency::IdempotencyKey;
use crate::keyed::Registered;
use crate::state::AppState;
use crate::story::KeyStory;

/// The query of `GET /v1/idempotency_keys`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyQuery {
    key: String,
    /// How many of the trail's records to skip: those a client already read.
    #[serde(default)]
    trail_after: u32,
}

/// `GET /v1/idempotency_keys?key=KEY&trail_after=N`: where the caller's key stands, the payment
/// it made, and its audit trail, a page at a time.
pub async fn key_story(
    state: web::Data<AppState>,
    keyed: web::Data<&'static [Registered]>,
    Authenticated(account, query): Authenticated<web::Query<KeyQuery>>,
) -> Result<HttpResponse, ApiError> {
    let key = IdempotencyKey::named(&query.key)?;
    let mut conn = db::connect(&state.db).await?;
    let story = KeyStory::find(&mut conn, &keyed, account, &key, query.trail_after).await?;
    let story = story.ok_or(ApiError::IdempotencyKeyNotFound)?;
    Ok(HttpResponse::Ok().json(story))
}
