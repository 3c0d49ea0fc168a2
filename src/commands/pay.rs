//! `payments pay`, and `payments capture` and `cancel` of a payment it only authorized: one request
//! through the reference client, as [`super::send`] says.

use std::process::ExitCode;

use clap::Args;
use payments_client::{NewCancel, NewCapture, NewPayment};

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
    /// Only authorize: capture it later with `payments capture`, or cancel it.
    #[arg(long)]
    pub no_capture: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: PayArgs) -> anyhow::Result<ExitCode> {
    let payment = NewPayment {
        amount: args.amount,
        currency: args.currency,
        source: args.source,
        description: args.description,
        capture: !args.no_capture,
    };
    send::run(args.client, &payment).await
}

/// `payments capture`.
#[derive(Clone, Args)]
pub struct CaptureArgs {
    /// The authorized payment, by its id.
    pub payment: uuid::Uuid,
    /// How much to capture, in the payment's minor units; all of it if not given (the rest is
    /// released).
    #[arg(long)]
    pub amount: Option<u64>,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn capture(args: CaptureArgs) -> anyhow::Result<ExitCode> {
    send::run(args.client, &NewCapture { payment: args.payment, amount: args.amount }).await
}

/// `payments cancel`.
#[derive(Clone, Args)]
pub struct CancelArgs {
    /// The authorized payment, by its id.
    pub payment: uuid::Uuid,
    /// Why it is cancelled.
    #[arg(long, value_parser = ["duplicate", "fraudulent", "requested_by_customer", "abandoned"])]
    pub reason: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn cancel(args: CancelArgs) -> anyhow::Result<ExitCode> {
    send::run(args.client, &NewCancel { payment: args.payment, reason: args.reason }).await
}
