//! The events API: an account's kept events, read. Each handler extracts, calls one function, and
//! shapes the answer; an event is answered in the very bytes its deliveries carry.

use actix_web::{HttpResponse, web};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::error::ApiError;
use super::extract::{Authenticated, Named, PathId};
use super::page;
use crate::db;
use crate::state::AppState;
use crate::webhooks::events::{EVENT_ID_PREFIX, Event, TypeFilter};

impl Named for Event {
    const PREFIX: &'static str = EVENT_ID_PREFIX;

    fn not_found() -> ApiError {
        ApiError::EventNotFound
    }
}

/// `GET /v1/events/{id}`
pub async fn get_event(
    state: web::Data<AppState>,
    Authenticated(account, PathId(id, _)): Authenticated<PathId<Event>>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connect(&state.db).await?;
    let event = db::query(Event::find(&mut conn, account, id)).await?.ok_or(ApiError::EventNotFound)?;
    Ok(HttpResponse::Ok().content_type("application/json").body(event.body))
}

/// The query of `GET /v1/events`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    limit: Option<i64>,
    starting_after: Option<String>,
    #[serde(rename = "type")]
    event_type: Option<String>,
}

/// A page of events, each in its kept bytes.
#[derive(Debug, Serialize)]
struct EventList {
    object: &'static str,
    data: Vec<Box<RawValue>>,
    has_more: bool,
}

/// `GET /v1/events?type=T&limit=N&starting_after=ID`: newest first, cursor-paginated; `type` is
/// one type, or a prefix with `*` (`payment.*`).
pub async fn list_events(
    state: web::Data<AppState>,
    Authenticated(account, query): Authenticated<web::Query<ListQuery>>,
) -> Result<HttpResponse, ApiError> {
    let limit = page::limit(query.limit)?;
    let filter = TypeFilter::parse(query.event_type.as_deref()).ok_or(ApiError::UnknownEventType)?;
    let mut conn = db::connect(&state.db).await?;
    let before = match query.starting_after.as_deref() {
        None => None,
        // The cursor names nothing that exists, as an unknown id does on its own path.
        Some(cursor) => {
            let id = Event::parse_id(cursor).ok_or(ApiError::EventNotFound)?;
            Some(db::query(Event::position(&mut conn, account, id)).await?.ok_or(ApiError::EventNotFound)?)
        }
    };
    let mut fetched = db::query(Event::list(&mut conn, account, &filter, before, limit)).await?;
    let has_more = page::cut(&mut fetched, limit);
    let data = fetched.into_iter().map(|event| RawValue::from_string(event.body)).collect::<Result<_, _>>();
    let data = data.map_err(|error| ApiError::Internal(format!("a kept event that is not JSON: {error}")))?;
    Ok(HttpResponse::Ok().json(EventList { object: "list", data, has_more }))
}
