//! `payments gateway`: the mock gateway as a process of its own, which outlives crashes of
//! `serve` (so that tests can count its charges across them).

use std::net::TcpListener;

use anyhow::Context;

use crate::config::GatewayArgs;
use crate::gateway::mock::{Controls, FaultPlan, MockGateway};
use crate::startup::shutdown_signal;

pub async fn run(args: GatewayArgs) -> anyhow::Result<()> {
    let listener = TcpListener::bind(&args.bind).with_context(|| format!("cannot listen on {}", args.bind))?;
    let faults = args.fault_rate.map(FaultPlan::random).unwrap_or_else(FaultPlan::none);
    let stop_requested = shutdown_signal()?;
    let controls = if args.control { Controls::Served } else { Controls::Hidden };
    let gateway = MockGateway::start(listener, faults, controls)?;
    println!("payments gateway listening on {}", gateway.url());
    let signal = stop_requested.await;
    tracing::info!(signal, "stopping the gateway");
    gateway.stop().await;
    Ok(())
}
