//! Events of finished payments reach the operator's sink at least once: fanned out once, delivered
//! to the webhook with a stable id (exactly once in normal operation), re-sent with the same id
//! after a crash, and dead-lettered when the receiver keeps failing; and kept, all the while.

use std::time::Duration;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, RunQueryDsl};
use payments_service::db::schema::{audit_records, staged_jobs};
use payments_service::workers::{Outcome, Worker};
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{Process, TestApp, new_key, payment_body, wait_until};

async fn receiver(status: u16) -> MockServer {
    let receiver = MockServer::start().await;
    Mock::given(method("POST")).and(path("/events")).respond_with(ResponseTemplate::new(status)).mount(&receiver).await;
    receiver
}

async fn app_delivering_to(receiver: &MockServer, max_attempts: u32) -> TestApp {
    let webhook = format!("{}/events", receiver.uri()).parse().unwrap();
    TestApp::builder()
        .workers(|w| {
            w.webhook_url = Some(webhook);
            w.webhook_backoff = Duration::ZERO;
            w.webhook_max_attempts = max_attempts;
        })
        .spawn()
        .await
}

/// Stages `count` events, as finished payments would.
async fn stage_events(app: &TestApp, count: u32) {
    app.run_sql(&format!(
        "INSERT INTO events (account_id, id, event_type, body)
         SELECT '{}', id, 'payment.succeeded', jsonb_build_object('id', 'evt_' || replace(id::text, '-', ''), 'type', 'payment.succeeded')
         FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, {count})) new",
        app.account_id
    ))
    .await;
}

/// Events not yet delivered to the sink: waiting for the fan-out, or in the sink's queue (dead
/// letters included).
async fn undelivered(app: &TestApp) -> i64 {
    diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
        "(SELECT count(*) FROM events WHERE fanned_out_at IS NULL) + (SELECT count(*) FROM staged_jobs)",
    ))
    .get_result(&mut app.db().await)
    .await
    .unwrap()
}

async fn audited(app: &TestApp, action: &str) -> i64 {
    audit_records::table.filter(audit_records::action.eq(action)).count().get_result(&mut app.db().await).await.unwrap()
}

#[tokio::test]
async fn each_event_is_delivered_once_with_its_id_as_the_idempotency_key() {
    let receiver = receiver(200).await;
    let app = app_delivering_to(&receiver, 10).await;
    let declined = json!({ "amount": 100, "currency": "usd", "source": "tok_chargeDeclined" });
    let succeeded: Value = app.post_payment(&new_key(), &payment_body()).await.json().await.unwrap();
    app.post_payment(&new_key(), &declined).await;
    let outbox = app.workers().outbox;

    while outbox.run_once().await.unwrap() == Outcome::Worked {}

    let deliveries = receiver.received_requests().await.unwrap();
    assert_eq!(deliveries.len(), 2);
    let events: Vec<Value> = deliveries.iter().map(|r| r.body_json().unwrap()).collect();
    // Delivered side by side, in no particular order.
    let mut types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    types.sort();
    assert_eq!(types, ["payment.failed", "payment.succeeded"]);
    let event = events.iter().find(|e| e["type"] == "payment.succeeded").unwrap();
    assert_eq!(event["data"]["object"], succeeded, "the event carries the payment as the API shows it");
    for (delivery, event) in deliveries.iter().zip(&events) {
        assert_eq!(delivery.headers["idempotency-key"], event["id"].as_str().unwrap());
        assert_eq!(delivery.headers["content-type"], "application/json");
    }
    assert_eq!(undelivered(&app).await, 0, "delivered events leave the sink's queue");
    assert_eq!(app.row_counts().await.3, 2, "and are kept");
    assert_eq!(audited(&app, "event.delivered").await, 2);
    assert_eq!(outbox.run_once().await.unwrap(), Outcome::Idle);
    assert_eq!(receiver.received_requests().await.unwrap().len(), 2, "nothing is delivered twice");
}

#[tokio::test]
async fn without_a_webhook_events_are_logged_and_cleared() {
    let app = TestApp::spawn().await;
    app.post_payment(&new_key(), &payment_body()).await;

    assert_eq!(app.workers().outbox.run_once().await.unwrap(), Outcome::Worked);

    assert_eq!(undelivered(&app).await, 0);
    assert_eq!(audited(&app, "event.delivered").await, 1);
}

#[tokio::test]
async fn a_receiver_that_keeps_failing_gets_the_event_dead_lettered() {
    let receiver = receiver(500).await;
    let app = app_delivering_to(&receiver, 3).await;
    app.post_payment(&new_key(), &payment_body()).await;
    let outbox = app.workers().outbox;

    for _ in 0..3 {
        assert_eq!(outbox.run_once().await.unwrap(), Outcome::Worked);
    }
    assert_eq!(outbox.run_once().await.unwrap(), Outcome::Idle, "a dead event is not retried");

    let attempts = receiver.received_requests().await.unwrap();
    assert_eq!(attempts.len(), 3);
    assert!(
        attempts.iter().all(|a| a.headers["idempotency-key"] == attempts[0].headers["idempotency-key"]),
        "one event id"
    );
    let (attempts_made, dead_at, last_error): (i32, Option<chrono::DateTime<chrono::Utc>>, Option<String>) =
        staged_jobs::table
            .select((staged_jobs::attempts, staged_jobs::dead_at, staged_jobs::last_error))
            .get_result(&mut app.db().await)
            .await
            .unwrap();
    assert_eq!(attempts_made, 3);
    assert!(dead_at.is_some(), "kept, dead, for an operator");
    assert!(last_error.unwrap().contains("500"));
    assert_eq!(audited(&app, "event.delivery_failed").await, 2);
    assert_eq!(audited(&app, "event.dead_lettered").await, 1);

    // The receiver is fixed; the operator requeues the dead letter as docs/workers.md says.
    receiver.reset().await;
    Mock::given(method("POST")).and(path("/events")).respond_with(ResponseTemplate::new(200)).mount(&receiver).await;
    app.run_sql("UPDATE staged_jobs SET dead_at = NULL, attempts = 0, run_at = now() WHERE dead_at IS NOT NULL").await;
    assert_eq!(outbox.run_once().await.unwrap(), Outcome::Worked);
    let redelivered = receiver.received_requests().await.unwrap();
    assert_eq!(redelivered.len(), 1);
    assert_eq!(redelivered[0].headers["idempotency-key"], attempts[0].headers["idempotency-key"], "the same event");
    assert_eq!(undelivered(&app).await, 0);
}

#[tokio::test]
async fn a_failed_delivery_waits_for_its_backoff() {
    let receiver = receiver(503).await;
    let webhook = format!("{}/events", receiver.uri()).parse().unwrap();
    let app = TestApp::builder()
        .workers(|w| {
            w.webhook_url = Some(webhook);
            w.webhook_backoff = Duration::from_secs(60);
        })
        .spawn()
        .await;
    app.post_payment(&new_key(), &payment_body()).await;
    let outbox = app.workers().outbox;

    assert_eq!(outbox.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(outbox.run_once().await.unwrap(), Outcome::Idle, "not due again for a minute");
    app.run_sql("UPDATE staged_jobs SET run_at = now() - interval '1 second'").await;
    assert_eq!(outbox.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(receiver.received_requests().await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_worker_killed_mid_delivery_leaves_the_event_to_be_sent_again_with_the_same_id() {
    // The receiver holds the first delivery open, long enough to kill the worker mid-request.
    let receiver = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/events"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(30)))
        .up_to_n_times(1)
        .mount(&receiver)
        .await;
    Mock::given(method("POST")).and(path("/events")).respond_with(ResponseTemplate::new(200)).mount(&receiver).await;
    let app = app_delivering_to(&receiver, 10).await;
    app.post_payment(&new_key(), &payment_body()).await;

    let webhook = format!("{}/events", receiver.uri());
    let env = [("PAYMENTS_WEBHOOK_URL", webhook.as_str()), ("PAYMENTS_WORKER_INTERVAL_MS", "50")];
    let mut worker = Process::worker(&app.database.url, app.gateway_url(), &env).await;
    wait_until(Duration::from_secs(20), "the worker is delivering", || async {
        !receiver.received_requests().await.unwrap().is_empty()
    })
    .await;
    worker.signal(nix::sys::signal::Signal::SIGKILL);
    worker.exited().await;
    assert_eq!(undelivered(&app).await, 1, "the event is still queued");

    // Its lease runs out (here: made to run out), and another worker delivers it again.
    app.run_sql("UPDATE staged_jobs SET leased_until = now()").await;
    assert_eq!(app.workers().outbox.run_once().await.unwrap(), Outcome::Worked);

    let deliveries = receiver.received_requests().await.unwrap();
    assert_eq!(deliveries.len(), 2);
    assert_eq!(deliveries[0].headers["idempotency-key"], deliveries[1].headers["idempotency-key"]);
    assert_eq!(deliveries[0].body, deliveries[1].body, "the same event, byte for byte");
    assert_eq!(undelivered(&app).await, 0);
}

#[tokio::test]
async fn a_receiver_that_redirects_has_not_received_the_event() {
    let receiver = MockServer::start().await;
    let moved = format!("{}/moved", receiver.uri());
    Mock::given(method("POST"))
        .and(path("/events"))
        .respond_with(ResponseTemplate::new(301).insert_header("Location", moved.as_str()))
        .mount(&receiver)
        .await;
    Mock::given(path("/moved")).respond_with(ResponseTemplate::new(200)).mount(&receiver).await;
    let app = app_delivering_to(&receiver, 10).await;
    app.post_payment(&new_key(), &payment_body()).await;

    assert_eq!(app.workers().outbox.run_once().await.unwrap(), Outcome::Worked);

    let requests = receiver.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1, "the redirect is not followed");
    assert_eq!(undelivered(&app).await, 1, "the event stays in the sink's queue");
    assert_eq!(audited(&app, "event.delivery_failed").await, 1);
}

#[tokio::test]
async fn events_are_leased_delivered_and_settled_in_batches() {
    let receiver = receiver(200).await;
    let app = app_delivering_to(&receiver, 10).await;
    stage_events(&app, 60).await;
    let outbox = app.workers().outbox;

    assert_eq!(outbox.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(receiver.received_requests().await.unwrap().len(), 50, "a batch of 50 in one run");
    assert_eq!(undelivered(&app).await, 10, "the delivered ones settled together");
    assert_eq!(outbox.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(outbox.run_once().await.unwrap(), Outcome::Idle);

    let delivered = receiver.received_requests().await.unwrap();
    let mut ids: Vec<String> =
        delivered.iter().map(|r| r.headers["idempotency-key"].to_str().unwrap().to_owned()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 60, "every event once");
    assert_eq!(audited(&app, "event.delivered").await, 60);
}

#[tokio::test]
async fn a_batch_is_leased_without_reading_the_whole_backlog() {
    let app = TestApp::spawn().await;
    // A backlog the planner does not know about: the statistics say the queue is empty, as a
    // queue's statistics mostly do.
    app.run_sql("ANALYZE staged_jobs").await;
    app.run_sql(&format!(
        "INSERT INTO staged_jobs (account_id, job_name, job_args)
         SELECT '{}', 'payment.succeeded', jsonb_build_object('id', gen_random_uuid(), 'type', 'payment.succeeded')
         FROM generate_series(1, 5000)",
        app.account_id
    ))
    .await;

    // One transaction around the lease (which runs as a nested one) and the count of what it read.
    let mut conn = app.db().await;
    conn.begin_test_transaction().await.unwrap();
    let leased = payments_service::outbox::lease_due_events(&mut conn, Duration::from_secs(30), 50).await.unwrap();
    let read: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
        "pg_stat_get_xact_tuples_fetched('staged_jobs'::regclass) + \
         pg_stat_get_xact_tuples_returned('staged_jobs'::regclass)",
    ))
    .get_result(&mut conn)
    .await
    .unwrap();

    assert_eq!(leased.len(), 50);
    assert!(read < 500, "leasing 50 of 5,000 events read {read} rows");
}
