//! What the tests share: the database, the app, the gateway, processes, and waiting.

mod citus;
mod client_run;
mod cluster;
mod db_proxy;
mod gateway;
mod metrics;
mod plans;
mod process;
mod seed;
mod shards;
mod statements;
mod svg;
mod test_app;
mod transaction;

use std::future::Future;
use std::time::Duration;

pub use citus::CitusDatabase;
pub use client_run::ClientRun;
pub use cluster::TestDatabase;
pub use db_proxy::DbProxy;
pub use gateway::{
    ChargePerKey, ChargesOnlyProxy, GatewayControl, GatewayStats, HeldProxy, charge_requests, listed_charge,
    mount_no_charges_found,
};
pub use metrics::Scrape;
pub use plans::{explain, plan_nodes, sql_of};
pub use process::Process;
pub use seed::{KeyRowId, Lock, TestWrites, audited_phase};
pub use shards::{database_with_shards_stand_in, delegated, unmarked};
pub use statements::{record_statements, statements};
pub use svg::Svg;
pub use test_app::{TestApp, new_key, payment_body};
pub use transaction::OpenTransaction;

/// Sends the same payment request to each of `servers` (base URLs) at once, and returns every
/// answer's status and whether it was a replay.
pub async fn post_all_at_once(servers: &[String], api_key: &str, key: &str) -> Vec<(reqwest::StatusCode, bool)> {
    let mut requests = tokio::task::JoinSet::new();
    for server in servers {
        let (url, api_key, key) = (format!("{server}/v1/payments"), api_key.to_owned(), key.to_owned());
        requests.spawn(async move {
            let response = reqwest::Client::new()
                .post(url)
                .bearer_auth(api_key)
                .header("Idempotency-Key", key)
                .json(&payment_body())
                .send()
                .await
                .unwrap();
            (response.status(), response.headers().contains_key("Idempotent-Replayed"))
        });
    }
    requests.join_all().await
}

/// Polls `check` until it yields a value (every 20 ms, for at most `within`): tests wait for
/// what they need to be true, never for a fixed time.
pub async fn wait_for<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `condition` until it holds (see [`wait_for`]).
pub async fn wait_until<F, Fut>(within: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for(within, what, || {
        let holds = condition();
        async move { holds.await.then_some(()) }
    })
    .await
}
