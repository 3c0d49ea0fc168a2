//! `payments gateway`: the mock gateway as a process of its own, which outlives crashes of
//! `serve` (so that tests can count its charges across them), and sends its events wherever it
//! is told.

use std::net::TcpListener;

use anyhow::Context;

use payments_mock_gateway::{Controls, FaultPlan, MockGateway, Webhook};
use payments_service::config::{GatewayArgs, webhook_secrets};
use payments_service::startup::shutdown_signal;

pub async fn run(args: GatewayArgs) -> anyhow::Result<()> {
    let webhook = webhook(&args)?;
    let listener = TcpListener::bind(&args.bind).with_context(|| format!("cannot listen on {}", args.bind))?;
    let faults = args.fault_rate.map(FaultPlan::random).unwrap_or_else(FaultPlan::none);
    let stop_requested = shutdown_signal()?;
    let controls = if args.control { Controls::Served } else { Controls::Hidden };
    let gateway = match webhook {
        Some(webhook) => {
            println!("events: to {}, each signed under {}", webhook.shown_url(), secrets(webhook.secrets()));
            MockGateway::start_with_events(listener, faults, controls, webhook)?
        }
        None => MockGateway::start(listener, faults, controls)?,
    };
    println!("payments gateway listening on {}", gateway.url());
    let signal = stop_requested.await;
    tracing::info!(signal, "stopping the gateway");
    gateway.stop().await;
    Ok(())
}

/// Where the events go, if anywhere: an events URL needs a secret, or every event would be
/// refused.
fn webhook(args: &GatewayArgs) -> anyhow::Result<Option<Webhook>> {
    let secrets = webhook_secrets(&args.webhook_secrets);
    match &args.events_url {
        None => Ok(None),
        Some(_) if secrets.is_empty() => anyhow::bail!(
            "--events-url needs a secret to sign the events with: --webhook-secret SECRET (or \
             PAYMENTS_GATEWAY_WEBHOOK_SECRETS), the one the receiving service has in PAYMENTS_GATEWAY_WEBHOOK_SECRETS"
        ),
        Some(url) => Ok(Some(Webhook::new(url.clone(), secrets))),
    }
}

/// "1 secret", "2 secrets".
fn secrets(count: usize) -> String {
    match count {
        1 => "1 secret".into(),
        n => format!("{n} secrets"),
    }
}
