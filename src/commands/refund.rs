//! `payments refund`: one refund through the reference client, as [`super::send`] says.

use std::process::ExitCode;

use clap::Args;
use payments_client::NewRefund;

use super::send::{self, ClientArgs};

/// `payments refund`.
#[derive(Clone, Args)]
pub struct RefundArgs {
    /// The payment to refund, by its id.
    #[arg(long)]
    pub payment: String,
    /// The amount to refund, in the payment's minor units; all it has left if not given.
    #[arg(long)]
    pub amount: Option<u64>,
    /// Why it is refunded.
    #[arg(long, value_parser = ["duplicate", "fraudulent", "requested_by_customer"])]
    pub reason: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: RefundArgs) -> anyhow::Result<ExitCode> {
    let refund = NewRefund { payment: args.payment, amount: args.amount, reason: args.reason };
    send::run(args.client, &refund).await
}
