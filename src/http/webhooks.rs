//! `POST /webhooks/gateway`: the gateway's events. No API key: the signature is the credential,
//! checked on the raw bytes before anything reads them.

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::json;

use super::error::ApiError;
use super::extract::RawBody;
use crate::db;
use crate::events::{self, GatewayEvent};
use crate::gateway::signature::{self, SIGNATURE_HEADER};
use crate::metrics::EventKind;
use crate::request_id::RequestId;
use crate::state::AppState;

/// `POST /webhooks/gateway`: 400 `invalid-signature` (nothing written) unless a `v1` signature
/// matches one of the secrets and its time is within the tolerance; 400 `malformed-body` for a
/// signed body that is not an event; 200 once the event is recorded and applied (a duplicate too:
/// it changes nothing); a failure of ours rolls back and answers 5xx, so the gateway sends it again.
pub async fn receive_gateway_event(
    state: web::Data<AppState>,
    request: HttpRequest,
    request_id: RequestId,
    RawBody(body): RawBody,
) -> Result<HttpResponse, ApiError> {
    let settings = &state.settings;
    let header = request.headers().get(SIGNATURE_HEADER).map(|value| value.as_bytes());
    let now = chrono::Utc::now().timestamp();
    let verified =
        signature::verify(header, &body, &settings.gateway_webhook_secrets, now, settings.gateway_webhook_tolerance);
    if let Err(error) = verified {
        state.metrics.gateway_event(EventKind::Unverified, crate::metrics::EventOutcome::InvalidSignature);
        tracing::warn!(%error, "refused a gateway event");
        return Err(ApiError::InvalidSignature(error));
    }
    let event = GatewayEvent::parse(&body).map_err(|error| ApiError::MalformedBody(error.to_string()))?;
    let mut conn = db::connect(&state.db).await?;
    let outcome = events::receive(&mut conn, &event, &request_id).await?;
    state.metrics.gateway_event(event.kind(), outcome);
    tracing::info!(event.id = %event.id, event.r#type = event.kind().as_str(), outcome = outcome.as_str(), "gateway event");
    Ok(HttpResponse::Ok().json(json!({ "received": true, "outcome": outcome.as_str() })))
}
