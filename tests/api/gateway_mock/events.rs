//! The mock gateway's events over real HTTP, to a small receiver in the test that verifies every
//! signature with `signature::verify`, records what came, and answers as each test tells it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::TcpListener;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use payments_mock_gateway::{Controls, FaultPlan, MockGateway, Webhook};
use payments_service::gateway::signature::{self, SIGNATURE_HEADER, SignatureError, WebhookSecret};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::{Gw, body, json_of};
use crate::helpers::{GatewayControl, Process, TestApp, wait_for, wait_until};

/// How long a test waits for events that should come at once (or after a pending refund's 2 s).
const PATIENCE: Duration = Duration::from_secs(20);
/// The receiver's tolerance, as the service's default.
const TOLERANCE: Duration = Duration::from_secs(300);
const SECRET: &str = "whsec_test_secret";

/// How the receiver answers a request whose signature verifies (one that does not gets `400`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    Status(u16),
    /// Holds the request until the test releases it, then `200`.
    Hold,
}

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    at: Instant,
    content_type: Option<String>,
    header: String,
    raw: web::Bytes,
    event: Value,
    verified: Result<i64, SignatureError>,
    answer: Answer,
}

impl Received {
    fn id(&self) -> &str {
        self.event["id"].as_str().expect("an event id")
    }

    fn object_id(&self) -> &str {
        self.event["data"]["object"]["id"].as_str().expect("an object id")
    }
}

struct ReceiverState {
    secrets: Vec<WebhookSecret>,
    /// Answers for the next requests that verify, in order; `200` once it is empty.
    script: Mutex<VecDeque<Answer>>,
    got: Mutex<Vec<Received>>,
    release: Semaphore,
    /// Requests held right now (one whose client hung up is no longer held).
    held: AtomicUsize,
}

/// A webhook receiver at `url`, knowing `secrets`.
struct Receiver {
    url: reqwest::Url,
    state: web::Data<ReceiverState>,
    server: ServerHandle,
}

impl Receiver {
    fn start(secrets: &[&str], script: &[Answer]) -> Receiver {
        Receiver::start_on(TcpListener::bind("127.0.0.1:0").unwrap(), secrets, script)
    }

    fn start_on(listener: TcpListener, secrets: &[&str], script: &[Answer]) -> Receiver {
        let state = web::Data::new(ReceiverState {
            secrets: secrets.iter().map(|secret| WebhookSecret::new(*secret)).collect(),
            script: Mutex::new(script.iter().copied().collect()),
            got: Mutex::default(),
            release: Semaphore::new(0),
            held: AtomicUsize::new(0),
        });
        let url = format!("http://{}/webhooks/gateway", listener.local_addr().unwrap()).parse().unwrap();
        let data = state.clone();
        let server = HttpServer::new(move || {
            App::new().app_data(data.clone()).route("/webhooks/gateway", web::post().to(receive))
        })
        .listen(listener)
        .unwrap()
        .workers(1)
        .disable_signals()
        // A request whose client hangs up is dropped: it is no longer held.
        .h1_allow_half_closed(false)
        .shutdown_timeout(1)
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Receiver { url, state, server: handle }
    }

    fn received(&self) -> Vec<Received> {
        self.state.got.lock().unwrap().clone()
    }

    /// Waits until `count` requests have come, and returns them (all that came, in order).
    async fn wait_for_requests(&self, count: usize) -> Vec<Received> {
        wait_for(PATIENCE, &format!("{count} requests reach the receiver"), || async {
            let got = self.received();
            (got.len() >= count).then_some(got)
        })
        .await
    }

    fn held(&self) -> usize {
        self.state.held.load(Ordering::SeqCst)
    }

    fn release_all(&self) {
        self.state.release.add_permits(1_000);
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        drop(self.server.stop(false));
    }
}

/// Unix seconds now.
fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

async fn receive(state: web::Data<ReceiverState>, request: HttpRequest, raw: web::Bytes) -> HttpResponse {
    let header = request.headers().get(SIGNATURE_HEADER).map(|value| value.as_bytes().to_vec());
    let verified = signature::verify(header.as_deref(), &raw, &state.secrets, now(), TOLERANCE);
    let answer = match verified {
        Ok(_) => state.script.lock().unwrap().pop_front().unwrap_or(Answer::Status(200)),
        Err(_) => Answer::Status(400),
    };
    state.got.lock().unwrap().push(Received {
        at: Instant::now(),
        content_type: request.headers().get("content-type").map(|value| value.to_str().unwrap().to_owned()),
        header: String::from_utf8(header.unwrap_or_default()).unwrap(),
        event: serde_json::from_slice(&raw).unwrap_or(Value::Null),
        raw,
        verified,
        answer,
    });
    match answer {
        Answer::Status(status) => HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap()).finish(),
        Answer::Hold => {
            let _held = Held::new(&state.held);
            state.release.acquire().await.unwrap().forget();
            HttpResponse::Ok().finish()
        }
    }
}

/// Counts a request as held for as long as it lives.
struct Held<'a>(&'a AtomicUsize);

impl<'a> Held<'a> {
    fn new(held: &'a AtomicUsize) -> Held<'a> {
        held.fetch_add(1, Ordering::SeqCst);
        Held(held)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A gateway sending its events to `receiver`, signed under `secrets`, retried quickly (20 ms,
/// doubling to 200 ms) so that tests need not wait out the real backoff.
fn sending_to(receiver: &Receiver, secrets: &[&str]) -> Gw {
    sending_with(webhook_to(receiver, secrets))
}

fn webhook_to(receiver: &Receiver, secrets: &[&str]) -> Webhook {
    let secrets = secrets.iter().map(|secret| WebhookSecret::new(*secret)).collect();
    Webhook::new(receiver.url.clone(), secrets).retry(Duration::from_millis(20), Duration::from_millis(200))
}

fn sending_with(webhook: Webhook) -> Gw {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let gateway = MockGateway::start_with_events(listener, FaultPlan::none(), Controls::Served, webhook).unwrap();
    Gw { url: gateway.url(), gateway, client: Client::new() }
}

impl Gw {
    async fn event_plan(&self, plan: Value) -> (StatusCode, Value) {
        let response = self.client.post(format!("{}/_control/events", self.url)).json(&plan).send().await;
        json_of(response.expect("the plan answered")).await
    }

    async fn set_event_plan(&self, plan: Value) {
        let (status, shown) = self.event_plan(plan.clone()).await;
        assert_eq!(status, StatusCode::OK, "{plan}: {shown}");
    }

    /// `(events, events_sent, event_attempts, events_acknowledged)`.
    async fn event_stats(&self) -> (u64, u64, u64, u64) {
        let (_, stats) = self.get("/_control/stats").await;
        let count = |name: &str| stats[name].as_u64().unwrap_or_else(|| panic!("{name} in {stats}"));
        (count("events"), count("events_sent"), count("event_attempts"), count("events_acknowledged"))
    }

    /// Waits until the gateway counts `count` events acknowledged, and returns its event counters.
    async fn wait_for_acknowledged(&self, count: u64) -> (u64, u64, u64, u64) {
        wait_for(PATIENCE, &format!("{count} events acknowledged"), || async {
            let stats = self.event_stats().await;
            (stats.3 >= count).then_some(stats)
        })
        .await
    }

    /// `GET /_control/events/sent`: `(id, type, copies, attempts, acknowledged)` of each.
    async fn events_sent(&self) -> Vec<(String, String, u64, u64, u64)> {
        let (status, list) = self.get("/_control/events/sent").await;
        assert_eq!((status, &list["object"]), (StatusCode::OK, &json!("list")));
        let data = list["data"].as_array().expect("a list").iter();
        data.map(|sent| {
            let text = |name: &str| sent[name].as_str().unwrap().to_owned();
            let count = |name: &str| sent[name].as_u64().unwrap();
            (text("id"), text("type"), count("copies"), count("attempts"), count("acknowledged"))
        })
        .collect()
    }

    async fn paid(&self, key: &str, source: &str) -> Value {
        let (status, charge) = json_of(self.charge(key, &body(1000, source)).await).await;
        assert_eq!(status, StatusCode::OK, "{charge}");
        charge
    }

    async fn refund_made(&self, key: &str, charge: &Value, amount: Option<u64>) -> Value {
        let request = self.client.post(format!("{}/v1/refunds", self.url)).header("Idempotency-Key", key);
        let response = request.json(&json!({"charge": charge["id"], "amount": amount})).send().await.unwrap();
        let (status, refund) = json_of(response).await;
        assert_eq!(status, StatusCode::OK, "{refund}");
        refund
    }
}

#[tokio::test]
async fn every_change_to_the_books_is_sent_once_signed_with_the_object_as_it_was_then() {
    let receiver = Receiver::start(&[SECRET], &[]);
    let gw = sending_to(&receiver, &[SECRET]);

    let visa = gw.paid("c1", "tok_visa").await;
    let (status, declined) = json_of(gw.charge("c2", &body(700, "tok_chargeDeclined")).await).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED);
    let refund = gw.refund_made("r1", &visa, Some(100)).await;
    let pending = gw.paid("c3", "tok_refundPending").await;
    let fails = gw.paid("c4", "tok_refundFails").await;
    let settles = gw.refund_made("r2", &pending, None).await;
    let fails_later = gw.refund_made("r3", &fails, None).await;
    assert_eq!((&settles["status"], &fails_later["status"]), (&json!("pending"), &json!("pending")));

    // Nothing asks the gateway about the pending refunds: they settle, and are told of, by themselves.
    let got = receiver.wait_for_requests(7).await;

    let failed_charge = gw.get(&format!("/v1/charges/{}", declined["error"]["charge"].as_str().unwrap())).await.1;
    let settled = gw.get(&format!("/v1/refunds/{}", settles["id"].as_str().unwrap())).await.1;
    let failed_refund = gw.get(&format!("/v1/refunds/{}", fails_later["id"].as_str().unwrap())).await.1;
    assert_eq!(
        (&failed_charge["status"], &settled["status"], &failed_refund["status"]),
        (&json!("failed"), &json!("succeeded"), &json!("failed"))
    );
    let expected = [
        ("charge.succeeded", "c1", &visa),
        ("charge.failed", "c2", &failed_charge),
        ("refund.succeeded", "r1", &refund),
        ("charge.succeeded", "c3", &pending),
        ("charge.succeeded", "c4", &fails),
        ("refund.succeeded", "r2", &settled),
        ("refund.failed", "r3", &failed_refund),
    ];
    assert_eq!(got.len(), expected.len(), "each once: {got:?}");
    for (received, (kind, key, object)) in got.iter().zip(expected) {
        let event = &received.event;
        assert!(received.verified.is_ok(), "{received:?}");
        assert_eq!(received.header.matches("v1=").count(), 1, "one secret, one signature");
        assert_eq!(received.content_type.as_deref(), Some("application/json"));
        assert!(received.id().starts_with("evt_") && received.id().len() == 28, "{event}");
        assert!(event["created"].as_i64().is_some_and(|created| (now() - created).abs() < 60), "{event}");
        let shown = json!({"id": received.id(), "object": "event", "type": kind, "created": event["created"],
            "data": {"object": object}, "request": {"idempotency_key": key}});
        assert_eq!(event, &shown, "the {kind} of {key}");
    }
    let ids: HashSet<&str> = got.iter().map(Received::id).collect();
    assert_eq!(ids.len(), 7, "an id per event");

    let sent = gw.events_sent().await;
    let listed: Vec<(String, String, u64, u64, u64)> = got
        .iter()
        .map(|received| (received.id().to_owned(), received.event["type"].as_str().unwrap().to_owned(), 1, 1, 1))
        .collect();
    assert_eq!(sent, listed, "sent as they came, in order, each once and acknowledged");
    assert_eq!(gw.event_stats().await, (7, 7, 7, 7));
    gw.stop().await;
}

#[tokio::test]
async fn a_gateway_without_a_webhook_makes_no_events() {
    let gw = super::start().await;
    gw.paid("c1", "tok_visa").await;
    assert_eq!(gw.event_stats().await, (0, 0, 0, 0));
    assert!(gw.events_sent().await.is_empty());
    gw.stop().await;
}

#[tokio::test]
async fn a_duplicate_rate_of_one_sends_every_event_twice_as_two_deliveries() {
    let receiver = Receiver::start(&[SECRET], &[]);
    let gw = sending_to(&receiver, &[SECRET]);
    gw.set_event_plan(json!({"duplicate_rate": 1.0})).await;
    let charges = [gw.paid("c1", "tok_visa").await, gw.paid("c2", "tok_visa").await];

    let got = receiver.wait_for_requests(4).await;

    let mut copies: HashMap<&str, Vec<&Received>> = HashMap::new();
    for received in &got {
        copies.entry(received.id()).or_default().push(received);
    }
    assert_eq!(copies.len(), 2, "{got:?}");
    for charge in &charges {
        let of_charge: Vec<_> = got.iter().filter(|received| received.object_id() == charge["id"]).collect();
        assert_eq!(of_charge.len(), 2, "two deliveries of the event of {charge}");
        assert_eq!(of_charge[0].id(), of_charge[1].id(), "of one event");
        assert_eq!(of_charge[0].raw, of_charge[1].raw, "the same bytes");
        assert!(of_charge.iter().all(|received| received.verified.is_ok()));
    }
    assert_eq!(gw.wait_for_acknowledged(2).await, (2, 2, 4, 2));
    assert!(gw.events_sent().await.iter().all(|sent| (sent.2, sent.3) == (2, 2)));

    // Cleared: the next event goes once.
    let response = gw.client.delete(format!("{}/_control/events", gw.url)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let third = gw.paid("c3", "tok_visa").await;
    receiver.wait_for_requests(5).await;
    let sent = gw.events_sent().await;
    let last = sent.last().unwrap();
    assert_eq!((last.2, last.3), (1, 1), "one delivery, one attempt: {sent:?}");
    assert_eq!(receiver.received()[4].object_id(), third["id"]);
    gw.stop().await;
}

#[tokio::test]
async fn a_delay_holds_each_event_back_before_its_first_attempt() {
    const DELAY: Duration = Duration::from_millis(800);
    let receiver = Receiver::start(&[SECRET], &[]);
    let gw = sending_to(&receiver, &[SECRET]);
    gw.set_event_plan(json!({"delay_ms": DELAY.as_millis() as u64})).await;

    let asked = Instant::now();
    gw.paid("c1", "tok_visa").await;
    let got = receiver.wait_for_requests(1).await;

    // The event is made while the charge is: no earlier than the request was sent.
    assert!(got[0].at.duration_since(asked) >= DELAY, "came {:?} after the charge", got[0].at - asked);
    assert!(got[0].verified.is_ok(), "signed when sent, not when made");
    gw.stop().await;
}

#[tokio::test]
async fn shuffle_sends_a_burst_of_events_out_of_the_order_made() {
    let receiver = Receiver::start(&[SECRET], &[]);
    let gw = sending_to(&receiver, &[SECRET]);
    gw.set_event_plan(json!({"shuffle": true})).await;
    let mut made = Vec::new();
    for key in ["c1", "c2", "c3", "c4"] {
        made.push(gw.paid(key, "tok_visa").await["id"].as_str().unwrap().to_owned());
    }

    let got = receiver.wait_for_requests(4).await;

    let order: Vec<&str> = got.iter().map(Received::object_id).collect();
    assert_ne!(order, made, "out of order");
    let mut sorted = order.clone();
    sorted.sort();
    let mut all = made.iter().map(String::as_str).collect::<Vec<_>>();
    all.sort();
    assert_eq!(sorted, all, "every event, once");
    assert_eq!(gw.wait_for_acknowledged(4).await, (4, 4, 4, 4));
    gw.stop().await;
}

#[tokio::test]
async fn an_event_is_sent_again_until_acknowledged_signed_at_each_attempt() {
    let receiver = Receiver::start(&[SECRET], &[Answer::Status(500), Answer::Status(503)]);
    let gw = sending_to(&receiver, &[SECRET]);
    gw.paid("c1", "tok_visa").await;

    let got = receiver.wait_for_requests(3).await;

    assert_eq!(gw.wait_for_acknowledged(1).await, (1, 1, 3, 1));
    let answers: Vec<Answer> = got.iter().map(|received| received.answer).collect();
    assert_eq!(answers, [Answer::Status(500), Answer::Status(503), Answer::Status(200)]);
    assert!(got.iter().all(|received| received.verified.is_ok() && received.raw == got[0].raw), "{got:?}");
    let signed_at: Vec<i64> = got.iter().map(|received| *received.verified.as_ref().unwrap()).collect();
    assert!(signed_at.is_sorted(), "each attempt signed when made: {signed_at:?}");
    assert_eq!(gw.events_sent().await[0].3, 3, "three attempts");
    assert_eq!(receiver.received().len(), 3, "none after the 2xx");
    gw.stop().await;
}

#[tokio::test]
async fn an_attempt_not_answered_in_time_is_given_up_and_made_again() {
    let receiver = Receiver::start(&[SECRET], &[Answer::Hold]);
    let gw = sending_with(webhook_to(&receiver, &[SECRET]).attempt_timeout(Duration::from_millis(300)));
    gw.paid("c1", "tok_visa").await;

    assert_eq!(gw.wait_for_acknowledged(1).await, (1, 1, 2, 1));

    let answers: Vec<Answer> = receiver.received().iter().map(|received| received.answer).collect();
    assert_eq!(answers, [Answer::Hold, Answer::Status(200)], "held, given up, sent again");
    wait_until(PATIENCE, "the held attempt is let go", || async { receiver.held() == 0 }).await;
    gw.stop().await;
}

#[tokio::test]
async fn during_a_rotation_each_event_is_signed_under_every_secret() {
    let receiver = Receiver::start(&["whsec_new"], &[]);
    let gw = sending_to(&receiver, &["whsec_old", "whsec_new"]);
    gw.paid("c1", "tok_visa").await;

    let got = receiver.wait_for_requests(1).await;

    assert_eq!(got[0].header.matches("v1=").count(), 2, "{}", got[0].header);
    assert!(got[0].verified.is_ok(), "the receiver knows only the new secret");
    let old = [WebhookSecret::new("whsec_old")];
    assert!(signature::verify(Some(got[0].header.as_bytes()), &got[0].raw, &old, now(), TOLERANCE).is_ok());
    gw.stop().await;
}

#[tokio::test]
async fn a_receiver_that_hangs_holds_up_neither_the_answers_nor_the_events_after() {
    let receiver = Receiver::start(&[SECRET], &[Answer::Hold, Answer::Hold]);
    let gw = sending_to(&receiver, &[SECRET]);

    gw.paid("c1", "tok_visa").await;
    gw.paid("c2", "tok_visa").await;
    receiver.wait_for_requests(2).await;

    assert_eq!(receiver.held(), 2, "both answers came while both events were on their way");
    assert_eq!(gw.event_stats().await, (2, 2, 2, 0));
    receiver.release_all();
    assert_eq!(gw.wait_for_acknowledged(2).await, (2, 2, 2, 2));
    gw.stop().await;
}

#[tokio::test]
async fn the_event_plan_is_checked_shown_and_cleared() {
    let gw = super::start().await;
    let (status, plan) = gw.get("/_control/events").await;
    assert_eq!((status, plan), (StatusCode::OK, json!({"duplicate_rate": 0.0, "delay_ms": 0, "shuffle": false})));
    for bad in [
        json!({"duplicate_rate": 1.5}),
        json!({"delay_ms": -1}),
        json!({"delay_ms": 3_600_001}),
        json!({"shuffle": "yes"}),
        json!({"duplicates": 1}),
    ] {
        let (status, error) = gw.event_plan(bad.clone()).await;
        assert_eq!(
            (status, &error["error"]["type"]),
            (StatusCode::BAD_REQUEST, &json!("invalid_request_error")),
            "{bad}"
        );
    }
    let set = json!({"duplicate_rate": 0.25, "delay_ms": 50, "shuffle": true});
    assert_eq!(gw.event_plan(set.clone()).await, (StatusCode::OK, set.clone()));
    assert_eq!(gw.get("/_control/events").await.1, set);
    let response = gw.client.delete(format!("{}/_control/events", gw.url)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(gw.get("/_control/events").await.1["duplicate_rate"], 0.0);
    gw.stop().await;
}

#[tokio::test]
async fn an_app_hears_from_its_own_mock_and_records_each_event_sent_once() {
    #[derive(diesel::QueryableByName)]
    struct Recorded {
        #[diesel(sql_type = diesel::sql_types::Text)]
        event_id: String,
    }
    let app = TestApp::builder().gateway_events().spawn().await;
    app.gateway.event_plan(json!({"duplicate_rate": 1.0, "shuffle": true})).await;
    for _ in 0..3 {
        app.paid(1000, "tok_visa").await;
    }

    wait_until(PATIENCE, "three events acknowledged", || async { app.gateway.event_stats().await.3 == 3 }).await;

    let sent: HashSet<String> = app.gateway.event_ids_sent().await.into_iter().collect();
    let rows: Vec<Recorded> =
        diesel_async::RunQueryDsl::load(diesel::sql_query("SELECT event_id FROM gateway_events"), &mut app.db().await)
            .await
            .unwrap();
    assert_eq!(rows.len(), 3, "a row per event, though each came twice");
    assert_eq!(rows.into_iter().map(|row| row.event_id).collect::<HashSet<_>>(), sent);
}

#[tokio::test]
async fn payments_gateway_sends_its_events_where_told_signed_under_the_secrets_it_never_prints() {
    let receiver = Receiver::start(&["whsec_second"], &[]);
    let url = receiver.url.to_string();
    let args = ["gateway", "--bind", "127.0.0.1:0", "--events-url", url.as_str(), "--webhook-secret", "whsec_first"];
    let env = [("PAYMENTS_GATEWAY_WEBHOOK_SECRETS", "x"), ("RUST_LOG", "debug")];
    // The flag wins over the variable, as for every setting; repeated, it signs under each.
    let mut gateway = Process::start(
        &[&args[..], &["--webhook-secret", "whsec_second"]].concat(),
        &env,
        "payments gateway listening on",
    )
    .await;
    let charged = Client::new()
        .post(format!("{}/v1/charges", gateway.url))
        .header("Idempotency-Key", "k")
        .json(&body(500, "tok_visa"))
        .send()
        .await
        .unwrap();
    assert_eq!(charged.status(), StatusCode::OK);

    let got = receiver.wait_for_requests(1).await;

    assert_eq!(got[0].header.matches("v1=").count(), 2);
    assert!(got[0].verified.is_ok(), "{:?}", got[0]);
    assert_eq!(gateway.stdout.borrow()[0], format!("events: to {url}, each signed under 2 secrets"));
    gateway.signal(nix::sys::signal::Signal::SIGTERM);
    let printed = [gateway.logs().await, gateway.stdout.borrow().clone()].concat();
    assert!(!printed.iter().any(|line| line.contains("whsec_")), "{printed:?}");

    let unsigned = tokio::process::Command::new(env!("CARGO_BIN_EXE_payments"))
        .args(&args[..5])
        .env_remove("PAYMENTS_GATEWAY_WEBHOOK_SECRETS")
        .output()
        .await
        .unwrap();
    assert!(!unsigned.status.success());
    assert!(String::from_utf8_lossy(&unsigned.stderr).contains("--events-url needs a secret"));
}

#[tokio::test]
async fn a_gateway_whose_receiver_is_down_says_so_once_keeps_trying_and_says_when_it_is_back() {
    // A port nothing listens on, for now.
    let address = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let url = format!("http://{address}/webhooks/gateway");
    let args = ["gateway", "--bind", "127.0.0.1:0", "--control", "--events-url", &url, "--webhook-secret", SECRET];
    let mut gateway = Process::start(&args, &[], "payments gateway listening on").await;
    let control = GatewayControl::new(&gateway.url);
    for key in ["c1", "c2", "c3"] {
        let charged = Client::new()
            .post(format!("{}/v1/charges", gateway.url))
            .header("Idempotency-Key", key)
            .json(&body(500, "tok_visa"))
            .send()
            .await
            .unwrap();
        assert_eq!(charged.status(), StatusCode::OK);
    }
    wait_until(PATIENCE, "every event is tried three times", || async { control.event_stats().await.2 >= 9 }).await;

    let receiver = Receiver::start_on(TcpListener::bind(address).unwrap(), &[SECRET], &[]);

    wait_until(PATIENCE, "every event is acknowledged", || async { control.event_stats().await.3 == 3 }).await;
    assert_eq!(receiver.received().iter().map(Received::id).collect::<HashSet<_>>().len(), 3);
    gateway.signal(nix::sys::signal::Signal::SIGTERM);
    let logs = gateway.logs().await;
    let lines = |text: &str| logs.iter().filter(|line| line.contains(text)).count();
    assert_eq!(lines("the gateway's events are not acknowledged"), 1, "{logs:#?}");
    assert_eq!(lines("WARN"), 1, "{logs:#?}");
    assert_eq!(lines("the gateway's events are acknowledged again"), 1, "{logs:#?}");
}
