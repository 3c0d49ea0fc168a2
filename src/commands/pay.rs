//! `payments pay`: one payment through the reference client ([`crate::client`]), for a person at
//! a terminal or a script. Each attempt is a line on stderr; the final answer's body goes to
//! stdout; the exit code says how it ended (see [`Ended`]).

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use reqwest::Url;

use super::parse_duration;
use crate::accounts::DEMO_API_KEY;
use crate::client::{self, Client, NewPayment, Outcome, RetryPolicy};

/// Where `payments serve` listens by default.
const DEFAULT_URL: &str = "http://127.0.0.1:8080";

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
    /// The idempotency key; a new UUIDv4 if not given. Give the key a run printed when it gave
    /// up to learn how that payment ended, or to finish it: it is never paid twice.
    #[arg(long)]
    pub key: Option<String>,
    /// The service's base URL. Repeat it to spread the attempts over several servers in turn.
    #[arg(long = "url", default_value = DEFAULT_URL)]
    pub urls: Vec<Url>,
    /// The API key (the embedded mode's demo key by default).
    #[arg(long, env = "PAYMENTS_API_KEY", hide_env_values = true, default_value = DEMO_API_KEY)]
    pub api_key: String,
    /// Attempts at most, the first included.
    #[arg(long, default_value_t = client::DEFAULT_MAX_ATTEMPTS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: u32,
    /// Give up when the next attempt would start later than this after the first.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub deadline: Duration,
    /// How long one attempt may wait for its answer.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// How a `payments pay` ended, as its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Ended {
    /// The payment succeeded (`2xx`).
    Paid = 0,
    /// The card was declined (`402`).
    Declined = 3,
    /// Any other definitive answer: a `4xx` (bad input, a key reused with another request, an
    /// expired key...) or a `502` from the gateway rejecting the charge.
    Rejected = 4,
    /// No definitive answer before the deadline or the last attempt: the payment may still
    /// complete. The key is printed on stderr, to resume with `--key`.
    GaveUp = 5,
}

impl Ended {
    pub fn of(outcome: &Outcome) -> Ended {
        match outcome {
            Outcome::Paid(_) => Ended::Paid,
            Outcome::Declined(_) => Ended::Declined,
            Outcome::Rejected(_) => Ended::Rejected,
            Outcome::GaveUp { .. } => Ended::GaveUp,
        }
    }
}

pub async fn run(args: PayArgs) -> anyhow::Result<ExitCode> {
    let policy = RetryPolicy {
        max_attempts: args.max_attempts,
        deadline: args.deadline,
        attempt_timeout: args.timeout,
        ..RetryPolicy::default()
    };
    let client = Client::new(&args.urls, &args.api_key, policy)?;
    let key = args.key.unwrap_or_else(Client::new_key);
    let payment =
        NewPayment { amount: args.amount, currency: args.currency, source: args.source, description: args.description };
    let finished = client.pay(&key, &payment, |attempt| eprintln!("{attempt}")).await;

    let last_body = match &finished.outcome {
        Outcome::Paid(answer) | Outcome::Declined(answer) | Outcome::Rejected(answer) => Some(&answer.body),
        Outcome::GaveUp { last, .. } => last.as_ref().ok().map(|answer| &answer.body),
    };
    if let Some(body) = last_body {
        println!("{}", String::from_utf8_lossy(body));
    }
    if let Outcome::GaveUp { .. } = finished.outcome {
        let attempts = match finished.attempts {
            1 => "1 attempt".to_owned(),
            n => format!("{n} attempts"),
        };
        eprintln!(
            "gave up after {attempts}. The payment may still complete: learn its outcome, or finish it, with --key \
             {key} (it is never charged twice)"
        );
    }
    Ok(ExitCode::from(Ended::of(&finished.outcome) as u8))
}
