//! Events kept: every change's event is written with the change, read back by `GET /v1/events`
//! as it was staged (and as the sink receives it), filtered by type, paged newest first, never
//! shown to another account, and deleted once its retention is over.

use std::time::Duration;

use payments_service::workers::{Outcome, Worker};
use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{TestApp, new_key};

async fn json_of(response: reqwest::Response, status: StatusCode) -> Value {
    let got = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(got, status, "{body}");
    body
}

async fn events(app: &TestApp, query: &str) -> Value {
    json_of(app.get(&format!("/v1/events{query}")).await, StatusCode::OK).await
}

fn types(page: &Value) -> Vec<&str> {
    page["data"].as_array().unwrap().iter().map(|event| event["type"].as_str().unwrap()).collect()
}

fn problem_type(problem: &Value) -> &str {
    problem["type"].as_str().unwrap().rsplit('/').next().unwrap()
}

/// A payment that succeeds, one declined, and a refund of the first: three events.
async fn three_changes(app: &TestApp) -> Value {
    let paid = app.paid(1000, "tok_visa").await;
    let declined = json!({ "amount": 100, "currency": "usd", "source": "tok_chargeDeclined" });
    assert_eq!(app.post_payment(&new_key(), &declined).await.status(), StatusCode::PAYMENT_REQUIRED);
    let refund = app.post_refund(&new_key(), &json!({ "payment": paid["id"], "amount": 300 })).await;
    assert_eq!(refund.status(), StatusCode::CREATED);
    paid
}

#[tokio::test]
async fn every_change_keeps_its_event_shown_newest_first_as_it_was_staged() {
    let app = TestApp::spawn().await;
    let paid = three_changes(&app).await;

    let page = events(&app, "").await;
    assert_eq!(page["object"], "list");
    assert_eq!(page["has_more"], false);
    assert_eq!(types(&page), ["refund.succeeded", "payment.failed", "payment.succeeded"]);
    let succeeded = &page["data"][2];
    assert_eq!(succeeded["object"], "event");
    assert_eq!(succeeded["data"]["object"], paid, "the payment as the API showed it then");
    let id = succeeded["id"].as_str().unwrap();
    assert!(id.starts_with("evt_") && id.len() == 36, "{id}");
    let created = succeeded["created"].as_i64().unwrap();
    assert!((chrono::Utc::now().timestamp() - created).abs() < 600, "{created}");

    let one = json_of(app.get(&format!("/v1/events/{id}")).await, StatusCode::OK).await;
    assert_eq!(&one, succeeded, "one event, the same JSON read either way");
}

#[tokio::test]
async fn a_list_is_filtered_by_one_type_or_a_prefix_and_refuses_a_type_no_event_has() {
    let app = TestApp::spawn().await;
    three_changes(&app).await;

    assert_eq!(types(&events(&app, "?type=payment.failed").await), ["payment.failed"]);
    assert_eq!(types(&events(&app, "?type=payment.*").await), ["payment.failed", "payment.succeeded"]);
    assert_eq!(types(&events(&app, "?type=refund.*").await), ["refund.succeeded"]);
    assert_eq!(types(&events(&app, "?type=*").await).len(), 3);
    assert_eq!(types(&events(&app, "?type=payment.captured").await), Vec::<&str>::new());

    for unknown in ["payment.paid", "payment", "pay*", "payment.%25", "charge.*"] {
        let response = app.get(&format!("/v1/events?type={unknown}")).await;
        let problem = json_of(response, StatusCode::BAD_REQUEST).await;
        assert_eq!(problem_type(&problem), "unknown-event-type", "{unknown}");
    }
}

#[tokio::test]
async fn a_list_is_paged_newest_first_past_a_cursor() {
    let app = TestApp::spawn().await;
    three_changes(&app).await;
    let all = events(&app, "").await;

    let first = events(&app, "?limit=2").await;
    assert_eq!(first["has_more"], true);
    assert_eq!(first["data"].as_array().unwrap()[..], all["data"].as_array().unwrap()[..2]);
    let cursor = first["data"][1]["id"].as_str().unwrap();
    let second = events(&app, &format!("?limit=2&starting_after={cursor}")).await;
    assert_eq!(second["has_more"], false);
    assert_eq!(second["data"].as_array().unwrap()[..], all["data"].as_array().unwrap()[2..]);

    let unknown = format!("evt_{}", uuid::Uuid::now_v7().simple());
    for cursor in [unknown.as_str(), "evt_nothing", "42"] {
        let response = app.get(&format!("/v1/events?starting_after={cursor}")).await;
        assert_eq!(problem_type(&json_of(response, StatusCode::NOT_FOUND).await), "event-not-found", "{cursor}");
    }
}

#[tokio::test]
async fn another_accounts_events_are_not_found() {
    let app = TestApp::spawn().await;
    three_changes(&app).await;
    let theirs = events(&app, "").await["data"][0]["id"].as_str().unwrap().to_owned();
    let other = app.create_account("other").await;

    let listed: Value = app.get_as(&other, "/v1/events").await.json().await.unwrap();
    assert_eq!(listed["data"], json!([]), "no event of another account is listed");
    for path in [format!("/v1/events/{theirs}"), format!("/v1/events?starting_after={theirs}")] {
        let problem = json_of(app.get_as(&other, &path).await, StatusCode::NOT_FOUND).await;
        assert_eq!(problem_type(&problem), "event-not-found", "{path}");
    }
    // Its own id, written without its prefix or with another, names no event either.
    let bare = uuid::Uuid::parse_str(&theirs["evt_".len()..]).unwrap();
    for path in [format!("/v1/events/{bare}"), format!("/v1/events/pay_{}", bare.simple())] {
        assert_eq!(app.get(&path).await.status(), StatusCode::NOT_FOUND, "{path}");
    }
}

#[tokio::test]
async fn the_sink_receives_each_event_exactly_as_the_api_shows_it() {
    let sink = MockServer::start().await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(204)).mount(&sink).await;
    let url = sink.uri().parse().unwrap();
    let app = TestApp::builder().workers(|w| w.webhook_url = Some(url)).spawn().await;
    three_changes(&app).await;

    let outbox = app.workers().outbox;
    while outbox.run_once().await.unwrap() == Outcome::Worked {}

    let delivered = sink.received_requests().await.unwrap();
    assert_eq!(delivered.len(), 3);
    for delivery in delivered {
        let event: Value = delivery.body_json().unwrap();
        let id = event["id"].as_str().unwrap();
        assert_eq!(delivery.headers["idempotency-key"], id);
        assert_eq!(json_of(app.get(&format!("/v1/events/{id}")).await, StatusCode::OK).await, event);
    }
}

#[tokio::test]
async fn the_reaper_deletes_events_past_their_retention_once_they_are_fanned_out() {
    let app = TestApp::builder().workers(|w| w.event_retention = Duration::from_secs(3600)).spawn().await;
    three_changes(&app).await;
    let reaper = app.workers().reaper;

    // Two of them are older than the retention, one of those not handed over yet.
    app.run_sql("UPDATE events SET created_at = now() - interval '2 hours' WHERE event_type LIKE 'payment.%'").await;
    app.run_sql("UPDATE events SET fanned_out_at = now() WHERE event_type <> 'payment.failed'").await;
    reaper.run_once().await.unwrap();

    assert_eq!(types(&events(&app, "").await), ["refund.succeeded", "payment.failed"]);
    let gone = app.get("/v1/events?type=payment.succeeded").await;
    assert_eq!(json_of(gone, StatusCode::OK).await["data"], json!([]));

    // Handed over, it goes too; one within its retention stays.
    app.run_sql("UPDATE events SET fanned_out_at = now()").await;
    reaper.run_once().await.unwrap();
    assert_eq!(types(&events(&app, "").await), ["refund.succeeded"]);
}
