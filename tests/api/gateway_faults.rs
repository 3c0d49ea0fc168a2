//! The gateway misbehaves. An indeterminate outcome (5xx, timeout, dropped connection, 409) is a
//! 503 that stores nothing and leaves the key unlocked at `started`; the retry finishes the
//! request; and the gateway holds exactly one charge in the end.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{TestApp, charge_requests, mount_no_charges_found, new_key, payment_body, wait_until};

/// Asserts the 503 of an indeterminate outcome, and what it left behind: the key unlocked at
/// `started` with nothing stored, its payment pending.
async fn assert_indeterminate(app: &TestApp, key: &str, response: reqwest::Response) {
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "2");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "https://payments.example/problems/gateway-unavailable");
    assert!(problem["detail"].as_str().unwrap().contains("may still complete"), "{problem}");
    let row = app.key_row(key).await.unwrap();
    assert_eq!(row.recovery_point, "started");
    assert!(row.locked_until.is_none() && row.lock_token.is_none(), "unlocked, so the retry resumes at once");
    assert!(row.response_status.is_none() && row.response_body.is_none(), "nothing final stored");
    let (keys, payments, _, jobs) = app.row_counts().await;
    assert_eq!((keys, payments, jobs), (1, 1, 0));
}

/// A wiremock gateway that answers the first charge request with `first`, and later ones with a
/// charge; its look-up by key finds nothing.
async fn gateway_answering_first(first: ResponseTemplate) -> MockServer {
    let gateway = MockServer::start().await;
    mount_no_charges_found(&gateway).await;
    Mock::given(method("POST")).and(path("/v1/charges")).respond_with(first).up_to_n_times(1).mount(&gateway).await;
    Mock::given(method("POST"))
        .and(path("/v1/charges"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({ "id": "ch_after_retry" })))
        .mount(&gateway)
        .await;
    gateway
}

/// The indeterminate first answer, then a retry that looks the charge up, finds none, and charges
/// with the same downstream key.
async fn retry_finishes_after(first: ResponseTemplate) {
    let gateway = gateway_answering_first(first).await;
    let app = TestApp::builder().gateway_url(gateway.uri()).gateway_timeout(Duration::from_millis(300)).spawn().await;
    let key = new_key();

    let response = app.post_payment(&key, &payment_body()).await;
    assert_indeterminate(&app, &key, response).await;

    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    let payment: Value = retry.json().await.unwrap();
    assert_eq!(payment["gateway_charge_id"], "ch_after_retry");
    let requests = charge_requests(&gateway).await;
    let calls: Vec<_> = requests.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(calls, ["POST", "GET", "POST"], "charge, then (resumed) look-up, then charge");
    let key = &requests[0].headers["idempotency-key"];
    assert_eq!(&requests[2].headers["idempotency-key"], key, "the same downstream key");
    let looked_up = requests[1].url.query_pairs().find(|(name, _)| name == "idempotency_key").unwrap().1;
    assert_eq!(looked_up, key.to_str().unwrap());
    let (keys, payments, _, jobs) = app.row_counts().await;
    assert_eq!((keys, payments, jobs), (1, 1, 1));
}

#[tokio::test]
async fn a_gateway_500_is_a_503_and_the_retry_finishes() {
    retry_finishes_after(ResponseTemplate::new(500)).await;
}

#[tokio::test]
async fn a_gateway_timeout_is_a_503_and_the_retry_finishes() {
    let slow =
        ResponseTemplate::new(200).set_body_json(json!({ "id": "ch_too_late" })).set_delay(Duration::from_secs(3));
    retry_finishes_after(slow).await;
}

#[tokio::test]
async fn a_gateway_409_is_a_503_and_the_retry_finishes() {
    retry_finishes_after(ResponseTemplate::new(409).set_body_json(json!({ "error": { "type": "idempotency_error" } })))
        .await;
}

#[tokio::test]
async fn an_unreadable_success_is_a_503_and_the_retry_finishes() {
    retry_finishes_after(ResponseTemplate::new(200).set_body_string("<html>")).await;
}

#[tokio::test]
async fn a_dropped_connection_is_a_503() {
    // A "gateway" that says it has no identity of its own (a bare 404 to the questions of who it
    // is), and closes every charge request's connection without a word.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut request = [0; 4096];
            let read = tokio::io::AsyncReadExt::read(&mut socket, &mut request).await.unwrap_or(0);
            if request[..read].starts_with(b"GET ") {
                let not_found = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                let _ = tokio::io::AsyncWriteExt::write_all(&mut socket, not_found).await;
            }
        }
    });
    let app = TestApp::builder().gateway_url(url).spawn().await;
    let key = new_key();

    let response = app.post_payment(&key, &payment_body()).await;

    assert_indeterminate(&app, &key, response).await;
}

#[tokio::test]
async fn a_gateway_that_cannot_say_who_it_is_gets_no_payment_started() {
    // Every connection closes without a word, the identity look-up's too.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            drop(socket);
        }
    });
    let app = TestApp::builder().gateway_url(url).spawn().await;
    let key = new_key();

    let response = app.post_payment(&key, &payment_body()).await;

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let row = app.key_row(&key).await.unwrap();
    assert_eq!((row.recovery_point.as_str(), row.locked_until), ("started", None));
    let (keys, payments, _, jobs) = app.row_counts().await;
    assert_eq!((keys, payments, jobs), (1, 0, 0), "no payment, so nothing to charge");
}

#[tokio::test]
async fn a_gateway_402_is_a_stored_decline() {
    let decline =
        json!({ "error": { "type": "card_error", "code": "insufficient_funds", "message": "Insufficient funds." } });
    let gateway = gateway_answering_first(ResponseTemplate::new(402).set_body_json(decline)).await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
    let key = new_key();

    let response = app.post_payment(&key, &payment_body()).await;

    assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["payment"]["failure_code"], "insufficient_funds");
    assert_eq!(problem["detail"], "Insufficient funds. (insufficient_funds)");
    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::PAYMENT_REQUIRED);
    assert_eq!(charge_requests(&gateway).await.len(), 1, "a decline is final");
}

#[tokio::test]
async fn a_gateway_400_is_a_stored_502() {
    let gateway =
        gateway_answering_first(ResponseTemplate::new(400).set_body_json(json!({ "error": { "message": "bad" } })))
            .await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
    let key = new_key();

    let response = app.post_payment(&key, &payment_body()).await;

    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(retry.headers()["Idempotent-Replayed"], "true");
    assert_eq!(charge_requests(&gateway).await.len(), 1, "a rejection is final");
}

/// Against the real mock: the gateway fails after it charged, and still holds one charge after
/// the retry, which adopts that charge.
async fn charge_made_then_failed(mode: &str) {
    let app = TestApp::builder().gateway_timeout(Duration::from_millis(300)).spawn().await;
    app.gateway.fault(mode, 1).await;
    let key = new_key();

    let response = app.post_payment(&key, &payment_body()).await;
    assert_indeterminate(&app, &key, response).await;
    assert_eq!(app.gateway.stats().await.charges, 1, "the gateway charged before failing");

    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    let payment: Value = retry.json().await.unwrap();
    let key_id = app.key_row(&key).await.unwrap().id;
    let charges = app.gateway.charges_for(&app.downstream_key(key_id)).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(payment["gateway_charge_id"], charges[0]["id"]);
    assert_eq!(app.gateway.stats().await.charges, 1);
}

#[tokio::test]
async fn error_after_charging_heals_on_retry_with_one_charge() {
    charge_made_then_failed("error_after").await;
}

#[tokio::test]
async fn timeout_after_charging_heals_on_retry_with_one_charge() {
    charge_made_then_failed("timeout_after").await;
}

#[tokio::test]
async fn error_before_charging_heals_on_retry_with_one_charge() {
    let app = TestApp::spawn().await;
    app.gateway.fault("error_before", 1).await;
    let key = new_key();

    let response = app.post_payment(&key, &payment_body()).await;
    assert_indeterminate(&app, &key, response).await;
    assert_eq!(app.gateway.stats().await.charges, 0);

    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CREATED);
    assert_eq!(app.gateway.stats().await.charges, 1);
}

#[tokio::test]
async fn retrying_through_random_faults_ends_with_one_charge() {
    let app = TestApp::builder().gateway_timeout(Duration::from_millis(300)).spawn().await;
    app.gateway.faults(json!({ "mode": "random", "rate": 1.0, "count": 4 })).await;
    let key = new_key();

    // Every charge request fails somehow, four times; a client keeps retrying. Once a charge
    // exists, the retry finds it by look-up and adopts it.
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let status = app.post_payment(&key, &payment_body()).await.status();
        statuses.push(status.as_u16());
        if status == StatusCode::CREATED {
            break;
        }
    }

    assert_eq!(statuses.last(), Some(&201), "{statuses:?}");
    assert!(statuses[..statuses.len() - 1].iter().all(|&s| s == 503), "{statuses:?}");
    assert_eq!(app.gateway.stats().await.charges, 1);
}

#[tokio::test]
async fn a_gateway_429_is_a_503_and_the_retry_finishes() {
    retry_finishes_after(ResponseTemplate::new(429)).await;
}

#[tokio::test]
async fn an_idempotency_conflict_at_the_gateway_is_a_503_not_a_rejection() {
    let conflict = json!({ "error": { "type": "idempotency_error", "message": "Keys for idempotent requests can only be used with the same parameters" } });
    retry_finishes_after(ResponseTemplate::new(400).set_body_json(conflict)).await;
}

#[tokio::test]
async fn a_charge_id_the_payment_cannot_record_is_a_503_never_a_failure() {
    let unrecordable = json!({ "id": format!("ch_{}", "x".repeat(300)) });
    retry_finishes_after(ResponseTemplate::new(200).set_body_json(unrecordable)).await;
}

#[tokio::test]
async fn an_odd_decline_is_still_recorded_as_a_decline() {
    let message = format!("Declined\u{0}{}", "!".repeat(600));
    let decline = json!({ "error": { "type": "card_error", "code": "", "message": message } });
    let gateway = gateway_answering_first(ResponseTemplate::new(402).set_body_json(decline)).await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;

    let response = app.post_payment(&new_key(), &payment_body()).await;

    assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["payment"]["failure_code"], "card_declined", "an empty code gets the generic one");
    let recorded = problem["payment"]["failure_message"].as_str().unwrap();
    assert_eq!(recorded.chars().count(), 500, "cut to what the payment records");
    assert!(recorded.starts_with("Declined!!"), "control characters dropped: {recorded:.20}");
}

#[tokio::test]
async fn a_gateway_redirect_is_not_followed_and_is_a_503() {
    retry_finishes_after(ResponseTemplate::new(302).insert_header("Location", "/v1/charges/elsewhere")).await;
}

#[tokio::test]
async fn a_phase_that_finds_no_payment_to_record_on_moves_the_key_nowhere() {
    // The payment vanishes while the gateway takes its time (nothing of ours deletes payments:
    // this is the database contradicting itself, which a phase must not paper over).
    let gateway = MockServer::start().await;
    mount_no_charges_found(&gateway).await;
    let slow = ResponseTemplate::new(200).set_body_json(json!({ "id": "ch_1" })).set_delay(Duration::from_millis(500));
    Mock::given(method("POST")).and(path("/v1/charges")).respond_with(slow).mount(&gateway).await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
    let key = new_key();

    let body = payment_body();
    let request = app.post_payment(&key, &body);
    let vanish = async {
        wait_until(Duration::from_secs(10), "the payment is started", || async { app.row_counts().await.1 == 1 }).await;
        app.run_sql("DELETE FROM payments").await;
    };
    let (response, ()) = tokio::join!(request, vanish);

    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let row = app.key_row(&key).await.unwrap();
    assert_eq!(row.recovery_point, "started", "the key did not move on without its payment");
    assert!(row.lock_token.is_none(), "and it was released");
    let recorded = app.audit_trail().await.iter().filter(|(action, _)| action == "payment.charge_recorded").count();
    assert_eq!(recorded, 0);
}
