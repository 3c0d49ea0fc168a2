//! The real binary aborts at each crash point (as with `kill -9`), is started again, and the
//! client's retry with the same key finishes the payment; the gateway, a process of its own that
//! outlives the crash, holds exactly one charge for it.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{GatewayControl, Process, TestDatabase, new_key, payment_body, wait_for};

/// Short enough that the restarted process takes the crashed request's lock over quickly, and
/// longer than the gateway timeout, so a live request is never taken for dead.
const LOCK_TIMEOUT_MS: &str = "1500";
const GATEWAY_TIMEOUT_MS: &str = "500";

async fn crash_and_recover(point: &str) {
    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let (account, api_key) = payments::accounts::create(&mut conn, "crash").await.unwrap();
    let gateway = Process::gateway().await;
    let control = GatewayControl::new(&gateway.url);
    let env = [("PAYMENTS_LOCK_TIMEOUT_MS", LOCK_TIMEOUT_MS), ("PAYMENTS_GATEWAY_TIMEOUT_MS", GATEWAY_TIMEOUT_MS)];
    let http = reqwest::Client::new();
    let key = new_key();
    let post = |url: String, crash: Option<&str>| {
        let mut request = http.post(format!("{url}/v1/payments")).bearer_auth(&api_key).header("Idempotency-Key", &key);
        if let Some(point) = crash {
            request = request.header("X-Fault-Inject", format!("crash={point}"));
        }
        request.json(&payment_body()).send()
    };

    let mut doomed =
        Process::serve(&database.url, &gateway.url, &[env[0], env[1], ("PAYMENTS_FAULT_INJECTION", "1")]).await;
    let crashed = post(doomed.url.clone(), Some(point)).await;
    assert!(crashed.is_err(), "the connection dies with the process");
    let status = doomed.exited().await;
    assert_eq!(status.signal(), Some(nix::sys::signal::Signal::SIGABRT as i32), "aborted, no clean-up");

    let restarted = Process::serve(&database.url, &gateway.url, &env).await;
    // Until the crashed request's lock goes stale, the key is (correctly) in flight.
    let (status, payment) = wait_for(Duration::from_secs(20), "the retry gets past the stale lock", || async {
        let response = post(restarted.url.clone(), None).await.unwrap();
        match response.status() {
            StatusCode::CONFLICT => None,
            status => Some((status, response.json::<Value>().await.unwrap())),
        }
    })
    .await;
    assert_eq!(status, StatusCode::CREATED, "{payment}");
    assert_eq!(payment["status"], "succeeded");
    let stats = control.stats().await;
    assert_eq!(stats.charges, 1, "exactly one charge across the crash");
    let key_id = payments_key_id(&database, account.id, &key).await;
    let charges = control.charges_for(&payments::gateway::downstream_key(account.id, key_id)).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(payment["gateway_charge_id"], charges[0]["id"]);
    let replay = post(restarted.url.clone(), None).await.unwrap();
    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
}

async fn payments_key_id(database: &TestDatabase, account_id: uuid::Uuid, key: &str) -> uuid::Uuid {
    use diesel::prelude::*;
    use diesel_async::RunQueryDsl;
    use payments::db::schema::idempotency_keys as k;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    k::table
        .filter(k::account_id.eq(account_id))
        .filter(k::idempotency_key.eq(key))
        .select(k::id)
        .get_result(&mut conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_crash_after_started_is_recovered_with_one_charge() {
    crash_and_recover("after_started").await;
}

#[tokio::test]
async fn a_crash_after_the_charge_is_recovered_with_one_charge() {
    crash_and_recover("after_charge").await;
}

#[tokio::test]
async fn a_crash_after_charge_created_is_recovered_with_one_charge() {
    crash_and_recover("after_charge_created").await;
}
