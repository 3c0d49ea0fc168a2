//! Talking to the mock gateway's control endpoints (in-process or a process of its own).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Semaphore;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// A wiremock answer to a charge request: a charge of its own per idempotency key (as a real
/// gateway makes), after `delay`.
pub struct ChargePerKey {
    pub delay: std::time::Duration,
}

impl Respond for ChargePerKey {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let key = request.headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default();
        let id = format!("ch_{}", key.replace(':', "_"));
        ResponseTemplate::new(200).set_body_json(json!({ "id": id })).set_delay(self.delay)
    }
}

/// A wiremock gateway's look-up by key, finding no charge: what a resumed key asks first.
pub async fn mount_no_charges_found(gateway: &MockServer) {
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({ "object": "list", "data": [] })))
        .mount(gateway)
        .await;
}

/// The mock's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct GatewayStats {
    pub charges: u64,
    pub declined: u64,
    pub requests: u64,
    pub look_ups: u64,
    pub faults: u64,
}

pub struct GatewayControl {
    url: String,
    http: reqwest::Client,
}

impl GatewayControl {
    pub fn new(url: &str) -> GatewayControl {
        GatewayControl { url: url.trim_end_matches('/').to_owned(), http: reqwest::Client::new() }
    }

    pub async fn stats(&self) -> GatewayStats {
        let response = self.http.get(format!("{}/_control/stats", self.url)).send().await.expect("gateway stats");
        response.json().await.expect("gateway stats body")
    }

    /// Every counter of the mock, refunds' included, as it sends them.
    pub async fn all_stats(&self) -> Value {
        let response = self.http.get(format!("{}/_control/stats", self.url)).send().await.expect("gateway stats");
        response.json().await.expect("gateway stats body")
    }

    /// The mock's event counters: `(events, events_sent, event_attempts, events_acknowledged)`.
    pub async fn event_stats(&self) -> (u64, u64, u64, u64) {
        let stats = self.all_stats().await;
        let count = |name: &str| stats[name].as_u64().unwrap_or_else(|| panic!("{name} in {stats}"));
        (count("events"), count("events_sent"), count("event_attempts"), count("events_acknowledged"))
    }

    /// Sets how the mock misdelivers its events from now on (`POST /_control/events`).
    pub async fn event_plan(&self, plan: Value) {
        let response = self.http.post(format!("{}/_control/events", self.url)).json(&plan).send().await.unwrap();
        assert!(response.status().is_success(), "setting the event plan {plan}: {}", response.status());
    }

    /// The ids of the events the mock sent, in the order first sent (`GET /_control/events/sent`).
    pub async fn event_ids_sent(&self) -> Vec<String> {
        let response = self.http.get(format!("{}/_control/events/sent", self.url)).send().await.unwrap();
        let list: Value = response.json().await.unwrap();
        let data = list["data"].as_array().expect("a list of events sent");
        data.iter().map(|sent| sent["id"].as_str().unwrap().to_owned()).collect()
    }

    /// Applies `mode` to the next `count` charge requests.
    pub async fn fault(&self, mode: &str, count: u64) {
        self.faults(json!({ "mode": mode, "count": count })).await;
    }

    pub async fn faults(&self, plan: Value) {
        let response = self.http.post(format!("{}/_control/faults", self.url)).json(&plan).send().await.unwrap();
        assert!(response.status().is_success(), "setting faults {plan}: {}", response.status());
    }

    /// Clears the faults planned (`DELETE /_control/faults`).
    pub async fn clear_faults(&self) {
        let response = self.http.delete(format!("{}/_control/faults", self.url)).send().await.unwrap();
        assert!(response.status().is_success());
    }

    /// Makes the gateway forget every idempotency key (its charges stay, findable by key).
    pub async fn forget_keys(&self) {
        let response = self.http.delete(format!("{}/_control/idempotency-keys", self.url)).send().await.unwrap();
        assert!(response.status().is_success());
    }

    /// The charge the gateway holds by this id, as it stands now.
    pub async fn charge(&self, id: &str) -> Value {
        let response = self.http.get(format!("{}/v1/charges/{id}", self.url)).send().await.unwrap();
        assert!(response.status().is_success(), "GET /v1/charges/{id}: {}", response.status());
        response.json().await.unwrap()
    }

    /// Cancels an authorization at the gateway itself, as someone using the gateway's own
    /// dashboard would: the service is not told, but for the event.
    pub async fn cancel_charge(&self, id: &str) {
        self.change_charge(id, "cancel", json!({})).await;
    }

    /// Captures `amount` of an authorization at the gateway itself.
    pub async fn capture_charge(&self, id: &str, amount: i64) {
        self.change_charge(id, "capture", json!({ "amount": amount })).await;
    }

    async fn change_charge(&self, id: &str, change: &str, body: Value) {
        let url = format!("{}/v1/charges/{id}/{change}", self.url);
        let request = self.http.post(url).header("Idempotency-Key", uuid::Uuid::new_v4().to_string());
        let response = request.json(&body).send().await.unwrap();
        assert!(response.status().is_success(), "{change} {id}: {}", response.status());
    }

    /// The charges the gateway holds for one downstream key.
    pub async fn charges_for(&self, downstream_key: &str) -> Vec<Value> {
        self.made_with("charges", downstream_key).await
    }

    /// The refunds the gateway holds for one downstream key, as they stand now.
    pub async fn refunds_for(&self, downstream_key: &str) -> Vec<Value> {
        self.made_with("refunds", downstream_key).await
    }

    async fn made_with(&self, what: &str, downstream_key: &str) -> Vec<Value> {
        let mut url = reqwest::Url::parse(&format!("{}/v1/{what}", self.url)).unwrap();
        url.query_pairs_mut().append_pair("idempotency_key", downstream_key);
        let response = self.http.get(url).send().await.unwrap();
        let list: Value = response.json().await.unwrap();
        list["data"].as_array().cloned().unwrap_or_default()
    }

    /// Settles every pending refund now (`tok_refundPending`: succeeded, `tok_refundFails`:
    /// failed), instead of about 2 s after it was made; returns how many were still pending.
    pub async fn settle_refunds(&self) -> u64 {
        let response = self.http.post(format!("{}/_control/refunds/settle", self.url)).send().await.unwrap();
        assert!(response.status().is_success());
        let settled: Value = response.json().await.unwrap();
        settled["settled"].as_u64().expect("a count")
    }
}

/// A charge as a gateway's look-up lists it: made under `downstream_key` for the usual payment
/// body (1000 usd), with `fields` (`id`, `status`, ...) on top.
pub fn listed_charge(downstream_key: &str, fields: Value) -> Value {
    let mut charge = json!({ "idempotency_key": downstream_key, "amount": 1000, "currency": "usd" });
    charge.as_object_mut().unwrap().extend(fields.as_object().cloned().unwrap_or_default());
    charge
}

/// The charge requests and look-ups a wiremock gateway received (not its identity look-ups).
pub async fn charge_requests(gateway: &MockServer) -> Vec<Request> {
    let requests = gateway.received_requests().await.unwrap_or_default();
    // The process asks who answers with a look-up of a key nobody uses: a question about the
    // gateway, as `GET /v1/account` is, not about a charge.
    let about_a_charge = |request: &Request| {
        request.url.path().starts_with("/v1/charges")
            && !request
                .url
                .query_pairs()
                .any(|(name, value)| name == "idempotency_key" && value == "payments:who-answers")
    };
    requests.into_iter().filter(about_a_charge).collect()
}

/// A proxy in front of a gateway that passes only its charge routes (`/v1/charges...`) and
/// answers everything else `404` itself, without the gateway's identity: as a proxy configured
/// for charges alone would. The gateway's identity look-up (`GET /v1/account`) never reaches it.
pub struct ChargesOnlyProxy {
    pub url: String,
    server: actix_web::dev::ServerHandle,
}

impl ChargesOnlyProxy {
    pub fn start(upstream: &str) -> ChargesOnlyProxy {
        use actix_web::{App, HttpServer, web};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let upstream = upstream.trim_end_matches('/').to_owned();
        let http = reqwest::Client::new();
        let server = HttpServer::new(move || {
            let (upstream, http) = (upstream.clone(), http.clone());
            App::new().default_service(web::to(move |request: actix_web::HttpRequest, body: web::Bytes| {
                let (upstream, http) = (upstream.clone(), http.clone());
                async move {
                    if !request.path().starts_with("/v1/charges") {
                        return actix_web::HttpResponse::NotFound().finish();
                    }
                    forward(upstream, http, request, body).await
                }
            }))
        })
        .listen(listener)
        .unwrap()
        .workers(1)
        .disable_signals()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        ChargesOnlyProxy { url, server: handle }
    }
}

impl Drop for ChargesOnlyProxy {
    fn drop(&mut self) {
        drop(self.server.stop(false));
    }
}

/// A proxy in front of a gateway that holds every request (or every one [`HeldProxy::holding`]
/// picks) until the test lets one through: a test can tell that a gateway call is under way
/// ([`HeldProxy::received`]) and choose when it is answered ([`HeldProxy::release`]), with what the
/// gateway says then.
pub struct HeldProxy {
    pub url: String,
    received: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
    server: actix_web::dev::ServerHandle,
}

impl HeldProxy {
    pub fn start(upstream: &str) -> HeldProxy {
        HeldProxy::holding(upstream, |_| true)
    }

    /// A proxy that holds the requests `held` picks, and passes the others on at once.
    pub fn holding(upstream: &str, held: fn(&actix_web::HttpRequest) -> bool) -> HeldProxy {
        use actix_web::{App, HttpServer, web};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let upstream = upstream.trim_end_matches('/').to_owned();
        let (received, gate) = (Arc::new(AtomicUsize::new(0)), Arc::new(Semaphore::new(0)));
        let http = reqwest::Client::new();
        let (counted, gated) = (received.clone(), gate.clone());
        let server = HttpServer::new(move || {
            let (upstream, http, counted, gated) = (upstream.clone(), http.clone(), counted.clone(), gated.clone());
            App::new().default_service(web::to(move |request: actix_web::HttpRequest, body: web::Bytes| {
                let (upstream, http, counted, gated) = (upstream.clone(), http.clone(), counted.clone(), gated.clone());
                async move {
                    if held(&request) {
                        counted.fetch_add(1, Ordering::SeqCst);
                        gated.acquire().await.unwrap().forget();
                    }
                    forward(upstream, http, request, body).await
                }
            }))
        })
        .listen(listener)
        .unwrap()
        .workers(1)
        .disable_signals()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        HeldProxy { url, received, gate, server: handle }
    }

    /// Picks a capture's or a cancel's request: what [`HeldProxy::holding`] holds to keep a change
    /// of a payment in flight.
    pub fn changes(request: &actix_web::HttpRequest) -> bool {
        request.method() == actix_web::http::Method::POST
            && (request.path().ends_with("/capture") || request.path().ends_with("/cancel"))
    }

    /// Picks a charge request (not a look-up).
    pub fn charges(request: &actix_web::HttpRequest) -> bool {
        request.method() == actix_web::http::Method::POST && request.path() == "/v1/charges"
    }

    /// Requests held back that reached the proxy so far (held or let through).
    pub fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }

    /// Lets `requests` held (or yet to come) through to the gateway.
    pub fn release(&self, requests: usize) {
        self.gate.add_permits(requests);
    }

    /// Sends `requests` at once (each yielding its answer's status) and holds whatever gateway call
    /// they make until every request has been answered or has its call held here: the calls
    /// that reached the gateway then are the race's, all at once, and the answers given meanwhile
    /// were decided while those calls were in flight. Then lets the held calls through, and waits
    /// for the rest of the answers.
    pub async fn race<F: Future<Output = u16>>(&self, requests: Vec<F>) -> HeldRace {
        let (before, total) = (self.received(), requests.len());
        let answers = std::sync::Mutex::new(vec![None; total]);
        let racing = futures_util::future::join_all(requests.into_iter().enumerate().map(|(n, request)| {
            let answers = &answers;
            async move {
                let status = request.await;
                answers.lock().unwrap()[n] = Some(status);
            }
        }));
        let held = || self.received() - before;
        let answered = || answers.lock().unwrap().iter().flatten().count();
        let hold = async {
            let all_there = || async { answered() + held() == total };
            super::wait_until(Duration::from_secs(60), "every request answered or its gateway call held", all_there)
                .await;
            let meanwhile = answers.lock().unwrap().clone();
            self.release(held());
            (held(), meanwhile)
        };
        let (_, (calls, meanwhile)) = tokio::join!(racing, hold);
        let statuses = answers.into_inner().unwrap().into_iter().map(|status| status.unwrap()).collect();
        HeldRace { calls, while_held: meanwhile.into_iter().flatten().collect(), statuses }
    }
}

/// What a [`HeldProxy::race`] came to.
#[derive(Debug)]
pub struct HeldRace {
    /// The gateway calls the race made, all held at once.
    pub calls: usize,
    /// The statuses answered while those calls were held, in no particular order.
    pub while_held: Vec<u16>,
    /// Every request's status, in the order sent.
    pub statuses: Vec<u16>,
}

impl Drop for HeldProxy {
    fn drop(&mut self) {
        drop(self.server.stop(false));
    }
}

/// Sends a request on to `upstream` as it came, and its answer back as it came.
async fn forward(
    upstream: String,
    http: reqwest::Client,
    request: actix_web::HttpRequest,
    body: actix_web::web::Bytes,
) -> actix_web::HttpResponse {
    use actix_web::HttpResponse;
    let url = format!("{upstream}{}", request.uri().path_and_query().map_or("/", |p| p.as_str()));
    let method = reqwest::Method::from_bytes(request.method().as_str().as_bytes()).unwrap();
    let mut outgoing = http.request(method, url).body(body.to_vec());
    for (name, value) in request.headers() {
        if !matches!(name.as_str(), "host" | "content-length" | "connection") {
            outgoing = outgoing.header(name.as_str(), value.as_bytes());
        }
    }
    let Ok(answer) = outgoing.send().await else {
        return HttpResponse::BadGateway().finish();
    };
    let mut response = HttpResponse::build(actix_web::http::StatusCode::from_u16(answer.status().as_u16()).unwrap());
    for (name, value) in answer.headers() {
        if !matches!(name.as_str(), "content-length" | "transfer-encoding" | "connection") {
            response.insert_header((name.as_str(), value.as_bytes()));
        }
    }
    response.body(answer.bytes().await.unwrap_or_default())
}
