//! The database goes away: requests fail closed (503, no gateway call), readiness says so, and
//! the service recovers by itself when the database is back.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{DbProxy, TestApp, TestDatabase, new_key, payment_body, wait_until};

#[tokio::test]
async fn an_unreachable_database_fails_closed_and_the_service_recovers() {
    let gateway = MockServer::start().await;
    let database = TestDatabase::create().await;
    let proxy = DbProxy::start(TestDatabase::socket_path()).await;
    let app =
        TestApp::builder().gateway_url(gateway.uri()).database_url(proxy.url(&database.name)).spawn_on(database).await;
    let ready = || async { app.http.get(format!("{}/readyz", app.address)).send().await.unwrap().status() };
    assert_eq!(ready().await, StatusCode::OK);

    proxy.break_connections();
    let key = new_key();
    let response = app.post_payment(&key, &payment_body()).await;

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "5");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "https://payments.example/problems/database-unavailable");
    assert!(gateway.received_requests().await.unwrap().is_empty(), "fail closed: no gateway call");
    assert_eq!(ready().await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(app.row_counts().await, (0, 0, 0, 0));

    proxy.restore();
    wait_until(Duration::from_secs(10), "the service is ready again", || async { ready().await == StatusCode::OK })
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/charges"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({ "id": "ch_back" })))
        .expect(1)
        .mount(&gateway)
        .await;
    let response = app.post_payment(&key, &payment_body()).await;
    assert_eq!(response.status(), StatusCode::CREATED, "no restart needed");
}
