//! `payments listen`: the reference receiver of a merchant's webhooks (`payments_client::listen`),
//! printing each event it verified (`<type> <id>`) on stdout and each delivery it refused on
//! stderr.

use std::net::TcpListener;

use anyhow::Context;
use clap::Args;
use tokio::sync::mpsc;

use payments_client::listen::{Heard, Receiver};
use payments_service::startup::shutdown_signal;
use payments_wire::standard_webhooks::SigningSecret;

/// What it prints once it listens, then its URL.
pub const LISTENING_ON: &str = "payments listen: on";

#[derive(Args)]
pub struct ListenArgs {
    /// Address to listen on (port 0 picks a free one, printed).
    #[arg(long, default_value = "127.0.0.1:8070")]
    pub bind: String,
    /// The endpoint's secret, `whsec_...`, as its creation answered it. Given twice (the new one
    /// and the old), a delivery signed under either verifies, as during a rotation.
    #[arg(long = "secret", required = true)]
    pub secrets: Vec<String>,
}

pub async fn run(args: ListenArgs) -> anyhow::Result<()> {
    let secrets = args
        .secrets
        .iter()
        .map(|secret| {
            SigningSecret::parse(secret).context("--secret takes the `whsec_...` an endpoint's creation answered")
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let listener = TcpListener::bind(&args.bind).with_context(|| format!("cannot listen on {}", args.bind))?;
    let (heard, mut hearing) = mpsc::unbounded_channel();
    let receiver = Receiver::start(listener, secrets, heard)?;
    println!("{LISTENING_ON} {}", receiver.url);
    let stop_requested = shutdown_signal()?;
    tokio::pin!(stop_requested);
    loop {
        tokio::select! {
            _ = &mut stop_requested => break,
            Some(heard) = hearing.recv() => match heard {
                Heard::Event { kind, id } => println!("{kind} {id}"),
                Heard::Refused(why) => eprintln!("refused a delivery: {why}"),
                Heard::Unreadable => eprintln!("refused a delivery: its body is larger than an event's, or broke off"),
            },
        }
    }
    receiver.stop().await;
    Ok(())
}
