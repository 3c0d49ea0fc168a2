//! `payments worker`: the background workers alone, with no HTTP. Any number may run beside any
//! number of `serve` processes on one database.

use std::sync::Arc;

use payments_service::config::WorkerCommandArgs;
use payments_service::db;
use payments_service::gateway::GatewayClient;
use payments_service::postgres::embedded::Sharing;
use payments_service::startup::{WORKER_RUNNING, exit_on_second_signal, shutdown_signal};
use payments_service::state::AppState;
use payments_service::workers::Workers;
use tokio::sync::watch;

use super::{
    MetricsListener, advertised_gateway, open_database, refuse_a_role_that_cannot_write, routing,
    warn_if_events_are_only_logged,
};

/// A worker drives one request at a time per worker kind: a few connections are plenty, and one
/// more listens for wake-ups.
const POOL_SIZE: u32 = 5;

pub async fn run(args: WorkerCommandArgs) -> anyhow::Result<()> {
    let settings = args.protocol.settings()?;
    let stop_requested = shutdown_signal()?;
    // Unset, the worker serves no metrics: it has no usual address, so that any number of workers
    // start on one machine.
    let metrics = args.metrics_bind.as_deref().map(MetricsListener::at).transpose()?;
    let (database_url, embedded) = open_database(&args.database, Sharing::JoinRunning).await?;
    let gateway_url = match (args.gateway_url, &embedded) {
        (Some(url), _) => url,
        // Beside an embedded `serve`, the gateway is the one it charges through.
        (None, Some(_)) => advertised_gateway(&args.database.data_dir)?,
        (None, None) => anyhow::bail!(
            "GATEWAY_URL is required with DATABASE_URL: the completer must reconcile with, and charge through, \
             the gateway the serve processes use; set it to that gateway's base URL"
        ),
    };
    if embedded.is_none() {
        refuse_a_role_that_cannot_write(&database_url).await?;
        warn_if_events_are_only_logged(&args.workers.settings());
    }
    let state = Arc::new(AppState::new(
        db::pool(&database_url, POOL_SIZE),
        routing(&args.database, &database_url, POOL_SIZE),
        GatewayClient::new(&gateway_url, settings.gateway_timeout)?,
        settings,
    ));
    let metrics = metrics.map(|listener| listener.serve(state.clone())).transpose()?;
    let (stop, stopped) = watch::channel(false);
    let mut running = tokio::spawn(Workers::new(state, &args.workers.settings())?.run(stopped));
    println!(
        "{WORKER_RUNNING} (completer, reaper, outbox, webhooks, settler, lapser, analyzer; gateway {gateway_url})"
    );

    tokio::select! {
        signal = stop_requested => tracing::info!(signal, "stopping: workers finish what they are on"),
        result = &mut running => tracing::error!(?result, "the workers stopped by themselves"),
    }
    exit_on_second_signal()?;
    let _ = stop.send(true);
    let _ = running.await;
    if let Some(metrics) = metrics {
        metrics.stop().await;
    }
    if let Some(embedded) = embedded {
        embedded.stop().await?;
    }
    Ok(())
}
