//! `payments pay`: one payment through the reference client, as [`super::send`] says.

use std::process::ExitCode;

use clap::Args;
use payments_client::NewPayment;

use super::send::{self, ClientArgs};

/// `payments pay`.
#[derive(Clone, Args)]
pub struct PayArgs {
    /// The amount, in minor units (cents).
    #[arg(long)]
    pub amount: u64,
    /// ISO 4217 currency code, such as `usd`.
    #[arg(long)]
    pub currency: String,
    /// The payment method's token: `tok_visa` is charged, `tok_chargeDeclined` declined.
    #[arg(long)]
    pub source: String,
    #[arg(long)]
    pub description: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: PayArgs) -> anyhow::Result<ExitCode> {
    let payment =
        NewPayment { amount: args.amount, currency: args.currency, source: args.source, description: args.description };
    send::run(args.client, &payment).await
}
