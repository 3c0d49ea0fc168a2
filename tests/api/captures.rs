//! Authorize now, capture later: a payment made with `capture: false` is only authorized, its money
//! held at the gateway until a capture or a cancel ends the authorization, or it lapses.

use std::os::unix::process::ExitStatusExt;

use chrono::{DateTime, Utc};
use nix::sys::signal::Signal;
use reqwest::StatusCode;
use serde_json::{Value, json};

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use payments_service::workers::{Outcome, Worker};

use crate::helpers::{GatewayControl, HeldProxy, Process, TestApp, TestDatabase, new_key};

fn authorization(amount: i64, source: &str) -> Value {
    json!({ "amount": amount, "currency": "usd", "source": source, "capture": false })
}

#[tokio::test]
async fn a_payment_made_with_capture_false_is_authorized_and_waits_for_its_capture() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let before = Utc::now();
    let response = app.post_payment(&key, &authorization(5000, "tok_visa")).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let body = response.bytes().await.unwrap();
    let payment: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(payment["status"], "requires_capture");
    assert_eq!(payment["capture_method"], "manual");
    assert_eq!((&payment["amount_capturable"], &payment["amount_captured"]), (&json!(5000), &json!(0)));
    assert_eq!((&payment["canceled_at"], &payment["cancellation_reason"]), (&Value::Null, &Value::Null));
    // It lapses a week after it was authorized, by default.
    let capture_before: DateTime<Utc> = payment["capture_before"].as_str().unwrap().parse().unwrap();
    let week = chrono::Duration::days(7);
    assert!(capture_before >= before + week && capture_before <= Utc::now() + week, "{capture_before}");

    // The gateway holds the money, and has captured none of it.
    let charge_id = payment["gateway_charge_id"].as_str().expect("the authorization's charge");
    let charge = app.gateway.charge(charge_id).await;
    assert_eq!((&charge["status"], &charge["captured"]), (&json!("requires_capture"), &json!(false)));

    // Replayed byte for byte; waiting for its capture, or its lapse; announced as authorized.
    let replay = app.post_payment(&key, &authorization(5000, "tok_visa")).await;
    assert_eq!((replay.status(), replay.bytes().await.unwrap()), (StatusCode::CREATED, body));
    let id = payment["id"].as_str().unwrap();
    assert!(app.database_says(&format!("EXISTS (SELECT FROM open_authorizations WHERE payment_id = '{id}')")).await);
    let staged = format!(
        "(SELECT event_type = 'payment.authorized' FROM events WHERE body -> 'data' -> 'object' ->> 'id' = '{id}')"
    );
    assert!(app.database_says(&staged).await, "its event: payment.authorized");

    // Nothing is captured yet, so there is nothing to refund.
    let refund = app.post_refund(&new_key(), &json!({ "payment": id })).await;
    assert_eq!(refund.status(), StatusCode::BAD_REQUEST);
    let refund: Value = refund.json().await.unwrap();
    assert_eq!(refund["type"], "https://payments.example/problems/payment-not-refundable");
}

#[tokio::test]
async fn a_payment_charged_at_once_shows_what_it_captured() {
    let app = TestApp::spawn().await;
    let paid = app.paid(5000, "tok_visa").await;
    assert_eq!((&paid["status"], &paid["capture_method"]), (&json!("succeeded"), &json!("automatic")));
    assert_eq!((&paid["amount_captured"], &paid["amount_capturable"]), (&json!(5000), &json!(0)));
    assert_eq!(paid["capture_before"], Value::Null);

    // The same key with `capture: false` is another request; and said outright, `capture: true` is
    // the same as saying nothing.
    let key = new_key();
    let charged = json!({ "amount": 700, "currency": "usd", "source": "tok_visa" });
    assert_eq!(app.post_payment(&key, &charged).await.status(), StatusCode::CREATED);
    let explicit = json!({ "amount": 700, "currency": "usd", "source": "tok_visa", "capture": true });
    assert_eq!(app.post_payment(&key, &explicit).await.status(), StatusCode::CREATED);
    let other = app.post_payment(&key, &authorization(700, "tok_visa")).await;
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn a_declined_authorization_is_a_declined_payment() {
    let app = TestApp::spawn().await;
    let response = app.post_payment(&new_key(), &authorization(5000, "tok_chargeDeclined")).await;
    assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["payment"]["status"], "failed");
    assert_eq!(problem["payment"]["amount_capturable"], 0);
    assert!(app.database_says("NOT EXISTS (SELECT FROM open_authorizations)").await);
}

impl TestApp {
    /// `POST /v1/payments/{id}/{action}` (`capture` or `cancel`) under `key`, with `body`.
    async fn change(&self, id: &str, action: &str, key: &str, body: &Value) -> reqwest::Response {
        let url = format!("{}/v1/payments/{id}/{action}", self.address);
        let request = self.http.post(url).bearer_auth(&self.api_key).header("Idempotency-Key", key);
        request.json(body).send().await.expect("answered")
    }

    /// A payment authorized for `amount`: its id.
    async fn authorized(&self, amount: i64) -> String {
        let response = self.post_payment(&new_key(), &authorization(amount, "tok_visa")).await;
        assert_eq!(response.status(), StatusCode::CREATED);
        let payment: Value = response.json().await.unwrap();
        payment["id"].as_str().unwrap().to_owned()
    }
}

/// A problem's type, by its last segment.
async fn problem_type(response: reqwest::Response) -> (StatusCode, String) {
    let status = response.status();
    let problem: Value = response.json().await.unwrap();
    (status, problem["type"].as_str().unwrap_or_default().rsplit('/').next().unwrap_or_default().to_owned())
}

#[tokio::test]
async fn a_partial_capture_is_replayed_and_refunds_take_back_only_what_it_captured() {
    let app = TestApp::spawn().await;
    let id = app.authorized(5000).await;
    let key = new_key();
    let response = app.change(&id, "capture", &key, &json!({ "amount": 3000 })).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.bytes().await.unwrap();
    let payment: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((&payment["status"], &payment["amount_captured"]), (&json!("succeeded"), &json!(3000)));
    assert_eq!(payment["amount_capturable"], 0);
    let charge = app.gateway.charge(payment["gateway_charge_id"].as_str().unwrap()).await;
    assert_eq!((&charge["status"], &charge["amount_captured"]), (&json!("succeeded"), &json!(3000)));

    // Replayed byte for byte; the same key on another payment, or with another amount, is 422.
    let replay = app.change(&id, "capture", &key, &json!({ "amount": 3000 })).await;
    assert_eq!((replay.status(), replay.bytes().await.unwrap()), (StatusCode::OK, body));
    let other_amount = app.change(&id, "capture", &key, &json!({ "amount": 2000 })).await;
    assert_eq!(other_amount.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let other = app.authorized(5000).await;
    let other_payment = app.change(&other, "capture", &key, &json!({ "amount": 3000 })).await;
    assert_eq!(other_payment.status(), StatusCode::UNPROCESSABLE_ENTITY);

    // Captured once: neither captured again nor cancelled, under any key.
    let again = app.change(&id, "capture", &new_key(), &json!({})).await;
    assert_eq!(problem_type(again).await, (StatusCode::BAD_REQUEST, "payment-not-capturable".into()));
    let cancel = app.change(&id, "cancel", &new_key(), &json!({})).await;
    assert_eq!(problem_type(cancel).await, (StatusCode::BAD_REQUEST, "payment-not-cancelable".into()));

    // Refunds take back at most the 3000 captured.
    let too_much = app.post_refund(&new_key(), &json!({ "payment": id, "amount": 3001 })).await;
    assert_eq!(problem_type(too_much).await, (StatusCode::BAD_REQUEST, "refund-exceeds-payment".into()));
    let all = app.post_refund(&new_key(), &json!({ "payment": id })).await;
    assert_eq!(all.status(), StatusCode::CREATED);
    assert_eq!(all.json::<Value>().await.unwrap()["amount"], 3000);
    assert_eq!(app.gateway.all_stats().await["captures"], 1);
}

#[tokio::test]
async fn a_cancelled_payment_is_never_captured_and_a_capture_is_held_to_what_was_authorized() {
    let app = TestApp::spawn().await;
    let id = app.authorized(5000).await;
    let too_much = app.change(&id, "capture", &new_key(), &json!({ "amount": 5001 })).await;
    assert_eq!(too_much.status(), StatusCode::BAD_REQUEST);
    let problem: Value = too_much.json().await.unwrap();
    assert_eq!(
        (problem["type"].as_str().unwrap().rsplit('/').next(), &problem["capturable"]),
        (Some("capture-exceeds-authorization"), &json!(5000))
    );

    let canceled = app.change(&id, "cancel", &new_key(), &json!({ "reason": "requested_by_customer" })).await;
    assert_eq!(canceled.status(), StatusCode::OK);
    let payment: Value = canceled.json().await.unwrap();
    assert_eq!(
        (&payment["status"], &payment["cancellation_reason"]),
        (&json!("canceled"), &json!("requested_by_customer"))
    );
    assert_eq!((&payment["amount_capturable"], &payment["amount_captured"]), (&json!(0), &json!(0)));
    assert!(payment["canceled_at"].is_string());
    let capture = app.change(&id, "capture", &new_key(), &json!({})).await;
    assert_eq!(problem_type(capture).await, (StatusCode::BAD_REQUEST, "payment-not-capturable".into()));
    let refund = app.post_refund(&new_key(), &json!({ "payment": id })).await;
    assert_eq!(problem_type(refund).await, (StatusCode::BAD_REQUEST, "payment-not-refundable".into()));
    assert!(
        app.database_says(&format!("NOT EXISTS (SELECT FROM open_authorizations WHERE payment_id = '{id}')")).await
    );

    // A payment charged at once is no authorization; nor is one that does not exist.
    let paid = app.paid(700, "tok_visa").await;
    let at_once = app.change(paid["id"].as_str().unwrap(), "capture", &new_key(), &json!({})).await;
    assert_eq!(problem_type(at_once).await, (StatusCode::BAD_REQUEST, "payment-not-capturable".into()));
    let unknown = app.change(&uuid::Uuid::now_v7().to_string(), "cancel", &new_key(), &json!({})).await;
    assert_eq!(problem_type(unknown).await, (StatusCode::NOT_FOUND, "payment-not-found".into()));
}

/// The servers of a race, behind a proxy that holds the gateway's capture and cancel calls: long
/// gateway timeouts (and leases to match), so that a change held while the rest of the race is
/// answered, on however slow a machine, is still answered by the gateway.
pub const HELD_CHANGES_ENV: [(&str, &str); 2] =
    [("PAYMENTS_GATEWAY_TIMEOUT_MS", "60000"), ("PAYMENTS_LOCK_TIMEOUT_MS", "200000")];

/// Twelve captures and cancels of one authorization (`change(n, action)` sends the `n`th), sent at
/// once while `proxy` holds the first change to reach the gateway: exactly one does, and every
/// other is refused (`400`) while it is in flight, so the database decided, not a status read
/// after the winner finished. Then the held change wins (`200`), and the gateway was asked once, of
/// its kind. Returns the winner's action.
pub async fn one_change_wins_while_it_is_in_flight<F>(
    proxy: &HeldProxy,
    gateway: &GatewayControl,
    round: usize,
    change: impl Fn(usize, &'static str) -> F,
) -> &'static str
where
    F: Future<Output = u16>,
{
    let asked = async || {
        let stats = gateway.all_stats().await;
        (stats["capture_requests"].as_u64().unwrap(), stats["cancel_requests"].as_u64().unwrap())
    };
    let before = asked().await;
    let actions: Vec<&'static str> = (0..12).map(|n| if n % 2 == 0 { "capture" } else { "cancel" }).collect();
    let race = proxy.race(actions.iter().enumerate().map(|(n, action)| change(n, action)).collect()).await;
    assert_eq!(
        race.calls, 1,
        "round {round}: changes at the gateway at once (the database let more than one stand): {race:?}"
    );
    assert!(
        race.while_held.len() == 11 && race.while_held.iter().all(|&status| status == 400),
        "round {round}: {race:?}"
    );
    let winners: Vec<usize> = (0..12).filter(|&n| race.statuses[n] == 200).collect();
    assert_eq!(winners.len(), 1, "round {round}: {race:?}");
    let won = actions[winners[0]];
    let after = asked().await;
    let expected = if won == "capture" { (before.0 + 1, before.1) } else { (before.0, before.1 + 1) };
    assert_eq!(after, expected, "round {round}: one gateway request, the winner's {won}");
    won
}

#[tokio::test]
async fn of_twelve_captures_and_cancels_at_once_over_two_servers_exactly_one_wins() {
    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let (_, api_key) = payments_service::accounts::create(&mut conn, "racing").await.unwrap();
    let gateway = Process::gateway().await;
    let proxy = HeldProxy::holding(&gateway.url, HeldProxy::changes);
    let servers = [
        Process::serve(&database.url, &proxy.url, &["--no-workers"], &HELD_CHANGES_ENV).await,
        Process::serve(&database.url, &proxy.url, &["--no-workers"], &HELD_CHANGES_ENV).await,
    ];
    let http = reqwest::Client::new();
    let post = |server: &Process, path: String, key: String, body: Value| {
        http.post(format!("{}{path}", server.url))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
    };
    let control = GatewayControl::new(&gateway.url);
    let mut won = Vec::new();
    for round in 0..5 {
        let authorized =
            post(&servers[0], "/v1/payments".into(), new_key(), authorization(5000, "tok_visa")).await.unwrap();
        let id = authorized.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
        let change = |n: usize, action: &str| {
            let sent = post(&servers[n / 2 % 2], format!("/v1/payments/{id}/{action}"), new_key(), json!({}));
            async move { sent.await.unwrap().status().as_u16() }
        };
        won.push(one_change_wins_while_it_is_in_flight(&proxy, &control, round, change).await);
    }
    let stats = control.all_stats().await;
    let captures = won.iter().filter(|&&won| won == "capture").count();
    let cancels = won.len() - captures;
    assert_eq!(
        (&stats["captures"], &stats["cancels"]),
        (&json!(captures), &json!(cancels)),
        "one change a round: {stats}"
    );
}

#[tokio::test]
async fn a_capture_whose_answer_was_lost_is_done_once_by_its_retry() {
    for fault in ["error_after", "timeout_after"] {
        let app = TestApp::builder().gateway_timeout(std::time::Duration::from_millis(500)).spawn().await;
        let id = app.authorized(5000).await;
        let key = new_key();
        app.gateway.fault(fault, 1).await;
        let lost = app.change(&id, "capture", &key, &json!({ "amount": 4000 })).await;
        assert_eq!(lost.status(), StatusCode::SERVICE_UNAVAILABLE, "{fault}");
        let retried = app.change(&id, "capture", &key, &json!({ "amount": 4000 })).await;
        assert_eq!(retried.status(), StatusCode::OK, "{fault}");
        let payment: Value = retried.json().await.unwrap();
        assert_eq!(payment["amount_captured"], 4000, "{fault}");
        let stats = app.gateway.all_stats().await;
        assert_eq!(
            (&stats["captures"], &stats["capture_requests"]),
            (&json!(1), &json!(1)),
            "{fault}: read, not asked again"
        );
        let story: Value = app.key_story(&key).await.json().await.unwrap();
        assert_eq!((&story["recovery_point"], &story["payment"]["status"]), (&json!("finished"), &json!("succeeded")));
        assert!(
            story["trail"].as_array().unwrap().iter().any(|entry| entry["action"] == "payment.capture_recorded"),
            "{story}"
        );
    }
}

#[tokio::test]
async fn a_capture_or_cancel_made_by_its_run_is_recorded_and_finished_at_once() {
    let faulted = Faulted::start("at once").await;
    let Faulted { database, gateway, server, http, api_key } = &faulted;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let post = |path: &str, key: &str, body: &Value, fault: Option<&str>| faulted.post(path, key, body, fault);
    for (kind, body) in [("capture", json!({ "amount": 3000 })), ("cancel", json!({ "reason": "abandoned" }))] {
        let authorized = post("/v1/payments", &new_key(), &authorization(5000, "tok_visa"), None).await.unwrap();
        let id = authorized.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
        // No point between the answer's record and the finish to crash at: they are one statement.
        let key = new_key();
        let path = format!("/v1/payments/{id}/{kind}");
        let changed = post(&path, &key, &body, Some("crash=after_change_created")).await.expect("no crash");
        assert_eq!(changed.status(), StatusCode::OK, "{kind}");
        let answered: Value = changed.json().await.unwrap();
        assert_eq!(key_point(&database.url, &key).await, "finished", "{kind}");
        // The answer says what the database holds, the time of a cancel included.
        let stored = http.get(format!("{}/v1/payments/{id}", server.url)).bearer_auth(api_key).send().await.unwrap();
        assert_eq!(answered, stored.json::<Value>().await.unwrap(), "{kind}");
        let trail = format!(
            "(SELECT array_agg(action::text ORDER BY id) = ARRAY['payment.{kind}_started', 'payment.{kind}_recorded', \
                                                          'payment.{kind}_finished']
              FROM audit_records WHERE resource_type = 'payment_change')
             AND EXISTS (SELECT FROM events WHERE body -> 'data' -> 'object' ->> 'id' = '{id}'
                         AND event_type = 'payment.{}')",
            if kind == "capture" { "captured" } else { "canceled" }
        );
        assert!(TestApp::database_says_on(&mut conn, &trail).await, "{kind}: recorded, finished and announced");
        // Recorded and finished by one transaction: the change's row and the key's last versions.
        let together = format!(
            "(SELECT c.xmin = k.xmin FROM payment_changes c JOIN idempotency_keys k ON k.id = c.idempotency_key_id
              WHERE c.payment_id = '{id}')"
        );
        assert!(TestApp::database_says_on(&mut conn, &together).await, "{kind}: in one transaction");
        conn.batch_execute("DELETE FROM audit_records WHERE resource_type = 'payment_change'").await.unwrap();
    }
    assert_eq!(kind_counts(gateway).await, (1, 1), "each done once");
}

#[tokio::test]
async fn a_change_whose_payment_was_written_meanwhile_records_nothing_and_its_retry_records_the_row() {
    let faulted = Faulted::start("guarded").await;
    let Faulted { database, gateway, server, .. } = &faulted;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let post = |path: &str, key: &str, body: &Value, fault: Option<&str>| faulted.post(path, key, body, fault);
    let authorized = post("/v1/payments", &new_key(), &authorization(5000, "tok_visa"), None).await.unwrap();
    let id = authorized.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let (key, path, body) = (new_key(), format!("/v1/payments/{id}/capture"), json!({ "amount": 3000 }));

    // The run that made the change stops after the gateway captured, before it records.
    let stalled = tokio::spawn(post(&path, &key, &body, Some("pause=after_change")));
    crate::helpers::wait_until(std::time::Duration::from_secs(10), "the server is stopped", || async {
        server.is_stopped()
    })
    .await;
    // Something writes the payment meanwhile, as nothing in the service does while a change
    // stands: the answer the run built from the payment it found is no longer the row's.
    let touched = format!("UPDATE payments SET updated_at = updated_at + interval '1 millisecond' WHERE id = '{id}'");
    conn.batch_execute(&touched).await.unwrap();
    server.signal(Signal::SIGCONT);
    let woken = stalled.await.unwrap().unwrap();
    assert!(woken.status().is_server_error(), "{}", woken.status());
    assert_eq!(key_point(&database.url, &key).await, "started", "nothing recorded");
    let untouched = format!(
        "(SELECT status = 'requires_capture' FROM payments WHERE id = '{id}')
         AND NOT EXISTS (SELECT FROM audit_records WHERE action = 'payment.capture_recorded')"
    );
    assert!(TestApp::database_says_on(&mut conn, &untouched).await);

    // The retry takes the change up: it reads the charge, records the answer, then finishes.
    end_the_leases(&database.url).await;
    let retried = post(&path, &key, &body, None).await.unwrap();
    assert_eq!(retried.status(), StatusCode::OK);
    let answered: Value = retried.json().await.unwrap();
    assert_eq!((&answered["status"], &answered["amount_captured"]), (&json!("succeeded"), &json!(3000)));
    assert_eq!(kind_counts(gateway).await, (1, 0), "captured once");
}

/// A database with an account, a gateway and a `serve` that takes fault injection, for one test.
struct Faulted {
    database: TestDatabase,
    api_key: String,
    gateway: Process,
    server: Process,
    http: reqwest::Client,
}

impl Faulted {
    async fn start(account: &str) -> Faulted {
        let database = TestDatabase::create().await;
        let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
        let (_, api_key) = payments_service::accounts::create(&mut conn, account).await.unwrap();
        let gateway = Process::gateway().await;
        let env = [("PAYMENTS_FAULT_INJECTION", "1")];
        let server = Process::serve(&database.url, &gateway.url, &["--no-workers"], &env).await;
        Faulted { database, api_key, gateway, server, http: reqwest::Client::new() }
    }

    /// `body` posted to `path` under `key`, with `fault` as its `X-Fault-Inject` if any.
    fn post(
        &self,
        path: &str,
        key: &str,
        body: &Value,
        fault: Option<&str>,
    ) -> impl Future<Output = reqwest::Result<reqwest::Response>> + use<> {
        let request = self.http.post(format!("{}{path}", self.server.url)).bearer_auth(&self.api_key);
        let request = request.header("Idempotency-Key", key);
        let request = match fault {
            Some(fault) => request.header("X-Fault-Inject", fault),
            None => request,
        };
        request.json(body).send()
    }
}

/// The captures and the cancels the gateway made.
async fn kind_counts(gateway: &Process) -> (u64, u64) {
    let stats = GatewayControl::new(&gateway.url).all_stats().await;
    (stats["captures"].as_u64().unwrap(), stats["cancels"].as_u64().unwrap())
}

#[tokio::test]
async fn a_capture_or_cancel_crashed_before_or_after_the_gateway_is_done_once_by_its_retry() {
    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let (_, api_key) = payments_service::accounts::create(&mut conn, "crashing").await.unwrap();
    let gateway = Process::gateway().await;
    let env = [("PAYMENTS_FAULT_INJECTION", "1")];
    let http = reqwest::Client::new();
    let post = |server: &Process, path: &str, key: &str, body: &Value| {
        let request = http.post(format!("{}{path}", server.url)).bearer_auth(&api_key).header("Idempotency-Key", key);
        request.json(body).send()
    };
    let changes = [("capture", json!({ "amount": 3000 }), "captures"), ("cancel", json!({}), "cancels")];
    for (kind, body, counted) in changes {
        // Between `started` and the gateway's call; between its answer and its recording; and
        // between that and `finished`. A run that made the change records the answer with the
        // key's finish: a key stops at `*_created` only on a run that took it up, here the
        // retry of one crashed after the change.
        for (n, point) in ["after_started", "after_change", "after_change_created"].into_iter().enumerate() {
            let id = {
                let server = Process::serve(&database.url, &gateway.url, &["--no-workers"], &env).await;
                let authorized =
                    post(&server, "/v1/payments", &new_key(), &authorization(5000, "tok_visa")).await.unwrap();
                authorized.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned()
            };
            let (key, path) = (new_key(), format!("/v1/payments/{id}/{kind}"));
            let crashes: &[&str] = match point {
                "after_change_created" => &["after_change", "after_change_created"],
                point => &[point],
            };
            for crash_at in crashes {
                end_the_leases(&database.url).await;
                let mut server = Process::serve(&database.url, &gateway.url, &["--no-workers"], &env).await;
                let crash =
                    http.post(format!("{}{path}", server.url)).bearer_auth(&api_key).header("Idempotency-Key", &key);
                let crashed = crash.header("X-Fault-Inject", format!("crash={crash_at}")).json(&body).send().await;
                assert!(crashed.is_err(), "{kind} {crash_at}: the connection dies with the process");
                let status = server.exited().await;
                assert_eq!(status.signal(), Some(Signal::SIGABRT as i32), "{kind} {crash_at}: aborted, no clean-up");
            }
            // The key stands where the crash left it: its change made, and (once the gateway's
            // answer is recorded) the answer with it.
            let left_at = match point {
                "after_change_created" => format!("{kind}_created"),
                _ => "started".to_owned(),
            };
            assert_eq!(key_point(&database.url, &key).await, left_at, "{kind} {point}");
            // Another process takes the retry, once the dead one's lease on the key is over.
            end_the_leases(&database.url).await;
            let server = Process::serve(&database.url, &gateway.url, &["--no-workers"], &env).await;
            let retried = post(&server, &path, &key, &body).await.unwrap();
            assert_eq!(retried.status(), StatusCode::OK, "{kind} {point}");
            assert_eq!(key_point(&database.url, &key).await, "finished", "{kind} {point}");
            let payment: Value = retried.json().await.unwrap();
            match kind {
                "capture" => {
                    assert_eq!((&payment["status"], &payment["amount_captured"]), (&json!("succeeded"), &json!(3000)))
                }
                _ => assert_eq!(payment["status"], "canceled", "{point}"),
            }
            let stats = GatewayControl::new(&gateway.url).all_stats().await;
            assert_eq!(stats[counted], n + 1, "{kind} {point}: done once");
        }
    }
}

#[tokio::test]
async fn a_capture_refused_because_the_gateway_cancelled_the_authorization_leaves_the_payment_cancelled() {
    let app = TestApp::spawn().await;
    let id = app.authorized(5000).await;
    let payment: Value = app.get(&format!("/v1/payments/{id}")).await.json().await.unwrap();
    app.gateway.cancel_charge(payment["gateway_charge_id"].as_str().unwrap()).await;
    // The gateway refuses the capture (`charge_canceled`) and says the charge is cancelled: the
    // payment says so too, rather than wait for a capture that can never come.
    let key = new_key();
    let refused = app.change(&id, "capture", &key, &json!({})).await;
    assert_eq!(refused.status(), StatusCode::BAD_GATEWAY);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(refused["type"], "https://payments.example/problems/gateway-rejected");
    assert_eq!(
        (&refused["payment"]["status"], &refused["payment"]["cancellation_reason"]),
        (&json!("canceled"), &Value::Null),
        "{refused}"
    );
    let payment: Value = app.get(&format!("/v1/payments/{id}")).await.json().await.unwrap();
    assert_eq!((&payment["status"], &payment["amount_capturable"]), (&json!("canceled"), &json!(0)), "{payment}");
    assert!(
        app.database_says(&format!("NOT EXISTS (SELECT FROM open_authorizations WHERE payment_id = '{id}')")).await
    );
    let staged = format!(
        "EXISTS (SELECT FROM events WHERE event_type = 'payment.canceled' \
         AND body -> 'data' -> 'object' ->> 'id' = '{id}')"
    );
    assert!(app.database_says(&staged).await, "its event: payment.canceled");
    // A cancel now is refused, naming the payment as it stands; nothing more at the gateway.
    let cancel = app.change(&id, "cancel", &new_key(), &json!({})).await;
    assert_eq!(problem_type(cancel).await, (StatusCode::BAD_REQUEST, "payment-not-cancelable".into()));
    assert_eq!(app.gateway.all_stats().await["captures"], 0);
}

/// The recovery point of the key `key` (one account's in the database at `url`).
async fn key_point(url: &str, key: &str) -> String {
    use diesel::prelude::*;
    use payments_service::db::schema::idempotency_keys as k;
    let mut conn = AsyncPgConnection::establish(url).await.unwrap();
    let point = k::table.filter(k::idempotency_key.eq(key)).select(k::recovery_point);
    diesel_async::RunQueryDsl::get_result(point, &mut conn).await.unwrap()
}

#[tokio::test]
async fn a_capture_whose_charge_the_gateway_captured_for_another_amount_is_refused_and_the_payment_records_it() {
    let app = TestApp::spawn().await;
    let id = app.authorized(5000).await;
    let payment: Value = app.get(&format!("/v1/payments/{id}")).await.json().await.unwrap();
    // Someone captures 2000 at the gateway's dashboard; the capture asked for all of it.
    app.gateway.capture_charge(payment["gateway_charge_id"].as_str().unwrap(), 2000).await;

    let refused = app.change(&id, "capture", &new_key(), &json!({})).await;

    // Not this capture's doing: refused, and the payment records what the gateway captured.
    assert_eq!(refused.status(), StatusCode::BAD_GATEWAY);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(
        (&refused["payment"]["status"], &refused["payment"]["amount_captured"]),
        (&json!("succeeded"), &json!(2000)),
        "{refused}"
    );
    let staged = format!(
        "EXISTS (SELECT FROM events WHERE event_type = 'payment.captured' \
         AND body -> 'data' -> 'object' ->> 'id' = '{id}')"
    );
    assert!(app.database_says(&staged).await, "its event: payment.captured");
    assert!(
        app.database_says(&format!("(SELECT status = 'failed' FROM payment_changes WHERE payment_id = '{id}')")).await
    );
    assert_eq!(app.gateway.all_stats().await["captures"], 1, "the dashboard's alone");
}

/// Ends the lease of every held key now, as time would for a dead process's.
async fn end_the_leases(url: &str) {
    let mut conn = AsyncPgConnection::establish(url).await.unwrap();
    let over =
        "UPDATE idempotency_keys SET locked_until = now() - interval '1 millisecond' WHERE locked_until IS NOT NULL";
    diesel_async::RunQueryDsl::execute(diesel::sql_query(over), &mut conn).await.unwrap();
}

#[tokio::test]
async fn an_authorization_lapses_once_past_its_time_and_a_capture_then_loses_to_it() {
    let app = TestApp::builder().authorization_ttl(std::time::Duration::from_secs(1)).spawn().await;
    let lapser = app.workers().lapser;
    // Captured in time: nothing lapses.
    let captured = app.authorized(5000).await;
    assert_eq!(app.change(&captured, "capture", &new_key(), &json!({})).await.status(), StatusCode::OK);
    // Left alone past its time: the lapse cancels it, at the gateway too; a capture then is refused.
    let lapsing = app.authorized(5000).await;
    let due = format!("(SELECT capture_before <= now() FROM payments WHERE id = '{lapsing}')");
    crate::helpers::wait_until(std::time::Duration::from_secs(10), "the authorization is past its time", || {
        app.database_says(&due)
    })
    .await;
    let late = app.change(&lapsing, "capture", &new_key(), &json!({})).await;
    assert_eq!(problem_type(late).await, (StatusCode::BAD_REQUEST, "payment-not-capturable".into()));
    assert_eq!(lapser.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(lapser.run_once().await.unwrap(), Outcome::Idle, "one lapse, once");
    let payment: Value = app.get(&format!("/v1/payments/{lapsing}")).await.json().await.unwrap();
    assert_eq!((&payment["status"], &payment["cancellation_reason"]), (&json!("canceled"), &json!("expired")));
    let charge = app.gateway.charge(payment["gateway_charge_id"].as_str().unwrap()).await;
    assert_eq!(charge["status"], "canceled");
    // Every record of the lapse's key, its claim's included, names the lapser, not the API.
    let lapse_records = format!(
        "(SELECT array_agg(DISTINCT actor) = '{{lapser}}' FROM audit_records \
         WHERE request_id IN (SELECT request_id FROM audit_records \
                              WHERE action = 'payment.cancel_started' AND data ->> 'payment' = '{lapsing}'))"
    );
    assert!(app.database_says(&lapse_records).await, "the lapse's records are the lapser's");
    let still: Value = app.get(&format!("/v1/payments/{captured}")).await.json().await.unwrap();
    assert_eq!(still["status"], "succeeded", "a captured payment never lapses");
    assert_eq!(app.gateway.all_stats().await["cancels"], 1);
}

#[tokio::test]
async fn the_gateways_capture_and_cancel_events_are_applied_once_and_agree() {
    let app = TestApp::builder().gateway_events().spawn().await;
    let captured = app.authorized(5000).await;
    assert_eq!(app.change(&captured, "capture", &new_key(), &json!({ "amount": 100 })).await.status(), StatusCode::OK);
    let canceled = app.authorized(5000).await;
    assert_eq!(app.change(&canceled, "cancel", &new_key(), &json!({})).await.status(), StatusCode::OK);
    // Two authorizations (charge.succeeded, not captured), a capture and a cancel: each recorded
    // once, and each agreeing with what its key recorded (or, come before, waking it).
    let recorded = "SELECT count(*) = 4 FROM gateway_events";
    crate::helpers::wait_until(std::time::Duration::from_secs(10), "the four events are recorded", || {
        app.database_says(recorded)
    })
    .await;
    let kinds = "SELECT array_agg(event_type ORDER BY event_type) = \
                 '{charge.canceled,charge.captured,charge.succeeded,charge.succeeded}' FROM gateway_events";
    assert!(app.database_says(kinds).await);
    assert!(
        app.database_says("NOT EXISTS (SELECT FROM gateway_events WHERE outcome NOT IN ('applied', 'nudged'))").await
    );
    assert!(app.database_says("NOT EXISTS (SELECT FROM idempotency_keys WHERE needs_attention_at IS NOT NULL)").await);
}

#[tokio::test]
async fn a_lapse_the_gateway_refuses_is_tried_again_only_after_a_backoff() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let gateway = MockServer::start().await;
    let authorized = json!({ "id": "ch_held", "object": "charge", "amount": 5000, "amount_captured": 0,
                             "currency": "usd", "captured": false, "status": "requires_capture" });
    Mock::given(method("POST"))
        .and(path("/v1/charges"))
        .respond_with(ResponseTemplate::new(200).set_body_json(&authorized))
        .mount(&gateway)
        .await;
    // The gateway refuses to release the hold, for good, and the charge stays authorized.
    let refused = json!({ "error": { "type": "invalid_request_error", "code": "processing_error",
                                     "message": "This authorization cannot be cancelled now." } });
    Mock::given(method("POST"))
        .and(path("/v1/charges/ch_held/cancel"))
        .respond_with(ResponseTemplate::new(400).set_body_json(refused))
        .expect(1)
        .mount(&gateway)
        .await;
    let app = TestApp::builder()
        .gateway_url(gateway.uri())
        .authorization_ttl(std::time::Duration::from_secs(1))
        .workers(|w| w.completer_backoff = std::time::Duration::from_secs(3600))
        .spawn()
        .await;
    let id = app.authorized(5000).await;
    let due = format!("(SELECT capture_before <= now() FROM payments WHERE id = '{id}')");
    crate::helpers::wait_until(std::time::Duration::from_secs(10), "the authorization is past its time", || {
        app.database_says(&due)
    })
    .await;
    let lapser = app.workers().lapser;
    assert_eq!(lapser.run_once().await.unwrap(), Outcome::Worked);
    let payment: Value = app.get(&format!("/v1/payments/{id}")).await.json().await.unwrap();
    assert_eq!(payment["status"], "requires_capture", "the gateway still holds it: {payment}");
    // Refused once, the lapse waits out its backoff rather than ask again at every run, each
    // time with a key and a change of its own.
    assert_eq!(lapser.run_once().await.unwrap(), Outcome::Idle);
    assert!(app.database_says(&format!("(SELECT count(*) = 1 FROM payment_changes WHERE payment_id = '{id}')")).await);
    // Once it has waited, it is tried again.
    let waited =
        format!("UPDATE payment_changes SET updated_at = now() - interval '2 hours' WHERE payment_id = '{id}'");
    app.run_sql(&waited).await;
    gateway.reset().await;
    Mock::given(method("POST"))
        .and(path("/v1/charges/ch_held/cancel"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({ "id": "ch_held", "object": "charge",
            "amount": 5000, "amount_captured": 0, "captured": false, "status": "canceled" })))
        .expect(1)
        .mount(&gateway)
        .await;
    assert_eq!(lapser.run_once().await.unwrap(), Outcome::Worked);
    let payment: Value = app.get(&format!("/v1/payments/{id}")).await.json().await.unwrap();
    assert_eq!((&payment["status"], &payment["cancellation_reason"]), (&json!("canceled"), &json!("expired")));
}

#[tokio::test]
async fn a_refund_racing_its_payments_capture_is_decided_on_the_capture_never_a_500() {
    let app = TestApp::spawn().await;
    let id = app.authorized(5000).await;
    let payment: Value = app.get(&format!("/v1/payments/{id}")).await.json().await.unwrap();
    app.gateway.capture_charge(payment["gateway_charge_id"].as_str().unwrap(), 4000).await;
    // The capture's record, committed while the refund's statement waits for the payment's row:
    // the statement's snapshot is from before the capture, its decision (on the row it locked)
    // from after it.
    let mut capture = crate::helpers::OpenTransaction::begin(&app.database.url).await;
    capture
        .run(&format!(
            "UPDATE payments SET status = 'succeeded', amount_captured = 4000, updated_at = now() WHERE id = '{id}'"
        ))
        .await;
    let (key, body) = (new_key(), json!({ "payment": id, "amount": 3000 }));
    let release = capture.commit_once_waited_for(std::time::Duration::from_secs(10));
    let (refund, released) = tokio::join!(app.post_refund(&key, &body), release);
    released.expect("the refund waits for the capture");
    assert_eq!(refund.status(), StatusCode::CREATED, "{:?}", refund.text().await);
    let payment: Value = app.get(&format!("/v1/payments/{id}")).await.json().await.unwrap();
    assert_eq!((&payment["amount_captured"], &payment["amount_refunded"]), (&json!(4000), &json!(3000)));
}

#[tokio::test]
async fn a_change_refused_because_the_charge_was_captured_meanwhile_leaves_no_room_for_another() {
    let app = TestApp::builder().gateway_timeout(std::time::Duration::from_millis(500)).spawn().await;
    let id = app.authorized(5000).await;
    let payment: Value = app.get(&format!("/v1/payments/{id}")).await.json().await.unwrap();
    // A cancel that stands, its outcome unknown (the gateway failed before doing anything).
    app.gateway.fault("error_before", 1).await;
    let cancel = app.change(&id, "cancel", &new_key(), &json!({})).await;
    assert_eq!(cancel.status(), StatusCode::SERVICE_UNAVAILABLE);
    // Meanwhile the charge is captured at the gateway itself; the cancel's record, refused
    // because of it, ends the payment captured: committed while a capture under another key
    // waits for it.
    app.gateway.capture_charge(payment["gateway_charge_id"].as_str().unwrap(), 5000).await;
    let mut record = crate::helpers::OpenTransaction::begin(&app.database.url).await;
    record.run(&format!("SELECT FROM payments WHERE id = '{id}' FOR UPDATE")).await;
    record
        .run(&format!(
            "UPDATE payment_changes SET status = 'failed', failure_code = 'charge_already_captured', \
             failure_message = 'the charge is captured' WHERE payment_id = '{id}'"
        ))
        .await;
    record
        .run(&format!(
            "UPDATE payments SET status = 'succeeded', amount_captured = 5000, updated_at = now() WHERE id = '{id}'"
        ))
        .await;
    record.run(&format!("DELETE FROM open_authorizations WHERE payment_id = '{id}'")).await;
    let (key, body) = (new_key(), json!({}));
    let release = record.commit_once_waited_for(std::time::Duration::from_secs(10));
    let (capture, released) = tokio::join!(app.change(&id, "capture", &key, &body), release);
    released.expect("the capture waits for the record");
    // The payment ended with the cancel's record: the capture finds it captured, and is refused.
    assert_eq!(problem_type(capture).await, (StatusCode::BAD_REQUEST, "payment-not-capturable".into()));
    assert!(app.database_says(&format!("(SELECT count(*) = 1 FROM payment_changes WHERE payment_id = '{id}')")).await);
    assert_eq!(app.gateway.all_stats().await["capture_requests"], 1, "only the gateway's own capture");
}

#[tokio::test]
async fn an_authorization_that_lapsed_before_its_key_finished_is_announced_as_authorized() {
    let app = TestApp::spawn().await;
    let (key, body) = (
        new_key(),
        json!({ "amount": 1000, "currency": "usd", "source": "tok_visa",
                                          "description": "Order #42", "capture": false }),
    );
    // Its key left at `charge_created` by a process that died there; the lapse came first.
    let key_id = app.seed_key(&key, &body, "charge_created", crate::helpers::Lock::Free).await;
    let id = app.seed_payment(key_id, &key, "pending", None).await;
    let lapsed = format!(
        "UPDATE payments SET status = 'canceled', gateway_charge_id = 'ch_lapsed', capture_method = 'manual', \
         amount_captured = 0, capture_before = now(), canceled_at = now(), cancellation_reason = 'expired' \
         WHERE id = '{id}'"
    );
    app.run_sql(&lapsed).await;
    let retried = app.post_payment(&key, &body).await;
    assert_eq!(retried.status(), StatusCode::CREATED);
    let staged = format!(
        "(SELECT array_agg(event_type) = '{{payment.authorized}}' FROM events \
         WHERE body -> 'data' -> 'object' ->> 'id' = '{id}')"
    );
    assert!(app.database_says(&staged).await, "announced as authorized, never as failed");
}

#[tokio::test]
async fn a_late_retry_of_a_capture_whose_key_expired_is_410_naming_the_payment_and_captures_nothing() {
    let app = TestApp::spawn().await;
    let id = app.authorized(5000).await;
    let key = new_key();
    assert_eq!(app.change(&id, "capture", &key, &json!({})).await.status(), StatusCode::OK);
    let expired = format!(
        "UPDATE idempotency_keys SET finished_at = now() - interval '2 hours', expires_at = now() - interval '1 hour' \
         WHERE idempotency_key = '{key}'"
    );
    app.run_sql(&expired).await;
    // Another process, which never answered it: this one may still replay it from memory until
    // the expiry it was told.
    let other = TestApp::builder().spawn_beside(&app).await;
    let late = other.change(&id, "capture", &key, &json!({})).await;
    assert_eq!(late.status(), StatusCode::GONE);
    let late: Value = late.json().await.unwrap();
    let detail = late["detail"].as_str().unwrap();
    assert!(detail.contains("asked to capture payment") && detail.contains("Nothing was changed now"), "{detail}");
    assert_eq!(late["payment"]["status"], "succeeded", "{late}");
    assert_eq!(app.gateway.all_stats().await["capture_requests"], 1);
}
