//! Refunds the gateway answered `pending` settle without anyone asking: the settler looks them up
//! at their own gateway with backoff, and settles each once, forward only, with the payment's
//! totals, its event and an audit record.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::Timestamptz;
use diesel_async::RunQueryDsl;
use payments_service::db::schema::{audit_records, events, payments as payments_table, refunds};
use payments_service::metrics::SettlerOutcome;
use payments_service::workers::{Outcome, Settler, Worker};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{HeldProxy, Scrape, TestApp, new_key, wait_until};

/// A refund of `amount` (all that is left if none) of `payment`, answered `201` and `pending`.
async fn pending_refund(app: &TestApp, payment: &Value, amount: Option<i64>) -> Value {
    let mut body = json!({ "payment": payment["id"] });
    if let Some(amount) = amount {
        body["amount"] = json!(amount);
    }
    let response = app.post_refund(&new_key(), &body).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let refund: Value = response.json().await.unwrap();
    assert_eq!(refund["status"], "pending");
    refund
}

fn id_of(object: &Value) -> Uuid {
    object["id"].as_str().unwrap().parse().unwrap()
}

/// Runs the settler until it has looked a refund up (the first is due a second after its request
/// finished).
async fn settle_when_due(settler: &Settler) {
    wait_until(Duration::from_secs(10), "the settler looked a refund up", move || async move {
        settler.run_once().await.unwrap() == Outcome::Worked
    })
    .await;
}

/// Makes the refund due now (as if its backoff, or a run's lease, had run out).
async fn make_due(app: &TestApp, refund: &Value) {
    app.run_sql(&format!("UPDATE refunds SET settle_at = now() WHERE id = '{}'", id_of(refund))).await;
}

/// The refund as the API shows it now.
async fn refund_now(app: &TestApp, refund: &Value) -> Value {
    app.get(&format!("/v1/refunds/{}", id_of(refund))).await.json().await.unwrap()
}

/// The settler's bookkeeping of a refund: its look-ups, and when it is next due.
async fn schedule(app: &TestApp, refund: &Value) -> (i32, Option<DateTime<Utc>>) {
    refunds::table
        .filter(refunds::id.eq(id_of(refund)))
        .select((refunds::settle_attempts, refunds::settle_at))
        .get_result(&mut app.db().await)
        .await
        .unwrap()
}

/// The payment's running totals: (refunded, pending).
async fn totals(app: &TestApp, payment: &Value) -> (i64, i64) {
    payments_table::table
        .filter(payments_table::id.eq(id_of(payment)))
        .select((payments_table::amount_refunded, payments_table::amount_refund_pending))
        .get_result(&mut app.db().await)
        .await
        .unwrap()
}

/// The events of type `name` staged so far.
async fn events(app: &TestApp, name: &str) -> Vec<Value> {
    events::table.filter(events::event_type.eq(name)).select(events::body).load(&mut app.db().await).await.unwrap()
}

/// The actors of the audit records of `action`.
async fn audited(app: &TestApp, action: &str) -> Vec<String> {
    audit_records::table
        .filter(audit_records::action.eq(action))
        .select(audit_records::actor)
        .load(&mut app.db().await)
        .await
        .unwrap()
}

/// The database's clock.
async fn db_now(app: &TestApp) -> DateTime<Utc> {
    diesel::select(diesel::dsl::sql::<Timestamptz>("now()")).get_result(&mut app.db().await).await.unwrap()
}

/// A gateway that answers every read of a refund with the refund `gateway_refund_id` in `status`,
/// naming itself `identity`.
async fn gateway_answering(identity: &str, gateway_refund_id: &str, status: &str) -> MockServer {
    let gateway = MockServer::start().await;
    let refund = json!({ "id": gateway_refund_id, "object": "refund", "status": status });
    Mock::given(method("GET"))
        .and(path(format!("/v1/refunds/{gateway_refund_id}")))
        .respond_with(ResponseTemplate::new(200).insert_header("Gateway-Account", identity).set_body_json(refund))
        .mount(&gateway)
        .await;
    gateway
}

#[tokio::test]
async fn a_pending_refund_settles_to_succeeded_with_its_event_once() {
    let app = TestApp::spawn().await;
    let payment = app.paid(1000, "tok_refundPending").await;
    let refund = pending_refund(&app, &payment, Some(400)).await;
    assert_eq!(totals(&app, &payment).await, (0, 400), "reserved while pending");
    let created = events(&app, "refund.created").await;
    assert_eq!(created.len(), 1, "a refund left pending is announced as created");
    let announced = &created[0]["data"]["object"];
    assert_eq!((&announced["id"], announced["status"].as_str()), (&refund["id"], Some("pending")));
    let scrape = app.metrics().await;
    for outcome in SettlerOutcome::ALL {
        assert_eq!(scrape.get("settler_runs_total", &[("outcome", outcome.as_str())]), Some(0.0), "{outcome:?}");
    }
    assert_eq!(app.gateway.settle_refunds().await, 1);

    let settler = app.workers().settler;
    settle_when_due(&settler).await;

    let settled = refund_now(&app, &refund).await;
    assert_eq!(settled["status"], "succeeded");
    let now: Value = app.get(&format!("/v1/payments/{}", id_of(&payment))).await.json().await.unwrap();
    assert_eq!((now["amount_refunded"].as_i64(), now["refunded"].as_bool()), (Some(400), Some(false)));
    assert_eq!(totals(&app, &payment).await, (400, 0), "moved out of pending, into refunded");
    let staged = events(&app, "refund.succeeded").await;
    assert_eq!(staged.len(), 1, "one event for the one transition");
    assert_eq!(staged[0]["data"]["object"], settled, "the event carries the refund as the API shows it");
    assert_eq!(audited(&app, "refund.settled").await, ["settler"]);
    assert_eq!(schedule(&app, &refund).await, (1, None), "settled: never looked up again");
    assert_eq!(settler.run_once().await.unwrap(), Outcome::Idle);
    let scrape = app.metrics().await;
    assert_eq!(scrape.count("settler_runs_total", &[("outcome", "succeeded")]), 1.0);
}

#[tokio::test]
async fn a_failed_refund_gives_its_amount_back() {
    let app = TestApp::spawn().await;
    let payment = app.paid(1000, "tok_refundFails").await;
    let refund = pending_refund(&app, &payment, None).await;
    let nothing_left = app.post_refund(&new_key(), &json!({ "payment": payment["id"] })).await;
    assert_eq!(nothing_left.status(), StatusCode::BAD_REQUEST, "the whole amount is reserved while pending");
    assert_eq!(app.gateway.settle_refunds().await, 1);

    settle_when_due(&app.workers().settler).await;

    let failed = refund_now(&app, &refund).await;
    assert_eq!(failed["status"], "failed");
    assert!(failed["failure_code"].as_str().is_some_and(|code| !code.is_empty()), "{failed}");
    assert_eq!(totals(&app, &payment).await, (0, 0), "given back");
    assert_eq!(events(&app, "refund.failed").await.len(), 1);
    assert_eq!(audited(&app, "refund.settled").await, ["settler"]);
    let again = pending_refund(&app, &payment, None).await;
    assert_eq!(again["amount"], 1000, "the whole amount is refundable again");
    let scrape = app.metrics().await;
    assert_eq!(scrape.count("settler_runs_total", &[("outcome", "failed")]), 1.0);
}

#[tokio::test]
async fn a_refund_settled_meanwhile_is_not_settled_twice() {
    let app = TestApp::spawn().await;
    let payment = app.paid(1000, "tok_refundPending").await;
    let refund = pending_refund(&app, &payment, Some(400)).await;
    // Another refund stays pending on the payment, so that settling the first twice would not
    // break the payment's CHECK: only the settler's own fence can stop it.
    let other = pending_refund(&app, &payment, Some(400)).await;
    app.run_sql(&format!("UPDATE refunds SET settle_at = now() + interval '1 hour' WHERE id = '{}'", id_of(&other)))
        .await;
    assert_eq!(app.gateway.settle_refunds().await, 2);
    make_due(&app, &refund).await;

    // A slow settler leases the refund and asks the gateway; its answer is held.
    let proxy = HeldProxy::start(app.gateway_url());
    let slow = app.workers_at_gateway(&proxy.url).settler;
    let slow_run = tokio::spawn(async move { slow.run_once().await.unwrap() });
    wait_until(Duration::from_secs(10), "the slow settler asked the gateway", || async { proxy.received() == 1 }).await;
    // Its lease runs out (it was paused, say), and another settler settles the refund.
    make_due(&app, &refund).await;
    assert_eq!(app.workers().settler.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(refund_now(&app, &refund).await["status"], "succeeded");

    // The slow settler's answer comes back, saying the same.
    proxy.release(1);
    assert_eq!(slow_run.await.unwrap(), Outcome::Worked);

    assert_eq!(totals(&app, &payment).await, (400, 400), "moved once; the other refund still reserved");
    assert_eq!(events(&app, "refund.succeeded").await.len(), 1);
    assert_eq!(audited(&app, "refund.settled").await.len(), 1);
    assert_eq!(refund_now(&app, &other).await["status"], "pending");
}

#[tokio::test]
async fn another_gateways_answer_never_settles_a_refund() {
    let app = TestApp::spawn().await;
    let payment = app.paid(1000, "tok_refundPending").await;
    let refund = pending_refund(&app, &payment, Some(400)).await;
    let gateway_refund_id = refund["gateway_refund_id"].as_str().unwrap();
    // An impostor at the gateway's address says the refund succeeded.
    let impostor = gateway_answering("acct_impostor", gateway_refund_id, "succeeded").await;
    let workers = app.workers_at_gateway(&impostor.uri());
    make_due(&app, &refund).await;

    assert_eq!(workers.settler.run_once().await.unwrap(), Outcome::Worked);

    assert_eq!(impostor.received_requests().await.unwrap().len(), 1, "the impostor was asked");
    assert_eq!(refund_now(&app, &refund).await["status"], "pending");
    assert_eq!(totals(&app, &payment).await, (0, 400));
    assert!(events(&app, "refund.succeeded").await.is_empty());
    assert!(audited(&app, "refund.settled").await.is_empty());
    let (attempts, due) = schedule(&app, &refund).await;
    assert_eq!(attempts, 1);
    assert!(due.unwrap() > db_now(&app).await, "looked up again after its backoff");
    assert_eq!(workers.settler.run_once().await.unwrap(), Outcome::Idle);

    // Its own gateway settles it.
    app.gateway.settle_refunds().await;
    make_due(&app, &refund).await;
    assert_eq!(app.workers().settler.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(refund_now(&app, &refund).await["status"], "succeeded");
}

#[tokio::test]
async fn a_refund_still_pending_is_looked_up_with_doubling_backoff_and_turns_overdue() {
    let (first, max) = (Duration::from_secs(40), Duration::from_secs(100));
    let app = TestApp::builder()
        .workers(|w| {
            w.settler_backoff = first;
            w.settler_max_backoff = max;
            w.settler_overdue_attempts = 3;
        })
        .spawn()
        .await;
    let payment = app.paid(1000, "tok_refundPending").await;
    let refund = pending_refund(&app, &payment, Some(400)).await;
    // The refund's own gateway (by its identity), saying it is still pending, whenever asked.
    let identity = app.gateway_id().await;
    let gateway = gateway_answering(&identity, refund["gateway_refund_id"].as_str().unwrap(), "pending").await;
    let at_gateway = app.state_at_gateway(&gateway.uri());
    let settler = app.workers_of(at_gateway.clone()).settler;

    // Each look-up waits twice the last before the next, up to the maximum: 40 s, 80 s, 100 s.
    for (attempt, wait) in [(1, first), (2, first * 2), (3, max)] {
        make_due(&app, &refund).await;
        let before = db_now(&app).await;
        assert_eq!(settler.run_once().await.unwrap(), Outcome::Worked);
        let after = db_now(&app).await;
        let (attempts, due) = schedule(&app, &refund).await;
        let due = due.expect("still to settle");
        let wait = chrono::Duration::from_std(wait).unwrap();
        assert_eq!(attempts, attempt);
        // The lease's statement ran between the two reads of the clock.
        assert!(before + wait <= due && due <= after + wait, "look-up {attempt}: due {due}, not {wait} after it");
        assert_eq!(settler.run_once().await.unwrap(), Outcome::Idle, "nothing is due before its backoff");
    }

    assert_eq!(refund_now(&app, &refund).await["status"], "pending");
    assert_eq!(totals(&app, &payment).await, (0, 400));
    let scrape = Scrape::of_state(&at_gateway).await;
    assert_eq!(scrape.count("settler_runs_total", &[("outcome", "pending")]), 2.0);
    assert_eq!(scrape.count("settler_runs_total", &[("outcome", "overdue")]), 1.0, "the third look-up is overdue");
}

#[tokio::test]
async fn a_refund_is_never_due_again_before_its_look_up_can_have_ended() {
    let app = TestApp::builder().workers(|w| w.settler_backoff = Duration::ZERO).spawn().await;
    let payment = app.paid(1000, "tok_refundPending").await;
    let refund = pending_refund(&app, &payment, Some(400)).await;
    let identity = app.gateway_id().await;
    let gateway = gateway_answering(&identity, refund["gateway_refund_id"].as_str().unwrap(), "pending").await;
    make_due(&app, &refund).await;

    let before = db_now(&app).await;
    assert_eq!(app.workers_at_gateway(&gateway.uri()).settler.run_once().await.unwrap(), Outcome::Worked);
    let after = db_now(&app).await;

    // The gateway timeout (10 s), and 2.5 s for the lease's own statement: with no backoff at
    // all, another settler still cannot take the refund while this one may be asking about it.
    let lease = chrono::Duration::milliseconds(12_500);
    let due = schedule(&app, &refund).await.1.unwrap();
    assert!(before + lease <= due && due <= after + lease, "due {due}, not 12.5 s after the look-up began");
}
