//! What a payment costs the database: the claim and the three phase transactions, each statement
//! prepared once per connection, and a replay that is a single look-up after authentication.

use crate::helpers::{TestApp, new_key, payment_body, record_statements, statements};

/// Authentication, the claim, then three phases of BEGIN, their two writes, the fenced key update
/// and COMMIT.
const STATEMENTS_PER_PAYMENT: usize = 2 + 3 * 5;
/// Authentication and the claim.
const STATEMENTS_PER_REPLAY: usize = 2;

#[tokio::test]
async fn a_payment_costs_the_claim_and_three_phases_with_every_statement_kept_prepared() {
    record_statements();
    let app = TestApp::spawn().await;
    let database = app.database.name.clone();

    let key = new_key();
    app.post_payment(&key, &payment_body()).await;
    let first = statements(&database);
    assert_eq!(first.executed.len(), STATEMENTS_PER_PAYMENT, "{:#?}", first.executed);

    for _ in 0..3 {
        app.post_payment(&new_key(), &payment_body()).await;
    }
    app.post_payment(&key, &payment_body()).await;
    let all = statements(&database);
    assert_eq!(all.executed.len(), 4 * STATEMENTS_PER_PAYMENT + STATEMENTS_PER_REPLAY);

    // Every statement ran prepared from the cache, except the transaction brackets (sent as
    // plain queries), and no statement was prepared twice on one connection.
    for sql in &all.executed {
        let bracket = sql.starts_with("BEGIN") || sql.starts_with("COMMIT");
        assert!(bracket || all.prepared.iter().any(|prepared| sql.starts_with(prepared)), "not kept prepared: {sql}");
    }
    let mut distinct = all.prepared.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), all.prepared.len(), "the pool kept one connection, so each statement is prepared once");
}
