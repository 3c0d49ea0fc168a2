//! Authorize now, capture later: a payment made with `capture: false` is only authorized, its money
//! held at the gateway until a capture or a cancel ends the authorization, or it lapses.

use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, new_key};

fn authorization(amount: i64, source: &str) -> Value {
    json!({ "amount": amount, "currency": "usd", "source": source, "capture": false })
}

#[tokio::test]
async fn a_payment_made_with_capture_false_is_authorized_and_waits_for_its_capture() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let before = Utc::now();
    let response = app.post_payment(&key, &authorization(5000, "tok_visa")).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let body = response.bytes().await.unwrap();
    let payment: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(payment["status"], "requires_capture");
    assert_eq!(payment["capture_method"], "manual");
    assert_eq!((&payment["amount_capturable"], &payment["amount_captured"]), (&json!(5000), &json!(0)));
    assert_eq!((&payment["canceled_at"], &payment["cancellation_reason"]), (&Value::Null, &Value::Null));
    // It lapses a week after it was authorized, by default.
    let capture_before: DateTime<Utc> = payment["capture_before"].as_str().unwrap().parse().unwrap();
    let week = chrono::Duration::days(7);
    assert!(capture_before >= before + week && capture_before <= Utc::now() + week, "{capture_before}");

    // The gateway holds the money, and has captured none of it.
    let charge_id = payment["gateway_charge_id"].as_str().expect("the authorization's charge");
    let charge = app.gateway.charge(charge_id).await;
    assert_eq!((&charge["status"], &charge["captured"]), (&json!("requires_capture"), &json!(false)));

    // Replayed byte for byte; waiting for its capture, or its lapse; announced as authorized.
    let replay = app.post_payment(&key, &authorization(5000, "tok_visa")).await;
    assert_eq!((replay.status(), replay.bytes().await.unwrap()), (StatusCode::CREATED, body));
    let id = payment["id"].as_str().unwrap();
    assert!(app.database_says(&format!("EXISTS (SELECT FROM open_authorizations WHERE payment_id = '{id}')")).await);
    let staged = format!(
        "(SELECT job_name = 'payment.authorized' FROM staged_jobs WHERE job_args -> 'data' -> 'object' ->> 'id' = '{id}')"
    );
    assert!(app.database_says(&staged).await, "its event: payment.authorized");

    // Nothing is captured yet, so there is nothing to refund.
    let refund = app.post_refund(&new_key(), &json!({ "payment": id })).await;
    assert_eq!(refund.status(), StatusCode::BAD_REQUEST);
    let refund: Value = refund.json().await.unwrap();
    assert_eq!(refund["type"], "https://payments.example/problems/payment-not-refundable");
}

#[tokio::test]
async fn a_payment_charged_at_once_shows_what_it_captured() {
    let app = TestApp::spawn().await;
    let paid = app.paid(5000, "tok_visa").await;
    assert_eq!((&paid["status"], &paid["capture_method"]), (&json!("succeeded"), &json!("automatic")));
    assert_eq!((&paid["amount_captured"], &paid["amount_capturable"]), (&json!(5000), &json!(0)));
    assert_eq!(paid["capture_before"], Value::Null);

    // The same key with `capture: false` is another request; and said outright, `capture: true` is
    // the same as saying nothing.
    let key = new_key();
    let charged = json!({ "amount": 700, "currency": "usd", "source": "tok_visa" });
    assert_eq!(app.post_payment(&key, &charged).await.status(), StatusCode::CREATED);
    let explicit = json!({ "amount": 700, "currency": "usd", "source": "tok_visa", "capture": true });
    assert_eq!(app.post_payment(&key, &explicit).await.status(), StatusCode::CREATED);
    let other = app.post_payment(&key, &authorization(700, "tok_visa")).await;
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn a_declined_authorization_is_a_declined_payment() {
    let app = TestApp::spawn().await;
    let response = app.post_payment(&new_key(), &authorization(5000, "tok_chargeDeclined")).await;
    assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["payment"]["status"], "failed");
    assert_eq!(problem["payment"]["amount_capturable"], 0);
    assert!(app.database_says("NOT EXISTS (SELECT FROM open_authorizations)").await);
}
