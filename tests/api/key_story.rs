//! `GET /v1/idempotency_keys?key=`: a key's whole story, at each recovery point, for its own
//! account only.

use std::time::Duration;

use payments::workers::Worker;
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{Lock, TestApp, new_key, payment_body};

/// The story of `key`, which must exist.
async fn story(app: &TestApp, key: &str) -> Value {
    let response = app.key_story(key).await;
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.unwrap()
}

/// The trail's actions, in order.
fn actions(story: &Value) -> Vec<&str> {
    story["trail"].as_array().unwrap().iter().map(|entry| entry["action"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn a_finished_key_tells_every_phase_with_the_request_that_committed_it() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let response = app.post_payment(&key, &payment_body()).await;
    let request_id = response.headers()["request-id"].to_str().unwrap().to_owned();
    let payment: Value = response.json().await.unwrap();

    let story = story(&app, &key).await;

    assert_eq!(story["object"], "idempotency_key");
    assert_eq!(story["key"], key);
    assert_eq!(story["recovery_point"], "finished");
    assert_eq!(story["locked"], false);
    assert!(story["locked_until"].is_null() && story["finished_at"].is_string() && story["created_at"].is_string());
    assert_eq!(story["response_status"], 201);
    assert_eq!(story["needs_attention"], false);
    assert_eq!(story["reaped"], false);
    assert_eq!(story["payment"], payment);
    assert_eq!(
        actions(&story),
        ["idempotency_key.claimed", "payment.created", "payment.charge_recorded", "payment.finished"]
    );
    let trail = story["trail"].as_array().unwrap();
    assert!(trail.iter().all(|entry| entry["request_id"] == request_id && entry["actor"] == "api"), "{story}");
    let points: Vec<&Value> = trail[1..].iter().map(|entry| &entry["data"]["recovery_point"]).collect();
    assert_eq!(points, ["started", "charge_created", "finished"]);
    assert_eq!(trail[2]["data"]["answered_by"], "charge");
}

#[tokio::test]
async fn the_error_after_walkthrough_shows_release_resumption_and_adoption() {
    let app = TestApp::spawn().await;
    let key = new_key();
    app.gateway.fault("error_after", 1).await;
    let first = app.post_payment(&key, &payment_body()).await;
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);

    let unknown = story(&app, &key).await;
    assert_eq!(unknown["recovery_point"], "started");
    assert_eq!(unknown["locked"], false);
    assert_eq!(unknown["payment"]["status"], "pending");
    assert!(unknown["response_status"].is_null());
    let released = &unknown["trail"][2];
    assert_eq!(released["action"], "idempotency_key.released");
    assert_eq!(released["data"]["reason_code"], "unknown_outcome", "{released}");
    assert!(released["data"].get("reason").is_none(), "the error's own text is for operators");
    assert!(unknown["trail"][1]["data"].get("gateway").is_none(), "so is the gateway's identity");

    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CREATED);
    let story = story(&app, &key).await;
    assert_eq!(
        actions(&story),
        [
            "idempotency_key.claimed",
            "payment.created",
            "idempotency_key.released",
            "idempotency_key.resumed",
            "payment.charge_recorded",
            "payment.finished"
        ]
    );
    assert_eq!(story["trail"][4]["data"]["answered_by"], "look_up", "the charge was found and adopted");
    assert_eq!(app.gateway.stats().await.charges, 1);
}

#[tokio::test]
async fn a_key_held_at_charge_created_is_locked_until_its_lease_ends() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "charge_created", Lock::Live).await;
    app.seed_payment(key_id, &key, "succeeded", Some("ch_seeded")).await;

    let story = story(&app, &key).await;

    assert_eq!(story["recovery_point"], "charge_created");
    assert_eq!(story["locked"], true);
    assert!(story["locked_until"].is_string());
    assert_eq!(story["payment"]["gateway_charge_id"], "ch_seeded");
    assert!(story["response_status"].is_null());
}

#[tokio::test]
async fn a_key_the_completer_gave_up_on_says_why() {
    let app = TestApp::builder()
        .workers(|w| {
            w.completer_backoff = Duration::ZERO;
            w.completer_max_attempts = 1;
        })
        .spawn()
        .await;
    let key = new_key();
    app.seed_key(&key, &payment_body(), "charge_created", Lock::Free).await;

    // At `charge_created` without a payment: the completer cannot finish it.
    app.workers().completer.run_once().await.unwrap();
    let story = story(&app, &key).await;

    assert_eq!(story["needs_attention"], true);
    assert_eq!(story["attention_reason"], "internal", "{story}");
    assert!(!story.to_string().contains("without a payment"), "the error's text is for operators");
    assert_eq!(story["completer_attempts"], 1);
    let trail = actions(&story);
    assert_eq!(trail, ["idempotency_key.taken_over", "idempotency_key.released", "idempotency_key.needs_attention"]);
    let runs: Vec<&Value> = story["trail"].as_array().unwrap().iter().map(|entry| &entry["request_id"]).collect();
    assert!(runs.iter().all(|run| *run == runs[0] && run.is_string()), "one completer run wrote them all");
}

#[tokio::test]
async fn a_reaped_key_still_tells_its_story_through_its_payment() {
    let app = TestApp::builder().key_retention(Duration::ZERO).spawn().await;
    let key = new_key();
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CREATED);
    app.workers().reaper.run_once().await.unwrap();
    assert!(app.key_row(&key).await.is_none());

    let story = story(&app, &key).await;

    assert_eq!(story["reaped"], true);
    assert_eq!(story["recovery_point"], "finished");
    assert_eq!(story["response_status"], 201);
    assert_eq!(story["payment"]["status"], "succeeded");
    assert_eq!(actions(&story).last(), Some(&"idempotency_key.reaped"));
    assert_eq!(actions(&story).len(), 5);
}

#[tokio::test]
async fn a_key_is_its_accounts_alone() {
    let app = TestApp::spawn().await;
    let other = app.create_account("other").await;
    let key = new_key();
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CREATED);

    let response = app.key_story_as(&other, &key).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "https://payments.example/problems/idempotency-key-not-found");
    assert_eq!(app.key_story(&key).await.status(), StatusCode::OK);
    assert_eq!(app.key_story_as("sk_nobody", &key).await.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_key_is_named_exactly_and_must_be_a_valid_key() {
    let app = TestApp::spawn().await;
    let key = " \"quoted and spaced\" ";
    let quoted = "\" \\\"quoted and spaced\\\" \"";
    let headers = [("Idempotency-Key", quoted), ("Content-Type", "application/json")];
    let response = app.post_payment_raw(Some(&app.api_key), &headers, payment_body().to_string()).await;
    assert_eq!(response.status(), StatusCode::CREATED);

    assert_eq!(story(&app, key).await["key"], key, "the key as meant, URL-encoded in the query");
    for invalid in ["", &"k".repeat(256), "tab\there"] {
        assert_eq!(app.key_story(invalid).await.status(), StatusCode::BAD_REQUEST, "{invalid:?}");
    }
    let no_key = app.get("/v1/idempotency_keys").await;
    assert_eq!(no_key.status(), StatusCode::BAD_REQUEST);
}
