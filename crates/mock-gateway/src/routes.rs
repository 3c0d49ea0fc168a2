//! The HTTP layer: thin actix handlers over the [`Ledger`], the [`FaultPlan`] and the
//! [`Outbox`] of events.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::http::header::ContentType;
use actix_web::{HttpRequest, HttpResponse, Resource, ResponseError, web};
use rand::Rng;
use rand::distr::Alphanumeric;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::deliveries::{EventStats, Outbox};
use super::error::{ApiError, MAX_KEY_LEN};
use super::event_plan::{EventPlan, EventPlanSpec};
use super::faults::{Fault, FaultPlan, FaultSpec};
use super::own_changes::{OwnChangePlan, OwnChangeSpec};
use super::requests::{
    CancelBody, CancelRequest, CaptureBody, CaptureRequest, ChargeRequest, Create, Endpoint, RefundRequest,
};
use super::state::{Claim, Declined, Ledger, Stats, StoredResponse};

/// What the handlers share.
pub(super) struct AppState {
    /// Who this gateway is: made anew each time it starts, because its memory (charges, keys)
    /// starts anew too. Every answer names it (`Gateway-Account`), so a client can tell which
    /// gateway answered, and never takes this one's "no charge" for another's.
    account_id: String,
    ledger: Mutex<Ledger>,
    faults: Mutex<FaultPlan>,
    /// Where the events the ledger makes go, to be sent.
    outbox: Outbox,
    /// Told whenever a refund (it may be pending) or a charge (it may be an authorization the
    /// gateway is to change on its own) is made, for the timer that makes the books' own changes
    /// on time.
    made: Notify,
}

impl AppState {
    pub(super) fn new(faults: FaultPlan, outbox: Outbox) -> Self {
        let suffix: String = rand::rng().sample_iter(Alphanumeric).take(16).map(char::from).collect();
        AppState {
            account_id: format!("acct_{suffix}"),
            ledger: Mutex::new(if outbox.sends() { Ledger::making_events() } else { Ledger::default() }),
            faults: Mutex::new(faults),
            outbox,
            made: Notify::new(),
        }
    }

    /// Who this gateway is.
    pub(super) fn account_id(&self) -> &str {
        &self.account_id
    }

    /// The books, locked.
    fn books(&self) -> Books<'_> {
        Books { ledger: lock(&self.ledger), outbox: &self.outbox }
    }

    /// The books, with every pending refund whose time has come settled, and every change the
    /// gateway makes on its own whose time has come made: whoever looks (a read, a new refund's
    /// check of what its charge has left, a capture, the stats) never sees one late, even if the
    /// timer that makes them is a moment late.
    fn ledger(&self) -> Books<'_> {
        let mut books = self.books();
        let now = Instant::now();
        books.settle_due(now);
        books.make_own_changes_due(now);
        books
    }

    /// Counts an incoming request to `endpoint` and draws its fault.
    fn arrive(&self, endpoint: Endpoint) -> Fault {
        let fault = lock(&self.faults).draw(&mut rand::rng());
        let mut books = self.books();
        books.count_request(endpoint);
        if fault.is_failure() {
            books.count_fault();
        }
        fault
    }

    /// Settles each pending refund, and makes each change the gateway makes on its own, when its
    /// time comes, so that its event goes out then, whether or not anyone looks at the books. Runs
    /// for as long as the gateway does.
    pub(super) async fn change_on_time(self: Arc<AppState>) {
        loop {
            let next = {
                let books = self.books();
                books.next_settlement().into_iter().chain(books.next_own_change()).min()
            };
            // A refund or a charge made after this look is not missed: `notify_one` keeps its
            // wake-up for a `notified` that comes later.
            let changed = self.made.notified();
            match next {
                Some(at) => tokio::select! {
                    () = tokio::time::sleep_until(at.into()) => {}
                    () = changed => {}
                },
                None => changed.await,
            }
            drop(self.ledger());
        }
    }
}

/// The ledger, locked. The events its changes made go to the outbox as it is unlocked (in the
/// order made, before another change can be made): none is left behind in the ledger, and a
/// request's answer never waits for its event to be sent.
struct Books<'a> {
    ledger: MutexGuard<'a, Ledger>,
    outbox: &'a Outbox,
}

impl Deref for Books<'_> {
    type Target = Ledger;

    fn deref(&self) -> &Ledger {
        &self.ledger
    }
}

impl DerefMut for Books<'_> {
    fn deref_mut(&mut self) -> &mut Ledger {
        &mut self.ledger
    }
}

impl Drop for Books<'_> {
    fn drop(&mut self) {
        for event in self.ledger.take_events() {
            self.outbox.post(event);
        }
    }
}

/// Locks without giving up on poisoning: every critical section leaves the
/// state consistent, so a panic elsewhere is no reason to stop serving.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether the gateway serves its `/_control/*` endpoints, which let whoever reaches them inject
/// faults, make it forget keys and settle refunds early: only for demos and tests, never by
/// default.
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
        .service(resource("/v1/charges").post(create::<ChargeRequest>).get(list_charges))
        .service(resource("/v1/charges/{id}").get(get_charge))
        .service(resource("/v1/charges/{id}/capture").post(capture))
        .service(resource("/v1/charges/{id}/cancel").post(cancel))
        .service(resource("/v1/refunds").post(create::<RefundRequest>).get(list_refunds))
        .service(resource("/v1/refunds/{id}").get(get_refund));
    if controls == Controls::Served {
        cfg.service(resource("/_control/faults").get(show_faults).post(set_faults).delete(clear_faults))
            .service(resource("/_control/events").get(show_event_plan).post(set_event_plan).delete(clear_event_plan))
            .service(resource("/_control/events/sent").get(events_sent))
            .service(resource("/_control/idempotency-keys").delete(forget_keys))
            .service(resource("/_control/refunds/settle").post(settle_refunds))
            .service(resource("/_control/authorizations/expire").post(expire_authorizations))
            .service(
                resource("/_control/authorizations/own-changes")
                    .get(show_own_changes)
                    .post(plan_own_changes)
                    .delete(stop_own_changes),
            )
            .service(resource("/_control/authorizations/own-changes/made").get(own_changes_made))
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

/// A request that makes a charge or a refund, or captures or cancels a charge: what the ledger
/// makes of it, as the answer stored under its key.
trait Make: Create + Send + 'static {
    fn make(&self, ledger: &mut Ledger, key: &str) -> StoredResponse;
}

impl Make for ChargeRequest {
    fn make(&self, ledger: &mut Ledger, key: &str) -> StoredResponse {
        match ledger.create_charge(key, self) {
            Ok(charge) => {
                ledger.draw_own_change(&charge, Instant::now());
                ok(&charge)
            }
            Err(Declined(charge)) => ApiError::CardDeclined(charge).stored(),
        }
    }
}

impl Make for RefundRequest {
    fn make(&self, ledger: &mut Ledger, key: &str) -> StoredResponse {
        match ledger.create_refund(key, self, Instant::now()) {
            Ok(refund) => ok(&refund),
            Err(refusal) => ApiError::from(refusal).stored(),
        }
    }
}

impl Make for CaptureRequest {
    fn make(&self, ledger: &mut Ledger, key: &str) -> StoredResponse {
        match ledger.capture(key, self) {
            Ok(charge) => ok(&charge),
            Err(refusal) => ApiError::from(refusal).stored(),
        }
    }
}

impl Make for CancelRequest {
    fn make(&self, ledger: &mut Ledger, key: &str) -> StoredResponse {
        match ledger.cancel(key, self) {
            Ok(charge) => ok(&charge),
            Err(refusal) => ApiError::from(refusal).stored(),
        }
    }
}

fn ok(object: &impl Serialize) -> StoredResponse {
    StoredResponse { status: StatusCode::OK, body: serde_json::to_vec(object).expect("an object always serializes") }
}

/// `POST /v1/charges` and `POST /v1/refunds`. The body is taken as a `Result` so that even a
/// malformed request is counted and uses up its fault before being refused.
async fn create<R: Make + DeserializeOwned>(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: Result<web::Json<R>, actix_web::Error>,
) -> actix_web::Result<HttpResponse> {
    under_key(state, req, body.map(web::Json::into_inner)).await
}

/// `POST /v1/charges/{id}/capture`, its body optional.
async fn capture(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> actix_web::Result<HttpResponse> {
    let request =
        optional_json(&body).map(|body: CaptureBody| CaptureRequest { charge: id.into_inner(), amount: body.amount });
    under_key(state, req, request).await
}

/// `POST /v1/charges/{id}/cancel`, with no body or an empty object.
async fn cancel(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> actix_web::Result<HttpResponse> {
    let request = optional_json(&body).map(|CancelBody {}| CancelRequest { charge: id.into_inner() });
    under_key(state, req, request).await
}

/// A JSON body that may be left out altogether.
fn optional_json<T: DeserializeOwned + Default>(body: &[u8]) -> Result<T, actix_web::Error> {
    if body.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|err| ApiError::Unparsable(StatusCode::BAD_REQUEST, err.to_string()).into())
}

/// A request done under its idempotency key: counted and given its fault on arrival (even if it is
/// malformed), then done once, its answer stored and replayed.
async fn under_key<R: Make>(
    state: web::Data<AppState>,
    req: HttpRequest,
    request: Result<R, actix_web::Error>,
) -> actix_web::Result<HttpResponse> {
    let fault = state.arrive(R::ENDPOINT);
    if fault == Fault::ErrorBefore {
        return Err(ApiError::Injected(fault).into());
    }
    let key = idempotency_key(&req)?;
    let request = request?;
    request.validate().map_err(ApiError::from)?;
    // Claimed on arrival, so a duplicate sent while this one waits out its
    // latency already sees the key in use.
    let claim = state.books().claim(&key, &request.fingerprint());
    let latency = match fault {
        Fault::Latency(delay) => Some(delay),
        _ => None,
    };
    // A client hanging up drops this handler; the spawned task is not
    // dropped with it, so a charge or refund is never left half made.
    let task = tokio::spawn(process(state.into_inner(), key, request, claim, latency));
    let (stored, replayed) = task.await.map_err(|_| ApiError::Internal)??;
    match fault {
        Fault::ErrorAfter => Err(ApiError::Injected(fault).into()),
        // Ends when the client gives up and actix drops this future.
        Fault::TimeoutAfter => std::future::pending().await,
        _ => Ok(stored_response(&stored, replayed)),
    }
}

/// The part of a request that must run to the end once started.
/// Returns the response and whether it is a replay.
async fn process<R: Make>(
    state: Arc<AppState>,
    key: String,
    request: R,
    claim: Claim,
    latency: Option<Duration>,
) -> Result<(StoredResponse, bool), ApiError> {
    if let Some(delay) = latency {
        tokio::time::sleep(delay).await;
    }
    match claim {
        Claim::Granted => {
            let mut books = state.ledger();
            let stored = request.make(&mut books, &key);
            books.finish(&key, stored.clone());
            drop(books);
            if matches!(R::ENDPOINT, Endpoint::Refunds | Endpoint::Charges) {
                // It may have made a pending refund, which the timer is to settle on time, or an
                // authorization the gateway is to change on its own.
                state.made.notify_one();
            }
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

/// `GET /v1/charges/{id}`: the charge as it is now (its refunds included).
async fn get_charge(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    match state.ledger().charge(&id) {
        Some(charge) => Ok(HttpResponse::Ok().json(charge)),
        None => Err(ApiError::NoSuchCharge(id.into_inner())),
    }
}

/// `GET /v1/refunds/{id}`: the refund as it is now.
async fn get_refund(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    match state.ledger().refund(&id) {
        Some(refund) => Ok(HttpResponse::Ok().json(refund)),
        None => Err(ApiError::NoSuchRefund(id.into_inner())),
    }
}

#[derive(Deserialize)]
struct ListQuery {
    idempotency_key: String,
}

#[derive(Serialize)]
struct List<T> {
    object: &'static str,
    data: Vec<T>,
}

/// `GET /v1/charges?idempotency_key=K`, answered from the charges themselves
/// so that it works after the idempotency cache has been forgotten.
async fn list_charges(state: web::Data<AppState>, query: web::Query<ListQuery>) -> HttpResponse {
    let mut ledger = state.ledger();
    ledger.count_look_up(Endpoint::Charges);
    HttpResponse::Ok().json(List { object: "list", data: ledger.charges_with_key(&query.idempotency_key) })
}

/// `GET /v1/refunds?idempotency_key=K`, from the refunds themselves, as for charges.
async fn list_refunds(state: web::Data<AppState>, query: web::Query<ListQuery>) -> HttpResponse {
    let mut ledger = state.ledger();
    ledger.count_look_up(Endpoint::Refunds);
    HttpResponse::Ok().json(List { object: "list", data: ledger.refunds_with_key(&query.idempotency_key) })
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
    state.books().forget_keys();
    HttpResponse::NoContent().finish()
}

/// `POST /_control/authorizations/expire`: every open authorization runs past its time now, as it
/// would days later, so that a test can see a capture refused for it.
async fn expire_authorizations(state: web::Data<AppState>) -> HttpResponse {
    let expired = state.ledger().expire_authorizations();
    HttpResponse::Ok().json(serde_json::json!({ "expired": expired }))
}

/// `GET /_control/authorizations/own-changes`: how the gateway changes authorizations on its own.
async fn show_own_changes(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(state.books().own_change_plan().view())
}

/// `POST /_control/authorizations/own-changes`: from now on, a share of the authorizations made
/// are captured or cancelled by the gateway itself, as its dashboard or another system would.
async fn plan_own_changes(
    state: web::Data<AppState>,
    spec: web::Json<OwnChangeSpec>,
) -> Result<HttpResponse, ApiError> {
    let plan = spec.into_inner().into_plan()?;
    state.books().plan_own_changes(plan);
    Ok(HttpResponse::Ok().json(plan.view()))
}

/// `DELETE /_control/authorizations/own-changes`: the authorizations made from now on are left to
/// the merchant (the changes drawn already are still made when due).
async fn stop_own_changes(state: web::Data<AppState>) -> HttpResponse {
    state.books().plan_own_changes(OwnChangePlan::default());
    HttpResponse::NoContent().finish()
}

/// `GET /_control/authorizations/own-changes/made`: every change the gateway made on its own, in
/// the order made: which charges a checker must not take for the merchant's doing.
async fn own_changes_made(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(List { object: "list", data: state.ledger().own_changes_made().to_vec() })
}

/// `POST /_control/refunds/settle`: every pending refund settles now, as it would have when its
/// time came, so that a test need not wait for it.
async fn settle_refunds(state: web::Data<AppState>) -> HttpResponse {
    let settled = state.ledger().settle_all();
    HttpResponse::Ok().json(serde_json::json!({ "settled": settled }))
}

/// What `GET /_control/stats` shows: the books' counters, then the events'.
#[derive(Serialize)]
struct AllStats {
    #[serde(flatten)]
    books: Stats,
    #[serde(flatten)]
    events: EventStats,
}

async fn stats(state: web::Data<AppState>) -> HttpResponse {
    let books = state.ledger().stats();
    HttpResponse::Ok().json(AllStats { books, events: state.outbox.stats() })
}

async fn show_event_plan(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(state.outbox.plan().view())
}

async fn set_event_plan(state: web::Data<AppState>, spec: web::Json<EventPlanSpec>) -> Result<HttpResponse, ApiError> {
    let plan = spec.into_inner().into_plan()?;
    state.outbox.set_plan(plan);
    Ok(HttpResponse::Ok().json(plan.view()))
}

async fn clear_event_plan(state: web::Data<AppState>) -> HttpResponse {
    state.outbox.set_plan(EventPlan::default());
    HttpResponse::NoContent().finish()
}

/// `GET /_control/events/sent`: every event sent, in the order first sent, with its copies,
/// attempts and acknowledgements: what a checker compares with what the receiver recorded.
async fn events_sent(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(List { object: "list", data: state.outbox.sent() })
}

async fn unknown_route(req: HttpRequest) -> HttpResponse {
    ApiError::NoRoute(req.method().clone(), req.path().to_owned()).error_response()
}

async fn method_not_allowed(req: HttpRequest) -> HttpResponse {
    ApiError::WrongMethod(req.method().clone(), req.path().to_owned()).error_response()
}
