//! What a payment costs the database: the claim and the three phases, one statement each, each
//! prepared once per connection; and a replay that costs nothing, answered from memory.

use serde_json::json;

use crate::helpers::{TestApp, new_key, payment_body, record_statements, statements};

/// The claim, then three phases, each one statement: its writes and the fenced key update.
const STATEMENTS_PER_PAYMENT: usize = 1 + 3;
/// Authentication, once per API key and process (then kept for a minute).
const STATEMENTS_PER_AUTHENTICATION: usize = 1;

#[tokio::test]
async fn a_payment_costs_the_claim_and_three_phases_with_every_statement_kept_prepared() {
    record_statements();
    let app = TestApp::spawn().await;
    let database = app.database.name.clone();

    let key = new_key();
    app.post_payment(&key, &payment_body()).await;
    let first = statements(&database);
    assert_eq!(first.executed.len(), STATEMENTS_PER_AUTHENTICATION + STATEMENTS_PER_PAYMENT, "{:#?}", first.executed);

    for _ in 0..3 {
        app.post_payment(&new_key(), &payment_body()).await;
    }
    let all = statements(&database);
    assert_eq!(all.executed.len(), STATEMENTS_PER_AUTHENTICATION + 4 * STATEMENTS_PER_PAYMENT);

    // Every statement ran prepared from the cache, and none was prepared twice on one connection.
    for sql in &all.executed {
        assert!(all.prepared.iter().any(|prepared| sql.starts_with(prepared)), "not kept prepared: {sql}");
    }
    let mut distinct = all.prepared.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), all.prepared.len(), "the pool kept one connection, so each statement is prepared once");
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
