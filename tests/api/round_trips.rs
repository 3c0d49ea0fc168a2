//! What a payment, a refund, a capture and a cancel cost the database: the claim with `started`,
//! then the phases after the gateway's answer, one statement, each prepared once per connection;
//! a replay that costs nothing, answered from memory, and one statement from the database.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{TestApp, new_key, payment_body, record_statements, statements};

/// The claim with `started` in its statement, then `charge_created` with `finished`: their writes
/// and the fenced key update, one statement.
pub const STATEMENTS_PER_PAYMENT: usize = 2;
/// The first payment of a process: the claim alone, then `started` on its own (it asks the
/// gateway who it is, which the claim cannot wait for), then the same one.
const STATEMENTS_PER_FIRST_PAYMENT: usize = 3;
/// The claim with `started`, then `refund_created` with `finished`.
pub const STATEMENTS_PER_REFUND: usize = 2;
/// The claim with `started`, which finds nothing left to refund, then `finished` storing that.
const STATEMENTS_PER_REFUSED_REFUND: usize = 2;
/// The claim with `started`, then `capture_created` (or `cancel_created`) with `finished`.
const STATEMENTS_PER_CHANGE: usize = 2;
/// Authentication, once per API key and process (then kept for a minute).
const STATEMENTS_PER_AUTHENTICATION: usize = 1;

#[tokio::test]
async fn a_payment_costs_the_claim_with_started_and_one_phase_with_every_statement_kept_prepared() {
    record_statements();
    let app = TestApp::spawn().await;
    let database = app.database.name.clone();

    let key = new_key();
    app.post_payment(&key, &payment_body()).await;
    let first = statements(&database);
    let expected = STATEMENTS_PER_AUTHENTICATION + STATEMENTS_PER_FIRST_PAYMENT;
    assert_eq!(first.executed.len(), expected, "{:#?}", first.executed);

    for _ in 0..3 {
        app.post_payment(&new_key(), &payment_body()).await;
    }
    let all = statements(&database);
    assert_eq!(all.executed.len(), expected + 3 * STATEMENTS_PER_PAYMENT, "{:#?}", all.executed);
    // Each finished payment asks the outbox to be woken, after its commit; a process sends at
    // most one wake-up per 50 ms, however many payments ask.
    assert!((1..=4).contains(&all.wake_ups.len()), "{:#?}", all.wake_ups);
    assert!(all.wake_ups.iter().all(|sql| sql == "NOTIFY payments_outbox;"), "{:#?}", all.wake_ups);

    // Every statement ran prepared from the cache, and none was prepared twice on one connection
    // (the wake-ups may take a second one from the pool while a request holds the first).
    for sql in &all.executed {
        assert!(all.prepared.iter().any(|(_, prepared)| sql.starts_with(prepared)), "not kept prepared: {sql}");
    }
    let mut distinct = all.prepared.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), all.prepared.len(), "a statement was prepared twice on one connection");
}

#[tokio::test]
async fn a_refund_costs_the_claim_with_started_and_one_phase_and_a_refusal_the_claim_and_finished() {
    record_statements();
    let app = TestApp::spawn().await;
    let database = app.database.name.clone();
    let payment = app.paid(1000, "tok_visa").await;

    let before = statements(&database).executed.len();
    let refund = app.post_refund(&new_key(), &json!({ "payment": payment["id"], "amount": 600 })).await;
    assert_eq!(refund.status(), StatusCode::CREATED);
    let refunded = statements(&database).executed;
    assert_eq!(refunded.len() - before, STATEMENTS_PER_REFUND, "{:#?}", &refunded[before..]);

    let refused = app.post_refund(&new_key(), &json!({ "payment": payment["id"], "amount": 600 })).await;
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST, "more than is left");
    let all = statements(&database).executed;
    assert_eq!(all.len() - refunded.len(), STATEMENTS_PER_REFUSED_REFUND, "{:#?}", &all[refunded.len()..]);
}

#[tokio::test]
async fn a_capture_and_a_cancel_each_cost_the_claim_with_started_and_one_phase() {
    record_statements();
    let app = TestApp::spawn().await;
    let database = app.database.name.clone();
    for (kind, body) in [("capture", json!({ "amount": 600 })), ("cancel", json!({}))] {
        let authorization = json!({ "amount": 1000, "currency": "usd", "source": "tok_visa", "capture": false });
        let authorized: serde_json::Value = app.post_payment(&new_key(), &authorization).await.json().await.unwrap();
        let path = format!("{}/v1/payments/{}/{kind}", app.address, authorized["id"].as_str().unwrap());
        let before = statements(&database).executed.len();
        let request = app.http.post(path).bearer_auth(&app.api_key).header("Idempotency-Key", new_key());
        let changed = request.json(&body).send().await.unwrap();
        assert_eq!(changed.status(), StatusCode::OK, "{kind}");
        let all = statements(&database).executed;
        assert_eq!(all.len() - before, STATEMENTS_PER_CHANGE, "{kind}: {:#?}", &all[before..]);
    }
}

#[tokio::test]
async fn a_replay_and_a_reused_key_are_answered_from_memory_with_no_statement() {
    record_statements();
    let app = TestApp::spawn().await;
    let database = app.database.name.clone();
    let key = new_key();
    let first = app.post_payment(&key, &payment_body()).await;
    let first = first.bytes().await.unwrap();
    let before = statements(&database).executed.len();

    let replay = app.post_payment(&key, &payment_body()).await;
    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
    assert_eq!(replay.bytes().await.unwrap(), first, "byte for byte");
    let reused = app.post_payment(&key, &json!({ "amount": 1, "currency": "usd", "source": "tok_visa" })).await;
    assert_eq!(reused.status(), reqwest::StatusCode::UNPROCESSABLE_ENTITY, "another body is still a 422");

    assert_eq!(statements(&database).executed.len(), before, "neither asked the database");
}

/// Answered by another process, whose memory holds nothing of the key, a reused key's `422` (with
/// another body, or at another endpoint) and a replay cost one statement each: the short claim,
/// which finds the finished key's answer.
#[tokio::test]
async fn a_replay_and_a_reused_key_answered_from_the_database_cost_one_statement_each() {
    record_statements();
    let app = TestApp::spawn().await;
    let other = TestApp::builder().spawn_beside(&app).await;
    let database = app.database.name.clone();
    let key = new_key();
    let first = app.post_payment(&key, &payment_body()).await.bytes().await.unwrap();
    let payment: serde_json::Value = serde_json::from_slice(&first).unwrap();
    let before = statements(&database).executed.len();

    let reused = other.post_payment(&key, &json!({ "amount": 1, "currency": "usd", "source": "tok_visa" })).await;
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let elsewhere = other.post_refund(&key, &json!({ "payment": payment["id"], "amount": 600 })).await;
    assert_eq!(elsewhere.status(), StatusCode::UNPROCESSABLE_ENTITY, "a key belongs to its first endpoint");
    let replay = other.post_payment(&key, &payment_body()).await;
    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
    assert_eq!(replay.bytes().await.unwrap(), first, "byte for byte");

    let ran = &statements(&database).executed[before..];
    assert_eq!(ran.len(), STATEMENTS_PER_AUTHENTICATION + 3, "{ran:#?}");
}

#[tokio::test]
async fn a_refunds_replay_and_reused_key_are_answered_from_memory_with_no_statement_too() {
    record_statements();
    let app = TestApp::spawn().await;
    let database = app.database.name.clone();
    let payment = app.paid(1000, "tok_visa").await;
    let (key, body) = (new_key(), json!({ "payment": payment["id"], "amount": 600 }));
    let first = app.post_refund(&key, &body).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first = first.bytes().await.unwrap();
    let before = statements(&database).executed.len();

    let replay = app.post_refund(&key, &body).await;
    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
    assert_eq!(replay.bytes().await.unwrap(), first, "byte for byte");
    let reused = app.post_refund(&key, &json!({ "payment": payment["id"], "amount": 1 })).await;
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY, "another body is still a 422");

    let after = statements(&database).executed;
    assert_eq!(after.len(), before, "neither asked the database: {:#?}", &after[before..]);
}

#[tokio::test]
async fn a_payments_key_sent_to_refunds_is_refused_from_memory_with_no_statement() {
    record_statements();
    let app = TestApp::spawn().await;
    let database = app.database.name.clone();
    let key = new_key();
    let paid = app.post_payment(&key, &payment_body()).await;
    assert_eq!(paid.status(), StatusCode::CREATED);
    let payment: serde_json::Value = paid.json().await.unwrap();
    let before = statements(&database).executed.len();

    let refund = app.post_refund(&key, &json!({ "payment": payment["id"], "amount": 600 })).await;
    assert_eq!(refund.status(), StatusCode::UNPROCESSABLE_ENTITY, "a key belongs to the endpoint it was first sent to");
    let after = statements(&database).executed;
    assert_eq!(after.len(), before, "the database was not asked: {:#?}", &after[before..]);
}
