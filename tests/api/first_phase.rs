//! A new key's first phase runs in its claim's statement: the key row and what `started` writes
//! (the payment or the refund with its reservation, and the records of both) commit in one
//! transaction, or not at all. A resumed key is claimed alone and runs `started` after the claim,
//! and so does a process's first payment, before it has heard from its gateway.
//!
//! Records written in one transaction carry one transaction id (`xmin`), so the trail tells
//! whether the claim and `started` committed together.

use diesel::QueryableByName;
use diesel::sql_types::Text;
use diesel_async::RunQueryDsl;
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{Lock, TestApp, new_key, payment_body};

#[derive(QueryableByName)]
struct Record {
    #[diesel(sql_type = Text)]
    action: String,
    #[diesel(sql_type = Text)]
    transaction: String,
}

/// The trail of the key and what it made as (action, the transaction that wrote it), in the
/// trail's order.
async fn trail(app: &TestApp, key: &str) -> Vec<(String, String)> {
    let records: Vec<Record> = diesel::sql_query(
        "SELECT a.action::text AS action, a.xmin::text AS transaction FROM audit_records a
         WHERE a.resource_id IN (SELECT id FROM idempotency_keys WHERE idempotency_key = $1
                                 UNION SELECT id FROM payments WHERE idempotency_key = $1
                                 UNION SELECT id FROM refunds WHERE idempotency_key = $1)
         ORDER BY a.created_at, a.id",
    )
    .bind::<Text, _>(key)
    .load(&mut app.db().await)
    .await
    .unwrap();
    records.into_iter().map(|record| (record.action, record.transaction)).collect()
}

fn actions(trail: &[(String, String)]) -> Vec<&str> {
    trail.iter().map(|(action, _)| action.as_str()).collect()
}

#[tokio::test]
async fn a_new_payments_claim_and_started_commit_in_one_transaction_once_the_process_knows_its_gateway() {
    let app = TestApp::spawn().await;
    let first = new_key();
    assert_eq!(app.post_payment(&first, &payment_body()).await.status(), StatusCode::CREATED);
    let key = new_key();
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CREATED);

    // The process's first payment: the claim, then `started` in a transaction of its own (the
    // process asked its gateway who it is in between).
    let before = trail(&app, &first).await;
    assert_eq!(actions(&before)[..2], ["idempotency_key.claimed", "payment.created"]);
    assert_ne!(before[0].1, before[1].1, "two transactions: {before:?}");
    // Every later one: one transaction.
    let after = trail(&app, &key).await;
    let expected = ["idempotency_key.claimed", "payment.created", "payment.charge_recorded", "payment.finished"];
    assert_eq!(actions(&after), expected);
    assert_eq!(after[0].1, after[1].1, "one transaction: {after:?}");
}

#[tokio::test]
async fn a_new_refunds_claim_and_started_commit_in_one_transaction() {
    let app = TestApp::spawn().await;
    let payment = app.paid(1000, "tok_visa").await;
    let key = new_key();
    let refund = app.post_refund(&key, &json!({ "payment": payment["id"], "amount": 400 })).await;
    assert_eq!(refund.status(), StatusCode::CREATED);

    let trail = trail(&app, &key).await;
    assert_eq!(actions(&trail)[..2], ["idempotency_key.claimed", "refund.created"]);
    assert_eq!(trail[0].1, trail[1].1, "one transaction: {trail:?}");
    let refunded =
        format!("SELECT amount_refunded = 400 FROM payments WHERE id = '{}'", payment["id"].as_str().unwrap());
    assert!(app.database_says(&refunded).await);
}

#[tokio::test]
async fn a_claim_whose_started_fails_leaves_no_key_row_and_the_retry_is_new() {
    let app = TestApp::spawn().await;
    app.paid(1000, "tok_visa").await;
    // Any failure inside `started` (here: a trigger refusing every new payment).
    let mut conn = app.db().await;
    for sql in [
        "CREATE FUNCTION refuse_payments() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$",
        "CREATE TRIGGER refuse_payments BEFORE INSERT ON payments FOR EACH ROW EXECUTE FUNCTION refuse_payments()",
    ] {
        diesel::sql_query(sql).execute(&mut conn).await.unwrap();
    }
    let key = new_key();

    let failed = app.post_payment(&key, &payment_body()).await;

    assert!(failed.status().is_server_error(), "{}", failed.status());
    assert!(app.key_row(&key).await.is_none(), "the key row rolled back with its payment");
    diesel::sql_query("DROP TRIGGER refuse_payments ON payments").execute(&mut conn).await.unwrap();
    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(!retry.headers().contains_key("Idempotent-Replayed"));
    let trail = trail(&app, &key).await;
    assert_eq!(actions(&trail)[..2], ["idempotency_key.claimed", "payment.created"], "a new key, not a resumed one");
}

#[tokio::test]
async fn a_resumed_key_is_claimed_alone_and_runs_started_after_the_claim() {
    let app = TestApp::spawn().await;
    app.paid(1000, "tok_visa").await;
    let key = new_key();
    app.seed_key(&key, &payment_body(), "started", Lock::Free).await;

    let response = app.post_payment(&key, &payment_body()).await;

    assert_eq!(response.status(), StatusCode::CREATED);
    let trail = trail(&app, &key).await;
    assert_eq!(actions(&trail)[..2], ["idempotency_key.resumed", "payment.created"]);
    assert_ne!(trail[0].1, trail[1].1, "two transactions: {trail:?}");
    let (keys, payments, _, _) = app.row_counts().await;
    assert_eq!((keys, payments), (2, 2), "one payment for the resumed key");
    assert_eq!(app.gateway.stats().await.charges, 2);
}

/// A statement run alone commits as it ends, and its commit can fail after it sent its rows (a
/// deferred check here; on Citus, a worker that cannot prepare its part of a two-phase commit):
/// the claim and `started` then did not happen, and the gateway is not asked.
#[tokio::test]
async fn a_claim_whose_commit_fails_after_its_rows_asks_the_gateway_nothing() {
    use diesel_async::SimpleAsyncConnection;
    let app = TestApp::spawn().await;
    // The process has heard from its gateway: `started` runs in the claim's statement.
    app.paid(1000, "tok_visa").await;
    let mut conn = app.db().await;
    conn.batch_execute(
        "CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$;
         CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON payments
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_at_commit()",
    )
    .await
    .unwrap();
    let key = new_key();
    let refused = app.post_payment(&key, &payment_body()).await;
    assert!(refused.status().is_server_error(), "{}", refused.status());
    assert_eq!(app.gateway.all_stats().await["charges"], 1, "only the first payment's charge");
    assert!(app.key_row(&key).await.is_none(), "the claim rolled back");

    conn.batch_execute("DROP TRIGGER refuse_at_commit ON payments").await.unwrap();
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CREATED);
    assert_eq!(app.gateway.all_stats().await["charges"], 2);
}
