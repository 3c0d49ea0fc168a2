//! The mock gateway over real HTTP: a `MockGateway` on port 0 per test,
//! driven with reqwest.

mod captures;
mod events;
mod refunds;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use payments_mock_gateway::{Controls, FaultPlan, MockGateway};
use reqwest::{Client, Response, StatusCode};
use serde_json::{Value, json};

use crate::helpers::wait_until;

/// How long a client that must give up waits before it does.
const SHORT_TIMEOUT: Duration = Duration::from_millis(200);

struct Gw {
    gateway: MockGateway,
    url: String,
    client: Client,
}

async fn start() -> Gw {
    start_with(FaultPlan::none()).await
}

async fn start_with(faults: FaultPlan) -> Gw {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    let gateway = MockGateway::start(listener, faults, Controls::Served).expect("gateway starts");
    let url = gateway.url();
    assert_eq!(url, format!("http://{}", gateway.addr()));
    Gw { gateway, url, client: Client::new() }
}

fn body(amount: u64, source: &str) -> Value {
    json!({"amount": amount, "currency": "USD", "source": source})
}

fn impatient_client() -> Client {
    Client::builder().timeout(SHORT_TIMEOUT).build().expect("client builds")
}

impl Gw {
    async fn charge(&self, key: &str, body: &Value) -> Response {
        self.charge_with(&self.client, key, body).await.expect("charge answered")
    }

    async fn charge_with(&self, client: &Client, key: &str, body: &Value) -> reqwest::Result<Response> {
        let url = format!("{}/v1/charges", self.url);
        let request = client.post(url).header("Idempotency-Key", key).json(body);
        request.send().await
    }

    async fn charge_raw(&self, key: &str, body: &'static str) -> Response {
        let url = format!("{}/v1/charges", self.url);
        let request = self.client.post(url).header("Idempotency-Key", key);
        let request = request.header("Content-Type", "application/json").body(body);
        request.send().await.expect("charge answered")
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self.client.get(format!("{}{path}", self.url)).send().await;
        json_of(response.expect("GET answered")).await
    }

    async fn set_faults(&self, spec: Value) {
        let url = format!("{}/_control/faults", self.url);
        let response = self.client.post(url).json(&spec).send().await;
        assert_eq!(response.expect("faults set").status(), StatusCode::OK, "{spec}");
    }

    async fn delete(&self, path: &str) -> StatusCode {
        let response = self.client.delete(format!("{}{path}", self.url)).send().await;
        response.expect("DELETE answered").status()
    }

    async fn charges_with_key(&self, key: &str) -> Vec<Value> {
        let (status, list) = self.get(&format!("/v1/charges?idempotency_key={key}")).await;
        assert_eq!((status, &list["object"]), (StatusCode::OK, &json!("list")));
        list["data"].as_array().expect("data is an array").clone()
    }

    async fn stats(&self) -> (u64, u64, u64) {
        let (_, stats) = self.get("/_control/stats").await;
        let count = |name: &str| stats[name].as_u64().expect("a count");
        (count("charges"), count("declined"), count("requests"))
    }

    /// Charge requests that were given a failure.
    async fn faults(&self) -> u64 {
        let (_, stats) = self.get("/_control/stats").await;
        stats["faults"].as_u64().expect("a count")
    }

    async fn stop(self) {
        // Close the pooled connections first so shutdown need not wait on them.
        drop(self.client);
        self.gateway.stop().await;
    }
}

/// Status and JSON body, checking that the body is JSON.
async fn json_of(response: Response) -> (StatusCode, Value) {
    let status = response.status();
    let content_type = response.headers().get("content-type").cloned();
    assert_eq!(content_type.expect("a content type"), "application/json");
    (status, response.json().await.expect("a JSON body"))
}

fn replayed(response: &Response) -> bool {
    response.headers().get("Idempotent-Replayed").is_some_and(|v| v == "true")
}

#[tokio::test]
async fn a_charge_succeeds() {
    let gw = start().await;
    let request = json!({"amount": 1234, "currency": "EUR", "source": "tok_visa",
        "description": "tea", "metadata": {"order": "42"}});
    let response = gw.charge("key-1", &request).await;
    assert!(!replayed(&response));
    let (status, charge) = json_of(response).await;
    assert_eq!(status, StatusCode::OK);
    let id = charge["id"].as_str().expect("an id");
    assert!(id.starts_with("ch_") && id.len() == 27, "{id}");
    assert!(id[3..].chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
    assert!(charge["created"].as_u64().is_some_and(|t| t > 1_600_000_000));
    let expected = json!({"id": id, "object": "charge", "amount": 1234, "amount_captured": 1234,
        "amount_refunded": 0, "captured": true, "currency": "eur", "description": "tea", "metadata": {"order": "42"},
        "refunded": false, "status": "succeeded", "idempotency_key": "key-1", "created": charge["created"]});
    assert_eq!(charge, expected);

    let (_, bare) = json_of(gw.charge("key-2", &body(5, "tok_visa")).await).await;
    assert_eq!((&bare["description"], &bare["metadata"]), (&Value::Null, &json!({})));
    gw.stop().await;
}

#[tokio::test]
async fn a_declined_card_is_402_and_keeps_a_failed_charge() {
    let gw = start().await;
    let (status, error) = json_of(gw.charge("k", &body(5, "tok_chargeDeclined")).await).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED);
    let id = error["error"]["charge"].as_str().expect("the failed charge's id").to_owned();
    let declined = json!({"error": {"type": "card_error", "code": "card_declined",
        "message": "Your card was declined.", "charge": id}});
    assert_eq!(error, declined);

    let (status, failed) = gw.get(&format!("/v1/charges/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    let expected = json!({"id": id, "object": "charge", "amount": 5, "amount_captured": 0, "amount_refunded": 0,
        "captured": false, "currency": "usd", "description": null, "metadata": {}, "refunded": false,
        "status": "failed", "failure_code": "card_declined", "failure_message": "Your card was declined.",
        "idempotency_key": "k", "created": failed["created"]});
    assert_eq!(failed, expected);
    assert_eq!(gw.charges_with_key("k").await, vec![failed]);
    assert_eq!(gw.stats().await, (0, 1, 1), "no charge made, one decline");
    gw.stop().await;
}

#[tokio::test]
async fn a_source_that_is_no_token_is_400_and_not_remembered() {
    let gw = start().await;
    let (status, error) = json_of(gw.charge("k", &body(5, "card_123")).await).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert_eq!(error["error"]["code"], "resource_missing");
    assert!(error["error"]["message"].as_str().is_some_and(|m| m.starts_with("No such token")));
    // Not stored under the key: the same key with another body still charges.
    let response = gw.charge("k", &body(5, "tok_visa")).await;
    assert_eq!((response.status(), replayed(&response)), (StatusCode::OK, false));
    gw.stop().await;
}

#[tokio::test]
async fn a_missing_idempotency_key_is_400() {
    let gw = start().await;
    let url = format!("{}/v1/charges", gw.url);
    let response = gw.client.post(url).json(&body(5, "tok_visa")).send().await;
    let (status, error) = json_of(response.expect("answered")).await;
    assert_eq!((status, &error["error"]["type"]), (StatusCode::BAD_REQUEST, &json!("invalid_request_error")));
    assert_eq!(gw.stats().await.0, 0);
    gw.stop().await;
}

#[tokio::test]
async fn a_retry_replays_byte_for_byte() {
    let gw = start().await;
    for source in ["tok_visa", "tok_chargeDeclined"] {
        let first = gw.charge(source, &body(5, source)).await;
        let (status, first_bytes) = (first.status(), first.bytes().await.expect("a body"));
        let again = gw.charge(source, &body(5, source)).await;
        assert!(replayed(&again));
        assert_eq!(again.status(), status);
        assert_eq!(again.bytes().await.expect("a body"), first_bytes);
    }
    assert_eq!(gw.stats().await, (1, 1, 4));
    gw.stop().await;
}

#[tokio::test]
async fn reordered_json_is_the_same_body() {
    let gw = start().await;
    let first =
        gw.charge_raw("k", r#"{"amount":7,"currency":"usd","source":"tok_visa","metadata":{"a":"1","b":"2"}}"#).await;
    let first_bytes = first.bytes().await.expect("a body");
    let again = gw
        .charge_raw(
            "k",
            r#"{ "metadata": {"b": "2", "a": "1"}, "source": "tok_visa", "currency": "usd", "amount": 7 }"#,
        )
        .await;
    assert!(replayed(&again));
    assert_eq!(again.bytes().await.expect("a body"), first_bytes);
    gw.stop().await;
}

#[tokio::test]
async fn the_same_key_with_another_body_is_refused() {
    let gw = start().await;
    assert_eq!(gw.charge("k", &body(5, "tok_visa")).await.status(), StatusCode::OK);
    let (status, error) = json_of(gw.charge("k", &body(6, "tok_visa")).await).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error["error"]["type"], "idempotency_error");
    assert!(error["error"].get("code").is_none());
    assert_eq!(gw.charges_with_key("k").await.len(), 1);
    gw.stop().await;
}

// Also runs the gateway from a multi-thread runtime, as the service does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_use_is_409_and_charges_once() {
    let gw = start().await;
    gw.set_faults(json!({"mode": "latency", "latency_ms": 1000})).await;
    let slow = tokio::spawn({
        let (client, url) = (gw.client.clone(), format!("{}/v1/charges", gw.url));
        let request = client.post(url).header("Idempotency-Key", "k").json(&body(5, "tok_visa"));
        request.send()
    });
    // The key is claimed in the same step that counts the request.
    wait_until(Duration::from_secs(5), "the first request arrives", || async { gw.stats().await.2 == 1 }).await;
    let (status, error) = json_of(gw.charge("k", &body(5, "tok_visa")).await).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(error["error"]["type"], "idempotency_error");
    assert_eq!(error["error"]["code"], "idempotency_key_in_use");

    let first = slow.await.expect("task ran").expect("first answered");
    let (status, charge) = json_of(first).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(gw.charges_with_key("k").await, vec![charge]);
    assert_eq!(gw.stats().await.0, 1);
    gw.stop().await;
}

#[tokio::test]
async fn error_before_processes_nothing() {
    let gw = start().await;
    gw.set_faults(json!({"mode": "error_before"})).await;
    let (status, error) = json_of(gw.charge("k", &body(5, "tok_visa")).await).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let expected = json!({"error": {"type": "api_error", "message": "injected fault: error_before"}});
    assert_eq!(error, expected);
    assert!(gw.charges_with_key("k").await.is_empty());
    // The retry is the first real attempt.
    let retry = gw.charge("k", &body(5, "tok_visa")).await;
    assert_eq!((retry.status(), replayed(&retry)), (StatusCode::OK, false));
    assert_eq!(gw.stats().await, (1, 0, 2));
    assert_eq!(gw.faults().await, 1);
    gw.stop().await;
}

/// After a fault that struck once the charge was made, key `k` holds one charge, and a retry
/// gets exactly that charge back.
async fn assert_the_retry_replays_the_one_charge(gw: &Gw) {
    let made = gw.charges_with_key("k").await;
    assert_eq!(made.len(), 1);
    let retry = gw.charge("k", &body(5, "tok_visa")).await;
    assert!(replayed(&retry));
    assert_eq!(json_of(retry).await, (StatusCode::OK, made[0].clone()));
}

#[tokio::test]
async fn error_after_charges_then_fails_and_the_retry_replays() {
    let gw = start().await;
    gw.set_faults(json!({"mode": "error_after"})).await;
    let (status, error) = json_of(gw.charge("k", &body(5, "tok_visa")).await).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(error["error"]["message"], "injected fault: error_after");
    assert_the_retry_replays_the_one_charge(&gw).await;
    gw.stop().await;
}

#[tokio::test]
async fn timeout_after_charges_then_hangs_and_the_retry_replays() {
    let gw = start().await;
    gw.set_faults(json!({"mode": "timeout_after"})).await;
    let err = gw.charge_with(&impatient_client(), "k", &body(5, "tok_visa")).await;
    assert!(err.expect_err("no answer").is_timeout());
    assert_the_retry_replays_the_one_charge(&gw).await;
    gw.stop().await;
}

#[tokio::test]
async fn latency_delays_the_charge() {
    let gw = start().await;
    gw.set_faults(json!({"mode": "latency", "latency_ms": 300})).await;
    let started = Instant::now();
    let response = gw.charge("k", &body(5, "tok_visa")).await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!((response.status(), replayed(&response)), (StatusCode::OK, false));
    // Used up: the next request is fast again.
    let (_, plan) = gw.get("/_control/faults").await;
    assert_eq!(plan["mode"], "none");
    gw.stop().await;
}

#[tokio::test]
async fn random_faults_never_charge_twice_for_one_key() {
    let gw = start().await;
    gw.set_faults(json!({"mode": "random", "rate": 1.0, "count": 12})).await;
    let client = impatient_client();
    for _ in 0..12 {
        match gw.charge_with(&client, "k", &body(5, "tok_visa")).await {
            Ok(response) => assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR),
            Err(err) => assert!(err.is_timeout(), "{err}"),
        }
    }
    // The plan is used up: this retry gets the charge, made now or earlier.
    let (status, charge) = json_of(gw.charge("k", &body(5, "tok_visa")).await).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(gw.charges_with_key("k").await, vec![charge]);
    assert_eq!(gw.stats().await, (1, 0, 13));
    gw.stop().await;
}

#[tokio::test]
async fn an_initial_random_plan_never_runs_out() {
    let gw = start_with(FaultPlan::random(1.0)).await;
    let (_, plan) = gw.get("/_control/faults").await;
    assert_eq!(plan, json!({"mode": "random", "remaining": null, "rate": 1.0}));
    let client = impatient_client();
    for _ in 0..3 {
        match gw.charge_with(&client, "k", &body(5, "tok_visa")).await {
            Ok(response) => assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR),
            Err(err) => assert!(err.is_timeout(), "{err}"),
        }
    }
    assert_eq!(gw.delete("/_control/faults").await, StatusCode::NO_CONTENT);
    assert_eq!(gw.charge("k", &body(5, "tok_visa")).await.status(), StatusCode::OK);
    gw.stop().await;
}

#[tokio::test]
async fn a_plan_applies_to_count_requests_and_can_be_cleared() {
    let gw = start().await;
    gw.set_faults(json!({"mode": "error_before", "count": 2})).await;
    let (_, plan) = gw.get("/_control/faults").await;
    assert_eq!(plan, json!({"mode": "error_before", "remaining": 2}));
    for _ in 0..2 {
        let status = gw.charge("k", &body(5, "tok_visa")).await.status();
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(gw.charge("k", &body(5, "tok_visa")).await.status(), StatusCode::OK);

    gw.set_faults(json!({"mode": "error_before", "count": 5})).await;
    assert_eq!(gw.delete("/_control/faults").await, StatusCode::NO_CONTENT);
    assert_eq!(gw.charge("k2", &body(5, "tok_visa")).await.status(), StatusCode::OK);
    gw.stop().await;
}

#[tokio::test]
async fn charges_are_found_by_id_and_by_key_even_after_keys_are_forgotten() {
    let gw = start().await;
    let (_, charge) = json_of(gw.charge("k", &body(5, "tok_visa")).await).await;
    let id = charge["id"].as_str().expect("an id");
    assert_eq!(gw.get(&format!("/v1/charges/{id}")).await, (StatusCode::OK, charge.clone()));
    let (status, error) = gw.get("/v1/charges/ch_nope").await;
    assert_eq!((status, &error["error"]["code"]), (StatusCode::NOT_FOUND, &json!("resource_missing")));
    assert!(gw.charges_with_key("other").await.is_empty());

    assert_eq!(gw.delete("/_control/idempotency-keys").await, StatusCode::NO_CONTENT);
    assert_eq!(gw.charges_with_key("k").await, vec![charge.clone()]);
    // The gateway no longer knows the key, so the same request charges again.
    let (_, second) = json_of(gw.charge("k", &body(5, "tok_visa")).await).await;
    assert_ne!(second["id"], charge["id"]);
    assert_eq!(gw.charges_with_key("k").await, vec![charge, second]);
    gw.stop().await;
}

#[tokio::test]
async fn stats_count_charges_declines_and_requests() {
    let gw = start().await;
    gw.charge("a", &body(5, "tok_visa")).await;
    gw.charge("a", &body(5, "tok_visa")).await;
    gw.charge("b", &body(5, "tok_chargeDeclined")).await;
    gw.charge("b", &body(5, "tok_chargeDeclined")).await;
    gw.charge("c", &body(5, "nope")).await;
    gw.set_faults(json!({"mode": "error_before"})).await;
    gw.charge("d", &body(5, "tok_visa")).await;
    assert_eq!(gw.stats().await, (1, 1, 6));
    gw.stop().await;
}

#[tokio::test]
async fn a_charge_is_made_even_if_its_client_hangs_up() {
    let gw = start().await;
    gw.set_faults(json!({"mode": "latency", "latency_ms": 2 * SHORT_TIMEOUT.as_millis()})).await;
    let err = gw.charge_with(&impatient_client(), "k", &body(5, "tok_visa")).await;
    assert!(err.expect_err("client gave up").is_timeout());
    assert!(gw.charges_with_key("k").await.is_empty(), "still waiting out its latency");
    wait_until(Duration::from_secs(5), "the charge is made", || async { gw.charges_with_key("k").await.len() == 1 })
        .await;
    gw.stop().await;
}

#[tokio::test]
async fn every_error_is_json() {
    let gw = start().await;
    let (status, error) = gw.get("/nowhere").await;
    assert_eq!((status, &error["error"]["type"]), (StatusCode::NOT_FOUND, &json!("invalid_request_error")));
    let (status, _) = json_of(gw.client.delete(format!("{}/v1/charges", gw.url)).send().await.expect("answered")).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let (status, _) = gw.get("/v1/charges").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a list needs its key");

    let bad_bodies = [
        r#"{"amount": 5, "#,
        r#"{"amount": 5, "currency": "usd", "source": "tok_visa", "extra": 1}"#,
        r#"{"amount": -5, "currency": "usd", "source": "tok_visa"}"#,
        r#"{"amount": 0, "currency": "usd", "source": "tok_visa"}"#,
        r#"{"amount": 5, "currency": "dollars", "source": "tok_visa"}"#,
    ];
    for bad in bad_bodies {
        let (status, error) = json_of(gw.charge_raw("k", bad).await).await;
        assert_eq!(
            (status, &error["error"]["type"]),
            (StatusCode::BAD_REQUEST, &json!("invalid_request_error")),
            "{bad}"
        );
    }
    let url = format!("{}/v1/charges", gw.url);
    let plain = gw.client.post(url).header("Idempotency-Key", "k").body("amount=5");
    let (status, _) = json_of(plain.send().await.expect("answered")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a body that is not JSON");

    let bad_specs = [
        json!({"mode": "sometimes"}),
        json!({"mode": "latency"}),
        json!({"mode": "random", "rate": 2.0}),
        json!({"mode": "error_after", "count": 0}),
        json!({"mode": "error_after", "latency_ms": 5}),
        json!({"mode": "error_after", "colour": "red"}),
    ];
    for spec in bad_specs {
        let response = gw.client.post(format!("{}/_control/faults", gw.url)).json(&spec).send().await;
        let (status, _) = json_of(response.expect("answered")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{spec}");
    }
    assert_eq!(gw.stats().await.0, 0);
    gw.stop().await;
}

#[tokio::test]
async fn the_control_endpoints_are_served_only_when_asked_for() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    let gateway = MockGateway::start(listener, FaultPlan::none(), Controls::Hidden).expect("gateway starts");
    let (url, client) = (gateway.url(), Client::new());

    let faults = client.post(format!("{url}/_control/faults")).json(&json!({ "mode": "error_after" })).send().await;
    assert_eq!(faults.unwrap().status(), StatusCode::NOT_FOUND);
    let forget = client.delete(format!("{url}/_control/idempotency-keys")).send().await.unwrap();
    assert_eq!(forget.status(), StatusCode::NOT_FOUND);
    let stats = client.get(format!("{url}/_control/stats")).send().await.unwrap();
    assert_eq!(stats.status(), StatusCode::NOT_FOUND);
    let settle = client.post(format!("{url}/_control/refunds/settle")).send().await.unwrap();
    assert_eq!(settle.status(), StatusCode::NOT_FOUND);
    let events = client.post(format!("{url}/_control/events")).json(&json!({ "duplicate_rate": 1.0 })).send().await;
    assert_eq!(events.unwrap().status(), StatusCode::NOT_FOUND);
    let sent = client.get(format!("{url}/_control/events/sent")).send().await.unwrap();
    assert_eq!(sent.status(), StatusCode::NOT_FOUND);
    let own = client.post(format!("{url}/_control/authorizations/own-changes")).json(&json!({ "rate": 1.0 }));
    assert_eq!(own.send().await.unwrap().status(), StatusCode::NOT_FOUND);
    let charge = client
        .post(format!("{url}/v1/charges"))
        .header("Idempotency-Key", "k")
        .json(&body(100, "tok_visa"))
        .send()
        .await
        .unwrap();
    assert_eq!(charge.status(), StatusCode::OK, "charging works as ever");
}

#[tokio::test]
async fn the_gateway_says_who_it_is_and_a_new_one_is_someone_else() {
    let (first, second) = (start().await, start().await);

    let (status, account) = first.get("/v1/account").await;

    assert_eq!(status, StatusCode::OK);
    assert!(account["id"].as_str().unwrap().starts_with("acct_"), "{account}");
    assert_eq!(first.get("/v1/account").await.1, account, "the same for its lifetime");
    assert_ne!(second.get("/v1/account").await.1["id"], account["id"]);
}
