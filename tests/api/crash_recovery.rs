//! The real binary aborts at each crash point (as with `kill -9`), of a payment's phases and of a
//! refund's. Either the client retries with the same key against a restarted process, or nobody
//! does and the restarted process's completer finishes the request by itself. Either way the
//! gateway, a process of its own that outlives the crash, holds exactly one charge (one refund),
//! and the client's retry ends with the one answer.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use payments_service::db::schema::idempotency_keys as k;
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{GatewayControl, Process, TestApp, TestDatabase, new_key, payment_body, wait_for};

/// Short enough that a crashed request's lock goes stale quickly: the shortest the service accepts
/// for this gateway timeout (three calls, 7.5 s of phase attempts, a 1 s checkout, 1 s to spare).
pub const LOCK_TIMEOUT_MS: &str = "11000";
pub const GATEWAY_TIMEOUT_MS: &str = "500";

/// An account of its own on a database, a gateway process, and a `serve` (no workers) whose
/// requests abort it at the crash point they name, with a lock short enough to go stale soon.
pub struct Doomed {
    pub account_id: Uuid,
    pub api_key: String,
    pub gateway: Process,
    pub doomed: Process,
}

impl Doomed {
    pub async fn start(database: &TestDatabase, account: &str) -> Doomed {
        let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
        let (account, api_key) = payments_service::accounts::create(&mut conn, account).await.unwrap();
        let gateway = Process::gateway().await;
        let env = [
            ("PAYMENTS_FAULT_INJECTION", "1"),
            ("PAYMENTS_GATEWAY_TIMEOUT_MS", GATEWAY_TIMEOUT_MS),
            ("PAYMENTS_LOCK_TIMEOUT_MS", LOCK_TIMEOUT_MS),
        ];
        let doomed = Process::serve(&database.url, &gateway.url, &["--no-workers"], &env).await;
        Doomed { account_id: account.id, api_key, gateway, doomed }
    }
}

/// A request that crashed the process at `point`, and what is left of it.
pub struct Crashed {
    database: TestDatabase,
    account_id: Uuid,
    api_key: String,
    gateway: Process,
    key: String,
    http: reqwest::Client,
    /// `/v1/payments`, or `/v1/refunds`.
    path: &'static str,
    body: Value,
    /// Charges made before the crashing request: the payment made just before it, if any.
    charged_before: u64,
}

impl Crashed {
    /// A payment that crashed the process at `point`: its first, so the claim ran alone and
    /// `started` after it (the process had not heard from its gateway yet).
    async fn at(point: &str) -> Crashed {
        Crashed::of("/v1/payments", point, false).await
    }

    /// A payment that crashed the process at `point` after another payment: its claim ran
    /// `started` in its statement.
    async fn at_after_a_payment(point: &str) -> Crashed {
        Crashed::of("/v1/payments", point, true).await
    }

    /// A payment whose first run crashed the process after its charge, and whose retry, taking it
    /// up, crashed the process again at `point`.
    async fn resumed_at(point: &str) -> Crashed {
        Crashed::resumed_in(TestDatabase::create().await, "/v1/payments", "after_charge", point).await
    }

    /// A request to `path` whose first run crashed the process after its gateway call (`after`),
    /// and whose retry, taking it up, crashed the process again at `point`: a run that made its
    /// payment or refund records the answer with the key's finish, so a key stops at
    /// `charge_created` or `refund_created` only on such a run.
    pub async fn resumed_in(database: TestDatabase, path: &'static str, after: &str, point: &str) -> Crashed {
        let crashed = Crashed::of_in(database, path, after, false).await;
        let env = [
            ("PAYMENTS_FAULT_INJECTION", "1"),
            ("PAYMENTS_GATEWAY_TIMEOUT_MS", GATEWAY_TIMEOUT_MS),
            ("PAYMENTS_LOCK_TIMEOUT_MS", LOCK_TIMEOUT_MS),
        ];
        let mut doomed = Process::serve(&crashed.database.url, &crashed.gateway.url, &["--no-workers"], &env).await;
        wait_for(Duration::from_secs(30), "the retry gets past the stale lock, and crashes", || async {
            match crashed.post(&doomed.url, Some(point)).await {
                Ok(response) if response.status() == StatusCode::CONFLICT => None,
                Ok(response) => panic!("the retry was answered {}", response.status()),
                Err(_) => Some(()),
            }
        })
        .await;
        let status = doomed.exited().await;
        assert_eq!(status.signal(), Some(nix::sys::signal::Signal::SIGABRT as i32), "aborted, no clean-up");
        assert_eq!(crashed.recovery_point().await, point.trim_start_matches("after_"));
        crashed
    }

    /// A request to `path` that crashed the process at `point`, after a payment made just before on
    /// the same process if `after_a_payment` (a refund's is always of such a payment).
    async fn of(path: &'static str, point: &str, after_a_payment: bool) -> Crashed {
        Crashed::of_in(TestDatabase::create().await, path, point, after_a_payment).await
    }

    /// [`Crashed::of`], on `database` (migrated).
    pub async fn of_in(database: TestDatabase, path: &'static str, point: &str, after_a_payment: bool) -> Crashed {
        let Doomed { account_id, api_key, gateway, mut doomed } = Doomed::start(&database, "crash").await;
        let mut crashed = Crashed {
            database,
            account_id,
            api_key,
            gateway,
            key: new_key(),
            http: reqwest::Client::new(),
            path: "/v1/payments",
            body: payment_body(),
            charged_before: 0,
        };
        if path == "/v1/refunds" || after_a_payment {
            let paid = crashed.post(&doomed.url, None).await.unwrap();
            let payment: Value = paid.json().await.unwrap();
            crashed.key = new_key();
            crashed.charged_before = 1;
            if path == "/v1/refunds" {
                crashed.path = path;
                crashed.body = json!({ "payment": payment["id"], "amount": 400 });
            }
        }
        let answer = crashed.post(&doomed.url, Some(point)).await;
        assert!(answer.is_err(), "the connection dies with the process");
        let status = doomed.exited().await;
        assert_eq!(status.signal(), Some(nix::sys::signal::Signal::SIGABRT as i32), "aborted, no clean-up");
        crashed
    }

    async fn post(&self, url: &str, crash: Option<&str>) -> reqwest::Result<reqwest::Response> {
        let mut request = self
            .http
            .post(format!("{url}{}", self.path))
            .bearer_auth(&self.api_key)
            .header("Idempotency-Key", &self.key);
        if let Some(point) = crash {
            request = request.header("X-Fault-Inject", format!("crash={point}"));
        }
        request.json(&self.body).send().await
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

    async fn recovery_point(&self) -> String {
        let mut conn = AsyncPgConnection::establish(&self.database.url).await.unwrap();
        k::table
            .filter(k::account_id.eq(self.account_id).and(k::idempotency_key.eq(&self.key)))
            .select(k::recovery_point)
            .get_result(&mut conn)
            .await
            .unwrap()
    }

    /// Exactly one charge (or refund) at the gateway, for this key, and it is the payment's (the
    /// refund's).
    async fn assert_done_once(&self, answer: &Value) {
        let control = GatewayControl::new(&self.gateway.url);
        let mut conn = AsyncPgConnection::establish(&self.database.url).await.unwrap();
        let key_id: Uuid = k::table
            .filter(k::account_id.eq(self.account_id).and(k::idempotency_key.eq(&self.key)))
            .select(k::id)
            .get_result(&mut conn)
            .await
            .unwrap();
        let downstream = payments_service::gateway::downstream_key(self.account_id, key_id);
        if self.path == "/v1/refunds" {
            let stats = control.all_stats().await;
            assert_eq!((stats["charges"].as_u64(), stats["refunds"].as_u64()), (Some(1), Some(1)), "one refund");
            let refunds = control.refunds_for(&downstream).await;
            assert_eq!(refunds.len(), 1);
            assert_eq!(answer["gateway_refund_id"], refunds[0]["id"]);
            assert_eq!(answer["status"], "succeeded");
            return;
        }
        assert_eq!(control.stats().await.charges, 1 + self.charged_before, "exactly one charge across the crash");
        let charges = control.charges_for(&downstream).await;
        assert_eq!(charges.len(), 1);
        assert_eq!(answer["gateway_charge_id"], charges[0]["id"]);
    }
}

/// The client retries until the crashed request's lock is stale, and gets the one payment.
async fn recovered_by_the_clients_retry(point: &str) {
    recovered_by_the_retry(Crashed::at(point).await).await;
}

pub async fn recovered_by_the_retry(crashed: Crashed) {
    let restarted = crashed.restart(&["--no-workers"]).await;
    let (status, payment) = wait_for(Duration::from_secs(30), "the retry gets past the stale lock", || async {
        let response = crashed.post(&restarted.url, None).await.unwrap();
        match response.status() {
            StatusCode::CONFLICT => None,
            status => Some((status, response.json::<Value>().await.unwrap())),
        }
    })
    .await;

    assert_eq!(status, StatusCode::CREATED, "{payment}");
    assert_eq!(payment["status"], "succeeded");
    crashed.assert_done_once(&payment).await;
    let replay = crashed.post(&restarted.url, None).await.unwrap();
    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
}

/// Nobody retries: the restarted service's completer finishes the request once its lock is stale,
/// and the client's much later retry gets the stored answer.
async fn finished_by_the_completer(point: &str) {
    completed(Crashed::at(point).await, point).await;
}

pub async fn completed(crashed: Crashed, point: &str) {
    let crashed_at = Instant::now();
    let restarted = crashed.restart(&[]).await;
    wait_for(Duration::from_secs(30), "the completer finishes the request", || async {
        (crashed.recovery_point().await == "finished").then_some(())
    })
    .await;
    tracing::info!(elapsed = ?crashed_at.elapsed(), point, "the completer finished a crashed request");

    let retry = crashed.post(&restarted.url, None).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["Idempotent-Replayed"], "true");
    crashed.assert_done_once(&retry.json().await.unwrap()).await;
}

#[tokio::test]
async fn a_crash_after_started_is_recovered_by_the_retry_with_one_charge() {
    recovered_by_the_clients_retry("after_started").await;
}

#[tokio::test]
async fn a_crash_after_the_charge_is_recovered_by_the_retry_with_one_charge() {
    recovered_by_the_clients_retry("after_charge").await;
}

#[tokio::test]
async fn a_crash_after_charge_created_is_recovered_by_the_retry_with_one_charge() {
    recovered_by_the_retry(Crashed::resumed_at("after_charge_created").await).await;
}

/// A payment its run made records the gateway's answer with the key's finish, in one statement:
/// there is no point between the two to stop at.
#[tokio::test]
async fn a_payment_made_by_its_run_is_recorded_and_finished_at_once() {
    let database = TestDatabase::create().await;
    let Doomed { api_key, gateway, doomed, .. } = Doomed::start(&database, "at once").await;
    let http = reqwest::Client::new();
    let pay = |key: String| {
        http.post(format!("{}/v1/payments", doomed.url))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", key)
            .header("X-Fault-Inject", "crash=after_charge_created")
            .json(&payment_body())
            .send()
    };
    // The process's first payment, its claim alone, and one after it, with its claim.
    for _ in 0..2 {
        let paid = pay(new_key()).await.expect("no crash");
        assert_eq!(paid.status(), StatusCode::CREATED);
    }
    let recorded = "(SELECT count(*) = 2 FROM audit_records WHERE action = 'payment.charge_recorded')";
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    assert!(TestApp::database_says_on(&mut conn, recorded).await, "each answer recorded, in the trail as before");
    assert_eq!(GatewayControl::new(&gateway.url).stats().await.charges, 2);
}

#[tokio::test]
async fn a_crash_after_started_is_finished_by_the_completer_without_a_retry() {
    finished_by_the_completer("after_started").await;
}

#[tokio::test]
async fn a_crash_after_the_charge_is_finished_by_the_completer_without_a_retry() {
    finished_by_the_completer("after_charge").await;
}

#[tokio::test]
async fn a_crash_after_charge_created_is_finished_by_the_completer_without_a_retry() {
    completed(Crashed::resumed_at("after_charge_created").await, "after_charge_created").await;
}

#[tokio::test]
async fn a_crash_after_started_with_the_claim_is_recovered_by_the_retry_with_one_charge() {
    recovered_by_the_retry(Crashed::at_after_a_payment("after_started").await).await;
}

#[tokio::test]
async fn a_crash_after_the_charge_of_a_payment_started_with_its_claim_is_recovered_by_the_retry() {
    recovered_by_the_retry(Crashed::at_after_a_payment("after_charge").await).await;
}

#[tokio::test]
async fn a_crash_after_started_with_the_claim_is_finished_by_the_completer_without_a_retry() {
    completed(Crashed::at_after_a_payment("after_started").await, "after_started").await;
}

#[tokio::test]
async fn a_refund_crashed_after_started_is_recovered_by_the_retry_with_one_refund() {
    recovered_by_the_retry(Crashed::of("/v1/refunds", "after_started", true).await).await;
}

#[tokio::test]
async fn a_refund_crashed_after_the_gateway_refunded_is_recovered_by_the_retry_with_one_refund() {
    recovered_by_the_retry(Crashed::of("/v1/refunds", "after_refund", true).await).await;
}

#[tokio::test]
async fn a_refund_crashed_after_refund_created_is_finished_by_the_completer() {
    let database = TestDatabase::create().await;
    let crashed = Crashed::resumed_in(database, "/v1/refunds", "after_refund", "after_refund_created").await;
    completed(crashed, "after_refund_created").await;
}

#[tokio::test]
async fn a_refund_crashed_after_the_gateway_refunded_is_finished_by_the_completer() {
    completed(Crashed::of("/v1/refunds", "after_refund", true).await, "after_refund").await;
}
