//! `Request-Id`: on every answer, in every problem body, in the audit records the request wrote,
//! and in its log lines.

use std::collections::BTreeSet;
use std::time::Duration;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use payments_service::db::schema::audit_records;
use payments_wire::problem::ProblemType;
use reqwest::{Response, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{Lock, Process, TestApp, TestDatabase, new_key, payment_body, wait_until};

/// The answer's `Request-Id`, checked to be one the service made.
fn request_id(response: &Response) -> String {
    let id = response.headers().get("Request-Id").expect("every answer carries Request-Id");
    let id = id.to_str().unwrap().to_owned();
    assert!(id.starts_with("req_") && id.len() == 36, "{id}");
    id
}

/// The problem of an answer, checked to carry the answer's own request id; returns its type's slug.
async fn problem_slug(response: Response) -> String {
    let id = request_id(&response);
    assert_eq!(response.headers()["content-type"], "application/problem+json");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["request_id"], id, "{problem}");
    problem["type"].as_str().unwrap().rsplit('/').next().unwrap().to_owned()
}

#[tokio::test]
async fn a_success_carries_a_request_id_which_its_audit_records_carry_too() {
    let app = TestApp::spawn().await;
    let key = new_key();

    let response = app.post_payment(&key, &payment_body()).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let id = request_id(&response);

    let written: Vec<Option<String>> =
        audit_records::table.select(audit_records::request_id).load(&mut app.db().await).await.unwrap();
    assert_eq!(written.len(), 4, "the claim and the three phases");
    assert!(written.iter().all(|written| written.as_deref() == Some(&id)), "{written:?} vs {id}");

    let replay = app.post_payment(&key, &payment_body()).await;
    assert_ne!(request_id(&replay), id, "each request has its own id, a replay too");
    assert_eq!(request_id(&app.get("/healthz").await).len(), 36);
}

#[tokio::test]
async fn a_valid_caller_id_is_used_and_an_invalid_one_replaced() {
    let app = TestApp::spawn().await;
    let post = |id: &'static str| {
        let headers = [("X-Request-Id", id)];
        let key = new_key();
        let app = &app;
        async move { app.post_payment_with(&key, payment_body().to_string(), &headers).await }
    };

    let response = post("trace-4bf92f35:01").await;
    assert_eq!(response.headers()["request-id"], "trace-4bf92f35:01");
    let response = post("no spaces <allowed>").await;
    request_id(&response);
}

#[tokio::test]
async fn every_problem_carries_its_request_id() {
    let app = TestApp::spawn().await;
    let (body, json_type) = (payment_body().to_string(), ("Content-Type", "application/json"));
    let mut seen = BTreeSet::new();
    let mut expect = |slug: String, expected: &str| {
        assert_eq!(slug, expected);
        seen.insert(slug);
    };

    expect(problem_slug(app.post_payment_raw(None, &[json_type], body.clone()).await).await, "unauthorized");
    let no_key = app.post_payment_raw(Some(&app.api_key), &[json_type], body.clone()).await;
    expect(problem_slug(no_key).await, "missing-idempotency-key");
    let bad_key = [json_type, ("Idempotency-Key", "\"open")];
    let bad_key = app.post_payment_raw(Some(&app.api_key), &bad_key, body.clone()).await;
    expect(problem_slug(bad_key).await, "invalid-idempotency-key");
    // actix's own extractors: the JSON body, the query string, the path.
    expect(problem_slug(app.post_payment_with(&new_key(), "{".into(), &[]).await).await, "malformed-body");
    expect(problem_slug(app.get("/v1/payments?limit=many").await).await, "invalid-request");
    expect(problem_slug(app.get("/v1/payments/not-a-uuid").await).await, "payment-not-found");
    let huge = json!({ "amount": 1, "currency": "usd", "source": "tok_visa", "description": "x".repeat(20_000) });
    expect(problem_slug(app.post_payment(&new_key(), &huge).await).await, "payload-too-large");
    let text = [("Idempotency-Key", "k"), ("Content-Type", "text/plain")];
    let text = app.post_payment_raw(Some(&app.api_key), &text, body).await;
    expect(problem_slug(text).await, "unsupported-media-type");
    expect(problem_slug(app.key_story("never-used").await).await, "idempotency-key-not-found");
    expect(problem_slug(app.get("/v2/anything").await).await, "route-not-found");
    let delete = app.http.delete(format!("{}/v1/payments", app.address)).send().await.unwrap();
    expect(problem_slug(delete).await, "method-not-allowed");

    let key = new_key();
    app.post_payment(&key, &payment_body()).await;
    let other = json!({ "amount": 2, "currency": "usd", "source": "tok_visa" });
    expect(problem_slug(app.post_payment(&key, &other).await).await, "idempotency-key-reused");
    let held = new_key();
    app.seed_key(&held, &payment_body(), "started", Lock::Live).await;
    expect(problem_slug(app.post_payment(&held, &payment_body()).await).await, "request-in-flight");
    let reaped = new_key();
    app.seed_payment(Uuid::now_v7(), &reaped, "succeeded", Some("ch_long_ago")).await;
    expect(problem_slug(app.post_payment(&reaped, &payment_body()).await).await, "idempotency-key-expired");
    let declined = json!({ "amount": 1, "currency": "usd", "source": "tok_chargeDeclined" });
    expect(problem_slug(app.post_payment(&new_key(), &declined).await).await, "card-declined");
    let unknown = json!({ "amount": 1, "currency": "usd", "source": "card_1" });
    expect(problem_slug(app.post_payment(&new_key(), &unknown).await).await, "unknown-source");
    app.gateway.fault("error_before", 1).await;
    expect(problem_slug(app.post_payment(&new_key(), &payment_body()).await).await, "gateway-unavailable");

    // Refunds' own.
    let paid: Value = app.post_payment(&new_key(), &payment_body()).await.json().await.unwrap();
    let app = &app;
    let refund = |body: Value| async move { problem_slug(app.post_refund(&new_key(), &body).await).await };
    expect(refund(json!({ "payment": Uuid::now_v7() })).await, "payment-not-found");
    let declined: Value = app.post_payment(&new_key(), &declined).await.json().await.unwrap();
    expect(refund(json!({ "payment": declined["payment"]["id"] })).await, "payment-not-refundable");
    expect(refund(json!({ "payment": paid["id"], "amount": 100_000 })).await, "refund-exceeds-payment");
    // The payment's row held by stuck work: a refund of it waits out the lock timeout.
    let mut holder = app.db().await;
    let held = format!("BEGIN; SELECT FROM payments WHERE id = '{}' FOR UPDATE", paid["id"].as_str().unwrap());
    diesel_async::SimpleAsyncConnection::batch_execute(&mut holder, &held).await.unwrap();
    expect(refund(json!({ "payment": paid["id"] })).await, "record-locked");
    diesel_async::SimpleAsyncConnection::batch_execute(&mut holder, "ROLLBACK").await.unwrap();
    app.post_refund(&new_key(), &json!({ "payment": paid["id"] })).await;
    expect(refund(json!({ "payment": paid["id"] })).await, "payment-already-refunded");
    expect(problem_slug(app.get("/v1/refunds/not-a-uuid").await).await, "refund-not-found");
    expect(problem_slug(app.post_event(b"{}", None).await).await, "invalid-signature");

    // Events' and webhook endpoints' own.
    expect(problem_slug(app.get("/v1/events/evt_nothing").await).await, "event-not-found");
    expect(problem_slug(app.get("/v1/events?type=payment.paid").await).await, "unknown-event-type");
    expect(problem_slug(app.get("/v1/webhook_endpoints/we_nothing").await).await, "webhook-endpoint-not-found");
    let endpoint = |body: Value| {
        let url = format!("{}/v1/webhook_endpoints", app.address);
        let request = app.http.post(url).bearer_auth(&app.api_key).header("Idempotency-Key", new_key());
        async move { problem_slug(request.json(&body).send().await.unwrap()).await }
    };
    expect(endpoint(json!({ "url": "ftp://shop.example/", "enabled_events": ["*"] })).await, "invalid-webhook-url");
    let not_allowed = json!({ "url": "http://127.0.0.2/", "enabled_events": ["*"] });
    expect(endpoint(not_allowed).await, "webhook-url-not-allowed");

    // Captures' and cancels' own.
    let change = |id: &str, action: &str, body: Value| {
        let url = format!("{}/v1/payments/{id}/{action}", app.address);
        let request = app.http.post(url).bearer_auth(&app.api_key).header("Idempotency-Key", new_key());
        async move { problem_slug(request.json(&body).send().await.unwrap()).await }
    };
    let paid_id = paid["id"].as_str().unwrap();
    expect(change(paid_id, "capture", json!({})).await, "payment-not-capturable");
    expect(change(paid_id, "cancel", json!({})).await, "payment-not-cancelable");
    let authorize = json!({ "amount": 1000, "currency": "usd", "source": "tok_visa", "capture": false });
    let authorized: Value = app.post_payment(&new_key(), &authorize).await.json().await.unwrap();
    let authorized_id = authorized["id"].as_str().unwrap();
    expect(change(authorized_id, "capture", json!({ "amount": 1001 })).await, "capture-exceeds-authorization");

    // The gateway's definitive 4xx, from a gateway that answers so.
    let gateway = wiremock::MockServer::start().await;
    let refusal = json!({ "error": { "message": "bad" } });
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .respond_with(wiremock::ResponseTemplate::new(400).set_body_json(refusal))
        .mount(&gateway)
        .await;
    let refusing = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
    expect(problem_slug(refusing.post_payment(&new_key(), &payment_body()).await).await, "gateway-rejected");

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let no_database = TestApp::builder().database_url(format!("postgres://postgres@{closed}/none")).spawn().await;
    expect(problem_slug(no_database.get("/readyz").await).await, "database-unavailable");

    // A signed event naming a key of ours under which the database shows nothing (yet).
    let secret = payments_service::gateway::signature::WebhookSecret::new("whsec_request_id");
    let listening = TestApp::builder().webhook_secrets(&["whsec_request_id"]).spawn().await;
    let now = chrono::Utc::now().timestamp();
    let event = json!({ "id": "evt_unseen", "object": "event", "type": "charge.succeeded", "created": now,
                        "data": { "object": { "id": "ch_unseen", "object": "charge" } },
                        "request": { "idempotency_key": listening.downstream_key(Uuid::now_v7()) } });
    let body = serde_json::to_vec(&event).unwrap();
    let signature = payments_service::gateway::signature::sign(&[secret], now, &body);
    expect(problem_slug(listening.post_event(&body, Some(&signature)).await).await, "event-not-seen-yet");

    // The two that no request can be made to cause on purpose are rendered by the same code: see
    // `http::error`'s unit test, which renders every error with an id.
    let all: BTreeSet<String> =
        ProblemType::ALL.iter().map(|kind| kind.uri().rsplit('/').next().unwrap().into()).collect();
    let missing: Vec<&String> = all.difference(&seen).collect();
    assert_eq!(missing, ["internal-error", "transaction-conflict"]);
}

#[tokio::test]
async fn a_stored_problem_names_the_request_that_finished_it_and_its_replay_is_the_same_bytes() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let declined = json!({ "amount": 1, "currency": "usd", "source": "tok_chargeDeclined" });

    let first = app.post_payment(&key, &declined).await;
    let first_id = request_id(&first);
    let first_body = first.bytes().await.unwrap();
    let replay = app.post_payment(&key, &declined).await;
    let replay_id = request_id(&replay);

    assert_ne!(replay_id, first_id);
    assert_eq!(replay.bytes().await.unwrap(), first_body, "byte for byte");
    let problem: Value = serde_json::from_slice(&first_body).unwrap();
    assert_eq!(problem["request_id"], first_id);
}

#[tokio::test]
async fn every_log_line_of_a_request_carries_its_id() {
    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let (_, api_key) = payments_service::accounts::create(&mut conn, "logs").await.unwrap();
    let gateway = Process::gateway().await;
    let env = [("PAYMENTS_LOG_FORMAT", "json"), ("RUST_LOG", "payments=debug")];
    let server = Process::serve(&database.url, &gateway.url, &[], &env).await;
    let control = crate::helpers::GatewayControl::new(&gateway.url);
    control.fault("error_before", 1).await;

    // An unknown outcome: the request logs a warning on its way.
    let response = reqwest::Client::new()
        .post(format!("{}/v1/payments", server.url))
        .bearer_auth(&api_key)
        .header("Idempotency-Key", new_key())
        .json(&payment_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let id = request_id(&response);

    let stderr = server.stderr.clone();
    wait_until(Duration::from_secs(10), "the request's warning is logged", || {
        let logged = stderr.borrow().iter().any(|line| line.contains("gateway outcome unknown"));
        async move { logged }
    })
    .await;
    let lines: Vec<Value> = stderr
        .borrow()
        .iter()
        .filter(|line| line.contains("gateway outcome unknown") || line.contains("payments.create"))
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert!(!lines.is_empty());
    for line in &lines {
        let spans = line["spans"].as_array().unwrap();
        assert!(spans.iter().any(|span| span["request_id"] == id), "{line}");
    }
}
