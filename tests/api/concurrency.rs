//! Identical requests at the same moment: one drives the key, the rest are told it is in flight
//! (or get the stored answer), and the gateway charges once.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{TestApp, new_key, payment_body, post_all_at_once};

const CONCURRENT: usize = 24;

/// Sends `CONCURRENT` identical requests at once; returns (fresh 201s, 409s, replays).
async fn fire(app: &TestApp, key: &str) -> (usize, usize, usize) {
    let servers = vec![app.address.clone(); CONCURRENT];
    let (mut fresh, mut in_flight, mut replayed) = (0, 0, 0);
    for (status, replay) in post_all_at_once(&servers, &app.api_key, key).await {
        match (status, replay) {
            (StatusCode::CREATED, false) => fresh += 1,
            (StatusCode::CREATED, true) => replayed += 1,
            (StatusCode::CONFLICT, _) => in_flight += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    (fresh, in_flight, replayed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn identical_requests_at_once_make_one_charge() {
    let gateway = MockServer::start().await;
    // A slow charge keeps the first request in flight while the others arrive.
    Mock::given(method("POST"))
        .and(path("/v1/charges"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({ "id": "ch_once" })).set_delay(Duration::from_millis(500)),
        )
        .expect(1)
        .mount(&gateway)
        .await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
    let key = new_key();

    let (fresh, in_flight, replayed) = fire(&app, &key).await;

    assert_eq!(fresh, 1, "exactly one request drove the key");
    assert_eq!(fresh + in_flight + replayed, CONCURRENT);
    assert!(in_flight > 0, "the slow charge kept the others out");
    assert_eq!(app.row_counts().await.1, 1, "one payment");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn identical_requests_at_once_against_the_mock_gateway_make_one_charge() {
    let app = TestApp::spawn().await;
    app.gateway.faults(json!({ "mode": "latency", "latency_ms": 300, "count": CONCURRENT })).await;
    let key = new_key();

    let (fresh, _, _) = fire(&app, &key).await;

    assert_eq!(fresh, 1);
    assert_eq!(app.gateway.stats().await.charges, 1);
    // A retry after the dust settles replays the one answer.
    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.headers()["Idempotent-Replayed"], "true");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn identical_requests_at_once_make_one_payment_when_each_claim_runs_started_with_it() {
    let app = TestApp::spawn().await;
    // A payment first: the process knows its gateway, so each claim of a new key runs `started` in
    // its statement, and every request racing for the key tries to insert its payment there.
    app.paid(1000, "tok_visa").await;
    app.gateway.faults(json!({ "mode": "latency", "latency_ms": 300, "count": CONCURRENT })).await;
    let key = new_key();

    let (fresh, in_flight, replayed) = fire(&app, &key).await;

    assert_eq!(fresh, 1, "exactly one request drove the key");
    assert_eq!(fresh + in_flight + replayed, CONCURRENT);
    let (keys, payments, _, _) = app.row_counts().await;
    assert_eq!((keys, payments), (2, 2), "one key row and one payment for the key");
    assert_eq!(app.gateway.stats().await.charges, 2);
    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.headers()["Idempotent-Replayed"], "true");
}
