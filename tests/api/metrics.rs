//! `GET /metrics`: served on a listener of its own, never on the API's address; each counter
//! moves when its event happens, labels come from closed sets (route templates, never raw paths),
//! and the system's state is read from the database, from indexes only, whatever the backlog.

use std::time::Duration;

use payments_service::workers::Worker;
use payments_wire::problem::ProblemType;
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{
    Lock, Process, Scrape, TestApp, TestDatabase, new_key, payment_body, plan_nodes, record_statements, sql_of,
    statements,
};

const REQUESTS: &str = "idempotency_requests_total";

/// `idempotency_requests_total{outcome}` now.
fn requests(scrape: &Scrape, outcome: &str) -> f64 {
    scrape.count(REQUESTS, &[("outcome", outcome)])
}

/// Asserts that `response` is the API's 404 for a path that is no route.
async fn assert_no_such_route(response: reqwest::Response) {
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(response.headers()["content-type"], "application/problem+json");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], ProblemType::RouteNotFound.uri(), "{problem}");
}

#[tokio::test]
async fn the_metrics_are_served_on_their_own_listener_and_the_api_address_knows_no_such_route() {
    let app = TestApp::spawn().await;
    assert_eq!(app.post_payment(&new_key(), &payment_body()).await.status(), StatusCode::CREATED);

    assert_no_such_route(app.http.get(format!("{}/metrics", app.address)).send().await.unwrap()).await;
    let scrape = app.metrics().await;
    assert_eq!(requests(&scrape, "created"), 1.0, "the listener serves the app's own counters");
    // And the listener serves nothing of the API.
    let payments = app.http.get(format!("{}/v1/payments", app.metrics_address)).bearer_auth(&app.api_key);
    assert_no_such_route(payments.send().await.unwrap()).await;
}

#[tokio::test]
async fn serve_prints_where_its_metrics_are_and_serves_them_only_there() {
    let database = TestDatabase::create().await;
    let gateway = Process::gateway().await;
    let serve = Process::serve(&database.url, &gateway.url, &["--no-workers"], &[]).await;

    let metrics = serve.metrics_url();
    assert!(metrics.starts_with("http://127.0.0.1:") && metrics.ends_with("/metrics"), "{metrics}");
    assert_ne!(metrics, format!("{}/metrics", serve.url), "a listener of its own");
    let scrape = Scrape::of(&metrics).await;
    assert_eq!(scrape.get("outbox_events_pending", &[]), Some(0.0));
    assert_no_such_route(reqwest::get(format!("{}/metrics", serve.url)).await.unwrap()).await;
}

#[tokio::test]
async fn serve_moves_its_metrics_off_a_taken_usual_address_and_says_so_but_never_off_one_it_was_given() {
    let database = TestDatabase::create().await;
    // Hold the usual address, unless something else already does.
    let _held = std::net::TcpListener::bind(payments_service::config::DEFAULT_METRICS_BIND);
    let env = [
        ("DATABASE_URL", database.url.as_str()),
        ("PAYMENTS_BIND", "127.0.0.1:0"),
        ("PAYMENTS_MOCK_GATEWAY_BIND", "127.0.0.1:0"),
    ];
    let args = ["serve", "--private-mock-gateway", "--no-workers"];

    // Not told where: a free port, and the line says why.
    let serve = Process::start(&args, &env, payments_service::startup::LISTENING).await;
    let line = serve.stdout.borrow().iter().find(|line| line.starts_with("metrics: ")).cloned().unwrap();
    assert!(line.ends_with("/metrics (127.0.0.1:9464 is taken)"), "{line}");
    assert!(!line.starts_with("metrics: http://127.0.0.1:9464/"), "{line}");
    assert!(Scrape::of(&serve.metrics_url()).await.get("db_pool_connections", &[("state", "idle")]).is_some());
    drop(serve);

    // Told where: refused, with the address and the setting named. A worker alike.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let told = [env.as_slice(), &[("PAYMENTS_METRICS_BIND", taken.as_str()), ("GATEWAY_URL", "http://127.0.0.1:1")]];
    for command in [&args[..1], &["worker"]] {
        let mut process = tokio::process::Command::new(env!("CARGO_BIN_EXE_payments"));
        process.args(command).env_clear().envs(told.concat());
        let refused = process.output().await.unwrap();
        assert!(!refused.status.success(), "{command:?}: no quiet move to another port");
        let error = String::from_utf8_lossy(&refused.stderr);
        assert!(error.contains(&taken) && error.contains("PAYMENTS_METRICS_BIND"), "{command:?}: {error}");
    }
}

#[tokio::test]
async fn each_way_a_key_is_taken_in_is_counted_once() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let before = app.metrics().await;
    let outcomes = ["created", "replayed", "key_reused", "in_flight", "resumed", "expired"];
    for outcome in outcomes {
        assert_eq!(requests(&before, outcome), 0.0, "{outcome}");
    }

    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CREATED);
    let scrape = app.metrics().await;
    assert_eq!(requests(&scrape, "created"), 1.0);
    assert_eq!(scrape.count("payments_total", &[("status", "succeeded"), ("reason", "none")]), 1.0);

    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CREATED);
    assert_eq!(requests(&app.metrics().await, "replayed"), 1.0);

    let other_body = json!({ "amount": 1, "currency": "usd", "source": "tok_visa" });
    assert_eq!(app.post_payment(&key, &other_body).await.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(requests(&app.metrics().await, "key_reused"), 1.0);

    let held = new_key();
    app.seed_key(&held, &payment_body(), "started", Lock::Live).await;
    assert_eq!(app.post_payment(&held, &payment_body()).await.status(), StatusCode::CONFLICT);
    assert_eq!(requests(&app.metrics().await, "in_flight"), 1.0);

    let crashed = new_key();
    app.seed_key(&crashed, &payment_body(), "started", Lock::Free).await;
    assert_eq!(app.post_payment(&crashed, &payment_body()).await.status(), StatusCode::CREATED);
    assert_eq!(requests(&app.metrics().await, "resumed"), 1.0);

    // A payment whose key's record was reaped: its payment remembers the key.
    let reaped = new_key();
    app.seed_payment(Uuid::now_v7(), &reaped, "succeeded", Some("ch_long_ago")).await;
    assert_eq!(app.post_payment(&reaped, &payment_body()).await.status(), StatusCode::GONE);

    let after = app.metrics().await;
    let counted: Vec<f64> = outcomes.iter().map(|outcome| requests(&after, outcome)).collect();
    assert_eq!(counted, [1.0; 6], "{outcomes:?}");
}

#[tokio::test]
async fn gateway_calls_are_counted_by_operation_and_outcome_and_timed() {
    let app = TestApp::spawn().await;
    let calls = |scrape: &Scrape, operation: &str, outcome: &str| {
        scrape.count("gateway_requests_total", &[("operation", operation), ("outcome", outcome)])
    };

    let declined = json!({ "amount": 1000, "currency": "usd", "source": "tok_chargeDeclined" });
    assert_eq!(app.post_payment(&new_key(), &declined).await.status(), StatusCode::PAYMENT_REQUIRED);
    let unknown = json!({ "amount": 1000, "currency": "usd", "source": "card_123" });
    assert_eq!(app.post_payment(&new_key(), &unknown).await.status(), StatusCode::PAYMENT_REQUIRED);
    // The gateway charges, then fails to answer: an unknown outcome, then a retry that finds the
    // charge by its key.
    let key = new_key();
    app.gateway.fault("error_after", 1).await;
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    let scrape = app.metrics().await;
    assert_eq!(calls(&scrape, "charge", "declined"), 2.0, "a decline, and a source the gateway does not know");
    assert_eq!(calls(&scrape, "charge", "indeterminate"), 1.0);
    assert_eq!(scrape.count("idempotency_requests_unfinished_total", &[("reason", "unknown_outcome")]), 1.0);
    assert_eq!(scrape.count("payments_total", &[("status", "failed"), ("reason", "card_declined")]), 1.0);
    assert_eq!(scrape.count("payments_total", &[("status", "failed"), ("reason", "unknown_source")]), 1.0);

    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CREATED);
    let scrape = app.metrics().await;
    assert_eq!(calls(&scrape, "lookup", "succeeded"), 1.0, "the retry found the charge");
    assert_eq!(calls(&scrape, "charge", "succeeded"), 0.0, "and did not charge again");
    let timed = scrape.count("gateway_request_duration_seconds_count", &[("operation", "charge")]);
    assert_eq!(timed, 3.0, "every charge request is timed");
    assert_eq!(scrape.count("gateway_request_duration_seconds_count", &[("operation", "lookup")]), 1.0);
}

#[tokio::test]
async fn http_requests_are_counted_by_route_template_never_by_raw_path() {
    let app = TestApp::spawn().await;
    let id = Uuid::now_v7();
    assert_eq!(app.get(&format!("/v1/payments/{id}")).await.status(), StatusCode::NOT_FOUND);
    assert_eq!(app.get("/no/such/thing").await.status(), StatusCode::NOT_FOUND);
    assert_eq!(app.post_payment(&new_key(), &payment_body()).await.status(), StatusCode::CREATED);
    let made_up = reqwest::Method::from_bytes(b"MADEUP1").unwrap();
    let odd = app.http.request(made_up, format!("{}/v1/payments", app.address)).send().await.unwrap();
    assert_eq!(odd.status(), StatusCode::METHOD_NOT_ALLOWED);

    let scrape = app.metrics().await;
    let http = |method: &str, route: &str, status: &str| {
        scrape.count("http_requests_total", &[("method", method), ("route", route), ("status", status)])
    };
    assert_eq!(http("GET", "/v1/payments/{id}", "404"), 1.0);
    assert_eq!(http("GET", "unmatched", "404"), 1.0);
    assert_eq!(http("POST", "/v1/payments", "201"), 1.0);
    let timed = [("method", "POST"), ("route", "/v1/payments")];
    assert_eq!(scrape.count("http_request_duration_seconds_count", &timed), 1.0);
    assert!(!scrape.0.contains(&id.to_string()) && !scrape.0.contains("/no/such"), "no raw path is a label");
    assert!(!scrape.0.contains(&app.account_id.to_string()), "no account is a label");
    assert_eq!(http("other", "/v1/payments", "405"), 1.0);
    assert!(!scrape.0.contains("MADEUP1"), "nor a method a client made up");
}

#[tokio::test]
async fn the_workers_runs_are_counted_and_the_systems_state_is_read_from_the_database() {
    let app = TestApp::builder()
        .key_retention(Duration::ZERO)
        .workers(|w| w.completer_backoff = Duration::ZERO)
        .spawn()
        .await;
    let workers = app.workers();
    let unfinished =
        |scrape: &Scrape, point: &str| scrape.get("idempotency_keys_unfinished", &[("recovery_point", point)]);

    // A client that gave up after an unknown outcome: its key waits at `started`.
    app.gateway.fault("error_before", 1).await;
    assert_eq!(app.post_payment(&new_key(), &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    let stuck = new_key();
    let stuck_id = app.seed_key(&stuck, &payment_body(), "charge_created", Lock::Live).await;
    app.run_sql(&format!(
        "UPDATE idempotency_keys SET needs_attention_at = now(), attention_reason = 'gave up', locked_until = NULL, \
         lock_token = NULL WHERE id = '{stuck_id}'"
    ))
    .await;
    let scrape = app.metrics().await;
    assert_eq!(unfinished(&scrape, "started"), Some(1.0));
    assert_eq!(unfinished(&scrape, "charge_created"), Some(0.0), "one needing attention is counted apart");
    assert_eq!(scrape.get("idempotency_keys_needing_attention", &[]), Some(1.0));
    assert_eq!(scrape.get("outbox_events_pending", &[]), Some(0.0));
    assert_eq!(scrape.get("outbox_oldest_event_age_seconds", &[]), Some(0.0));

    workers.completer.run_once().await.unwrap();
    let scrape = app.metrics().await;
    assert_eq!(scrape.count("completer_runs_total", &[("outcome", "finished")]), 1.0);
    assert_eq!(unfinished(&scrape, "started"), Some(0.0));
    assert_eq!(scrape.get("outbox_events_pending", &[]), Some(1.0));
    assert!(scrape.get("outbox_oldest_event_age_seconds", &[]).unwrap() > 0.0);

    workers.outbox.run_once().await.unwrap();
    workers.reaper.run_once().await.unwrap();
    let scrape = app.metrics().await;
    assert_eq!(scrape.count("outbox_deliveries_total", &[("outcome", "delivered")]), 1.0);
    assert_eq!(scrape.get("outbox_events_pending", &[]), Some(0.0));
    assert_eq!(scrape.count("reaper_keys_reaped_total", &[]), 1.0);
}

#[tokio::test]
async fn the_pool_reports_its_connections_and_checkouts() {
    let app = TestApp::spawn().await;
    assert_eq!(app.post_payment(&new_key(), &payment_body()).await.status(), StatusCode::CREATED);

    let scrape = app.metrics().await;
    let idle = scrape.get("db_pool_connections", &[("state", "idle")]).unwrap();
    let in_use = scrape.get("db_pool_connections", &[("state", "in_use")]).unwrap();
    assert!(idle + in_use >= 1.0, "idle {idle}, in use {in_use}");
    // One for the claim and `started`, one after the gateway call.
    assert!(scrape.count("db_pool_checkouts_total", &[("result", "direct")]) >= 2.0);
    assert_eq!(scrape.get("db_pool_checkouts_total", &[("result", "timed_out")]), Some(0.0));
    assert!(scrape.get("db_pool_checkout_wait_seconds_total", &[]).is_some());
}

#[tokio::test]
async fn a_scrape_without_the_database_still_answers_with_what_the_process_counted() {
    // Nothing listens on the database's address.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let app = TestApp::builder().database_url(format!("postgres://postgres@{closed}/nothing")).spawn().await;
    assert_eq!(app.post_payment(&new_key(), &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);

    let scrape = app.metrics().await;
    assert_eq!(scrape.count("http_requests_total", &[("route", "/v1/payments"), ("status", "503")]), 1.0);
    assert!(scrape.count("db_pool_checkouts_total", &[("result", "timed_out")]) >= 1.0);
    assert_eq!(scrape.get("idempotency_keys_needing_attention", &[]), None, "not read, so not reported");
}

#[tokio::test]
async fn the_worker_process_serves_its_metrics_on_its_own_listener() {
    let database = TestDatabase::create().await;
    let gateway = Process::gateway().await;
    let worker = Process::worker(&database.url, &gateway.url, &[("PAYMENTS_METRICS_BIND", "127.0.0.1:0")]).await;

    let scrape = Scrape::of(&worker.metrics_url()).await;
    assert_eq!(scrape.get("idempotency_keys_needing_attention", &[]), Some(0.0));
    assert!(scrape.get("db_pool_connections", &[("state", "idle")]).is_some());
}

#[tokio::test]
async fn a_scrape_reads_the_outbox_from_an_index_and_counts_only_up_to_a_cap_whatever_the_backlog() {
    record_statements();
    let app = TestApp::spawn().await;
    // A webhook receiver down for days, and dead letters nobody cleared: 100,000 events pending
    // and 100,000 dead, one second apart, interleaved.
    app.run_sql(&format!(
        "INSERT INTO staged_jobs (account_id, job_name, job_args, created_at, dead_at)
         SELECT '{}', 'payment.succeeded', '{{}}', now() - i * interval '1 second',
                CASE WHEN i % 2 = 0 THEN now() END
         FROM generate_series(1, 200000) i",
        app.account_id
    ))
    .await;
    app.run_sql("ANALYZE staged_jobs").await;

    let scrape = app.metrics().await;

    let executed = statements(&app.database.name).executed;
    let read = executed.iter().find(|sql| sql.contains("events_dead")).expect("the scrape's statement");
    let mut conn = app.db().await;
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(format!("PREPARE state(int8) AS {}", sql_of(read))),
        &mut conn,
    )
    .await
    .unwrap();
    let plan = plan_nodes(&mut conn, &format!("EXECUTE state({})", payments_service::metrics::COUNT_CAP)).await;
    let outbox: Vec<_> = plan.iter().filter(|node| node.relation.as_deref() == Some("staged_jobs")).collect();
    assert!(outbox.iter().all(|node| node.node_type != "Seq Scan"), "no sequential scan of the outbox: {plan:#?}");
    assert!(outbox.iter().all(|node| node.index.is_some()), "each part from an index: {plan:#?}");

    let cap = payments_service::metrics::COUNT_CAP as f64;
    assert_eq!(scrape.get("outbox_events_pending", &[]), Some(cap), "this many or more");
    assert_eq!(scrape.get("outbox_events_dead", &[]), Some(cap));
    let oldest = scrape.get("outbox_oldest_event_age_seconds", &[]).unwrap();
    assert!(oldest >= 199_999.0, "the oldest pending event, exactly: {oldest}");
}
