//! Deliveries to merchants' endpoints, to real receivers on loopback: every event to every enabled
//! endpoint that takes it, signed (verified by the Standard Webhooks project's own verifier), the
//! same `webhook-id` and bytes on every attempt; retried on the schedule, `Retry-After` honoured,
//! failed when it is spent and sent again by `recover`; `410` disabling the endpoint, re-enabling
//! resuming; each attempt logged; a name that resolves to a refused address reaching nothing; a
//! worker killed mid-attempt leaving the delivery to be attempted again; nothing sent once a delete
//! is answered.

use std::net::TcpListener as StdListener;
use std::time::Duration;

use payments_service::workers::{Outcome, Worker};
use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{Process, TestApp, new_key, wait_until};

/// Registers an endpoint at `url` taking `events`; its JSON, with its secret.
async fn endpoint(app: &TestApp, url: &str, events: &[&str]) -> Value {
    let created = app
        .http
        .post(format!("{}/v1/webhook_endpoints", app.address))
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", new_key())
        .json(&json!({ "url": url, "enabled_events": events }))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    created.json().await.unwrap()
}

async fn receiver(status: u16) -> MockServer {
    let receiver = MockServer::start().await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(status)).mount(&receiver).await;
    receiver
}

/// Fans out what is staged, then runs the webhooks worker until nothing is due.
async fn deliver_due(app: &TestApp) {
    let workers = app.workers();
    while workers.outbox.run_once().await.unwrap() == Outcome::Worked {}
    while workers.webhooks.run_once().await.unwrap() == Outcome::Worked {}
}

async fn attempts(app: &TestApp, endpoint: &Value) -> Vec<Value> {
    let path = format!("/v1/webhook_endpoints/{}/attempts", endpoint["id"].as_str().unwrap());
    let page: Value = app.get(&path).await.json().await.unwrap();
    page["data"].as_array().unwrap().clone()
}

/// Whether the Standard Webhooks project's verifier accepts `request` under `secret`.
fn verifies(request: &wiremock::Request, secret: &str) -> bool {
    standardwebhooks::Webhook::new(secret).unwrap().verify(&request.body, &request.headers).is_ok()
}

#[tokio::test]
async fn every_event_reaches_every_enabled_endpoint_that_takes_it_signed_as_the_standard_says() {
    let app = TestApp::spawn().await;
    let (all, refunds, off) = (receiver(200).await, receiver(200).await, receiver(200).await);
    let every = endpoint(&app, &all.uri(), &["*"]).await;
    let refunds_only = endpoint(&app, &refunds.uri(), &["refund.succeeded"]).await;
    let disabled = endpoint(&app, &off.uri(), &["*"]).await;
    let path = format!("{}/v1/webhook_endpoints/{}", app.address, disabled["id"].as_str().unwrap());
    app.http.post(path).bearer_auth(&app.api_key).json(&json!({ "status": "disabled" })).send().await.unwrap();
    let paid = app.paid(1000, "tok_visa").await;
    app.post_refund(&new_key(), &json!({ "payment": paid["id"], "amount": 100 })).await;

    deliver_due(&app).await;

    let to_all = all.received_requests().await.unwrap();
    let to_refunds = refunds.received_requests().await.unwrap();
    assert_eq!(to_all.len(), 2);
    assert_eq!(to_refunds.len(), 1);
    assert!(off.received_requests().await.unwrap().is_empty(), "nothing to a disabled endpoint");
    for (request, secret) in
        to_all.iter().map(|r| (r, &every["secret"])).chain(to_refunds.iter().map(|r| (r, &refunds_only["secret"])))
    {
        assert!(verifies(request, secret.as_str().unwrap()), "the standard's verifier accepts it");
        let body: Value = serde_json::from_slice(&request.body).unwrap();
        assert_eq!(request.headers["webhook-id"], body["id"].as_str().unwrap());
        assert_eq!(request.headers["content-type"], "application/json");
        let kept = app.get(&format!("/v1/events/{}", body["id"].as_str().unwrap())).await.bytes().await.unwrap();
        assert_eq!(request.body, kept, "the body is the event as kept, byte for byte");
    }
    assert!(!verifies(&to_refunds[0], every["secret"].as_str().unwrap()), "each endpoint's own secret");
    let logged = attempts(&app, &every).await;
    assert_eq!(logged.len(), 2);
    for attempt in logged {
        assert_eq!((attempt["attempt"].as_i64(), attempt["status_code"].as_i64()), (Some(1), Some(200)));
        assert_eq!(attempt["delivery_status"], "delivered");
        assert_eq!(attempt["next_attempt_at"], Value::Null);
        assert_eq!(attempt["error"], Value::Null);
    }
    assert_eq!(app.workers().webhooks.run_once().await.unwrap(), Outcome::Idle, "nothing is sent twice");
}

#[tokio::test]
async fn a_failing_endpoint_is_tried_on_the_schedule_with_one_id_and_one_body_then_failed_and_recovered() {
    let app = TestApp::builder().workers(|w| w.webhook_retry_schedule = schedule("10ms,10ms")).spawn().await;
    let failing = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500).set_body_string("down for maintenance"))
        .mount(&failing)
        .await;
    let hook = endpoint(&app, &failing.uri(), &["payment.succeeded"]).await;
    app.paid(1000, "tok_visa").await;

    let workers = app.workers();
    while workers.outbox.run_once().await.unwrap() == Outcome::Worked {}
    wait_until(Duration::from_secs(10), "the delivery fails for the last time", || async {
        workers.webhooks.run_once().await.unwrap();
        app.database_says("(SELECT status = 'failed' FROM webhook_deliveries)").await
    })
    .await;

    let sent = failing.received_requests().await.unwrap();
    assert_eq!(sent.len(), 3, "three attempts: the first, and one after each wait");
    for request in &sent {
        assert_eq!(request.headers["webhook-id"], sent[0].headers["webhook-id"]);
        assert_eq!(request.body, sent[0].body, "the same bytes on every attempt");
    }
    let logged = attempts(&app, &hook).await;
    let numbers: Vec<i64> = logged.iter().map(|a| a["attempt"].as_i64().unwrap()).collect();
    assert_eq!(numbers, [3, 2, 1], "newest first");
    for attempt in &logged {
        assert_eq!(attempt["status_code"], 500);
        assert_eq!(attempt["response_body"], "down for maintenance");
        assert_eq!(attempt["error"], "answered 500");
        assert_eq!(attempt["delivery_status"], "failed");
        assert_eq!(attempt["event_type"], "payment.succeeded");
    }
    assert_eq!(logged[0]["next_attempt_at"], Value::Null, "none after the last");
    assert!(logged[1]["next_attempt_at"].is_string() && logged[2]["next_attempt_at"].is_string());

    // The receiver is fixed; the merchant asks for what failed since then.
    failing.reset().await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(204)).mount(&failing).await;
    let path = format!("{}/v1/webhook_endpoints/{}/recover", app.address, hook["id"].as_str().unwrap());
    let recovered = app.http.post(&path).bearer_auth(&app.api_key).json(&json!({ "since": 0 })).send().await.unwrap();
    assert_eq!(recovered.status(), StatusCode::ACCEPTED);
    assert_eq!(recovered.json::<Value>().await.unwrap(), json!({ "queued": 1 }));
    while workers.webhooks.run_once().await.unwrap() == Outcome::Worked {}
    let resent = failing.received_requests().await.unwrap();
    assert_eq!(resent.len(), 1);
    assert_eq!((&resent[0].headers["webhook-id"], &resent[0].body), (&sent[0].headers["webhook-id"], &sent[0].body));
    let latest = &attempts(&app, &hook).await[0];
    assert_eq!((latest["attempt"].as_i64(), latest["status_code"].as_i64()), (Some(1), Some(204)));
    assert_eq!(latest["delivery_status"], "delivered");
    let again = app.http.post(&path).bearer_auth(&app.api_key).json(&json!({ "since": 0 })).send().await.unwrap();
    assert_eq!(again.json::<Value>().await.unwrap(), json!({ "queued": 0 }), "nothing failed any more");
}

#[tokio::test]
async fn a_retry_after_on_a_429_is_honoured() {
    let app = TestApp::builder().workers(|w| w.webhook_retry_schedule = schedule("1s")).spawn().await;
    let busy = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(429).insert_header("Retry-After", "600"))
        .mount(&busy)
        .await;
    let hook = endpoint(&app, &busy.uri(), &["*"]).await;
    app.paid(1000, "tok_visa").await;

    deliver_due(&app).await;

    let logged = attempts(&app, &hook).await;
    assert_eq!(logged.len(), 1);
    assert!(
        app.database_says("(SELECT next_attempt_at > now() + interval '9 minutes' FROM webhook_deliveries)").await,
        "due again no sooner than the receiver asked, not after the schedule's second"
    );
}

#[tokio::test]
async fn a_410_disables_the_endpoint_at_once_and_re_enabling_resumes() {
    let app = TestApp::spawn().await;
    let gone = receiver(410).await;
    let hook = endpoint(&app, &gone.uri(), &["*"]).await;
    let id = hook["id"].as_str().unwrap();
    app.paid(1000, "tok_visa").await;
    deliver_due(&app).await;

    let shown: Value = app.get(&format!("/v1/webhook_endpoints/{id}")).await.json().await.unwrap();
    assert_eq!((shown["status"].as_str(), shown["disabled_reason"].as_str()), (Some("disabled"), Some("gone")));
    assert_eq!(attempts(&app, &hook).await[0]["delivery_status"], "failed");
    app.paid(1000, "tok_visa").await;
    deliver_due(&app).await;
    assert_eq!(gone.received_requests().await.unwrap().len(), 1, "nothing more is sent to it");

    let path = format!("{}/v1/webhook_endpoints/{id}", app.address);
    app.http.post(&path).bearer_auth(&app.api_key).json(&json!({ "status": "enabled" })).send().await.unwrap();
    gone.reset().await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(200)).mount(&gone).await;
    app.paid(1000, "tok_visa").await;
    deliver_due(&app).await;
    assert_eq!(gone.received_requests().await.unwrap().len(), 1, "the next event reaches it");
}

#[tokio::test]
async fn a_name_that_resolves_to_a_refused_address_reaches_nothing() {
    // Only IPv6 loopback is allowed: `localhost` resolves to 127.0.0.1 too, which is refused.
    let allowed = payments_service::webhooks::network::AllowedNetworks::parse("::1/128").unwrap();
    let app = TestApp::builder().webhook_networks(allowed).spawn().await;
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let hook = endpoint(&app, &format!("http://localhost:{port}/hook"), &["*"]).await;
    app.paid(1000, "tok_visa").await;

    deliver_due(&app).await;

    assert!(listener.accept().is_err(), "no connection came");
    let logged = attempts(&app, &hook).await;
    assert_eq!((logged[0]["status_code"].as_i64(), logged[0]["error"].as_str()), (None, Some("address not allowed")));
}

#[tokio::test]
async fn a_redirect_is_a_failed_attempt_an_answer_is_logged_to_4_kib_and_a_hang_is_cut_at_the_timeout() {
    let app = TestApp::builder().workers(|w| w.webhook_timeout = Duration::from_secs(1)).spawn().await;
    let elsewhere = receiver(200).await;
    let redirecting = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(302).insert_header("Location", elsewhere.uri().as_str()))
        .mount(&redirecting)
        .await;
    let chatty = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500).set_body_string("x".repeat(100_000)))
        .mount(&chatty)
        .await;
    let hanging = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(30)))
        .mount(&hanging)
        .await;
    let hooks = [
        endpoint(&app, &redirecting.uri(), &["*"]).await,
        endpoint(&app, &chatty.uri(), &["*"]).await,
        endpoint(&app, &hanging.uri(), &["*"]).await,
    ];
    app.paid(1000, "tok_visa").await;

    let workers = app.workers();
    while workers.outbox.run_once().await.unwrap() == Outcome::Worked {}
    workers.webhooks.run_once().await.unwrap();

    assert!(elsewhere.received_requests().await.unwrap().is_empty(), "the redirect is not followed");
    let redirected = &attempts(&app, &hooks[0]).await[0];
    assert_eq!((redirected["status_code"].as_i64(), redirected["error"].as_str()), (Some(302), Some("redirect")));
    assert_eq!(redirected["delivery_status"], "pending");
    let long = &attempts(&app, &hooks[1]).await[0];
    assert_eq!(long["response_body"].as_str().unwrap().len(), 4096);
    let hung = &attempts(&app, &hooks[2]).await[0];
    assert_eq!((hung["status_code"].as_i64(), hung["error"].as_str()), (None, Some("timeout")));
}

#[tokio::test]
async fn a_worker_killed_mid_attempt_leaves_the_delivery_to_be_attempted_again_with_the_same_id() {
    let app = TestApp::spawn().await;
    let slow = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(30)))
        .up_to_n_times(1)
        .mount(&slow)
        .await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(200)).mount(&slow).await;
    endpoint(&app, &slow.uri(), &["*"]).await;
    app.paid(1000, "tok_visa").await;

    let env = [("PAYMENTS_WEBHOOK_ALLOWED_NETWORKS", "127.0.0.1/32"), ("PAYMENTS_WORKER_INTERVAL_MS", "50")];
    let mut worker = Process::worker(&app.database.url, app.gateway_url(), &env).await;
    wait_until(Duration::from_secs(20), "the worker is attempting", || async {
        !slow.received_requests().await.unwrap().is_empty()
    })
    .await;
    worker.signal(nix::sys::signal::Signal::SIGKILL);
    worker.exited().await;
    assert!(app.database_says("(SELECT status = 'pending' AND leased_until > now() FROM webhook_deliveries)").await);

    // Its lease runs out (here: made to run out), and another worker attempts it again.
    app.run_sql("UPDATE webhook_deliveries SET leased_until = now()").await;
    while app.workers().webhooks.run_once().await.unwrap() == Outcome::Worked {}

    let sent = slow.received_requests().await.unwrap();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].headers["webhook-id"], sent[1].headers["webhook-id"]);
    assert_eq!(sent[0].body, sent[1].body, "the same event, byte for byte");
    assert!(app.database_says("(SELECT status = 'delivered' FROM webhook_deliveries)").await);
}

#[tokio::test]
async fn nothing_is_sent_to_an_endpoint_once_its_delete_is_answered() {
    let app = TestApp::spawn().await;
    let slow = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(2)))
        .mount(&slow)
        .await;
    let hook = endpoint(&app, &slow.uri(), &["*"]).await;
    app.paid(1000, "tok_visa").await;
    let workers = app.workers();
    while workers.outbox.run_once().await.unwrap() == Outcome::Worked {}
    let attempting = tokio::spawn(async move { workers.webhooks.run_once().await.unwrap() });
    wait_until(Duration::from_secs(10), "an attempt is on its way", || async {
        !slow.received_requests().await.unwrap().is_empty()
    })
    .await;

    let path = format!("{}/v1/webhook_endpoints/{}", app.address, hook["id"].as_str().unwrap());
    let deleted = app.http.delete(&path).bearer_auth(&app.api_key).send().await.unwrap();
    assert_eq!(deleted.status(), StatusCode::OK);
    // Answered only once the attempt on its way had ended, and been logged.
    assert!(app.database_says("EXISTS (SELECT FROM webhook_attempts)").await, "the attempt had ended");
    assert!(!app.database_says("EXISTS (SELECT FROM webhook_deliveries)").await, "its deliveries are gone");
    attempting.await.unwrap();

    app.paid(1000, "tok_visa").await;
    deliver_due(&app).await;
    assert_eq!(slow.received_requests().await.unwrap().len(), 1, "nothing after the delete");
}

/// A retry schedule, written as the setting is.
fn schedule(text: &str) -> payments_service::webhooks::schedule::RetrySchedule {
    payments_service::webhooks::schedule::RetrySchedule::parse(text).unwrap()
}

#[tokio::test]
async fn a_rotated_secret_signs_beside_the_old_one_until_it_expires_and_a_replay_returns_the_same_secret() {
    let app = TestApp::spawn().await;
    let hooks = receiver(200).await;
    let hook = endpoint(&app, &hooks.uri(), &["*"]).await;
    let old = hook["secret"].as_str().unwrap().to_owned();
    let rotate = |key: String, id: String, body: Value| {
        let url = format!("{}/v1/webhook_endpoints/{id}/rotate_secret", app.address);
        let request = app.http.post(url).bearer_auth(&app.api_key).header("Idempotency-Key", key).json(&body);
        async move { request.send().await.unwrap() }
    };
    let id = hook["id"].as_str().unwrap().to_owned();
    let key = new_key();

    let rotated = rotate(key.clone(), id.clone(), json!({ "expires_in": 3600 })).await;
    assert_eq!(rotated.status(), StatusCode::OK);
    let bytes = rotated.bytes().await.unwrap();
    let replay = rotate(key.clone(), id.clone(), json!({ "expires_in": 3600 })).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.bytes().await.unwrap(), bytes, "the same secret, byte for byte");
    let rotated: Value = serde_json::from_slice(&bytes).unwrap();
    let new = rotated["secret"].as_str().unwrap().to_owned();
    assert_ne!(new, old);
    assert_eq!(rotated["id"], hook["id"]);

    app.paid(1000, "tok_visa").await;
    deliver_due(&app).await;
    let during = hooks.received_requests().await.unwrap().remove(0);
    let signatures = during.headers["webhook-signature"].to_str().unwrap().to_owned();
    assert_eq!(signatures.split(' ').count(), 2, "{signatures}");
    assert!(verifies(&during, &new) && verifies(&during, &old), "either secret verifies it during the overlap");

    // The overlap ends (here: made to end now).
    app.run_sql("UPDATE webhook_endpoints SET previous_secret_expires_at = now()").await;
    hooks.reset().await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(200)).mount(&hooks).await;
    app.paid(1000, "tok_visa").await;
    deliver_due(&app).await;
    let after = hooks.received_requests().await.unwrap().remove(0);
    assert_eq!(after.headers["webhook-signature"].to_str().unwrap().split(' ').count(), 1);
    assert!(verifies(&after, &new) && !verifies(&after, &old), "the new secret alone, once the old one expired");

    // The body may be left out: the old secret then signs for a day.
    let url = format!("{}/v1/webhook_endpoints/{}/rotate_secret", app.address, hook["id"].as_str().unwrap());
    let bare = app.http.post(url).bearer_auth(&app.api_key).header("Idempotency-Key", new_key()).send().await.unwrap();
    assert_eq!(bare.status(), StatusCode::OK);
    assert!(
        app.database_says("(SELECT previous_secret_expires_at > now() + interval '23 hours' FROM webhook_endpoints)")
            .await
    );

    // No such endpoint: a 404, stored under the key.
    let missing = format!("we_{}", uuid::Uuid::now_v7().simple());
    let unknown = new_key();
    let refused = rotate(unknown.clone(), missing.clone(), json!({})).await;
    assert_eq!(refused.status(), StatusCode::NOT_FOUND);
    assert_eq!(rotate(unknown, missing, json!({})).await.headers()["idempotent-replayed"], "true");
    let too_long = rotate(new_key(), id, json!({ "expires_in": 604_801 })).await;
    assert_eq!(too_long.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn deliveries_no_worker_may_make_never_hold_back_another_accounts() {
    let app = TestApp::spawn().await;
    // Another account's deliveries, due for an hour, to an endpoint that is no longer there (or
    // disabled): more than a batch, and older than anything else.
    app.run_sql(
        "INSERT INTO webhook_deliveries (account_id, id, event_id, endpoint_id, next_attempt_at)
         SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), now() - interval '1 hour'
         FROM generate_series(1, 60)",
    )
    .await;
    let hooks = receiver(200).await;
    endpoint(&app, &hooks.uri(), &["*"]).await;
    app.paid(1000, "tok_visa").await;

    deliver_due(&app).await;

    assert_eq!(hooks.received_requests().await.unwrap().len(), 1, "this account's delivery went out");
}

#[tokio::test]
async fn an_endpoint_failing_for_too_long_is_disabled_and_re_enabling_starts_its_streak_afresh() {
    let app = TestApp::spawn().await;
    let failing = receiver(500).await;
    let hook = endpoint(&app, &failing.uri(), &["*"]).await;
    let shown = || async {
        let endpoint: Value =
            app.get(&format!("/v1/webhook_endpoints/{}", hook["id"].as_str().unwrap())).await.json().await.unwrap();
        (endpoint["status"].as_str().unwrap().to_owned(), endpoint["disabled_reason"].as_str().map(str::to_owned))
    };
    app.paid(1000, "tok_visa").await;
    deliver_due(&app).await;
    assert_eq!(shown().await, ("enabled".to_owned(), None), "a first failure starts the streak");

    // The streak has lasted past PAYMENTS_WEBHOOK_DISABLE_AFTER_SECS (here: made to have).
    app.run_sql("UPDATE webhook_endpoints SET failing_since = now() - interval '10 days'").await;
    app.paid(1000, "tok_visa").await;
    deliver_due(&app).await;
    assert_eq!(shown().await, ("disabled".to_owned(), Some("failing".to_owned())));

    let path = format!("{}/v1/webhook_endpoints/{}", app.address, hook["id"].as_str().unwrap());
    app.http.post(&path).bearer_auth(&app.api_key).json(&json!({ "status": "enabled" })).send().await.unwrap();
    app.paid(1000, "tok_visa").await;
    deliver_due(&app).await;
    assert_eq!(shown().await, ("enabled".to_owned(), None), "one failure after re-enabling does not disable it");
    assert!(app.database_says("(SELECT failing_since > now() - interval '1 minute' FROM webhook_endpoints)").await);
}
