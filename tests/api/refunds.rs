//! Refunds: a second endpoint on the same idempotency layer, and the rule that no key can
//! enforce (the sum of a payment's refunds never exceeds it), held by the database.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use diesel_async::RunQueryDsl;
use payments_service::workers::Worker;

use crate::helpers::{GatewayControl, OpenTransaction, TestApp, new_key, wait_until};

async fn problem(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    (status, response.json().await.unwrap())
}

#[tokio::test]
async fn partial_refunds_up_to_the_whole_payment_then_nothing_is_left() {
    let app = TestApp::spawn().await;
    let payment = app.paid(1000, "tok_visa").await;
    let id = payment["id"].as_str().unwrap();

    let first = app.post_refund(&new_key(), &json!({ "payment": id, "amount": 300 })).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();
    assert_eq!(
        (first["object"].as_str(), first["status"].as_str(), first["amount"].as_i64()),
        (Some("refund"), Some("succeeded"), Some(300))
    );

    let (status, too_much) = problem(app.post_refund(&new_key(), &json!({ "payment": id, "amount": 800 })).await).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(too_much["type"], "https://payments.example/problems/refund-exceeds-payment");
    assert_eq!(too_much["refundable"], 700);

    // No amount: all that is left.
    let rest = app.post_refund(&new_key(), &json!({ "payment": id })).await;
    assert_eq!(rest.status(), StatusCode::CREATED);
    assert_eq!(rest.json::<Value>().await.unwrap()["amount"], 700);

    let (status, nothing) = problem(app.post_refund(&new_key(), &json!({ "payment": id })).await).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(nothing["type"], "https://payments.example/problems/payment-already-refunded");

    let now: Value = app.get(&format!("/v1/payments/{id}")).await.json().await.unwrap();
    assert_eq!((now["amount_refunded"].as_i64(), now["refunded"].as_bool()), (Some(1000), Some(true)));
    let list: Value = app.get(&format!("/v1/refunds?payment={id}")).await.json().await.unwrap();
    assert_eq!(list["data"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn refusals_are_answers_stored_under_the_key() {
    let app = TestApp::spawn().await;
    let declined = app
        .post_payment(&new_key(), &json!({ "amount": 500, "currency": "usd", "source": "tok_chargeDeclined" }))
        .await;
    let declined: Value = declined.json().await.unwrap();
    let key = new_key();
    let body = json!({ "payment": declined["payment"]["id"] });
    let (status, refused) = problem(app.post_refund(&key, &body).await).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(refused["type"], "https://payments.example/problems/payment-not-refundable");
    let replay = app.post_refund(&key, &body).await;
    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
    let refusals = app.audit_trail().await.into_iter().filter(|(action, _)| action == "refund.refused").count();
    assert_eq!(refusals, 1, "the refusal is in the audit trail, once");

    let other = app.create_account("other").await;
    let theirs = app.paid(100, "tok_visa").await;
    let response = reqwest::Client::new()
        .post(format!("{}/v1/refunds", app.address))
        .bearer_auth(&other)
        .header("Idempotency-Key", new_key())
        .json(&json!({ "payment": theirs["id"] }))
        .send()
        .await
        .unwrap();
    let (status, missing) = problem(response).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(missing["type"], "https://payments.example/problems/payment-not-found");
}

#[tokio::test]
async fn a_refused_refund_made_nothing_so_its_key_is_new_again_once_reaped() {
    let app = TestApp::builder().key_retention(std::time::Duration::from_secs(1)).spawn().await;
    let payment = app.paid(1000, "tok_visa").await;
    let key = new_key();
    let (status, _) = problem(app.post_refund(&key, &json!({ "payment": payment["id"], "amount": 5000 })).await).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "more than the payment");
    wait_until(std::time::Duration::from_secs(10), "the key expired", || app.key_has_expired(&key)).await;
    app.workers().reaper.run_once().await.unwrap();
    assert!(app.key_row(&key).await.is_none(), "reaped");

    let again = app.post_refund(&key, &json!({ "payment": payment["id"], "amount": 300 })).await;

    assert_eq!(again.status(), StatusCode::CREATED, "a new request under the key");
    assert_eq!(again.json::<Value>().await.unwrap()["amount"], 300);
}

#[tokio::test]
async fn a_key_used_for_a_payment_is_refused_for_a_refund() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let payment = app.post_payment(&key, &json!({ "amount": 100, "currency": "usd", "source": "tok_visa" })).await;
    let payment: Value = payment.json().await.unwrap();
    let (status, _) = problem(app.post_refund(&key, &json!({ "payment": payment["id"] })).await).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
}

/// A refund whose gateway answer is lost (`mode`), retried, or left to the completer: one refund
/// at the gateway, the one the answer names.
async fn a_lost_refund_answer_is_healed_with_one_refund(mode: &str, by_completer: bool) {
    let app = TestApp::builder()
        .gateway_timeout(std::time::Duration::from_millis(500))
        .workers(|w| w.completer_backoff = std::time::Duration::ZERO)
        .spawn()
        .await;
    let gateway = GatewayControl::new(app.gateway_url());
    let payment = app.paid(1000, "tok_visa").await;
    let (key, body) = (new_key(), json!({ "payment": payment["id"], "amount": 250 }));
    gateway.fault(mode, 1).await;
    assert_eq!(app.post_refund(&key, &body).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    // The gateway forgets its keys: only the look-up by key can find what it did.
    gateway.forget_keys().await;

    if by_completer {
        let workers = app.workers();
        wait_until(std::time::Duration::from_secs(10), "the completer finishes the refund", || async {
            workers.completer.run_once().await.unwrap();
            app.key_row(&key).await.is_some_and(|row| row.recovery_point == "finished")
        })
        .await;
    }
    let retry = app.post_refund(&key, &body).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    let refund: Value = retry.json().await.unwrap();
    let stats = gateway.all_stats().await;
    assert_eq!((stats["refunds"].as_u64(), stats["refunded_amount"].as_u64()), (Some(1), Some(250)));
    let key_id = app.key_row(&key).await.unwrap().id;
    let at_gateway = gateway.refunds_for(&app.downstream_key(key_id)).await;
    assert_eq!(at_gateway.len(), 1);
    assert_eq!(refund["gateway_refund_id"], at_gateway[0]["id"]);
    let now: Value = app.get(&format!("/v1/payments/{}", payment["id"].as_str().unwrap())).await.json().await.unwrap();
    assert_eq!(now["amount_refunded"], 250);
}

#[tokio::test]
async fn a_refund_whose_answer_was_lost_after_it_was_made_is_adopted_on_retry() {
    a_lost_refund_answer_is_healed_with_one_refund("error_after", false).await;
}

#[tokio::test]
async fn a_refund_that_timed_out_after_it_was_made_is_adopted_by_the_completer() {
    a_lost_refund_answer_is_healed_with_one_refund("timeout_after", true).await;
}

#[tokio::test]
async fn a_refund_key_tells_its_story() {
    let app = TestApp::spawn().await;
    let payment = app.paid(1000, "tok_visa").await;
    let key = new_key();
    assert_eq!(app.post_refund(&key, &json!({ "payment": payment["id"] })).await.status(), StatusCode::CREATED);

    let story: Value = app.key_story(&key).await.json().await.unwrap();
    assert_eq!(story["recovery_point"], "finished");
    assert_eq!(story["refund"]["status"], "succeeded");
    let actions: Vec<&str> = story["trail"].as_array().unwrap().iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(
        actions,
        ["idempotency_key.claimed", "refund.created", "refund.outcome_recorded", "refund.finished"],
        "{story}"
    );
}

#[tokio::test]
async fn refund_requests_are_counted_apart_from_payments() {
    let app = TestApp::spawn().await;
    let payment = app.paid(1000, "tok_visa").await;
    let key = new_key();
    for _ in 0..2 {
        app.post_refund(&key, &json!({ "payment": payment["id"], "amount": 10 })).await;
    }

    let scrape = app.metrics().await;
    let count =
        |endpoint, outcome| scrape.count("idempotency_requests_total", &[("endpoint", endpoint), ("outcome", outcome)]);
    assert_eq!((count("refunds", "created"), count("refunds", "replayed")), (1.0, 1.0));
    assert_eq!((count("payments", "created"), count("payments", "replayed")), (1.0, 0.0));
    assert_eq!(scrape.count("refunds_total", &[("status", "succeeded")]), 1.0);
}

#[tokio::test]
async fn an_expired_refund_key_answers_410_naming_its_refund_and_refunds_nothing() {
    let app = TestApp::builder().key_retention(std::time::Duration::from_secs(1)).spawn().await;
    let gateway = GatewayControl::new(app.gateway_url());
    let payment = app.paid(1000, "tok_visa").await;
    let (key, body) = (new_key(), json!({ "payment": payment["id"], "amount": 100 }));
    let refund: Value = app.post_refund(&key, &body).await.json().await.unwrap();
    wait_until(std::time::Duration::from_secs(10), "the key expired", || app.key_has_expired(&key)).await;

    // Expired, then reaped: the same answer, whatever the body, and never a second refund.
    for reaped in [false, true] {
        if reaped {
            app.workers().reaper.run_once().await.unwrap();
            assert!(app.key_row(&key).await.is_none(), "reaped");
        }
        let late = app.post_refund(&key, &json!({ "payment": payment["id"], "amount": 999 })).await;
        let (status, problem) = problem(late).await;
        assert_eq!(status, StatusCode::GONE, "reaped: {reaped}");
        assert_eq!(problem["refund"]["id"], refund["id"]);
    }
    assert_eq!(gateway.all_stats().await["refunds"], 1);
    // A key that made a refund is still not a payment's, after its record is gone.
    let as_payment = app.post_payment(&key, &json!({ "amount": 100, "currency": "usd", "source": "tok_visa" })).await;
    assert_eq!(as_payment.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

/// A refund of `body` sent while another transaction holds `update` of the payment's row, not
/// committed yet; committed once the refund waits for that transaction's lock. A refund that
/// answers without waiting (deciding on the row as it was before) fails the test with its answer.
async fn refund_behind(app: &TestApp, update: &str, body: Value) -> reqwest::Response {
    let mut other = OpenTransaction::begin(&app.database.url).await;
    other.run(update).await;
    let key = new_key();
    let (refund, committed) =
        tokio::join!(app.post_refund(&key, &body), other.commit_once_waited_for(Duration::from_secs(10)));
    if let Err(why) = committed {
        let (status, answer) = (refund.status(), refund.text().await.unwrap_or_default());
        panic!("the refund did not wait for the update's lock ({why}): {status} {answer}");
    }
    refund
}

#[tokio::test]
async fn a_refund_decides_on_the_payment_as_a_concurrent_refund_left_it_never_on_an_older_read() {
    let app = TestApp::spawn().await;
    let payment = app.paid(999, "tok_visa").await;
    let id = payment["id"].as_str().unwrap().to_owned();
    // Another refund's transaction holds the payment's row, having reserved 700, not committed yet;
    // this refund's `started` waits for that row, and then sees what the other left: 299.
    let reserve = format!("UPDATE payments SET amount_refund_pending = amount_refund_pending + 700 WHERE id = '{id}'");
    let refund = refund_behind(&app, &reserve, json!({ "payment": id, "amount": 333 })).await;

    let (status, refused) = problem(refund).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert_eq!(
        (refused["type"].as_str(), refused["refundable"].as_i64()),
        (Some("https://payments.example/problems/refund-exceeds-payment"), Some(299))
    );
}

#[tokio::test]
async fn a_refund_decided_as_the_payments_charge_is_recorded_calls_the_gateway_with_that_charge() {
    let app = TestApp::spawn().await;
    let payment = app.paid(1000, "tok_visa").await;
    let (id, charge) = (payment["id"].as_str().unwrap(), payment["gateway_charge_id"].as_str().unwrap());
    // The payment as its `charge_created` finds it: pending, no charge recorded yet.
    let pending = format!("UPDATE payments SET status = 'pending', gateway_charge_id = NULL WHERE id = '{id}'");
    diesel::sql_query(&pending).execute(&mut app.db().await).await.unwrap();
    // That phase's transaction, the charge recorded, not committed yet: the refund's statement
    // begins while the payment is pending, waits for its row, and then decides on what the phase
    // committed: a succeeded payment, with its charge.
    let record = format!("UPDATE payments SET status = 'succeeded', gateway_charge_id = '{charge}' WHERE id = '{id}'");
    let refund = refund_behind(&app, &record, json!({ "payment": id, "amount": 400 })).await;

    let (status, refund) = problem(refund).await;
    assert_eq!(status, StatusCode::CREATED, "{refund}");
    assert_eq!((refund["status"].as_str(), refund["amount"].as_i64()), (Some("succeeded"), Some(400)));
    let now: Value = app.get(&format!("/v1/payments/{id}")).await.json().await.unwrap();
    assert_eq!(now["amount_refunded"].as_i64(), Some(400));
    let settled = format!("SELECT amount_refund_pending = 0 FROM payments WHERE id = '{id}'");
    assert!(app.database_says(&settled).await, "nothing stays reserved");
}

#[tokio::test]
async fn the_database_refuses_refund_totals_beyond_the_payment() {
    let app = TestApp::spawn().await;
    let payment = app.paid(500, "tok_visa").await;
    let id = payment["id"].as_str().unwrap();
    for totals in ["amount_refunded = 400, amount_refund_pending = 101", "amount_refund_pending = -1"] {
        let sql = format!("UPDATE payments SET {totals} WHERE id = '{id}'");
        let refused = diesel::sql_query(&sql).execute(&mut app.db().await).await;
        assert!(refused.is_err_and(|e| e.to_string().contains("payments_refund_totals_check")), "{sql}");
    }
}

#[tokio::test]
async fn a_refund_the_gateway_refuses_is_a_stored_502_and_gives_the_amount_back() {
    let app = TestApp::spawn().await;
    let payment = app.paid(1000, "tok_visa").await;
    // Someone refunded the whole charge at the gateway directly, behind the service's back.
    let direct = reqwest::Client::new()
        .post(format!("{}/v1/refunds", app.gateway_url()))
        .header("Idempotency-Key", new_key())
        .json(&json!({ "charge": payment["gateway_charge_id"], "amount": 1000 }))
        .send()
        .await
        .unwrap();
    assert!(direct.status().is_success());
    let (key, body) = (new_key(), json!({ "payment": payment["id"], "amount": 500 }));

    let (status, refused) = problem(app.post_refund(&key, &body).await).await;

    assert_eq!(status, StatusCode::BAD_GATEWAY, "{refused}");
    assert_eq!(refused["type"], "https://payments.example/problems/gateway-rejected");
    assert_eq!(
        (refused["refund"]["status"].as_str(), refused["refund"]["failure_code"].as_str()),
        (Some("failed"), Some("gateway_rejected"))
    );
    let id = payment["id"].as_str().unwrap();
    assert!(
        app.database_says(&format!(
            "SELECT amount_refund_pending = 0 AND amount_refunded = 0 FROM payments WHERE id = '{id}'"
        ))
        .await
    );
    assert!(app.database_says("SELECT count(*) = 1 FROM events WHERE event_type = 'refund.failed'").await);
    assert_eq!(app.post_refund(&key, &body).await.headers()["Idempotent-Replayed"], "true");
}

#[tokio::test]
async fn a_payments_refunds_are_listed_newest_first_a_page_at_a_time() {
    let app = TestApp::spawn().await;
    let payment = app.paid(1000, "tok_visa").await;
    let id = payment["id"].as_str().unwrap();
    let mut made = Vec::new();
    for _ in 0..3 {
        let refund: Value =
            app.post_refund(&new_key(), &json!({ "payment": id, "amount": 100 })).await.json().await.unwrap();
        made.push(refund["id"].as_str().unwrap().to_owned());
    }
    assert!(
        app.database_says("SELECT count(*) = 3 FROM events WHERE event_type = 'refund.succeeded'").await,
        "one event each"
    );

    let first: Value = app.get(&format!("/v1/refunds?payment={id}&limit=2")).await.json().await.unwrap();
    let ids = |page: &Value| {
        page["data"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect::<Vec<_>>()
    };
    assert_eq!((ids(&first), first["has_more"].as_bool()), (vec![made[2].clone(), made[1].clone()], Some(true)));
    let rest: Value =
        app.get(&format!("/v1/refunds?payment={id}&limit=2&starting_after={}", made[1])).await.json().await.unwrap();
    assert_eq!((ids(&rest), rest["has_more"].as_bool()), (vec![made[0].clone()], Some(false)));

    let (status, missing) =
        problem(app.get(&format!("/v1/refunds?payment={id}&starting_after={}", Uuid::now_v7())).await).await;
    assert_eq!(
        (status, missing["type"].as_str()),
        (StatusCode::NOT_FOUND, Some("https://payments.example/problems/refund-not-found"))
    );
    // A cursor is a place in this payment's list: another payment's refund is none.
    let other = app.paid(1000, "tok_visa").await;
    let elsewhere: Value =
        app.post_refund(&new_key(), &json!({ "payment": other["id"], "amount": 100 })).await.json().await.unwrap();
    let (status, foreign) = problem(
        app.get(&format!("/v1/refunds?payment={id}&starting_after={}", elsewhere["id"].as_str().unwrap())).await,
    )
    .await;
    assert_eq!(
        (status, foreign["type"].as_str()),
        (StatusCode::NOT_FOUND, Some("https://payments.example/problems/refund-not-found"))
    );
    let (status, _) = problem(app.get(&format!("/v1/refunds?payment={}", Uuid::now_v7())).await).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
