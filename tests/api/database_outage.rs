//! The database goes away: requests fail closed (503, no gateway call), readiness says so, and
//! the service recovers by itself when the database is back.

use std::time::Duration;

use payments_service::workers::Worker;
use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::helpers::{DbProxy, Lock, TestApp, TestDatabase, charge_requests, new_key, payment_body, wait_until};

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
    assert!(charge_requests(&gateway).await.is_empty(), "fail closed: no gateway call");
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

#[tokio::test]
async fn a_database_that_stops_answering_fails_closed_too() {
    let gateway = MockServer::start().await;
    let database = TestDatabase::create().await;
    let proxy = DbProxy::start(TestDatabase::socket_path()).await;
    let app =
        TestApp::builder().gateway_url(gateway.uri()).database_url(proxy.url(&database.name)).spawn_on(database).await;
    let patient = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let ready = || async { patient.get(format!("{}/readyz", app.address)).send().await.unwrap().status() };
    assert_eq!(ready().await, StatusCode::OK);

    proxy.freeze();
    let response = patient
        .post(format!("{}/v1/payments", app.address))
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", new_key())
        .json(&payment_body())
        .send()
        .await
        .expect("an answer, not a hang");

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "https://payments.example/problems/database-unavailable");
    assert_eq!(ready().await, StatusCode::SERVICE_UNAVAILABLE);
    assert!(charge_requests(&gateway).await.is_empty(), "fail closed: no gateway call");

    // The partition heals: the stuck connections die, and the service finds its way back.
    proxy.break_connections();
    proxy.restore();
    wait_until(Duration::from_secs(10), "the service is ready again", || async { ready().await == StatusCode::OK })
        .await;
}

#[tokio::test]
async fn a_statement_the_server_kills_mid_way_is_a_503_not_a_500() {
    let app = TestApp::spawn().await;
    let key = new_key();
    app.seed_key(&key, &payment_body(), "started", Lock::Free).await;

    // The request's claim waits on the key's row, and its backend is ended.
    let body = payment_body();
    let response = cut_off_while_waiting_on(&app, "SELECT FROM idempotency_keys FOR UPDATE", async {
        app.post_payment(&key, &body).await
    })
    .await;

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "https://payments.example/problems/database-unavailable");
    // A connection the server closed may fail one more request before the pool notices; a client
    // retrying after Retry-After, as this one does once the service is ready, does not see it.
    let ready = || async { app.http.get(format!("{}/readyz", app.address)).send().await.unwrap().status() };
    wait_until(Duration::from_secs(10), "the service is ready", || async { ready().await == StatusCode::OK }).await;
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CREATED);
}

/// A permission the database refuses the service's role is no outage: the database answers
/// (`/readyz` is `200`), and will refuse the same until someone changes the grants. Each request
/// it refuses is an opaque `500` whose logged cause names the permission, never a `503` that calls
/// the database unreachable and tells the client to retry.
#[tokio::test]
async fn a_permission_the_database_refuses_is_a_500_not_a_database_outage() {
    let database = TestDatabase::create().await;
    let role = format!("no_grants_{}", uuid::Uuid::new_v4().simple());
    let mut conn = diesel_async::AsyncPgConnection::establish(&database.url).await.unwrap();
    conn.batch_execute(&format!("CREATE ROLE {role} LOGIN")).await.unwrap();
    let as_role = database.url.replace("user=postgres", &format!("user={role}"));
    assert_ne!(as_role, database.url);
    let app = TestApp::builder().database_url(as_role).spawn_on(database).await;

    let ready = app.http.get(format!("{}/readyz", app.address)).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK, "the database answers");
    let response = app.post_payment(&new_key(), &payment_body()).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!response.headers().contains_key("Retry-After"));
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "https://payments.example/problems/internal-error");
    assert!(!problem.to_string().contains("permission"), "the cause is logged, never sent: {problem}");
    assert_eq!(app.gateway.stats().await.requests, 0);
}

/// Runs `request` while another transaction holds what `lock` takes, and once the request's
/// backend waits on it, ends that backend, as a restart or a failover does.
async fn cut_off_while_waiting_on<T>(app: &TestApp, lock: &str, request: impl Future<Output = T>) -> T {
    let mut holder = app.db().await;
    holder.batch_execute(&format!("BEGIN; {lock}")).await.unwrap();
    let database = app.database.name.clone();
    let terminate_the_waiter = async {
        wait_until(Duration::from_secs(10), "the request waits on the lock", || async {
            !waiting_on_a_lock(app, &database).await.is_empty()
        })
        .await;
        for pid in waiting_on_a_lock(app, &database).await {
            app.run_sql(&format!("SELECT pg_terminate_backend({pid})")).await;
        }
    };
    let (answer, ()) = tokio::join!(request, terminate_the_waiter);
    holder.batch_execute("ROLLBACK").await.unwrap();
    answer
}

#[tokio::test]
async fn a_claim_that_fails_gives_up_its_connection_instead_of_lending_it_to_the_next_request() {
    let app = TestApp::spawn().await;
    let mut holder = app.db().await;
    holder.batch_execute("BEGIN; LOCK TABLE idempotency_keys IN EXCLUSIVE MODE").await.unwrap();
    let database = app.database.name.clone();

    // The claim waits on the table until its statement times out.
    let (key, body) = (new_key(), payment_body());
    let response = app.post_payment(&key, &body);
    let its_backend = async {
        wait_until(Duration::from_secs(10), "the claim waits on the lock", || async {
            !waiting_on_a_lock(&app, &database).await.is_empty()
        })
        .await;
        waiting_on_a_lock(&app, &database).await
    };
    let (response, claimed_on) = tokio::join!(response, its_backend);
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);

    // Its connection, which could as well be still busy or broken, is closed, not pooled.
    let [pid] = claimed_on[..] else { panic!("one claim waited: {claimed_on:?}") };
    let gone = format!("NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = {pid})");
    wait_until(Duration::from_secs(10), "the claim's backend is gone", || app.database_says(&gone)).await;
    assert_eq!(app.post_payment(&new_key(), &payment_body()).await.status(), StatusCode::CREATED);
}

#[derive(diesel::QueryableByName)]
struct Backend {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pid: i32,
}

/// The backends of `database` waiting on a lock.
async fn waiting_on_a_lock(app: &TestApp, database: &str) -> Vec<i32> {
    let sql = format!("SELECT pid FROM pg_stat_activity WHERE datname = '{database}' AND wait_event_type = 'Lock'");
    let backends: Vec<Backend> = diesel::sql_query(sql).load(&mut app.db().await).await.unwrap();
    backends.into_iter().map(|b| b.pid).collect()
}

#[tokio::test]
async fn a_503_after_the_claim_says_the_request_may_still_complete_and_it_does() {
    let app = TestApp::builder().workers(|w| w.completer_backoff = Duration::ZERO).spawn().await;
    let key = new_key();

    // The claim commits; the `started` phase then waits on the payments table, and is cut off.
    let body = payment_body();
    let response = cut_off_while_waiting_on(&app, "LOCK TABLE payments IN EXCLUSIVE MODE", async {
        app.post_payment(&key, &body).await
    })
    .await;

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let problem: Value = response.json().await.unwrap();
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("may still complete") && detail.contains("same Idempotency-Key"), "{detail}");
    assert!(!detail.contains("nothing was done"), "{detail}");
    // And it does complete, with no client: a client that paid again with a new key would pay twice.
    assert_eq!(app.key_row(&key).await.unwrap().recovery_point, "started");
    let workers = app.workers();
    wait_until(Duration::from_secs(10), "the completer finishes the request", || async {
        let _ = workers.completer.run_once().await;
        app.key_row(&key).await.unwrap().response_status == Some(201)
    })
    .await;
    assert_eq!(app.gateway.stats().await.charges, 1);
}

/// An HTTP worker's runtime stops on its own at a clean stop (at once, if it is idle), while the
/// others drain their requests and the workers finish their unit of work: a connection it happened
/// to open for the pool must not die with it.
#[test]
fn a_connection_opened_from_a_runtime_that_stopped_since_still_serves() {
    let process = tokio::runtime::Runtime::new().unwrap();
    let database = process.block_on(TestDatabase::create());
    let pool = process.block_on(async { payments_service::db::pool(&database.url, 1) });
    let http_worker = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    http_worker.block_on(async {
        let mut conn = payments_service::db::connect(&pool).await.unwrap();
        diesel::sql_query("SELECT 1").execute(&mut conn).await.unwrap();
    });
    // A request elsewhere holds that connection (across its phases) as the worker stops.
    let mut held = process.block_on(payments_service::db::connect(&pool)).unwrap();
    drop(http_worker);

    process.block_on(async {
        diesel::sql_query("SELECT 1").execute(&mut *held).await.expect("the connection still works");
    });
}
