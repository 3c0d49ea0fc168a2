//! The real binary aborts at each crash point (as with `kill -9`). Either the client retries with
//! the same key against a restarted process, or nobody does and the restarted process's completer
//! finishes the request by itself. Either way the gateway, a process of its own that outlives the
//! crash, holds exactly one charge, and the client's retry ends with the one answer.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use payments::db::schema::idempotency_keys as k;
use reqwest::StatusCode;
use serde_json::Value;
use uuid::Uuid;

use crate::helpers::{GatewayControl, Process, TestDatabase, new_key, payment_body, wait_for};

/// Short enough that a crashed request's lock goes stale quickly: the shortest the service accepts
/// for this gateway timeout (three calls, 7.5 s of phase attempts, a 1 s checkout, 1 s to spare).
const LOCK_TIMEOUT_MS: &str = "11000";
const GATEWAY_TIMEOUT_MS: &str = "500";

/// A request that crashed the process at `point`, and what is left of it.
struct Crashed {
    database: TestDatabase,
    account_id: Uuid,
    api_key: String,
    gateway: Process,
    key: String,
    http: reqwest::Client,
}

impl Crashed {
    async fn at(point: &str) -> Crashed {
        let database = TestDatabase::create().await;
        let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
        let (account, api_key) = payments::accounts::create(&mut conn, "crash").await.unwrap();
        let gateway = Process::gateway().await;
        let env = [
            ("PAYMENTS_FAULT_INJECTION", "1"),
            ("PAYMENTS_GATEWAY_TIMEOUT_MS", GATEWAY_TIMEOUT_MS),
            ("PAYMENTS_LOCK_TIMEOUT_MS", LOCK_TIMEOUT_MS),
        ];
        let mut doomed = Process::serve(&database.url, &gateway.url, &["--no-workers"], &env).await;
        let crashed = Crashed {
            database,
            account_id: account.id,
            api_key,
            gateway,
            key: new_key(),
            http: reqwest::Client::new(),
        };
        let answer = crashed.post(&doomed.url, Some(point)).await;
        assert!(answer.is_err(), "the connection dies with the process");
        let status = doomed.exited().await;
        assert_eq!(status.signal(), Some(nix::sys::signal::Signal::SIGABRT as i32), "aborted, no clean-up");
        crashed
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
        request.json(&payment_body()).send().await
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

    /// Exactly one charge at the gateway, for this key, and it is the payment's.
    async fn assert_charged_once(&self, payment: &Value) {
        let control = GatewayControl::new(&self.gateway.url);
        assert_eq!(control.stats().await.charges, 1, "exactly one charge across the crash");
        let mut conn = AsyncPgConnection::establish(&self.database.url).await.unwrap();
        let key_id: Uuid = k::table
            .filter(k::account_id.eq(self.account_id).and(k::idempotency_key.eq(&self.key)))
            .select(k::id)
            .get_result(&mut conn)
            .await
            .unwrap();
        let charges = control.charges_for(&payments::gateway::downstream_key(self.account_id, key_id)).await;
        assert_eq!(charges.len(), 1);
        assert_eq!(payment["gateway_charge_id"], charges[0]["id"]);
    }
}

/// The client retries until the crashed request's lock is stale, and gets the one payment.
async fn recovered_by_the_clients_retry(point: &str) {
    let crashed = Crashed::at(point).await;
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
    crashed.assert_charged_once(&payment).await;
    let replay = crashed.post(&restarted.url, None).await.unwrap();
    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
}

/// Nobody retries: the restarted service's completer finishes the request once its lock is stale,
/// and the client's much later retry gets the stored answer.
async fn finished_by_the_completer(point: &str) {
    let crashed = Crashed::at(point).await;
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
    crashed.assert_charged_once(&retry.json().await.unwrap()).await;
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
    recovered_by_the_clients_retry("after_charge_created").await;
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
    finished_by_the_completer("after_charge_created").await;
}
