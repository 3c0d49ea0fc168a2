//! A finished key answers every retry with the stored response, byte for byte.

use std::time::Duration;

use payments_service::workers::Worker;
use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{Lock, TestApp, charge_requests, new_key, payment_body, wait_until};

#[tokio::test]
async fn replaying_a_finished_key_returns_the_stored_bytes() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let first = app.post_payment(&key, &payment_body()).await;
    let (status, content_type) = (first.status(), first.headers()["content-type"].clone());
    let first_bytes = first.bytes().await.unwrap();

    let retry = app.post_payment(&key, &payment_body()).await;

    assert_eq!(retry.status(), status);
    assert_eq!(retry.headers()["content-type"], content_type);
    assert_eq!(retry.headers()["Idempotent-Replayed"], "true");
    assert_eq!(retry.bytes().await.unwrap(), first_bytes);
    assert_eq!(app.gateway.stats().await.requests, 1, "a replay never reaches the gateway");
    assert_eq!(app.row_counts().await, (1, 1, 4, 1), "a replay writes nothing");
}

#[tokio::test]
async fn a_reordered_and_reformatted_body_is_the_same_request() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let first = app.post_payment(&key, &payment_body()).await.bytes().await.unwrap();

    let reordered = r#"{ "description" : "Order #42",
                         "source": "tok_visa", "currency": "USD", "amount": 1000, "metadata": {} }"#;
    let retry = app.post_payment_with(&key, reordered.into(), &[]).await;

    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["Idempotent-Replayed"], "true");
    assert_eq!(retry.bytes().await.unwrap(), first);
}

#[tokio::test]
async fn an_integral_amount_written_with_a_fraction_is_the_same_request() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let with_fraction = r#"{"amount": 51803.0, "currency": "usd", "source": "tok_visa"}"#;
    let first = app.post_payment_with(&key, with_fraction.into(), &[]).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first = first.bytes().await.unwrap();
    assert_eq!(app.key_row(&key).await.unwrap().request_params["amount"], json!(51803), "stored as an integer");

    let retry = app.post_payment(&key, &json!({ "amount": 51803, "currency": "usd", "source": "tok_visa" })).await;

    assert_eq!(retry.headers()["Idempotent-Replayed"], "true");
    assert_eq!(retry.bytes().await.unwrap(), first);
}

#[tokio::test]
async fn the_quoted_key_form_names_the_same_key() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let first = app.post_payment(&key, &payment_body()).await.bytes().await.unwrap();

    let retry = app.post_payment(&format!("\"{key}\""), &payment_body()).await;

    assert_eq!(retry.headers()["Idempotent-Replayed"], "true");
    assert_eq!(retry.bytes().await.unwrap(), first);
}

#[tokio::test]
async fn spaces_around_a_bare_key_are_not_part_of_it() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let first = app.post_payment(&key, &payment_body()).await.bytes().await.unwrap();

    // HTTP drops them before the service sees the header, as the spec says.
    let retry = app.post_payment(&format!("  {key}\t "), &payment_body()).await;

    assert_eq!(retry.headers()["Idempotent-Replayed"], "true");
    assert_eq!(retry.bytes().await.unwrap(), first);
}

#[tokio::test]
async fn a_stored_decline_is_replayed_too() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let body = json!({ "amount": 500, "currency": "usd", "source": "tok_chargeDeclined" });
    let first = app.post_payment(&key, &body).await.bytes().await.unwrap();

    let retry = app.post_payment(&key, &body).await;

    assert_eq!(retry.status(), StatusCode::PAYMENT_REQUIRED);
    assert_eq!(retry.headers()["Idempotent-Replayed"], "true");
    assert_eq!(retry.headers()["content-type"], "application/problem+json");
    assert_eq!(retry.bytes().await.unwrap(), first);
    assert_eq!(app.gateway.stats().await.requests, 1);
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_request_gets_the_finished_answer_on_retry() {
    let gateway = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/charges"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({ "id": "ch_patient" }))
                .set_delay(Duration::from_millis(500)),
        )
        .expect(1)
        .mount(&gateway)
        .await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
    let key = new_key();

    // The client gives up while the charge is on its way: once the gateway has the request, the
    // client's connection is dropped.
    let request = app
        .http
        .post(format!("{}/v1/payments", app.address))
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", &key)
        .json(&payment_body())
        .send();
    let client = tokio::spawn(request);
    wait_until(Duration::from_secs(10), "the charge request reaches the gateway", || async {
        !charge_requests(&gateway).await.is_empty()
    })
    .await;
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled(), "hung up before the answer");

    // The request runs to the end anyway, and the retry gets its answer.
    wait_until(Duration::from_secs(10), "the abandoned request finished", || async {
        app.key_row(&key).await.is_some_and(|row| row.recovery_point == "finished")
    })
    .await;
    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["Idempotent-Replayed"], "true");
}

#[tokio::test]
async fn another_account_with_the_same_key_is_never_answered_from_the_first_ones_memory() {
    let app = TestApp::spawn().await;
    let other = app.create_account("other").await;
    let key = new_key();
    let theirs: Value = app.post_payment(&key, &payment_body()).await.json().await.unwrap();
    assert!(app.remembers_the_answer_of(&key));

    let headers = [("Idempotency-Key", key.as_str()), ("Content-Type", "application/json")];
    let ours = app.post_payment_raw(Some(&other), &headers, payment_body().to_string()).await;

    assert_eq!(ours.status(), StatusCode::CREATED);
    assert!(!ours.headers().contains_key("Idempotent-Replayed"), "a new request of its own");
    let ours: Value = ours.json().await.unwrap();
    assert_ne!(ours["id"], theirs["id"]);
    assert_eq!(app.gateway.stats().await.charges, 2);
}

#[tokio::test]
async fn a_replay_from_the_database_is_kept_in_memory_only_until_the_key_expires() {
    let app = TestApp::builder()
        .key_retention(Duration::from_secs(3600))
        .workers(|w| w.completer_backoff = Duration::ZERO)
        .spawn()
        .await;
    let key = new_key();
    // A key finished by a worker (so never by this process's API), which the database says
    // expires in a second, whatever this process's retention of an hour.
    let key_id = app.seed_key(&key, &payment_body(), "charge_created", Lock::Free).await;
    app.seed_payment(key_id, &key, "succeeded", Some("ch_earlier")).await;
    app.workers().completer.run_once().await.unwrap();
    app.run_sql("UPDATE idempotency_keys SET expires_at = now() + interval '1 second'").await;
    assert!(!app.remembers_the_answer_of(&key));

    let replay = app.post_payment(&key, &payment_body()).await;

    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
    assert!(app.remembers_the_answer_of(&key));
    wait_until(Duration::from_secs(10), "the key expired", || app.key_has_expired(&key)).await;
    assert!(!app.remembers_the_answer_of(&key), "the answer is not kept past the key's expiry");
}
