//! The webhook endpoints that read, change and delete (the `POST` that makes one is the
//! registry's: see [`super::idempotent`]). Each handler extracts, calls one function, and shapes
//! the answer. Setting fields is idempotent, so an update needs no key; nor does a delete.

use actix_web::{HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::error::ApiError;
use super::extract::{Authenticated, JsonBody, Named, PathId};
use super::page;
use crate::db::wake::Wake;
use crate::db::{self, StoreError};
use crate::fields::{IntegralNumber, Omittable};
use crate::request_id::RequestId;
use crate::state::AppState;
use crate::webhooks::deliveries::{self, LoggedAttempt};
use crate::webhooks::endpoints::request::{UpdateEndpointBody, check_address};
use crate::webhooks::endpoints::{ENDPOINT_ID_PREFIX, EndpointList, EndpointView, WebhookEndpoint, endpoint_id};
use crate::webhooks::events::event_id;

impl Named for WebhookEndpoint {
    const PREFIX: &'static str = ENDPOINT_ID_PREFIX;

    fn not_found() -> ApiError {
        ApiError::WebhookEndpointNotFound
    }
}

/// `GET /v1/webhook_endpoints/{id}`
pub async fn get_endpoint(
    state: web::Data<AppState>,
    Authenticated(account, PathId(id, _)): Authenticated<PathId<WebhookEndpoint>>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connect(&state.db).await?;
    let endpoint = db::query(WebhookEndpoint::find(&mut conn, account, id)).await?;
    let endpoint = endpoint.ok_or(ApiError::WebhookEndpointNotFound)?;
    Ok(HttpResponse::Ok().json(EndpointView::from(&endpoint)))
}

/// The query of `GET /v1/webhook_endpoints`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    limit: Option<i64>,
    starting_after: Option<String>,
}

/// `GET /v1/webhook_endpoints?limit=N&starting_after=ID`: newest first, cursor-paginated.
pub async fn list_endpoints(
    state: web::Data<AppState>,
    Authenticated(account, query): Authenticated<web::Query<ListQuery>>,
) -> Result<HttpResponse, ApiError> {
    let limit = page::limit(query.limit)?;
    let mut conn = db::connect(&state.db).await?;
    let before = match query.starting_after.as_deref() {
        None => None,
        // The cursor names nothing that exists, as an unknown id does on its own path.
        Some(cursor) => {
            let id = WebhookEndpoint::parse_id(cursor).ok_or(ApiError::WebhookEndpointNotFound)?;
            let position = db::query(WebhookEndpoint::position(&mut conn, account, id)).await?;
            Some(position.ok_or(ApiError::WebhookEndpointNotFound)?)
        }
    };
    let mut fetched = db::query(WebhookEndpoint::list(&mut conn, account, before, limit)).await?;
    let has_more = page::cut(&mut fetched, limit);
    let data = fetched.iter().map(EndpointView::from).collect();
    Ok(HttpResponse::Ok().json(EndpointList { object: "list", data, has_more }))
}

/// `POST /v1/webhook_endpoints/{id}`: sets the fields sent, leaves the others.
pub async fn update_endpoint(
    state: web::Data<AppState>,
    request_id: RequestId,
    Authenticated(account, (PathId(id, _), body)): Authenticated<(
        PathId<WebhookEndpoint>,
        JsonBody<UpdateEndpointBody>,
    )>,
) -> Result<HttpResponse, ApiError> {
    let changes = body.0.validate()?;
    if let Some(url) = &changes.url {
        check_address(&state.settings.webhook_guard(), url)?;
    }
    let mut conn = db::connect(&state.db).await?;
    let updated = db::query(WebhookEndpoint::update(&mut conn, account, id, &changes, request_id.as_str())).await?;
    let endpoint = updated.ok_or(ApiError::WebhookEndpointNotFound)?;
    Ok(HttpResponse::Ok().json(EndpointView::from(&endpoint)))
}

/// `DELETE /v1/webhook_endpoints/{id}`
pub async fn delete_endpoint(
    state: web::Data<AppState>,
    request_id: RequestId,
    Authenticated(account, PathId(id, _)): Authenticated<PathId<WebhookEndpoint>>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connect(&state.db).await?;
    if !db::query(WebhookEndpoint::delete(&mut conn, account, id, request_id.as_str())).await? {
        return Err(ApiError::WebhookEndpointNotFound);
    }
    drop(conn);
    // In a task of its own, so that a client that hangs up does not leave the endpoint's
    // deliveries behind; answered once it is done, or failed (the delete itself has committed, and
    // only the wait for attempts on their way and their tidying were left).
    let waited = tokio::spawn(async move { WebhookEndpoint::wait_for_attempts(&state.db, account, id).await }).await;
    if let Ok(Err(error)) | Err(error) = waited.map_err(|error| StoreError::Unavailable(error.to_string())) {
        tracing::warn!(%error, endpoint.id = %id, "the deleted endpoint's deliveries were not all tidied");
    }
    Ok(HttpResponse::Ok().json(json!({ "id": endpoint_id(id), "object": "webhook_endpoint", "deleted": true })))
}

/// The body of `POST /v1/webhook_endpoints/{id}/recover`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecoverBody {
    /// Unix seconds: deliveries that failed from then on.
    since: IntegralNumber,
    /// Unix seconds: and before then, if given.
    #[serde(default)]
    until: Omittable<IntegralNumber>,
}

/// The last second a recovery's window may name: the end of the year 9999.
const LAST_SECOND: i64 = 253_402_300_799;

/// `POST /v1/webhook_endpoints/{id}/recover`: every delivery to the endpoint that ended `failed`
/// in the window is attempted again, from the start of the schedule; `202 {"queued": N}`.
pub async fn recover_endpoint(
    state: web::Data<AppState>,
    Authenticated(account, (PathId(id, _), body)): Authenticated<(PathId<WebhookEndpoint>, JsonBody<RecoverBody>)>,
) -> Result<HttpResponse, ApiError> {
    let time = |seconds: i64, name: &str| {
        DateTime::<Utc>::from_timestamp(seconds, 0)
            .filter(|_| (0..=LAST_SECOND).contains(&seconds))
            .ok_or_else(|| ApiError::InvalidRequest(format!("{name} must be Unix seconds, from 0 to {LAST_SECOND}.")))
    };
    let since = time(body.0.since.0, "since")?;
    let until = body.0.until.sent().map(|IntegralNumber(until)| time(until, "until")).transpose()?;
    if until.is_some_and(|until| until < since) {
        return Err(ApiError::InvalidRequest("until must not be before since.".into()));
    }
    let mut conn = db::connect(&state.db).await?;
    db::query(WebhookEndpoint::find(&mut conn, account, id)).await?.ok_or(ApiError::WebhookEndpointNotFound)?;
    let queued = deliveries::recover(&mut conn, account, id, since, until).await?;
    if queued > 0 {
        state.wake.wake(Wake::Webhooks);
    }
    Ok(HttpResponse::Accepted().json(json!({ "queued": queued })))
}

/// What an attempt's id begins with where the API shows it: `wa_` and its number.
const ATTEMPT_ID_PREFIX: &str = "wa_";

/// An attempt, as the log shows it.
#[derive(Debug, Serialize)]
struct AttemptView<'a> {
    id: String,
    object: &'static str,
    event_id: String,
    event_type: &'a str,
    attempt: i32,
    status_code: Option<i16>,
    error: Option<&'a str>,
    response_body: &'a str,
    duration_ms: i32,
    attempted_at: DateTime<Utc>,
    next_attempt_at: Option<DateTime<Utc>>,
    /// Where the attempt's delivery stands now: `pending`, `delivered` or `failed`.
    delivery_status: Option<&'a str>,
}

impl<'a> From<&'a LoggedAttempt> for AttemptView<'a> {
    fn from(attempt: &'a LoggedAttempt) -> Self {
        AttemptView {
            id: format!("{ATTEMPT_ID_PREFIX}{}", attempt.id),
            object: "webhook_attempt",
            event_id: event_id(attempt.event_id),
            event_type: &attempt.event_type,
            attempt: attempt.attempt,
            status_code: attempt.status_code,
            error: attempt.error.as_deref(),
            response_body: &attempt.response_body,
            duration_ms: attempt.duration_ms,
            attempted_at: attempt.attempted_at,
            next_attempt_at: attempt.next_attempt_at,
            delivery_status: attempt.delivery_status.as_deref(),
        }
    }
}

/// `GET /v1/webhook_endpoints/{id}/attempts?limit=N&starting_after=ID`: the endpoint's attempts,
/// newest first.
pub async fn list_attempts(
    state: web::Data<AppState>,
    Authenticated(account, (PathId(id, _), query)): Authenticated<(PathId<WebhookEndpoint>, web::Query<ListQuery>)>,
) -> Result<HttpResponse, ApiError> {
    let limit = page::limit(query.limit)?;
    let before = match query.starting_after.as_deref() {
        None => None,
        Some(cursor) => Some(
            cursor
                .strip_prefix(ATTEMPT_ID_PREFIX)
                .and_then(|number| number.parse::<i64>().ok())
                .ok_or_else(|| ApiError::InvalidRequest("starting_after must be an attempt's id (wa_...).".into()))?,
        ),
    };
    let mut conn = db::connect(&state.db).await?;
    db::query(WebhookEndpoint::find(&mut conn, account, id)).await?.ok_or(ApiError::WebhookEndpointNotFound)?;
    let mut fetched = deliveries::attempts(&mut conn, account, id, before, limit).await?;
    let has_more = page::cut(&mut fetched, limit);
    let data: Vec<AttemptView> = fetched.iter().map(AttemptView::from).collect();
    Ok(HttpResponse::Ok().json(json!({ "object": "list", "data": data, "has_more": has_more })))
}
