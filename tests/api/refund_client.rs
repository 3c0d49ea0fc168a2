//! `payments refund`: the reference client under `payments pay`, sending refunds, against the real
//! service and its mock gateway with faults. The retry loop and the reading of answers are the
//! same; a refund's own refusals are answers about its key.

use std::time::Duration;

use payments_client::Client;
use serde_json::Value;

use crate::helpers::{ClientRun, TestApp, new_key};

/// `payments refund --payment <payment>` against `app`, with these extra flags.
async fn refund(app: &TestApp, payment: &str, flags: &[&str]) -> ClientRun {
    ClientRun::of(app, "refund", &[&["--payment", payment], flags].concat()).await
}

/// A payment of 1000 from `source`, by its id.
async fn paid(app: &TestApp, source: &str) -> String {
    app.paid(1000, source).await["id"].as_str().unwrap().to_owned()
}

/// The payment's refunds, as `GET /v1/refunds?payment=` lists them.
async fn refunds_of(app: &TestApp, payment: &str) -> Vec<Value> {
    let list: Value = app.get(&format!("/v1/refunds?payment={payment}")).await.json().await.unwrap();
    list["data"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_refund_through_a_gateway_fault_ends_with_one_refund() {
    for fault in ["error_after", "error_before"] {
        let app = TestApp::spawn().await;
        let payment = paid(&app, "tok_visa").await;
        app.gateway.fault(fault, 1).await;

        let refunded = refund(&app, &payment, &["--amount", "400", "--reason", "requested_by_customer"]).await;

        assert_eq!(refunded.code, 0, "{fault}: {}", refunded.stderr);
        let attempts = refunded.attempts();
        assert_eq!(attempts.len(), 2, "{fault}: {}", refunded.stderr);
        assert!(attempts[0].starts_with("attempt 1: 503 gateway-unavailable, retrying in 2."), "{}", attempts[0]);
        assert_eq!(attempts[1], "attempt 2: 201 Created");
        let body = refunded.body();
        assert_eq!((body["status"].as_str(), body["amount"].as_i64()), (Some("succeeded"), Some(400)), "{body}");
        let stats = app.gateway.all_stats().await;
        assert_eq!((stats["refunds"].as_u64(), stats["faults"].as_u64()), (Some(1), Some(1)), "{fault}: {stats}");
        // The one refund of the payment is the one the client was answered.
        let refunds = refunds_of(&app, &payment).await;
        assert_eq!(refunds.len(), 1, "{fault}");
        assert_eq!(refunds[0]["id"], body["id"]);
    }
}

#[tokio::test]
async fn a_refusal_exits_declined_and_is_not_retried() {
    let app = TestApp::spawn().await;
    let payment = paid(&app, "tok_visa").await;

    // With --key, as if an earlier run may have sent it: a refusal is an answer about the key, and
    // definitive even so.
    let key = new_key();
    let too_much = refund(&app, &payment, &["--amount", "1500", "--key", &key]).await;
    assert_eq!(too_much.code, 3, "{}", too_much.stderr);
    assert_eq!(too_much.attempts(), ["attempt 1: 400 refund-exceeds-payment"]);
    assert_eq!(too_much.body()["refundable"], 1000);

    let declined = app
        .post_payment(
            &new_key(),
            &serde_json::json!({ "amount": 500, "currency": "usd", "source": "tok_chargeDeclined" }),
        )
        .await;
    let declined: Value = declined.json().await.unwrap();
    let not_refundable = refund(&app, declined["payment"]["id"].as_str().unwrap(), &[]).await;
    assert_eq!((not_refundable.code, not_refundable.attempts()), (3, vec!["attempt 1: 400 payment-not-refundable"]));

    let unknown = refund(&app, &uuid::Uuid::now_v7().to_string(), &[]).await;
    assert_eq!((unknown.code, unknown.attempts()), (3, vec!["attempt 1: 404 payment-not-found"]));

    let whole = refund(&app, &payment, &[]).await;
    assert_eq!((whole.code, whole.attempts()), (0, vec!["attempt 1: 201 Created"]));
    assert_eq!(whole.body()["amount"], 1000);
    let nothing_left = refund(&app, &payment, &[]).await;
    assert_eq!((nothing_left.code, nothing_left.attempts()), (3, vec!["attempt 1: 400 payment-already-refunded"]));

    // Stored under its key: asked again, the same answer, not a refund of what is left.
    let again = refund(&app, &payment, &["--amount", "1500", "--key", &key]).await;
    assert_eq!((again.code, again.attempts()), (3, vec!["attempt 1: 400 refund-exceeds-payment (replayed)"]));
    assert_eq!(app.gateway.all_stats().await["refund_requests"], 1, "only the whole refund reached the gateway");
}

#[tokio::test]
async fn a_key_used_for_a_payment_is_rejected_for_a_refund() {
    let app = TestApp::spawn().await;
    let payment = paid(&app, "tok_visa").await;
    let key = new_key();
    let args = ["--amount", "300", "--currency", "usd", "--source", "tok_visa", "--key", &key];
    assert_eq!(ClientRun::of(&app, "pay", &args).await.code, 0);

    let reused = refund(&app, &payment, &["--key", &key]).await;

    assert_eq!((reused.code, reused.attempts()), (4, vec!["attempt 1: 422 idempotency-key-reused"]));
    assert_eq!(app.gateway.all_stats().await["refund_requests"], 0);
}

#[tokio::test]
async fn a_pending_refund_is_made_and_said_to_be_pending() {
    let app = TestApp::spawn().await;
    let payment = paid(&app, "tok_refundPending").await;

    let pending = refund(&app, &payment, &[]).await;

    assert_eq!((pending.code, pending.attempts()), (0, vec!["attempt 1: 201 Created"]));
    let id = pending.body()["id"].as_str().unwrap().to_owned();
    assert_eq!(pending.body()["status"], "pending");
    assert!(
        pending.stderr.contains(&format!(
            "the refund is pending: the gateway settles it later, succeeded or failed. GET /v1/refunds/{id} shows how it \
             ends"
        )),
        "{}",
        pending.stderr
    );
}

#[tokio::test]
async fn giving_up_prints_the_key_and_resuming_with_it_finishes_the_same_refund() {
    let app = TestApp::spawn().await;
    let payment = paid(&app, "tok_visa").await;
    // The refund is made, then the answer is lost: the one attempt allowed ends without knowing.
    app.gateway.fault("error_after", 1).await;
    let gave_up = refund(&app, &payment, &["--amount", "250", "--max-attempts", "1"]).await;
    assert_eq!(gave_up.code, 5, "{}", gave_up.stderr);
    assert!(gave_up.stderr.contains("The refund may still complete"), "{}", gave_up.stderr);
    assert!(gave_up.stderr.contains("(it is never refunded twice)"), "{}", gave_up.stderr);
    let key = gave_up.key_to_resume();

    let resumed = refund(&app, &payment, &["--amount", "250", "--key", &key]).await;

    assert_eq!((resumed.code, resumed.attempts()), (0, vec!["attempt 1: 201 Created"]), "{}", resumed.stderr);
    assert_eq!(refunds_of(&app, &payment).await.len(), 1);
    let stats = app.gateway.all_stats().await;
    assert_eq!((stats["refunds"].as_u64(), stats["refunded_amount"].as_u64()), (Some(1), Some(250)), "{stats}");
}

#[tokio::test]
async fn a_refund_key_whose_record_expired_exits_6_naming_the_refund_it_made() {
    let app = TestApp::builder().key_retention(Duration::from_secs(1)).spawn().await;
    let payment = paid(&app, "tok_visa").await;
    let key = Client::new_key();
    let refunded = refund(&app, &payment, &["--amount", "100", "--key", &key]).await;
    assert_eq!(refunded.code, 0, "{}", refunded.stderr);
    let id = refunded.body()["id"].as_str().unwrap().to_owned();
    app.wait_until_reaped(&key).await;

    let late = refund(&app, &payment, &["--amount", "100", "--key", &key]).await;

    assert_eq!((late.code, late.attempts()), (6, vec!["attempt 1: 410 idempotency-key-expired"]), "{}", late.stderr);
    assert!(
        late.stderr.contains(&format!("the key made refund {id}, and nothing was refunded now. GET /v1/refunds/{id}")),
        "{}",
        late.stderr
    );
    assert_eq!(late.body()["refund"]["id"], id.as_str());
    assert_eq!(app.gateway.all_stats().await["refund_requests"], 1);
}
