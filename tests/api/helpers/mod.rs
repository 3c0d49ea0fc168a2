//! What the tests share: the database, the app, the gateway, processes, and waiting.

mod cluster;
mod db_proxy;
mod gateway;
mod process;
mod seed;
mod statements;
mod test_app;

use std::future::Future;
use std::time::Duration;

pub use cluster::TestDatabase;
pub use db_proxy::DbProxy;
pub use gateway::{ChargePerKey, GatewayControl, GatewayStats, mount_no_charges_found};
pub use process::Process;
pub use seed::Lock;
pub use statements::{record_statements, statements};
pub use test_app::{TestApp, new_key, payment_body};

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
