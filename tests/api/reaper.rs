//! The reaper deletes finished keys past their retention, in batches, and never an unfinished
//! one; a retry that arrives after its key was reaped is told so, and charged nothing. It deletes
//! the per-account request counts past theirs, in batches too.

use std::time::Duration;

use payments_service::workers::{Outcome, Worker};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Lock, OpenTransaction, TestApp, new_key, payment_body, wait_until};

/// Backdates every key by two days (finished ones: when they finished), past the default
/// retention of one.
async fn age_all_keys(app: &TestApp) {
    app.run_sql(
        "UPDATE idempotency_keys SET created_at = now() - interval '2 days',
         finished_at = CASE WHEN recovery_point = 'finished' THEN now() - interval '2 days' END",
    )
    .await;
}

#[tokio::test]
async fn finished_keys_past_retention_are_deleted_in_batches_and_unfinished_ones_never() {
    let app = TestApp::spawn().await;
    // 1,200 finished keys and one unfinished key, all two days old; and one fresh finished key.
    app.run_sql(&format!(
        "INSERT INTO idempotency_keys (id, account_id, idempotency_key, request_method, request_path,
                                       request_fingerprint, request_params, recovery_point, response_status,
                                       response_body, finished_at)
         SELECT gen_random_uuid(), '{}', 'old-' || i, 'POST', '/v1/payments', decode(repeat('00', 32), 'hex'), '{{}}',
                'finished', 201, '{{}}'::bytea, now()
         FROM generate_series(1, 1200) i",
        app.account_id
    ))
    .await;
    let unfinished = new_key();
    app.seed_key(&unfinished, &payment_body(), "started", Lock::Free).await;
    age_all_keys(&app).await;
    let fresh = new_key();
    app.post_payment(&fresh, &payment_body()).await;
    let reaper = app.workers().reaper;

    // Batches of 500: two full ones (more may follow), then the rest.
    assert_eq!(reaper.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(app.row_counts().await.0, 1200 + 2 - 500);
    assert_eq!(reaper.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(reaper.run_once().await.unwrap(), Outcome::Idle);
    assert_eq!(reaper.run_once().await.unwrap(), Outcome::Idle);

    assert!(app.key_row(&unfinished).await.is_some(), "an unfinished key is never reaped");
    assert!(app.key_row(&fresh).await.is_some(), "a key within its retention stays");
    assert_eq!(app.row_counts().await.0, 2);
    let mut conn = app.db().await;
    let audited: i64 = diesel_async::RunQueryDsl::get_result(
        diesel::QueryDsl::count(diesel::QueryDsl::filter(
            payments_service::db::schema::audit_records::table,
            diesel::ExpressionMethods::eq(
                payments_service::db::schema::audit_records::action,
                "idempotency_key.reaped",
            ),
        )),
        &mut conn,
    )
    .await
    .unwrap();
    assert_eq!(audited, 1200, "one audit record per reaped key");
}

/// An app whose keys are kept a second after they finish, so that a test can outlive a retention.
async fn app_with_a_short_retention() -> TestApp {
    TestApp::builder().key_retention(Duration::from_secs(1)).spawn().await
}

/// Pays with `key`, outlives the key's retention (the answer kept in memory for replays expires
/// with it), and reaps it.
async fn pay_and_outlive(app: &TestApp, key: &str) -> Value {
    let payment: Value = app.post_payment(key, &payment_body()).await.json().await.unwrap();
    assert!(app.remembers_the_answer_of(key), "the answer is kept for replays");
    wait_until(Duration::from_secs(10), "the retention ends", || async { !app.remembers_the_answer_of(key) }).await;
    wait_until(Duration::from_secs(10), "the key is reaped", || async {
        app.workers().reaper.run_once().await.unwrap();
        app.key_row(key).await.is_none()
    })
    .await;
    payment
}

#[tokio::test]
async fn a_retry_after_its_key_was_reaped_is_410_and_charges_nothing() {
    let app = app_with_a_short_retention().await;
    let key = new_key();
    let payment = pay_and_outlive(&app, &key).await;

    let late = app.post_payment(&key, &payment_body()).await;

    assert_eq!(late.status(), StatusCode::GONE);
    assert_eq!(late.headers()["content-type"], "application/problem+json");
    let problem: Value = late.json().await.unwrap();
    assert_eq!(problem["type"], "https://payments.example/problems/idempotency-key-expired");
    assert_eq!(problem["payment"]["id"], payment["id"]);
    assert!(problem["detail"].as_str().unwrap().contains(payment["id"].as_str().unwrap()));
    assert_eq!(app.gateway.stats().await.requests, 1, "the gateway never heard of the late retry");
    let (keys, payments, _, _) = app.row_counts().await;
    assert_eq!((keys, payments), (0, 1), "no new key row, no second payment");
}

/// A late retry that comes while the reaper deletes its key (the row deleted, what it made kept,
/// neither committed yet) is 410 too. The claim's snapshot still holds the row, so a new key's
/// short claim writes nothing and the full claim finds the key expired. An insert guarded by
/// `key_resources` alone would wait for the reaper's commit, find the row gone, and pay again.
#[tokio::test]
async fn a_retry_that_comes_while_its_key_is_reaped_is_410_and_charges_nothing() {
    let app = app_with_a_short_retention().await;
    let key = new_key();
    let payment: Value = app.post_payment(&key, &payment_body()).await.json().await.unwrap();
    wait_until(Duration::from_secs(10), "the key expires", || async {
        !app.remembers_the_answer_of(&key) && app.key_has_expired(&key).await
    })
    .await;
    let mut reaping = OpenTransaction::begin(&app.database.url).await;
    let reaped = payments_service::idempotency::reap_finished(reaping.connection(), Duration::from_secs(1), 10);
    assert_eq!(reaped.await.unwrap(), 1, "the key is reaped, uncommitted");

    let body = payment_body();
    let late = app.post_payment(&key, &body);
    tokio::pin!(late);
    // Answered while the reaper's transaction is open; or, if the claim waits for it, answered
    // once it commits. (Watched from a session of its own: the reaper's must stay free to commit.)
    let waited = async {
        while !reaping.is_waited_for().await {
            tokio::task::yield_now().await;
        }
    };
    let answered_first = tokio::select! {
        late = &mut late => Some(late),
        () = waited => None,
    };
    reaping.commit().await;
    let late = match answered_first {
        Some(late) => late,
        None => late.await,
    };

    assert_eq!(late.status(), StatusCode::GONE);
    let problem: Value = late.json().await.unwrap();
    assert_eq!(problem["payment"]["id"], payment["id"]);
    assert_eq!(app.gateway.stats().await.requests, 1, "the gateway never heard of the late retry");
    let (keys, payments, _, _) = app.row_counts().await;
    assert_eq!((keys, payments), (0, 1), "no new key row, no second payment");
}

#[tokio::test]
async fn a_retry_after_its_key_was_reaped_is_410_whatever_its_body() {
    let app = app_with_a_short_retention().await;
    let key = new_key();
    let payment = pay_and_outlive(&app, &key).await;

    // The first late retry with another body must not bind the key to that body, and no order of
    // bodies may turn the answer into a 422.
    let other = json!({ "amount": 2500, "currency": "eur", "source": "tok_visa" });
    for body in [&other, &payment_body(), &other] {
        let late = app.post_payment(&key, body).await;
        assert_eq!(late.status(), StatusCode::GONE, "{body}");
        let problem: Value = late.json().await.unwrap();
        assert_eq!(problem["payment"]["id"], payment["id"]);
    }
    assert_eq!(app.gateway.stats().await.requests, 1);
}

#[tokio::test]
async fn retention_counts_from_when_a_key_finished_not_when_it_was_created() {
    let app = TestApp::spawn().await;
    let key = new_key();
    // A request that took two days to finish (say, after an outage and an operator's retry).
    app.post_payment(&key, &payment_body()).await;
    app.run_sql("UPDATE idempotency_keys SET created_at = now() - interval '2 days'").await;

    assert_eq!(app.workers().reaper.run_once().await.unwrap(), Outcome::Idle);

    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.headers()["Idempotent-Replayed"], "true", "still replayed: it finished just now");
}

/// How many hourly request counts the database holds, and how many of them lie past a retention
/// of `hours`.
async fn request_counts(app: &TestApp, hours: u64) -> (i64, i64) {
    #[derive(diesel::QueryableByName)]
    struct Counts {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        rows: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        past: i64,
    }
    let sql = format!(
        "SELECT count(*) AS rows, count(*) FILTER (WHERE hour <= now() - interval '{hours} hours') AS past
         FROM key_request_counts"
    );
    let counts: Counts =
        diesel_async::RunQueryDsl::get_result(diesel::sql_query(sql), &mut app.db().await).await.unwrap();
    (counts.rows, counts.past)
}

#[tokio::test]
async fn request_counts_past_their_retention_are_deleted_in_batches_and_newer_ones_kept() {
    let hours = 24;
    let app =
        TestApp::builder().workers(|w| w.request_counts_retention = Duration::from_secs(hours * 3600)).spawn().await;
    // Two accounts, each with this hour and the 22 before it (within the retention) and 288 hours
    // from 25 to 312 hours back (past it). The hours at the edge are left out, so that the clock
    // passing a whole hour during the test changes nothing.
    for account in [app.account_id, uuid::Uuid::now_v7()] {
        app.run_sql(&format!(
            "INSERT INTO key_request_counts (account_id, hour, created, replayed)
             SELECT '{account}', date_trunc('hour', now(), 'UTC') - h * interval '1 hour', 3, 1
             FROM generate_series(0, 312) h WHERE h NOT IN (23, 24)"
        ))
        .await;
    }
    assert_eq!(request_counts(&app, hours).await, (2 * 311, 2 * 288));
    let reaper = app.workers().reaper;

    // A batch of 500 (more may follow), then the rest.
    assert_eq!(reaper.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(request_counts(&app, hours).await.0, 2 * 311 - 500);
    assert_eq!(reaper.run_once().await.unwrap(), Outcome::Idle);

    assert_eq!(request_counts(&app, hours).await, (2 * 23, 0), "every hour within the retention kept, none past it");
}
