//! What `payments pay`, `capture`, `cancel` and `refund` share: one request through the reference client
//! ([`payments_client`]), for a person at a terminal or a script. Each attempt is a line on stderr;
//! the final answer's body goes to stdout; the exit code says how it ended (see [`Ended`]). A key
//! given with `--key` may have been sent by an earlier run, so only an answer about that key ends
//! such a run with `3`, `4` or `6`: anything else (a `401` after the API key changed, say) may hide
//! a payment or refund the key made, and ends it with `5`.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use payments_client::{Answer, Client, Endpoint, GaveUp, IdempotentRequest, KeySeen, Outcome, RetryPolicy};
use payments_service::accounts::DEMO_API_KEY;
use reqwest::Url;

use super::parse_duration;

/// Where `payments serve` listens by default.
const DEFAULT_URL: &str = "http://127.0.0.1:8080";

/// How the client reaches the service and how hard it tries: the flags of `pay` and `refund`.
#[derive(Clone, Args)]
pub struct ClientArgs {
    /// The idempotency key; a new UUIDv4 if not given. Give the key a run printed when it gave
    /// up to learn how that request ended, or to finish it: it is never carried out twice. A key
    /// given here may have been used, so only an answer about it is definitive.
    #[arg(long)]
    pub key: Option<String>,
    /// The service's base URL. Repeat it to spread the attempts over several servers in turn.
    #[arg(long = "url", default_value = DEFAULT_URL)]
    pub urls: Vec<Url>,
    /// The API key (the embedded mode's demo key by default).
    #[arg(long, env = "PAYMENTS_API_KEY", hide_env_values = true, default_value = DEMO_API_KEY)]
    pub api_key: String,
    /// Attempts at most, the first included.
    #[arg(long, default_value_t = payments_client::DEFAULT_MAX_ATTEMPTS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: u32,
    /// How long the whole request may take: no attempt goes on past it, and none starts with less
    /// than 3 s (or --timeout, if shorter) left.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub deadline: Duration,
    /// How long one attempt may wait for its answer.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// How a `payments pay` or `payments refund` ended, as its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Ended {
    /// The payment succeeded, or the refund was made (`2xx`): succeeded, or pending (the gateway
    /// settles it later; a note on stderr says so).
    Succeeded = 0,
    /// Refused about the key, and nothing made: the card was declined (`402`); the refund's
    /// payment was not found (`404`), is not refundable, is refunded already or has less left
    /// than asked (`400`); or the refund failed at the gateway (`201` with a `failed` refund).
    Declined = 3,
    /// Any other definitive answer: the key was used for another request (`422`), the gateway
    /// rejected the charge or refund (`502`), or, on a new key's first answers, before any attempt
    /// may have reached the service, the request was refused (`400`, `401`, a proxy's `404`...):
    /// nothing was made, and sending it again once it is put right is safe.
    Rejected = 4,
    /// No definitive answer: the deadline or the last attempt came first, or, once an attempt may
    /// have reached the service, an answer came that is not about the key (a `401`, a proxy's
    /// `404`). The payment or refund may have been made, or may still be. The key is printed on
    /// stderr, to resume with `--key`.
    GaveUp = 5,
    /// `410`: the key made a payment or refund and its record has since expired; nothing was made
    /// now. What it made is named on stderr; the body shows it as it is now.
    Expired = 6,
}

impl Ended {
    pub fn of(outcome: &Outcome) -> Ended {
        match outcome {
            Outcome::Succeeded(_) => Ended::Succeeded,
            Outcome::Declined(_) => Ended::Declined,
            Outcome::Expired(_) => Ended::Expired,
            Outcome::Rejected(_) => Ended::Rejected,
            Outcome::GaveUp { .. } => Ended::GaveUp,
        }
    }
}

/// How the notes on stderr name what a request to `endpoint` does.
struct Words {
    /// `payment`, `refund`.
    object: &'static str,
    /// `charged`, `refunded`.
    done: &'static str,
}

impl Words {
    fn of(endpoint: Endpoint) -> Words {
        match endpoint {
            Endpoint::Payments => Words { object: "payment", done: "charged" },
            Endpoint::Refunds => Words { object: "refund", done: "refunded" },
            Endpoint::Captures => Words { object: "payment", done: "captured" },
            Endpoint::Cancels => Words { object: "payment", done: "canceled" },
        }
    }
}

/// Sends `request` as `args` say, prints what it got, and exits as [`Ended`] says.
pub async fn run<R: IdempotentRequest>(args: ClientArgs, request: &R) -> anyhow::Result<ExitCode> {
    let policy = RetryPolicy {
        max_attempts: args.max_attempts,
        deadline: args.deadline,
        attempt_timeout: args.timeout,
        ..RetryPolicy::default()
    };
    let client = Client::new(&args.urls, &args.api_key, policy)?;
    let (key, seen) = match args.key {
        Some(key) => (key, KeySeen::Maybe),
        None => (Client::new_key(), KeySeen::No),
    };
    let finished = client.send(&key, seen, request, |attempt| eprintln!("{attempt}")).await;

    let last_body = match &finished.outcome {
        Outcome::Succeeded(answer)
        | Outcome::Declined(answer)
        | Outcome::Expired(answer)
        | Outcome::Rejected(answer) => Some(&answer.body),
        Outcome::GaveUp { last, .. } => last.as_ref().ok().map(|answer| &answer.body),
    };
    if let Some(body) = last_body {
        println!("{}", String::from_utf8_lossy(body));
    }
    let Words { object, done } = Words::of(R::ENDPOINT);
    let path = R::ENDPOINT.path();
    match &finished.outcome {
        Outcome::Succeeded(answer) if is_pending(answer) => {
            let id = answer.object_id().unwrap_or_default();
            eprintln!(
                "the {object} is pending: the gateway settles it later, succeeded or failed. GET /{path}/{id} shows how \
                 it ends"
            );
        }
        Outcome::Expired(answer) => {
            let id = answer.object_id().unwrap_or_else(|| "(not named)".into());
            eprintln!(
                "the key's record has expired: the key made {object} {id}, and nothing was {done} now. GET /{path}/{id} \
                 shows it"
            );
        }
        Outcome::GaveUp { why, .. } => {
            let attempts = match finished.attempts {
                1 => "1 attempt".to_owned(),
                n => format!("{n} attempts"),
            };
            let may = match why {
                GaveUp::NotAboutTheKey => "may have been made: once the last answer's cause is put right,",
                GaveUp::Attempts | GaveUp::Deadline => "may still complete:",
            };
            eprintln!(
                "gave up after {attempts}. The {object} {may} learn its outcome, or finish it, with --key {key} (it is \
                 never {done} twice)"
            );
        }
        Outcome::Succeeded(_) | Outcome::Declined(_) | Outcome::Rejected(_) => {}
    }
    Ok(ExitCode::from(Ended::of(&finished.outcome) as u8))
}

/// Whether a success carries something the gateway has not settled yet (a pending refund).
fn is_pending(answer: &Answer) -> bool {
    serde_json::from_slice::<serde_json::Value>(&answer.body).is_ok_and(|body| body["status"] == "pending")
}
