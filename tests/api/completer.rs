//! The completer finishes requests their clients abandoned: from the recovery point, reconciling
//! with the gateway first, backing off, and handing a hopeless key to an operator.

use std::time::Duration;

use payments_service::idempotency::{claim_abandoned, needing_attention, retry_needing_attention};
use payments_service::request_id::RequestId;
use payments_service::workers::{Outcome, Worker};
use reqwest::StatusCode;
use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{
    ChargePerKey, Lock, OpenTransaction, TestApp, charge_requests, listed_charge, mount_no_charges_found, new_key,
    payment_body, wait_until,
};

/// An app whose completer needs no backoff before its first attempt.
async fn app_with_gateway(gateway: &str) -> TestApp {
    TestApp::builder()
        .gateway_url(gateway)
        .gateway_timeout(Duration::from_millis(300))
        .workers(|w| w.completer_backoff = Duration::ZERO)
        .spawn()
        .await
}

#[tokio::test]
async fn a_charge_whose_answer_was_lost_is_adopted_even_after_the_gateway_forgot_the_key() {
    let app = TestApp::builder()
        .gateway_timeout(Duration::from_millis(300))
        .workers(|w| w.completer_backoff = Duration::ZERO)
        .spawn()
        .await;
    app.gateway.fault("error_after", 1).await;
    let key = new_key();
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    // The client never comes back, and the gateway's idempotency cache moves on: asked again
    // under the same key, it would now charge a second time.
    app.gateway.forget_keys().await;

    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Worked);

    assert_eq!(app.key_row(&key).await.unwrap().recovery_point, "finished");
    assert_eq!(app.gateway.stats().await.charges, 1, "the charge was found by look-up, not made again");
    // Its takeover and every phase it drove are on the record, as the completer's.
    let trail = app.audit_trail().await;
    let by_completer: Vec<&str> =
        trail.iter().filter(|(_, actor)| actor == "completer").map(|(a, _)| a.as_str()).collect();
    assert_eq!(by_completer, ["idempotency_key.taken_over", "payment.charge_recorded", "payment.finished"]);
    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["Idempotent-Replayed"], "true");
    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Idle);
}

#[tokio::test]
async fn the_completer_looks_the_charge_up_before_charging() {
    let gateway = MockServer::start().await;
    let app = app_with_gateway(&gateway.uri()).await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "started", Lock::Free).await;
    app.seed_payment(key_id, &key, "pending", None).await;
    let found = json!({ "object": "list", "data": [listed_charge(&app.downstream_key(key_id), json!({ "id": "ch_found", "status": "succeeded" }))] });
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .and(wiremock::matchers::query_param("idempotency_key", app.downstream_key(key_id).as_str()))
        .respond_with(ResponseTemplate::new(200).set_body_json(found))
        .expect(1)
        .mount(&gateway)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/charges"))
        .respond_with(ResponseTemplate::new(500))
        .expect(0)
        .mount(&gateway)
        .await;

    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Worked);

    let row = app.key_row(&key).await.unwrap();
    assert_eq!((row.recovery_point.as_str(), row.response_status), ("finished", Some(201)));
    let answer: serde_json::Value = serde_json::from_slice(&row.response_body.unwrap()).unwrap();
    assert_eq!(answer["gateway_charge_id"], "ch_found");
}

#[tokio::test]
async fn the_completer_leaves_live_and_finished_keys_alone() {
    let app = TestApp::builder().workers(|w| w.completer_backoff = Duration::ZERO).spawn().await;
    app.seed_key(&new_key(), &payment_body(), "started", Lock::Live).await;
    assert_eq!(app.post_payment(&new_key(), &payment_body()).await.status(), StatusCode::CREATED);

    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Idle);
    assert_eq!(app.gateway.stats().await.requests, 1, "only the finished request's own charge");
}

#[tokio::test]
async fn attempts_back_off_and_a_hopeless_key_ends_as_needing_attention_without_extra_charges() {
    let gateway = MockServer::start().await;
    mount_no_charges_found(&gateway).await;
    Mock::given(method("POST")).and(path("/v1/charges")).respond_with(ResponseTemplate::new(500)).mount(&gateway).await;
    let backoff = Duration::from_secs(10);
    let app = TestApp::builder()
        .gateway_url(gateway.uri())
        .workers(|w| {
            w.completer_backoff = backoff;
            w.completer_max_attempts = 3;
        })
        .spawn()
        .await;
    let key = new_key();
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    let completer = app.workers().completer;
    // Time passes by moving the key's last run back: the wait doubles with every attempt
    // (10 s before the first, 20 s before the second, 40 s before the third).
    let ran_ago = |seconds: u64| {
        let app = &app;
        async move {
            app.run_sql(&format!("UPDATE idempotency_keys SET last_run_at = now() - interval '{seconds} seconds'"))
                .await
        }
    };
    for (attempt, wait) in [(1, 10), (2, 20), (3, 40)] {
        ran_ago(wait - 2).await;
        assert_eq!(completer.run_once().await.unwrap(), Outcome::Idle, "attempt {attempt} is not due yet");
        ran_ago(wait + 2).await;
        assert_eq!(completer.run_once().await.unwrap(), Outcome::Worked, "attempt {attempt} is due");
    }

    let row = app.key_row(&key).await.unwrap();
    assert_eq!((row.recovery_point.as_str(), row.locked_until), ("started", None), "unfinished, and unlocked");
    let list = needing_attention(&mut app.db().await, &payments_service::endpoints::all()).await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].id, list[0].completer_attempts), (row.id, 3));
    assert!(list[0].attention_reason.contains("gateway"), "{}", list[0].attention_reason);
    // Given up on: no worker drives it again, however long it waits.
    ran_ago(3600).await;
    assert_eq!(completer.run_once().await.unwrap(), Outcome::Idle);
    let charges = charge_requests(&gateway).await.iter().filter(|r| r.method.as_str() == "POST").count();
    assert_eq!(charges, 4, "the client's attempt and three of the completer's, all under one key");

    // The operator fixes the cause and hands the key back.
    assert!(retry_needing_attention(&mut app.db().await, app.account_id, row.id).await.unwrap());
    assert!(needing_attention(&mut app.db().await, &payments_service::endpoints::all()).await.unwrap().is_empty());
    gateway.reset().await;
    mount_no_charges_found(&gateway).await;
    Mock::given(method("POST"))
        .and(path("/v1/charges"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({ "id": "ch_at_last" })))
        .mount(&gateway)
        .await;
    ran_ago(11).await;
    assert_eq!(completer.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(app.key_row(&key).await.unwrap().recovery_point, "finished");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_completers_never_drive_one_key_at_once() {
    let gateway = MockServer::start().await;
    mount_no_charges_found(&gateway).await;
    Mock::given(method("POST"))
        .and(path("/v1/charges"))
        .respond_with(ChargePerKey { delay: Duration::from_millis(800) })
        .mount(&gateway)
        .await;
    let app =
        TestApp::builder().gateway_url(gateway.uri()).workers(|w| w.completer_backoff = Duration::ZERO).spawn().await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "started", Lock::Free).await;

    // The first completer's take-over, its statement run in a transaction held open: the key row
    // stays locked as it is while a worker's take-over commits.
    let (run, state) = (RequestId::generate(), app.state_at_gateway(&gateway.uri()));
    let mut taking = OpenTransaction::begin(&app.database.url).await;
    // The key made nothing yet: a worker at any gateway can drive it.
    let first = claim_abandoned(
        taking.connection(),
        &payments_service::endpoints::all(),
        None,
        Duration::from_secs(60),
        Duration::ZERO,
        &run,
    )
    .await
    .unwrap();
    let first = first.expect("the first completer takes the key");
    // A second completer, as in another worker process, runs meanwhile. It answers at once, or
    // waits for the row (as a take-over without `FOR UPDATE SKIP LOCKED` would, to take the key
    // too once the first commits): the first commits once it did either.
    let second = app.workers().completer;
    let second = tokio::spawn(async move { second.run_once().await.unwrap() });
    wait_until(Duration::from_secs(10), "the second completer answered or waits for the row", || async {
        second.is_finished() || taking.is_waited_for().await
    })
    .await;
    taking.commit().await;
    assert_eq!(second.await.unwrap(), Outcome::Idle, "the key is the first completer's");

    // The first drives the key and waits on the slow gateway...
    let driving = tokio::spawn(async move {
        payments_service::keyed::complete::<payments_service::payments::Create>(&state, first, &run).await
    });
    wait_until(Duration::from_secs(10), "the first completer is charging", || async {
        charge_requests(&gateway).await.iter().any(|r| r.method.as_str() == "POST")
    })
    .await;
    // ...and another finds nothing it may take.
    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Idle);
    assert_eq!(driving.await.unwrap().unwrap().status, 201);

    assert_eq!(app.key_row(&key).await.unwrap().recovery_point, "finished");
    let trail = app.audit_trail().await;
    assert_eq!(trail.iter().filter(|(action, _)| action == "idempotency_key.taken_over").count(), 1, "{trail:?}");
    let downstream = app.downstream_key(key_id);
    let requests = charge_requests(&gateway).await;
    let charges =
        requests.iter().filter(|r| r.method.as_str() == "POST" && r.headers["idempotency-key"] == downstream.as_str());
    assert_eq!(charges.count(), 1, "one driver, one charge request");
}

/// A key's recovery point is read back through its endpoint, as the registry lists it: a point the
/// endpoint does not declare (a refund's, on a payment's key) is a bug no phases can drive. The
/// completer puts such a key on the operator's list at once, rather than take it again and again,
/// and its client's retry is an internal error that changes nothing.
#[tokio::test]
async fn a_key_at_a_point_its_endpoint_does_not_declare_waits_for_a_person() {
    let app = TestApp::builder().workers(|w| w.completer_backoff = Duration::ZERO).spawn().await;
    let key = new_key();
    app.seed_key(&key, &payment_body(), "refund_created", Lock::Free).await;

    let completer = app.workers().completer;
    let error = completer.run_once().await.expect_err("no endpoint drives the key");
    assert!(error.to_string().contains("no endpoint drives"), "{error}");
    let list = needing_attention(&mut app.db().await, &payments_service::endpoints::all()).await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].recovery_point, "refund_created");
    assert!(list[0].attention_reason.contains("which no endpoint drives"), "{}", list[0].attention_reason);
    assert_eq!(completer.run_once().await.unwrap(), Outcome::Idle, "given up on, never taken again");

    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let row = app.key_row(&key).await.unwrap();
    assert_eq!(row.recovery_point, "refund_created", "nothing changed");
}
