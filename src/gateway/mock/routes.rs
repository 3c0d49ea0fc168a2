//! The HTTP layer: thin actix handlers over the [`Ledger`] and the
//! [`FaultPlan`].

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::http::header::ContentType;
use actix_web::{HttpRequest, HttpResponse, Resource, ResponseError, web};
use rand::Rng;
use rand::distr::Alphanumeric;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, MAX_KEY_LEN};
use super::faults::{Fault, FaultPlan, FaultSpec};
use super::state::{Charge, ChargeRequest, Claim, Ledger, Outcome, StoredResponse};

/// What the handlers share.
pub(super) struct AppState {
    /// Who this gateway is: made anew each time it starts, because its memory (charges, keys)
    /// starts anew too. Every answer names it (`Gateway-Account`), so a client can tell which
    /// gateway answered, and never takes this one's "no charge" for another's.
    account_id: String,
    ledger: Mutex<Ledger>,
    faults: Mutex<FaultPlan>,
}

impl AppState {
    pub(super) fn new(faults: FaultPlan) -> Self {
        let suffix: String = rand::rng().sample_iter(Alphanumeric).take(16).map(char::from).collect();
        AppState { account_id: format!("acct_{suffix}"), ledger: Mutex::default(), faults: Mutex::new(faults) }
    }

    /// Who this gateway is.
    pub(super) fn account_id(&self) -> &str {
        &self.account_id
    }

    /// Counts an incoming charge request and draws its fault.
    fn arrive(&self) -> Fault {
        let fault = lock(&self.faults).draw(&mut rand::rng());
        let mut ledger = lock(&self.ledger);
        ledger.count_request();
        if fault.is_failure() {
            ledger.count_fault();
        }
        fault
    }
}

/// Locks without giving up on poisoning: every critical section leaves the
/// state consistent, so a panic elsewhere is no reason to stop serving.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether the gateway serves its `/_control/*` endpoints, which let whoever reaches them inject
/// faults and make it forget keys: only for demos and tests, never by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controls {
    Served,
    Hidden,
}

/// Registers every route, and makes every failure, even actix's own, JSON.
pub(super) fn configure(cfg: &mut web::ServiceConfig, controls: Controls) {
    cfg.app_data(web::JsonConfig::default().error_handler(|err, _| payload_error(err)))
        .app_data(web::QueryConfig::default().error_handler(|err, _| payload_error(err)))
        .service(resource("/v1/account").get(account))
        .service(resource("/v1/charges").post(create_charge).get(list_charges))
        .service(resource("/v1/charges/{id}").get(get_charge));
    if controls == Controls::Served {
        cfg.service(resource("/_control/faults").get(show_faults).post(set_faults).delete(clear_faults))
            .service(resource("/_control/idempotency-keys").delete(forget_keys))
            .service(resource("/_control/stats").get(stats));
    }
    cfg.default_service(web::to(unknown_route));
}

/// `GET /v1/account`: who this gateway is, as Stripe answers for the account an API key is of.
async fn account(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "id": state.account_id, "object": "account" }))
}

/// A resource that answers methods it has no route for with a JSON 405.
fn resource(path: &str) -> Resource {
    web::resource(path).default_service(web::to(method_not_allowed))
}

/// A body or query string actix could not parse, as a JSON error.
fn payload_error(err: impl ResponseError) -> actix_web::Error {
    ApiError::Unparsable(err.status_code(), err.to_string()).into()
}

/// `POST /v1/charges`. The body is taken as a `Result` so that even a
/// malformed request is counted and uses up its fault before being refused.
async fn create_charge(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: Result<web::Json<ChargeRequest>, actix_web::Error>,
) -> actix_web::Result<HttpResponse> {
    let fault = state.arrive();
    if fault == Fault::ErrorBefore {
        return Err(ApiError::Injected(fault).into());
    }
    let key = idempotency_key(&req)?;
    let request = body?.into_inner();
    request.validate().map_err(ApiError::from)?;
    // Claimed on arrival, so a duplicate sent while this one waits out its
    // latency already sees the key in use.
    let claim = lock(&state.ledger).claim(&key, &request.fingerprint());
    let latency = match fault {
        Fault::Latency(delay) => Some(delay),
        _ => None,
    };
    // A client hanging up drops this handler; the spawned task is not
    // dropped with it, so a charge is never left half made.
    let task = tokio::spawn(process(state.into_inner(), key, request, claim, latency));
    let (stored, replayed) = task.await.map_err(|_| ApiError::Internal)??;
    match fault {
        Fault::ErrorAfter => Err(ApiError::Injected(fault).into()),
        // Ends when the client gives up and actix drops this future.
        Fault::TimeoutAfter => std::future::pending().await,
        _ => Ok(stored_response(&stored, replayed)),
    }
}

/// The part of a charge request that must run to the end once started.
/// Returns the response and whether it is a replay.
async fn process(
    state: Arc<AppState>,
    key: String,
    request: ChargeRequest,
    claim: Claim,
    latency: Option<Duration>,
) -> Result<(StoredResponse, bool), ApiError> {
    if let Some(delay) = latency {
        tokio::time::sleep(delay).await;
    }
    match claim {
        Claim::Granted => {
            let mut ledger = lock(&state.ledger);
            let stored = match ledger.settle(&key, &request) {
                Outcome::Charged(charge) => StoredResponse {
                    status: StatusCode::OK,
                    body: serde_json::to_vec(&charge).expect("a charge always serializes"),
                },
                Outcome::Declined => ApiError::CardDeclined.stored(),
            };
            ledger.finish(&key, stored.clone());
            Ok((stored, false))
        }
        Claim::Replay(stored) => Ok((stored, true)),
        Claim::InUse => Err(ApiError::KeyInUse),
        Claim::Mismatch => Err(ApiError::KeyReused),
    }
}

fn idempotency_key(req: &HttpRequest) -> Result<String, ApiError> {
    req.headers()
        .get("Idempotency-Key")
        .and_then(|value| value.to_str().ok())
        .filter(|key| !key.is_empty() && key.len() <= MAX_KEY_LEN)
        .map(str::to_owned)
        .ok_or(ApiError::MissingKey)
}

fn stored_response(stored: &StoredResponse, replayed: bool) -> HttpResponse {
    let mut response = HttpResponse::build(stored.status);
    if replayed {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    response.content_type(ContentType::json()).body(stored.body.clone())
}

async fn get_charge(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    match lock(&state.ledger).charge(&id) {
        Some(charge) => Ok(HttpResponse::Ok().json(charge)),
        None => Err(ApiError::NoSuchCharge(id.into_inner())),
    }
}

#[derive(Deserialize)]
struct ListQuery {
    idempotency_key: String,
}

#[derive(Serialize)]
struct ChargeList {
    object: &'static str,
    data: Vec<Charge>,
}

/// `GET /v1/charges?idempotency_key=K`, answered from the charges themselves
/// so that it works after the idempotency cache has been forgotten.
async fn list_charges(state: web::Data<AppState>, query: web::Query<ListQuery>) -> HttpResponse {
    let mut ledger = lock(&state.ledger);
    ledger.count_look_up();
    let data = ledger.charges_with_key(&query.idempotency_key);
    HttpResponse::Ok().json(ChargeList { object: "list", data })
}

async fn show_faults(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(lock(&state.faults).view())
}

async fn set_faults(state: web::Data<AppState>, spec: web::Json<FaultSpec>) -> Result<HttpResponse, ApiError> {
    let plan = spec.into_inner().into_plan()?;
    let view = plan.view();
    *lock(&state.faults) = plan;
    Ok(HttpResponse::Ok().json(view))
}

async fn clear_faults(state: web::Data<AppState>) -> HttpResponse {
    *lock(&state.faults) = FaultPlan::none();
    HttpResponse::NoContent().finish()
}

async fn forget_keys(state: web::Data<AppState>) -> HttpResponse {
    lock(&state.ledger).forget_keys();
    HttpResponse::NoContent().finish()
}

async fn stats(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(lock(&state.ledger).stats())
}

async fn unknown_route(req: HttpRequest) -> HttpResponse {
    ApiError::NoRoute(req.method().clone(), req.path().to_owned()).error_response()
}

async fn method_not_allowed(req: HttpRequest) -> HttpResponse {
    ApiError::WrongMethod(req.method().clone(), req.path().to_owned()).error_response()
}
