//! `POST /webhooks/gateway`: the gateway's events. No API key: the signature is the credential,
//! checked on the raw bytes before anything reads them.

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::json;

use super::error::ApiError;
use super::extract::{RawBody, Repeated, sent_once};
use crate::db;
use crate::db::wake::Wake;
use crate::events::{self, GatewayEvent};
use crate::gateway::signature::{self, SIGNATURE_HEADER, SignatureError};
use crate::metrics::{EventKind, EventOutcome};
use crate::request_id::RequestId;
use crate::state::AppState;

/// `POST /webhooks/gateway`: 400 `invalid-signature` (nothing written) unless a `v1` signature
/// matches one of the secrets and its time is within the tolerance; 200 once the event is recorded
/// and applied (a duplicate too: it changes nothing), and 200 `unrecognized` for a signed body the
/// service cannot read, kept for a person; a failure of ours rolls back and answers 5xx, so the
/// gateway sends it again, as does 503 `event-not-seen-yet` (see [`events::UNSEEN_PATIENCE`]).
pub async fn receive_gateway_event(
    state: web::Data<AppState>,
    request: HttpRequest,
    request_id: RequestId,
    RawBody(body): RawBody,
) -> Result<HttpResponse, ApiError> {
    let settings = &state.settings;
    // Two headers are no signature, as any header that names one thing sent twice is none.
    let header = sent_once(&request, SIGNATURE_HEADER).map_err(|Repeated| SignatureError::SentTwice);
    let now = chrono::Utc::now().timestamp();
    let (secrets, tolerance) = (&settings.gateway_webhook_secrets, settings.gateway_webhook_tolerance);
    let verified =
        header.and_then(|header| signature::verify(header.map(|v| v.as_bytes()), &body, secrets, now, tolerance));
    if let Err(error) = verified {
        state.metrics.gateway_event(EventKind::Unverified, EventOutcome::InvalidSignature);
        tracing::warn!(%error, "refused a gateway event");
        return Err(ApiError::InvalidSignature(error));
    }
    let mut conn = db::connect(&state.db).await?;
    let (kind, outcome) = match GatewayEvent::parse(&body) {
        Ok(event) => {
            let outcome = events::receive(&mut conn, &event, &request_id).await?;
            tracing::info!(event.id = %event.id, event.r#type = event.kind().as_str(), outcome = outcome.as_str(), "gateway event");
            (event.kind(), outcome)
        }
        // Signed, so the gateway's; unreadable, so no retry of it would help: kept for a person.
        Err(unreadable) => {
            let outcome = events::keep_unreadable(&mut conn, &body, &unreadable, &request_id).await?;
            tracing::error!(reason = %unreadable, "a gateway event that verified cannot be read; kept for a person");
            (unreadable.kind, outcome)
        }
    };
    state.metrics.gateway_event(kind, outcome);
    if outcome == EventOutcome::NotSeenYet {
        return Err(ApiError::EventNotSeenYet);
    }
    // Committed: the worker that acts on what the event changed looks at once.
    match (kind, outcome) {
        (_, EventOutcome::Nudged) => state.wake.wake(Wake::Completer),
        (EventKind::RefundSucceeded | EventKind::RefundFailed, EventOutcome::Applied) => state.wake.wake(Wake::Outbox),
        _ => {}
    }
    Ok(HttpResponse::Ok().json(json!({ "received": true, "outcome": outcome.as_str() })))
}
