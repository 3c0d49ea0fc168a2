//! A retry resumes a key at its recorded recovery point, and never repeats an earlier phase: the
//! gateway is called only when the key has not got past `started`.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{Lock, TestApp, listed_charge, mount_no_charges_found, new_key, payment_body};

/// An app whose gateway is a wiremock server mounted later (it needs the seeded key's id). Its
/// look-up by key finds no charge.
async fn app_with(gateway: &MockServer) -> TestApp {
    mount_no_charges_found(gateway).await;
    TestApp::builder().gateway_url(gateway.uri()).spawn().await
}

async fn assert_finished(app: &TestApp, key: &str, response: reqwest::Response, charge_id: &str) {
    assert_eq!(response.status(), StatusCode::CREATED);
    let payment: Value = response.json().await.unwrap();
    assert_eq!(payment["gateway_charge_id"], charge_id);
    let row = app.key_row(key).await.unwrap();
    assert_eq!((row.recovery_point.as_str(), row.locked_until), ("finished", None));
    let (keys, payments, _, jobs) = app.row_counts().await;
    assert_eq!((keys, payments, jobs), (1, 1, 1), "one key, one payment, one event");
}

#[tokio::test]
async fn a_key_at_started_without_its_payment_finishes_with_one_charge() {
    let gateway = MockServer::start().await;
    let app = app_with(&gateway).await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "started", Lock::Free).await;
    let _charge = gateway_expecting_on(&gateway, &app.downstream_key(key_id), 1).await;

    let response = app.post_payment(&key, &payment_body()).await;

    assert_finished(&app, &key, response, "ch_resumed").await;
}

#[tokio::test]
async fn a_key_at_started_with_its_pending_payment_reuses_the_payment() {
    let gateway = MockServer::start().await;
    let app = app_with(&gateway).await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "started", Lock::Free).await;
    let payment_id = app.seed_payment(key_id, &key, "pending", None).await;
    let _charge = gateway_expecting_on(&gateway, &app.downstream_key(key_id), 1).await;

    let response = app.post_payment(&key, &payment_body()).await;

    let body = response.bytes().await.unwrap();
    let payment: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(payment["id"], payment_id.to_string(), "the payment made before the crash, not a new one");
    let (keys, payments, _, _) = app.row_counts().await;
    assert_eq!((keys, payments), (1, 1));
    let actions: Vec<String> = app.audit_trail().await.into_iter().map(|(action, _)| action).collect();
    let expected = ["idempotency_key.resumed", "payment.charge_recorded", "payment.finished"];
    assert_eq!(actions, expected, "no second payment.created: charge recorded and finished only");
}

#[tokio::test]
async fn a_key_at_charge_created_finishes_without_calling_the_gateway() {
    let gateway = MockServer::start().await;
    let app = app_with(&gateway).await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "charge_created", Lock::Free).await;
    app.seed_payment(key_id, &key, "succeeded", Some("ch_before_crash")).await;
    let _never = gateway_expecting_on(&gateway, &app.downstream_key(key_id), 0).await;

    let response = app.post_payment(&key, &payment_body()).await;

    assert_finished(&app, &key, response, "ch_before_crash").await;
}

#[tokio::test]
async fn a_declined_payment_at_charge_created_finishes_as_402() {
    let gateway = MockServer::start().await;
    let app = app_with(&gateway).await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "charge_created", Lock::Free).await;
    app.seed_payment(key_id, &key, "failed", None).await;
    let _never = gateway_expecting_on(&gateway, &app.downstream_key(key_id), 0).await;

    let response = app.post_payment(&key, &payment_body()).await;

    assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    assert_eq!(app.key_row(&key).await.unwrap().response_status, Some(402));
}

#[tokio::test]
async fn a_stale_lock_is_taken_over_and_the_request_finishes() {
    let gateway = MockServer::start().await;
    mount_no_charges_found(&gateway).await;
    let app = TestApp::builder().gateway_url(gateway.uri()).lock_timeout(Duration::from_secs(60)).spawn().await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "started", Lock::Expired).await;
    app.seed_payment(key_id, &key, "pending", None).await;
    let _charge = gateway_expecting_on(&gateway, &app.downstream_key(key_id), 1).await;

    let response = app.post_payment(&key, &payment_body()).await;

    assert_finished(&app, &key, response, "ch_resumed").await;
}

#[tokio::test]
async fn a_live_lock_is_409_with_retry_after_and_touches_nothing() {
    let gateway = MockServer::start().await;
    let app = TestApp::builder().gateway_url(gateway.uri()).lock_timeout(Duration::from_secs(60)).spawn().await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "started", Lock::Live).await;
    let before = app.key_row(&key).await.unwrap();
    let _never = gateway_expecting_on(&gateway, &app.downstream_key(key_id), 0).await;

    let response = app.post_payment(&key, &payment_body()).await;

    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(response.headers()["retry-after"], "1");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "https://payments.example/problems/request-in-flight");
    let after = app.key_row(&key).await.unwrap();
    assert_eq!((after.locked_until, after.lock_token), (before.locked_until, before.lock_token));
}

/// Expects exactly `times` charge requests under `downstream_key` (checked when the guard drops).
async fn gateway_expecting_on(gateway: &MockServer, downstream_key: &str, times: u64) -> wiremock::MockGuard {
    Mock::given(method("POST"))
        .and(path("/v1/charges"))
        .and(header("Idempotency-Key", downstream_key))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({ "id": "ch_resumed", "status": "succeeded" })))
        .expect(times)
        .mount_as_scoped(gateway)
        .await
}

#[tokio::test]
async fn a_resumed_key_adopts_the_charge_the_gateway_already_made() {
    let gateway = MockServer::start().await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "started", Lock::Free).await;
    app.seed_payment(key_id, &key, "pending", None).await;
    // The earlier run's charge went through, but its answer was lost.
    let downstream = app.downstream_key(key_id);
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .and(wiremock::matchers::query_param("idempotency_key", downstream.as_str()))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({ "object": "list", "data": [listed_charge(&downstream, json!({ "id": "ch_lost_answer", "status": "succeeded" }))] }),
        ))
        .expect(1)
        .mount(&gateway)
        .await;
    let _no_second_charge = gateway_expecting_on(&gateway, &downstream, 0).await;

    let response = app.post_payment(&key, &payment_body()).await;

    assert_finished(&app, &key, response, "ch_lost_answer").await;
}

#[tokio::test]
async fn a_look_up_that_fails_is_indeterminate_and_charges_nothing() {
    let gateway = MockServer::start().await;
    Mock::given(method("GET")).and(path("/v1/charges")).respond_with(ResponseTemplate::new(500)).mount(&gateway).await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "started", Lock::Free).await;
    let _never = gateway_expecting_on(&gateway, &app.downstream_key(key_id), 0).await;

    let response = app.post_payment(&key, &payment_body()).await;

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let row = app.key_row(&key).await.unwrap();
    assert_eq!((row.recovery_point.as_str(), row.locked_until), ("started", None));
}

#[tokio::test]
async fn a_resumed_key_whose_charge_failed_records_the_decline_instead_of_charging() {
    let gateway = MockServer::start().await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "started", Lock::Free).await;
    // The earlier run was declined, and crashed before recording it.
    let failed = listed_charge(
        &app.downstream_key(key_id),
        json!({ "id": "ch_declined", "status": "failed",
        "failure_code": "expired_card", "failure_message": "The card has expired." }),
    );
    let failed = json!({ "object": "list", "data": [failed] });
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .respond_with(ResponseTemplate::new(200).set_body_json(failed))
        .mount(&gateway)
        .await;
    let _no_charge = gateway_expecting_on(&gateway, &app.downstream_key(key_id), 0).await;

    let response = app.post_payment(&key, &payment_body()).await;

    assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["payment"]["failure_code"], "expired_card");
    assert!(problem["payment"]["gateway_charge_id"].is_null(), "a failed charge is not the payment's charge");
}

#[tokio::test]
async fn a_resumed_key_whose_charge_is_pending_waits() {
    let gateway = MockServer::start().await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "started", Lock::Free).await;
    let pending = listed_charge(&app.downstream_key(key_id), json!({ "id": "ch_pending", "status": "pending" }));
    let pending = json!({ "object": "list", "data": [pending] });
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .respond_with(ResponseTemplate::new(200).set_body_json(pending))
        .mount(&gateway)
        .await;
    let _no_charge = gateway_expecting_on(&gateway, &app.downstream_key(key_id), 0).await;

    let response = app.post_payment(&key, &payment_body()).await;

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(app.key_row(&key).await.unwrap().recovery_point, "started");
}

/// A wiremock gateway whose look-up by key answers with these charges, and which must not be
/// asked to charge.
async fn look_up_finds(gateway: &MockServer, charges: Vec<Value>) {
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({ "object": "list", "data": charges })))
        .mount(gateway)
        .await;
}

#[tokio::test]
async fn a_looked_up_charge_that_is_not_ours_is_never_adopted_nor_charged_over() {
    let gateway = MockServer::start().await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "started", Lock::Free).await;
    let downstream = app.downstream_key(key_id);
    let mut other_amount = listed_charge(&downstream, json!({ "id": "ch_other_amount", "status": "succeeded" }));
    other_amount["amount"] = json!(999);
    let other_key = listed_charge("payments:someone:else", json!({ "id": "ch_other_key", "status": "succeeded" }));
    let mut other_currency = listed_charge(&downstream, json!({ "id": "ch_other_currency" }));
    other_currency["currency"] = json!("eur");
    look_up_finds(&gateway, vec![other_amount, other_key, other_currency]).await;
    let _no_charge = gateway_expecting_on(&gateway, &downstream, 0).await;

    let response = app.post_payment(&key, &payment_body()).await;

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "an unknown outcome");
    let row = app.key_row(&key).await.unwrap();
    assert_eq!((row.recovery_point.as_str(), row.response_status), ("started", None));
}

#[tokio::test]
async fn a_succeeded_charge_of_ours_wins_over_a_failed_one() {
    let gateway = MockServer::start().await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "started", Lock::Free).await;
    let downstream = app.downstream_key(key_id);
    let failed = listed_charge(&downstream, json!({ "id": "ch_failed", "status": "failed" }));
    let succeeded = listed_charge(&downstream, json!({ "id": "ch_succeeded", "status": "succeeded" }));
    look_up_finds(&gateway, vec![failed, succeeded]).await;
    let _no_charge = gateway_expecting_on(&gateway, &downstream, 0).await;

    let response = app.post_payment(&key, &payment_body()).await;

    assert_finished(&app, &key, response, "ch_succeeded").await;
}
