//! What the gateway did meanwhile is what the payment records. A request's answer is lost (the
//! process aborts right after the gateway authorized), and before the key is taken up again the
//! gateway acts on its own, as its dashboard, another system or its own lapse of an authorization
//! would (the mock gateway's own capture and cancel stand for them). The retry, or the completer,
//! looks the charge up and records where it stands: captured (in whole or in part) or cancelled,
//! with the event that says so, and the key finished. And a gateway that ignores `capture`
//! (charging what was to be authorized, or authorizing what was to be charged) is recorded as
//! what it did, never as what was asked.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::crash_recovery::{Doomed, GATEWAY_TIMEOUT_MS, LOCK_TIMEOUT_MS};
use crate::helpers::{
    GatewayControl, Process, TestApp, TestDatabase, mount_no_charges_found, new_key, wait_for, wait_until,
};

fn authorization(amount: i64) -> Value {
    json!({ "amount": amount, "currency": "usd", "source": "tok_visa", "capture": false })
}

/// An authorization whose answer was lost: the process aborted right after the gateway
/// authorized it, leaving the key at `started`, its payment pending.
struct Lost {
    database: TestDatabase,
    account_id: Uuid,
    api_key: String,
    gateway: Process,
    control: GatewayControl,
    key: String,
    http: reqwest::Client,
}

impl Lost {
    async fn authorization() -> Lost {
        let database = TestDatabase::create().await;
        let Doomed { account_id, api_key, gateway, mut doomed } = Doomed::start(&database, "lost").await;
        let control = GatewayControl::new(&gateway.url);
        let lost =
            Lost { database, account_id, api_key, gateway, control, key: new_key(), http: reqwest::Client::new() };
        let answer = lost.post(&doomed.url, Some("after_charge")).await;
        assert!(answer.is_err(), "the connection dies with the process");
        let status = doomed.exited().await;
        assert_eq!(status.signal(), Some(nix::sys::signal::Signal::SIGABRT as i32), "aborted, no clean-up");
        assert_eq!(lost.charges().await.len(), 1, "the gateway authorized before the process died");
        lost
    }

    async fn post(&self, url: &str, crash: Option<&str>) -> reqwest::Result<reqwest::Response> {
        let mut request = self
            .http
            .post(format!("{url}/v1/payments"))
            .bearer_auth(&self.api_key)
            .header("Idempotency-Key", &self.key);
        if let Some(point) = crash {
            request = request.header("X-Fault-Inject", format!("crash={point}"));
        }
        request.json(&authorization(1000)).send().await
    }

    /// The charges the gateway holds under this key's downstream key.
    async fn charges(&self) -> Vec<Value> {
        let key_id: Uuid =
            self.value(&format!("SELECT id FROM idempotency_keys WHERE idempotency_key = '{}'", self.key)).await;
        self.control.charges_for(&payments_service::gateway::downstream_key(self.account_id, key_id)).await
    }

    /// The authorization, as the gateway holds it now.
    async fn charge_id(&self) -> String {
        self.charges().await[0]["id"].as_str().unwrap().to_owned()
    }

    /// The service, started again on the same database and gateway.
    async fn restart(&self, args: &[&str]) -> Process {
        let env = [
            ("PAYMENTS_GATEWAY_TIMEOUT_MS", GATEWAY_TIMEOUT_MS),
            ("PAYMENTS_LOCK_TIMEOUT_MS", LOCK_TIMEOUT_MS),
            ("PAYMENTS_WORKER_INTERVAL_MS", "100"),
            ("PAYMENTS_COMPLETER_BACKOFF_MS", "0"),
        ];
        Process::serve(&self.database.url, &self.gateway.url, args, &env).await
    }

    /// The client's retry, once the crashed request's lock is stale: its status and body.
    async fn retry(&self, service: &Process) -> (StatusCode, Value) {
        wait_for(Duration::from_secs(30), "the retry gets past the stale lock", || async {
            let response = self.post(&service.url, None).await.unwrap();
            match response.status() {
                StatusCode::CONFLICT => None,
                status => Some((status, response.json::<Value>().await.unwrap())),
            }
        })
        .await
    }

    async fn says(&self, condition: &str) -> bool {
        let mut conn = AsyncPgConnection::establish(&self.database.url).await.unwrap();
        TestApp::database_says_on(&mut conn, condition).await
    }

    /// The one value `sql` selects, as JSON.
    async fn value<T: serde::de::DeserializeOwned>(&self, sql: &str) -> T {
        #[derive(QueryableByName)]
        struct Selected {
            #[diesel(sql_type = diesel::sql_types::Jsonb)]
            value: Value,
        }
        let mut conn = AsyncPgConnection::establish(&self.database.url).await.unwrap();
        let sql = format!("SELECT to_jsonb(({sql})) AS value");
        let selected = diesel::sql_query(&sql).get_result::<Selected>(&mut conn).await;
        serde_json::from_value(selected.unwrap_or_else(|e| panic!("{sql}: {e}")).value).unwrap()
    }

    /// The events staged for the payment, by type, in order.
    async fn events(&self, payment_id: &str) -> Vec<String> {
        self.value(&format!(
            "SELECT coalesce(jsonb_agg(event_type ORDER BY id), '[]') FROM events \
             WHERE body -> 'data' -> 'object' ->> 'id' = '{payment_id}'"
        ))
        .await
    }
}

#[tokio::test]
async fn an_authorization_captured_at_the_gateway_while_its_answer_was_lost_is_recorded_captured() {
    let lost = Lost::authorization().await;
    // Someone captures 600 of the 1000 at the gateway's dashboard meanwhile.
    lost.control.capture_charge(&lost.charge_id().await, 600).await;

    let service = lost.restart(&["--no-workers"]).await;
    let (status, payment) = lost.retry(&service).await;

    assert_eq!(status, StatusCode::CREATED, "{payment}");
    assert_eq!(payment["status"], "succeeded", "{payment}");
    assert_eq!((&payment["amount_captured"], &payment["amount_capturable"]), (&json!(600), &json!(0)));
    assert_eq!(payment["capture_method"], "manual");
    let id = payment["id"].as_str().unwrap();
    assert_eq!(lost.events(id).await, ["payment.captured"], "the event says what was recorded");
    assert!(!lost.says(&format!("EXISTS (SELECT FROM open_authorizations WHERE payment_id = '{id}')")).await);

    // What the gateway holds can be refunded, and no more.
    let refund = |amount: i64| {
        lost.http
            .post(format!("{}/v1/refunds", service.url))
            .bearer_auth(&lost.api_key)
            .header("Idempotency-Key", new_key())
            .json(&json!({ "payment": id, "amount": amount }))
            .send()
    };
    let beyond = refund(601).await.unwrap();
    assert_eq!(beyond.status(), StatusCode::BAD_REQUEST);
    let beyond: Value = beyond.json().await.unwrap();
    assert_eq!(beyond["type"], "https://payments.example/problems/refund-exceeds-payment", "{beyond}");
    assert_eq!(refund(600).await.unwrap().status(), StatusCode::CREATED);
}

#[tokio::test]
async fn an_authorization_cancelled_at_the_gateway_while_its_answer_was_lost_ends_cancelled_for_the_retry() {
    let lost = Lost::authorization().await;
    lost.control.cancel_charge(&lost.charge_id().await).await;

    let service = lost.restart(&["--no-workers"]).await;
    let (status, payment) = lost.retry(&service).await;

    assert_eq!(status, StatusCode::CREATED, "{payment}");
    assert_eq!(payment["status"], "canceled", "{payment}");
    assert!(payment["canceled_at"].is_string(), "{payment}");
    assert_eq!((&payment["amount_captured"], &payment["amount_capturable"]), (&json!(0), &json!(0)));
    assert_eq!(lost.events(payment["id"].as_str().unwrap()).await, ["payment.canceled"]);
    // Finished: the next retry is the stored answer.
    let replay = lost.post(&service.url, None).await.unwrap();
    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
    assert_eq!(replay.json::<Value>().await.unwrap(), payment);
}

#[tokio::test]
async fn an_authorization_cancelled_at_the_gateway_while_its_answer_was_lost_is_finished_by_the_completer() {
    let lost = Lost::authorization().await;
    lost.control.cancel_charge(&lost.charge_id().await).await;

    let service = lost.restart(&[]).await;
    let finished =
        format!("(SELECT recovery_point = 'finished' FROM idempotency_keys WHERE idempotency_key = '{}')", lost.key);
    wait_until(Duration::from_secs(40), "the completer finishes the key", || lost.says(&finished)).await;

    let (status, payment) = lost.retry(&service).await;
    assert_eq!((status, &payment["status"]), (StatusCode::CREATED, &json!("canceled")), "{payment}");
    assert!(
        !lost.says("EXISTS (SELECT FROM idempotency_keys WHERE needs_attention_at IS NOT NULL)").await,
        "nothing for a person"
    );
}

/// A wiremock gateway that answers every charge request with `charge` (a look-up finds nothing).
async fn gateway_answering(charge: Value) -> MockServer {
    let gateway = MockServer::start().await;
    mount_no_charges_found(&gateway).await;
    let answer = ResponseTemplate::new(200).set_body_json(charge);
    Mock::given(method("POST")).and(path("/v1/charges")).respond_with(answer).mount(&gateway).await;
    gateway
}

#[tokio::test]
async fn an_authorization_the_gateway_captured_at_once_is_recorded_captured() {
    let charge = json!({ "id": "ch_at_once", "status": "succeeded", "amount": 1000, "amount_captured": 1000 });
    let gateway = gateway_answering(charge).await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;

    let response = app.post_payment(&new_key(), &authorization(1000)).await;

    assert_eq!(response.status(), StatusCode::CREATED);
    let payment: Value = response.json().await.unwrap();
    assert_eq!(payment["status"], "succeeded", "{payment}");
    assert_eq!((&payment["amount_captured"], &payment["capture_method"]), (&json!(1000), &json!("manual")));
    let id = payment["id"].as_str().unwrap();
    let staged = format!(
        "(SELECT array_agg(event_type) = '{{payment.captured}}' FROM events WHERE body -> 'data' -> 'object' ->> 'id' = '{id}')"
    );
    assert!(app.database_says(&staged).await, "its event: payment.captured");
}

#[tokio::test]
async fn a_charge_the_gateway_only_authorized_is_recorded_as_the_authorization_it_is() {
    let charge = json!({ "id": "ch_held", "status": "requires_capture", "amount": 1000, "amount_captured": 0 });
    let gateway = gateway_answering(charge).await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
    let at_once = json!({ "amount": 1000, "currency": "usd", "source": "tok_visa" });

    let response = app.post_payment(&new_key(), &at_once).await;

    assert_eq!(response.status(), StatusCode::CREATED);
    let payment: Value = response.json().await.unwrap();
    assert_eq!(payment["status"], "requires_capture", "{payment}");
    assert_eq!((&payment["amount_captured"], &payment["amount_capturable"]), (&json!(0), &json!(1000)));
    assert_eq!(payment["capture_method"], "manual", "held, to be captured or released");
    assert!(payment["capture_before"].is_string(), "it lapses, so the money is not held for ever");
    let id = payment["id"].as_str().unwrap();
    assert!(app.database_says(&format!("EXISTS (SELECT FROM open_authorizations WHERE payment_id = '{id}')")).await);
    let staged = format!(
        "(SELECT array_agg(event_type) = '{{payment.authorized}}' FROM events WHERE body -> 'data' -> 'object' ->> 'id' = '{id}')"
    );
    assert!(app.database_says(&staged).await, "its event: payment.authorized");
}

#[tokio::test]
async fn a_charge_shown_succeeded_but_not_captured_is_an_authorization() {
    // Stripe's charges show an authorization not captured yet so.
    let charge = json!({ "id": "ch_uncaptured", "status": "succeeded", "captured": false, "amount": 1000,
                         "amount_captured": 0 });
    let gateway = gateway_answering(charge).await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;

    let response = app.post_payment(&new_key(), &authorization(1000)).await;

    assert_eq!(response.status(), StatusCode::CREATED);
    let payment: Value = response.json().await.unwrap();
    assert_eq!(payment["status"], "requires_capture", "{payment}");
    assert_eq!((&payment["amount_captured"], &payment["amount_capturable"]), (&json!(0), &json!(1000)));
}

#[tokio::test]
async fn an_authorizations_bare_answer_that_says_not_whether_it_captured_records_nothing() {
    let gateway = gateway_answering(json!({ "id": "ch_unclear" })).await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
    let key = new_key();

    let response = app.post_payment(&key, &authorization(1000)).await;

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "not known: the retry looks it up");
    let row = app.key_row(&key).await.unwrap();
    assert_eq!(row.recovery_point, "started");
    assert!(app.database_says("(SELECT status = 'pending' FROM payments)").await);
}
